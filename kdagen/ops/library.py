"""The public ops as ``torch.library`` custom ops, so that ``torch.compile(fullgraph=True)``
traces a model that calls them: Dynamo sees one opaque op per call (with a fake
implementation for shapes) instead of kdagen's Python (validation, look-ups, launch code).

Eager calls do not come here: ``chunk_kda`` and ``fused_recurrent_kda`` route to
:mod:`.traced`, which calls these ops (from its registry, :data:`.traced.OPS`, filled here),
only while ``torch.compiler.is_compiling()``, so decode's eager latency has no dispatcher in it.
Importing kdagen imports this module.

Why ``custom_op`` and not ``triton_op`` + ``wrap_triton``: ``triton_op`` needs the op's body to
be traceable on fake tensors down to the kernel launches.  Ours is not: the configs come from
look-ups keyed by the GPU and by shape buckets, the launch layer keeps per-device dummy
pointers and per-geometry fast paths, and packed sequences build their chunk schedule from
the values of ``cu_seqlens`` on the host.  An opaque op runs exactly the eager code, so a
compiled model gets the very kernels (and bits) of an eager one.

The ops (namespace: the top-level package, ``kdagen`` here, the package's name in an export):

- ``chunk_kda_infer``: the inference forward (no autograd).
- ``chunk_kda_train``: the training forward; returns o, the final state and what the backward
  reads (the per-chunk states, V' and, when the config stores them, the intra intermediates).
  Its autograd formula calls ``chunk_kda_bwd``.
- ``chunk_kda_l2norm``: a training call's l2-norm of q and k (``use_qk_l2norm_in_kernel``), the
  eager call's launches; its autograd formula calls ``chunk_kda_l2norm_bwd``.
- ``fused_recurrent_kda``: decode; mutates a state pool (``ssm_state_indices``) and ``out``.

What a compiled call cannot do is in :mod:`.traced`.
"""
import dataclasses
from typing import Optional

import torch
from torch import Tensor

from ..cache.lookup import resolve
from ..kernels import _DUMMY, build, dummy_pointer
from . import chunk_bwd as B
from .chunk import chunk_kda, prepare_kda
from .chunk_call import chunk_configs, training_launches
from .l2norm import normalise, normalise_bwd
from .inputs import state_shape
from .recurrent import fused_recurrent_kda
from .traced import NAMESPACE, OPS

_EMPTY = (0,)
_N_SAVED = 7  # hs, vn, qg, kg, w, aqk, gn


def _empty(x: Tensor) -> Tensor:
    return x.new_empty(_EMPTY, dtype=torch.float32)


def _keep_dummies(fn):
    """Run ``fn`` (a fake implementation, which runs kdagen's preparation on fake tensors)
    without letting it store a fake dummy pointer for the eager launches."""
    def wrapped(*args, **kwargs):
        saved = dict(_DUMMY)
        try:
            return fn(*args, **kwargs)
        finally:
            _DUMMY.clear()
            _DUMMY.update(saved)
    return wrapped


# --- chunk_kda: inference ---------------------------------------------------------------

@torch.library.custom_op(f"{NAMESPACE}::chunk_kda_infer", mutates_args=())
def chunk_kda_infer(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, initial_state: Optional[Tensor],
                    A_log: Optional[Tensor], dt_bias: Optional[Tensor], scale: Optional[float],
                    output_final_state: bool, use_qk_l2norm_in_kernel: bool, use_gate_in_kernel: bool,
                    use_beta_sigmoid_in_kernel: bool, allow_neg_eigval: bool, safe_gate: bool,
                    lower_bound: Optional[float], chunk_size: Optional[int], cu_seqlens: Optional[Tensor],
                    cu_seqlens_cpu: Optional[Tensor], state_v_first: bool) -> tuple[Tensor, Tensor]:
    with torch.no_grad():
        o, ht = chunk_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                          output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                          use_gate_in_kernel=use_gate_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                          allow_neg_eigval=allow_neg_eigval, safe_gate=safe_gate, lower_bound=lower_bound,
                          A_log=A_log, dt_bias=dt_bias, chunk_size=chunk_size, cu_seqlens=cu_seqlens,
                          cu_seqlens_cpu=cu_seqlens_cpu, state_v_first=state_v_first)
    return o, (ht if ht is not None else _empty(q))


