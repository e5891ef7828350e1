"""Speculative decoding's verify step on a GPU: kdagen against FLA's ``fused_recurrent_kda_fwd`` with the
same arguments (CI never runs it: there is no GPU there).

    PYTHONPATH=. python tests/gpu/spec_decode_bench.py --out "$OUT"          # on the GPU, FLA beside it if importable
    TRITON_INTERPRET=1 python tests/gpu/spec_decode_bench.py --out /tmp/s    # a CPU dry run: tiny shapes, no timing

Each case is B sequences of 1 + k tokens (packed, cu_seqlens on the device), H = HV = 32, K = V = 128, bf16
inputs, a state pool of fp32 or bf16 ([P, HV, K, V]), a 2-D ``ssm_state_indices`` [B, 1 + k] (every token
its own slot, the rows scattered over the pool) and random ``num_accepted_tokens`` in 1..1+k: the call vLLM
makes for a KDA layer under MTP / a draft model.  Per case:

- exactness: one step from a fresh pool, every token's o and every token slot's state against the float64
  recurrence (kdagen.spec.reference, token by token from slot [n, accepted - 1]); FLA's error beside it;
- timing: CUDA-graph replay (10 steps per graph, ``triton.testing.do_bench`` median) of kdagen and FLA;
- the copy ceiling: the bytes a step must move -- one state read and 1 + k state writes per sequence and
  head -- and a device-to-device copy of equal traffic (a copy of half those bytes: it reads and writes
  them), replayed the same way; "% copy" is the copy's time over the op's.

``--batches``, ``--tokens`` (1 + k), ``--pools`` choose the cases (default 1,16,256 x 2,4 x float32,bfloat16).
FLA is imported with ``FLA_DISABLE_BACKEND_DISPATCH=1`` (its Triton kernel, not a vendor backend).  FLA's
kernel has no padding slots, so every slot here is a real one.  Prints a markdown table; writes
``spec_decode_bench.json`` under --out.  Exit status 1 when an exactness check fails.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import kdagen  # noqa: E402
from kdagen.spec.reference import naive_recurrent_kda  # noqa: E402

GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
DEV = "cuda" if GPU else "cpu"
# the float64 bound a case must meet: bf16 inputs (and outputs) on a GPU; a bf16 pool rounds every token's state
TOL = {"float32": 1e-2, "bfloat16": 2e-2}
DRY_TOL = 1e-5  # the interpreter's exact fp32


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--batches", default="1,16,256", help="sequences per step")
    ap.add_argument("--tokens", default="2,4", help="tokens per sequence and step (1 + k drafts)")
    ap.add_argument("--pools", default="float32,bfloat16", help="the state pool's dtypes")
    ap.add_argument("--per-graph", type=int, default=10, help="steps per captured CUDA graph")
    ap.add_argument("--no-fla", action="store_true", help="kdagen only")
    args = ap.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    args.tokens = [int(t) for t in args.tokens.split(",")]
    args.pools = args.pools.split(",")
    for t in args.tokens:
        if t < 1:
            ap.error(f"--tokens: every entry is 1 + k >= 1, got {t}")
    for p in args.pools:
        if p not in TOL:
            ap.error(f"--pools: float32 or bfloat16, got {p!r}")
    return args


def fla_op():
    """FLA's decode op as vLLM calls it (its Triton kernel), and FLA's version; (None, why) if absent."""
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
    try:
        import fla
        from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd
        return fused_recurrent_kda_fwd, getattr(fla, "__version__", "?")
    except Exception as e:  # noqa: BLE001
        return None, f"not importable: {e!r}"


def geometry():
    """(H, K, V, input dtype): the timed shape on a GPU, a tiny one in the interpreter."""
    return (32, 128, 128, torch.bfloat16) if GPU else (2, 16, 16, torch.float32)


def make_case(B, T1, pool_dtype, seed=0):
    """Inputs of B sequences of T1 = 1 + k tokens, a pool of B * T1 + 3 slots (rows scattered), the slot rows
    [B, T1] and accepted counts [B] in 1..T1."""
    H, K, V, dt = geometry()
    gen = torch.Generator().manual_seed(seed + 100 * B + T1)
    T = B * T1
    x = dict(q=torch.randn(1, T, H, K, generator=gen),
             k=torch.nn.functional.normalize(torch.randn(1, T, H, K, generator=gen), dim=-1),
             v=torch.randn(1, T, H, V, generator=gen),
             g=-torch.rand(1, T, H, K, generator=gen),  # g in (-1, 0]
             beta=torch.rand(1, T, H, generator=gen))
    x = {n: t.to(DEV, torch.float32 if n == "g" else dt) for n, t in x.items()}
    P = T + 3
    pool = (0.1 * torch.randn(P, H, K, V, generator=gen)).to(DEV, getattr(torch, pool_dtype))
    rows = torch.randperm(P, generator=gen)[:T].view(B, T1).to(DEV, torch.int32)
    acc = torch.randint(1, T1 + 1, (B,), generator=gen).to(DEV, torch.int32)
    cu = torch.arange(0, T + 1, T1, device=DEV, dtype=torch.int64)
    return x, pool, rows, acc, cu


def reference(x, pool, rows, acc, B, T1):
    """float64, token by token from slot [n, acc[n] - 1]: [(o [B, HV, V], state [B, HV, K, V])] per token."""
    r = {n: t.view(B, T1, *t.shape[2:]) for n, t in x.items()}
    S = pool[rows.long()[torch.arange(B, device=rows.device), acc.long() - 1]].double()
    out = []
    for j in range(T1):
        o, S = naive_recurrent_kda(*(r[n][:, j:j + 1].double() for n in ("q", "k", "v", "g", "beta")),
                                   initial_state=S, output_final_state=True)
        out.append((o[:, 0], S))
    return out


def rel_err(pairs) -> float:
    """||a - b|| / ||b|| over every (a, b) of ``pairs`` together (one tensor pair at a time in float64)."""
    num = den = 0.0
    for a, b in pairs:
        a, b = a.detach().double(), b.detach().double()
        num += (a - b).norm().item() ** 2
        den += b.norm().item() ** 2
    return (num / max(den, 1e-300)) ** 0.5


def step_fns(x, pool, rows, acc, cu, fla):
    """The verify step of kdagen and (if given) FLA, each on its own pool and o."""
    H, K, V, _ = geometry()
    out = torch.empty_like(x["v"])
    mine = lambda: kdagen.fused_recurrent_kda(**x, initial_state=pool, ssm_state_indices=rows,  # noqa: E731
                                              num_accepted_tokens=acc, cu_seqlens=cu, out=out,
                                              inplace_final_state=True)
    fns = {"kdagen": (mine, pool, out)}
    if fla is not None:
        pool_f, out_f = pool.clone(), torch.empty_like(x["v"])
        theirs = lambda: fla(**x, initial_state=pool_f, scale=K ** -0.5, inplace_final_state=True,  # noqa: E731
                             cu_seqlens=cu, ssm_state_indices=rows, num_accepted_tokens=acc, out=out_f)
        fns["fla"] = (theirs, pool_f, out_f)
    return fns


def exactness(fns, x, pool0, rows, acc, B, T1):
    """Each op's rel. error against float64 (o of every token, and every token slot's state) after one step
    from ``pool0``."""
    ref = reference(x, pool0, rows, acc, B, T1)
    errs = {}
    for name, (fn, pool, out) in fns.items():
        pool.copy_(pool0)
        fn()
        if GPU:
            torch.cuda.synchronize()
        HV, V = x["v"].shape[2:]
        got_o = out.view(B, T1, HV, V)
        err_o = rel_err((got_o[:, j], ref[j][0]) for j in range(T1))
        err_s = rel_err((pool[rows[:, j].long()], ref[j][1]) for j in range(T1))  # every token's slot
        errs[name] = max(err_o, err_s)
        pool.copy_(pool0)
    return errs


def capture(fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def graph_us(fn, per_graph) -> float:
    """Microseconds per call, replaying a CUDA graph of ``per_graph`` calls."""
    from triton.testing import do_bench
    graph = capture(lambda: [fn() for _ in range(per_graph)])
    return do_bench(graph.replay, warmup=20, rep=200, return_mode="median") * 1e3 / per_graph


def copy_us(nbytes: int, per_graph) -> float:
    """A device-to-device copy of ``nbytes // 2`` bytes (reading and writing them: ``nbytes`` of traffic)."""
    a = torch.empty(max(1, nbytes // 2), dtype=torch.uint8, device=DEV)
    b = torch.empty_like(a)
    return graph_us(lambda: b.copy_(a), per_graph)


def run(args) -> dict:
    fla, fla_version = (None, "not run (--no-fla)") if args.no_fla else fla_op()
    if not GPU:
        fla, fla_version = None, "not run (dry run: no GPU)"
    H, K, V, dt = geometry()
    res = dict(env=dict(date=datetime.datetime.now().isoformat(timespec="seconds"), torch=torch.__version__,
                        gpu=torch.cuda.get_device_name() if GPU else "none (dry run)",
                        python=platform.python_version(), kdagen=kdagen.__version__, fla=fla_version,
                        H=H, K=K, V=V, inputs=str(dt).replace("torch.", "")), rows=[])
    try:
        import triton
        res["env"]["triton"] = triton.__version__
    except ImportError:
        pass
    print(json.dumps(res["env"]), flush=True)
    for pool_dtype in args.pools:
        if not GPU and pool_dtype == "bfloat16":
            print("skip bfloat16 pools in the dry run: Triton's interpreter cannot run bf16", flush=True)
            continue
        for T1 in args.tokens:
            for B in args.batches:
                x, pool, rows, acc, cu = make_case(B, T1, pool_dtype)
                pool0 = pool.clone()
                fns = step_fns(x, pool, rows, acc, cu, fla)
                row = dict(B=B, tokens=T1, pool=pool_dtype)
                errs = exactness(fns, x, pool0, rows, acc, B, T1)
                for name, e in errs.items():
                    row[f"rel_err_{name}"] = e
                tol = TOL[pool_dtype] if GPU else DRY_TOL
                row["exact"] = bool(errs["kdagen"] == errs["kdagen"] and errs["kdagen"] < tol)
                row["tol"] = tol
                moved = B * H * K * V * pool.element_size() * (1 + T1)  # one state read, 1 + k written
                row["state_bytes"] = moved
                if GPU:
                    for name, (fn, p, _) in fns.items():
                        row[f"{name}_us"] = graph_us(fn, args.per_graph)
                        p.copy_(pool0)
                    row["copy_us"] = copy_us(moved, args.per_graph)
                    row["kdagen_tbs"] = moved / (row["kdagen_us"] * 1e-6) / 1e12
                    row["pct_copy"] = 100 * row["copy_us"] / row["kdagen_us"]
                    if "fla_us" in row:
                        row["fla_over_kdagen"] = row["fla_us"] / row["kdagen_us"]
                res["rows"].append(row)
                print(json.dumps(row), flush=True)
                del fns, x, pool, pool0
                if GPU:
                    torch.cuda.empty_cache()
    return res


def table(res) -> str:
    lines = ["| B | 1+k | pool | kdagen | FLA | FLA / kdagen | kdagen TB/s | copy of equal bytes | % copy | "
             "rel. err kdagen | rel. err FLA |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda r, k, fmt: (fmt.format(r[k]) if k in r else "--")  # noqa: E731
    for r in res["rows"]:
        lines.append(f"| {r['B']} | {r['tokens']} | {r['pool']} | {f(r, 'kdagen_us', '{:.1f} us')} | "
                     f"{f(r, 'fla_us', '{:.1f} us')} | {f(r, 'fla_over_kdagen', '{:.2f}x')} | "
                     f"{f(r, 'kdagen_tbs', '{:.2f}')} | {f(r, 'copy_us', '{:.1f} us')} | "
                     f"{f(r, 'pct_copy', '{:.0f}%')} | "
                     f"{f(r, 'rel_err_kdagen', '{:.1e}')} | {f(r, 'rel_err_fla', '{:.1e}')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    res = run(args)
    res["seconds"] = round(time.time() - t0, 1)
    print()
    print(table(res))
    bad = [r for r in res["rows"] if not r["exact"]]
    for r in bad:
        print(f"FAIL: B={r['B']} 1+k={r['tokens']} pool {r['pool']}: kdagen rel. error {r['rel_err_kdagen']:.2e} "
              f"above {r['tol']:.0e}")
    print("PASS: every case within its float64 bound" if not bad else f"{len(bad)} case(s) failed")
    with open(os.path.join(args.out, "spec_decode_bench.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
