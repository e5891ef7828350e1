"""Generic entries for any spec :func:`kdagen.codegen.lower.lower` can lower: ``chunk_member``
(chunkwise form: prefill and training, with autograd) and ``fused_recurrent_member`` (decode,
with a state pool, and a backward).  The spec decides everything the kernels do -- its decay
kind (identity / scalar / per channel) sets g's layout and the plan's diagonal mode, its gate
the in-kernel gate -- so a member no library ships runs through here with no template edit.
The FLA-named ops of the other members (:mod:`kdagen.ops.family`) are thin wrappers over these.

g's layout by the spec's decay: [B, T, HV, K] (channel), [B, T, HV] (scalar), none (identity:
g must be None).  With ``use_gate_in_kernel`` g is the gate's raw input z in that layout; a
gate parameter laid out per channel (dt_bias) may be given per value head ([HV]) for a scalar
decay, where every channel shares it.
"""
from __future__ import annotations

import dataclasses
from functools import lru_cache

import torch

from .. import spec as S
from ..codegen.lower import lower, spec_max_head_dim
from ..cache.lookup import resolve
from ..dtypes import dtype
from ..kernels import build, dummy_pointer
from . import checks, recurrent_bwd
from .chunk_call import (chunk_configs, fla_layout, forward_launches, prepare_chunk, requires_grad, run_forward,
                         train, training_step_launches, with_plan)
from .inputs import (RECURRENT_IGNORED_KWARGS, check_beta_flags, check_inplace_final_state, check_kwargs,
                     check_rank1_vectors, check_runnable, check_token_slots, host_seqlens, preprocess, state_layout)
from .inputs import check_inputs as _validate
from .recurrent import RecurrentFunction, prepare_recurrent, tensor_key, token_slot_config
from .traced import eager_under_compile


# fused_recurrent_member's per-geometry memo (as fused_recurrent_kda's fast path): the first call of a
# signature -- every tensor's geometry, every flag, the spec -- is validated, lowered and built in
# full; later calls lay out the arguments and launch.  No value takes part (reading one would wait
# for the device).
_FAST: dict = {}
_FAST_MAX = 4096
# chunk_member's chunk lengths (FLA's chunk_delta_rule / chunk_gated_delta_rule take these; 16 runs the
# training forward's launches for inference too, kdagen.ops.chunk_call.chunk_configs)
CHUNK_SIZES = (16, 32, 64)


def _gate_args(op: str, spec: S.Recurrence, q, v, g, use_gate_in_kernel: bool, A_log, dt_bias,
               expand_bias: bool = True):
    """(g as the kernels read it, A_log, dt_bias) after the checks that depend on the spec.
    A scalar decay's dt_bias [HV] is expanded to [HV, K] (read per channel) unless
    ``expand_bias`` is False (the decode kernel reads it per head: no copy per step)."""
    if spec.decay == "identity":
        if g is not None:
            raise ValueError(f"{op}: spec {spec.name!r} has no decay, so it takes no gate; pass g=None")
        if use_gate_in_kernel or A_log is not None or dt_bias is not None:
            raise ValueError(f"{op}: spec {spec.name!r} has no decay: use_gate_in_kernel, A_log and dt_bias "
                             "do not apply")
        return None, None, None
    if g is None:
        raise ValueError(f"{op}: spec {spec.name!r} has a {spec.decay} decay: g is required")
    if not use_gate_in_kernel:
        if A_log is not None or dt_bias is not None:
            raise ValueError(f"{op}: A_log/dt_bias are only used with use_gate_in_kernel=True")
        return g, None, None
    if spec.gate.name == "direct":
        raise ValueError(f"{op}: use_gate_in_kernel=True needs a gate expression in the spec; spec "
                         f"{spec.name!r} takes g directly")
    free = spec.gate.substituted.free_symbols
    for name, sym, x in (("A_log", S.A_log, A_log), ("dt_bias", S.dt_bias, dt_bias)):
        if sym in free and x is None:
            raise ValueError(f"{op}: the gate {spec.gate.name!r} reads {name}; pass it (or a spec whose gate "
                             f"does not read it)")
        if sym not in free and x is not None:
            raise ValueError(f"{op}: the gate {spec.gate.name!r} does not read {name}; pass {name}=None")
    if dt_bias is not None and spec.decay == "scalar":
        HV, K = v.shape[2], q.shape[3]
        if isinstance(dt_bias, torch.Tensor) and dt_bias.numel() == HV:
            # one bias per value head, the same for every channel: the chunk kernels read it per channel
            if expand_bias:
                dt_bias = dt_bias.reshape(HV, 1).expand(HV, K).contiguous()
        elif isinstance(dt_bias, torch.Tensor):
            raise ValueError(f"{op}: dt_bias must have HV = {HV} entries (one per value head), got shape "
                             f"{tuple(dt_bias.shape)}")
    return g, A_log, dt_bias


