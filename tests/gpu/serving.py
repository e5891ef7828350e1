"""The serving path on a GPU (issue 13): proofs first, then decode timings, in about a minute.

    PYTHONPATH=. python tests/gpu/serving.py --out "$OUT"            # on the GPU, FLA beside it if importable
    TRITON_INTERPRET=1 python tests/gpu/serving.py --out /tmp/s      # a CPU dry run of the same code, tiny shapes

Sections (``--suite``, comma-separated; each runs even if an earlier one failed):

- ``sync``:   ``torch.cuda.set_sync_debug_mode("error")`` around fused_recurrent_kda -- the first
              call of a geometry (validation, planning, compile) and later ones, batch and packed
              forms, fp32 and bf16 pools -- and around chunk_kda (batch; packed with
              ``cu_seqlens_cpu``; packed with the offsets on the device only). Any host
              synchronisation raises.
- ``graph``:  the packed decode (cu_seqlens and slots on the device) captured in a CUDA graph and
              replayed step after step with new tokens copied into its inputs: every step's o and
              the pool against the same steps run eagerly, and against float64; on a [K, V] pool
              and on a [V, K] one (``state_v_first``).
- ``prefill_graph``: chunk_kda with packed sequences (device cu_seqlens, ``use_graph=True``)
              captured once and replayed with new lengths of the same total, against eager calls.
- ``gates``:  bf16, g at the bound (-5), below it (-8, -20) and -inf, against float64: decode,
              chunk_kda with ``safe_gate=True, lower_bound=-5`` (inference), and its training
              call with ``check_gate_bound=True`` configs (forward and every gradient against
              float64 autograd).
- ``timing``: decode, H=32, K=V=128, B = 1, 16, 256: kdagen batch and packed forms with the
              fp32 pool, the packed form with a bf16 pool, FLA's batch and packed forms (fp32
              pool): CUDA-graph replay (10 steps per graph) and eager per call (``out=`` given);
              the B=1 eager cost split into the op's Python and its launch.  With ``--layouts
              kv,vk`` (the default) also the packed forms on a pool laid out [P, HV, V, K]
              (``state_v_first=True``, FLA's keyword): kdagen's fp32 and bf16 pools, FLA's fp32.
- ``drift``:  a bf16 pool against the fp32 pool over 1,000 decode steps at B=256, on the same
              tokens: o and state relative errors at steps 1, 10, 100, 1000.

Writes ``serving.json`` (every number) and ``serving.log`` under --out; prints the tables and one
``PASS``/``FAIL``/``MISS`` line per claim last. Exit status 1 when a proof fails (not when a
timing target is missed).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import kdagen  # noqa: E402
import kdagen.ops.recurrent as R  # noqa: E402
from kdagen.config import ChunkFwdConfig  # noqa: E402
from kdagen.kernels import launch as generic_launch  # noqa: E402
from kdagen.spec.reference import naive_recurrent_kda  # noqa: E402

GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
DEV = "cuda" if GPU else "cpu"
LOWER = -5.0
OUT = {"rows": [], "claims": []}
LOG: list[str] = []
T0 = time.time()


def log(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    LOG.append(s)


def claim(name: str, ok: bool | None, detail: str, proof: bool = True):
    """One line of the verdict: a proof (PASS/FAIL) or a target (PASS/MISS); None: not run."""
    word = "SKIP" if ok is None else ("PASS" if ok else ("FAIL" if proof else "MISS"))
    OUT["claims"].append(dict(name=name, result=word, detail=detail, proof=proof))
    log(f"{word}: {name} -- {detail}")


def rel_err(a, b) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


# ----------------------------------------------------------------------------------- inputs


class Geometry:
    """One decode step's shapes: B sequences of one token, H heads (HV = H), head dims K, V."""

    def __init__(self, B, H, K, V, dtype=torch.bfloat16):
        self.B, self.H, self.K, self.V, self.dtype = B, H, K, V, dtype

    def tokens(self, gen, packed: bool, slow_decay: bool = False):
        """Fresh q, k, v, g, beta for one step ([B, 1, ...] or packed [1, B, ...]) on DEV; g in
        [-5, 0) (or in [-0.55, -0.05] with ``slow_decay``: long memory, the worst case for drift)."""
        lead = (1, self.B) if packed else (self.B, 1)
        r = lambda *s: torch.randn(*lead, *s, generator=gen, device=DEV)  # noqa: E731
        u = lambda *s: torch.rand(*lead, *s, generator=gen, device=DEV)  # noqa: E731
        q, k, v = r(self.H, self.K), torch.nn.functional.normalize(r(self.H, self.K), dim=-1), r(self.H, self.V)
        g = -(0.05 + 0.5 * u(self.H, self.K)) if slow_decay else LOWER * torch.sigmoid(r(self.H, self.K) + 2.0)
        beta = torch.sigmoid(r(self.H))
        c = lambda x: x.to(self.dtype)  # noqa: E731
        return dict(q=c(q), k=c(k), v=c(v), g=g.float(), beta=c(beta))

    def pool(self, gen, dtype=torch.float32, extra=3):
        """A pool with a few slots more than sequences; sequence n uses slot (7 n) mod P (a
        permutation: P is not a multiple of 7), computed on the device (no host round trip)."""
        P = pool_slots(self.B, extra)
        pool = (0.1 * torch.randn(P, self.H, self.K, self.V, generator=gen, device=DEV)).to(dtype)
        slots = (torch.arange(self.B, device=DEV) * 7) % P
        return pool, slots.to(torch.int32)

    def cu(self):
        return torch.arange(self.B + 1, device=DEV, dtype=torch.int64)


