"""`fused_recurrent_kda`: the recurrent form (decode) -- one launch per call over all
sequences, value heads and V tiles; float32 state in registers; optional in-place update
of a state pool addressed by per-sequence slots."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton

from ..cache.heuristics import slot_grid
from ..cache.lookup import resolve
from ..codegen.lower import lower
from ..config import RecurrentConfig
from ..dtypes import dtype
from ..kernels import Launch, build, compile_options, dummy_pointer, launch, launch_options
from . import checks, recurrent_bwd
from .inputs import (RECURRENT_IGNORED_KWARGS, Dims, check_beta_flags, check_inplace_final_state, check_kwargs,
                     check_runnable, check_token_slots, fla_dtypes, host_seqlens, preprocess, select_spec, state_layout,
                     state_shape)
from .inputs import check_inputs as _validate
from .traced import fused_recurrent_kda_traced


def _outputs_and_args(q, k, v, g, beta, *, scale, initial_state, output_final_state, state_indices, out,
                      dims, cu_seqlens=None, A_log=None, dt_bias=None, state_v_first=False, ab=None,
                      accepted=None):
    """Allocate o (and the final state) and lay out the kernel's non-constexpr arguments.
    ``ab``: general DPLR's (read a, write b), which the kernel takes in place of beta.  A 2-D
    ``state_indices`` (speculative decoding) adds ``accepted`` (``num_accepted_tokens``, or a stand-in)."""
    dev = q.device
    o = out if out is not None else torch.empty(v.shape, dtype=v.dtype, device=dev)
    if state_indices is not None:
        ht = initial_state  # the pool, updated in place
    elif output_final_state:
        ht = torch.empty(state_shape(dims.N, dims.HV, dims.K, dims.V, state_v_first), dtype=torch.float32, device=dev)
    else:
        ht = None
    dummy = dummy_pointer(dev)
    args = dict(q=q, k=k, v=v, g=g, beta=beta) if ab is None else dict(q=q, k=k, v=v, g=g, a=ab[0], b=ab[1])
    if A_log is not None:
        args["A_log"] = A_log
    if dt_bias is not None:
        args["dt_bias"] = dt_bias
    args.update(o=o, h0=initial_state if initial_state is not None else dummy,
                ht=ht if ht is not None else dummy,
                state_indices=state_indices if state_indices is not None else dummy,
                cu_seqlens=dummy if cu_seqlens is None else _on_device(cu_seqlens, dev))
    if state_indices is not None and state_indices.dim() == 2:
        args["accepted"] = dummy if accepted is None else accepted
    args.update(T=dims.T, P=initial_state.shape[0] if initial_state is not None else dims.N, scale=float(scale))
    return o, ht, args


def token_slot_config(config: RecurrentConfig, state_indices) -> RecurrentConfig:
    """The config a call runs, given the one resolved for it: with a 2-D ``state_indices`` (speculative
    decoding: a slot per token) the kernel with per-token state stores (``token_slots``), on one-item programs
    of one tile (the body that has them: no persistent programs or lean body); otherwise without
    them.  The rest of the config (tile width, warps, readout, ...) is kept."""
    on = state_indices is not None and state_indices.dim() == 2
    if on and not (config.token_slots and not config.programs_per_sm and not config.lean):
        return replace(config, token_slots=True, programs_per_sm=0, lean=False)
    if not on and config.token_slots:
        return replace(config, token_slots=False)
    return config


def _on_device(cu_seqlens, dev):
    """cu_seqlens where the kernel reads it.  A host cu_seqlens is staged through pinned memory
    and copied asynchronously (a plain copy would wait for the device)."""
    if cu_seqlens.device == dev:
        return cu_seqlens
    if dev.type != "cuda":
        return cu_seqlens.to(dev)
    if torch.cuda.is_current_stream_capturing():
        raise ValueError("cu_seqlens is on the host: a CUDA graph cannot capture its copy to the device; "
                         "put cu_seqlens on the device to capture fused_recurrent_kda")
    return cu_seqlens.pin_memory().to(dev, non_blocking=True)


def prepare_recurrent(q, k, v, g, beta, *, scale, initial_state, output_final_state, cu_seqlens,
                      state_indices, dims, plan, built, A_log=None, dt_bias=None, out=None, state_v_first=False,
                      ab=None, reverse=False, qk_l2norm=False, beta_sigmoid=False, neg_eigval=False,
                      by_slot: bool | None = None, pdl: bool | None = None, accepted=None):
    """Describe the one launch of a validated recurrent call: ``(launch, (o, final state))``.
    General DPLR (``plan.structure == "dplr"``): ``ab`` = (a, b) replaces beta, and ``reverse``
    walks each sequence's tokens last to first (FLA's ``reverse``; only this structure takes it).
    ``qk_l2norm`` / ``beta_sigmoid`` (``neg_eigval``: twice the sigmoid): the in-kernel flags
    applied by the kernel to the raw q, k and beta it loads (the decode path; the autograd path
    passes them applied already).  A scalar decay's ``dt_bias`` may be [HV] (read per head) or
    [HV, K] (per channel).  ``by_slot`` / ``pdl`` (None: decided here, by
    :func:`kdagen.cache.heuristics.slot_grid` and the device): the slot grid (a pool's one-item
    programs over its slots) and the programmatic dependent launch, forced on or off -- for compile
    checks of the launch a GPU that is not here would run.

    Speculative decoding (FLA's fused_recurrent_kda_fwd): a 2-D ``state_indices`` [N, T_max] gives every
    token a pool slot; sequence n starts from slot [n, accepted[n] - 1] (``accepted``: num_accepted_tokens
    [N]; without it slot [n, 0]) and token t's state is written to slot [n, t] as it is consumed.  A negative
    starting slot (or one >= P, or an accepted count outside 1..T_max) is padding: o = 0, nothing read or
    written; a negative (or >= P) token slot, or a token past column T_max - 1, stores nothing.  The
    built config must be :func:`token_slot_config`'s."""
    dplr = plan.structure == "dplr"
    if dplr != (ab is not None):
        raise ValueError("the general DPLR kernel takes a and b (ab=...), every other structure beta")
    if reverse and not dplr:
        raise ValueError("reverse=True is generated for the general DPLR structure only")
    takes_beta = plan.has_rank1 and not dplr
    if (beta_sigmoid or neg_eigval) and not takes_beta:
        raise ValueError(f"the beta sigmoid applies to a beta; the {plan.structure!r} kernel reads none")
    H, HV, K, V, N = dims.H, dims.HV, dims.K, dims.V, dims.N
    cfg: RecurrentConfig = built.config
    token_slots = state_indices is not None and state_indices.dim() == 2
    if cfg.token_slots != token_slots:
        raise ValueError(f"the recurrent kernel was built with token_slots={cfg.token_slots} for a call whose "
                         f"ssm_state_indices is {'2-D' if token_slots else 'not 2-D'}: build it with "
                         "token_slot_config(config, state_indices)")
    if accepted is not None and not token_slots:
        raise ValueError("num_accepted_tokens needs a 2-D ssm_state_indices [N, T_max] (a slot per token)")
    if token_slots and reverse:
        raise ValueError("reverse=True with a 2-D ssm_state_indices (speculative decoding) is not supported")
    o, ht, args = _outputs_and_args(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        state_indices=state_indices, out=out, dims=dims, cu_seqlens=cu_seqlens,
        A_log=A_log if plan.gate_has_A else None, dt_bias=dt_bias if plan.gate_has_bias else None,
        state_v_first=state_v_first, ab=ab, accepted=accepted)
    bv = min(cfg.block_v, plan.BV)
    # a pool's programs over its slots (address order) rather than over the batch: heuristics.slot_grid
    P = args["P"]
    if by_slot is None:
        by_slot = slot_grid(N, HV, P)
    by_slot = bool(by_slot) and state_indices is not None and not cfg.programs_per_sm and not token_slots
    if pdl is None:
        pdl = PDL and _pdl_capable(q.device)
    constexprs = dict(H=H, HV=HV, K=K, V=V, BK=plan.BK, BV=bv, USE_H0=initial_state is not None,
                      STORE_HT=ht is not None, USE_INDICES=state_indices is not None,
                      IS_VARLEN=cu_seqlens is not None, STATE_V_FIRST=bool(state_v_first),
                      SLOT_GRID=by_slot, SCAN=max(16, triton.next_power_of_2(N)) if by_slot else 1,
                      PDL=bool(pdl))
    if dplr:
        constexprs["REVERSE"] = bool(reverse)
    constexprs["QK_L2NORM"] = bool(qk_l2norm)
    if takes_beta:
        constexprs.update(BETA_SIGMOID=bool(beta_sigmoid), NEG_EIGVAL=bool(neg_eigval))
    if plan.gate_has_bias:
        # a scalar decay's dt_bias as the caller gives it, [HV] (the only other size check_inputs lets through)
        constexprs["BIAS_PER_HEAD"] = dt_bias.numel() != HV * K
    args["NS"] = N
    if token_slots:  # the slot indices' row length, and whether num_accepted_tokens picks the starting column
        args["TS"] = state_indices.shape[1]
        constexprs["ACCEPTED"] = accepted is not None
    # rows: the sequences, or (slot grid) a row for the padding sequences' o and one per slot
    # columns: the V tiles
    grid = (triton.cdiv(V, bv), ((P + 1) if by_slot else N) * HV)
    if cfg.programs_per_sm:  # persistent programs (templates/recurrent_persistent.py.j2): items taken in turn
        grid = (max(1, min(grid[0] * grid[1], cfg.programs_per_sm * _sm_count(q.device))),)
    launch = Launch("recurrent", built.fns[0], grid, args, constexprs, cfg.num_warps, cfg.num_stages)
    return launch, (o, ht)


# Programmatic dependent launch on GPUs that have it (sm_90 on): the kernel waits for the previous grid
# (griddepcontrol.wait) before it reads anything and lets the next launch begin at once, so a step's
# programs become resident while the previous grid drains (templates/_recurrent_grid.py.j2's PDL;
# docs/decisions/0024-decode-slot-grid-and-pdl.md).
# (A switch for A/B timing: the fast path's entries hold the choice made.)
PDL = True
_PDL: dict = {}


def _pdl_capable(device) -> bool:
    if device.type != "cuda":
        return False
    ok = _PDL.get(device.index)
    if ok is None:
        ok = _PDL[device.index] = torch.cuda.get_device_capability(device)[0] >= 9
    return ok


_SMS: dict = {}


def _sm_count(device) -> int:
    """Streaming multiprocessors of a CUDA device (1 elsewhere: the interpreter runs programs in turn)."""
    if device.type != "cuda":
        return 1
    n = _SMS.get(device.index)
    if n is None:
        n = _SMS[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return n


@fla_dtypes("v")
def fused_recurrent_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    lower_bound: float | None = None,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    ssm_state_indices: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    config: RecurrentConfig | None = None,
    check_inputs: bool | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    num_accepted_tokens: torch.Tensor | None = None,
    **kwargs,
):
    """Recurrent KDA (decode) with flash-linear-attention's signature and layout.

    Same tensors as :func:`kdagen.chunk_kda`.  With ``ssm_state_indices`` ([N] int),
    ``initial_state`` is a state pool [P, HV, K, V] (float32, or bf16/fp16 to halve the
    traffic; the math is float32 either way): sequence n reads slot ``ssm_state_indices[n]``
    and its final state is written back to that slot in place (a negative slot is padding:
    skipped, o = 0; a slot >= P is treated the same way, so a bad index never writes outside
    the pool); the pool is returned as the final state.  Two sequences on one slot is the
    caller's error (``check_inputs`` names it): which update the slot keeps is not defined, and
    with many (sequence, head) pairs -- where the programs run over the pool's slots in address
    order, :func:`kdagen.cache.heuristics.slot_grid` -- the others' o is NaN.  Otherwise the final state is a new
    float32 [N, HV, K, V] tensor when ``output_final_state``.

    Serving: nothing here reads a value from the device.  The sequences' count is
    ``cu_seqlens.numel() - 1`` and every check is on shapes, dtypes and devices, so a call
    never waits for the GPU and the packed form (``cu_seqlens`` on the device, with a pool)
    can be captured in a CUDA graph.  (A cu_seqlens on the host is checked on the host and
    copied to the device asynchronously, through pinned memory: no wait either, but a CUDA
    graph cannot capture that copy.)  A decode loop's repeated
    calls of one geometry are validated and planned once: later calls only lay out the
    arguments and launch; with ``out=`` and a pool they allocate nothing.  In-kernel, offsets
    are clamped to [0, T] and slots to the pool, so unchecked values never address memory
    outside the tensors.

    Speculative decoding (FLA's ``fused_recurrent_kda_fwd`` keywords, as vLLM calls it): a 2-D
    ``ssm_state_indices`` [N, T_max] gives every token of the packed call (1 + k tokens per sequence, k
    may differ and be 0) a pool slot.  Sequence n starts from slot ``[n, num_accepted_tokens[n] - 1]``
    (``num_accepted_tokens`` [N] int, on the device: how many tokens of the previous step were accepted),
    or from slot ``[n, 0]`` without it, and token t's state is written to slot ``[n, t]`` as it is
    consumed, so the next step can start from whichever token is accepted.  A negative starting slot is
    padding (o = 0, nothing read or written); a negative token slot stores nothing (the recurrence goes
    on).  T_max must cover the longest sequence (a ValueError where that is known without reading the
    device: T without cu_seqlens, host offsets or ``cu_seqlens_cpu`` with them; otherwise tokens past
    column T_max - 1 store nothing).  Nothing is read back, so the step can be captured in a CUDA graph;
    ``check_inputs`` also checks the accepted counts (1..T_max) and that no slot appears twice.  FLA's
    ``inplace_final_state`` is accepted as True with a pool (the pool is updated in place; False, which
    makes FLA write per-token states to a new tensor, is a ValueError).

    Gates: the recurrent form applies ``exp(g)`` element-wise per token, so it needs no
    bound on g.  Every g <= 0 gives the recurrence's answer, including g far below
    ``lower_bound`` and g = -inf (a full reset of that channel); ``lower_bound`` here only
    shapes the in-kernel gate (``use_gate_in_kernel``).  g > 0 grows the state, as the
    recurrence says.  NaN anywhere in a sequence's inputs gives NaN in its output and its
    final state -- with a pool, in its slot, in place: that is the recurrence's answer for
    NaN, and the opt-in value check is how to catch it.

    ``check_inputs=True`` (or ``KDAGEN_CHECK_INPUTS=1``) reads the values before the launch
    and raises a ValueError naming the argument and its first bad index for NaN/inf inputs,
    g > 0, bad cu_seqlens offsets, and duplicate or out-of-pool slots
    (:mod:`kdagen.ops.checks`).  It synchronises with the device, so it is off by default.

    ``state_v_first=True`` (FLA's keyword; its deprecated name ``transpose_state_layout`` works
    as in FLA): every state -- initial_state, the pool, the final state, and the initial state's
    gradient -- is [.., HV, V, K] instead of [.., HV, K, V]; the kernel addresses that layout
    (nothing is transposed).  For a serving pool it is the faster layout
    (docs/decisions/0025-decode-vk-pool.md).

    Gradients.  When autograd is on and some input requires grad, the call runs an autograd
    Function (the decode path above is not involved): the forward is the same kernel, storing
    nothing extra, and the backward is generated from the spec (:mod:`kdagen.ops.recurrent_bwd`:
    it recomputes the states from checkpoints every few tokens and walks them back), giving
    gradients for q, k, v, g, beta, the initial state and, with the in-kernel gate, A_log and
    dt_bias; the l2-norm and the beta sigmoid of the in-kernel flags are torch ops that autograd
    differentiates, as in chunk_kda's training path.  ``ssm_state_indices`` (an in-place pool
    update) and ``out=`` are refused there (ValueError).  The backward needs the sequence lengths
    on the host: ``cu_seqlens_cpu`` gives them without reading ``cu_seqlens`` back (one
    synchronisation otherwise); the decode path never reads them.  (FLA 0.6.0's own
    fused_recurrent_kda returns outputs without a gradient.)

    FLA's chunk keywords ``disable_recompute``, ``use_graph``, ``max_num_seqs`` are accepted and
    change nothing here (the op launches one kernel whose grid depends only on the shapes, and it
    can be captured in a CUDA graph with a device cu_seqlens); ``cp_context`` must be None.  Any
    other keyword is a TypeError.
    """
    if kwargs:
        state_v_first = state_layout("fused_recurrent_kda", state_v_first, kwargs)
        check_kwargs("fused_recurrent_kda", kwargs, RECURRENT_IGNORED_KWARGS)
        check_inplace_final_state("fused_recurrent_kda", kwargs, ssm_state_indices, initial_state)
    if torch.compiler.is_compiling():  # torch.compile traces one registered op (kdagen.ops.traced)
        return fused_recurrent_kda_traced(
            q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, scale=scale, initial_state=initial_state,
            output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
            use_gate_in_kernel=use_gate_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
            allow_neg_eigval=allow_neg_eigval, lower_bound=lower_bound, cu_seqlens=cu_seqlens,
            ssm_state_indices=ssm_state_indices, out=out, config=config, check_inputs=check_inputs,
            state_v_first=state_v_first, cu_seqlens_cpu=cu_seqlens_cpu, num_accepted_tokens=num_accepted_tokens)
    flags = (scale, output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
             allow_neg_eigval, lower_bound, config, state_v_first)
    try:
        sig = _signature(q, k, v, g, beta, initial_state, ssm_state_indices, out, cu_seqlens, A_log, dt_bias, flags,
                         num_accepted_tokens)
        hit = _FAST.get(sig)
    except (AttributeError, TypeError):  # not a tensor, or unhashable: the full path says what is wrong
        hit = sig = None
    if hit is None and torch.is_grad_enabled() and any(
            isinstance(x, torch.Tensor) and x.requires_grad for x in (q, k, v, g, beta, initial_state, A_log, dt_bias)):
        # (never a fast-path hit: entries are made by calls without gradients, and the signature
        # holds every tensor's requires_grad and the grad mode)
        return _fused_recurrent_kda_train(
            q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, scale=scale, initial_state=initial_state,
            output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
            use_gate_in_kernel=use_gate_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
            allow_neg_eigval=allow_neg_eigval, lower_bound=lower_bound, state_v_first=state_v_first,
            cu_seqlens=cu_seqlens, ssm_state_indices=ssm_state_indices, out=out, config=config,
            check_inputs=check_inputs, cu_seqlens_cpu=cu_seqlens_cpu, num_accepted_tokens=num_accepted_tokens)
    check = checks.wanted(check_inputs)
    if hit is None:
        desc, (o, ht), (scale, dims) = fused_recurrent_kda_launch(
            q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, scale=scale, initial_state=initial_state,
            output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
            use_gate_in_kernel=use_gate_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
            allow_neg_eigval=allow_neg_eigval, lower_bound=lower_bound, cu_seqlens=cu_seqlens,
            ssm_state_indices=ssm_state_indices, out=out, config=config, state_v_first=state_v_first,
            num_accepted_tokens=num_accepted_tokens, cu_seqlens_cpu=cu_seqlens_cpu)
        if check:
            _check_values(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, ssm_state_indices,
                          use_gate_in_kernel, num_accepted_tokens)
        desc()
        # the fast path passes the caller's tensors as they are, so only contiguous ones qualify
        if sig is not None and all(x.is_contiguous() for x in (q, k, v, g, beta)):
            if len(_FAST) >= _FAST_MAX:
                _FAST.clear()
            _FAST[sig] = _Entry(desc.fn, desc.grid, desc.constexprs, desc.num_warps, desc.num_stages,
                                float(scale),
                                dims, "A_log" in desc.args, "dt_bias" in desc.args, _Direct.of(desc),
                                state_shape(dims.N, dims.HV, dims.K, dims.V, state_v_first),
                                {n: desc.args[n] for n in ("NS", "TS") if n in desc.args}, "accepted" in desc.args)
        return o, ht  # the launch description already leaves out a final state nobody asked for
    if cu_seqlens is not None and cu_seqlens.is_cpu:
        seqlens = host_seqlens(cu_seqlens, hit.dims.T)  # on the host the values are free to check
        if hit.token_slots:
            check_token_slots(ssm_state_indices, num_accepted_tokens, N=hit.dims.N, T=hit.dims.T, packed=True,
                              seqlens=seqlens)
    if check:
        _check_values(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, ssm_state_indices,
                      use_gate_in_kernel, num_accepted_tokens)
    if hit.direct is not None and (cu_seqlens is None or cu_seqlens.is_cuda):  # (host cu_seqlens: copied)
        # the decode step: the caller's tensors as they are, pointers laid out in the kernel's order
        o = out if out is not None else torch.empty_like(v)
        if ssm_state_indices is not None:
            ht = initial_state  # the pool, updated in place
        elif output_final_state:
            ht = torch.empty(hit.state_shape, dtype=torch.float32, device=v.device)
        else:
            ht = None
        d = hit.direct
        ptrs = [q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(), beta.data_ptr()]
        if hit.with_A:
            ptrs.append(A_log.data_ptr())
        if hit.with_bias:
            ptrs.append(dt_bias.data_ptr())
        ptrs += (o.data_ptr(), d.dummy if initial_state is None else initial_state.data_ptr(),
                 d.dummy if ht is None else ht.data_ptr(),
                 d.dummy if ssm_state_indices is None else ssm_state_indices.data_ptr(),
                 d.dummy if cu_seqlens is None else cu_seqlens.data_ptr())
        if hit.token_slots:
            ptrs.append(d.dummy if num_accepted_tokens is None else num_accepted_tokens.data_ptr())
        if d.launch(ptrs):
            return o, (ht if (output_final_state or ssm_state_indices is not None) else None)
    o, ht, args = _outputs_and_args(
        q, k, v, g, beta, scale=hit.scale, initial_state=initial_state, output_final_state=output_final_state,
        state_indices=ssm_state_indices, out=out, dims=hit.dims, cu_seqlens=cu_seqlens,
        A_log=A_log if hit.with_A else None, dt_bias=dt_bias if hit.with_bias else None, state_v_first=state_v_first,
        accepted=num_accepted_tokens)
    args.update(hit.extra)
    if hit.direct is None or not hit.direct(args):
        launch(hit.fn, hit.grid, args, hit.constexprs, hit.num_warps, hit.num_stages)
    return o, (ht if (output_final_state or ssm_state_indices is not None) else None)


def _check_values(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, state_indices, gate_in_kernel,
                  accepted=None):
    checks.check_values("fused_recurrent_kda", q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state,
                        cu_seqlens=cu_seqlens, state_indices=state_indices, raw_gate=gate_in_kernel,
                        A_log=A_log, dt_bias=dt_bias, accepted=accepted)


def fused_recurrent_kda_launch(q, k, v, g, beta, *, A_log=None, dt_bias=None, scale=None, initial_state=None,
                               output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                               use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None,
                               cu_seqlens=None, ssm_state_indices=None, out=None,
                               config: RecurrentConfig | None = None, state_v_first=False,
                               num_accepted_tokens=None, cu_seqlens_cpu=None):
    """Validate, plan, build and describe the one launch of :func:`fused_recurrent_kda`
    (nothing runs): ``(launch, (o, final_state), (scale, dims))``.  Calling ``launch()``
    again rewrites the same outputs; the tuner times it this way, without the op's Python
    work, and under CUDA-graph replay as a decode loop runs it."""
    dims, _ = _validate(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                        state_indices=ssm_state_indices, A_log=A_log, dt_bias=dt_bias,
                        gate_in_kernel=use_gate_in_kernel, sync_seqlens=False, state_v_first=state_v_first,
                        member="fused_recurrent_kda", accepted=num_accepted_tokens, cu_seqlens_cpu=cu_seqlens_cpu)
    check_runnable(q)
    if not isinstance(state_v_first, bool):
        raise TypeError(f"fused_recurrent_kda: state_v_first must be a bool, got {type(state_v_first).__name__}")
    spec = select_spec(use_gate_in_kernel, False, lower_bound, A_log is not None, dt_bias is not None)
    if scale is None:
        scale = dims.K ** -0.5
    check_beta_flags(use_beta_sigmoid_in_kernel, allow_neg_eigval)  # (the kernel applies the flags itself)
    plan = lower(spec, dims.K, dims.V, dtype(q.dtype).name, "recurrent", use_gate_in_kernel)
    state = "float32" if initial_state is None else dtype(initial_state.dtype).name  # a pool may be bf16
    pool = initial_state.shape[0] if ssm_state_indices is not None else 0
    shape = dims.decode_shape(state_v_first, pool, ssm_state_indices)
    built = build(plan, token_slot_config(resolve("recurrent", plan, config, shape, state), ssm_state_indices))
    if out is not None and (tuple(out.shape) != tuple(v.shape) or out.dtype != v.dtype or out.device != v.device
                            or not out.is_contiguous()):
        raise ValueError(f"out must match v: shape {tuple(v.shape)}, dtype {v.dtype}, device {v.device}, "
                         "contiguous")
    for name, x in (("ssm_state_indices", ssm_state_indices), ("cu_seqlens", cu_seqlens)):
        if x is not None and not x.is_contiguous():
            raise ValueError(f"{name} must be contiguous (the kernel reads it with stride 1)")
    q, k, v, g, beta = (x if x.is_contiguous() else x.contiguous() for x in (q, k, v, g, beta))
    launch, (o, ht) = prepare_recurrent(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, state_indices=ssm_state_indices, dims=dims, plan=plan, built=built,
        A_log=A_log, dt_bias=dt_bias, out=out, state_v_first=state_v_first, qk_l2norm=use_qk_l2norm_in_kernel,
        beta_sigmoid=use_beta_sigmoid_in_kernel, neg_eigval=allow_neg_eigval, accepted=num_accepted_tokens)
    return launch, (o, ht if (output_final_state or ssm_state_indices is not None) else None), (scale, dims)


# --- training: the autograd path -----------------------------------------------------------


class RecurrentFunction(torch.autograd.Function):
    """fused_recurrent_kda with gradients.  The forward is the decode kernel (it stores nothing
    for the backward); the backward is :mod:`kdagen.ops.recurrent_bwd`.  Used only when some
    input requires grad; the inputs are validated and pre-processed already."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, initial_state, A_log, dt_bias, run):
        meta, fwd_plan, built, output_final_state = run
        d = meta.dims
        launch, (o, ht) = prepare_recurrent(
            q, k, v, g, beta, scale=meta.scale, initial_state=initial_state, output_final_state=output_final_state,
            cu_seqlens=meta.cu_seqlens, state_indices=None, dims=d, plan=fwd_plan, built=built, A_log=A_log,
            dt_bias=dt_bias, state_v_first=meta.state_v_first)
        launch()
        ctx.save_for_backward(q, k, v, g, beta, initial_state, A_log, dt_bias)
        ctx.meta = meta
        ctx.like = {n: None if t is None else (t.shape, t.dtype) for n, t in
                    dict(q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias).items()}
        return o, ht

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do, dht):
        return recurrent_bwd.backward(ctx.meta, ctx.saved_tensors, ctx.like, ctx.needs_input_grad, do, dht) + (None,)


def _fused_recurrent_kda_train(q, k, v, g, beta, *, A_log, dt_bias, scale, initial_state, output_final_state,
                               use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
                               allow_neg_eigval, lower_bound, state_v_first, cu_seqlens, ssm_state_indices, out,
                               config, check_inputs, cu_seqlens_cpu, num_accepted_tokens=None):
    """A call that some input's gradient flows through: validate (reading the sequence lengths
    on the host, for the backward's segment schedule), pre-process with torch ops and run the
    autograd Function."""
    if ssm_state_indices is not None or num_accepted_tokens is not None:
        raise ValueError("fused_recurrent_kda: ssm_state_indices (an in-place state pool update) and "
                         "num_accepted_tokens have no gradient; call it under torch.no_grad()/inference_mode(), or "
                         "pass initial_state [N, HV, K, V] without ssm_state_indices to train through it")
    if out is not None:
        raise ValueError("fused_recurrent_kda: out= (writing o into a given tensor) has no gradient; leave out=None "
                         "when some input requires grad")
    if not isinstance(state_v_first, bool):
        raise TypeError(f"fused_recurrent_kda: state_v_first must be a bool, got {type(state_v_first).__name__}")
    check_runnable(q)
    dims, seqlens = _validate(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                              A_log=A_log, dt_bias=dt_bias, gate_in_kernel=use_gate_in_kernel,
                              cu_seqlens_cpu=cu_seqlens_cpu, state_v_first=state_v_first, member="fused_recurrent_kda")
    if checks.wanted(check_inputs):
        _check_values(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, None, use_gate_in_kernel)
    spec = select_spec(use_gate_in_kernel, False, lower_bound, A_log is not None, dt_bias is not None)
    scale = dims.K ** -0.5 if scale is None else scale
    q, k, beta = preprocess(q, k, beta, use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    plan = lower(spec, dims.K, dims.V, dtype(q.dtype).name, "recurrent", use_gate_in_kernel)
    state = "float32" if initial_state is None else dtype(initial_state.dtype).name
    built = build(plan, token_slot_config(resolve("recurrent", plan, config, dims.decode_shape(state_v_first), state),
                                          None))
    meta = recurrent_bwd.RecurrentBwdMeta(dims, seqlens, cu_seqlens, float(scale), plan, recurrent_bwd.current_config(plan),
                                          state_v_first)
    x = [t if t is None or t.is_contiguous() else t.contiguous()
         for t in (q, k, v, g, beta, initial_state, A_log, dt_bias)]
    o, ht = RecurrentFunction.apply(*x, (meta, plan, built, output_final_state))
    return o, (ht if output_final_state else None)


# --- the per-token fast path -------------------------------------------------------------
# A decode loop calls this op once per token with the same geometry.  The first call of a
# geometry is validated, planned and built in full; its launch description is kept under a
# signature of everything validation looked at (shapes, dtypes, devices, contiguity,
# requires_grad, flags, scale, config), so later calls with the same signature only lay out
# the arguments and launch.  Any difference in the signature -- including a bad shape --
# takes the full, validating path.  No value takes part: reading one would synchronise.
_FAST: dict = {}
_FAST_MAX = 4096  # geometries kept (a packed decode has one per batch size); beyond, start again


class _Direct:
    """A fast-path entry's compiled kernel on a GPU, launched without the generic launcher's
    per-call work: no specialisation key to build (the entry's signature fixes the shapes, so
    only the 16-byte alignment the kernel was specialised on is re-checked), the stream read
    raw, pointers passed as integers (Triton's launcher then skips a driver query per pointer),
    and -- when the kernel needs no scratch memory -- the launcher's C entry point called
    directly (docs/decisions/0032-decode-direct-launch.md)."""

    def __init__(self, kernel, args: dict, constexprs: dict, grid):
        run = kernel.run
        self.run, self.function, self.metadata = run, kernel.function, kernel.packed_metadata
        vals = list(args.values())
        self.pointers = tuple(i for i, a in enumerate(vals) if isinstance(a, torch.Tensor))
        # the pointers the kernel assumes 16-byte aligned (any pointer serves where it does not)
        self.required = tuple(n for n, i in enumerate(self.pointers) if vals[i].data_ptr() % 16 == 0)
        self.device = vals[0].device.index
        self.grid = (tuple(grid) + (1, 1))[:3]
        self.tail = tuple(constexprs.values())
        self.scalars = tuple(a for a in vals if not isinstance(a, torch.Tensor))  # T, P, scale
        self.dummy = dummy_pointer(vals[0].device).data_ptr()
        c_launch = getattr(run, "launch", None)
        plain = (c_launch is not None and getattr(run, "global_scratch_size", 1) == 0
                 and getattr(run, "profile_scratch_size", 1) == 0 and not getattr(run, "gsan_enabled", False))
        # The C entry point's arguments changed in Triton 3.7: up to 3.6 the kernel's arguments follow
        # the head one by one; from 3.7 they come as one tuple after the launcher's argument
        # annotations and kernel signature (which only the 3.7+ launcher object carries).
        self.packed_args = hasattr(run, "arg_annotations") and hasattr(run, "kernel_signature")
        if plain and self.packed_args:
            self.c_launch = c_launch
            self.c_head = (run.launch_cooperative_grid, run.launch_pdl, self.metadata, None, None, None, None, None,
                           run.arg_annotations, run.kernel_signature)
        elif plain:
            self.c_launch = c_launch
            self.c_head = (run.launch_cooperative_grid, run.launch_pdl, None, None, self.metadata, None, None, None)
        else:
            self.c_launch = None

    @classmethod
    def of(cls, desc: Launch):
        """For a launch that has run on a GPU (outside the interpreter), else None."""
        if desc.fn is None or not hasattr(desc.fn, "warmup") or desc.args["q"].device.type != "cuda":
            return None
        try:
            kernel = desc.fn.warmup(**desc.args, **desc.constexprs, grid=desc.grid, num_warps=desc.num_warps,
                                    num_stages=desc.num_stages,  # the JIT's cached binary of that launch
                                    **compile_options(), **launch_options(desc.constexprs))
            return cls(kernel, desc.args, desc.constexprs, desc.grid)
        except Exception:  # noqa: BLE001 - e.g. an asynchronous compile: the generic launcher serves instead
            return None

    def launch(self, ptrs: list) -> bool:
        """Launch with the tensor arguments as integer addresses, in the kernel's order; False
        (nothing launched) when one the kernel assumes aligned is not."""
        m = 0
        for n in self.required:
            m |= ptrs[n]
        if m & 15:
            return False
        stream = torch._C._cuda_getCurrentRawStream(self.device)
        if self.c_launch is None:
            self.run(*self.grid, stream, self.function, self.metadata, None, None, None, *ptrs, *self.scalars,
                     *self.tail)
        elif self.packed_args:
            self.c_launch(*self.grid, stream, self.function, *self.c_head, (*ptrs, *self.scalars, *self.tail))
        else:
            self.c_launch(*self.grid, stream, self.function, *self.c_head, *ptrs, *self.scalars, *self.tail)
        return True

    def __call__(self, args: dict) -> bool:
        """:meth:`launch` from the arguments as :func:`_outputs_and_args` lays them out."""
        vals = list(args.values())
        return self.launch([vals[i].data_ptr() for i in self.pointers])


@dataclass(frozen=True)
class _Entry:
    """What the first call of a geometry found (no tensors: an entry keeps none alive)."""
    fn: object
    grid: tuple
    constexprs: dict
    num_warps: int
    num_stages: int
    scale: float
    dims: Dims
    with_A: bool  # the kernel takes A_log / dt_bias (the plan's in-kernel gate reads them)
    with_bias: bool
    direct: _Direct | None  # on a GPU
    state_shape: tuple  # of a final state the call allocates
    extra: dict  # the launch's scalar arguments beyond _outputs_and_args' (NS, the sequences' count; TS)
    token_slots: bool = False  # speculative decoding: the kernel takes num_accepted_tokens after cu_seqlens


def tensor_key(x):
    """One tensor's part of a fast-path signature (the family ops' decode, kdagen.ops.member)."""
    return None if x is None else (x.shape, x.dtype, x.get_device(), x.is_contiguous(), x.requires_grad)


def _signature(q, k, v, g, beta, initial_state, state_indices, out, cu_seqlens, A_log, dt_bias, flags,
               accepted=None):
    """The fast path's key of a call: tensors by geometry (shape, dtype, device index,
    contiguity, and requires_grad when autograd is on), everything else by value.  Flat, and the device as an index, not
    a torch.device: each attribute is ~0.1 us on the host, a measurable share of a decode step."""
    grad = torch.is_grad_enabled()
    key = [flags, grad]
    if grad:
        for x in (q, k, v, g, beta, initial_state, state_indices, out, cu_seqlens, A_log, dt_bias):
            key.append(None if x is None else (x.shape, x.dtype, x.get_device(), x.is_contiguous(), x.requires_grad))
    else:  # (no_grad / inference_mode: requires_grad routes nothing)
        for x in (q, k, v, g, beta, initial_state, state_indices, out, cu_seqlens, A_log, dt_bias):
            key.append(None if x is None else (x.shape, x.dtype, x.get_device(), x.is_contiguous()))
    if accepted is not None:  # (speculative decoding's counts: a plain call's key is as it was)
        key.append((accepted.shape, accepted.dtype, accepted.get_device(), accepted.is_contiguous()))
    return tuple(key)