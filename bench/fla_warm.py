"""Fill Triton's on-disk compile cache with every autotuning candidate of FLA's KDA kernels, in
parallel worker processes, so that the measuring process's own autotuning only benchmarks.

FLA autotunes each kernel over up to a few dozen configs on first use, and Triton compiles them
one after another: minutes per shape on the H200 (bench/RESULTS.md, runs 6 and 7), more than a
device call can spare. Worker i of N replaces `Autotuner.prune_configs` so that it keeps only
candidates i, i+N, ... and runs FLA's forward and forward+backward at the benchmark's shapes;
the compiled kernels land in the shared TRITON_CACHE_DIR. The measuring process
(`bench/bench.py`) then autotunes over the full candidate list as FLA always does: every
candidate is benchmarked there and FLA picks its winner, only the compiles are cache hits.
The workers' own timings are thrown away (they run side by side on one GPU).

    TRITON_CACHE_DIR=/tmp/tc PYTHONPATH=/tmp/site:. python3 bench/fla_warm.py --workers 14
"""
import argparse
import multiprocessing as mp
import os
import sys
import time

SHAPES = [(1, 8192, 96, 128, 128), (2, 16384, 16, 128, 128), (1, 512, 2, 128, 128), (2, 200, 2, 96, 192)]


def keep_share_of_configs(index, count):
    """From now on in this process, every Triton autotuner keeps only its candidates index,
    index + count, ... (at least one): worker ``index`` of ``count`` compiles its share."""
    from triton.runtime import autotuner

    original = autotuner.Autotuner.prune_configs

    def my_share(self, kwargs):
        configs = original(self, kwargs)
        return configs[index::count] or configs[:1]

    autotuner.Autotuner.prune_configs = my_share


def _worker(index, count, shapes, queue):
    import torch

    keep_share_of_configs(index, count)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench import GRAD_NAMES, LOWER, inputs  # the benchmark's own input recipe
    from fla.ops.kda import chunk_kda

    done = 0
    for B, T, H, K, V in shapes:
        try:
            x = inputs(B, T, H, K, V)
            with torch.no_grad():
                chunk_kda(**x, output_final_state=True, safe_gate=True, lower_bound=LOWER)
            for n in GRAD_NAMES:
                x[n] = x[n].detach().requires_grad_(True)
            o, s = chunk_kda(**x, output_final_state=True, safe_gate=True, lower_bound=LOWER)
            torch.autograd.grad((o, s), [x[n] for n in GRAD_NAMES], (torch.randn_like(o), torch.randn_like(s)))
            torch.cuda.synchronize()
            done += 1
        except Exception as e:  # noqa: BLE001
            queue.put((index, f"shape {(B, T, H, K, V)}: {type(e).__name__}: {str(e)[:200]}"))
        torch.cuda.empty_cache()
    queue.put((index, f"done {done}/{len(shapes)} shapes"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=14)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    start = time.time()
    procs = [ctx.Process(target=_worker, args=(i, args.workers, SHAPES, queue)) for i in range(args.workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    while not queue.empty():
        i, msg = queue.get()
        print(f"[fla_warm] worker {i}: {msg}", flush=True)
    bad = [i for i, p in enumerate(procs) if p.exitcode != 0]
    print(f"[fla_warm] {args.workers} workers in {time.time() - start:.0f} s; exit codes non-zero: {bad}", flush=True)


if __name__ == "__main__":
    main()
