"""The recurrent backward and state_v_first on a GPU, beside flash-linear-attention (FLA), in one
process on the same inputs; prints a compact table (under 90 s on an H200).

    PYTHONPATH=.:$PYTHONPATH python3 bench/recurrent_bwd_gpu.py [--out DIR] [--fla-chunk]
    TRITON_INTERPRET=1 python3 bench/recurrent_bwd_gpu.py --tiny        # a dry run on the CPU

1. Gradient errors, bf16 inputs (fp32 g and initial state), against float64 autograd through the
   token-by-token recurrence on the same (rounded) inputs: o, dq, dk, dv, dg, dbeta, dh0 of
   kdagen's fused_recurrent_kda -- the plain call (g given, GVA) and the KDA layer's (l2-norm,
   in-kernel gate with A_log/dt_bias, beta sigmoid: dA_log, ddt_bias too).  FLA's
   fused_recurrent_kda: its forward error, and its gradients when its output carries a graph
   (FLA 0.6.0's does not: the table says so).
2. Median times (triton.testing.do_bench) at one training shape, B=4, T=1024, H=16, K=V=128:
   forward, and forward+backward, of both recurrent ops; with ``--fla-chunk`` also both chunk_kda
   forward+backward (FLA's training op; its autotuning compiles for a minute or more cold).
3. state_v_first in bf16: chunk_kda's V-first final and intermediate states are the K-first ones
   transposed; a V-first bf16 state pool decoded with ssm_state_indices matches the K-first pool
   transposed; the recurrent backward's V-first dh0 is the K-first one transposed; and, with FLA,
   kdagen's V-first final state matches FLA's recurrent V-first one (and, with ``--fla-chunk``,
   FLA's chunk_kda's): the layouts agree.
Exit status 1 when a kdagen check fails its bound.  FLA missing: reported, kdagen still runs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

if "--tiny" in sys.argv:  # before triton is imported (kdagen imports it)
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kdagen  # noqa: E402
from kdagen.spec.reference import kda_gate, naive_recurrent_kda  # noqa: E402

T0 = time.time()
LINES: list[str] = []
FAILED: list[str] = []
BOUND_O, BOUND_GRAD = 6e-3, 1.5e-2  # bf16 inputs/outputs (fp32 state), relative Frobenius error
GRADS = ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias")
SHORT = dict(q="dq", k="dk", v="dv", g="dg", beta="dbeta", initial_state="dh0", A_log="dA_log", dt_bias="ddt_bias")


def say(s=""):
    print(s, flush=True)
    LINES.append(s)


def rel(a, b):
    a, b = a.detach().double(), b.detach().double().to(a.device)
    return ((a - b).norm() / b.norm()).item()


def load_fla():
    try:
        import fla
        from fla.ops.kda import chunk_kda, fused_recurrent_kda
        return dict(version=str(getattr(fla, "__version__", "?")), chunk=chunk_kda, recurrent=fused_recurrent_kda)
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        say(f"FLA: not available ({type(e).__name__}: {str(e)[:120]}); kdagen only")
        return None


def make(B, T, H, HV, K, V, dev, dt, layer=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.randn(B, T, H, K, generator=gen)
    x = dict(v=torch.randn(B, T, HV, V, generator=gen).to(dev, dt),
             initial_state=(0.5 * torch.randn(B, HV, K, V, generator=gen)).to(dev))
    if layer:
        x.update(q=q.to(dev, dt), k=k.to(dev, dt), g=torch.randn(B, T, HV, K, generator=gen).to(dev),
                 beta=torch.randn(B, T, HV, generator=gen).to(dev, dt),
                 A_log=torch.log(torch.rand(HV, generator=gen) * 4 + 1).to(dev),
                 dt_bias=(0.5 * torch.randn(HV * K, generator=gen)).to(dev))
        flags = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                     lower_bound=-5.0)
    else:
        k = torch.nn.functional.normalize(k, dim=-1)
        x.update(q=q.to(dev, dt), k=k.to(dev, dt), g=(-5.0 * torch.sigmoid(torch.randn(B, T, HV, K, generator=gen)
                                                                             + 2.0)).to(dev),
                 beta=torch.sigmoid(torch.randn(B, T, HV, generator=gen)).to(dev, dt))
        flags = {}
    return x, flags


def reference(x, flags, do, dht):
    """float64 autograd through the recurrence, on the inputs as given: (o, ht, grads by name)."""
    r = {n: t.detach().double().requires_grad_(True) for n, t in x.items()}
    q, k, g, beta = r["q"], r["k"], r["g"], r["beta"]
    if flags.get("use_qk_l2norm_in_kernel"):
        q, k = torch.nn.functional.normalize(q, dim=-1), torch.nn.functional.normalize(k, dim=-1)
    if flags.get("use_gate_in_kernel"):
        g = kda_gate(g, r["A_log"], r["dt_bias"], lower_bound=flags.get("lower_bound"))
    if flags.get("use_beta_sigmoid_in_kernel"):
        beta = torch.sigmoid(beta)
    o, ht = naive_recurrent_kda(q, k, r["v"], g, beta, initial_state=r["initial_state"], output_final_state=True)
    ((o * do.double()).sum() + (ht * dht.double()).sum()).backward()
    return o.detach(), ht.detach(), {n: t.grad for n, t in r.items()}


def run_grads(fn, x, flags, do, dht):
    """(o, ht, grads or None): grads None when fn's outputs carry no graph."""
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in x.items()}
    o, ht = fn(**leaves, **flags, output_final_state=True)
    if not (o.requires_grad and o.grad_fn is not None):
        return o.detach(), ht.detach(), None
    ((o.float() * do).sum() + (ht * dht).sum()).backward()
    return o.detach(), ht.detach(), {n: t.grad for n, t in leaves.items()}


