"""`chunk_kda`: the chunkwise form (prefill and training) -- the public op, an adapter with FLA's
signature over the chunk call path (:mod:`kdagen.ops.chunk_call`: configs, launches, autograd).

A call is validated once (:func:`prepare_kda`).  An inference call runs the two launches of
:mod:`kdagen.ops.chunk_fwd`, which compute the l2-norm, the gate and the beta sigmoid of
FLA's in-kernel flags inside the kernels.  A training call (some input requires grad) runs the
forward of :mod:`kdagen.ops.chunk_train`, which also keeps what the backward
(:mod:`kdagen.ops.chunk_bwd`) reads; its l2-norm runs in launches of its own before the forward's
(:mod:`kdagen.ops.l2norm`, with their backward) and its beta sigmoid as a torch op, which autograd
differentiates.  Configs are resolved together (:func:`~.chunk_call.chunk_configs`).
None of those modules imports this one.
"""
from __future__ import annotations

import torch

from ..config import ChunkBwdConfig, ChunkFwdConfig, ChunkTrainConfig
from . import checks
from .chunk_call import (ChunkCall, bwd_override_active, chunk_configs, fla_layout, forward_launches, prepare_chunk,
                         requires_grad, run_forward, train, training_step_launches)
from .chunk_call import chunk_bwd_config  # noqa: F401  (re-exported: the tuner and the tests take it from here)
from .cp import run_cp
from .inputs import check_kwargs, check_runnable, fla_dtypes, select_spec, state_layout
from .traced import chunk_kda_traced


def prepare_kda(q, k, v, g, beta, *, scale=None, initial_state=None, cu_seqlens=None, A_log=None, dt_bias=None,
                use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                allow_neg_eigval=False, safe_gate=False, lower_bound=None,
                in_kernel: bool = True, cu_seqlens_cpu=None, state_v_first: bool = False,
                sync_seqlens: bool | None = None, l2norm_launch: bool = False) -> tuple[ChunkCall, dict]:
    """chunk_kda's call on the chunk front end (:func:`~.chunk_call.prepare_chunk`): the spec FLA's
    gate flags select (:func:`~.inputs.select_spec`, once the tensors are validated).  ``in_kernel``:
    an inference call (the kernels apply the l2-norm and beta sigmoid), else a training call's torch
    ops -- except the l2-norm with ``l2norm_launch`` (its own launches, :func:`~.chunk_call.train`)."""
    return prepare_chunk(
        lambda: select_spec(use_gate_in_kernel, safe_gate, lower_bound, A_log is not None, dt_bias is not None),
        q, k, v, g, beta, member="chunk_kda", training=not in_kernel, scale=scale, initial_state=initial_state,
        cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, A_log=A_log, dt_bias=dt_bias,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_gate_in_kernel=use_gate_in_kernel,
        use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
        state_v_first=state_v_first, sync_seqlens=sync_seqlens, l2norm_launch=l2norm_launch)