@chunk_kda_infer.register_fake
def _(q, k, v, g, beta, initial_state, A_log, dt_bias, scale, output_final_state, use_qk_l2norm_in_kernel,
      use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound, chunk_size,
      cu_seqlens, cu_seqlens_cpu, state_v_first):
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    o = v.new_empty(v.shape)
    N = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else B
    ht = q.new_empty(state_shape(N, HV, K, V, state_v_first), dtype=torch.float32) if output_final_state else _empty(q)
    return o, ht


# --- chunk_kda: training forward and backward -------------------------------------------

def _training_call(q, k, v, g, beta, initial_state, A_log, dt_bias, scale, use_gate_in_kernel, safe_gate,
                   lower_bound, chunk_size, state_v_first, disable_recompute):
    """The validated call and its configs, resolved as an eager training call resolves them
    (without a ``chunk_bwd_config`` block, which :func:`.traced.chunk_kda_traced` refuses)."""
    call, x = prepare_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state, A_log=A_log, dt_bias=dt_bias,
                       use_gate_in_kernel=use_gate_in_kernel, safe_gate=safe_gate, lower_bound=lower_bound,
                       in_kernel=False, state_v_first=state_v_first)
    bwd = resolve("chunk_bwd", call.plan, None, call.shape, call.state_dtype)
    train, bwd = chunk_configs(call, None, bwd, True, chunk_size, disable_recompute)
    return call, x, train, bwd


# chunk_kda_train's outputs after (o, final state, hs, vn): every tensor the backward may read (empty
# where the backward config does not keep it)
_TRAIN_SAVED = B.KEPT_INTERMEDIATES + ("td",)


def _train_outputs(q, k, v, g, beta, initial_state, A_log, dt_bias, scale, output_final_state, use_gate_in_kernel,
                   safe_gate, lower_bound, chunk_size, state_v_first, disable_recompute, run: bool):
    call, x, train, bwd = _training_call(q, k, v, g, beta, initial_state, A_log, dt_bias, scale, use_gate_in_kernel,
                                         safe_gate, lower_bound, chunk_size, state_v_first, disable_recompute)
    launches, (o, ht, hs), _ = training_launches(call, x, train, bwd, output_final_state)
    if run:
        for launch in launches:
            launch()
    a = launches[0].args
    vn = launches[1].args["vn"]
    # what the backward reads: the kept intermediates, or in recompute mode A_qk and T (td)
    kept = B.saved_names(call.plan, bwd)
    inter = [a[n] if n in kept else _empty(q) for n in _TRAIN_SAVED]
    return (o, ht if ht is not None else _empty(q), hs, vn, *inter)


@torch.library.custom_op(f"{NAMESPACE}::chunk_kda_train", mutates_args=())
def chunk_kda_train(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, initial_state: Optional[Tensor],
                    A_log: Optional[Tensor], dt_bias: Optional[Tensor], scale: Optional[float],
                    output_final_state: bool, use_gate_in_kernel: bool, safe_gate: bool, lower_bound: Optional[float],
                    chunk_size: Optional[int], state_v_first: bool,
                    disable_recompute: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                                                        Tensor, Tensor, Tensor]:
    """(o, final state or empty, then what the backward reads: hs, vn, qg, kg, w, aqk, gn, td --
    qg, kg, w and gn empty unless the backward's config stores them, td (T) only in recompute mode)."""
    return _train_outputs(q, k, v, g, beta, initial_state, A_log, dt_bias, scale, output_final_state,
                          use_gate_in_kernel, safe_gate, lower_bound, chunk_size, state_v_first, disable_recompute,
                          run=True)