def pool_slots(B, extra=3):
    """The slots of a benchmark pool for B sequences: B + extra, one more where that is a multiple of 7
    (so that n -> (7 n) mod P is a permutation)."""
    return B + extra + (1 if (B + extra) % 7 == 0 else 0)


def generator(seed):
    return torch.Generator(device=DEV).manual_seed(seed)


def reference_step(x, pool, slots, packed, first=8, l2norm=False):
    """The float64 recurrence of one step for the first ``first`` sequences: (o laid out as the
    op lays out those sequences, their new states).  ``l2norm``: q and k normalised first
    (use_qk_l2norm_in_kernel)."""
    pick = (lambda t: t[:, :first].transpose(0, 1)) if packed else (lambda t: t[:first])  # noqa: E731  [n, 1, ...]
    ref = [pick(x[n]).double().cpu() for n in ("q", "k", "v", "g", "beta")]
    if l2norm:
        ref[0], ref[1] = (torch.nn.functional.normalize(t, dim=-1) for t in ref[:2])
    o, s = naive_recurrent_kda(*ref, initial_state=pool[slots[:first].long()].double().cpu(), output_final_state=True)
    return (o.transpose(0, 1) if packed else o), s


def picked(o, packed, first=8):
    return o[:, :first] if packed else o[:first]


# ----------------------------------------------------------------------------------- sync


def sync_free():
    """Every call under sync-debug "error": any synchronising CUDA call raises."""
    if not GPU:
        claim("no host synchronisation on the decode path", None, "needs a GPU (the CPU-side rule is "
              "tests/decode/test_serving.py::test_decode_reads_no_device_value)")
        return
    geo = Geometry(16, 32, 128, 128)  # the timing's shapes: the same compiled kernels serve both
    gen = generator(1)
    R._FAST.clear()
    done = []
    torch.cuda.synchronize()
    try:
        # every input is made (and copied to the device) first: only the op runs in the mode
        host_cu = geo.cu().cpu()
        calls = []
        for form in ("batch", "packed", "packed, cu_seqlens on the host"):
            packed = form != "batch"
            for pool_dtype, v_first in ((torch.float32, False), (torch.bfloat16, False), (torch.float32, True)):
                pool, slots = geo.pool(gen, pool_dtype)
                if v_first:
                    pool = pool.transpose(-1, -2).contiguous()
                out = torch.empty_like(geo.tokens(gen, packed)["v"])
                for call in range(3):  # the first call of a geometry, then the fast path
                    cu = None if not packed else (host_cu if "host" in form else geo.cu())
                    calls.append((f"{form}/{str(pool_dtype)[6:]}{'/[V, K]' if v_first else ''}/call{call}",
                                  dict(**geo.tokens(gen, packed), initial_state=pool, ssm_state_indices=slots,
                                       cu_seqlens=cu, out=out, state_v_first=v_first)))
        # many pairs on a [V, K] fp32 pool (the slot grid's step)
        big = Geometry(256, 32, 128, 128)
        pool, slots = big.pool(gen, torch.float32)
        pool = pool.transpose(-1, -2).contiguous()
        x = big.tokens(gen, True)
        out = torch.empty_like(x["v"])
        for call in range(3):
            calls.append((f"packed/float32/[V, K]/B=256/call{call}",
                          dict(**x, initial_state=pool, ssm_state_indices=slots, cu_seqlens=big.cu(), out=out,
                               state_v_first=True)))
        # speculative decoding: 1 + k = 4 tokens per sequence, a pool slot per token, accepted counts
        x = {n: t.repeat_interleave(4, dim=1) for n, t in geo.tokens(gen, True).items()}
        rows = torch.arange(4 * geo.B, device=DEV, dtype=torch.int32).view(geo.B, 4)
        accepted = torch.randint(1, 5, (geo.B,), device=DEV, dtype=torch.int32)
        cu4 = torch.arange(0, 4 * geo.B + 1, 4, device=DEV)
        out = torch.empty_like(x["v"])
        for pool_dtype in (torch.float32, torch.bfloat16):
            pool = torch.zeros(4 * geo.B + 3, 32, 128, 128, device=DEV, dtype=pool_dtype)
            for call in range(3):
                calls.append((f"speculative decoding/{str(pool_dtype)[6:]}/call{call}",
                              dict(**x, initial_state=pool, ssm_state_indices=rows, num_accepted_tokens=accepted,
                                   cu_seqlens=cu4, out=out)))
        torch.cuda.synchronize()
        for name, kw in calls:
            torch.cuda.set_sync_debug_mode("error")
            kdagen.fused_recurrent_kda(**kw)
            torch.cuda.set_sync_debug_mode("default")
            done.append(name)
        torch.cuda.set_sync_debug_mode("default")
        claim("no host synchronisation in fused_recurrent_kda (sync debug mode 'error')", True,
              f"{len(done)} calls: first and later calls of the batch and packed forms (cu_seqlens on the device "
              "and on the host), fp32 and bf16 pools, an fp32 pool laid out [V, K] (at B=16 and, packed, at B=256), "
              "and speculative decoding's verify step (2-D slots, num_accepted_tokens; fp32 and bf16 pools)")
    except Exception as e:  # noqa: BLE001
        torch.cuda.set_sync_debug_mode("default")
        claim("no host synchronisation in fused_recurrent_kda (sync debug mode 'error')", False,
              f"after {done}: {type(e).__name__}: {str(e)[:300]} at "
              + " <- ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} {f.name}"
                            for f in reversed(traceback.extract_tb(e.__traceback__)[-4:])))
    # prefill (the lead wires cu_seqlens_cpu through chunk_kda; reported, not required here)
    T, lens = 200, [0, 70, 71, 200]
    x = Geometry(1, 32, 128, 128).tokens(gen, True)  # [1, 1, ...]: widen to T tokens
    x = {n: t.expand(1, T, *t.shape[2:]).contiguous() for n, t in x.items()}
    cu = torch.tensor(lens, device=DEV)
    for name, kw in (("batch", {}), ("packed, cu_seqlens_cpu given", dict(cu_seqlens=cu, cu_seqlens_cpu=torch.tensor(lens))),
                     ("packed, offsets on the device only", dict(cu_seqlens=cu))):
        try:
            kdagen.chunk_kda(**x, **kw, output_final_state=True, safe_gate=True, lower_bound=LOWER)  # compile first
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            kdagen.chunk_kda(**x, **kw, output_final_state=True, safe_gate=True, lower_bound=LOWER)
            torch.cuda.set_sync_debug_mode("default")
            claim(f"no host synchronisation in chunk_kda ({name})", True, "a warm call under sync debug mode 'error'")
        except Exception as e:  # noqa: BLE001
            torch.cuda.set_sync_debug_mode("default")
            claim(f"no host synchronisation in chunk_kda ({name})", False, f"{type(e).__name__}: {str(e)[:300]}")


