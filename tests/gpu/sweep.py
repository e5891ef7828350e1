"""GPU sweep: every member and form at every head dim and dtype, against the float64 recurrence.

Runs on a CUDA machine (CI never runs it: there is no GPU there).  For each member (kda, gdn,
delta, gla, dplr), head dim K = V, dtype (float32, float16, bfloat16) and layout (fixed length,
varlen, FLA's positive draws), four forms are run through the public ops and compared with kdagen's float64
reference (:mod:`kdagen.spec.reference`) on the same device:

- ``chunk_fwd``: the chunk op without gradients (the inference forward);
- ``chunk_bwd``: the chunk op with gradients of every input, the initial state included;
- ``decode``: the recurrent op;
- ``decode_bwd``: the recurrent op with gradients.

A fault that kills the CUDA context (a misaligned address, an illegal access) must not hide
the cases after it: each (member, K, dtype) group runs in a worker process, every case is
logged before it starts, and a worker that dies is restarted after the case it died on.
Every launch goes through :func:`kdagen.kernels.launch`; the worker records the last kernel
launched, so a fault names its kernel (``CUDA_LAUNCH_BLOCKING=1`` is set for the workers so
the failing launch is the last one).

    python tests/gpu/sweep.py --out DIR [--workers 12] [--members kda,gdn] [--dims 60,100]
        [--dtypes float16,bfloat16] [--budget 540] [--cases CASES.json]

Prints one line per case and a table at the end; writes ``DIR/sweep.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MEMBERS = ("kda", "gdn", "delta", "gla", "dplr")
DIMS = (16, 24, 40, 60, 64, 80, 96, 100, 120, 128, 160, 192, 200, 256)
DTYPES = ("float32", "float16", "bfloat16")
FORMS = ("chunk_fwd", "chunk_bwd", "decode", "decode_bwd")
# fixed length, packed sequences, and FLA's op-test inputs: q, k, v drawn from [0, 1) (nearly parallel keys
# after the l2-norm: an ill-conditioned triangular solve), longer sequences, gates near 0
LAYOUTS = ("fixed", "varlen", "positive")
# relative Frobenius error allowed against float64: a sweep for faults and garbage, not for the last bit
# (float32 dots run as tf32 on the GPU by default)
TOL = {"float32": 5e-3, "float16": 1e-2, "bfloat16": 3e-2}
VARLEN = (0, 1, 37, 100, 165)


# ------------------------------------------------------------------------------------ worker


def _inputs(member: str, K: int, dtype, layout: str, device, seed: int):
    import torch
    import torch.nn.functional as F

    gen = torch.Generator(device="cpu").manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=gen)

    if layout == "varlen":
        B, T, cu = 1, VARLEN[-1], torch.tensor(VARLEN, dtype=torch.long)
    else:
        B, T, cu = 2, (100 if layout == "fixed" else 512), None
    N = B if cu is None else len(VARLEN) - 1
    H = 2
    if layout == "positive":
        def r(*shape):  # noqa: F811 - FLA's draws
            return torch.rand(*shape, generator=gen)
    q, k, v = r(B, T, H, K), F.normalize(r(B, T, H, K), dim=-1), r(B, T, H, K)
    x = dict(q=q, k=k, v=v, h0=0.5 * r(N, H, K, K))
    if member in ("kda", "gla"):
        x["g"] = F.logsigmoid(r(B, T, H, K)) / 2
    if member == "gdn":
        x["g"] = F.logsigmoid(r(B, T, H)) / 2
    if member in ("kda", "gdn", "delta"):
        x["beta"] = torch.sigmoid(r(B, T, H))
    if member == "dplr":
        a = F.normalize(torch.rand(B, T, H, K, generator=gen), dim=-1)
        x.update(a=a, b=-a, g=F.logsigmoid(r(B, T, H, K)) / 4)
    out = {}
    for n, t in x.items():
        dt = torch.float32 if n in ("h0", "g") else dtype
        out[n] = t.to(device=device, dtype=dt)
    return out, (None if cu is None else cu.to(device))


def _call(member: str, form: str, x: dict, cu):
    import kdagen

    chunk = form.startswith("chunk")
    kw = dict(initial_state=x["h0"], output_final_state=True, cu_seqlens=cu)
    if member == "kda":
        op = kdagen.chunk_kda if chunk else kdagen.fused_recurrent_kda
        return op(x["q"], x["k"], x["v"], x["g"], x["beta"], **kw)
    if member == "gdn":
        op = kdagen.chunk_gated_delta_rule if chunk else kdagen.fused_recurrent_gated_delta_rule
        return op(x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"], **kw)
    if member == "delta":
        op = kdagen.chunk_delta_rule if chunk else kdagen.fused_recurrent_delta_rule
        return op(x["q"], x["k"], x["v"], beta=x["beta"], **kw)
    if member == "gla":
        if chunk:
            return kdagen.chunk_gla(x["q"], x["k"], x["v"], x["g"], **kw)
        return kdagen.fused_recurrent_gla(x["q"], x["k"], x["v"], gk=x["g"], **kw)
    op = kdagen.chunk_dplr_delta_rule if chunk else kdagen.fused_recurrent_dplr_delta_rule
    return op(x["q"], x["k"], x["v"], x["a"], x["b"], x["g"], **kw)


def _reference(member: str, x: dict, cu):
    from kdagen.spec import reference as R

    kw = dict(initial_state=x["h0"], output_final_state=True, cu_seqlens=cu)
    if member == "kda":
        return R.naive_recurrent_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], **kw)
    if member == "gdn":
        return R.naive_recurrent_gdn(x["q"], x["k"], x["v"], x["g"], x["beta"], **kw)
    if member == "delta":
        return R.naive_recurrent_deltanet(x["q"], x["k"], x["v"], x["beta"], **kw)
    if member == "gla":
        return R.naive_recurrent_gla(x["q"], x["k"], x["v"], x["g"], **kw)
    # FLA's (a, b) are the spec's (a', b') = (-b, a): S += b (a^T S)  <=>  S -= (-b) (a^T S)
    return R.naive_recurrent_dplr(x["q"], x["k"], x["v"], -x["b"], x["a"], x["g"], **kw)


def _rel(a, b) -> float:
    import torch

    a, b = a.detach().double(), b.detach().double()
    if not torch.isfinite(a).all():
        return float("inf")
    n = b.norm().item()
    return (a - b).norm().item() / (n if n > 0 else 1.0)


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def run_case(member: str, K: int, dtype_name: str, layout: str, form: str, seed: int = 0) -> dict:
    """One case: ``{"errors": {name: rel err}, "worst": ..., "ok": bool}``."""
    import torch

    dtype = getattr(torch, dtype_name)
    device = torch.device(os.environ.get("KDAGEN_SWEEP_DEVICE", "cuda"))
    x, cu = _inputs(member, K, dtype, layout, device, seed)
    grad = form.endswith("bwd")
    names = [n for n in x if n != "h0"] + ["h0"]
    leaves = {n: t.detach().clone().requires_grad_(grad) for n, t in x.items()}
    with torch.set_grad_enabled(grad):
        o, ht = _call(member, form, leaves, cu)
    _sync(device)
    ref_leaves = {n: t.detach().double().requires_grad_(grad) for n, t in x.items()}
    with torch.set_grad_enabled(grad):
        ro, rht = _reference(member, ref_leaves, cu)
    errs = {"o": _rel(o, ro), "ht": _rel(ht, rht)}
    if grad:
        gen = torch.Generator(device="cpu").manual_seed(seed + 1)
        do = torch.randn(ro.shape, generator=gen).to(device)
        dht = torch.randn(rht.shape, generator=gen).to(device)
        ((o.float() * do).sum() + (ht * dht).sum()).backward()
        ((ro * do.double()).sum() + (rht * dht.double()).sum()).backward()
        _sync(device)
        for n in names:
            g, rg = leaves[n].grad, ref_leaves[n].grad
            if rg is None or rg.norm().item() == 0:
                continue
            errs["d" + n] = float("inf") if g is None else _rel(g, rg)
    worst = max(errs.values())
    return {"errors": errs, "worst": worst, "ok": worst <= TOL[dtype_name]}


def _last_launch():
    """Record the last kernel every launch ran (its name and constexprs), for a fault's report."""
    import kdagen.kernels as KK

    state = {"kernel": None}
    inner = KK.launch

    def recording(fn, grid, args, constexprs, num_warps, num_stages):
        state["kernel"] = {"name": getattr(fn, "__name__", str(fn)), "grid": list(grid), "num_warps": num_warps,
                           "num_stages": num_stages,
                           "constexprs": {k: (v if isinstance(v, (int, float, bool, str)) else str(v))
                                          for k, v in constexprs.items()}}
        return inner(fn, grid, args, constexprs, num_warps, num_stages)

    KK.launch = recording
    return state


