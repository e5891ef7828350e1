"""Drop-in: every keyword of flash-linear-attention 0.6.0's ``chunk_kda`` and
``fused_recurrent_kda`` is honoured, ignored on purpose, or refused with a clear error -- never
an unexpected-keyword TypeError (chunk_size and cu_seqlens_cpu have their own tests in
test_ops_chunk.py; the recurrent backward in test_ops_recurrent_bwd.py).

Interpreter, fp32 (exact dots) and fp16; small shapes.
"""
from __future__ import annotations

import inspect
import warnings

import pytest
import torch

from cases import make_inputs
from conftest import F64, TOL, assert_close, cdiv

import kdagen
from kdagen.spec.reference import naive_recurrent_kda

# FLA 0.6.0's signatures, positional order (fla/ops/kda/chunk.py, fla/ops/kda/fused_recurrent.py)
FLA_CHUNK = ("q", "k", "v", "g", "beta", "scale", "initial_state", "output_final_state", "use_qk_l2norm_in_kernel",
             "use_gate_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval", "safe_gate", "lower_bound",
             "disable_recompute", "return_intermediate_states", "state_v_first", "cu_seqlens", "cu_seqlens_cpu",
             "cp_context", "use_graph", "max_num_seqs")
FLA_CHUNK_KWARGS = ("A_log", "dt_bias", "chunk_size")  # read from **kwargs by FLA (and transpose_state_layout)
FLA_RECURRENT = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "scale", "initial_state", "output_final_state",
                 "use_qk_l2norm_in_kernel", "use_gate_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval",
                 "lower_bound", "state_v_first", "cu_seqlens")


def test_signatures_take_fla_arguments_in_fla_positions():
    for fn, names, extra in ((kdagen.chunk_kda, FLA_CHUNK, FLA_CHUNK_KWARGS),
                             (kdagen.fused_recurrent_kda, FLA_RECURRENT, ())):
        params = list(inspect.signature(fn).parameters)
        assert tuple(params[:len(names)]) == names, fn.__name__
        assert set(extra) <= set(params), fn.__name__


def _t(x):  # the V-first layout of [.., K, V] states
    return x.transpose(-1, -2).contiguous()


# ------------------------------------------------------------------ state_v_first: chunk_kda


@pytest.mark.parametrize("cu", [None, [0, 1, 30, 70]], ids=["B2-fixed", "varlen-len1"])
def test_chunk_state_v_first_is_the_k_first_state_transposed(cu):
    """Inference: the V-first call's final and intermediate states are the K-first call's,
    transposed, bit for bit (the same arithmetic, other addresses); o is identical.  The first
    intermediate state of each sequence is its initial state."""
    B = 1 if cu else 2
    x = make_inputs(B, cu[-1] if cu else 45, 1, 2, 32, 48, seed=3, cu_seqlens=cu)
    kw = dict(output_final_state=True, return_intermediate_states=True, cu_seqlens=x.cu_seqlens, chunk_size=32)
    o, ht, hs = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, **kw)
    o2, ht2, hs2 = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=_t(x.h0), state_v_first=True, **kw)
    assert ht2.shape == (x.h0.shape[0], 2, 48, 32) and hs2.shape == hs.shape[:-2] + (48, 32)
    assert torch.equal(o, o2) and torch.equal(_t(ht), ht2) and torch.equal(_t(hs), hs2)
    assert torch.equal(hs2[0, 0], _t(x.h0[0]))
    q, k, v, g, beta = x.ref_args()
    _, rh = naive_recurrent_kda(q, k, v, g, beta, initial_state=x.h0.to(F64), output_final_state=True,
                                cu_seqlens=x.cu_seqlens)
    assert_close(ht2, _t(rh), TOL[torch.float32], "V-first final state")


