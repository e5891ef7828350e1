"""Context-parallel test harness: the one-process reference call and the spawned gloo ranks.

The main process draws a case's global inputs, runs the op once on all tokens (outputs and
autograd gradients) and saves both; :func:`worker` (one process per rank, spawned) runs every
case on its rank's tokens under ``cp_context``, backpropagates the same upstream gradients and
saves what it got (a training case also as an inference call, ``o_inf``/``ht_inf``); :func:`gather`
puts the ranks' pieces back together (tokens concatenated, the final states and the initial state's
gradient summed over the ranks)."""
from __future__ import annotations

import os

import torch

from cases import inputs

OPS = {  # op -> (token tensor names after q, k, v), has beta
    "chunk_kda": ("g", "beta"),
    "chunk_gated_delta_rule": ("g", "beta"),
    "chunk_delta_rule": ("beta",),
    "chunk_gla": ("g",),
    "chunk_dplr_delta_rule": ("a", "b", "gk"),
}


MEMBER = {"chunk_kda": "kda", "chunk_gated_delta_rule": "gdn", "chunk_delta_rule": "delta", "chunk_gla": "gla",
          "chunk_dplr_delta_rule": "dplr"}
PARAMS = ("A_log", "dt_bias")
SUMMED = ("initial_state",) + PARAMS  # not split along T: each rank's gradient is its share


def make_case(op, lengths, *, H=2, HV=2, K=16, V=16, seed=0, h0=False, final=False, flags=None, gate=None,
              rank_lengths=None, grad=True, fla_context=False, mutate=None, split_wide=False, batch=1):
    """Global inputs of one case (float32, B = 1, packed by ``lengths``; ``batch`` > 1: a fixed-length
    batch of that many rows of ``lengths`` = [T] tokens each, every row split over the ranks alike).
    ``grad=False``: an inference call (no_grad); ``fla_context``: the ranks pass an object with only
    FLA's FLACPContext fields; ``mutate``: rank 1 breaks its call that way (the case expects a
    ValueError on every rank): 'V' (another head dim), 'cu_seqlens' (offsets unlike the
    context's), 'shape' (a g of the wrong length), 'context' (a
    context built for another rank), 'nan' (a NaN that rank 1's call refuses,
    with ``check_inputs=True``, after the ranks agreed on the shapes); or 'rows': every rank passes
    two rows under a context of several sequences.  ``split_wide``: the widened call
    runs as its two halves (as for V + K above the op's head-dim limit)."""
    flags = dict(flags or {})
    T = sum(lengths)
    svf = flags.get("state_v_first", False)
    assert batch == 1 or len(lengths) == 1, "a fixed-length batch is one sequence per row"
    n = max(batch, len(lengths))
    hshape = (n, HV, V, K) if svf else (n, HV, K, V)
    c = inputs(MEMBER[op], batch, T, H, HV, K, V, seed=seed, N=n, h0=h0, state_scale=0.5, v_first=svf,
               **_draws(op, flags, gate))
    x = {"q": c.q, "k": c.k, "v": c.v}
    x.update({n: getattr(c, n) for n in OPS[op]})
    x.update({n: getattr(c, n) for n in PARAMS if getattr(c, n) is not None})
    if h0:
        x["initial_state"] = c.h0
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int64)
    up = {"do": torch.randn(batch, T, HV, V, generator=c.gen), "dht": torch.randn(*hshape, generator=c.gen)}
    return {"op": op, "x": x, "flags": flags, "cu": cu, "final": final, "up": up, "rank_lengths": rank_lengths,
            "grad": grad, "fla_context": fla_context, "mutate": mutate, "split_wide": split_wide, "batch": batch}


def _draws(op, flags, gate):
    """tests/cases.py's options for an op's case: q and k l2-normalised, or raw for the kernel's l2-norm (DPLR's
    raw and halved, a = -k', b = u k'); KDA's gate -0.7 U[0, 1) (-5 everywhere at the bound), the others' -0.5
    U[0, 1), or the in-kernel gate's raw input with A_log = log U[0, 1), dt_bias = 0.5 N(0, 1); beta U[0, 1), or
    N(0, 1) for the kernel's sigmoid; the initial state 0.5 N(0, 1)."""
    raw = flags.get("use_qk_l2norm_in_kernel", False)
    o = dict(query="normal" if raw else "unit", key="raw" if raw else "unit", order=("ab", "gate", "params", "beta"))
    if op == "chunk_dplr_delta_rule":
        return dict(o, query="normal", q_scale=0.5, key="raw", k_scale=0.5, ab="delta", gate="uniform", g_scale=0.5)
    if op in ("chunk_kda", "chunk_gated_delta_rule") and flags.get("use_gate_in_kernel"):
        o.update(gate="raw", params="log")
    elif op == "chunk_kda" and gate == "bound":  # every log decay at the promised bound
        o.update(gate="lb")
    elif op == "chunk_kda":
        o.update(gate="uniform", g_scale=0.7)
    elif op in ("chunk_gated_delta_rule", "chunk_gla"):
        o.update(gate="uniform", g_scale=0.5)
    if "beta" in OPS[op]:
        o["beta"] = "raw" if flags.get("use_beta_sigmoid_in_kernel") else "uniform"
    return o


FLA_FIELDS = ("group", "cu_seqlens", "cu_seqlens_cpu", "is_last_rank", "pre_num_ranks", "is_first_rank",
              "post_num_ranks", "conv1d_kernel_size", "pre_num_conv_tokens")


