"""A family member's training step (chunk op, forward + backward) under config variants, with
FLA's op of the same name in the same process: which chunk length and tiles beat FLA.

    PYTHONPATH=/tmp/site:. python3 bench/member_train_variants.py --out "$OUT" --member deltanet \
        [--variants default,c64a,c64b] [--warm-workers 14 --warm-budget 90] [--budget 400]
    TRITON_INTERPRET=1 PYTHONPATH=. python3 bench/member_train_variants.py --smoke --out /tmp/x

A variant is a pair (training forward's ChunkTrainConfig, backward's ChunkBwdConfig) written as
replacements of the heuristic configs of the call (``VARIANTS`` below; ``default`` is the
heuristic itself).  Per shape and variant: forward + backward median ms (do_bench), the kernels'
times (torch.profiler, mean of 3 calls), the largest difference of every gradient from the
default variant's (they must agree to bf16 rounding), and, at a small shape, the bf16 errors of
o, the final state and every gradient against float64 autograd through the token-by-token
recurrence, beside FLA's.  ``--smoke``: tiny shapes on the CPU (the interpreter), no FLA.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import family_vs_fla as F  # noqa: E402

# name -> (ChunkTrainConfig replacements, ChunkBwdConfig replacements); C=64 rows: two 32-row sub-tiles
C64 = dict(chunk_size=64, sub_chunk=32)
VARIANTS = {
    "default": ({}, {}),
    # 64-row chunks, everything else the heuristic's (the reverse pass widened to 32 where it would be 16)
    "c64h": (dict(C64), dict(C64)),
    # the state passes on 4 warps with 32-wide V tiles, 2 stages; dqkw on [64, 64]; split intra gradients on 4 warps
    "c64a": (dict(C64, intra_num_warps=8, state_num_warps=4, state_block_v=32, state_num_stages=2),
             dict(C64, state_num_stages=2, state_block_v=32, dqkw_block_k=64, dqkw_block_v=64, dqkw_num_warps=4,
                  intra_num_warps=4, intra_block_v=64, rerun_num_warps=2)),
    # 16-wide V tiles in the forward state pass (3 stages); dqkw [128, 32] on 8 warps; intra gradients on 8 warps.
    # (Runs 93-95 also had the reverse pass on 16-wide tiles here and in c64d: wrong dk/dv/dbeta/dh0 on the
    # H200; ChunkBwdConfig now refuses it, min_state_block_v)
    "c64b": (dict(C64, intra_num_warps=4, intra_block_k=64, state_num_warps=4, state_block_v=16, state_num_stages=3),
             dict(C64, state_num_stages=2, state_block_v=32, dqkw_block_k=128, dqkw_block_v=32, dqkw_num_warps=8,
                  intra_num_warps=8, intra_block_v=64, rerun_num_warps=4)),
    # 64-wide V tiles in both state passes; dqkw [128, 64] on 8 warps; intra gradients on 8 warps, BV=32
    "c64c": (dict(C64, intra_num_warps=8, state_num_warps=4, state_block_v=64, state_num_stages=2),
             dict(C64, state_num_stages=2, state_block_v=64, dqkw_block_k=128, dqkw_block_v=64, dqkw_num_warps=8,
                  intra_num_warps=8, intra_block_v=32, rerun_num_warps=4)),
    # the forward state pass on 8 warps (BV=64); the reverse pass 32-wide, 3 stages; dqkw [64, 32]
    "c64d": (dict(C64, intra_num_warps=8, state_num_warps=8, state_block_v=64, state_num_stages=2),
             dict(C64, state_num_stages=3, state_block_v=32, dqkw_block_k=64, dqkw_block_v=32, dqkw_num_warps=4,
                  intra_num_warps=4, intra_block_v=32, rerun_num_warps=8, rerun_block_k=128)),
}
# the output out of the forward state pass (ChunkTrainConfig.split_output: a states-only pass, then chunk_out)
VARIANTS["split"] = (dict(split_output=True), {})
VARIANTS["split_w2"] = (dict(split_output=True, state_block_v=32, state_num_warps=2, state_num_stages=2), {})
# no decay (DeltaNet): the split intra backward folded into dqkw and chunk_bwd_wy (ChunkBwdConfig.intra_fold)
VARIANTS["unfold"] = ({}, dict(intra_fold=False, intra_block_k=32))  # the split as it was before run 115's default
VARIANTS["fold"] = ({}, dict(intra_fold=True))
VARIANTS["fold_w8"] = ({}, dict(intra_fold=True, dqkw_num_warps=8))  # dqkw's three [C, 128] accumulators on 8 warps
VARIANTS["fold_w8_bk64"] = ({}, dict(intra_fold=True, dqkw_num_warps=8, intra_block_k=64))
VARIANTS["fold_bk64"] = ({}, dict(intra_fold=True, intra_block_k=64))
VARIANTS["fold_bk64_bv32"] = ({}, dict(intra_fold=True, intra_block_k=64, dqkw_block_v=32))
VARIANTS["fold_bk64_s1"] = ({}, dict(intra_fold=True, intra_block_k=64, dqkw_num_stages=1))
# (runs 122-125 also timed dqkw on chunk pairs and the state pass over pairs, ChunkBwdConfig.dqkw_pairs and
# ChunkTrainConfig.state_pairs: slower in every tiling, removed after commit ab07a15; bench/RESULTS.md, session 25)
# DeltaNet: the folded dqkw on narrower K tiles (more programs per chunk, fewer registers: sm_90 static report
# BK=128 182 registers (2 programs per SM), BK=64 128 (4 per SM), BK=32 168)
VARIANTS["dq_bk64"] = ({}, dict(dqkw_block_k=64))
VARIANTS["dq_bk64_bv32"] = ({}, dict(dqkw_block_k=64, dqkw_block_v=32))
VARIANTS["dq_bk32"] = ({}, dict(dqkw_block_k=32))
# the fused pass on the tiles the heuristic took before the split (run 96's default)
VARIANTS["fused16"] = (dict(split_output=False, state_block_v=16, state_num_warps=4, state_num_stages=3), {})
VARIANTS["fused32"] = (dict(split_output=False, state_block_v=32, state_num_warps=2, state_num_stages=3), {})
# GDN (session 27): the state passes on 16-wide V tiles (twice the programs at few heads; the reverse pass's
# 16-wide tile is allowed at C=32, min_state_block_v) or 32-wide ones; the wy launch on 4 warps or 32-wide K tiles
VARIANTS["st16"] = (dict(state_block_v=16, state_num_warps=4, state_num_stages=3),
                    dict(state_block_v=16, state_num_warps=4, state_num_stages=4))
VARIANTS["st16f"] = (dict(state_block_v=16, state_num_warps=4, state_num_stages=3), {})
VARIANTS["st16b"] = ({}, dict(state_block_v=16, state_num_warps=4, state_num_stages=4))
VARIANTS["st32"] = (dict(state_block_v=32, state_num_warps=4, state_num_stages=3),
                    dict(state_block_v=32, state_num_warps=4, state_num_stages=4))
VARIANTS["wy_w4"] = ({}, dict(intra_num_warps=4))
VARIANTS["wy_bk32"] = ({}, dict(intra_block_k=32))
# GDN at 64-row chunks in today's launches: dqkw on 8 warps (sm_90 static: 222 registers, no spill; 4 warps spill
# 368 bytes), the wy launch on 4 warps (88 bytes spilled against 172 on 2)
VARIANTS["c64w8"] = (dict(C64), dict(C64, dqkw_num_warps=8, intra_num_warps=4))
# GDN at C=64 (run 138: c64h 3.408 ms against the default's 3.880 at (2, 16384, 16), but 5.440 against 5.299 at
# (1, 8192, 96), where the reverse pass on 64-wide tiles spills and takes 1.24 ms): the reverse pass on 32-wide tiles
# (3 / 2 stages) or on 8 warps; the forward intra launch on 8 warps; the re-run on 2 warps
VARIANTS["c64s32"] = (dict(C64), dict(C64, state_block_v=32))
VARIANTS["c64s32s2"] = (dict(C64), dict(C64, state_block_v=32, state_num_stages=2))
VARIANTS["c64sw8"] = (dict(C64), dict(C64, state_num_warps=8))
VARIANTS["c64s32i8r2"] = (dict(C64, intra_num_warps=8), dict(C64, state_block_v=32, rerun_num_warps=2))
OPS = {"deltanet": "chunk_delta_rule", "gdn": "chunk_gated_delta_rule",
       "gdn_gate": "chunk_gated_delta_rule",  # gdn_gate: FLA's in-kernel gate (A_log, dt_bias); its default only
       "gdn_layer": "chunk_gated_delta_rule"}  # gdn_layer: the gate and use_qk_l2norm_in_kernel; its default only


def configs(member, name, x):
    """The variant's (ChunkTrainConfig, ChunkBwdConfig) for the call on inputs ``x``; (None, None) for the
    in-kernel gate's default (the op resolves its own)."""
    if member in F.GATED:
        if name != "default":
            raise ValueError(f"{member}: only the default variant")
        return None, None
    from kdagen.cache.heuristics import default_chunk_bwd_config, default_train_config
    from kdagen.ops.member import _prepare_chunk
    from kdagen import load_spec

    spec = load_spec(member)
    call, _, _ = _prepare_chunk(spec, x["q"], x["k"], x["v"], x.get("g"), x.get("beta"),
                                initial_state=x["initial_state"], training=True)
    t = default_train_config(call.plan, call.shape)
    # the backward's heuristic on the forward's chunks, as the op resolves it (ops/chunk.py _configs)
    b = default_chunk_bwd_config(call.plan, call.shape, (t.chunk_size, t.sub_chunk))
    rt, rb = VARIANTS[name]
    if "chunk_size" in rb:  # the backward on the variant's chunks, as the op chooses it (ChunkBwdConfig.with_chunking)
        b = b.with_chunking(rb["chunk_size"], rb.get("sub_chunk", b.sub_chunk))
        rb = {n: v for n, v in rb.items() if n not in ("chunk_size", "sub_chunk")}
    return t.replace(**rt), b.replace(**rb)