def worker(member: str, K: int, dtype: str, skip: set[str], log: Path) -> int:
    """Run one group's cases; append one JSON line per case start and end to ``log``."""
    last = _last_launch()
    with open(log, "a") as f:
        for case, layout, form in _cases(member, K, dtype):
            if case in skip:
                continue
            f.write(json.dumps({"case": case, "status": "start"}) + "\n")
            f.flush()
            t0 = time.time()
            rec = {"case": case, "member": member, "form": form, "K": K, "dtype": dtype, "layout": layout}
            try:
                res = run_case(member, K, dtype, layout, form)
                rec.update(res, status="pass" if res["ok"] else "wrong")
            except Exception as e:  # noqa: BLE001 - every failure is a result here
                msg = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                fault = "CUDA error" in msg or "an illegal" in msg or "misaligned" in msg
                rec.update(status="fault" if fault else "error", error=msg, kernel=last["kernel"],
                           trace=traceback.format_exc()[-1500:])
                if fault:
                    rec["seconds"] = round(time.time() - t0, 2)
                    f.write(json.dumps(rec) + "\n")
                    f.flush()
                    return 3  # the context is lost: the driver restarts after this case
            rec["seconds"] = round(time.time() - t0, 2)
            f.write(json.dumps(rec) + "\n")
            f.flush()
    return 0