@lru_cache(maxsize=64)
def _refuse_dplr(op: str, spec: S.Recurrence) -> None:
    """The general DPLR structure reads vectors a and b, not beta: its chunk form is
    :func:`kdagen.ops.dplr.chunk_dplr_delta_rule`, not these beta-taking entries."""
    if free_rank1(spec):
        raise ValueError(f"{op}: spec {spec.name!r} has the general DPLR structure (vectors a and b, no beta), "
                         "which the member entries do not take; call kdagen.chunk_dplr_delta_rule(q, k, v, a, b, gk, "
                         "...) for its chunk form")


def _beta_args(op: str, spec: S.Recurrence, beta, use_beta_sigmoid_in_kernel: bool, allow_neg_eigval: bool):
    """beta is required exactly when the spec has a rank-1 part (GLA's structure has none)."""
    if spec.has_rank1:
        if beta is None:
            raise ValueError(f"{op}: beta is required")
        return
    if beta is not None:
        raise ValueError(f"{op}: spec {spec.name!r} has no rank-1 (delta) part, so it takes no beta; pass beta=None")
    if use_beta_sigmoid_in_kernel or allow_neg_eigval:
        raise ValueError(f"{op}: spec {spec.name!r} has no beta: use_beta_sigmoid_in_kernel and allow_neg_eigval "
                         "do not apply")


def free_rank1(spec: S.Recurrence) -> bool:
    """Whether ``spec`` has general DPLR's free rank-1 vectors (inputs a and b instead of beta):
    the structure :func:`kdagen.codegen.lower.lower` lowers as ``"dplr"``."""
    return spec.a is not None and spec.a == S.a_free and spec.b == S.b_free


def _dplr_args(op: str, spec: S.Recurrence, beta, a, b, use_beta_sigmoid_in_kernel: bool, allow_neg_eigval: bool):
    """General DPLR takes a (read) and b (write) [B, T, HV, K], flash-linear-attention's
    convention, and no beta; any other spec takes no a, b."""
    if not free_rank1(spec):
        if a is not None or b is not None:
            raise ValueError(f"{op}: spec {spec.name!r} takes no free rank-1 vectors a, b (general DPLR's); pass "
                             "a=None, b=None")
        return None
    if beta is not None:
        raise ValueError(f"{op}: spec {spec.name!r} (general DPLR) takes a and b, not beta; pass beta=None")
    if use_beta_sigmoid_in_kernel or allow_neg_eigval:
        raise ValueError(f"{op}: spec {spec.name!r} has no beta: use_beta_sigmoid_in_kernel and allow_neg_eigval "
                         "do not apply")
    for name, x in (("a", a), ("b", b)):
        if x is None:
            raise ValueError(f"{op}: spec {spec.name!r} (general DPLR) needs {name} [B, T, HV, K] (a: the read "
                             "vector, b: the write vector)")
    return a, b