@fla_dtypes("q")
def chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    cp_context=None,
    use_graph: bool = False,
    max_num_seqs: int | None = None,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    config: ChunkFwdConfig | None = None,
    check_inputs: bool | None = None,
    chunk_size: int | None = None,
    intermediate_states_dtype: torch.dtype | None = None,
    **kwargs,
):
    """Chunkwise KDA with flash-linear-attention's signature and layout.

    Packed sequences (``cu_seqlens``).  Given ``cu_seqlens_cpu`` (FLA's keyword: the same offsets
    on the host), the chunk schedule is built on the host from the lengths and kept on the
    device for the last few lengths seen (the layers of one step share it; the key is the
    lengths' values, so offsets rewritten in place are never served a stale schedule).  With
    the offsets on the device only, an inference call builds its schedule there, over a bound
    of T // C + N chunks whose surplus programs return at once, and reads nothing back (no
    synchronisation; bad offsets stop the stream with a device-side assertion, see
    :mod:`kdagen.ops.schedule`).  A training call, and one with
    ``return_intermediate_states`` (whose output's shape is the chunk count), read a device
    ``cu_seqlens`` back once unless ``cu_seqlens_cpu`` is given.

    ``chunk_size`` (32 or 64, as FLA) pins the chunk length; by default it is the tuned winner's
    or the heuristic's (64 for K <= 128).

    ``check_inputs=True`` (or ``KDAGEN_CHECK_INPUTS=1`` at import) also checks the inputs' values
    -- NaN/inf, g > 0, g below a promised ``lower_bound``, bad offsets -- and raises a ValueError
    naming the argument and its first bad index; it costs one synchronisation (see
    :mod:`kdagen.ops.checks`).

    q, k: [B, T, H, K]; v: [B, T, HV, V]; g: [B, T, HV, K] (log decay, or the raw gate input
    with ``use_gate_in_kernel``); beta: [B, T, HV]; initial_state: [N, HV, K, V].
    Returns ``(o, final_state)`` -- o [B, T, HV, V] in q's dtype, final_state float32
    [N, HV, K, V] or None -- and with ``return_intermediate_states=True`` (inference only) also
    the states entering each chunk in FLA's layout, ``h``: [B, NT, HV, K, V] with
    NT = ceil(T / chunk length) for a fixed-length batch, and [1, NT_total, HV, K, V] with
    ``cu_seqlens`` (NT_total: the chunks of all sequences, sequence by sequence; sequence n's
    start after the ceil(len_m / C) chunks of every sequence m < n; a length-0 sequence has
    none).  The chunk length is ``chunk_size`` when given (else the config's: pin it to know
    it).  As FLA, the states are in the inputs' dtype; ``intermediate_states_dtype=torch.float32`` (kdagen's
    keyword) returns them as the kernels write them, float32, without rounding (a prefix cache that restores
    them exactly).

    ``state_v_first=True`` (FLA's keyword; ``transpose_state_layout``, its deprecated name,
    works as in FLA): every state -- initial_state, the final state, the intermediate states
    and, in training, the initial state's gradient -- is [.., HV, V, K] instead of
    [.., HV, K, V].  The kernels load and store that layout (nothing is transposed around the
    call); the math is the same.

    FLA's other keywords:
    ``disable_recompute=True``: the backward keeps the forward's intermediates instead of
    recomputing them (``ChunkBwdConfig.store_intermediates``); no effect without a gradient.
    ``cp_context`` (context parallelism, :mod:`kdagen.ops.cp`): q, k, v, g, beta hold this rank's
    tokens ([1, T_local, ...]) of the global varlen batch the context
    (:func:`kdagen.build_cp_context`, or FLA's) was built from; the context's local ``cu_seqlens``
    are used.  Outputs and gradients equal the one-process call on the concatenated tokens;
    ``initial_state`` is then the global [N_global, HV, K, V] on every rank and the final state
    [N_global, HV, K, V] holds the sequences ending on this rank (zero elsewhere).
    ``use_graph`` (FLA: a device-built, fixed-shape chunk list so a varlen call can be captured
    in a CUDA graph): a fixed-length call reads nothing on the host and launches a schedule
    fixed by the shapes, so ``use_graph=True`` changes nothing there.  With ``cu_seqlens`` it
    makes an inference call build its schedule on the device even when ``cu_seqlens_cpu`` is
    given (host lengths would be frozen into a captured graph): the grid depends only on T and
    the number of sequences, so a graph captured once replays with any lengths of the same
    total (pad the count with empty sequences).  A training call or ``return_intermediate_states``
    needs the lengths on the host, so ``use_graph=True`` with ``cu_seqlens`` is refused there
    (ValueError).  ``max_num_seqs``: checked to be a positive int or None and not read (the
    sequence count is cu_seqlens's length).
    ``A_log``, ``dt_bias``, ``chunk_size`` (FLA takes them through ``**kwargs``) are named here.
    Any other keyword is a TypeError.
    ``config`` overrides the tuned/heuristic kernel config: a :class:`~kdagen.config.ChunkFwdConfig`
    (inference), or for a training call a :class:`~kdagen.config.ChunkTrainConfig` (a
    ChunkFwdConfig there pins the chunk length only).

    Gates.  ``g`` is a per-token log decay (<= 0).  The inference kernels check, per 16-row
    sub-tile, that the gate decays by at most exp(-81) (a lower bound of -5 per token
    guarantees it): such sub-tiles take the factorised tensor-core path, and any other sub-tile
    (g below the bound, -inf as a full reset) the element-wise path, so the result is the
    recurrence's either way.  ``safe_gate``/``lower_bound`` choose the spec (and the tuned
    winners) but are a promise the inference kernels do not rely on.  A log decay below -40
    is treated as -40 (a decay to 4e-18, below float32 resolution).  NaN in any input gives
    NaN in its sequence's outputs.  The training kernels factorise every diagonal
    sub-tile in their main launches and flag each (chunk, head) with a sub-tile whose decay spans
    over exp(81); a repair launch after each re-runs only the flagged ones, each sub-tile checked
    (factorised within the limit, element-wise one column at a time else).  So any g <= 0 (below a
    promised bound, -inf) gets the recurrence's answer, with or without ``safe_gate``, at under 1%
    of the bf16 step on realistic gates (docs/decisions/0013-gate-bound-checked-by-repair-launches.md).
    ``check_gate_bound=False`` in the
    training and backward configs trusts a promised bound instead (no repair launches: wrong values
    or NaN where g breaks it).  fp16 operands keep the element-wise diagonal throughout.
    """
    state_v_first = state_layout("chunk_kda", state_v_first, kwargs)
    check_kwargs("chunk_kda", kwargs)
    _check_graph_flags(use_graph, max_num_seqs)
    if chunk_size is not None and chunk_size not in (32, 64):
        raise ValueError(f"chunk_kda: `chunk_size` must be either 32 or 64 for KDA, got {chunk_size!r}")
    if chunk_size is not None and config is not None and config.chunk_size != chunk_size:
        raise ValueError(f"chunk_kda: chunk_size={chunk_size} disagrees with config.chunk_size={config.chunk_size}")
    if cp_context is not None:
        if return_intermediate_states:
            raise ValueError("chunk_kda: return_intermediate_states=True is not supported under cp_context")

        def local(t, h0, cu, cu_cpu):
            return chunk_kda(*t, scale=scale, initial_state=h0, output_final_state=True,
                             use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_gate_in_kernel=use_gate_in_kernel,
                             use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
                             safe_gate=safe_gate, lower_bound=lower_bound, disable_recompute=disable_recompute,
                             cu_seqlens=cu, cu_seqlens_cpu=cu_cpu, use_graph=use_graph, A_log=A_log, dt_bias=dt_bias,
                             config=config if t[2].shape[-1] == v.shape[-1] else None, check_inputs=check_inputs,
                             chunk_size=chunk_size)
        return run_cp("chunk_kda", cp_context, (q, k, v, g, beta), local, initial_state=initial_state,
                      output_final_state=output_final_state, state_v_first=state_v_first, cu_seqlens=cu_seqlens,
                      params=(A_log, dt_bias), splits=True)
    if torch.compiler.is_compiling():  # torch.compile traces one registered op (kdagen.ops.traced)
        return chunk_kda_traced(
            q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_gate_in_kernel=use_gate_in_kernel,
            use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
            safe_gate=safe_gate, lower_bound=lower_bound, return_intermediate_states=return_intermediate_states,
            cu_seqlens=cu_seqlens, A_log=A_log, dt_bias=dt_bias, config=config, cu_seqlens_cpu=cu_seqlens_cpu,
            check_inputs=check_inputs, chunk_size=chunk_size, bwd_override=bwd_override_active(),
            state_v_first=state_v_first, disable_recompute=disable_recompute,
            intermediate_states_dtype=intermediate_states_dtype)
    if isinstance(q, torch.Tensor):
        check_runnable(q)
    training = requires_grad(q, k, v, g, beta, initial_state, A_log, dt_bias)
    if use_graph and cu_seqlens is not None:
        _check_graph_capturable(training, return_intermediate_states)
        cu_seqlens_cpu = None  # a captured graph replays the schedule the device builds, never host lengths
    call, x = prepare_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                          A_log=A_log, dt_bias=dt_bias, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                          use_gate_in_kernel=use_gate_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                          allow_neg_eigval=allow_neg_eigval, safe_gate=safe_gate, lower_bound=lower_bound,
                          in_kernel=not training, cu_seqlens_cpu=cu_seqlens_cpu, state_v_first=state_v_first,
                          sync_seqlens=training or return_intermediate_states, l2norm_launch=True)
    if checks.wanted(check_inputs):
        checks.check_values("chunk_kda", q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state,
                            cu_seqlens=cu_seqlens, gate_bound=checks.promised_bound(safe_gate, lower_bound,
                                                                                    use_gate_in_kernel),
                            raw_gate=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias)
    if training and return_intermediate_states:
        raise ValueError(
            "chunk_kda: return_intermediate_states=True is inference-only (prefix caching) and has no "
            "backward; call it under torch.no_grad() / torch.inference_mode() or detach the inputs")
    config, bwd_config = chunk_configs(call, config, None, training, chunk_size, disable_recompute)
    if training:
        return train(call, x, config, bwd_config, output_final_state)
    o, ht, hs = run_forward(call, x, config, output_final_state, return_intermediate_states)
    if return_intermediate_states:
        return o, ht, fla_layout(hs, call, intermediate_states_dtype)
    return o, ht