def test_chunk_state_v_first_training():
    """Training: the V-first initial state's gradient is the K-first one's, transposed (the
    training forward and the backward's state pass address the caller's layout), fp16 inputs."""
    x = make_inputs(1, 40, 1, 2, 32, 32, dtype=torch.float16, seed=6)
    leaves = dict(q=x.q, k=x.k, v=x.v, g=x.g, beta=x.beta)
    grads = []
    for v_first in (False, True):
        a = {n: t.clone().requires_grad_(True) for n, t in leaves.items()}
        h0 = (_t(x.h0) if v_first else x.h0.clone()).requires_grad_(True)
        o, ht = kdagen.chunk_kda(**a, initial_state=h0, output_final_state=True, state_v_first=v_first,
                                 safe_gate=True, lower_bound=-5.0)
        dht = torch.ones(2, 32, 32).tril()  # not symmetric: a layout slip shows
        (o.float().sum() + (ht * (_t(dht) if v_first else dht)).sum()).backward()
        grads.append([a[n].grad for n in leaves] + [_t(h0.grad) if v_first else h0.grad,
                                                     _t(ht) if v_first else ht, o])
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_transpose_state_layout_is_fla_deprecated_alias():
    x = make_inputs(1, 20, 1, 1, 16, 16, seed=1)
    with pytest.warns(DeprecationWarning, match="transpose_state_layout"):
        _, ht = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=_t(x.h0), output_final_state=True,
                                 transpose_state_layout=True)
    _, ref = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=_t(x.h0), output_final_state=True,
                              state_v_first=True)
    assert torch.equal(ht, ref)
    with pytest.warns(DeprecationWarning):
        _, ht = kdagen.fused_recurrent_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=_t(x.h0),
                                           output_final_state=True, transpose_state_layout=True)
    assert_close(ht, ref, TOL[torch.float32], "recurrent, transpose_state_layout")
    for op in (kdagen.chunk_kda, kdagen.fused_recurrent_kda):
        with pytest.raises(ValueError, match="both"):
            op(x.q, x.k, x.v, x.g, x.beta, state_v_first=True, transpose_state_layout=True)


def test_state_v_first_checks_the_initial_state_shape(no_launch):
    x = make_inputs(1, 8, 1, 1, 16, 32, seed=1)  # K=16, V=32: the layouts have different shapes
    for op in (kdagen.chunk_kda, kdagen.fused_recurrent_kda):
        with pytest.raises(ValueError, match=r"\[N, HV, V, K\].*state_v_first"):
            op(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, state_v_first=True)
        with pytest.raises(ValueError, match=r"\[N, HV, K, V\]"):
            op(x.q, x.k, x.v, x.g, x.beta, initial_state=_t(x.h0))
        with pytest.raises(TypeError, match="state_v_first must be a bool"):
            op(x.q, x.k, x.v, x.g, x.beta, state_v_first="yes")
    assert not no_launch


# ------------------------------------------------------------------ state_v_first: serving round trip


def test_state_v_first_round_trip_prefill_pool_decode():
    """Prefill two packed prompts with chunk_kda (V-first final states), put them into slots of a
    V-first state pool, decode three tokens with fused_recurrent_kda updating the pool in place
    (slot -1 is padding): the outputs and the pool equal the K-first path's (transposed), and the
    float64 recurrence's."""
    HV, K, V = 2, 16, 32
    prompts, steps = [23, 9], 3
    gen = torch.Generator().manual_seed(11)
    T = sum(prompts) + 2 * steps
    x = make_inputs(1, T, 1, HV, K, V, seed=12, h0=False)
    cu = torch.tensor([0, prompts[0], sum(prompts)])
    pre = slice(0, sum(prompts))
    slots = torch.tensor([3, 0], dtype=torch.int32)
    results = {}
    for v_first in (False, True):
        def view(t):
            return t[:, pre]
        o_pre, ht = kdagen.chunk_kda(view(x.q), view(x.k), view(x.v), view(x.g), view(x.beta), cu_seqlens=cu,
                                     output_final_state=True, state_v_first=v_first)
        pool = torch.randn((4, HV, V, K) if v_first else (4, HV, K, V), generator=gen)
        pool[slots.long()] = ht
        outs = [o_pre]
        for s in range(steps):
            t0 = sum(prompts) + 2 * s
            sl = slice(t0, t0 + 2)
            idx = torch.tensor([3, -1, 0], dtype=torch.int32) if s == 1 else slots
            cu_d = torch.tensor([0, 1, 1, 2]) if s == 1 else torch.tensor([0, 1, 2])
            o, _ = kdagen.fused_recurrent_kda(x.q[:, sl], x.k[:, sl], x.v[:, sl], x.g[:, sl], x.beta[:, sl],
                                              initial_state=pool, ssm_state_indices=idx, cu_seqlens=cu_d,
                                              state_v_first=v_first)
            outs.append(o)
        results[v_first] = (torch.cat(outs, 1), pool[slots.long()])
    (o_k, s_k), (o_v, s_v) = results[False], results[True]
    assert torch.equal(o_k, o_v)
    assert_close(s_v, _t(s_k), TOL[torch.float32], "V-first pool slots vs K-first")
    # the float64 recurrence of each sequence: its prompt, then its decode tokens
    q, k, v, g, beta = x.ref_args()
    for n in range(2):
        a, b = (0, prompts[0]) if n == 0 else (prompts[0], sum(prompts))
        idx = torch.tensor(list(range(a, b)) + [sum(prompts) + 2 * s + n for s in range(steps)])
        ro, rh = naive_recurrent_kda(*(t[:, idx] for t in (q, k, v, g, beta)), output_final_state=True)
        assert_close(o_v[:, idx], ro, TOL[torch.float32], f"sequence {n}: o")
        assert_close(s_v[n], _t(rh[0]), TOL[torch.float32], f"sequence {n}: its V-first pool slot")