def _value_check(op, q, k, v, g, beta, initial_state, cu_seqlens, state_indices, raw_gate, A_log, dt_bias,
                 ab=None, accepted=None):
    checks.check_values(op, q=q, k=k, v=v, g=g if g is not None else torch.zeros(1, device=q.device), beta=beta,
                        initial_state=initial_state, cu_seqlens=cu_seqlens, state_indices=state_indices,
                        raw_gate=raw_gate, A_log=A_log, dt_bias=dt_bias,
                        a=None if ab is None else ab[0], b=None if ab is None else ab[1], accepted=accepted)


@eager_under_compile  # no registered op (yet): torch.compile runs it eagerly, a graph break
def chunk_member(spec: S.Recurrence, q, k, v, g=None, beta=None, scale=None, initial_state=None,
                 output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                 use_gate_in_kernel: bool = False, A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel: bool = False,
                 allow_neg_eigval: bool = False, state_v_first: bool = False, cu_seqlens=None, cu_seqlens_cpu=None,
                 return_intermediate_states: bool = False, intermediate_states_dtype=None,
                 disable_recompute: bool = False, config=None,
                 chunk_size: int | None = None, check_inputs: bool | None = None, op: str = "chunk_member",
                 **kwargs):
    """The chunkwise form of ``spec`` with FLA's conventions (see the module; the keywords are
    chunk_kda's).  Returns ``(o, final_state)`` (and the per-chunk states with
    ``return_intermediate_states``, inference only).  Differentiable in q, k, v, g, beta,
    initial_state (and A_log, dt_bias with an in-kernel gate) when one of them requires grad."""
    state_v_first = state_layout(op, state_v_first, kwargs)
    check_kwargs(op, kwargs)
    if chunk_size is not None and chunk_size not in CHUNK_SIZES:
        raise ValueError(f"{op}: chunk_size must be 16, 32 or 64, got {chunk_size!r}")
    if chunk_size is not None and config is not None and config.chunk_size != chunk_size:
        raise ValueError(f"{op}: chunk_size={chunk_size} disagrees with config.chunk_size={config.chunk_size}")
    if isinstance(q, torch.Tensor):
        check_runnable(q)
    call, x, training = _prepare_chunk(
        spec, q, k, v, g, beta, scale=scale, initial_state=initial_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias,
        use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
        state_v_first=state_v_first, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, check_inputs=check_inputs,
        op=op, sync_seqlens=None if not return_intermediate_states else True, l2norm_launch=True)
    if training and return_intermediate_states:
        raise ValueError(f"{op}: return_intermediate_states=True is inference-only and has no backward")
    given = config
    config, bwd_config = chunk_configs(call, config, None, training, chunk_size, disable_recompute)
    if training:
        return train(call, x, config, bwd_config, output_final_state,
                        plain=_plain_chunks(spec, call, given, config, bwd_config, chunk_size, disable_recompute))
    o, ht, hs = run_forward(call, x, config, output_final_state, return_intermediate_states)
    if return_intermediate_states:
        return o, ht, fla_layout(hs, call, intermediate_states_dtype)
    return o, ht


@lru_cache(maxsize=64)
def _direct_gate_plan(spec: S.Recurrence, lower_bound, K: int, V: int, dtype: str):
    """The chunk plan of ``spec`` with g given (its gate's bound as the direct gate's): once per spec and
    geometry, not per training call."""
    return lower(dataclasses.replace(spec, gate=S.gate_direct(lower_bound)), K, V, dtype, "chunk", False)


def _plain_chunks(spec, call, given, config, bwd_config, chunk_size, disable_recompute):
    """Where a training call's in-kernel gate runs in launches of its own (``ChunkTrainConfig.gate_launch``):
    the call and configs of its chunk launches, the member with g given (the gate's bound, if its formula
    has one, as the direct gate's); the configs are that plan's own unless the caller gave some (a
    training forward's config is the call's then, without gate_launch).  None otherwise."""
    if not config.launches_gate(call.plan):
        return None
    p = call.plan
    plain = with_plan(call, _direct_gate_plan(spec, p.lower_bound, p.K, p.V, p.dtype))
    if given is None:
        config, bwd_config = chunk_configs(plain, None, None, True, chunk_size, disable_recompute)
    return plain, config.replace(gate_launch=False), bwd_config


