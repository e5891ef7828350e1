"""flash-linear-attention 0.6.0's ops of the general diagonal-plus-rank-1 (DPLR) recurrence
(``fla.ops.generalized_delta_rule.dplr``), with its names, signatures, layouts and return values:

    S_t = Diag(exp gk_t) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T,      o_t = S_t^T (scale q_t)

``a`` is the read and ``b`` the write vector of the rank-1 term, which reads the undecayed
previous state.  q, k: [B, T, H, K]; v: [B, T, HV, V]; a, b, gk: [B, T, HV, K] (per value head,
like v: HV a multiple of H, GVA; FLA has HV = H); states [N, HV, K, V], float32.
kdagen's spec of this recurrence is :func:`kdagen.spec.dplr`, which writes the rank-1 term as
``-a' b'^T`` (its reference ``naive_recurrent_dplr(q, k, v, a', b', gk)``), so FLA's (a, b) are
the spec's (a', b') = (-b, a).

The chunk form (:func:`chunk_dplr_delta_rule`) runs the general-DPLR form of the
training-path kernels -- the intra-chunk launch (``chunk_intra``, a template of its own: A_ab, A_ak,
A_qb, A_qk, the triangular inverse, w, u, qg, kg, kgv, aqk, aqv, G_n) and the state pass (``chunk_state``) --
for inference and training alike (KDA's inference-only solve/pass kernels have no DPLR
branch).  Its config is a :class:`~kdagen.config.ChunkTrainConfig`.  Its gradients come from the
DPLR backward (:mod:`kdagen.ops.dplr_bwd`).

The recurrent form (:func:`fused_recurrent_dplr_delta_rule`, decode) runs the DPLR branch of the
recurrent template, over :func:`kdagen.ops.member.fused_recurrent_member` (state pool, ``out=``,
packed decode), with a backward from general DPLR's recurrent backward template (FLA's op has
none).
"""
from __future__ import annotations

from functools import lru_cache

import torch

from .. import spec as S
from ..cache.miscompiles import legal
from ..cache.lookup import resolve
from ..codegen.forms import generates
from ..config import ChunkTrainConfig
from ..dtypes import TORCH_DTYPES
from ..kernels import build
from . import chunk_bwd as bwd
from . import fallback
from .chunk_call import ChunkFunction, chunk_configs, prepare_chunk, requires_grad, training_launches
from .chunk_train import prepare_chunk_train
from .cp import cp_call
from .dplr_bwd import DPLR_KEPT_INTERMEDIATES, prepare_dplr_bwd
from .inputs import check_kwargs, check_runnable, fla_dtypes, gate_choice
from .member import fused_recurrent_member
from .traced import eager_under_compile

CHUNK_SIZES = (16, 32, 64)  # the chunk lengths the training-path templates are run and tested at for DPLR
_CHUNK_IGNORED = ("chunk_indices",)  # FLA's precomputed schedule: kdagen builds its own from cu_seqlens


@lru_cache(maxsize=8)
def dplr_spec(lower_bound: float | None = None) -> S.Recurrence:
    """General DPLR's spec with gk given, bounded below by ``lower_bound`` when the caller promises
    one (the diagonal tiles are then factorised dots; element-wise otherwise)."""
    return S.dplr(S.gate_direct(lower_bound))