def _check_graph_flags(use_graph, max_num_seqs) -> None:
    if not isinstance(use_graph, bool):
        raise TypeError(f"chunk_kda: use_graph must be a bool, got {type(use_graph).__name__}")
    if max_num_seqs is not None and (isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int)
                                     or max_num_seqs < 1):
        raise ValueError(f"chunk_kda: max_num_seqs must be a positive int or None, got {max_num_seqs!r}")


def _check_graph_capturable(training: bool, return_intermediate_states: bool) -> None:
    """use_graph=True with cu_seqlens: only an inference call builds its whole schedule on the device."""
    if training or return_intermediate_states:
        what = "a training call (its backward)" if training else "return_intermediate_states (its output's shape)"
        raise ValueError(
            f"chunk_kda: use_graph=True with cu_seqlens is not supported for {what}: it needs the sequence "
            "lengths on the host, which a CUDA-graph replay with new lengths would not follow.  Capture an "
            "inference call (torch.no_grad()) without return_intermediate_states, or a fixed-length call")


def chunk_kda_launches(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                       use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                       allow_neg_eigval=False, safe_gate=False, lower_bound=None, return_intermediate_states=False,
                       cu_seqlens=None, A_log=None, dt_bias=None, config=None, state_v_first=False):
    """Validate, plan, generate and describe the forward launches of chunk_kda without running
    them (the op runs them; the tuner and the benchmark time them one by one; compile-only
    checks compile them): ``(launches, (o, final_state, per-chunk states))``."""
    call, x = prepare_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                          A_log=A_log, dt_bias=dt_bias, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                          use_gate_in_kernel=use_gate_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                          allow_neg_eigval=allow_neg_eigval, safe_gate=safe_gate, lower_bound=lower_bound,
                          state_v_first=state_v_first, sync_seqlens=return_intermediate_states)
    config, _ = chunk_configs(call, config, None, False)
    return forward_launches(call, x, config, output_final_state, return_intermediate_states)