# ------------------------------------------------------------------ return_intermediate_states


def test_intermediate_states_in_fla_layout_for_a_batch():
    """B=2 fixed length: [B, NT, HV, K, V], batch-major, each the state entering its chunk."""
    B, T, C = 2, 45, 32
    x = make_inputs(B, T, 1, 2, 16, 16, seed=8)
    _, _, hs = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, return_intermediate_states=True,
                                chunk_size=C)
    assert hs.shape == (B, cdiv(T, C), 2, 16, 16) and hs.dtype == torch.float32
    q, k, v, g, beta = x.ref_args()
    for b in range(B):
        assert torch.equal(hs[b, 0], x.h0[b])
        sl = slice(b, b + 1)
        _, rh = naive_recurrent_kda(q[sl, :C], k[sl, :C], v[sl, :C], g[sl, :C], beta[sl, :C],
                                    initial_state=x.h0[sl].to(F64), output_final_state=True)
        assert_close(hs[b, 1], rh[0], TOL[torch.float32], f"batch {b}: state entering chunk 1")


@pytest.mark.parametrize("op", ["kda", "gdn"])
def test_intermediate_states_come_in_the_inputs_dtype_as_flas(op):
    """FLA returns the per-chunk states in the inputs' dtype (its test_chunk_return_intermediate_states):
    so does kdagen, by default -- the float32 states the kernels write, rounded once; with
    intermediate_states_dtype=torch.float32 they come unrounded."""
    x = make_inputs(1, 70, 1, 1, 16, 16, seed=9, dtype=torch.float16)
    if op == "kda":
        call = lambda **kw: kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0,  # noqa: E731
                                             return_intermediate_states=True, chunk_size=32, **kw)
    else:
        g = x.g[..., 0].contiguous()
        call = lambda **kw: kdagen.chunk_gated_delta_rule(x.q, x.k, x.v, g, x.beta, initial_state=x.h0,  # noqa: E731
                                                          return_intermediate_states=True, chunk_size=32, **kw)
    _, _, h = call()
    _, _, h32 = call(intermediate_states_dtype=torch.float32)
    assert h.dtype == torch.float16 and h32.dtype == torch.float32 and h.shape == h32.shape == (1, 3, 1, 16, 16)
    assert torch.equal(h, h32.to(torch.float16)) and not torch.equal(h32, h32.to(torch.float16).float())


# ------------------------------------------------------------------ the other keywords