def _check_vectors(op: str, q, v, a, b, gk) -> None:
    """a, b and gk: tensors of [B, T, HV, K] on q's device; a and b in q's dtype."""
    for name, x in (("a", a), ("b", b), ("gk", gk)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in TORCH_DTYPES:
            raise TypeError(f"{op}: {name} must be float32, float16 or bfloat16, got {x.dtype}")
    if not (isinstance(q, torch.Tensor) and q.dim() == 4 and isinstance(v, torch.Tensor) and v.dim() == 4):
        return  # check_inputs says what is wrong with q or v
    B, T, _, K = q.shape
    HV = v.shape[2]
    for name, x in (("a", a), ("b", b), ("gk", gk)):
        if tuple(x.shape) != (B, T, HV, K):
            raise ValueError(f"{op}: {name} must have shape [B, T, HV, K] = {(B, T, HV, K)} (per value head, like "
                             f"v), got {tuple(x.shape)}")
        if x.device != q.device:
            raise ValueError(f"{op}: {name} is on {x.device} but q is on {q.device}; all inputs must share a device")
    for name, x in (("a", a), ("b", b)):
        if x.dtype != q.dtype:
            raise TypeError(f"{op}: {name} must have q's dtype {q.dtype}, got {x.dtype}")


def _prepare(op: str, q, k, v, a, b, gk, *, scale=None, initial_state=None, cu_seqlens=None, cu_seqlens_cpu=None,
             safe_gate: bool = False, lower_bound: float | None = None, training: bool | None = None):
    """A chunk call on the chunk front end (:func:`~.chunk_call.prepare_chunk`), a and b read in place of
    beta: ``(call, inputs by name, training)``.  ``training`` None: whether some input requires grad."""
    _check_vectors(op, q, v, a, b, gk)
    _, bound, _, _ = gate_choice(False, safe_gate, lower_bound, False, False)  # chunk_kda's reading of the flags
    spec = dplr_spec(bound)
    if training is None:
        training = requires_grad(q, k, v, a, b, gk, initial_state)
    call, x = prepare_chunk(spec, q, k, v, gk, None, member=op, training=training, scale=scale,
                            initial_state=initial_state, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu,
                            sync_seqlens=True, ab=(a, b), tensors=dict(decay="channel", rank1=False))
    return call, x, training


def _configs(op: str, call, config, training: bool, chunk_size: int | None, disable_recompute: bool = False):
    """``(forward config, backward config or None)``: the caller's ChunkTrainConfig, else the tuned
    winner of the ``chunk_train`` family, else its heuristic; a training call's backward config
    as every member's (:func:`kdagen.ops.chunk_call.chunk_configs`)."""
    if config is not None and not isinstance(config, ChunkTrainConfig):
        raise TypeError(f"{op}: config must be a ChunkTrainConfig (general DPLR runs the training-path kernels, "
                        f"chunk_intra and chunk_state, for inference too), got {type(config).__name__}")
    if training:
        return chunk_configs(call, config, None, True, chunk_size, disable_recompute)
    fwd = resolve("chunk_train", call.plan, config, call.shape, call.state_dtype)
    fwd = fwd if chunk_size is None else fwd.replace(chunk_size=chunk_size, sub_chunk=min(fwd.sub_chunk, chunk_size))
    # a config the caller did not give is made legal for the GPU (kdagen.cache.miscompiles.legal)
    return (fwd if config is not None else legal("chunk_train", call.plan, fwd)), None


def _launches(call, x, config: ChunkTrainConfig, output_final_state: bool):
    """The inference forward's two launches (not run) and its outputs ``(o, final state, None)``."""
    return prepare_chunk_train(
        x["q"], x["k"], x["v"], x["g"], None, scale=call.scale, initial_state=x["initial_state"],
        output_final_state=output_final_state, cu_seqlens=call.cu_seqlens, seqlens=call.seqlens, dims=call.dims,
        plan=call.plan, config=config, built=build(call.plan, config), a=x["a"], b=x["b"])


def _check_chunk_size(op: str, chunk_size, config) -> None:
    if chunk_size is not None and chunk_size not in CHUNK_SIZES:
        raise ValueError(f"{op}: chunk_size={chunk_size!r} is not supported; kdagen's DPLR chunk kernels take "
                         f"{', '.join(map(str, CHUNK_SIZES))} (or None: the tuned or heuristic length)")
    if config is not None and getattr(config, "chunk_size", None) not in CHUNK_SIZES:
        raise ValueError(f"{op}: config.chunk_size={getattr(config, 'chunk_size', None)!r} is not supported; "
                         f"kdagen's DPLR chunk kernels take {', '.join(map(str, CHUNK_SIZES))}")
    if chunk_size is not None and config is not None and config.chunk_size != chunk_size:
        raise ValueError(f"{op}: chunk_size={chunk_size} disagrees with config.chunk_size={config.chunk_size}")


@eager_under_compile  # no registered op (yet): torch.compile runs it eagerly, a graph break
@fla_dtypes("q", ("q", "k", "v", "a", "b"))
def chunk_dplr_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                          gk: torch.Tensor, scale: float | None = None, initial_state: torch.Tensor | None = None,
                          output_final_state: bool = False, cu_seqlens: torch.LongTensor | None = None,
                          cu_seqlens_cpu: torch.LongTensor | None = None, safe_gate: bool = False,
                          chunk_size: int | None = None, lower_bound: float | None = None,
                          disable_recompute: bool = False, cp_context=None, config: ChunkTrainConfig | None = None,
                          **kwargs):
    """Chunkwise general DPLR (FLA 0.6.0's ``chunk_dplr_delta_rule`` signature):
    S_t = Diag(exp gk_t) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T, o_t = S_t^T (scale q_t).

    q, k: [B, T, H, K]; v: [B, T, HV, V]; a, b: [B, T, HV, K]; gk: [B, T, HV, K]
    log decay (<= 0); initial_state: [N, HV, K, V] (N = B, or the number of sequences with
    ``cu_seqlens``, B = 1).  HV is a multiple of H (GVA: value head hv reads q/k head
    hv // (HV // H)); FLA has HV = H.  Returns ``(o, final_state)``: o [B, T, HV, V] in q's
    dtype, final_state float32 [N, HV, K, V] or None.  ``cu_seqlens_cpu``: the offsets on the
    host, so nothing is read back from the device.  float32 inputs are accepted (FLA warns).

    Gates.  By default any gk <= 0 gives the recurrence's answer: each 16-token diagonal sub-tile's
    decay span is checked in the kernel, factorised tensor-core dots where it is within exp(81),
    element-wise products (one column at a time) else, and gk = -inf (a reset) is taken as -40 (a
    decay to 4e-18).  ``safe_gate=True`` (with ``lower_bound=L``, default -5: chunk_kda's reading of
    the flags; ``lower_bound`` without ``safe_gate`` changes nothing) promises gk >= L and the
    diagonal tiles become unchecked factorised dots (the heuristic configs trust the promise), which
    give wrong values where gk breaks it; ``check_gate_bound=True`` in the training and backward
    configs checks it per sub-tile in the kernels (docs/decisions/0013-gate-bound-checked-by-repair-launches.md).

    ``chunk_size``: 16, 32 or 64 (None: the tuned winner's or the heuristic's); other lengths
    are refused (ValueError).  ``cp_context``: context parallelism as chunk_kda's
    (:mod:`kdagen.ops.cp`); ``head_first`` as in FLA.  FLA's ``chunk_indices`` is accepted and not read.
    ``config``: a :class:`~kdagen.config.ChunkTrainConfig` instead of the tuned/heuristic one.

    Gradients: a call with an input that requires grad runs the training forward through
    kdagen's autograd Function (it keeps the per-chunk states and V' as every member's does);
    its backward (:mod:`kdagen.ops.dplr_bwd`) gives the gradients of q, k, v, a, b, gk and
    initial_state from o and the final state.  ``disable_recompute``
    maps to the backward config's ``store_intermediates`` (the forward's intermediates are kept
    instead of recomputed), as chunk_kda's; no effect without a gradient."""
    op = "chunk_dplr_delta_rule"
    if "head_first" in kwargs:
        raise ValueError(f"{op}: head_first has been removed (as in FLA); inputs are [B, T, H, ...]")
    for name in _CHUNK_IGNORED:
        kwargs.pop(name, None)
    check_kwargs(op, kwargs)
    _check_chunk_size(op, chunk_size, config)
    if cp_context is not None:
        return cp_call(op, chunk_dplr_delta_rule, cp_context, (q, k, v, a, b, gk), scale, initial_state,
                       output_final_state, False, cu_seqlens,
                       dict(kwargs, safe_gate=safe_gate, chunk_size=chunk_size, lower_bound=lower_bound,
                            disable_recompute=disable_recompute, config=config))
    if not isinstance(disable_recompute, bool):
        raise TypeError(f"{op}: disable_recompute must be a bool, got {type(disable_recompute).__name__}")
    if isinstance(q, torch.Tensor):
        check_runnable(q)
    call, x, training = _prepare(op, q, k, v, a, b, gk, scale=scale, initial_state=initial_state,
                                 cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, safe_gate=safe_gate,
                                 lower_bound=lower_bound)
    config, bwd_config = _configs(op, call, config, training, chunk_size, disable_recompute)
    if training:
        return ChunkFunction.apply(x["q"], x["k"], x["v"], x["g"], None, x["initial_state"], None, None,
                                         x["a"], x["b"], (call, config, bwd_config, output_final_state))
    # a config that does not compile on this GPU falls back to a smaller one (kdagen.ops.fallback)
    _, _, (o, ht, _) = fallback.run("chunk_train", call.plan, config, lambda c: _launches(call, x, c, output_final_state))
    return o, ht