def errors_section(fla, dev, tiny):
    B, T, H, HV, D = (1, 19, 1, 2, 32) if tiny else (2, 256, 2, 4, 128)
    dt = torch.float32 if tiny else torch.bfloat16  # bf16 is wrong in the interpreter
    say(f"1. gradient errors vs float64 autograd ({str(dt)[6:]} inputs), B={B} T={T} H={H} HV={HV} K=V={D}")
    head = f"{'':26}" + "".join(f"{c:>9}" for c in ["o"] + [SHORT[n] for n in GRADS])
    say(head)
    for layer in (False, True):
        x, flags = make(B, T, H, HV, D, D, dev, dt, layer)
        gen = torch.Generator().manual_seed(7)
        do = torch.randn(B, T, HV, D, generator=gen).to(dev)
        dht = torch.randn(B, HV, D, D, generator=gen).to(dev)
        ro, rht, rg = reference(x, flags, do, dht)
        libs = [("kdagen", kdagen.fused_recurrent_kda)]
        if fla is not None:
            libs.append((f"FLA {fla['version']}", fla["recurrent"]))
        for name, fn in libs:
            label = f"{name} {'layer' if layer else 'plain'}"
            try:
                o, ht, grads = run_grads(fn, x, flags, do, dht)
            except Exception as e:  # noqa: BLE001
                say(f"{label:26} failed: {type(e).__name__}: {str(e)[:100]}")
                if name == "kdagen":
                    FAILED.append(f"{label}: {type(e).__name__}")
                continue
            errs = [rel(o, ro)]
            cells = [f"{errs[0]:9.1e}"]
            for n in GRADS:
                if n not in x:
                    cells.append(f"{'-':>9}")
                elif grads is None:
                    cells.append(f"{'n/a':>9}")
                else:
                    e = rel(grads[n], rg[n])
                    errs.append(e)
                    cells.append(f"{e:9.1e}")
            note = "  (outputs carry no gradient)" if grads is None else ""
            say(f"{label:26}" + "".join(cells) + note)
            if name == "kdagen":
                if grads is None or errs[0] > BOUND_O or max(errs[1:]) > BOUND_GRAD or not all(e == e for e in errs):
                    FAILED.append(f"{label}: errors {['%.1e' % e for e in errs]}")


