"""flash-linear-attention 0.6.0's ops of Gated DeltaNet and DeltaNet, with its names, signatures,
layouts and return values: thin wrappers over :mod:`kdagen.ops.member` with the member's spec.

    chunk_gated_delta_rule / fused_recurrent_gated_delta_rule   g: [B, T, HV] (scalar decay)
    chunk_delta_rule / fused_recurrent_delta_rule               no decay
    chunk_gla / fused_recurrent_gla                             g: [B, T, HV, K], no beta (no rank-1 part)

Beyond FLA: float32 inputs, GVA for DeltaNet (HV a multiple of H, as GDN), gradients through
the recurrent ops, the decode state pool (``ssm_state_indices``) and ``out=`` on the recurrent
ops, ``check_inputs``, ``chunk_size`` on ``chunk_gla``.  ``chunk_size`` 16, 32 or 64, as FLA's
(16: the training forward's launches for inference too).  ``cp_context`` (context
parallelism, :mod:`kdagen.ops.cp`) on the chunk ops.  Refused with a ValueError naming the
keyword: ``gv`` (and ``gk`` together with ``g``), ``head_first``.
"""
from __future__ import annotations

from functools import lru_cache

import sympy as sp
import torch

from .. import spec as S
from .cp import cp_call
from .inputs import fla_dtypes, gate_choice, state_layout
from .member import CHUNK_SIZES, chunk_member, fused_recurrent_member

_CHUNK_IGNORED = ("chunk_indices",)  # FLA's precomputed schedule: kdagen builds its own from cu_seqlens


@lru_cache(maxsize=8)
def gdn_spec(use_gate_in_kernel: bool = False, has_bias: bool = False) -> S.Recurrence:
    """Gated DeltaNet's spec for FLA's flags: g given, or (``use_gate_in_kernel``) FLA's GDN gate
    g = -exp(A_log) softplus(z + dt_bias), A_log and dt_bias one per value head (dt_bias
    substituted out when not given)."""
    if not use_gate_in_kernel:
        return S.gdn()
    gate = S.gate_softplus()
    expr = gate.expr if has_bias else gate.expr.subs(S.dt_bias, 0)
    params = ((S.A_log, "head"),) + (((S.dt_bias, "head"),) if has_bias else ())
    return S.gdn(S.Gate("gdn_softplus" + ("" if has_bias else "_nobias"), sp.simplify(expr), gate.raw, params))


def _common(op: str, kwargs: dict):
    if "head_first" in kwargs:
        raise ValueError(f"{op}: head_first has been removed (as in FLA); inputs are [B, T, H, ...]")
    cs = kwargs.get("chunk_size")
    if cs is not None and cs not in CHUNK_SIZES:
        raise ValueError(f"{op}: chunk_size={cs!r} is not supported; kdagen's chunk kernels take 16, 32 or 64")
    for name in _CHUNK_IGNORED:
        kwargs.pop(name, None)


@fla_dtypes("q")
def chunk_gated_delta_rule(q, k, v, g, beta, scale: float | None = None, initial_state=None,
                           output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                           use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False,
                           state_v_first: bool = False, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None,
                           cp_context=None, **kwargs):
    """Chunkwise Gated DeltaNet (FLA 0.6.0's signature).  q, k: [B, T, H, K]; v: [B, T, HV, V];
    g: [B, T, HV] log decay (or, with ``use_gate_in_kernel=True``, the raw input of
    g = -exp(A_log) softplus(g + dt_bias), A_log and dt_bias [HV], given as keywords as in FLA);
    beta: [B, T, HV]; initial_state: [N, HV, K, V].  Returns ``(o, final_state)``.

    Any g <= 0 gives the recurrence's answer (no bound needed: the diagonal tiles multiply
    whole dots by exp(G_i - G_j) <= 1); g = -inf is a reset (taken as -40, a decay to 4e-18).
    Differentiable in q, k, v, g, beta, initial_state (and A_log, dt_bias).  FLA's
    ``chunk_indices`` is accepted and not read (kdagen builds the schedule from cu_seqlens);
    other keywords as :func:`kdagen.ops.member.chunk_member` (``config``, ``check_inputs``,
    ``return_intermediate_states``, ``disable_recompute``, ``chunk_size`` 16/32/64).
    ``cp_context``: context parallelism as :func:`kdagen.chunk_kda`'s (:mod:`kdagen.ops.cp`), as on
    ``chunk_delta_rule``, ``chunk_gla`` and ``chunk_dplr_delta_rule``."""
    op = "chunk_gated_delta_rule"
    _common(op, kwargs)
    if cp_context is not None:
        return cp_call(op, chunk_gated_delta_rule, cp_context, (q, k, v, g, beta), scale, initial_state,
                       output_final_state, state_layout(op, state_v_first, kwargs), cu_seqlens,
                       dict(kwargs, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                            use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval), splits=True)
    use_gate = bool(kwargs.pop("use_gate_in_kernel", False))
    A_log, dt_bias = kwargs.pop("A_log", None), kwargs.pop("dt_bias", None)
    if use_gate and A_log is None:
        raise ValueError(f"{op}: use_gate_in_kernel=True needs A_log [HV] (the gate's rate), as in FLA")
    spec = gdn_spec(use_gate, dt_bias is not None and use_gate)
    return chunk_member(spec, q, k, v, g, beta, scale=scale, initial_state=initial_state,
                        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                        use_gate_in_kernel=use_gate, A_log=A_log, dt_bias=dt_bias,
                        use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
                        state_v_first=state_v_first, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, op=op,
                        **kwargs)