def test_disable_recompute_keeps_the_intermediates():
    """disable_recompute=True: the backward reads the forward's intermediates (saved on the
    graph) instead of re-running the intra launch; the gradients are the same."""
    x = make_inputs(1, 40, 1, 1, 16, 16, seed=9)
    runs = []
    for flag in (False, True):
        a = {n: t.clone().requires_grad_(True) for n, t in dict(q=x.q, k=x.k, v=x.v, g=x.g, beta=x.beta).items()}
        o, _ = kdagen.chunk_kda(**a, initial_state=x.h0, safe_gate=True, lower_bound=-5.0, disable_recompute=flag)
        saved = len(o.grad_fn.saved_tensors)
        o.sum().backward()
        runs.append((saved, [t.grad for t in a.values()]))
    (n_default, g_default), (n_kept, g_kept) = runs
    assert n_kept > n_default  # the intermediates are on the graph
    for a, b in zip(g_default, g_kept):
        assert torch.equal(a, b)
    with torch.no_grad():  # no effect without a gradient
        o1, _ = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, disable_recompute=True)
        o2, _ = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta)
    assert torch.equal(o1, o2)


def test_cp_context_is_refused_and_num_accepted_tokens_needs_slot_rows(no_launch):
    """cp_context must be None; num_accepted_tokens (speculative decoding) needs a 2-D ssm_state_indices
    (a pool slot per token) and is refused without one, before any launch."""
    x = make_inputs(1, 8, 1, 1, 16, 16, seed=1)
    for op in (kdagen.chunk_kda, kdagen.fused_recurrent_kda):
        with pytest.raises(ValueError, match="cp_context"):
            op(x.q, x.k, x.v, x.g, x.beta, cp_context=object())
    with pytest.raises(ValueError, match="num_accepted_tokens"):
        kdagen.fused_recurrent_kda(x.q, x.k, x.v, x.g, x.beta, num_accepted_tokens=torch.ones(1, dtype=torch.int32))
    assert not no_launch


def test_speculative_decoding_keywords_as_vllm_passes_them():
    """FLA's fused_recurrent_kda_fwd keywords, as vLLM calls it: a 2-D ssm_state_indices, num_accepted_tokens
    and inplace_final_state=True (the pool updated in place) give the call without inplace_final_state, bit
    for bit; inplace_final_state=True without a pool would write over initial_state in FLA, and is refused."""
    x = make_inputs(1, 5, 1, 1, 16, 16, seed=4, cu_seqlens=[0, 3, 5])
    rows = torch.tensor([[0, 1, 2], [3, 4, -1]], dtype=torch.int32)
    acc = torch.tensor([3, 2], dtype=torch.int32)
    pool0 = torch.randn(5, 1, 16, 16, generator=torch.Generator().manual_seed(4))
    res = []
    for extra in ({}, dict(inplace_final_state=True)):
        pool = pool0.clone()
        o, ht = kdagen.fused_recurrent_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=pool, cu_seqlens=x.cu_seqlens,
                                           ssm_state_indices=rows, num_accepted_tokens=acc, **extra)
        assert ht is pool
        res.append((o, pool))
    assert torch.equal(res[0][0], res[1][0]) and torch.equal(res[0][1], res[1][1])
    with pytest.raises(ValueError, match="inplace_final_state=True without ssm_state_indices"):
        kdagen.fused_recurrent_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=pool0[:2], cu_seqlens=x.cu_seqlens,
                                   inplace_final_state=True)


def test_use_graph_and_max_num_seqs():
    """use_graph=True: fixed-length calls are unchanged; with cu_seqlens an inference call gives
    the same answer (its schedule built on the device: tests/chunk/test_schedule.py) and a training
    call is refused (its backward needs the host's lengths).  max_num_seqs is checked, not used."""
    x = make_inputs(1, 20, 1, 1, 16, 16, seed=2, cu_seqlens=[0, 7, 20])
    ref = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta)
    got = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, use_graph=True, max_num_seqs=4)
    assert torch.equal(ref[0], got[0])
    packed = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, cu_seqlens=x.cu_seqlens)
    graph = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, cu_seqlens=x.cu_seqlens, use_graph=True)
    assert torch.equal(packed[0], graph[0])
    with pytest.raises(ValueError, match="use_graph=True with cu_seqlens is not supported for a training call"):
        kdagen.chunk_kda(x.q, x.k.clone().requires_grad_(), x.v, x.g, x.beta, cu_seqlens=x.cu_seqlens,
                         use_graph=True)
    with pytest.raises(ValueError, match="max_num_seqs"):
        kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, max_num_seqs=0)
    o, _ = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, cu_seqlens=x.cu_seqlens, max_num_seqs=2)
    o2, _ = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, cu_seqlens=x.cu_seqlens)
    assert torch.equal(o, o2)


