"""`chunk_kda`: the chunkwise form (prefill and training) -- the public op, its autograd
Function, and the block that sets the backward's config.

A call is validated once (:func:`_prepare`).  An inference call runs the two launches of
:mod:`kdagen.ops.chunk_fwd`, which compute the l2-norm, the gate and the beta sigmoid of
FLA's in-kernel flags inside the kernels.  A training call (some input requires grad) runs the
forward of :mod:`kdagen.ops.chunk_train`, which also keeps what the backward
(:mod:`kdagen.ops.chunk_bwd`) reads; its l2-norm runs in launches of its own before the forward's
(:mod:`kdagen.ops.l2norm`, with their backward) and its beta sigmoid as a torch op, which autograd
differentiates.  Configs are resolved together (:func:`_configs`: the caller's, a
``chunk_bwd_config`` block's, the tuned winner for this GPU and shape, or the heuristic).
None of those modules imports this one.
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch

from ..cache.miscompiles import legal
from ..cache.heuristics import default_train_config
from ..cache.lookup import resolve
from ..codegen.lower import Plan, lower
from ..config import ChunkBwdConfig, ChunkFwdConfig, ChunkTrainConfig
from ..dtypes import dtype, storage
from ..kernels import build
from . import chunk_bwd as bwd
from . import checks
from . import fallback
from .chunk_fwd import prepare_chunk_fwd
from .chunk_train import prepare_chunk_train
from .gate import layer_gate
from .l2norm import qk_l2norm
from .inputs import (Dims, check_beta_flags, check_cp_context, check_inputs, check_kwargs, check_runnable,
                     fla_dtypes, host_seqlens, preprocess, select_spec, state_layout)
from .traced import chunk_kda_traced

_BWD_OVERRIDE: list[ChunkBwdConfig] = []


@contextlib.contextmanager
def chunk_bwd_config(config: ChunkBwdConfig):
    """Use ``config`` for the backward of every chunk_kda called (forward) inside the block.

    chunk_kda's signature has no backward config; its ``chunk_size``/``sub_chunk`` are
    always replaced by the forward's."""
    if not isinstance(config, ChunkBwdConfig):
        raise TypeError(f"chunk_bwd_config takes a ChunkBwdConfig, got {type(config).__name__}")
    _BWD_OVERRIDE.append(config)
    try:
        yield config
    finally:
        _BWD_OVERRIDE.pop()


@dataclass(frozen=True)
class _Call:
    """A validated call: what it computes (the tensors are passed alongside, see :func:`_prepare`)."""

    dims: Dims
    seqlens: list[int] | None
    plan: Plan
    scale: float
    cu_seqlens: torch.Tensor | None
    state_dtype: str  # of the initial state (float32 without one): part of the tuned winners' key
    # FLA's in-kernel flags, for the inference kernels (a training call applied them as torch ops,
    # or with l2norm set, the l2-norm in launches of its own before the forward's: _train)
    l2norm: bool = False
    beta_sigmoid: bool = False
    beta_scale: float = 1.0
    state_v_first: bool = False  # the initial, final and intermediate states are [.., V, K]

    @property
    def shape(self) -> dict:
        """The call's shape as the config look-up reads it."""
        d = self.dims
        longest = d.T if self.seqlens is None else max((b - a for a, b in zip(self.seqlens, self.seqlens[1:])), default=0)
        return {"T": d.T, "B": d.B, "N": d.N, "HV": d.HV, "T_max": longest}


def _training_preprocess(q, k, beta, use_qk_l2norm_in_kernel: bool, use_beta_sigmoid_in_kernel: bool,
                         allow_neg_eigval: bool, l2norm_launch: bool):
    """A chunk training call's :func:`~.inputs.preprocess` (this module's and the family's,
    :mod:`.member`): ``(q, k, beta, flags)``.  With ``l2norm_launch`` the l2-norm is left to the
    call's own launches (``flags["l2norm"]``: it is owed; :func:`_train`), else it is a torch op
    here like the sigmoid."""
    deferred = use_qk_l2norm_in_kernel and l2norm_launch
    q, k, beta = preprocess(q, k, beta, use_qk_l2norm_in_kernel and not deferred, use_beta_sigmoid_in_kernel,
                            allow_neg_eigval)
    return q, k, beta, dict(l2norm=deferred)


