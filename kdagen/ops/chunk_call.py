"""The chunk form's one call path, which every chunk op is an adapter over -- ``chunk_kda``
(:mod:`.chunk`), the family's ``chunk_member`` (:mod:`.member`) and general DPLR's
``chunk_dplr_delta_rule`` (:mod:`.dplr`): the validated call (:class:`ChunkCall`), its configs
(:func:`chunk_configs`: the caller's, a :func:`chunk_bwd_config` block's, the tuned winner for this
GPU and shape, or the heuristic), the forward's launches (:func:`forward_launches`: the two of
:mod:`kdagen.ops.chunk_fwd`, or the training forward's at a chunk length those do not take) and a
training call's (:func:`training_launches`, :mod:`kdagen.ops.chunk_train`, keeping what the backward
:mod:`kdagen.ops.chunk_bwd` reads), and autograd (:func:`train`, :class:`ChunkFunction`).
None of the modules it imports imports it or the ops.
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
from ..kernels import build, dummy_pointer
from . import chunk_bwd as bwd
from . import fallback
from .chunk_fwd import prepare_chunk_fwd
from .chunk_segments import fold_segments, sequence_transition_launch
from .chunk_train import prepare_chunk_train
from .cp import NotSplit, RankSplit, take_split
from .gate import layer_gate
from .l2norm import qk_l2norm
from .inputs import Dims, check_beta_flags, check_inputs, host_seqlens, preprocess, select_spec

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


def bwd_override_active() -> bool:
    """Whether a :func:`chunk_bwd_config` block is open (a traced call carries it into the op)."""
    return bool(_BWD_OVERRIDE)


@dataclass(frozen=True)
class ChunkCall:
    """A validated call: what it computes (the tensors are passed alongside, see :func:`prepare_chunk`)."""

    dims: Dims
    seqlens: list[int] | None
    plan: Plan
    scale: float
    cu_seqlens: torch.Tensor | None
    state_dtype: str  # of the initial state (float32 without one): part of the tuned winners' key
    # FLA's in-kernel flags, for the inference kernels (a training call applied them as torch ops,
    # or with l2norm set, the l2-norm in launches of its own before the forward's: train)
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


def training_preprocess(q, k, beta, use_qk_l2norm_in_kernel: bool, use_beta_sigmoid_in_kernel: bool,
                         allow_neg_eigval: bool, l2norm_launch: bool):
    """A chunk training call's :func:`~.inputs.preprocess` (this module's and the family's,
    :mod:`.member`): ``(q, k, beta, flags)``.  With ``l2norm_launch`` the l2-norm is left to the
    call's own launches (``flags["l2norm"]``: it is owed; :func:`train`), else it is a torch op
    here like the sigmoid."""
    deferred = use_qk_l2norm_in_kernel and l2norm_launch
    q, k, beta = preprocess(q, k, beta, use_qk_l2norm_in_kernel and not deferred, use_beta_sigmoid_in_kernel,
                            allow_neg_eigval)
    return q, k, beta, dict(l2norm=deferred)


def requires_grad(*tensors) -> bool:
    """Whether a call is a training call: autograd is on and some input requires grad."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def prepare_chunk(spec, q, k, v, g, beta, *, member: str, training: bool, scale=None, initial_state=None,
                  cu_seqlens=None, cu_seqlens_cpu=None, A_log=None, dt_bias=None, use_qk_l2norm_in_kernel=False,
                  use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                  state_v_first=False, sync_seqlens: bool | None = None, l2norm_launch: bool = False,
                  ab: tuple | None = None, tensors: dict | None = None, value_check=None) -> tuple[ChunkCall, dict]:
    """Validate a chunk call and plan it: ``(call, its contiguous inputs by name)`` -- the one front
    end of every chunk op (chunk_kda, the family's chunk_member, chunk_dplr_delta_rule), which
    differ only in what they pass here:

    - ``spec``: the spec, or a function of nothing selecting it once the tensors are validated
      (chunk_kda's flags); ``tensors``: :func:`~.inputs.check_inputs`'s description of the spec's
      tensors (``decay``, ``rank1``, ``max_head_dim``); ``member``: the name its messages give.
    - ``beta`` None: the spec reads none (the kernels get a stand-in pointer), or with ``ab``
      general DPLR's (a, b), read in its place; g None likewise (no decay).
    - ``value_check``: the opt-in value check, called with the beta the kernels read once the
      shapes are validated.
    - ``training``: the l2-norm and beta sigmoid are torch ops here, which autograd differentiates
      -- except the l2-norm with ``l2norm_launch`` (launches of its own, :func:`train`); else the
      inference kernels apply them.  ``sync_seqlens``: read a device cu_seqlens back (default:
      when training, whose backward needs the lengths; an inference call builds its chunk schedule
      on the device)."""
    dims, seqlens = check_inputs(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                                 A_log=A_log, dt_bias=dt_bias, gate_in_kernel=use_gate_in_kernel,
                                 cu_seqlens_cpu=cu_seqlens_cpu, state_v_first=state_v_first,
                                 sync_seqlens=training if sync_seqlens is None else sync_seqlens, member=member,
                                 **(tensors or {}))
    if callable(spec):  # chunk_kda's: chosen once the tensors are validated (a Recurrence is not callable)
        spec = spec()
    if beta is None and ab is None:  # no rank-1 part: the kernels read no beta (a stand-in pointer is passed)
        beta = dummy_pointer(q.device)
    if value_check is not None:
        value_check(beta)
    if training:
        q, k, beta, flags = training_preprocess(q, k, beta, use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel,
                                                allow_neg_eigval, l2norm_launch)
    else:
        check_beta_flags(use_beta_sigmoid_in_kernel, allow_neg_eigval)
        flags = dict(l2norm=use_qk_l2norm_in_kernel, beta_sigmoid=use_beta_sigmoid_in_kernel,
                     beta_scale=2.0 if allow_neg_eigval else 1.0)
    plan = lower(spec, dims.K, dims.V, dtype(q.dtype).name, "chunk", use_gate_in_kernel)
    x = dict(q=q, k=k, v=v, g=g if g is not None else dummy_pointer(q.device), beta=beta,
             initial_state=initial_state, A_log=A_log, dt_bias=dt_bias)
    if ab is not None:
        x.update(a=ab[0], b=ab[1])
    x = {n: t if t is None or n == "initial_state" else t.contiguous() for n, t in x.items()}
    state = "float32" if initial_state is None else dtype(initial_state.dtype).name
    call = ChunkCall(dims, seqlens, plan, dims.K ** -0.5 if scale is None else scale, cu_seqlens, state, **flags,
                     state_v_first=state_v_first)
    return call, x


