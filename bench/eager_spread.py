"""How much the host moves the eager per-call figure of one decode step (issue 13: eager B=1 <= 15 us).

serving.py's timing suite measures each row's eager figure once (the median of 5 loops of 1,000 calls); in
run 173 the same Python path read 13.2-20.4 us across rows minutes apart.  This script measures the
kdagen B=1 forms round-robin, ROUNDS times each, so that a slow stretch of the host hits every form alike,
and prints each form's median, min and max over the rounds.  GPU only; `--rounds` (default 9).

    PYTHONPATH=. python3 bench/eager_spread.py --rounds 9
"""
import argparse
import statistics
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from serving import decode_case, eager_us  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("eager_spread: needs a GPU")
    forms = {"batch fp32 [K,V]": dict(packed=False, pool_dtype=torch.float32),
             "packed fp32 [K,V]": dict(packed=True, pool_dtype=torch.float32),
             "packed bf16 [K,V]": dict(packed=True, pool_dtype=torch.bfloat16),
             "packed fp32 [K,V] l2norm": dict(packed=True, pool_dtype=torch.float32, l2norm=True),
             "packed fp32 [V,K]": dict(packed=True, pool_dtype=torch.float32, v_first=True)}
    fns = {}
    for name, kw in forms.items():
        fn, _, err, _ = decode_case(1, **kw)
        assert err < 5e-3, (name, err)  # checked against float64 before it is timed
        fns[name] = fn
    got = {name: [] for name in forms}
    for r in range(a.rounds):
        for name, fn in fns.items():
            got[name].append(eager_us(fn))
        print(f"round {r + 1}/{a.rounds}: " + ", ".join(f"{v[-1]:.1f}" for v in got.values()), flush=True)
    print(f"{'form':28s} {'median':>7s} {'min':>6s} {'max':>6s}  (us per eager call, B=1, out= given)")
    for name, v in got.items():
        print(f"{name:28s} {statistics.median(v):7.1f} {min(v):6.1f} {max(v):6.1f}")


if __name__ == "__main__":
    main()