def test_recurrent_accepts_the_chunk_only_keywords_without_effect():
    x = make_inputs(2, 3, 1, 1, 16, 16, seed=3)
    ref = kdagen.fused_recurrent_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, output_final_state=True)
    got = kdagen.fused_recurrent_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, output_final_state=True,
                                     disable_recompute=True, use_graph=True, max_num_seqs=8, cp_context=None,
                                     num_accepted_tokens=None)
    assert torch.equal(ref[0], got[0]) and torch.equal(ref[1], got[1])


def test_recurrent_training_reads_host_offsets_from_cu_seqlens_cpu(monkeypatch):
    """The recurrent backward builds its segment schedule from cu_seqlens_cpu when given:
    validation never reads cu_seqlens itself back to the host (on a GPU, a synchronisation)."""
    import kdagen.ops.recurrent as R

    cuv = [0, 3, 11]
    x = make_inputs(1, 11, 1, 1, 16, 16, seed=4, cu_seqlens=cuv)
    cu = x.cu_seqlens
    real_tolist, real_validate = torch.Tensor.tolist, R._validate

    def guarded(t):
        if t is cu:  # (not an assert: pytest's message would print t, through tolist)
            raise AssertionError("cu_seqlens was read back to the host")
        return real_tolist(t)

    def guarded_validate(*args, **kwargs):  # the host-side checks, with cu_seqlens unreadable
        with monkeypatch.context() as m:
            m.setattr(torch.Tensor, "tolist", guarded)
            return real_validate(*args, **kwargs)

    monkeypatch.setattr(R, "_validate", guarded_validate)
    v = x.v.clone().requires_grad_(True)
    o, _ = kdagen.fused_recurrent_kda(x.q, x.k, v, x.g, x.beta, cu_seqlens=cu, cu_seqlens_cpu=torch.tensor(cuv))
    assert o.grad_fn.meta.seqlens == cuv
    o.sum().backward()
    v64 = x.v.to(F64).requires_grad_(True)
    q, k, _, g, beta = x.ref_args()
    ro, _ = naive_recurrent_kda(q, k, v64, g, beta, cu_seqlens=cu)
    ro.sum().backward()
    assert_close(v.grad, v64.grad, TOL[torch.float32], "dv")
    with pytest.raises(AssertionError, match="read back"):  # without it, the lengths come from cu_seqlens
        kdagen.fused_recurrent_kda(x.q, x.k, v, x.g, x.beta, cu_seqlens=cu)


def test_unknown_keywords_are_a_type_error(no_launch):
    x = make_inputs(1, 8, 1, 1, 16, 16, seed=1)
    for op in (kdagen.chunk_kda, kdagen.fused_recurrent_kda):
        with pytest.raises(TypeError, match="unexpected keyword.*'chunk_sise'"):
            op(x.q, x.k, x.v, x.g, x.beta, chunk_sise=64)
    assert not no_launch


def test_no_fla_keyword_warns_or_fails_by_name():
    """Each FLA keyword at its default value is taken by both ops without a warning about it
    (the interpreter's own numpy warnings aside)."""
    x = make_inputs(1, 8, 1, 1, 16, 16, seed=1)
    chunk_defaults = dict(disable_recompute=False, return_intermediate_states=False, state_v_first=False,
                          cu_seqlens=None, cu_seqlens_cpu=None, cp_context=None, use_graph=False, max_num_seqs=None,
                          chunk_size=64, A_log=None, dt_bias=None)
    rec_defaults = dict(A_log=None, dt_bias=None, state_v_first=False, cu_seqlens=None)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, **chunk_defaults)
        kdagen.fused_recurrent_kda(x.q, x.k, x.v, x.g, x.beta, **rec_defaults)
    about = [str(w.message) for w in seen if any(n in str(w.message) for n in (*chunk_defaults, "kdagen"))]
    assert not about, about
