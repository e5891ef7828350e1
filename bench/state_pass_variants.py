"""The training step's two sequential launches, alone, under variants: the forward state pass
(with its output products, and without them: ``WRITE_O=False``, the states and V' only) beside
a chunk-parallel output launch (a ``split_output``'s chunk_out: O = qg S_c + A_qk V' per chunk from
the stored states), and the reverse state pass, over V tile / warps / stages.  What it
answers: does a states-only pass plus a chunk-parallel output beat the fused pass (FLA's split),
and which tiles the passes want at few heads.

    PYTHONPATH=/tmp/site:. python3 bench/state_pass_variants.py --member deltanet \
        --shapes "2,16384,16,128;1,8192,96,128" [--chunk 32] [--fla] --out "$OUT"
    TRITON_INTERPRET=1 PYTHONPATH=. python3 bench/state_pass_variants.py --smoke

Per shape: each variant's median ms (do_bench), and for the split the largest difference of its O
from the fused pass's (bf16 rounding expected: the fused pass multiplies by the state rounded to
the dot dtype, the split by the stored per-chunk state in the same dtype).  ``--fla``: FLA's op of
the same name, forward + backward, its kernels' times (torch.profiler) in the same process.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _rechunk(t, b, chunk):
    """The (training, backward) configs on chunks of ``chunk`` rows (sub-tiles of half), the state tiles
    widened where 64-row chunks need it."""
    if chunk == t.chunk_size:
        return t, b
    t = t.replace(chunk_size=chunk, sub_chunk=chunk // 2, state_block_v=max(t.state_block_v, chunk // 2))
    return t, b.with_chunking(chunk, chunk // 2)


def launches(member, B, T, H, D, dev, chunk):
    """(inputs, forward launches, backward launches) of the member's training step at the heuristic
    configs with ``split_output`` (the forward: intra, the states-only pass, the output launch;
    ``kda``: bench.py's inputs and call, g >= -5 promised)."""
    do_dht = lambda x: dict(do=torch.randn_like(x["v"]), dht=torch.randn_like(x["initial_state"]))  # noqa: E731
    if member == "kda":
        from bench import LOWER, inputs, train_config_for, bench_plan, shape_hint
        from kdagen.cache.heuristics import default_chunk_bwd_config
        from kdagen.ops.chunk import chunk_kda_bwd_launches

        dt = torch.bfloat16 if dev == "cuda" else torch.float32
        x = inputs(B, T, H, D, D, dtype=dt, device=dev)
        t, b = _rechunk(train_config_for(B, T, H, D, split_output=True),
                        default_chunk_bwd_config(bench_plan(D, D, dt), shape_hint(B, T, H)), chunk)
        fwd, bwd, _ = chunk_kda_bwd_launches(**x, output_final_state=True, safe_gate=True, lower_bound=LOWER,
                                             config=t, bwd_config=b, **do_dht(x))
        return x, fwd, bwd
    from kdagen import load_spec
    from kdagen.ops.member import chunk_member_launches
    import family_vs_fla as F
    from member_train_variants import configs

    x = F.inputs(member, B, T, H, D, D, dev)
    t, b = configs(member, "default", x)
    t, b = _rechunk(t.replace(split_output=True), b, chunk)
    fwd, bwd, _ = chunk_member_launches(load_spec(member), x["q"], x["k"], x["v"], x.get("g"), x.get("beta"),
                                        training=True, config=t, bwd_config=b, initial_state=x["initial_state"],
                                        output_final_state=True, **do_dht(x))
    return x, fwd, bwd


def variant(ln, bv=None, warps=None, stages=None, **const):
    """The launch with another V tile (its grid follows), warps, stages or constexprs."""
    c = {**ln.constexprs, **const}
    grid = ln.grid
    if bv is not None:
        c["BV"] = bv
        grid = (triton.cdiv(c["V"], bv),) + tuple(grid[1:])
    return dataclasses.replace(ln, constexprs=c, grid=grid, num_warps=warps or ln.num_warps,
                               num_stages=stages or ln.num_stages, then=None)


def timed(fn, cuda):
    if not cuda:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    from triton.testing import do_bench
    return float(do_bench(fn, warmup=10, rep=60, return_mode="median"))


FWD = [  # (BV, warps, stages) of the forward pass
    (16, 4, 3), (16, 2, 3), (32, 2, 2), (32, 2, 3), (32, 4, 2), (32, 4, 3), (64, 2, 2), (64, 4, 2), (64, 4, 3)]
OUT = [(64, 64, 4, 2), (64, 128, 4, 2), (128, 64, 4, 2), (128, 64, 8, 2), (64, 64, 4, 3), (32, 128, 4, 2)]
REV = [(16, 4, 3), (16, 2, 3), (32, 2, 2), (32, 2, 3), (32, 4, 2), (32, 4, 3), (64, 2, 2), (64, 4, 2), (64, 4, 3)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--member", default="deltanet")
    ap.add_argument("--shapes", default="2,16384,16,128;1,8192,96,128")
    ap.add_argument("--chunk", type=int, default=32)
    ap.add_argument("--fla", action="store_true")
    ap.add_argument("--out", default=".")
    ap.add_argument("--budget", type=float, default=300)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--quick", action="store_true", help="the states-only pass on four tiles, the default output "
                    "launch, every reverse-pass tile (no fused-pass sweep)")
    args = ap.parse_args()
    cuda = torch.cuda.is_available() and not args.smoke
    dev = "cuda" if cuda else "cpu"
    shapes = [tuple(map(int, s.split(","))) for s in args.shapes.split(";")]
    fwd_v, out_v, rev_v = FWD, OUT, REV
    if args.quick:
        fwd_v, out_v = [(32, 4, 3), (16, 4, 3), (32, 2, 3), (64, 4, 3)], [(128, 64, 4, 2)]
        rev_v = [(16, 4, 3), (32, 4, 3), (32, 4, 4), (32, 8, 3), (32, 8, 4), (64, 4, 3), (64, 4, 4), (64, 8, 3)]
    if args.smoke:
        shapes, fwd_v, out_v, rev_v = [(1, 70, 2, 32)], [(16, 4, 3)], [(16, 32, 4, 2)], [(16, 4, 3)]
    deadline = time.time() + args.budget
    res = []
    for B, T, H, D in shapes:
        x, fwd, bwd = launches(args.member, B, T, H, D, dev, args.chunk)
        for ln in list(fwd) + list(bwd):
            ln()
        state, out = variant(fwd[1], WRITE_O=True), fwd[2]  # the fused pass; the split's output launch
        state()
        rev = next(ln for ln in bwd if ln.kernel == "chunk_bwd_state")
        o_ref = state.args["o"].clone()
        base = dict(shape=[B, T, H, D], C=args.chunk, member=args.member)
        res.append(dict(base, what="fused pass (default)", ms=timed(state, cuda),
                        tile=[state.constexprs["BV"], state.num_warps, state.num_stages]))
        print(res[-1], flush=True)
        for bv, w, s in fwd_v:
            if time.time() > deadline:
                break
            for write_o in ((False,) if args.quick else (True, False)):
                try:
                    ms = timed(variant(state, bv, w, s, WRITE_O=write_o), cuda)
                except Exception as e:  # noqa: BLE001
                    ms = f"{type(e).__name__}: {str(e)[:120]}"
                res.append(dict(base, what="pass" if write_o else "states-only pass", tile=[bv, w, s], ms=ms))
                print(res[-1], flush=True)
        variant(state, WRITE_O=False)()  # the states (hs) and V' are the fused pass's; o is left as it was
        for bv, bk, w, s in out_v:
            if time.time() > deadline:
                break
            state.args["o"].zero_()
            run = variant(out, bv, w, s, BK=bk)
            run()
            diff = float((state.args["o"].float() - o_ref.float()).abs().max())
            res.append(dict(base, what="output launch", tile=[bv, bk, w, s], ms=timed(run, cuda),
                            o_diff_vs_fused=diff, o_max=float(o_ref.float().abs().max())))
            print(res[-1], flush=True)
        res.append(dict(base, what="reverse pass (default)", ms=timed(rev, cuda),
                        tile=[rev.constexprs["BV"], rev.num_warps, rev.num_stages]))
        print(res[-1], flush=True)
        for bv, w, s in rev_v:
            if time.time() > deadline or bv < args.chunk // 2:
                continue
            try:
                ms = timed(variant(rev, bv, w, s), cuda)
            except Exception as e:  # noqa: BLE001
                ms = f"{type(e).__name__}: {str(e)[:120]}"
            res.append(dict(base, what="reverse pass", tile=[bv, w, s], ms=ms))
            print(res[-1], flush=True)
        if args.fla and cuda and args.member != "kda":
            import family_vs_fla as F
            from bench import profile_top
            fla = F.ops(args.member, "fla")
            if fla:
                run = F.fwdbwd_fn(args.member, fla[0], x)
                run()
                rows = profile_top(run, f"FLA {args.member} {(B, T, H, D)}")
                res.append(dict(base, what="FLA fwd+bwd", ms=timed(run, cuda),
                                kernels=[(round(ms, 4), c, n[:60]) for ms, c, n in rows[:12]]))
                print(res[-1], flush=True)
        del x, fwd, bwd
        if cuda:
            torch.cuda.empty_cache()
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"state_pass_variants_{args.member}.json"), "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