def kdagen_op(member, t, b):
    import kdagen
    from kdagen.ops.chunk import chunk_bwd_config

    op = getattr(kdagen, OPS[member])

    def run(*a, **kw):
        if b is None:
            return op(*a, config=t, **kw)
        with chunk_bwd_config(b):
            return op(*a, config=t, **kw)
    return run


def launch_check(member, name, shape, dev):
    """Run the variant's training launches one by one, each followed by a synchronisation, and
    print each before it runs: the last line names the launch that faults (a fault ends the CUDA
    context, so run one variant per process)."""
    from kdagen import load_spec
    from kdagen.kernels import with_repairs
    from kdagen.ops.member import chunk_member_launches

    x = F.inputs(member, *shape, shape[-1], dev)
    t, b = configs(member, name, x)
    fwd, bwd, outs = chunk_member_launches(load_spec(member), x["q"], x["k"], x["v"], x.get("g"), x.get("beta"),
                                           training=True, config=t, bwd_config=b, initial_state=x["initial_state"],
                                           output_final_state=True, do=torch.randn_like(x["v"]),
                                           dht=torch.randn_like(x["initial_state"]), with_rerun=True)
    for ln in with_repairs(list(fwd) + list(bwd)):
        print(f"launch {ln.kernel} grid {ln.grid} warps {ln.num_warps} stages {ln.num_stages} "
              f"{ {k: v for k, v in ln.constexprs.items() if k in ('BT', 'BC', 'BK', 'BV')} }", flush=True)
        ln()
        if dev == "cuda":
            torch.cuda.synchronize()
    print(f"launch check {name} {shape}: every launch ran; finite: "
          f"{ {n: bool(torch.isfinite(v).all()) for n, v in outs.items() if isinstance(v, torch.Tensor)} }", flush=True)


