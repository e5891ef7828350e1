"""Context parallelism's per-rank cost on one GPU (not run by CI).

    PYTHONPATH=. python tests/gpu/cp_bench.py --out "$OUT"              # B=1, T=2^20, H=32, K=V=128, bf16
    TRITON_INTERPRET=1 python tests/gpu/cp_bench.py --T 256 --H 2 --K 16 --V 16 --splits 2 --train-T 128
                                                                         # a CPU dry run, tiny shapes

For each split CP = 2, 4, 8 of the T tokens (one sequence), the work of the busiest rank -- one
inside the sequence (``pre_num_ranks > 0``), as :func:`kdagen.ops.cp.run_cp` runs it there -- timed
against the one-GPU call on all T tokens.  Inference (``fwd``): the op's forward in two phases
(:class:`kdagen.ops.cp.RankSplit`): the solve, the (end state, transition) piece of its tokens, the chain
over the earlier ranks' pieces ([HV, K, K] x [HV, K, V] products), the pass from the start state it gives.
Training (``train``): the op on its T/CP tokens with values [v | 0] from [0 | I]
(:func:`kdagen.ops.cp._wide_call`), the chain and the correction o(0) + Q h of its outputs
(:func:`kdagen.ops.cp.corrected_outputs`) and end state.
Target: the rank's time within 10% of 1/CP of the one-GPU time (``--mode fwd``: inference;
``train``: forward + backward at ``--train-T`` tokens, which the one-GPU training call fits in memory).
The collectives (one all-gather forward, one all-reduce backward, CP x H x K x (K + V) fp32
words each) are not in the rank's time; their bytes are printed.

``--check``: the functional check -- CP ranks (spawned processes sharing this GPU through gloo,
CUDA tensors) run chunk_kda under cp_context, forward and backward (float32), and inference (float32 and
bf16), against the one-process call (small T); the worst relative error of each over the ranks.

A markdown table to stdout; ``cp_bench.json`` under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import kdagen  # noqa: E402
from kdagen.ops.cp import RankSplit, _wide_call, corrected_outputs, rank_split  # noqa: E402

GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
DEV = "cuda" if GPU else "cpu"


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", type=int, default=1 << 20)
    p.add_argument("--H", type=int, default=32)
    p.add_argument("--K", type=int, default=128)
    p.add_argument("--V", type=int, default=128)
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16" if GPU else "fp32")
    p.add_argument("--splits", default="2,4,8", help="comma-separated CP sizes")
    p.add_argument("--mode", default="fwd,train", help="fwd, train or both (comma-separated)")
    p.add_argument("--train-T", type=int, default=1 << 17, help="tokens of the training timings")
    p.add_argument("--reps", type=int, default=5 if GPU else 1)
    p.add_argument("--check", action="store_true", help="the functional check with spawned gloo ranks")
    p.add_argument("--check-T", type=int, default=4096 if GPU else 96)
    p.add_argument("--out", default=None, help="directory for cp_bench.json")
    return p.parse_args(argv)


def inputs(T, H, K, V, dtype, grad=False, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)

    def r(*s):
        return torch.randn(*s, device=DEV, generator=g)
    q = torch.nn.functional.normalize(r(1, T, H, K), dim=-1).to(dtype)
    k = torch.nn.functional.normalize(r(1, T, H, K), dim=-1).to(dtype)
    v = r(1, T, H, V).to(dtype)
    gate = -torch.rand(1, T, H, K, device=DEV, generator=g) * 0.5
    beta = torch.rand(1, T, H, device=DEV, generator=g)
    xs = (q, k, v, gate, beta)
    return tuple(x.requires_grad_() for x in xs) if grad else xs


def timed(fn, reps):
    """Median seconds of ``reps`` calls after one warm-up (which also compiles)."""
    fn()
    out = []
    for _ in range(reps):
        if GPU:
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if GPU:
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def rank_work(xs, cp, train):
    """The busiest rank's work in run_cp (a rank inside the sequence, cp - 1 ranks before it): inference, the
    op's forward in two phases (kdagen.ops.cp.RankSplit; the collective replaced by the chain over made-up
    pieces); training, the widened call and the correction."""
    q, k, v, gate, beta = xs
    T, HV, K, V = q.shape[1], v.shape[2], q.shape[3], v.shape[3]
    pieces = torch.randn(cp, HV, K, V + K, device=DEV) * 0.01
    if not train:
        def publish(he, hm):
            torch.cat([he, hm], dim=-1)  # the piece the rank would share
            h = pieces[0, :, :, :V]
            for j in range(1, cp - 1):
                h = torch.matmul(pieces[j, :, :, V:], h) + pieces[j, :, :, :V]
            return h[None]
        cu = torch.tensor([0, T], device=DEV)
        with rank_split(RankSplit((0,), False, publish)):
            return kdagen.chunk_kda(*xs, initial_state=torch.zeros(1, HV, K, V, device=DEV), output_final_state=True,
                                    cu_seqlens=cu, cu_seqlens_cpu=cu.cpu())

    def call(t, h0, cu, cu_cpu):
        return kdagen.chunk_kda(*t, initial_state=h0, output_final_state=True, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu)
    h0 = torch.cat([torch.zeros(HV, K, V, device=DEV), torch.eye(K, device=DEV).expand(HV, K, K)], -1)[None]
    ow, htw = _wide_call(call, xs, h0.contiguous(), V, K, 256)
    h = pieces[0, :, :, :V]
    for j in range(1, cp - 1):
        h = torch.matmul(pieces[j, :, :, V:], h) + pieces[j, :, :, :V]
    o = corrected_outputs(ow, h[None], V)  # what run_cp runs there (not a copy of it: the bench times the op's own)
    ht = htw[0, :, :, :V] + torch.matmul(htw[0, :, :, V:], h)
    if train:
        (o.float().sum() + ht.sum()).backward()
    return o, ht


def one_call(xs, train):
    o, ht = kdagen.chunk_kda(*xs, output_final_state=True)
    if train:
        (o.float().sum() + ht.sum()).backward()
    return o, ht


def bench(args):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    rows = []
    for mode in [m for m in args.mode.split(",") if m]:
        train = mode == "train"
        T = args.train_T if train else args.T
        grad_ctx = torch.enable_grad if train else torch.no_grad
        with grad_ctx():
            full = inputs(T, args.H, args.K, args.V, dtype, grad=train)
            t_full = timed(lambda: one_call(full, train), args.reps)
            del full
            for cp in [int(s) for s in args.splits.split(",") if s]:
                part = inputs(T // cp, args.H, args.K, args.V, dtype, grad=train, seed=cp)
                t_rank = timed(lambda: rank_work(part, cp, train), args.reps)
                del part
                ideal = t_full / cp
                words = cp * args.H * args.K * (args.K + args.V)
                rows.append(dict(mode=mode, T=T, cp=cp, one_gpu_ms=1e3 * t_full, rank_ms=1e3 * t_rank,
                                 ideal_ms=1e3 * ideal, overhead=t_rank / ideal - 1, collective_bytes=4 * words,
                                 target_met=t_rank <= 1.10 * ideal))
                if GPU:
                    torch.cuda.empty_cache()
    return rows


def check(args):
    """CP ranks sharing this device through gloo (CUDA tensors on a GPU) against the one-process call."""
    import torch.multiprocessing as mp
    results = []
    for cp in [int(s) for s in args.splits.split(",") if s]:
        d = tempfile.mkdtemp(prefix="cp_check_")
        mp.spawn(_check_rank, args=(cp, d, args.check_T, args.H, args.K, args.V), nprocs=cp)
        errs = [json.load(open(os.path.join(d, f"rank{r}.json"))) for r in range(cp)]
        results.append(dict(cp=cp, worst_rel_err={k: max(e[k] for e in errs) for k in errs[0]}))
    return results


def _check_rank(rank, world, d, T, H, K, V):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{d}/init", rank=rank, world_size=world)
    xs = inputs(T, H, K, V, torch.float32, seed=1)
    cu = torch.tensor([0, T // 3, T], device=DEV)
    ctx = kdagen.build_cp_context(cu, group=dist.group.WORLD)
    s, e = ctx.rank_start, ctx.rank_end
    loc = [x[:, s:e].clone().requires_grad_() for x in xs]
    o, _ = kdagen.chunk_kda(*loc, cp_context=ctx)
    o.float().sum().backward()
    ref = [x.clone().requires_grad_() for x in xs]
    ro, _ = kdagen.chunk_kda(*ref, cu_seqlens=cu)
    ro.float().sum().backward()

    def err(a, b):
        return ((a.double() - b.double()).norm() / b.double().norm()).item()
    out = {"o": err(o, ro[:, s:e])}
    out.update({f"d{n}": err(x.grad, r.grad[:, s:e]) for n, x, r in zip("qkvgb", loc, ref)})
    # inference (a rank continuing a sequence runs in two phases), float32 and bf16, against the one-process call
    for name, dt in (("o_inference", torch.float32),) + ((("o_inference_bf16", torch.bfloat16),) if GPU else ()):
        xi = inputs(T, H, K, V, dt, seed=1)
        with torch.no_grad():
            oi, _ = kdagen.chunk_kda(*[x[:, s:e] for x in xi], cp_context=ctx)
            ri, _ = kdagen.chunk_kda(*xi, cu_seqlens=cu)
        out[name] = err(oi, ri[:, s:e])
    json.dump(out, open(os.path.join(d, f"rank{rank}.json"), "w"))
    dist.destroy_process_group()


def main(argv=None):
    args = parse(argv)
    rows = bench(args)
    dev = torch.cuda.get_device_name() if GPU else "CPU (Triton interpreter)"
    print(f"## chunk_kda under cp_context, busiest rank vs 1/CP of one call ({dev}, H={args.H}, K={args.K}, "
          f"V={args.V}, {args.dtype})\n")
    print("| mode | T | CP | one call ms | 1/CP ms | rank ms | overhead | collective bytes | <= 10% |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['T']} | {r['cp']} | {r['one_gpu_ms']:.2f} | {r['ideal_ms']:.2f} | "
              f"{r['rank_ms']:.2f} | {100 * r['overhead']:+.1f}% | {r['collective_bytes']} | "
              f"{'yes' if r['target_met'] else 'no'} |")
    out = {"device": dev, "args": vars(args), "rows": rows}
    if args.check:
        out["check"] = check(args)
        for c in out["check"]:
            print(f"\ncheck CP={c['cp']}: worst rel. error vs the one-process call "
                  + ", ".join(f"{k} {v:.2e}" for k, v in c["worst_rel_err"].items()))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "cp_bench.json"), "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