def _prepare(q, k, v, g, beta, *, scale=None, initial_state=None, cu_seqlens=None, A_log=None, dt_bias=None,
             use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
             allow_neg_eigval=False, safe_gate=False, lower_bound=None,
             in_kernel: bool = True, cu_seqlens_cpu=None, state_v_first: bool = False,
             sync_seqlens: bool | None = None, l2norm_launch: bool = False) -> tuple[_Call, dict]:
    """Validate the arguments and choose the spec and plan: the call and its contiguous inputs by
    name.  ``in_kernel``: the l2-norm and beta sigmoid are left to the kernels (the inference
    forward); otherwise they are applied here as torch ops, which autograd differentiates --
    except the l2-norm with ``l2norm_launch`` (a training call: its own launches, :func:`_train`).
    ``sync_seqlens``: read a device cu_seqlens back to the host (default: for a training call,
    whose backward needs the lengths; an inference call builds its schedule on the device)."""
    dims, seqlens = check_inputs(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                                 A_log=A_log, dt_bias=dt_bias, gate_in_kernel=use_gate_in_kernel,
                                 cu_seqlens_cpu=cu_seqlens_cpu, state_v_first=state_v_first,
                                 sync_seqlens=not in_kernel if sync_seqlens is None else sync_seqlens,
                                 member="chunk_kda")
    spec = select_spec(use_gate_in_kernel, safe_gate, lower_bound, A_log is not None, dt_bias is not None)
    flags = {}
    if in_kernel:
        check_beta_flags(use_beta_sigmoid_in_kernel, allow_neg_eigval)
        flags = dict(l2norm=use_qk_l2norm_in_kernel, beta_sigmoid=use_beta_sigmoid_in_kernel,
                     beta_scale=2.0 if allow_neg_eigval else 1.0)
    else:
        q, k, beta, flags = _training_preprocess(q, k, beta, use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel,
                                                 allow_neg_eigval, l2norm_launch)
    plan = lower(spec, dims.K, dims.V, dtype(q.dtype).name, "chunk", use_gate_in_kernel)
    x = dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state, A_log=A_log, dt_bias=dt_bias)
    x = {n: t if t is None or n == "initial_state" else t.contiguous() for n, t in x.items()}
    state = "float32" if initial_state is None else dtype(initial_state.dtype).name
    call = _Call(dims, seqlens, plan, dims.K ** -0.5 if scale is None else scale, cu_seqlens, state, **flags,
                 state_v_first=state_v_first)
    return call, x