@chunk_kda_train.register_fake
@_keep_dummies
def _(q, k, v, g, beta, initial_state, A_log, dt_bias, scale, output_final_state, use_gate_in_kernel, safe_gate,
      lower_bound, chunk_size, state_v_first, disable_recompute):
    # kdagen's own preparation on fake tensors: the configs (hence the chunk count and the
    # stored dtypes) are those the op will run.  The configs are chosen per head dim and shape
    # bucket, so the shapes are specialised (int() guards a symbolic one).
    xs = [None if t is None else t.new_empty([int(s) for s in t.shape])
          for t in (q, k, v, g, beta, initial_state, A_log, dt_bias)]
    return _train_outputs(*xs, scale, output_final_state, use_gate_in_kernel, safe_gate, lower_bound, chunk_size,
                          state_v_first, disable_recompute, run=False)


@torch.library.custom_op(f"{NAMESPACE}::chunk_kda_bwd", mutates_args=())
def chunk_kda_bwd(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, initial_state: Optional[Tensor],
                  A_log: Optional[Tensor], dt_bias: Optional[Tensor], saved: list[Tensor], do: Tensor,
                  dht: Optional[Tensor], scale: Optional[float], output_final_state: bool, use_gate_in_kernel: bool,
                  safe_gate: bool, lower_bound: Optional[float], chunk_size: Optional[int], state_v_first: bool,
                  disable_recompute: bool, needs: list[bool]) -> list[Tensor]:
    """The gradients of (q, k, v, g, beta, initial_state, A_log, dt_bias), empty where not needed."""
    call, x, train, bwd = _training_call(q, k, v, g, beta, initial_state, A_log, dt_bias, scale, use_gate_in_kernel,
                                         safe_gate, lower_bound, chunk_size, state_v_first, disable_recompute)
    meta = _backward_meta(call, x, train, bwd, output_final_state)
    hs, vn = saved[0], saved[1]
    full = [x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state, x["A_log"], x["dt_bias"], hs, vn]
    named = dict(zip(_TRAIN_SAVED, saved[2:]))
    full += [named[n] for n in B.saved_names(call.plan, bwd)]
    like = {n: None if t is None else (t.shape, t.dtype) for n, t in x.items()}
    grads = B.backward(meta, full, like, tuple(needs), do, dht)
    return [gr if gr is not None else _empty(q) for gr in grads]


def _backward_meta(call, x, train, bwd, output_final_state):
    """The backward's description of the forward's chunks (:class:`.chunk_bwd.BwdMeta`), from the
    forward's launches described on the meta device: nothing is allocated or run.  (A batch of
    equal-length sequences: the only pointers the description keeps are dummies, put back here
    on the inputs' device.)"""
    _, _, meta = training_launches(call, {n: None if t is None else t.to("meta") for n, t in x.items()}, train, bwd,
                                    output_final_state)
    dummy = dummy_pointer(x["q"].device)

    def real(a):
        return dummy if isinstance(a, Tensor) and a.is_meta else a

    fi = meta.fwd_intra
    return dataclasses.replace(meta, cu_seqlens=real(meta.cu_seqlens), chunk_indices=real(meta.chunk_indices),
                               chunk_offsets=real(meta.chunk_offsets),
                               fwd_intra=dataclasses.replace(fi, args={n: real(a) for n, a in fi.args.items()}))


@chunk_kda_bwd.register_fake
def _(q, k, v, g, beta, initial_state, A_log, dt_bias, saved, do, dht, scale, output_final_state, use_gate_in_kernel,
      safe_gate, lower_bound, chunk_size, state_v_first, disable_recompute, needs):
    xs = (q, k, v, g, beta, initial_state, A_log, dt_bias)
    return [torch.empty_like(x, memory_format=torch.contiguous_format) if need and x is not None else _empty(q)
            for x, need in zip(xs, needs)]


_TRAIN_ARGS = ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias", "scale", "output_final_state",
               "use_gate_in_kernel", "safe_gate", "lower_bound", "chunk_size", "state_v_first", "disable_recompute")


def _setup_context(ctx, inputs, output):
    args = dict(zip(_TRAIN_ARGS, inputs))
    ctx.save_for_backward(*(args[n] for n in _TRAIN_ARGS[:8] if args[n] is not None), *output[2:])
    ctx.present = tuple(args[n] is not None for n in _TRAIN_ARGS[:8])
    ctx.flags = {n: args[n] for n in _TRAIN_ARGS[8:]}
    ctx.mark_non_differentiable(*output[2:])


