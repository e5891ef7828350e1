"""What one eager call costs on this machine's host, and where the B=1 decode op's time goes
(issue 13's "eager per call <= 15 us").

    PYTHONPATH=. python3 bench/launch_floor.py --out "$OUT"

Each row: ``host`` = microseconds per call of the loop before the final synchronisation (what
the host spends per call), ``wall`` = after it (the larger of host and device time per call).
Rows: a PyTorch in-place add (one kernel), a one-pointer Triton kernel through the JIT and
through its compiled launcher (the floor of any Triton launch), a 14-argument one (the decode
kernel's argument count), the decode op (batch and packed forms, fp32 pool, ``out=``), its
direct launch alone, and the pieces of its fast path (signature, argument layout).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@triton.jit
def _one(x):
    tl.store(x, 1.0)


@triton.jit
def _many(a, b, c, d, e, f, g, h, i, j, n1, n2, s1, K: tl.constexpr):
    tl.store(a, tl.load(b) + n1 + n2 + s1)


def per_call(fn, n=2000):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t) / n * 1e6
    return round(host, 2), round(wall, 2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    import kdagen
    import kdagen.ops.recurrent as R
    from serving import decode_case

    rows = []

    def row(name, fn):
        try:
            host, wall = per_call(fn)
            rows.append(dict(name=name, host_us=host, wall_us=wall))
        except Exception as e:  # noqa: BLE001
            rows.append(dict(name=name, error=f"{type(e).__name__}: {str(e)[:200]}"))
        print(json.dumps(rows[-1]), flush=True)

    x = torch.zeros(16, device="cuda")
    row("torch add_ (one kernel)", lambda: x.add_(1.0))
    row("triton JIT, 1 pointer", lambda: _one[(1,)](x))
    k1 = _one[(1,)](x)
    stream = torch.cuda.current_stream().cuda_stream
    p = x.data_ptr()
    row("triton compiled launcher, 1 pointer (int)",
        lambda: k1.run(1, 1, 1, stream, k1.function, k1.packed_metadata, None, None, None, p))
    ts = [torch.zeros(16, device="cuda") for _ in range(10)]
    km = _many[(1,)](*ts, 3, 5, 0.5, K=4)
    ps = [t.data_ptr() for t in ts]
    row("triton compiled launcher, 13 args (ints)",
        lambda: km.run(1, 1, 1, stream, km.function, km.packed_metadata, None, None, None, *ps, 3, 5, 0.5, 4))
    row("triton compiled launcher, 13 args, stream fetched per call",
        lambda: km.run(1, 1, 1, torch._C._cuda_getCurrentRawStream(0), km.function, km.packed_metadata, None, None,
                       None, *ps, 3, 5, 0.5, 4))
    row("torch.cuda.current_stream() per call", lambda: torch.cuda.current_stream())
    for packed in (False, True):
        R._FAST.clear()
        fn, _, _, (xx, pool, slots, cu, out) = decode_case(1, packed, torch.float32)
        form = "packed" if packed else "batch"
        row(f"decode op B=1 {form} fp32 pool", fn)
        with torch.inference_mode():
            row(f"decode op B=1 {form} fp32 pool, under torch.inference_mode()", fn)
        entry = next(iter(R._FAST.values()), None)
        if entry is None:
            continue
        _, _, a = R._outputs_and_args(xx["q"], xx["k"], xx["v"], xx["g"], xx["beta"], scale=entry.scale,
                                      initial_state=pool, output_final_state=False, state_indices=slots, out=out,
                                      dims=entry.dims, cu_seqlens=cu)
        if entry.direct is not None:
            row(f"decode direct launch {form}", lambda: entry.direct(a))
        sig_args = (xx["q"], xx["k"], xx["v"], xx["g"], xx["beta"], pool, slots, out, cu, None, None, ())
        row(f"decode fast-path signature {form} (host only)", lambda: R._signature(*sig_args))
        row(f"decode argument layout {form} (host only)", lambda: R._outputs_and_args(
            xx["q"], xx["k"], xx["v"], xx["g"], xx["beta"], scale=entry.scale, initial_state=pool,
            output_final_state=False, state_indices=slots, out=out, dims=entry.dims, cu_seqlens=cu))
        import cProfile
        import pstats
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(500):
            fn()
        pr.disable()
        torch.cuda.synchronize()
        st = pstats.Stats(pr)
        st.sort_stats("tottime")
        path = os.path.join(args.out, f"launch_floor_profile_{form}.txt")
        with open(path, "w") as f:
            st.stream = f
            st.print_stats(25)
    with open(os.path.join(args.out, "launch_floor.json"), "w") as f:
        json.dump(dict(rows=rows, torch=torch.__version__, triton=triton.__version__), f, indent=1)


if __name__ == "__main__":
    main()