def _configs(call: _Call, config, bwd_config: ChunkBwdConfig | None, training: bool, chunk_size: int | None = None,
             disable_recompute: bool = False):
    """The forward's config (a :class:`ChunkFwdConfig` for inference) or, when training, the
    training forward's :class:`ChunkTrainConfig` and the backward's, with one chunk length.
    ``chunk_size``, or a :class:`ChunkFwdConfig` given to a training call, pins that length.
    ``disable_recompute`` (FLA's keyword) makes the backward's config keep the forward's
    intermediates instead of recomputing them (``store_intermediates=True``).  An inference call at a
    ``chunk_size`` the solve and pass do not take (16: the member ops') gets the training forward's
    config instead (:func:`_inference_train_config`), which :func:`_forward_launches` runs."""
    if not training:
        if config is not None and not isinstance(config, ChunkFwdConfig):
            raise TypeError(f"chunk_kda: an inference call takes a ChunkFwdConfig, got {type(config).__name__}")
        if chunk_size is not None and chunk_size not in ChunkFwdConfig.CHUNK_SIZES:
            return _inference_train_config(call, chunk_size), None
        fwd = resolve("chunk_fwd", call.plan, config, call.shape, call.state_dtype)
        fwd = fwd if chunk_size is None else fwd.replace(chunk_size=chunk_size)
        # a config the caller did not give is made legal for the GPU (kdagen.cache.miscompiles.legal)
        return (fwd if config is not None else legal("chunk_fwd", call.plan, fwd)), None
    if config is not None and not isinstance(config, (ChunkFwdConfig, ChunkTrainConfig)):
        raise TypeError(f"chunk_kda: config must be a ChunkFwdConfig or ChunkTrainConfig, got {type(config).__name__}")
    given_bwd = bwd_config
    if bwd_config is None and _BWD_OVERRIDE:
        bwd_config = _BWD_OVERRIDE[-1]
    b = resolve("chunk_bwd", call.plan, bwd_config, call.shape, call.state_dtype)
    if isinstance(config, ChunkTrainConfig):
        train = config
    else:
        train = default_train_config(call.plan, call.shape)  # not tuned: it runs at the backward's chunk length
        train = train.replace(chunk_size=config.chunk_size if config is not None else b.chunk_size,
                              sub_chunk=b.sub_chunk)
    if chunk_size is not None:  # (sub-tiles no longer than the chunk: a 64 / 32 config pinned to 16 rows)
        train = train.replace(chunk_size=chunk_size, sub_chunk=min(train.sub_chunk, chunk_size))
    if (b.chunk_size, b.sub_chunk) != (train.chunk_size, train.sub_chunk):
        b = b.with_chunking(train.chunk_size, train.sub_chunk)
    if disable_recompute and not b.store_intermediates:
        b = b.replace(store_intermediates=True)
    if not isinstance(config, ChunkTrainConfig):
        train = legal("chunk_train", call.plan, train)
    if given_bwd is None:
        b = legal("chunk_bwd", call.plan, b)
    b.reverse_pass_block_v(call.plan)  # refused before anything runs: a tile too narrow for the chunks
    return train, b


def _inference_train_config(call: _Call, chunk_size: int) -> ChunkTrainConfig:
    """An inference call's config at a chunk length the solve and pass do not take
    (``ChunkFwdConfig.CHUNK_SIZES``): the training forward's (tuned or heuristic) on chunks of
    ``chunk_size`` rows, any in-kernel gate computed by its chunk launches (``gate_launch`` off);
    :func:`_forward_launches` runs its two launches, as general DPLR's inference does."""
    train = resolve("chunk_train", call.plan, None, call.shape, call.state_dtype)
    return legal("chunk_train", call.plan,
                 train.replace(chunk_size=chunk_size, sub_chunk=min(train.sub_chunk, chunk_size), gate_launch=False))


def _forward_launches(call: _Call, x: dict, config: ChunkFwdConfig | ChunkTrainConfig, output_final_state: bool,
                      return_intermediate_states: bool = False):
    if isinstance(config, ChunkTrainConfig):  # a chunk length the inference kernels do not take (_configs)
        return _train_forward_launches(call, x, config, output_final_state, return_intermediate_states)
    return prepare_chunk_fwd(
        x["q"], x["k"], x["v"], x["g"], x["beta"], scale=call.scale, initial_state=x["initial_state"],
        output_final_state=output_final_state, cu_seqlens=call.cu_seqlens, seqlens=call.seqlens, dims=call.dims,
        plan=call.plan, config=config, built=build(call.plan, config), A_log=x["A_log"], dt_bias=x["dt_bias"],
        return_intermediate_states=return_intermediate_states, l2norm=call.l2norm, beta_sigmoid=call.beta_sigmoid,
        beta_scale=call.beta_scale, state_v_first=call.state_v_first)