# ------------------------------------------------------------------------------------ driver


def _read(log: Path) -> tuple[list[dict], str | None]:
    done, started = [], None
    if log.exists():
        for line in log.read_text().splitlines():
            r = json.loads(line)
            if r["status"] == "start":
                started = r["case"]
            elif r["status"] == "cut":  # stopped by the budget, not by a fault: run it again next time
                started = None
            else:
                done.append(r)
                started = None
    return done, started


def _cases(member: str, K: int, dtype: str) -> list[tuple[str, str, str]]:
    """A group's cases in the order a worker runs them: (name, layout, form)."""
    return [(f"{member}/{form}/K{K}/{dtype}/{layout}", layout, form) for layout in LAYOUTS for form in FORMS]


def _group(member: str, K: int, dtype: str, logdir: Path, deadline: float, only: set[str] | None = None):
    """Run one group's cases not yet in its log (``only``: just these) in worker processes, restarting a
    worker that died after the case it died on."""
    log = logdir / f"{member}_{K}_{dtype}.jsonl"
    others = set() if only is None else {c for c, _, _ in _cases(member, K, dtype)} - only
    env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1"}
    for _ in range(len(LAYOUTS) * len(FORMS)):
        done, crashed = _read(log)
        if crashed is not None:  # the process died inside this case (no Python exception got out)
            with open(log, "a") as f:
                f.write(json.dumps({"case": crashed, "status": "crash", "member": member, "K": K, "dtype": dtype,
                                    "form": crashed.split("/")[1], "layout": crashed.split("/")[-1]}) + "\n")
            done, _ = _read(log)
        skip = {r["case"] for r in done} | others
        if len(skip) >= len(LAYOUTS) * len(FORMS) or time.time() > deadline:
            return
        cmd = [sys.executable, __file__, "--worker", f"{member},{K},{dtype}", "--log", str(log),
               "--skip", ";".join(sorted(skip))]
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=max(5, deadline - time.time()))
        except subprocess.TimeoutExpired:
            _, started = _read(log)
            if started is not None:
                with open(log, "a") as f:
                    f.write(json.dumps({"case": started, "status": "cut"}) + "\n")
            return
        if p.returncode == 0:
            return
        if p.returncode not in (3,):
            (logdir / f"{member}_{K}_{dtype}.stderr").write_text(p.stderr[-4000:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="sweep-out")
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--members", default=",".join(MEMBERS))
    ap.add_argument("--dims", default=",".join(map(str, DIMS)))
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--budget", type=float, default=540.0, help="seconds; a case still running then is cut (and rerun by the next sweep into the same --out), later ones are skipped")
    ap.add_argument("--cases", help="a JSON file listing case names (member/form/K../dtype/layout): run only those")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--log", help=argparse.SUPPRESS)
    ap.add_argument("--skip", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        m, K, dt = a.worker.split(",")
        sys.exit(worker(m, int(K), dt, set(filter(None, a.skip.split(";"))), Path(a.log)))

    out = Path(a.out)
    logdir = out / "sweep_logs"
    logdir.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + a.budget
    groups = [(m, int(K), dt) for dt in a.dtypes.split(",") for K in a.dims.split(",") for m in a.members.split(",")]
    only = None
    if a.cases:
        only = set(json.loads(Path(a.cases).read_text()))
        groups = [g for g in groups if only & {c for c, _, _ in _cases(*g)}]
    with ThreadPoolExecutor(a.workers) as ex:
        list(ex.map(lambda g: _group(*g, logdir, deadline, only), groups))
    results = []
    for m, K, dt in groups:
        done, _ = _read(logdir / f"{m}_{K}_{dt}.jsonl")
        results += done
    (out / "sweep.json").write_text(json.dumps(results, indent=1))
    _table(results, groups, len(only) if only is not None else len(groups) * len(FORMS) * len(LAYOUTS))


def _table(results: list[dict], groups, asked: int) -> None:
    by = {(r["member"], r["form"], r["K"], r["dtype"], r["layout"]): r for r in results}
    counts: dict[str, int] = {}
    for r in results:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    bad = [r for r in results if r["status"] != "pass"]
    print(f"\n{len(results)} cases run of {asked}: "
          + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    for r in sorted(bad, key=lambda r: (r["member"], r["form"], r["K"], r["dtype"], r["layout"])):
        what = r.get("error") or f"worst {r.get('worst', float('nan')):.2e} " + json.dumps(
            {k: float(f"{v:.2e}") for k, v in r.get("errors", {}).items()})
        kern = r.get("kernel") or {}
        print(f"  {r['status']:5s} {r['member']}/{r['form']}/K{r['K']}/{r['dtype']}/{r['layout']}: {what[:220]}"
              + (f" [kernel {kern.get('name')}]" if kern else ""))
    # member x form x dtype: the head dims that did not pass
    print("\nmember  form        dtype     fails (K)")
    for m in MEMBERS:
        for f in FORMS:
            for dt in DTYPES:
                ks = sorted({K for (mm, ff, K, dd, _), r in by.items() if (mm, ff, dd) == (m, f, dt)})
                if not ks:
                    continue
                fails = sorted({K for (mm, ff, K, dd, _), r in by.items()
                                if (mm, ff, dd) == (m, f, dt) and r["status"] != "pass"})
                print(f"{m:7s} {f:11s} {dt:9s} {len(ks)} dims run; " + (", ".join(map(str, fails)) if fails else "all pass"))


if __name__ == "__main__":
    main()