def grads_of(member, fn, x, seed=3):
    names = F.GRAD[member]
    leaves = {n: x[n].detach().clone().requires_grad_(True) for n in names}
    o, s = F.call_chunk(member, fn, {**x, **leaves})
    gen = torch.Generator().manual_seed(seed)
    do = torch.randn(o.shape, generator=gen).to(o.device, o.dtype)
    ds = torch.randn(s.shape, generator=gen).to(s.device, s.dtype)
    return dict(zip(names, torch.autograd.grad((o, s), [leaves[n] for n in names], (do, ds)))), o, s


def errors(member, fn, x):
    """bf16 relative errors of o, the final state and every gradient against float64 autograd."""
    names = F.GRAD[member]
    r, ro, rs = F._reference(member, x, names, x["q"].device)
    gen = torch.Generator().manual_seed(7)
    do = torch.randn(ro.shape, generator=gen).to(ro.device)
    ds = torch.randn(rs.shape, generator=gen).to(rs.device)
    rg = torch.autograd.grad((ro, rs), [r[n] for n in names], (do.double(), ds.double()))
    leaves = {n: x[n].detach().clone().requires_grad_(True) for n in names}
    o, s = F.call_chunk(member, fn, {**x, **leaves})
    g = torch.autograd.grad((o, s), [leaves[n] for n in names], (do.to(o.dtype), ds))
    out = dict(o=F.rel(o, ro), final_state=F.rel(s, rs))
    out.update({f"d{n}": F.rel(a, b) for n, a, b in zip(names, g, rg)})
    return {k: float(f"{v:.3e}") for k, v in out.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--member", default="deltanet", choices=sorted(OPS))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--shapes", default="1,8192,96,128;2,16384,16,128")
    ap.add_argument("--error-shape", default="1,1024,4,128")
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--warm-workers", type=int, default=0)
    ap.add_argument("--warm-budget", type=float, default=90.0)
    ap.add_argument("--budget", type=float, default=400.0)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--errors-only", action="store_true", help="only the bf16 errors at --error-shape")
    ap.add_argument("--launch-check", default="", help="VARIANT: run its launches one at a time at --error-shape, "
                    "synchronising after each, and stop (which launch faults)")
    ap.add_argument("--fla-gdn-unguarded", action="store_true",
                    help="time FLA's GDN backward with its Triton < 3.7.1 Hopper guard lifted (family_vs_fla.py's flag)")
    args = ap.parse_args()
    cuda = torch.cuda.is_available() and not args.smoke
    dev = "cuda" if cuda else "cpu"
    member = args.member
    shapes = [tuple(map(int, s.split(","))) for s in args.shapes.split(";")]
    eshape = tuple(map(int, args.error_shape.split(",")))
    if args.smoke:
        shapes, eshape = [(1, 70, 2, 32)], (1, 45, 1, 32)
    if args.launch_check:
        launch_check(member, args.launch_check, eshape, dev)
        return
    deadline = time.time() + args.budget  # checked before each row; FLA's first row (its autotuning) runs regardless
    res = dict(member=member, rows=[], errors=[])
    fla = None if (args.no_fla or not cuda) else F.ops(member, "fla")
    if fla is not None and args.fla_gdn_unguarded:
        F.lift_fla_gdn_guard()
        res["fla_gdn_unguarded"] = True
    if fla is not None and args.warm_workers:
        F.warm_parallel(args.warm_workers, [member], shapes, args.warm_budget)
    names = args.variants.split(",")

    def dump():
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"{member}_train_variants.json"), "w") as f:
            json.dump(res, f, indent=1)

    # bf16 errors against float64 first (small, and what makes a variant admissible)
    x = F.inputs(member, *eshape, eshape[-1], dev)
    for name in names + (["fla"] if fla else []):
        try:
            fn = fla[0] if name == "fla" else kdagen_op(member, *configs(member, name, x))
            e = errors(member, fn, x)
        except Exception as ex:  # noqa: BLE001
            e = dict(error=f"{type(ex).__name__}: {str(ex)[:200]}")
        res["errors"].append(dict(variant=name, shape=list(eshape), **e))
        print(f"errors {name:8s} {e}", flush=True)
    dump()
    if args.errors_only:
        return
    for B, T, H, D in shapes:
        x = F.inputs(member, B, T, H, D, D, dev)
        ref = None
        for name in names + (["fla"] if fla else []):  # FLA last: its first call may autotune for minutes
            if time.time() > deadline:
                print(f"budget: skipped {name} {(B, T, H, D)}", flush=True)
                continue
            row = dict(variant=name, shape=[B, T, H, D])
            try:
                if name == "fla":
                    fn = fla[0]
                else:
                    t, b = configs(member, name, x)
                    row["configs"] = [str(t), str(b)]
                    fn = kdagen_op(member, t, b)
                    g, _, _ = grads_of(member, fn, x)
                    if ref is None:
                        ref = g
                    row["grad_diff_vs_first"] = {n: float((g[n].float() - ref[n].float()).abs().max()) for n in g}
                    row["finite"] = all(bool(torch.isfinite(v).all()) for v in g.values())
                    del g
                run = F.fwdbwd_fn(member, fn, x)
                t0 = time.time()
                run()
                if cuda:
                    torch.cuda.synchronize()
                row["first_call_s"] = round(time.time() - t0, 2)
                row["ms"] = F.bench_ms(run, cuda)
                if cuda:
                    from bench import profile_top  # (prints the table)
                    row["kernels"] = [(round(ms, 4), c, n[:60]) for ms, c, n in
                                      profile_top(run, f"{name} {(B, T, H, D)}")[:14]]
            except Exception as ex:  # noqa: BLE001
                row["error"] = f"{type(ex).__name__}: {str(ex)[:300]}"
            res["rows"].append(row)
            print(f"{(B, T, H, D)} {name:8s} {row.get('ms', float('nan')):8.3f} ms  finite={row.get('finite')} "
                  f"diff={row.get('grad_diff_vs_first')} {row.get('error', '')}", flush=True)
            dump()
            if cuda:
                torch.cuda.empty_cache()
        fl = [r for r in res["rows"] if r["variant"] == "fla" and r["shape"] == [B, T, H, D] and "ms" in r]
        if fl:
            for r in res["rows"]:
                if r["shape"] == [B, T, H, D] and "ms" in r and r["variant"] != "fla":
                    r["fla_over_kdagen"] = fl[0]["ms"] / r["ms"]
                    print(f"  FLA / kdagen {r['variant']}: {r['fla_over_kdagen']:.3f}", flush=True)
        dump()


if __name__ == "__main__":
    main()