def timing_section(fla, dev, tiny, fla_chunk):
    B, T, H, D = (1, 16, 2, 32) if tiny else (4, 1024, 16, 128)
    dt = torch.float32 if tiny else torch.bfloat16
    say(f"\n2. time at B={B} T={T} H={H} K=V={D} ({str(dt)[6:]}), median ms" + (" (interpreter: one call)" if tiny else ""))
    x, flags = make(B, T, H, H, D, D, dev, dt)
    do = torch.randn(B, T, H, D, device=dev)
    if tiny:
        def ms(fn):
            t = time.perf_counter()
            fn()
            return 1e3 * (time.perf_counter() - t)
    else:
        from triton.testing import do_bench

        def ms(fn):
            return float(do_bench(fn, warmup=10, rep=150, return_mode="median"))
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in x.items()}

    def fwd(fn):
        def run():
            with torch.no_grad():
                fn(**x, **flags, output_final_state=True)
        return run

    def fwdbwd(fn):
        def run():
            for t in leaves.values():
                t.grad = None
            o, ht = fn(**leaves, **flags, output_final_state=True)
            (o.float() * do).sum().add(ht.sum()).backward()
        return run

    rows = [("kdagen fused_recurrent_kda", kdagen.fused_recurrent_kda)]
    if fla is not None:
        rows.append((f"FLA fused_recurrent_kda", fla["recurrent"]))
    if fla_chunk:
        rows.append(("kdagen chunk_kda", kdagen.chunk_kda))
        if fla is not None:
            rows.append(("FLA chunk_kda", fla["chunk"]))
    say(f"{'':28}{'fwd':>10}{'fwd+bwd':>10}")
    res = {}
    for name, fn in rows:
        try:
            f = ms(fwd(fn))
        except Exception as e:  # noqa: BLE001
            say(f"{name:28} failed: {type(e).__name__}: {str(e)[:100]}")
            continue
        try:
            with torch.enable_grad():
                probe = fn(**leaves, **flags, output_final_state=True)[0]
            fb = ms(fwdbwd(fn)) if probe.grad_fn is not None else None
        except Exception as e:  # noqa: BLE001
            say(f"{name:28} backward failed: {type(e).__name__}: {str(e)[:100]}")
            fb = None
        res[name] = (f, fb)
        say(f"{name:28}{f:10.3f}" + (f"{fb:10.3f}" if fb is not None else f"{'no bwd':>10}"))
    a, b = res.get("kdagen fused_recurrent_kda"), res.get("FLA fused_recurrent_kda")
    if a and b:
        say(f"{'FLA / kdagen recurrent, fwd':28}{b[0] / a[0]:10.2f}")
    c, d = res.get("kdagen chunk_kda"), res.get("FLA chunk_kda")
    if c and d and c[1] and d[1]:
        say(f"{'FLA / kdagen chunk':28}{d[0] / c[0]:10.2f}{d[1] / c[1]:10.2f}")
    if a and a[1] and d and d[1]:
        say(f"{'FLA chunk / kdagen recurrent':28}{d[0] / a[0]:10.2f}{d[1] / a[1]:10.2f}")
    return res