def chunk_configs(call: ChunkCall, config, bwd_config: ChunkBwdConfig | None, training: bool, chunk_size: int | None = None,
             disable_recompute: bool = False):
    """The forward's config (a :class:`ChunkFwdConfig` for inference) or, when training, the
    training forward's :class:`ChunkTrainConfig` and the backward's, with one chunk length.
    ``chunk_size``, or a :class:`ChunkFwdConfig` given to a training call, pins that length.
    ``disable_recompute`` (FLA's keyword) makes the backward's config keep the forward's
    intermediates instead of recomputing them (``store_intermediates=True``).  An inference call at a
    ``chunk_size`` the solve and pass do not take (16: the member ops') gets the training forward's
    config instead (:func:`inference_train_config`), which :func:`forward_launches` runs."""
    if not training:
        if config is not None and not isinstance(config, ChunkFwdConfig):
            raise TypeError(f"chunk_kda: an inference call takes a ChunkFwdConfig, got {type(config).__name__}")
        if chunk_size is not None and chunk_size not in ChunkFwdConfig.CHUNK_SIZES:
            return inference_train_config(call, chunk_size), None
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


def inference_train_config(call: ChunkCall, chunk_size: int) -> ChunkTrainConfig:
    """An inference call's config at a chunk length the solve and pass do not take
    (``ChunkFwdConfig.CHUNK_SIZES``): the training forward's (tuned or heuristic) on chunks of
    ``chunk_size`` rows, any in-kernel gate computed by its chunk launches (``gate_launch`` off);
    :func:`forward_launches` runs its two launches, as general DPLR's inference does."""
    train = resolve("chunk_train", call.plan, None, call.shape, call.state_dtype)
    return legal("chunk_train", call.plan,
                 train.replace(chunk_size=chunk_size, sub_chunk=min(train.sub_chunk, chunk_size), gate_launch=False))


def forward_launches(call: ChunkCall, x: dict, config: ChunkFwdConfig | ChunkTrainConfig, output_final_state: bool,
                      return_intermediate_states: bool = False):
    if isinstance(config, ChunkTrainConfig):  # a chunk length the inference kernels do not take (chunk_configs)
        return _train_forward_launches(call, x, config, output_final_state, return_intermediate_states)
    return prepare_chunk_fwd(
        x["q"], x["k"], x["v"], x["g"], x["beta"], scale=call.scale, initial_state=x["initial_state"],
        output_final_state=output_final_state, cu_seqlens=call.cu_seqlens, seqlens=call.seqlens, dims=call.dims,
        plan=call.plan, config=config, built=build(call.plan, config), A_log=x["A_log"], dt_bias=x["dt_bias"],
        return_intermediate_states=return_intermediate_states, l2norm=call.l2norm, beta_sigmoid=call.beta_sigmoid,
        beta_scale=call.beta_scale, state_v_first=call.state_v_first)