def _backward(ctx, do, dht, *_):
    saved = list(ctx.saved_tensors)
    xs = [saved.pop(0) if p else None for p in ctx.present]
    needs = [bool(n) and p for n, p in zip(ctx.needs_input_grad[:8], ctx.present)]
    f = ctx.flags
    grads = chunk_kda_bwd._opoverload(
        *xs, saved, do, dht if f["output_final_state"] else None, f["scale"], f["output_final_state"],
        f["use_gate_in_kernel"], f["safe_gate"], f["lower_bound"], f["chunk_size"], f["state_v_first"],
        f["disable_recompute"], needs)
    return tuple(gr if n else None for gr, n in zip(grads, needs)) + (None,) * (len(_TRAIN_ARGS) - 8)


chunk_kda_train.register_autograd(_backward, setup_context=_setup_context)


# --- chunk_kda: a training call's l2-norm of q and k (use_qk_l2norm_in_kernel) -------------
# The eager call's launches (kdagen.ops.l2norm), from the kernels of the call's own plan and configs:
# the same bits compiled or not.  The other inputs only resolve the plan (not differentiated here).

def _l2norm_kernels(q, k, v, g, beta, initial_state, A_log, dt_bias, scale, use_gate_in_kernel, safe_gate,
                    lower_bound, chunk_size, state_v_first, disable_recompute):
    call, _, train, bwd = _training_call(q, k, v, g, beta, initial_state, A_log, dt_bias, scale, use_gate_in_kernel,
                                         safe_gate, lower_bound, chunk_size, state_v_first, disable_recompute)
    return build(call.plan, train).fn("qk_l2norm"), build(call.plan, bwd).fn("qk_l2norm_bwd")


@torch.library.custom_op(f"{NAMESPACE}::chunk_kda_l2norm", mutates_args=())
def chunk_kda_l2norm(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, initial_state: Optional[Tensor],
                     A_log: Optional[Tensor], dt_bias: Optional[Tensor], scale: Optional[float],
                     use_gate_in_kernel: bool, safe_gate: bool, lower_bound: Optional[float],
                     chunk_size: Optional[int], state_v_first: bool,
                     disable_recompute: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(q / |q|, k / |k|, and each row's 1 / |x| of q and of k, float32, for the backward)."""
    fwd, _ = _l2norm_kernels(q, k, v, g, beta, initial_state, A_log, dt_bias, scale, use_gate_in_kernel, safe_gate,
                             lower_bound, chunk_size, state_v_first, disable_recompute)
    return normalise(q.contiguous(), k.contiguous(), fwd)


@chunk_kda_l2norm.register_fake
def _(q, k, v, g, beta, initial_state, A_log, dt_bias, scale, use_gate_in_kernel, safe_gate, lower_bound,
      chunk_size, state_v_first, disable_recompute):
    rows = q.numel() // q.shape[-1]
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            q.new_empty((rows,), dtype=torch.float32), q.new_empty((rows,), dtype=torch.float32))


@torch.library.custom_op(f"{NAMESPACE}::chunk_kda_l2norm_bwd", mutates_args=())
def chunk_kda_l2norm_bwd(q: Tensor, k: Tensor, rq: Tensor, rk: Tensor, dqn: Tensor, dkn: Tensor, v: Tensor, g: Tensor,
                         beta: Tensor, initial_state: Optional[Tensor], A_log: Optional[Tensor],
                         dt_bias: Optional[Tensor], scale: Optional[float], use_gate_in_kernel: bool, safe_gate: bool,
                         lower_bound: Optional[float], chunk_size: Optional[int], state_v_first: bool,
                         disable_recompute: bool) -> tuple[Tensor, Tensor]:
    _, bwd = _l2norm_kernels(q, k, v, g, beta, initial_state, A_log, dt_bias, scale, use_gate_in_kernel, safe_gate,
                             lower_bound, chunk_size, state_v_first, disable_recompute)
    return normalise_bwd(q.contiguous(), k.contiguous(), rq, rk, dqn, dkn, bwd)


@chunk_kda_l2norm_bwd.register_fake
def _(q, k, rq, rk, dqn, dkn, v, g, beta, initial_state, A_log, dt_bias, scale, use_gate_in_kernel, safe_gate,
      lower_bound, chunk_size, state_v_first, disable_recompute):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format))