def chunk_kda_bwd_launches(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                           use_gate_in_kernel=False, safe_gate=False, lower_bound=None, cu_seqlens=None,
                           A_log=None, dt_bias=None, config: ChunkTrainConfig | ChunkFwdConfig | None = None,
                           bwd_config: ChunkBwdConfig | None = None, do=None, dht=None, with_rerun=False,
                           state_v_first=False):
    """Describe the forward launches and the backward launches of a training call of chunk_kda
    (nothing runs; for compile-only checks, tests, the tuner and the benchmark):
    ``(fwd_launches, bwd_launches, bwd_outputs)``.

    The backward reads the intermediates and per-chunk states the forward launches write
    (run those first); ``do`` / ``dht`` default to zeros.  No host pre-processing, and dq/dk
    in the outputs are per value head (not yet summed over GVA groups); in recompute mode the
    backward's launches begin with chunk_bwd_rerun.  ``with_rerun``: the forward launches end with
    the backward's re-run of the intra launch where the backward takes one (it keeps nothing of the
    forward's intermediates: chunks of four sub-tiles, :func:`~.chunk_bwd.saved_names`), for
    compiling everything a training step runs."""
    call, x = prepare_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                          A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=use_gate_in_kernel, safe_gate=safe_gate,
                          lower_bound=lower_bound, in_kernel=False, state_v_first=state_v_first)
    config, bwd_config = chunk_configs(call, config, bwd_config, True)
    return training_step_launches(call, x, config, bwd_config, output_final_state, do, dht, with_rerun)