def chunk_dplr_launches(q, k, v, a, b, gk, *, training: bool = False, config: ChunkTrainConfig | None = None,
                        bwd_config=None, output_final_state: bool = False, scale=None, initial_state=None,
                        cu_seqlens=None, safe_gate: bool = False, lower_bound: float | None = None):
    """Describe, without running, the forward launches of a :func:`chunk_dplr_delta_rule` call (for
    compile-only checks, benchmarks of single kernels and the tuner): ``(launches, (o, final
    state, per-chunk states))``.  ``training=True``: the training forward's launches, which also
    write the per-chunk states (in the backward config's ``state_dtype``) and V' (the state
    launch's ``vn``) -- what the backward reads; ``bwd_config`` as chunk_kda's."""
    op = "chunk_dplr_launches"
    _check_chunk_size(op, None, config)
    call, x, _ = _prepare(op, q, k, v, a, b, gk, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                          safe_gate=safe_gate, lower_bound=lower_bound, training=training)
    if not training:
        config, _ = _configs(op, call, config, False, None)
        return _launches(call, x, config, output_final_state)
    if config is not None and not isinstance(config, ChunkTrainConfig):
        raise TypeError(f"{op}: config must be a ChunkTrainConfig, got {type(config).__name__}")
    config, bwd_config = chunk_configs(call, config, bwd_config, True)
    launches, outs, _ = training_launches(call, x, config, bwd_config, output_final_state)
    return launches, outs