# ----------------------------------------------------------------------------------- graph


def capture(fn, warm=None) -> "torch.cuda.CUDAGraph":
    """``fn`` captured in a CUDA graph, after three calls of ``warm`` (default ``fn``) on a side
    stream (compiles, and the op's first, validating call, stay out of the graph)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            (warm or fn)()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def graph_replay(steps=12):
    """Capture one packed decode step; replay it with new tokens copied into its static inputs: on a
    [P, HV, K, V] pool, and on a [P, HV, V, K] one (``state_v_first=True``)."""
    for v_first in (False, True):
        graph_replay_on(steps, v_first)
    if GPU:  # many pairs on a [V, K] fp32 pool (the slot grid's step)
        graph_replay_on(steps, True, 256)


def graph_replay_on(steps, v_first, B=16):
    name = ("packed decode captured in a CUDA graph and replayed" + (", [V, K] pool" if v_first else "")
            + (f", B={B}" if B != 16 else ""))
    geo = Geometry(B, 32, 128, 128) if GPU else Geometry(3, 1, 16, 16, torch.float32)
    gen = generator(2)
    pool, slots = geo.pool(gen)
    if v_first:
        pool = pool.transpose(-1, -2).contiguous()
    kv = (lambda p: p.transpose(-1, -2)) if v_first else (lambda p: p)  # noqa: E731  (the states as [.., K, V])
    pool_eager = pool.clone()
    static = geo.tokens(gen, True)
    cu = geo.cu()
    out = torch.empty_like(static["v"])
    call = lambda p, o, x: kdagen.fused_recurrent_kda(**x, initial_state=p, ssm_state_indices=slots,  # noqa: E731
                                                      cu_seqlens=cu, out=o, state_v_first=v_first)
    try:
        if GPU:
            scratch = pool.clone()  # the warm-up calls (compiled, validated, on the fast path) step it instead
            replay = capture(lambda: call(pool, out, static), warm=lambda: call(scratch, out, static)).replay
        else:  # the dry run: the same loop, the call run directly
            replay = lambda: call(pool, out, static)  # noqa: E731
        worst_eager, worst_ref = 0.0, 0.0
        out_eager = torch.empty_like(out)
        for _ in range(steps):
            x = geo.tokens(gen, True)
            for n, t in x.items():
                static[n].copy_(t)
            o_ref, s_ref = reference_step(x, kv(pool_eager), slots, True)
            replay()
            call(pool_eager, out_eager, x)
            if GPU:
                torch.cuda.synchronize()
            worst_eager = max(worst_eager, rel_err(out, out_eager), rel_err(pool, pool_eager))
            worst_ref = max(worst_ref, rel_err(picked(out, True).float(), o_ref),
                            rel_err(kv(pool[slots[:8].long()]), s_ref))
        ok = worst_eager == 0.0 and worst_ref < 1e-2 and torch.isfinite(pool).all().item()
        OUT[("graph_v_first" if v_first else "graph") + (f"_B{B}" if B != 16 else "")] = dict(
            steps=steps, max_rel_vs_eager=worst_eager, max_rel_vs_float64=worst_ref)
        claim(name if GPU else name + " (dry run: no graph on the CPU)", ok if GPU else None,
              f"{steps} replays: max rel. error vs the eager op {worst_eager:.1e}, vs float64 {worst_ref:.1e}")
    except Exception as e:  # noqa: BLE001
        claim(name, False, f"{type(e).__name__}: {str(e)[:300]}")
        log(traceback.format_exc())


def prefill_graph(replays=4):
    """chunk_kda with packed sequences (device cu_seqlens, use_graph=True) captured once and
    replayed with other lengths of the same total: each replay's o and final state against the
    eager call with those lengths (bit-identical expected: the same kernels, the same schedule)."""
    name = "packed chunk_kda (use_graph=True) captured in a CUDA graph and replayed with new lengths"
    if not GPU:
        claim(name, None, "needs a GPU")
        return
    T, H, D, N = 1000, 4, 128, 5
    gen = generator(5)
    x = Geometry(1, H, D, D).tokens(gen, True)
    x = {n: t.expand(1, T, *t.shape[2:]).contiguous() for n, t in x.items()}
    cu = torch.tensor([0, 100, 300, 300, 650, T], device=DEV)
    base = dict(output_final_state=True, safe_gate=True, lower_bound=LOWER)
    kw = dict(base, use_graph=True)
    out = {}

    def step():
        out["o"], out["ht"] = kdagen.chunk_kda(**x, cu_seqlens=cu, **kw)
    try:
        graph = capture(step)
        worst = 0.0
        lens_gen = torch.Generator().manual_seed(6)
        for r in range(replays):
            cuts = torch.sort(torch.randint(0, T + 1, (N - 1,), generator=lens_gen)).values.tolist()
            lens = [0] + cuts + [T]
            cu.copy_(torch.tensor(lens))
            graph.replay()
            o, ht = kdagen.chunk_kda(**x, cu_seqlens=torch.tensor(lens, device=DEV), **kw)
            torch.cuda.synchronize()
            worst = max(worst, rel_err(out["o"], o), rel_err(out["ht"], ht))
        claim(name, worst == 0.0, f"{replays} replays with random lengths summing to {T}: max rel. error vs "
              f"the eager call {worst:.1e}")
        # the schedule built on the device (one program of the schedule kernel) against the host's
        lens = cu.tolist()
        segments = ChunkFwdConfig(state_segment_chunks=2, solve_load_ahead=0)
        for form, kw2 in (("chunks", {}), ("segments", dict(config=segments))):
            dev = kdagen.chunk_kda(**x, cu_seqlens=cu, **base, **kw2)
            host = kdagen.chunk_kda(**x, cu_seqlens=cu, cu_seqlens_cpu=torch.tensor(lens), **base, **kw2)
            same = torch.equal(dev[0], host[0]) and torch.equal(dev[1], host[1])
            claim(f"packed chunk_kda: the device-built schedule gives the host-built one's answer ({form})", same,
                  f"lengths {lens}: bit-identical o and final state" if same else
                  f"lengths {lens}: max rel. difference {max(rel_err(dev[0], host[0]), rel_err(dev[1], host[1])):.1e}")
    except Exception as e:  # noqa: BLE001
        claim(name, False, f"{type(e).__name__}: {str(e)[:300]}")
        log(traceback.format_exc())


# ----------------------------------------------------------------------------------- gates


def gate_patterns(T):
    """(name, g [1, T, H, K] edit) of the issue's NaN cases, inside a g in [-5, 0)."""
    def at_bound(g):
        g[:, T // 4:T // 4 + 20] = LOWER

    def below(g):
        g[:, T // 4:T // 4 + 20] = -8.0
        g[:, (2 * T) // 3] = -20.0

    def minus_inf(g):
        g[:, T // 3] = float("-inf")
        g[:, T // 3 + 2, :, : g.shape[-1] // 3] = float("-inf")

    return [("g = -5 (at the bound)", at_bound), ("g = -8 and -20 (below)", below), ("g = -inf (resets)", minus_inf)]


def gates():
    from kdagen.cache.heuristics import default_chunk_bwd_config, default_train_config
    from kdagen.ops.chunk import chunk_bwd_config
    from kdagen.ops.inputs import select_spec
    from kdagen.tuning.families import lower_for

    H, K, V, T = (32, 128, 128, 150) if GPU else (1, 16, 16, 40)
    dtype = torch.bfloat16 if GPU else torch.float32
    tol = 1e-2 if GPU else 1e-5
    gen = generator(3)
    base = Geometry(1, H, K, V, dtype)
    toks = [base.tokens(gen, False) for _ in range(T)]
    x = {n: torch.cat([t[n] for t in toks], dim=1) for n in ("q", "k", "v", "g", "beta")}
    h0 = 0.1 * torch.randn(1, H, K, V, generator=gen, device=DEV)
    for name, edit in gate_patterns(T):
        g = x["g"].clone()
        edit(g)
        ref_o, ref_s = naive_recurrent_kda(*(x[n].double().cpu() for n in ("q", "k", "v")), g.double().cpu(),
                                           x["beta"].double().cpu(), initial_state=h0.double().cpu(),
                                           output_final_state=True)
        row = dict(kind="gates", case=name)
        try:  # decode, token by token from a pool slot
            pool = h0.clone()
            slot = torch.zeros(1, device=DEV, dtype=torch.int32)
            outs = []
            for t in range(T):
                step = {n: x[n][:, t:t + 1].contiguous() for n in ("q", "k", "v", "beta")}
                o, _ = kdagen.fused_recurrent_kda(**step, g=g[:, t:t + 1].contiguous(), initial_state=pool,
                                                  ssm_state_indices=slot)
                outs.append(o)
            row["decode_o"], row["decode_state"] = rel_err(torch.cat(outs, 1), ref_o), rel_err(pool, ref_s)
            claim(f"decode gives the recurrence for {name} ({str(dtype)[6:]})",
                  max(row["decode_o"], row["decode_state"]) < tol,
                  f"rel. error o {row['decode_o']:.1e}, state {row['decode_state']:.1e} (tolerance {tol:.0e})")
        except Exception as e:  # noqa: BLE001
            claim(f"decode gives the recurrence for {name}", False, f"{type(e).__name__}: {str(e)[:200]}")
        try:  # prefill with the promise broken (the chunk forward's in-kernel fallback: the lead's kernels)
            o, s = kdagen.chunk_kda(**{**x, "g": g}, initial_state=h0, output_final_state=True, safe_gate=True,
                                    lower_bound=LOWER)
            row["chunk_o"], row["chunk_state"] = rel_err(o, ref_o), rel_err(s, ref_s)
            claim(f"chunk_kda(safe_gate, lower_bound=-5) gives the recurrence for {name} ({str(dtype)[6:]})",
                  max(row["chunk_o"], row["chunk_state"]) < tol,
                  f"rel. error o {row['chunk_o']:.1e}, state {row['chunk_state']:.1e} (tolerance {tol:.0e})")
        except Exception as e:  # noqa: BLE001
            claim(f"chunk_kda gives the recurrence for {name}", False, f"{type(e).__name__}: {str(e)[:200]}")
        try:  # training with the promise broken: the training forward's and backward's checked diagonals
            names = ("q", "k", "v", "g", "beta", "initial_state")
            vals = {**x, "g": g, "initial_state": h0}
            leaves = {n: vals[n].clone().requires_grad_(True) for n in names}
            # the promise checked in the kernels (check_gate_bound=True; the default trusts it)
            plan = lower_for(select_spec(False, True, LOWER, False, False), "chunk_fwd", K, V, dtype)
            shape = {"N": 1, "HV": H}
            with chunk_bwd_config(default_chunk_bwd_config(plan, shape).replace(check_gate_bound=True)):
                o, s = kdagen.chunk_kda(**leaves, output_final_state=True, safe_gate=True, lower_bound=LOWER,
                                        config=default_train_config(plan, shape).replace(check_gate_bound=True))
                do = torch.randn(o.shape, generator=gen, device=DEV).to(o.dtype)
                dht = torch.randn(s.shape, generator=gen, device=DEV)
                got = torch.autograd.grad((o, s), [leaves[n] for n in names], (do, dht))
            r64 = {n: vals[n].detach().double().cpu().requires_grad_(True) for n in names}
            ro, rs = naive_recurrent_kda(**r64, output_final_state=True)
            ref = torch.autograd.grad((ro, rs), [r64[n] for n in names], (do.double().cpu(), dht.double().cpu()))
            errs = {"o": rel_err(o, ro), "state": rel_err(s, rs)}
            errs.update({f"d{n}": rel_err(a, b) for n, a, b in zip(names, got, ref)})
            row["train"] = errs
            claim(f"chunk_kda training (safe_gate, lower_bound=-5, check_gate_bound) gives the recurrence for {name} ({str(dtype)[6:]})",
                  max(errs.values()) < tol, ", ".join(f"{k} {v:.1e}" for k, v in errs.items()) + f" (tolerance {tol:.0e})")
        except Exception as e:  # noqa: BLE001
            claim(f"chunk_kda training gives the recurrence for {name}", False, f"{type(e).__name__}: {str(e)[:200]}")
        OUT["rows"].append(row)


def lean_items():
    """The lean body (RecurrentConfig.lean: the heuristic's choice for a decode step on KDA's fp32 pool laid out
    [V, K] with many pairs; 8-row tiles on one warp) forced on a call that is not a pure
    decode step: 40 sequences of 0-3 tokens (the slots' programs run the one-token items, row 0 the others),
    two padding sequences and two that share a slot, on the slot grid, in bf16, both layouts.  Every sequence's
    o and every slot against the float64 recurrence; the padding's o 0, the earlier sharer's o NaN."""
    from kdagen.cache import heuristics
    from kdagen.config import RecurrentConfig

    H, K, V = (32, 128, 128) if GPU else (2, 16, 16)
    dtype = torch.bfloat16 if GPU else torch.float32
    tol = 1e-2 if GPU else 1e-5
    gen = generator(11)
    lens = [(0, 1, 2, 3, 1, 1, 1, 2)[n % 8] for n in range(40)]
    N, P, T = len(lens), len(lens) + 6, sum(lens)
    slots = [(7 * n) % P for n in range(N)]
    slots[5], slots[9] = -1, P  # padding: below and past the pool
    slots[30] = slots[12]  # sequences 12 and 30 share a slot (the caller's error): 30's state is kept, 12's o NaN
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=DEV)
    r = lambda *sh: torch.randn(1, T, *sh, generator=gen, device=DEV)  # noqa: E731
    x = dict(q=r(H, K), k=torch.nn.functional.normalize(r(H, K), dim=-1), v=r(H, V),
             g=LOWER * torch.sigmoid(r(H, K) + 2.0), beta=torch.sigmoid(r(H)))
    x = {n: (t if n == "g" else t.to(dtype)) for n, t in x.items()}
    pool_kv = 0.1 * torch.randn(P, H, K, V, generator=gen, device=DEV)
    idx = torch.tensor(slots, dtype=torch.int32, device=DEV)
    # the float64 recurrence, once for both layouts: each kept sequence's o and the pool after the call
    b = cu.tolist()
    want_o, want_pool = {}, pool_kv.double().cpu().clone()
    for n in range(N):
        if 0 <= slots[n] < P and n != 12:  # (padding's o is 0 and sequence 12's NaN: checked below)
            seg = slice(b[n], b[n + 1])
            ro, rs = naive_recurrent_kda(*(x[m][:, seg].double().cpu() for m in ("q", "k", "v", "g", "beta")),
                                         initial_state=pool_kv[slots[n]][None].double().cpu(), output_final_state=True)
            want_pool[slots[n]] = rs[0]
            if lens[n]:
                want_o[n] = ro
    saved = heuristics.SLOT_GRID_MIN_PAIRS
    heuristics.SLOT_GRID_MIN_PAIRS = 1  # (the slot grid at these pairs, as at B=256)
    R._FAST.clear()
    try:
        for v_first in (False, True):
            pool = pool_kv.transpose(-1, -2).contiguous() if v_first else pool_kv.clone()
            o = torch.zeros_like(x["v"])
            kdagen.fused_recurrent_kda(**x, initial_state=pool, ssm_state_indices=idx, cu_seqlens=cu, out=o,
                                       state_v_first=v_first,
                                       config=RecurrentConfig(block_v=8, num_warps=1, lean=True, readout="updated"))
            got_pool = pool.transpose(-1, -2) if v_first else pool
            bad = [f"padding sequence {n}: o not 0" for n in range(N)
                   if not 0 <= slots[n] < P and not (o[:, b[n]:b[n + 1]] == 0).all()]
            if not torch.isnan(o[:, b[12]:b[13]]).all():
                bad.append("sequence 12 (its slot shared with 30): o not NaN")
            worst = max([rel_err(o[:, b[n]:b[n + 1]], ro) for n, ro in want_o.items()] + [rel_err(got_pool, want_pool)])
            claim(f"the lean body gives the recurrence for items of 0-3 tokens, padding and a shared slot "
                  f"({'[V, K]' if v_first else '[K, V]'} pool, {str(dtype)[6:]})", worst < tol and not bad,
                  f"worst rel. error {worst:.1e} over every sequence's o and the pool (tolerance {tol:.0e})"
                  + ("; " + "; ".join(bad) if bad else ""))
    finally:
        heuristics.SLOT_GRID_MIN_PAIRS = saved
        R._FAST.clear()


# ----------------------------------------------------------------------------------- timing


def copy_ceiling_gbs() -> float:
    """Read + write bandwidth of a 1 GiB device-to-device copy (median)."""
    from triton.testing import do_bench
    a = torch.empty(1 << 28, device=DEV).uniform_()
    b = torch.empty_like(a)
    ms = do_bench(lambda: b.copy_(a), warmup=25, rep=200, return_mode="median")
    del a, b
    torch.cuda.empty_cache()
    return 2 * (1 << 28) * 4 / (ms * 1e-3) / 1e9


def graph_us(fn, per_graph=10) -> float:
    """Microseconds per call, replaying a CUDA graph of ``per_graph`` calls."""
    from triton.testing import do_bench
    graph = capture(lambda: [fn() for _ in range(per_graph)])
    return do_bench(graph.replay, warmup=20, rep=200, return_mode="median") * 1e3 / per_graph


def eager_us(fn, n=1000, repeats=5) -> float:
    """Microseconds per eager call: the median of ``repeats`` loops of ``n`` calls, each loop ended by a
    synchronisation (a single short loop moved by up to 2 us with the host's state on an H200 machine: the
    same Python path measured 13.2 and 15.0 us)."""
    fn()
    torch.cuda.synchronize()
    per = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        per.append((time.perf_counter() - t) / n * 1e6)
    return sorted(per)[len(per) // 2]


def fla_decode():
    try:
        from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd
        import fla
        return fused_recurrent_kda_fwd, getattr(fla, "__version__", "?")
    except Exception as e:  # noqa: BLE001
        log(f"FLA not available: {e!r}")
        return None, "not run"


def decode_case(B, packed, pool_dtype, fla=None, l2norm=False, ordered=False, v_first=False):
    """(step function, bytes of state moved) of one decode configuration on fresh inputs.
    ``l2norm``: the serving engines' call, raw k (3x its unit length) with use_qk_l2norm_in_kernel.
    ``ordered``: sequence n in slot n (the slots in batch order, as a fresh engine hands them out)
    instead of the scrambled (7 n) mod P.  ``v_first``: the pool laid out [P, HV, V, K]
    (``state_v_first=True``; the same states)."""
    geo = Geometry(B, 32, 128, 128)
    gen = generator(10 + B)
    x = geo.tokens(gen, packed)
    if l2norm:
        x["k"] = 3 * x["k"]
    pool, slots = geo.pool(gen, pool_dtype)
    if v_first:
        pool = pool.transpose(-1, -2).contiguous()
    kv = (lambda p: p.transpose(-1, -2)) if v_first else (lambda p: p)  # noqa: E731  (the states as [.., K, V])
    if ordered:
        slots = torch.arange(B, device=pool.device, dtype=slots.dtype)
    cu = geo.cu() if packed else None
    out = torch.empty_like(x["v"])
    if fla is None:
        fn = lambda: kdagen.fused_recurrent_kda(**x, initial_state=pool, ssm_state_indices=slots,  # noqa: E731
                                                cu_seqlens=cu, out=out, use_qk_l2norm_in_kernel=l2norm,
                                                state_v_first=v_first)
    else:
        idx = slots.long()
        vf = dict(state_v_first=True) if v_first else {}  # (FLA's keyword, left out where it is not needed)
        fn = lambda: fla(**x, initial_state=pool, scale=128 ** -0.5, inplace_final_state=True,  # noqa: E731
                         ssm_state_indices=idx, cu_seqlens=cu, out=out, use_qk_l2norm_in_kernel=l2norm, **vf)
    p0 = pool.clone()
    o_ref, s_ref = reference_step(x, kv(pool), slots, packed, l2norm=l2norm)
    fn()
    if GPU:
        torch.cuda.synchronize()
    err = max(rel_err(picked(out, packed).float(), o_ref), rel_err(kv(pool[slots[:8].long()]).float(), s_ref))
    pool.copy_(p0)
    return fn, 2 * B * 32 * 128 * 128 * pool.element_size(), err, (x, pool, slots, cu, out)


def timing(batches=(1, 16, 256), layouts=("kv", "vk")):
    if not GPU:
        claim("decode timings", None, "need a GPU")
        return
    copy = copy_ceiling_gbs()
    OUT["copy_gbs"] = copy
    log(f"device copy ceiling: {copy:.0f} GB/s")
    fla, fla_ver = fla_decode()
    OUT["env"]["fla"] = fla_ver
    # (op, packed, pool dtype, use_qk_l2norm_in_kernel, layout): the fourth of each library's [K, V] forms is
    # the engines' call
    forms = [("kdagen", False, torch.float32, False, "kv"), ("kdagen", True, torch.float32, False, "kv"),
             ("kdagen", True, torch.bfloat16, False, "kv"), ("kdagen", True, torch.float32, True, "kv")]
    if "vk" in layouts:
        forms += [("kdagen", True, torch.float32, False, "vk"), ("kdagen", True, torch.bfloat16, False, "vk")]
    if fla is not None:
        forms += [("fla", False, torch.float32, False, "kv"), ("fla", True, torch.float32, False, "kv"),
                  ("fla", True, torch.float32, True, "kv")]
        if "vk" in layouts:
            forms += [("fla", True, torch.float32, False, "vk")]

    def measure(row, eager=True, **case):
        """One decode case (decode_case's keywords) timed into ``row``: graph replay, and eager per call
        unless ``eager`` is False; logged and kept."""
        try:
            fn, nbytes, row["rel_err_vs_float64"], _ = decode_case(**case)
            if eager:
                row["eager_us"] = eager_us(fn)
            row["graph_us"] = graph_us(fn)
            row["tbs"] = nbytes / (row["graph_us"] * 1e-6) / 1e12
            row["pct_copy"] = 100 * row["tbs"] * 1e3 / copy
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        log(json.dumps(row))
        OUT["rows"].append(row)

    for B in batches:
        for who, packed, pool_dtype, l2norm, layout in forms:
            row = dict(kind="decode", B=B, op=who, form="packed" if packed else "batch", pool=str(pool_dtype)[6:],
                       l2norm=l2norm)
            if layout == "vk":  # (a [K, V] row has no key: the rows of earlier runs read the same)
                row["layout"] = "vk"
            measure(row, B=B, packed=packed, pool_dtype=pool_dtype, fla=fla if who == "fla" else None, l2norm=l2norm,
                    v_first=layout == "vk")
    if 256 in batches:  # what the slots' order costs (a probe since removed; git history keeps it): the same step, slots in batch order
        for who in ("kdagen", "fla") if fla is not None else ("kdagen",):
            measure(dict(kind="decode_slot_order", B=256, op=who, form="packed", pool="float32", slots="batch order"),
                    eager=False, B=256, packed=True, pool_dtype=torch.float32, fla=fla if who == "fla" else None,
                    ordered=True)
    eager_split()
    rows = [r for r in OUT["rows"] if r.get("kind") == "decode"]

    def find(B, op, form, pool, layout="kv"):
        return next((r for r in rows if (r["B"], r["op"], r["form"], r["pool"], r["l2norm"], r.get("layout", "kv"))
                     == (B, op, form, pool, False, layout) and "graph_us" in r), None)

    for layout, name in (("kv", ""), ("vk", ", [V, K] pool (state_v_first)")):
        big = (find(256, "kdagen", "packed", "float32", layout)
               or (find(256, "kdagen", "batch", "float32") if layout == "kv" else None))
        if big:
            claim(f"decode B=256 fp32 pool >= 96% of the copy ceiling{name}", big["pct_copy"] >= 96,
                  f"{big['graph_us']:.1f} us, {big['pct_copy']:.1f}% of copy", proof=False)
        bf, fl = find(256, "kdagen", "packed", "bfloat16", layout), find(256, "fla", "batch", "float32")
        if bf and fl:
            claim(f"bf16 pool at B=256 >= 1.8x FLA's fp32-pool step{name}", fl["graph_us"] / bf["graph_us"] >= 1.8,
                  f"{bf['graph_us']:.1f} us vs FLA {fl['graph_us']:.1f} us: {fl['graph_us'] / bf['graph_us']:.2f}x",
                  proof=False)
    one = [r for r in rows if r["B"] == 1 and r["op"] == "kdagen" and r["pool"] == "float32" and "eager_us" in r
           and "layout" not in r]
    for r in one:  # each form on its own: the batch form (a fresh final state per call) and the packed pool
        claim(f"eager decode at B=1 <= 15 us per call ({r['form']} form{', l2norm' if r['l2norm'] else ''})",
              r["eager_us"] <= 15, f"{r['eager_us']:.1f} us", proof=False)
    for B in batches:  # the engines' call (in-kernel l2-norm): at least FLA's speed
        kd, fl = ([r for r in rows if (r["B"], r["op"], r["l2norm"]) == (B, op, True) and "graph_us" in r]
                  for op in ("kdagen", "fla"))
        if kd and fl:
            claim(f"packed decode with use_qk_l2norm_in_kernel at B={B} >= FLA's", fl[0]["graph_us"] >= kd[0]["graph_us"],
                  f"{kd[0]['graph_us']:.1f} us vs FLA {fl[0]['graph_us']:.1f} us", proof=False)


def eager_split():
    """Where the B=1 eager call's time goes: the whole op; the fast path's direct launch alone;
    the generic launcher alone (both with the op's arguments laid out once)."""
    for packed in (False, True):
        R._FAST.clear()
        fn, _, _, (x, pool, slots, cu, out) = decode_case(1, packed, torch.float32)
        fn()
        entry = next(iter(R._FAST.values()), None)  # this geometry's, the only one
        row = dict(kind="eager_split", B=1, form="packed" if packed else "batch", op_us=eager_us(fn))
        if entry is not None:
            _, _, args = R._outputs_and_args(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=entry.scale,
                                             initial_state=pool, output_final_state=False, state_indices=slots,
                                             out=out, dims=entry.dims, cu_seqlens=cu)
            args.update(entry.extra)  # NS, as the op's generic path adds it
            e = entry
            row["generic_launch_us"] = eager_us(lambda: generic_launch(e.fn, e.grid, args, e.constexprs, e.num_warps,
                                                                       e.num_stages))
            row["direct"] = entry.direct is not None
            if entry.direct is not None:
                row["direct_launch_us"] = eager_us(lambda: entry.direct(args))
        log(json.dumps(row))
        OUT["rows"].append(row)


# ----------------------------------------------------------------------------------- drift


def pool_drift(steps=1000, geo: Geometry | None = None, at=(1, 10, 100, 1000), seed=4):
    """A bf16 pool and an fp32 pool decoding the same tokens (slow decay: long memory) for
    ``steps`` steps: [(step, rel. error of o, rel. error of the state)] of bf16 against fp32."""
    geo = geo or Geometry(256, 32, 128, 128)
    gen = generator(seed)
    pool32, slots = geo.pool(gen)
    pool16 = pool32.to(torch.bfloat16)
    x = geo.tokens(gen, True, slow_decay=True)
    out32, out16 = torch.empty_like(x["v"]), torch.empty_like(x["v"])
    cu = geo.cu()
    rows = []
    for t in range(1, steps + 1):
        x = geo.tokens(gen, True, slow_decay=True)
        kdagen.fused_recurrent_kda(**x, initial_state=pool32, ssm_state_indices=slots, cu_seqlens=cu, out=out32)
        kdagen.fused_recurrent_kda(**x, initial_state=pool16, ssm_state_indices=slots, cu_seqlens=cu, out=out16)
        if t in at:
            live = slots.long()
            rows.append((t, rel_err(out16.float(), out32.float()), rel_err(pool16[live].float(), pool32[live])))
    return rows


def drift(steps=None):
    geo = Geometry(256, 32, 128, 128) if GPU else Geometry(2, 1, 16, 16, torch.float32)
    steps = steps or (1000 if GPU else 100)
    rows = pool_drift(steps, geo, at=tuple(t for t in (1, 10, 100, 1000) if t < steps) + (steps,))
    for t, eo, es in rows:
        log(f"  bf16 pool vs fp32 pool after {t:>4} steps: o {eo:.2e}, state {es:.2e}")
        OUT["rows"].append(dict(kind="drift", B=geo.B, step=t, rel_o=eo, rel_state=es))
    worst = max(max(eo, es) for _, eo, es in rows)
    claim(f"bf16 pool drift against the fp32 pool over {steps} steps (B={geo.B})", worst < 2e-2,
          f"worst rel. error {worst:.2e} (o and state; target < 2e-2)", proof=False)


# ----------------------------------------------------------------------------------- main


def table():
    rows = [r for r in OUT["rows"] if r.get("kind") == "decode" and "graph_us" in r]
    if rows:
        log("\n| B | op | form | pool | graph replay / step | TB/s | % copy | eager / call | rel. err |")
        log("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            pool = r["pool"] + (" [V, K]" if r.get("layout") == "vk" else "")
            log(f"| {r['B']} | {r['op']} | {r['form']} | {pool} | {r['graph_us']:.1f} us | {r['tbs']:.2f} | "
                f"{r['pct_copy']:.0f}% | {r['eager_us']:.1f} us | {r['rel_err_vs_float64']:.1e} |")
    split = [r for r in OUT["rows"] if r.get("kind") == "eager_split"]
    for r in split:
        log(f"eager B=1 {r['form']}: op {r['op_us']:.1f} us; generic launch {r.get('generic_launch_us', 0):.1f} us; "
            f"direct launch {r.get('direct_launch_us', float('nan')):.1f} us")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--suite", default="sync,graph,prefill_graph,gates,lean,timing,drift")
    ap.add_argument("--layouts", default="kv,vk", help="timing's pool layouts: kv ([P, HV, K, V]) and/or vk "
                    "([P, HV, V, K], state_v_first)")
    ap.add_argument("--drift-steps", type=int, default=None, help="default: 1000 on a GPU, 100 in a dry run")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    OUT["env"] = dict(date=datetime.datetime.now().isoformat(timespec="seconds"), torch=torch.__version__,
                      gpu=torch.cuda.get_device_name() if GPU else "none (dry run)", python=platform.python_version(),
                      kdagen=kdagen.__version__)
    try:
        import triton
        OUT["env"]["triton"] = triton.__version__
    except ImportError:
        pass
    log(json.dumps(OUT["env"]))
    sections = dict(sync=sync_free, graph=graph_replay, prefill_graph=prefill_graph, gates=gates, lean=lean_items,
                    timing=lambda: timing(layouts=tuple(args.layouts.split(","))),
                    drift=lambda: drift(args.drift_steps))
    for name in args.suite.split(","):
        log(f"\n== {name} [t={time.time() - T0:.0f}s] ==")
        try:
            sections[name]()
        except Exception as e:  # noqa: BLE001
            claim(f"section {name} ran", False, f"{type(e).__name__}: {str(e)[:300]}")
            log(traceback.format_exc())
        with open(os.path.join(args.out, "serving.json"), "w") as f:
            json.dump(OUT, f, indent=1)
    table()
    log(f"\n== verdict [t={time.time() - T0:.0f}s] ==")
    for c in OUT["claims"]:
        log(f"{c['result']}: {c['name']} -- {c['detail']}")
    with open(os.path.join(args.out, "serving.json"), "w") as f:
        json.dump(OUT, f, indent=1)
    with open(os.path.join(args.out, "serving.log"), "w") as f:
        f.write("\n".join(LOG))
    return 1 if any(c["result"] == "FAIL" for c in OUT["claims"]) else 0


if __name__ == "__main__":
    sys.exit(main())
