"""Timing probe (values not checked): do the sequential state passes and the chunk-parallel launches
after them overlap on two CUDA streams, and what does the pair cost together against one after the
other?  The reverse pass (one program per V tile and head: ~6% occupancy at few heads) leaves most of
each SM's issue slots idle; if the chunk-parallel dqkw and wy launches can run beside it, a backward
split into segments of chunks (dqkw of a segment on a side stream once the pass has left it) would
hide most of their time.  Same for the forward's state pass and output launch.

    PYTHONPATH=. python3 bench/overlap_probe.py --member gdn --shapes "2,16384,16,128;1,8192,96,128"

Per shape (median of 25 rounds, CUDA events): each launch alone, the group one after the other on one
stream, and the sequential launch on stream 1 beside the rest on stream 2 (the sequential one launched
first).  The launches are the heuristic's training step at that shape (bench/state_pass_variants.py).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def timed(fn, rounds=25):
    ts = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def main():
    from state_pass_variants import launches

    ap = argparse.ArgumentParser()
    ap.add_argument("--member", default="gdn")
    ap.add_argument("--shapes", default="2,16384,16,128;1,8192,96,128")
    a = ap.parse_args()
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    for shape in a.shapes.split(";"):
        B, T, H, D = (int(v) for v in shape.split(","))
        _, fwd, bwd = launches(a.member, B, T, H, D, "cuda", 32)
        by = {ln.kernel: ln for ln in list(fwd) + list(bwd)}
        for ln in list(fwd) + list(bwd):  # compile, and the buffers the later launches read
            ln()
        torch.cuda.synchronize()
        groups = [("fwd", "chunk_state", ["chunk_out"]),
                  ("bwd", "chunk_bwd_state", ["chunk_bwd_dqkw", "chunk_bwd_wy"]),
                  ("bwd dqkw only", "chunk_bwd_state", ["chunk_bwd_dqkw"])]
        print(f"{a.member} {(B, T, H, D)}", flush=True)
        for name in by:
            print(f"  {name:18s} alone {timed(by[name]):7.3f} ms", flush=True)
        for label, seq, rest in groups:
            def serial():
                by[seq]()
                for n in rest:
                    by[n]()

            def overlapped():
                cur = torch.cuda.current_stream()
                s1.wait_stream(cur)
                s2.wait_stream(cur)
                with torch.cuda.stream(s1):
                    by[seq]()
                with torch.cuda.stream(s2):
                    for n in rest:
                        by[n]()
                cur.wait_stream(s1)
                cur.wait_stream(s2)
            t_ser, t_ov = timed(serial), timed(overlapped)
            print(f"  {label:14s} serial {t_ser:7.3f}  two streams {t_ov:7.3f}  saved {t_ser - t_ov:6.3f} ms",
                  flush=True)


if __name__ == "__main__":
    main()