def state_v_first_section(fla, dev, tiny, fla_chunk=False):
    """V-first vs K-first (transposed) in bf16, and vs FLA's V-first states."""
    dt = torch.float32 if tiny else torch.bfloat16
    B, T, H, HV, K, V = (1, 40, 1, 2, 32, 48) if tiny else (2, 300, 2, 4, 128, 64)
    say(f"\n3. state_v_first ({str(dt)[6:]}), B={B} T={T} H={H} HV={HV} K={K} V={V}: rel. error, V-first vs "
        "K-first transposed")
    x, _ = make(B, T, H, HV, K, V, dev, dt, seed=3)
    tr = lambda s: s.transpose(-1, -2).contiguous()  # noqa: E731
    xv = dict(x, initial_state=tr(x["initial_state"]))
    checks = []
    with torch.no_grad():
        kw = dict(output_final_state=True, return_intermediate_states=True, chunk_size=64)
        o1, h1, s1 = kdagen.chunk_kda(**x, **kw)
        o2, h2, s2 = kdagen.chunk_kda(**xv, **kw, state_v_first=True)
        checks += [("chunk_kda o", rel(o2, o1)), ("chunk_kda final state", rel(tr(h2), h1)),
                   ("chunk_kda intermediate states", rel(tr(s2), s1))]
        # decode one token into a bf16 pool through slots, K-first and V-first
        pool_k = x["initial_state"].to(dt if not tiny else torch.float32)
        pool_k = torch.cat([pool_k, torch.zeros_like(pool_k[:1])])
        pool_v = tr(pool_k)
        idx = torch.tensor([B] + list(range(1, B)), dtype=torch.int32, device=dev)[:B]
        step = {n: t[:, :1] for n, t in x.items() if n != "initial_state"}
        od_k, _ = kdagen.fused_recurrent_kda(**step, initial_state=pool_k, ssm_state_indices=idx)
        od_v, _ = kdagen.fused_recurrent_kda(**step, initial_state=pool_v, ssm_state_indices=idx, state_v_first=True)
        checks += [("decode o (pool)", rel(od_v, od_k)), ("decode pool", rel(tr(pool_v).float(), pool_k.float()))]
    # the recurrent backward's dh0
    dh0 = []
    for v_first, xx in ((False, x), (True, xv)):
        h0 = xx["initial_state"].clone().requires_grad_(True)
        o, ht = kdagen.fused_recurrent_kda(**dict(xx, initial_state=h0), output_final_state=True, state_v_first=v_first)
        gen = torch.Generator().manual_seed(5)
        dht = torch.randn(B, HV, K, V, generator=gen).to(dev)
        (o.float().sum() + (ht * (tr(dht) if v_first else dht)).sum()).backward()
        dh0.append(tr(h0.grad) if v_first else h0.grad)
    checks.append(("recurrent backward dh0", rel(dh0[1], dh0[0])))
    for name, e in checks:
        # the same arithmetic on other addresses: equal up to the order of a reduction (a layout
        # slip is an O(1) error); the pool is bf16, rounded once more after an fp32 update
        ok = e <= 1e-5 or (name.startswith("decode pool") and e <= 1e-2)
        say(f"  {name:34}{e:9.1e}  {'OK' if ok else 'FAIL'}")
        if not ok:
            FAILED.append(f"state_v_first {name}: {e:.1e}")
    if fla is not None:
        try:
            with torch.no_grad():
                _, hr = fla["recurrent"](**xv, output_final_state=True, state_v_first=True)
                theirs = [("FLA recurrent V-first final state", hr)]
                if fla_chunk:  # FLA's chunk forward autotunes (slow when cold)
                    theirs.append(("FLA chunk_kda V-first final state", fla["chunk"](
                        **xv, output_final_state=True, state_v_first=True)[1]))
            for name, h in theirs:
                e = rel(h2, h)
                say(f"  {name:34}{e:9.1e}  (kdagen chunk_kda's V-first vs FLA's)")
                if not e <= 2e-2:
                    FAILED.append(f"state_v_first: kdagen's V-first final state differs from FLA's ({name}: {e:.1e})")
        except Exception as e:  # noqa: BLE001
            say(f"  FLA with state_v_first failed: {type(e).__name__}: {str(e)[:100]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="directory for recurrent_bwd.json / recurrent_bwd.log")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes in Triton's CPU interpreter (fp32)")
    ap.add_argument("--fla-chunk", action="store_true", help="also time both chunk_kda forward+backward")
    ap.add_argument("--with-fla", action="store_true", help="with --tiny: run FLA's part too (a CPU-capable FLA)")
    args = ap.parse_args()
    if args.tiny:  # an FLA on the path runs there too (the tests put a fake one there)
        dev, fla = "cpu", (load_fla() if args.with_fla else None)
    else:
        if not torch.cuda.is_available():
            print("no GPU: run with --tiny (TRITON_INTERPRET=1) for a dry run", file=sys.stderr)
            return 2
        dev, fla = "cuda", load_fla()
        say(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, kdagen {kdagen.__version__}"
            + (f", FLA {fla['version']}" if fla else ""))
    errors_section(fla, dev, args.tiny)
    timing = timing_section(fla, dev, args.tiny, args.fla_chunk)
    state_v_first_section(fla, dev, args.tiny, args.fla_chunk)
    say(f"\n{'FAILED: ' + '; '.join(FAILED) if FAILED else 'all kdagen checks OK'} ({time.time() - T0:.0f} s)")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "recurrent_bwd.log"), "w") as f:
            f.write("\n".join(LINES) + "\n")
        with open(os.path.join(args.out, "recurrent_bwd.json"), "w") as f:
            json.dump(dict(lines=LINES, failed=FAILED, timing={k: list(v) for k, v in timing.items()}), f, indent=1)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