def _train_forward_launches(call: _Call, x: dict, config: ChunkTrainConfig, output_final_state: bool,
                            return_intermediate_states: bool):
    """An inference call's forward on the training forward's launches (intra, fused state pass): FLA's
    in-kernel flags, which those kernels do not apply, as torch ops first (:func:`~.inputs.preprocess`),
    and a device cu_seqlens read back once (the schedule is built on the host).  The per-chunk states
    come back float32 in the call's layout (the pass writes them [K, V]: a transposed view with
    ``state_v_first``)."""
    q, k, beta = x["q"], x["k"], x["beta"]
    if call.l2norm or call.beta_sigmoid:
        q, k, beta = preprocess(q, k, beta, call.l2norm, call.beta_sigmoid, call.beta_scale == 2.0)
    seqlens = call.seqlens
    if call.cu_seqlens is not None and seqlens is None:
        seqlens = host_seqlens(call.cu_seqlens, call.dims.T)
    launches, (o, ht, hs) = prepare_chunk_train(
        q, k, x["v"], x["g"], beta, scale=call.scale, initial_state=x["initial_state"],
        output_final_state=output_final_state, cu_seqlens=call.cu_seqlens, seqlens=seqlens, dims=call.dims,
        plan=call.plan, config=config, built=build(call.plan, config), A_log=x["A_log"], dt_bias=x["dt_bias"],
        return_intermediate_states=return_intermediate_states, state_v_first=call.state_v_first)
    if hs is not None and call.state_v_first:
        hs = hs.transpose(-1, -2)
    return launches, (o, ht, hs)


def _training_launches(call: _Call, x: dict, config: ChunkTrainConfig, bwd_config: ChunkBwdConfig,
                       output_final_state: bool):
    """The forward launches of a training call -- also writing the per-chunk states (in the
    backward config's ``state_dtype``) and V' -- and the backward's :class:`~.chunk_bwd.BwdMeta`."""
    launches, outs = prepare_chunk_train(
        x["q"], x["k"], x["v"], x["g"], x["beta"], scale=call.scale, initial_state=x["initial_state"],
        output_final_state=output_final_state, cu_seqlens=call.cu_seqlens, seqlens=call.seqlens, dims=call.dims,
        plan=call.plan, config=config, built=build(call.plan, config), A_log=x["A_log"], dt_bias=x["dt_bias"],
        return_intermediate_states=True, state_dtype=storage(bwd_config.state_dtype, x["q"].dtype), store_vn=True,
        state_v_first=call.state_v_first, a=x.get("a"), b=x.get("b"),
        store_t=bwd_config.reruns_from_saved(call.plan),
        # a backward that keeps the forward's intermediates and splits qg reads it in fp32
        qg_dtype=bwd.qg_dtype(bwd_config, storage(config.intermediates, x["q"].dtype))
        if bwd_config.store_intermediates else None)
    return launches, outs, bwd.meta_from_forward(launches, call.plan, bwd_config)


def _train(call: _Call, x: dict, config: ChunkTrainConfig, bwd_config: ChunkBwdConfig, output_final_state: bool,
           plain: tuple | None = None):
    """A training call's forward with autograd: the l2-norm of q and k first when ``call.l2norm``
    (:mod:`.l2norm`, its kernels from the training forward's and the backward's families), then
    :class:`_ChunkKDAFunction`.  ``plain``: (call, config, bwd_config) of the chunk launches once the
    in-kernel gate runs in launches of its own (default: KDA's, :func:`_without_gate`)."""
    q, k, g, A_log, dt_bias = x["q"], x["k"], x["g"], x["A_log"], x["dt_bias"]
    if call.l2norm:
        q, k = qk_l2norm(q, k, build(call.plan, config).fn("qk_l2norm"), build(call.plan, bwd_config).fn("qk_l2norm_bwd"))
    if config.launches_gate(call.plan):
        # the gate in launches of its own (ChunkTrainConfig.gate_launch), then the plan without an in-kernel gate
        built = build(call.plan, config)
        g = layer_gate(g, A_log, dt_bias, built.fn("gate"), built.fn("gate_bwd"), call.plan.decay == "scalar")
        A_log = dt_bias = None
        call, config, bwd_config = plain if plain is not None else _without_gate(call, config, bwd_config)
    return _ChunkKDAFunction.apply(q, k, x["v"], g, x["beta"], x["initial_state"], A_log, dt_bias,
                                   None, None, (call, config, bwd_config, output_final_state))