@fla_dtypes("v")
def fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale: float | None = None,
                                     initial_state=None, output_final_state: bool = False,
                                     use_qk_l2norm_in_kernel: bool = False, use_gate_in_kernel: bool = False,
                                     A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel: bool = False,
                                     allow_neg_eigval: bool = False, state_v_first: bool = False, cu_seqlens=None,
                                     **kwargs):
    """Recurrent Gated DeltaNet (decode; FLA 0.6.0's signature).  g: [B, T, HV] (or None: no
    decay, DeltaNet); beta None means 1, as in FLA.  ``gk`` [B, T, HV, K] alone (a per-channel
    decay) runs the KDA spec; ``gk`` with ``g``, and ``gv``, are refused (ValueError).
    kdagen's extras as fused_recurrent_kda: ``ssm_state_indices`` (a state pool updated in
    place; [N, T_max] with ``num_accepted_tokens`` for speculative decoding, as vLLM calls its GDN
    decode), ``out=``, ``config``, ``check_inputs``, ``cu_seqlens_cpu``; gradients when an input
    requires grad (FLA 0.6.0 has none here)."""
    op = "fused_recurrent_gated_delta_rule"
    if gv is not None:
        raise ValueError(f"{op}: gv (a per-value-channel decay) is not supported by kdagen; pass gv=None")
    if gk is not None and g is not None:
        raise ValueError(f"{op}: g and gk together (a scalar and a per-channel decay) are not supported by kdagen; "
                         "pass one of them")
    if "head_first" in kwargs:
        raise ValueError(f"{op}: head_first has been removed (as in FLA); inputs are [B, T, H, ...]")
    if use_gate_in_kernel:
        if A_log is None:
            raise ValueError(f"{op}: use_gate_in_kernel=True needs A_log [HV] (the gate's rate), as in FLA")
        if g is None:
            raise ValueError(f"{op}: use_gate_in_kernel=True needs g (the gate's raw input), as in FLA")
    if beta is None:
        beta = q.new_ones(q.shape[:2] + (v.shape[2],))
    if gk is not None:
        if use_gate_in_kernel:
            raise ValueError(f"{op}: use_gate_in_kernel=True with gk (FLA's GDN gate is per head) is not supported; "
                             "use kdagen.fused_recurrent_kda for KDA's in-kernel gates")
        spec, gate = S.kda(), gk
    elif g is None:
        spec, gate = S.deltanet(), None
        if A_log is not None or dt_bias is not None:
            raise ValueError(f"{op}: A_log/dt_bias without a gate g do not apply")
    else:
        spec, gate = gdn_spec(use_gate_in_kernel, dt_bias is not None and use_gate_in_kernel), g
    return fused_recurrent_member(spec, q, k, v, gate, beta, scale=scale, initial_state=initial_state,
                                  output_final_state=output_final_state,
                                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                                  use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias,
                                  use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                                  allow_neg_eigval=allow_neg_eigval, state_v_first=state_v_first,
                                  cu_seqlens=cu_seqlens, op=op, **kwargs)


@fla_dtypes("q")
def chunk_delta_rule(q, k, v, beta, scale: float | None = None, initial_state=None, output_final_state: bool = False,
                     use_qk_l2norm_in_kernel: bool = False, cu_seqlens=None, cu_seqlens_cpu=None, **kwargs):
    """Chunkwise DeltaNet (FLA 0.6.0's signature): no decay.  q, k: [B, T, H, K]; v: [B, T, HV, V]
    (HV = H in FLA; a multiple of H here, GVA); beta: [B, T, HV].  Returns ``(o, final_state)``.
    Differentiable in q, k, v, beta, initial_state.  float32 inputs are accepted (FLA refuses
    them).  kdagen's extras as :func:`chunk_gated_delta_rule`."""
    op = "chunk_delta_rule"
    _common(op, kwargs)
    cp_context = kwargs.pop("cp_context", None)
    if cp_context is not None:
        svf = state_layout(op, kwargs.pop("state_v_first", False), kwargs)
        return cp_call(op, chunk_delta_rule, cp_context, (q, k, v, beta), scale, initial_state, output_final_state,
                       svf, cu_seqlens, dict(kwargs, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel), splits=True)
    return chunk_member(S.deltanet(), q, k, v, None, beta, scale=scale, initial_state=initial_state,
                        output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                        cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, op=op, **kwargs)