class FLALikeContext:
    """An object with FLA's FLACPContext fields only (FLA's own class, duck-typed)."""

    def __init__(self, ctx):
        for name in FLA_FIELDS:
            setattr(self, name, getattr(ctx, name))


def _leaves(case):
    x = {n: t.clone().requires_grad_() for n, t in case["x"].items()}
    return x, [n for n in x]


def _call(op, x, case, **kw):
    import kdagen
    names = ("q", "k", "v") + OPS[op]
    args = [x[n] for n in names]
    params = {n: x[n] for n in PARAMS if n in x}
    return getattr(kdagen, op)(*args, initial_state=x.get("initial_state"), output_final_state=case["final"],
                               **case["flags"], **params, **kw)


def reference(case):
    """The one-process call on all tokens: o, final state and every input's gradient."""
    x, names = _leaves(case)
    cu = None if case["batch"] > 1 else case["cu"]
    if not case["grad"]:
        with torch.no_grad():
            o, ht = _call(case["op"], x, case, cu_seqlens=cu)
        return {"o": o, "ht": ht}
    o, ht = _call(case["op"], x, case, cu_seqlens=cu)
    loss = (o * case["up"]["do"]).sum() + ((ht * case["up"]["dht"]).sum() if case["final"] else 0)
    loss.backward()
    return {"o": o.detach(), "ht": None if ht is None else ht.detach(),
            **{"d" + n: x[n].grad for n in names}}


def worker(rank, world, init_file, cases_file, out_dir):
    os.environ["KDAGEN_CACHE_DIR"] = os.path.join(out_dir, f"cache{rank}")
    torch.set_num_threads(1)
    import interpreter_speed  # (a spawned process: the conftest's interpreter set-up is not imported here)

    interpreter_speed.install()
    import torch.distributed as dist
    import kdagen
    import kdagen.ops.cp as cp_module
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        results = []
        for case in torch.load(cases_file):
            ctx = kdagen.build_cp_context(case["cu"], group=dist.group.WORLD, rank_lengths=case["rank_lengths"])
            s, e = ctx.rank_start, ctx.rank_end
            x = {n: (t if n in SUMMED else t[:, s:e]).clone().requires_grad_(case["grad"])
                 for n, t in case["x"].items()}
            kw = {}
            cp_module.WIDE_LIMIT = 0 if case["split_wide"] else 256
            if case["fla_context"]:
                ctx = FLALikeContext(ctx)
            if case["mutate"] and rank == 1:
                if case["mutate"] == "V":
                    x["v"] = torch.cat([x["v"], x["v"]], -1).detach()
                elif case["mutate"] == "cu_seqlens":
                    kw["cu_seqlens"] = torch.tensor([0, e - s])
                elif case["mutate"] == "shape":
                    x["g"] = x["g"][:, 1:].detach()
                elif case["mutate"] == "context":  # rank 0's context, passed on rank 1
                    import dataclasses
                    ctx = dataclasses.replace(ctx, rank=0)
                elif case["mutate"] == "nan":  # found by check_inputs inside rank 1's own call
                    x["q"] = x["q"].detach().clone()
                    x["q"][0, 3, 0, 0] = float("nan")
            if case["mutate"] == "rows":  # every rank: two rows under a context of several sequences
                x = {n: t if n in SUMMED else torch.cat([t, t]).detach() for n, t in x.items()}
            if case["mutate"]:
                try:
                    _call(case["op"], x, case, cp_context=ctx, **kw)
                    results.append({"error": None})
                except ValueError as err:
                    results.append({"error": str(err)})
                continue
            if not case["grad"]:
                with torch.no_grad():
                    o, ht = _call(case["op"], x, case, cp_context=ctx)
                results.append({"o": o, "ht": ht})
                continue
            with torch.no_grad():  # the same case as an inference call (a rank continuing a sequence: two phases)
                o_inf, ht_inf = _call(case["op"], x, case, cp_context=ctx)
            o, ht = _call(case["op"], x, case, cp_context=ctx)
            loss = (o * case["up"]["do"][:, s:e]).sum() + ((ht * case["up"]["dht"]).sum() if case["final"] else 0)
            loss.backward()
            # an empty rank's inputs are [1, 0, ...]: no gradient reaches them (an empty one, put together)
            results.append({"o": o.detach(), "ht": None if ht is None else ht.detach(),
                            "o_inf": o_inf, "ht_inf": ht_inf,
                            **{"d" + n: x[n].grad if x[n].grad is not None or x[n].numel() else torch.zeros_like(x[n])
                               for n in x}})
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    except BaseException:
        import traceback
        with open(os.path.join(out_dir, f"rank{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        raise
    finally:
        # leave together: a gloo rank that tears its pairs down while a peer still holds them can abort the peer
        # (monitored: a rank that died is reported, not waited for)
        try:
            import datetime
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=300))
        finally:
            dist.destroy_process_group()


def gather(per_rank: list):
    """The ranks' results of one case, put together as the one-process call returns them."""
    out = {}
    for key in per_rank[0]:
        vals = [r[key] for r in per_rank]
        if key in ("ht", "ht_inf") or key[1:] in SUMMED:  # a rank that never reads initial_state has no gradient for it
            vals = [x for x in vals if x is not None]
            out[key] = torch.stack(vals).sum(0) if vals else None
        else:
            out[key] = torch.cat(vals, dim=1)
    return out