def with_plan(call: _Call, plan: Plan) -> _Call:
    """The same call on another plan of the same dims (a member's plan without its in-kernel gate)."""
    return dataclasses.replace(call, plan=plan)


def _without_gate(call: _Call, config: ChunkTrainConfig, bwd_config: ChunkBwdConfig):
    """The call and configs of a layer call's chunk launches once its gate is launched apart (g given, in
    float32): the plan of KDA with the direct gate, whose lower bound (where the gate's formula has one,
    lower_bound * sigmoid(..) >= lower_bound) is trusted, not checked -- the formula guarantees it, as for
    the in-kernel gate's plan.  The configs are the call's otherwise."""
    bound = call.plan.lower_bound
    spec = select_spec(False, bound is not None, bound, False, False)
    plan = lower(spec, call.plan.K, call.plan.V, call.plan.dtype, "chunk", False)
    return (with_plan(call, plan), config.replace(gate_launch=False, check_gate_bound=False),
            bwd_config.replace(check_gate_bound=False))


class _ChunkKDAFunction(torch.autograd.Function):
    """chunk_kda with gradients: the forward launches also write what the backward reads.  Used
    only when some input requires grad; the inputs are already validated and pre-processed.
    ``a``, ``b``: general DPLR's read and write vectors (None for every other member, whose
    ``beta`` they replace)."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, initial_state, A_log, dt_bias, a, b, run):
        call, config, bwd_config, output_final_state = run
        x = dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state, A_log=A_log, dt_bias=dt_bias, a=a, b=b)
        # a forward config that does not compile on this GPU falls back to a smaller one (kdagen.ops.fallback)
        _, launches, ((o, ht, hs), meta) = fallback.run(
            "chunk_train", call.plan, config,
            lambda c: (lambda r: (r[0], (r[1], r[2])))(_training_launches(call, x, c, bwd_config, output_final_state)))
        ctx.save_for_backward(*bwd.saved_tensors(launches, initial_state, hs, call.plan, meta.config))
        ctx.meta = meta
        ctx.like = {n: None if t is None else (t.shape, t.dtype) for n, t in x.items()}
        return o, ht

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do, dht):
        grads = bwd.backward(ctx.meta, ctx.saved_tensors, ctx.like, ctx.needs_input_grad, do, dht)
        return grads + (None,) * (11 - len(grads))  # (DPLR's da, db, when not its,) and run's


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
    it).  Unlike FLA (which returns them in k's dtype), the states are float32: cast them if
    the cache is kept lower.

    ``state_v_first=True`` (FLA's keyword; ``transpose_state_layout``, its deprecated name,
    works as in FLA): every state -- initial_state, the final state, the intermediate states
    and, in training, the initial state's gradient -- is [.., HV, V, K] instead of
    [.., HV, K, V].  The kernels load and store that layout (nothing is transposed around the
    call); the math is the same.

    FLA's other keywords:
    ``disable_recompute=True``: the backward keeps the forward's intermediates instead of
    recomputing them (``ChunkBwdConfig.store_intermediates``); no effect without a gradient.
    ``cp_context`` (context parallelism): not supported, only None is accepted.
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
    check_cp_context("chunk_kda", cp_context)
    _check_graph_flags(use_graph, max_num_seqs)
    if chunk_size is not None and chunk_size not in (32, 64):
        raise ValueError(f"chunk_kda: `chunk_size` must be either 32 or 64 for KDA, got {chunk_size!r}")
    if chunk_size is not None and config is not None and config.chunk_size != chunk_size:
        raise ValueError(f"chunk_kda: chunk_size={chunk_size} disagrees with config.chunk_size={config.chunk_size}")
    if torch.compiler.is_compiling():  # torch.compile traces one registered op (kdagen.ops.traced)
        return chunk_kda_traced(
            q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_gate_in_kernel=use_gate_in_kernel,
            use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
            safe_gate=safe_gate, lower_bound=lower_bound, return_intermediate_states=return_intermediate_states,
            cu_seqlens=cu_seqlens, A_log=A_log, dt_bias=dt_bias, config=config, cu_seqlens_cpu=cu_seqlens_cpu,
            check_inputs=check_inputs, chunk_size=chunk_size, bwd_override=bool(_BWD_OVERRIDE),
            state_v_first=state_v_first, disable_recompute=disable_recompute)
    if isinstance(q, torch.Tensor):
        check_runnable(q)
    training = torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v, g, beta, initial_state, A_log, dt_bias))
    if use_graph and cu_seqlens is not None:
        _check_graph_capturable(training, return_intermediate_states)
        cu_seqlens_cpu = None  # a captured graph replays the schedule the device builds, never host lengths
    call, x = _prepare(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
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
    config, bwd_config = _configs(call, config, None, training, chunk_size, disable_recompute)
    if training:
        return _train(call, x, config, bwd_config, output_final_state)
    _, _, (o, ht, hs) = fallback.run("chunk_fwd", call.plan, config, lambda c: _forward_launches(
        call, x, c, output_final_state, return_intermediate_states))
    if return_intermediate_states:
        return o, ht, _fla_layout(hs, call)
    return o, ht


def _fla_layout(hs: torch.Tensor, call: _Call) -> torch.Tensor:
    """The per-chunk states [NT_total, HV, ., .] as FLA returns them (views, no copy):
    [B, NT, HV, ., .] for a fixed-length batch (NT_total = B * NT, batch-major) and
    [1, NT_total, HV, ., .] with cu_seqlens."""
    if call.cu_seqlens is None:
        return hs.view(call.dims.B, -1, *hs.shape[1:])
    return hs.unsqueeze(0)


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
    call, x = _prepare(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                       A_log=A_log, dt_bias=dt_bias, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                       use_gate_in_kernel=use_gate_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                       allow_neg_eigval=allow_neg_eigval, safe_gate=safe_gate, lower_bound=lower_bound,
                       state_v_first=state_v_first, sync_seqlens=return_intermediate_states)
    config, _ = _configs(call, config, None, False)
    return _forward_launches(call, x, config, output_final_state, return_intermediate_states)


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
    call, x = _prepare(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                       A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=use_gate_in_kernel, safe_gate=safe_gate,
                       lower_bound=lower_bound, in_kernel=False, state_v_first=state_v_first)
    config, bwd_config = _configs(call, config, bwd_config, True)
    fwd, (o, ht, hs), meta = _training_launches(call, x, config, bwd_config, output_final_state)
    inputs = {n: x[n] for n in bwd.INPUT_NAMES}
    inter = {n: fwd[0].args[n] for n in bwd.INTERMEDIATES + bwd.RERUN_SAVED if n in fwd[0].args}
    if do is None:
        do = torch.zeros_like(o)
    if dht is None and output_final_state:
        dht = torch.zeros_like(ht)
    launches, outs = bwd.prepare_chunk_bwd(meta, inputs, inter, hs, fwd[1].args["vn"], do.contiguous(),
                                           None if dht is None else dht.contiguous(), initial_state is not None)
    if with_rerun and not bwd.saved_names(call.plan, meta.config):
        fwd = list(fwd) + [bwd.rerun_intra_launch(meta, inputs)[0]]
    return fwd, launches, outs