@fla_dtypes("q")
def fused_recurrent_delta_rule(q, k, v, beta=None, scale: float | None = None, initial_state=None,
                               output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                               cu_seqlens=None, **kwargs):
    """Recurrent DeltaNet (decode; FLA 0.6.0's signature): beta None means 1, as in FLA.
    kdagen's extras as :func:`fused_recurrent_gated_delta_rule` (state pool, ``out=``, ...)."""
    op = "fused_recurrent_delta_rule"
    if scale is not None and not scale > 0:
        raise ValueError(f"{op}: scale must be positive, got {scale}")
    if beta is None:
        beta = q.new_ones(q.shape[:2] + (v.shape[2],))
    return fused_recurrent_member(S.deltanet(), q, k, v, None, beta, scale=scale, initial_state=initial_state,
                                  output_final_state=output_final_state,
                                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens, op=op,
                                  **kwargs)


chunk_gdn = chunk_gated_delta_rule
fused_recurrent_gdn = fused_recurrent_gated_delta_rule


@lru_cache(maxsize=8)
def gla_spec(lower_bound: float | None = None) -> S.Recurrence:
    """GLA's spec: g given (a per-channel log decay), bounded below by ``lower_bound`` when the
    caller promises one (the diagonal tiles are then factorised dots; element-wise otherwise)."""
    return S.gla(S.gate_direct(lower_bound))


@fla_dtypes("v")
def chunk_gla(q, k, v, g, scale: float | None = None, initial_state=None, output_final_state: bool = False,
              state_v_first: bool = False, cu_seqlens=None, cu_seqlens_cpu=None, safe_gate: bool = False,
              lower_bound: float | None = None, **kwargs):
    """Chunkwise gated linear attention (FLA 0.6.0's ``chunk_gla`` signature): S_t = Diag(exp g_t)
    S_{t-1} + k_t v_t^T, o_t = scale S_t^T q_t.  q, k: [B, T, H, K]; v: [B, T, HV, V]; g:
    [B, T, HV, K] log decay (<= 0); initial_state: [N, HV, K, V].  Returns ``(o, final_state)``.

    Beyond FLA: GVA (HV a multiple of H), float32 inputs, ``safe_gate=True`` with ``lower_bound=L``
    (default -5; kdagen's flags, read as chunk_kda reads them): the caller promises g >= L, which
    picks the bounded spec and its tuned winners.  With or without it the diagonal sub-tiles are
    factorised tensor-core dots wherever their decay span allows and element-wise elsewhere, as for
    chunk_kda (inference: in the solve; training: in repair launches, unless the configs set
    ``check_gate_bound=False``), so a g below the bound or -inf gets the recurrence's answer.  No
    beta: GLA has no rank-1 part."""
    op = "chunk_gla"
    _common(op, kwargs)
    cp_context = kwargs.pop("cp_context", None)
    if cp_context is not None:
        return cp_call(op, chunk_gla, cp_context, (q, k, v, g), scale, initial_state, output_final_state,
                       state_layout(op, state_v_first, kwargs), cu_seqlens,
                       dict(kwargs, safe_gate=safe_gate, lower_bound=lower_bound), splits=True)
    _, bound, _, _ = gate_choice(False, safe_gate, lower_bound, False, False)  # chunk_kda's reading of the flags
    return chunk_member(gla_spec(bound), q, k, v, g, None, scale=scale, initial_state=initial_state,
                        output_final_state=output_final_state, state_v_first=state_v_first, cu_seqlens=cu_seqlens,
                        cu_seqlens_cpu=cu_seqlens_cpu, op=op, **kwargs)


@fla_dtypes("q")
def fused_recurrent_gla(q, k, v, gk=None, gv=None, scale: float | None = None, initial_state=None,
                        output_final_state: bool = False, reverse: bool = False, state_v_first: bool = False,
                        cu_seqlens=None, **kwargs):
    """Recurrent GLA (FLA 0.6.0's ``fused_recurrent_gla`` signature; decode, with kdagen's state pool
    ``ssm_state_indices`` and ``out=``).  gk: [B, T, HV, K] log decay, or None (no decay: plain
    linear attention, run as a zero decay).  ``gv`` (a decay over V) and ``reverse=True`` are
    refused with a ValueError."""
    op = "fused_recurrent_gla"
    if gv is not None:
        raise ValueError(f"{op}: gv (a decay along V) is not supported by kdagen's GLA kernels; only gk")
    if reverse:
        raise ValueError(f"{op}: reverse=True (a right-to-left scan) is not supported by kdagen")
    if gk is None:
        if v.dim() != 4 or q.dim() != 4:
            raise ValueError(f"{op}: q must be [B, T, H, K] and v [B, T, HV, V]")
        gk = q.new_zeros(q.shape[0], q.shape[1], v.shape[2], q.shape[3], dtype=torch.float32)
    return fused_recurrent_member(gla_spec(None), q, k, v, gk, None, scale=scale, initial_state=initial_state,
                                  output_final_state=output_final_state, state_v_first=state_v_first,
                                  cu_seqlens=cu_seqlens, op=op, **kwargs)