def chunk_dplr_bwd_launches(q, k, v, a, b, gk, *, config=None, bwd_config=None, output_final_state: bool = False,
                            do=None, dht=None, with_rerun: bool = False, **kw):
    """Describe, without running, the launches of a training step of
    :func:`kdagen.ops.dplr.chunk_dplr_delta_rule` (for compile-only checks and benchmarks of single
    kernels), as :func:`kdagen.ops.member.chunk_member_launches` does for the other members:
    ``(fwd_launches, bwd_launches, bwd_outputs)`` (:mod:`kdagen.ops.dplr_bwd`'s) -- the backward reads what the forward launches
    write (run those first); ``do``/``dht`` default to zeros; ``with_rerun``: the forward launches
    end with the backward's re-run of the intra launch when the backward config recomputes the
    intermediates.  ``kw``: scale, initial_state, cu_seqlens, safe_gate, lower_bound."""
    call, x, _ = _prepare("chunk_dplr_bwd_launches", q, k, v, a, b, gk, training=True, **kw)
    config, bwd_config = chunk_configs(call, config, bwd_config, True)
    fwd, (o, ht, hs), meta = training_launches(call, x, config, bwd_config, output_final_state)
    inputs = dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], a=x["a"], b=x["b"])
    inter = {n: fwd[0].args[n] for n in DPLR_KEPT_INTERMEDIATES}
    do = torch.zeros_like(o) if do is None else do.contiguous()
    if dht is None and output_final_state:
        dht = torch.zeros_like(ht)
    launches, outs = prepare_dplr_bwd(meta, inputs, inter, hs, fwd[1].args["vn"], do,
                                      None if dht is None else dht.contiguous(), x["initial_state"] is not None)
    if with_rerun and not meta.config.store_intermediates:
        fwd = list(fwd) + [bwd.rerun_intra_launch(meta, inputs)[0]]
    return fwd, launches, outs