_L2NORM_ARGS = ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias", "scale", "use_gate_in_kernel",
                "safe_gate", "lower_bound", "chunk_size", "state_v_first", "disable_recompute")


def _l2norm_setup_context(ctx, inputs, output):
    args = dict(zip(_L2NORM_ARGS, inputs))
    rest = ("v", "g", "beta", "initial_state", "A_log", "dt_bias")
    ctx.present = tuple(args[n] is not None for n in rest)
    ctx.save_for_backward(args["q"], args["k"], output[2], output[3], *(args[n] for n in rest if args[n] is not None))
    ctx.flags = tuple(args[n] for n in _L2NORM_ARGS[8:])
    ctx.mark_non_differentiable(output[2], output[3])


def _l2norm_backward(ctx, dqn, dkn, *_):
    q, k, rq, rk, *saved = ctx.saved_tensors
    rest = [saved.pop(0) if p else None for p in ctx.present]
    dq, dk = chunk_kda_l2norm_bwd._opoverload(q, k, rq, rk, dqn, dkn, *rest, *ctx.flags)
    return (dq if ctx.needs_input_grad[0] else None, dk if ctx.needs_input_grad[1] else None) + \
        (None,) * (len(_L2NORM_ARGS) - 2)


chunk_kda_l2norm.register_autograd(_l2norm_backward, setup_context=_l2norm_setup_context)


# --- fused_recurrent_kda ----------------------------------------------------------------

@torch.library.custom_op(f"{NAMESPACE}::fused_recurrent_kda", mutates_args=("initial_state", "out"))
def fused_recurrent_kda_op(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, A_log: Optional[Tensor],
                           dt_bias: Optional[Tensor], scale: Optional[float], initial_state: Optional[Tensor],
                           output_final_state: bool, use_qk_l2norm_in_kernel: bool, use_gate_in_kernel: bool,
                           use_beta_sigmoid_in_kernel: bool, allow_neg_eigval: bool, lower_bound: Optional[float],
                           cu_seqlens: Optional[Tensor], ssm_state_indices: Optional[Tensor],
                           out: Optional[Tensor], state_v_first: bool,
                           num_accepted_tokens: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """(o, or empty when written to ``out``; the new final state, or empty when there is none or
    it is the pool, updated in place)."""
    o, ht = fused_recurrent_kda(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, scale=scale,
                                initial_state=initial_state, output_final_state=output_final_state,
                                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_gate_in_kernel=use_gate_in_kernel,
                                use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
                                lower_bound=lower_bound, cu_seqlens=cu_seqlens, ssm_state_indices=ssm_state_indices,
                                out=out, state_v_first=state_v_first, num_accepted_tokens=num_accepted_tokens)
    return (_empty(q) if out is not None else o), (ht if ht is not None and ssm_state_indices is None else _empty(q))


@fused_recurrent_kda_op.register_fake
def _(q, k, v, g, beta, A_log, dt_bias, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
      use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, cu_seqlens, ssm_state_indices,
      out, state_v_first, num_accepted_tokens=None):
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    N = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else B
    o = _empty(q) if out is not None else v.new_empty(v.shape)
    new_state = output_final_state and ssm_state_indices is None
    return o, (q.new_empty(state_shape(N, HV, K, V, state_v_first), dtype=torch.float32) if new_state else _empty(q))


OPS.update(chunk_kda_infer=chunk_kda_infer._opoverload, chunk_kda_train=chunk_kda_train._opoverload,
           chunk_kda_l2norm=chunk_kda_l2norm._opoverload,
           fused_recurrent_kda=fused_recurrent_kda_op._opoverload)
