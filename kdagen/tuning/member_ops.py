"""The ops a tuned spec's candidates run through, and the float64 recurrence they are checked
against, for every spec but KDA's (whose candidates keep running through ``chunk_kda`` /
``fused_recurrent_kda`` and ``naive_chunk_kda`` / ``naive_recurrent_kda``, unchanged).

A member -- a named one (``gdn``, ``deltanet``) or a user's spec file -- runs through the
generic entries :func:`kdagen.ops.member.chunk_member` (forward, and its backward through
autograd) and :func:`~kdagen.ops.member.fused_recurrent_member`, with the tuning spec of the
family (:func:`kdagen.tuning.families.family_spec`: g given, the chunk form bounded as the
build says), so the kernels timed are the ones the member's ops run and look their winners up
for.  Its inputs follow the spec's layout: g ``[B, T, HV, K]`` for a per-channel decay,
``[B, T, HV]`` for a scalar one, none without decay; beta only with a rank-1 part
(``spec.has_rank1``), general DPLR's a (read) and b (write) [B, T, HV, K] instead of beta.
The reference is the spec's own recurrence evaluated from its expressions, token by token in
float64 (:func:`kdagen.spec.evaluate.spec_recurrence`), on the candidate's device -- nothing
hand-written per member.

The launch descriptions below (timed one kernel at a time, compiled for a GPU that is not
here) are :func:`kdagen.ops.member.chunk_member_launches`'s.

A general DPLR spec (vectors a and b, no beta) runs its chunk form through
:func:`kdagen.ops.dplr.chunk_dplr_delta_rule` (family ``chunk_train``; its launches are
:func:`~kdagen.ops.dplr.chunk_dplr_launches`'), with a and b made from KDA's random inputs.
"""
from __future__ import annotations

import torch

from ..codegen.lower import lower
from ..dtypes import dtype as as_dtype
from ..kernels import build, dummy_pointer
from ..spec import Recurrence
from ..ops.member import free_rank1
from ..spec.evaluate import spec_recurrence
from .families import family_spec, uses_kda_ops

DIRECT_LOWER = -5.0  # the KDA inputs' gate range: g in [-5, 0)


def member_spec(family: str, spec_args: dict) -> Recurrence | None:
    """The spec a family's candidates run through the member entries with; None for KDA's ops."""
    return None if uses_kda_ops(spec_args) else family_spec(family, spec_args)


def member_inputs(spec: Recurrence, x: dict) -> dict:
    """KDA's random inputs (:func:`kdagen.tuning.candidates.random_inputs`) in ``spec``'s layout:
    g per channel (drawn into the gate's bound when it is above -5), one per head and token for
    a scalar decay (channel 0's draw), none without decay; beta only with a rank-1 part.
    General DPLR (free a, b, FLA's convention): the read vector a is k (a unit vector) on each
    value head and the write vector b = -beta a, as the bench harness (kdagen.tuning.bench_cases) draws them -- the
    transition Diag(exp g) - beta a a^T stays contracting, so long checks stay finite."""
    out = dict(x)
    g = x["g"]
    if spec.decay == "identity":
        g = None
    else:
        lb = spec.gate.lower_bound if spec.gate is not None else None
        if lb is not None and lb > DIRECT_LOWER:
            g = g * (lb / DIRECT_LOWER)  # [-5, 0) onto [lb, 0): the kernels may assume g >= lb
        if spec.decay == "scalar":
            g = g[..., 0].contiguous()
    out["g"] = g
    if not spec.has_rank1:
        out["beta"] = None
    elif free_rank1(spec):
        out.update(dplr_vectors(x))
        out["beta"] = None
    return out


def dplr_vectors(x: dict) -> dict:
    """General DPLR's a and b ([B, T, HV, K], in q's dtype) from KDA's random inputs: the read
    vector a is the unit key of each value head's q/k head, and the write vector
    b = -beta * unit(a + q / (2 |q|)), a unit vector near a but not parallel to it, so every
    step's transition Diag(exp g) + b a^T stays a contraction."""
    q, k, beta = x["q"], x["k"], x["beta"]
    HV = x["v"].shape[2]
    rep = HV // q.shape[2]
    kf = torch.nn.functional.normalize(k.float().repeat_interleave(rep, 2), dim=-1)
    qf = torch.nn.functional.normalize(q.float().repeat_interleave(rep, 2), dim=-1)
    b = -beta.float()[..., None] * torch.nn.functional.normalize(kf + 0.5 * qf, dim=-1)
    return dict(a=kf.to(q.dtype).contiguous(), b=b.to(q.dtype).contiguous())