def run_forward(call: ChunkCall, x: dict, config: ChunkFwdConfig | ChunkTrainConfig, output_final_state: bool,
                return_intermediate_states: bool = False):
    """Run an inference call's forward (:func:`forward_launches`, through :func:`kdagen.ops.fallback.run`,
    which steps down from a config that does not compile here): ``(o, final state, per-chunk states)``.

    A context-parallel rank that continues a sequence (:class:`kdagen.ops.cp.RankSplit`, which
    :func:`kdagen.ops.cp.run_cp` sets for this one call) runs in two phases: the solve and the
    (end state, transition) pieces of the sequences it names, the collective, then the pass from the start
    states the collective gave -- on the inference forward's two launches only (else :class:`NotSplit`,
    raised before anything runs: the rank takes the widened call)."""
    split = take_split()
    if split is None:
        _, _, out = fallback.run("chunk_fwd", call.plan, config, lambda c: forward_launches(
            call, x, c, output_final_state, return_intermediate_states))
        return out
    if isinstance(config, ChunkTrainConfig) or return_intermediate_states or call.state_v_first \
            or x["initial_state"] is None:
        raise NotSplit(f"{config.short()}: not the inference forward's solve and pass")
    dev = x["q"].device

    def describe(c):
        launches, out = forward_launches(call, x, c, output_final_state)
        steps = [launches[0]]
        pieces = None
        if split.seqs != ():  # (a rank whose piece reads no local sequence shares the identity)
            piece, *pieces = sequence_transition_launch(build(call.plan, c), launches[-1], split.seqs, plan=call.plan,
                                                        config=c, dev=dev, seqlens=call.seqlens)
            steps.append(piece)
        h0 = next(ln.args["h0"] for ln in launches[1:] if "h0" in ln.args)  # the tensor the pass reads
        steps.append(_ShareStep(split, pieces, h0))
        return steps + list(launches[1:]), out
    _, _, out = fallback.run("chunk_fwd", call.plan, config, describe)
    return out


class _ShareStep:
    """The two-phase rank's collective as a step between launches: the start state(s) it gives are written
    into the first row (every row) of the initial state the pass reads."""
    kernel = None

    def __init__(self, split: RankSplit, pieces, h0: torch.Tensor):
        self.split, self.pieces, self.h0 = split, pieces, h0  # pieces: the segments' (he, hm, groups), or None

    def __call__(self):
        he = hm = None
        if self.pieces is not None:
            he, hm = fold_segments(*self.pieces)
        h = self.split.share(he, hm)
        if self.split.every_row:
            self.h0.copy_(h)
        else:
            self.h0[0].copy_(h[0])