def chunk_form_available() -> bool:
    """Whether this build generates general DPLR's chunk form (its chunk kernels, their tuning and
    ``chunk_dplr_delta_rule``): :func:`kdagen.codegen.forms.generates`, which ``chunk_member``,
    the CLI and the tuner ask before they reach for the chunk form of the dplr spec."""
    return generates("dplr", "chunk")


@fla_dtypes("v", ("q", "k", "v", "a", "b"))
def fused_recurrent_dplr_delta_rule(q, k, v, a, b, gk, scale: float | None = None, initial_state=None,
                                    output_final_state: bool = False, reverse: bool = False, cu_seqlens=None,
                                    **kwargs):
    """Recurrent general DPLR (decode; FLA 0.6.0's signature and semantics):
    S_t = Diag(exp gk_t) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T, o_t = S_t^T (scale q_t).

    q, k: [B, T, H, K]; v: [B, T, HV, V]; a (read), b (write), gk (log decay, not cumulated):
    [B, T, HV, K]; scale defaults to K ** -0.5; initial_state: [N, HV, K, V] (N = B, or the
    number of sequences of ``cu_seqlens``, which needs B == 1).  Returns ``(o, final_state)``,
    final_state float32 [N, HV, K, V] with ``output_final_state`` (else None).  ``reverse=True``
    walks each sequence's tokens last to first, as FLA's.  The gate is applied element-wise per
    token, so any gk works, -inf (a reset of that channel) included.

    kdagen's extras, as its other recurrent ops (:func:`kdagen.fused_recurrent_kda`):
    ``ssm_state_indices`` ([N] int: ``initial_state`` is a state pool [P, HV, K, V] whose slot
    ssm_state_indices[n] sequence n reads and writes in place; negative slots are padding),
    ``out=`` (o written there), ``state_v_first`` (states [.., V, K]), ``config``,
    ``check_inputs`` (a value check that synchronises), ``cu_seqlens_cpu``; GVA; float32 inputs.
    Nothing is read from the device, so a decode step with a device cu_seqlens and a pool can be
    captured in a CUDA graph; a decode loop's repeated geometry skips validation and planning.

    Gradients (FLA 0.6.0's op has none): when autograd is on and an input requires grad, the
    forward is the same kernel, storing nothing extra, and the backward is generated from the
    recurrent backward's DPLR template (states recomputed from checkpoints), giving the
    gradients of q, k, v, a, b, gk and initial_state; ``ssm_state_indices`` and ``out=`` are
    refused there, and ``reverse=True`` has no backward (NotImplementedError: train with
    ``chunk_dplr_delta_rule``).  The backward needs the sequence lengths on the host
    (``cu_seqlens_cpu``, else one read of cu_seqlens).  Bad inputs raise a ValueError/TypeError
    naming the argument; ``head_first`` and ``cp_context`` are refused."""
    op = "fused_recurrent_dplr_delta_rule"
    if "head_first" in kwargs:
        raise ValueError(f"{op}: head_first has been removed (as in FLA); inputs are [B, T, H, ...]")
    for name, x in (("a", a), ("b", b), ("gk", gk)):
        if x is None:
            raise ValueError(f"{op}: {name} [B, T, HV, K] is required")
    if (isinstance(q, torch.Tensor) and isinstance(v, torch.Tensor) and q.dim() == 4 and v.dim() == 4
            and isinstance(gk, torch.Tensor) and tuple(gk.shape) != (q.shape[0], q.shape[1], v.shape[2], q.shape[3])):
        B, T, _, K = q.shape
        raise ValueError(f"{op}: gk must have shape [B, T, HV, K] = {(B, T, v.shape[2], K)}, got {tuple(gk.shape)}")
    return fused_recurrent_member(dplr_spec(), q, k, v, gk, None, scale=scale, initial_state=initial_state,
                                  output_final_state=output_final_state, cu_seqlens=cu_seqlens, a=a, b=b,
                                  reverse=reverse, op=op, **kwargs)
