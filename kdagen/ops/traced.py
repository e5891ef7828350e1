"""What ``chunk_kda`` and ``fused_recurrent_kda`` do while torch.compile traces them
(``torch.compiler.is_compiling()``): Dynamo sees one op registered with torch.library per call
(:mod:`.library` registers them and fills :data:`OPS`), never kdagen's Python.

Not traced (a ValueError says so; call the op outside the compiled region for it): the gradient
of ``fused_recurrent_kda``, training on
packed sequences in ``chunk_kda`` (the per-chunk states the backward keeps have a count that
depends on the values of ``cu_seqlens``; inference on them is traced), ``return_intermediate_states`` (and
``intermediate_states_dtype``),
``config=``, a ``chunk_bwd_config`` block, and the value check (``check_inputs``).
"""
import torch

from .inputs import preprocess

NAMESPACE = __name__.split(".")[0]  # kdagen, or an exported package's name
OPS: dict = {}  # op name -> its OpOverload (filled by .library)
# chunk_kda's keywords that change nothing in what it computes, checked by the op before it routes here
CHECKED_BEFORE_ROUTING = ("cp_context", "use_graph", "max_num_seqs")


def eager_under_compile(fn):
    """``fn`` run eagerly when torch.compile traces a caller: one graph break at the call, as with
    ``torch.compiler.disable`` (for the ops with no registered torch.library op).  torch's lazy form of that
    decorator (``torch._disable_dynamo``) imports Dynamo at the first call rather than here: importing it is
    ~0.9 s, a third of ``import kdagen``, in every process that never compiles.  A torch without the lazy
    form gets the public decorator."""
    lazy = getattr(torch, "_disable_dynamo", None)
    return lazy(fn) if callable(lazy) else torch.compiler.disable(fn)


def _op(name: str):
    try:
        return OPS[name]
    except KeyError:
        raise RuntimeError(f"{NAMESPACE}: the torch.library ops are not registered; import {NAMESPACE} "
                           f"(it imports {NAMESPACE}.ops.library)") from None


def chunk_kda_traced(q, k, v, g, beta, *, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                     use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound,
                     return_intermediate_states, cu_seqlens, A_log, dt_bias, config, cu_seqlens_cpu, check_inputs,
                     chunk_size, bwd_override, state_v_first, disable_recompute, intermediate_states_dtype=None):
    """``chunk_kda`` while torch.compile traces: one registered op per call (the op has checked the
    keywords of :data:`CHECKED_BEFORE_ROUTING` and the deprecated ones).  ``bwd_override``: a
    ``chunk_bwd_config`` block is active."""
    training = torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v, g, beta, initial_state, A_log, dt_bias))
    for name, given in (("training on packed sequences (cu_seqlens)", training and cu_seqlens is not None),
                        ("return_intermediate_states", bool(return_intermediate_states)),
                        ("intermediate_states_dtype", intermediate_states_dtype is not None),
                        ("config", config is not None), ("check_inputs", bool(check_inputs)),
                        ("a chunk_bwd_config block", bool(bwd_override))):
        if given:
            raise ValueError(f"chunk_kda under torch.compile: {name} is not supported; call chunk_kda outside "
                             "the compiled region (torch.compiler.disable) for it")
    if cu_seqlens_cpu is not None and not isinstance(cu_seqlens_cpu, torch.Tensor):
        cu_seqlens_cpu = torch.tensor(cu_seqlens_cpu, dtype=torch.int64)
    if training:
        if use_qk_l2norm_in_kernel:  # the eager call's l2-norm launches, in an op of their own
            q, k = _op("chunk_kda_l2norm")(q, k, v, g, beta, initial_state, A_log, dt_bias, scale, use_gate_in_kernel,
                                         safe_gate, lower_bound, chunk_size, state_v_first, disable_recompute)[:2]
        q, k, beta = preprocess(q, k, beta, False, use_beta_sigmoid_in_kernel, allow_neg_eigval)
        out = _op("chunk_kda_train")(q, k, v, g, beta, initial_state, A_log, dt_bias, scale, output_final_state,
                                  use_gate_in_kernel, safe_gate, lower_bound, chunk_size, state_v_first,
                                  disable_recompute)
        o, ht = out[0], out[1]
    else:
        o, ht = _op("chunk_kda_infer")(q, k, v, g, beta, initial_state, A_log, dt_bias, scale, output_final_state,
                                    use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
                                    allow_neg_eigval, safe_gate, lower_bound, chunk_size, cu_seqlens, cu_seqlens_cpu,
                                    state_v_first)
    return o, (ht if output_final_state else None)


def fused_recurrent_kda_traced(q, k, v, g, beta, *, A_log, dt_bias, scale, initial_state, output_final_state,
                               use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
                               allow_neg_eigval, lower_bound, cu_seqlens, ssm_state_indices, out, config,
                               check_inputs, state_v_first, cu_seqlens_cpu, num_accepted_tokens=None):
    """``fused_recurrent_kda`` while torch.compile traces: one registered op per call (decode;
    ``cu_seqlens_cpu`` only serves the backward, which is not traced)."""
    training = torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v, g, beta, initial_state, A_log, dt_bias))
    for name, given in (("config", config is not None), ("check_inputs", bool(check_inputs)),
                        ("its gradient (inputs that require grad)", training)):
        if given:
            raise ValueError(f"fused_recurrent_kda under torch.compile: {name} is not supported; call it outside "
                             "the compiled region (torch.compiler.disable) for it")
    o, ht = _op("fused_recurrent_kda")(
        q, k, v, g, beta, A_log, dt_bias, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
        use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, cu_seqlens,
        ssm_state_indices, out, state_v_first, num_accepted_tokens)
    if out is not None:
        o = out
    if ssm_state_indices is not None:
        return o, initial_state
    return o, (ht if output_final_state else None)