def _prepare_chunk(spec, q, k, v, g, beta, *, scale=None, initial_state=None, use_qk_l2norm_in_kernel=False,
                   use_gate_in_kernel=False, A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel=False,
                   allow_neg_eigval=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
                   check_inputs=None, op="chunk_member", training=None, sync_seqlens=None, l2norm_launch=False):
    """A chunk call of ``spec`` on the chunk front end (:func:`~.chunk_call.prepare_chunk`), after the
    checks that depend on the spec (beta, gate, general DPLR refused): ``(call, inputs by name, training)``.
    ``training`` None: whether some input requires grad (then the l2-norm and beta sigmoid are
    torch ops here, which autograd differentiates; else the inference kernels apply them).
    ``sync_seqlens``: read a device cu_seqlens back (default: when training; an inference call
    builds its chunk schedule on the device).  ``l2norm_launch``: a training call leaves the l2-norm
    to launches of its own (``call.l2norm``, :func:`.chunk_call.train`)."""
    _refuse_dplr(op, spec)
    _beta_args(op, spec, beta, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    g, A_log, dt_bias = _gate_args(op, spec, q, v, g, use_gate_in_kernel, A_log, dt_bias)
    if training is None:
        training = requires_grad(q, k, v, g, beta, initial_state, A_log, dt_bias)
    check = None
    if checks.wanted(check_inputs):
        def check(beta_read):
            _value_check(op, q, k, v, g, beta_read, initial_state, cu_seqlens, None, use_gate_in_kernel, A_log,
                         dt_bias)
    call, x = prepare_chunk(
        spec, q, k, v, g, beta, member=f"{op} (spec {spec.name!r})", training=training, scale=scale,
        initial_state=initial_state, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, A_log=A_log,
        dt_bias=dt_bias, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_gate_in_kernel=use_gate_in_kernel,
        use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
        state_v_first=state_v_first, sync_seqlens=sync_seqlens, l2norm_launch=l2norm_launch,
        tensors=dict(decay=spec.decay, rank1=spec.has_rank1, max_head_dim=spec_max_head_dim(spec)), value_check=check)
    return call, x, training


def chunk_member_launches(spec: S.Recurrence, q, k, v, g=None, beta=None, *, training: bool = False, config=None,
                          bwd_config=None, output_final_state: bool = False, do=None, dht=None,
                          with_rerun: bool = False, chunk_size: int | None = None, **kw):
    """Describe, without running, the launches a chunk call of ``spec`` makes (for compile-only
    checks, benchmarks of single kernels and the tuner): inference ``(fwd_launches, outputs)``;
    ``training=True``: ``(fwd_launches, bwd_launches, bwd_outputs)`` -- the backward reads what
    the forward launches write (run those first); ``do``/``dht`` default to zeros.  In recompute
    mode the backward's launches begin with chunk_bwd_rerun; ``with_rerun`` adds the forward intra
    launch's re-run where the backward takes one instead (:func:`~.chunk_bwd.saved_names`).  ``chunk_size``:
    :func:`chunk_member`'s (16: an inference call's launches are the training forward's).  ``kw``: the
    validation keywords of :func:`chunk_member` (scale, initial_state, cu_seqlens, gate ...)."""
    call, x, _ = _prepare_chunk(spec, q, k, v, g, beta, training=training, **kw)
    config, bwd_config = chunk_configs(call, config, bwd_config, training, chunk_size)
    if not training:
        return forward_launches(call, x, config, output_final_state)
    return training_step_launches(call, x, config, bwd_config, output_final_state, do, dht, with_rerun)


@eager_under_compile  # as chunk_member
def fused_recurrent_member(spec: S.Recurrence, q, k, v, g=None, beta=None, scale=None, initial_state=None,
                           output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                           use_gate_in_kernel: bool = False, A_log=None, dt_bias=None,
                           use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False,
                           state_v_first: bool = False, cu_seqlens=None, ssm_state_indices=None, out=None,
                           config=None, check_inputs: bool | None = None, cu_seqlens_cpu=None,
                           a=None, b=None, reverse: bool = False, op: str = "fused_recurrent_member",
                           num_accepted_tokens=None, **kwargs):
    """The recurrent form (decode) of ``spec`` with fused_recurrent_kda's conventions: the state
    pool (``ssm_state_indices``: ``initial_state`` is [P, HV, K, V], updated in place; negative
    slots are padding), ``out=``, nothing read from the device.  With some input requiring grad:
    the autograd path (pool and ``out=`` refused), as fused_recurrent_kda.

    General DPLR (:func:`free_rank1`: ``kdagen.spec.dplr()``) takes ``a`` (read) and ``b`` (write),
    [B, T, HV, K], in flash-linear-attention's convention -- S = Diag(exp g) S + b (a^T S) + k v^T,
    so the spec's own inputs are a' = -b, b' = a -- and no beta; ``reverse=True`` walks each
    sequence last to first (this structure only; it has no backward).  Gradients of q, k, v, g,
    a, b and the initial state come from general DPLR's recurrent backward template.

    Speculative decoding, as :func:`kdagen.fused_recurrent_kda`: a 2-D ``ssm_state_indices`` [N, T_max] (a
    slot per token, each token's state written to its slot) and ``num_accepted_tokens`` [N] (sequence n
    starts from slot [n, num_accepted_tokens[n] - 1]; without it from slot [n, 0]); not with ``reverse``."""
    if kwargs:
        state_v_first = state_layout(op, state_v_first, kwargs)
        check_kwargs(op, kwargs, RECURRENT_IGNORED_KWARGS)
        check_inplace_final_state(op, kwargs, ssm_state_indices, initial_state)
    ab = _dplr_args(op, spec, beta, a, b, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    if ab is None:
        _beta_args(op, spec, beta, use_beta_sigmoid_in_kernel, allow_neg_eigval)
        if reverse:
            raise ValueError(f"{op}: reverse=True (a right-to-left scan) is generated for the general DPLR "
                             f"structure only, not for spec {spec.name!r}")
    if beta is None:  # no beta (no rank-1 part, or DPLR's a, b): the kernels read none (a stand-in pointer is passed)
        beta = dummy_pointer(q.device)
    if not isinstance(state_v_first, bool):
        raise TypeError(f"{op}: state_v_first must be a bool, got {type(state_v_first).__name__}")
    if not isinstance(reverse, bool):
        raise TypeError(f"{op}: reverse must be a bool, got {type(reverse).__name__}")
    sig = hit = None
    if not kwargs and not checks.wanted(check_inputs):
        try:  # a decode loop's later calls of one geometry: no validation, lowering or config look-up
            sig = (spec, op, tensor_key(q), tensor_key(k), tensor_key(v), tensor_key(g), tensor_key(beta), tensor_key(initial_state),
                   tensor_key(ssm_state_indices), tensor_key(out), tensor_key(cu_seqlens), tensor_key(A_log), tensor_key(dt_bias), scale,
                   output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
                   allow_neg_eigval, state_v_first, config, torch.is_grad_enabled(), tensor_key(num_accepted_tokens))
            if ab is not None:
                sig += (tensor_key(ab[0]), tensor_key(ab[1]), reverse)
            hit = _FAST.get(sig)
        except (AttributeError, TypeError):  # not a tensor, or unhashable: the full path says what is wrong
            sig = hit = None
    # the decode kernel applies FLA's in-kernel flags to what it loads (the autograd path: torch ops)
    fused = (use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    if hit is not None:  # (never a call with gradients: see the signature)
        g, A_log, dt_bias = _gate_args(op, spec, q, v, g, use_gate_in_kernel, A_log, dt_bias, expand_bias=False)
        plan, built, dims, scale = hit
        if cu_seqlens is not None and cu_seqlens.device.type == "cpu":
            host_seqlens(cu_seqlens, dims.T)  # on the host the values are free to check
        g = g if g is not None else dummy_pointer(q.device)
        if hit_slots := (ssm_state_indices is not None and ssm_state_indices.dim() == 2):
            if cu_seqlens is not None and cu_seqlens.device.type == "cpu":
                check_token_slots(ssm_state_indices, num_accepted_tokens, N=dims.N, T=dims.T, packed=True,
                                  seqlens=host_seqlens(cu_seqlens, dims.T))
        return _decode(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, ssm_state_indices,
                       dims, plan, built, A_log, dt_bias, out, state_v_first, ab, reverse, fused,
                       accepted=num_accepted_tokens if hit_slots else None)
    training = torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad
        for x in (q, k, v, g, beta, initial_state, A_log, dt_bias) + (ab or ()))
    g, A_log, dt_bias = _gate_args(op, spec, q, v, g, use_gate_in_kernel, A_log, dt_bias, expand_bias=training)
    if training:
        if ssm_state_indices is not None or num_accepted_tokens is not None:
            raise ValueError(f"{op}: ssm_state_indices (an in-place state pool update) and num_accepted_tokens have "
                             "no gradient; call it under torch.no_grad(), or pass initial_state [N, HV, K, V] "
                             "without them to train")
        if out is not None:
            raise ValueError(f"{op}: out= has no gradient; leave out=None when some input requires grad")
    dims, seqlens = _validate(q, k, v, g, beta if spec.has_rank1 and ab is None else None, scale=scale,
                              initial_state=initial_state, cu_seqlens=cu_seqlens,
                              state_indices=ssm_state_indices, A_log=A_log, dt_bias=dt_bias,
                              gate_in_kernel=use_gate_in_kernel, cu_seqlens_cpu=cu_seqlens_cpu,
                              sync_seqlens=training, state_v_first=state_v_first, decay=spec.decay,
                              rank1=spec.has_rank1 and ab is None, max_head_dim=spec_max_head_dim(spec),
                              member=f"{op} (spec {spec.name!r})", accepted=num_accepted_tokens)
    if ab is not None:
        check_rank1_vectors(q, v, *ab)
    check_runnable(q)
    if checks.wanted(check_inputs):
        _value_check(op, q, k, v, g, beta, initial_state, cu_seqlens, ssm_state_indices, use_gate_in_kernel,
                     A_log, dt_bias, ab, num_accepted_tokens)
    scale = dims.K ** -0.5 if scale is None else scale
    if training:
        q, k, beta = preprocess(q, k, beta, use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    else:
        check_beta_flags(use_beta_sigmoid_in_kernel, allow_neg_eigval)
    plan = lower(spec, dims.K, dims.V, dtype(q.dtype).name, "recurrent", use_gate_in_kernel)
    state = "float32" if initial_state is None else dtype(initial_state.dtype).name
    pool = initial_state.shape[0] if ssm_state_indices is not None else 0
    shape = dims.decode_shape(state_v_first, pool, None if training else ssm_state_indices)
    built = build(plan, token_slot_config(resolve("recurrent", plan, config, shape, state),
                                          None if training else ssm_state_indices))
    g = g if g is not None else dummy_pointer(q.device)
    if training and ab is not None:  # general DPLR: its own autograd Function (a, b in place of beta)
        meta = recurrent_bwd.RecurrentBwdMeta(dims, seqlens, cu_seqlens, float(scale), plan,
                                              recurrent_bwd.current_config(plan), state_v_first)
        x = [t if t.is_contiguous() else t.contiguous() for t in (q, k, v, g) + ab]
        o, ht = _RecurrentDPLRFunction.apply(*x, initial_state, (op, meta, built, output_final_state, reverse))
        return o, (ht if output_final_state else None)
    if training:
        meta = recurrent_bwd.RecurrentBwdMeta(dims, seqlens, cu_seqlens, float(scale), plan,
                                              recurrent_bwd.current_config(plan), state_v_first)
        x = [t if t is None or t.is_contiguous() else t.contiguous()
             for t in (q, k, v, g, beta, initial_state, A_log, dt_bias)]
        o, ht = RecurrentFunction.apply(*x, (meta, plan, built, output_final_state))
        return o, (ht if output_final_state else None)
    if out is not None and (tuple(out.shape) != tuple(v.shape) or out.dtype != v.dtype or out.device != v.device
                            or not out.is_contiguous()):
        raise ValueError(f"{op}: out must match v: shape {tuple(v.shape)}, dtype {v.dtype}, device {v.device}, "
                         "contiguous")
    for name, x in (("ssm_state_indices", ssm_state_indices), ("cu_seqlens", cu_seqlens)):
        if x is not None and not x.is_contiguous():
            raise ValueError(f"{op}: {name} must be contiguous (the kernel reads it with stride 1)")
    result = _decode(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, ssm_state_indices,
                     dims, plan, built, A_log, dt_bias, out, state_v_first, ab, reverse, fused,
                     accepted=num_accepted_tokens)
    if sig is not None:  # (never for a call with gradients: the signature holds requires_grad and the grad mode)
        if len(_FAST) >= _FAST_MAX:
            _FAST.clear()
        _FAST[sig] = (plan, built, dims, scale)
    return result


def _decode(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, state_indices, dims, plan,
            built, A_log, dt_bias, out, state_v_first, ab=None, reverse=False, fused=(False, False, False),
            accepted=None):
    """Launch the recurrent kernel of a validated decode call: ``(o, final state or pool or None)``.
    ``ab``: general DPLR's (a, b), read in place of beta.  ``fused``: (use_qk_l2norm_in_kernel,
    use_beta_sigmoid_in_kernel, allow_neg_eigval), which the kernel applies to the raw inputs."""
    q, k, v, g, beta = (x if x.is_contiguous() else x.contiguous() for x in (q, k, v, g, beta))
    if ab is not None:
        ab = tuple(x if x.is_contiguous() else x.contiguous() for x in ab)
    launch, (o, ht) = prepare_recurrent(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, state_indices=state_indices, dims=dims, plan=plan, built=built,
        A_log=A_log, dt_bias=dt_bias, out=out, state_v_first=state_v_first, ab=ab, reverse=reverse,
        qk_l2norm=fused[0], beta_sigmoid=fused[1], neg_eigval=fused[2], accepted=accepted)
    launch()
    return o, (ht if (output_final_state or state_indices is not None) else None)


class _RecurrentDPLRFunction(torch.autograd.Function):
    """General DPLR's recurrent form with gradients (flash-linear-attention's op has none): the
    decode kernel forward, storing nothing extra; the backward is general DPLR's recurrent
    backward template (:func:`kdagen.ops.recurrent_bwd.backward_dplr`), giving the gradients
    of q, k, v, gk, a, b and the initial state.  ``reverse=True`` has no backward
    (NotImplementedError naming chunk_dplr_delta_rule)."""

    @staticmethod
    def forward(ctx, q, k, v, g, a, b, initial_state, run):
        op, meta, built, output_final_state, reverse = run
        o, ht = _decode(q, k, v, g, dummy_pointer(q.device), meta.scale, initial_state, output_final_state,
                        meta.cu_seqlens, None, meta.dims, meta.plan, built, None, None, None, meta.state_v_first,
                        (a, b), reverse)
        ctx.save_for_backward(q, k, v, g, a, b, initial_state)
        ctx.op, ctx.meta, ctx.reverse = op, meta, reverse
        ctx.like = {n: (t.shape, t.dtype) for n, t in dict(q=q, k=k, v=v, g=g, a=a, b=b).items()}
        return o, ht

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do, dht):
        if ctx.reverse:
            raise NotImplementedError(
                f"{ctx.op}: reverse=True has no backward in kdagen's recurrent form; for training use "
                "chunk_dplr_delta_rule (the chunk form), or the forward scan (reverse=False)")
        return recurrent_bwd.backward_dplr(ctx.meta, ctx.saved_tensors, ctx.like, ctx.needs_input_grad, do,
                                           dht) + (None,)