def _train_forward_launches(call: ChunkCall, x: dict, config: ChunkTrainConfig, output_final_state: bool,
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


def training_launches(call: ChunkCall, x: dict, config: ChunkTrainConfig, bwd_config: ChunkBwdConfig,
                       output_final_state: bool):
    """The forward launches of a training call -- also writing the per-chunk states (in the
    backward config's ``state_dtype``) and V' -- and the backward's :class:`~.chunk_bwd.BwdMeta`."""
    launches, outs = prepare_chunk_train(
        x["q"], x["k"], x["v"], x["g"], x["beta"], scale=call.scale, initial_state=x["initial_state"],
        output_final_state=output_final_state, cu_seqlens=call.cu_seqlens, seqlens=call.seqlens, dims=call.dims,
        plan=call.plan, config=config, built=build(call.plan, config), A_log=x["A_log"], dt_bias=x["dt_bias"],
        return_intermediate_states=True, state_dtype=storage(bwd_config.state_dtype, x["q"].dtype), store_vn=True,
        state_v_first=call.state_v_first, a=x.get("a"), b=x.get("b"),
        store_t=bwd_config.reruns_from_saved(call.plan))
    return launches, outs, bwd.meta_from_forward(launches, call.plan, bwd_config)


def training_step_launches(call: ChunkCall, x: dict, config, bwd_config, output_final_state: bool, do=None, dht=None,
                           with_rerun: bool = False):
    """Describe (nothing runs) a training call's forward launches and the backward's
    (:mod:`.chunk_bwd`): ``(fwd_launches, bwd_launches, bwd_outputs)`` -- the backward reads what the
    forward launches write (run those first); ``do``/``dht`` default to zeros.  In recompute mode the
    backward's launches begin with chunk_bwd_rerun; ``with_rerun`` adds the forward intra launch's
    re-run where the backward takes one instead (:func:`~.chunk_bwd.saved_names`)."""
    fwd, (o, ht, hs), meta = training_launches(call, x, config, bwd_config, output_final_state)
    inputs = {n: x[n] for n in bwd.INPUT_NAMES}
    inter = {n: fwd[0].args[n] for n in bwd.INTERMEDIATES + bwd.RERUN_SAVED if n in fwd[0].args}
    do = torch.zeros_like(o) if do is None else do.contiguous()
    if dht is None and output_final_state:
        dht = torch.zeros_like(ht)
    launches, outs = bwd.prepare_chunk_bwd(meta, inputs, inter, hs, fwd[1].args["vn"], do,
                                           None if dht is None else dht.contiguous(), x["initial_state"] is not None)
    if with_rerun and not bwd.saved_names(call.plan, meta.config):
        fwd = list(fwd) + [bwd.rerun_intra_launch(meta, inputs)[0]]
    return fwd, launches, outs


def train(call: ChunkCall, x: dict, config: ChunkTrainConfig, bwd_config: ChunkBwdConfig, output_final_state: bool,
           plain: tuple | None = None):
    """A training call's forward with autograd: the l2-norm of q and k first when ``call.l2norm``
    (:mod:`.l2norm`, its kernels from the training forward's and the backward's families), then
    :class:`ChunkFunction`.  ``plain``: (call, config, bwd_config) of the chunk launches once the
    in-kernel gate runs in launches of its own (default: KDA's, :func:`without_gate`)."""
    q, k, g, A_log, dt_bias = x["q"], x["k"], x["g"], x["A_log"], x["dt_bias"]
    if call.l2norm:
        q, k = qk_l2norm(q, k, build(call.plan, config).fn("qk_l2norm"), build(call.plan, bwd_config).fn("qk_l2norm_bwd"))
    if config.launches_gate(call.plan):
        # the gate in launches of its own (ChunkTrainConfig.gate_launch), then the plan without an in-kernel gate
        built = build(call.plan, config)
        g = layer_gate(g, A_log, dt_bias, built.fn("gate"), built.fn("gate_bwd"), call.plan.decay == "scalar")
        A_log = dt_bias = None
        call, config, bwd_config = plain if plain is not None else without_gate(call, config, bwd_config)
    return ChunkFunction.apply(q, k, x["v"], g, x["beta"], x["initial_state"], A_log, dt_bias,
                                   None, None, (call, config, bwd_config, output_final_state))


def with_plan(call: ChunkCall, plan: Plan) -> ChunkCall:
    """The same call on another plan of the same dims (a member's plan without its in-kernel gate)."""
    return dataclasses.replace(call, plan=plan)


def without_gate(call: ChunkCall, config: ChunkTrainConfig, bwd_config: ChunkBwdConfig):
    """The call and configs of a layer call's chunk launches once its gate is launched apart (g given, in
    float32): the plan of KDA with the direct gate, whose lower bound (where the gate's formula has one,
    lower_bound * sigmoid(..) >= lower_bound) is trusted, not checked -- the formula guarantees it, as for
    the in-kernel gate's plan.  The configs are the call's otherwise."""
    bound = call.plan.lower_bound
    spec = select_spec(False, bound is not None, bound, False, False)
    plan = lower(spec, call.plan.K, call.plan.V, call.plan.dtype, "chunk", False)
    return (with_plan(call, plan), config.replace(gate_launch=False, check_gate_bound=False),
            bwd_config.replace(check_gate_bound=False))


class ChunkFunction(torch.autograd.Function):
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
            lambda c: (lambda r: (r[0], (r[1], r[2])))(training_launches(call, x, c, bwd_config, output_final_state)))
        ctx.save_for_backward(*bwd.saved_tensors(launches, initial_state, hs, call.plan, meta.config))
        ctx.meta = meta
        ctx.like = {n: None if t is None else (t.shape, t.dtype) for n, t in x.items()}
        return o, ht

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do, dht):
        grads = bwd.backward(ctx.meta, ctx.saved_tensors, ctx.like, ctx.needs_input_grad, do, dht)
        return grads + (None,) * (11 - len(grads))  # (DPLR's da, db, when not its,) and run's


def fla_layout(hs: torch.Tensor, call: ChunkCall, states_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The per-chunk states [NT_total, HV, ., .] as FLA returns them: [B, NT, HV, ., .] for a fixed-length
    batch (NT_total = B * NT, batch-major) and [1, NT_total, HV, ., .] with cu_seqlens; in ``states_dtype``
    (None: the inputs' dtype, as FLA returns them; the kernels write float32, which
    ``intermediate_states_dtype=torch.float32`` keeps without a copy)."""
    hs = hs.to(dtype(call.plan.dtype).torch if states_dtype is None else states_dtype)
    if call.cu_seqlens is None:
        return hs.view(call.dims.B, -1, *hs.shape[1:])
    return hs.unsqueeze(0)