def _dplr_args(x: dict, spec: Recurrence) -> dict:
    """chunk_dplr_delta_rule's arguments from member inputs (g is FLA's gk), bounded as ``spec``."""
    lb = spec.gate.lower_bound if spec.gate is not None else None
    return dict(q=x["q"], k=x["k"], v=x["v"], a=x["a"], b=x["b"], gk=x["g"], initial_state=x["initial_state"],
                safe_gate=lb is not None, lower_bound=lb)


def forward(spec: Recurrence, family: str, config, x: dict, **kw):
    """One call of the member's op (output_final_state): the recurrent form's or the chunk form's."""
    from ..ops.member import chunk_member, fused_recurrent_member

    if family == "recurrent":
        return fused_recurrent_member(spec, **x, output_final_state=True, config=config, **kw)
    if free_rank1(spec):
        from ..ops.dplr import chunk_dplr_delta_rule

        return chunk_dplr_delta_rule(**_dplr_args(x, spec), output_final_state=True, config=config, **kw)
    return chunk_member(spec, **x, output_final_state=True, config=config, **kw)


def reference(spec: Recurrence, r: dict):
    """(o, final state) of ``spec``'s own float64 recurrence on ``r`` (the op's inputs, float64;
    a general DPLR spec's a and b in FLA's convention, the spec's (a', b') = (-b, a))."""
    a = None if r.get("b") is None else -r["b"]
    return spec_recurrence(spec, r["q"], r["k"], r["v"], r.get("g"), r.get("beta"), a, r.get("a"),
                           initial_state=r["initial_state"], output_final_state=True)


def chunk_train_launches(spec: Recurrence, x: dict, config, final_state: bool = True):
    """General DPLR's chunk forward launches (intra, state) for ``config`` (a ChunkTrainConfig), not run;
    ``final_state``: output_final_state."""
    from ..ops.dplr import chunk_dplr_launches

    launches, _ = chunk_dplr_launches(**_dplr_args(x, spec), config=config, output_final_state=final_state)
    return launches


def chunk_fwd_launches(spec: Recurrence, x: dict, config, final_state: bool = True):
    """The inference forward's launches of a chunk call (not run); ``final_state``: output_final_state."""
    from ..ops.member import chunk_member_launches

    launches, _ = chunk_member_launches(spec, **x, training=False, config=config, output_final_state=final_state)
    return launches


def chunk_bwd_launches(spec: Recurrence, x: dict, fwd_config, bwd_config, do=None, with_rerun: bool = False,
                       final_state: bool = True):
    """``(forward launches, backward launches)`` of a training call (not run); ``with_rerun``:
    the forward's end with the backward's re-run of the intra launch when the backward config
    recomputes the intermediates (everything a training step compiles), as
    :func:`kdagen.ops.chunk.chunk_kda_bwd_launches` does for KDA; ``final_state``: output_final_state."""
    from ..ops.member import chunk_member_launches

    fwd, launches, _ = chunk_member_launches(spec, **x, training=True, config=fwd_config, bwd_config=bwd_config,
                                             output_final_state=final_state, do=do, with_rerun=with_rerun)
    return fwd, launches


def recurrent_launch(spec: Recurrence, x: dict, config, pdl: bool | None = None):
    """The recurrent form's one launch for ``config`` (not run; calling it again rewrites the same
    outputs): what the member's decode step launches, without the op's Python work; ``pdl``: as
    prepare_recurrent's (None: as the inputs' device decides)."""
    from ..ops.inputs import check_inputs
    from ..ops.recurrent import prepare_recurrent

    q, k, v, g, beta, h0 = (x[n] for n in ("q", "k", "v", "g", "beta", "initial_state"))
    ab = (x["a"].contiguous(), x["b"].contiguous()) if free_rank1(spec) else None
    dims, _ = check_inputs(q, k, v, g, beta, scale=None, initial_state=h0, cu_seqlens=None, sync_seqlens=False,
                           decay=spec.decay, rank1=spec.has_rank1 and ab is None)
    plan = lower(spec, dims.K, dims.V, as_dtype(q.dtype).name, "recurrent")
    q, k, v = (t.contiguous() for t in (q, k, v))
    g = dummy_pointer(q.device) if g is None else g.contiguous()
    beta = dummy_pointer(q.device) if beta is None else beta.contiguous()  # no rank-1 part: not read
    launch, _ = prepare_recurrent(q, k, v, g, beta, scale=dims.K ** -0.5, initial_state=h0,
                                  output_final_state=True, cu_seqlens=None, state_indices=None, dims=dims, plan=plan,
                                  built=build(plan, config), ab=ab, pdl=pdl)
    return launch
