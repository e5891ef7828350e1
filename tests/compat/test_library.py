"""The ops registered with torch.library (kdagen.ops.library): torch.compile(fullgraph=True)
traces a module that calls chunk_kda (forward and backward) and fused_recurrent_kda with no
graph break and gives eager's bits; torch.library.opcheck passes on every registered op."""
import pytest
import torch

from cases import inputs

import kdagen
from kdagen.ops import library as L

B, T, H, K = 1, 40, 2, 16  # T straddles the chunks; two heads
# KDA's case (tests/cases.py) at that shape: g = -5 U[0, 1), beta ~ U[0, 1)
CASE = dict(gate="uniform", g_scale=5.0, beta="uniform")
NAMES = ("q", "k", "v", "g", "beta", "h0")


class _Layer(torch.nn.Module):
    """Prefill with chunk_kda (differentiated), then one decode step into a state pool."""

    def forward(self, q, k, v, g, beta, h0, pool, slots):
        o, ht = kdagen.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                 use_qk_l2norm_in_kernel=True, safe_gate=True, lower_bound=-5.0)
        with torch.no_grad():
            o1, pool = kdagen.fused_recurrent_kda(q[:, -1:], k[:, -1:], v[:, -1:], g[:, -1:], beta[:, -1:],
                                                  initial_state=pool, ssm_state_indices=slots,
                                                  use_qk_l2norm_in_kernel=True)
            o2, h2 = kdagen.fused_recurrent_kda(q[:, -1:], k[:, -1:], v[:, -1:], g[:, -1:], beta[:, -1:],
                                                initial_state=ht, output_final_state=True)
        return (o * o).sum() + ht.sum(), o1, o2, h2


def _run(module, leaves):
    xs = [t.clone().requires_grad_() for t in leaves]
    pool = torch.randn(3, H, K, K, generator=torch.Generator().manual_seed(1))
    slots = torch.tensor([2])
    loss, o1, o2, h2 = module(*xs, pool, slots)
    loss.backward()
    return [loss, o1, o2, h2, pool] + [x.grad for x in xs]


@pytest.mark.slow
def test_fullgraph_compile_matches_eager_bit_for_bit():
    leaves = inputs("kda", B, T, H, H, K, K, **CASE).take(*NAMES)
    torch._dynamo.reset()
    compiled = torch.compile(_Layer(), backend="aot_eager", fullgraph=True)  # fullgraph: a graph break raises
    got = _run(compiled, leaves)
    want = _run(_Layer(), leaves)
    names = ["loss", "o (decode, pool)", "o (decode)", "state (decode)", "pool"] + [
        f"d{n}" for n in ("q", "k", "v", "g", "beta", "h0")]
    for n, a, b in zip(names, got, want):
        assert a is not None and torch.equal(a, b), n
    # the pool slot the decode step used was updated in place by the compiled call too
    assert not torch.equal(got[4][2], torch.randn(3, H, K, K, generator=torch.Generator().manual_seed(1))[2])


def test_compiled_inference_on_packed_sequences_matches_eager():
    q, k, v, g, beta, h0 = inputs("kda", B, T, H, H, K, K, **CASE).take(*NAMES)
    cu = torch.tensor([0, 7, 30, T])
    h0 = torch.randn(3, H, K, K)

    def f(q, k, v, g, beta, h0, cu):
        return kdagen.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)

    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(f, backend="aot_eager", fullgraph=True)(q, k, v, g, beta, h0, cu)
        want = f(q, k, v, g, beta, h0, cu)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_compiled_region_refuses_what_it_cannot_trace():
    q, k, v, g, beta, h0 = inputs("kda", B, T, H, H, K, K, **CASE).take(*NAMES)
    torch._dynamo.reset()
    f = torch.compile(lambda q: kdagen.chunk_kda(q, k, v, g, beta, cu_seqlens=torch.tensor([0, T]))[0],
                      backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match="training on packed sequences .cu_seqlens. is not supported"):
        f(q.clone().requires_grad_())


def test_the_eager_path_does_not_dispatch_through_the_registered_ops(monkeypatch):
    """Eager calls run kdagen's Python directly (decode latency): the compiled-path wrappers are
    not entered."""
    import kdagen.ops.chunk as C
    import kdagen.ops.recurrent as R

    calls = []
    monkeypatch.setattr(C, "chunk_kda_traced", lambda *a, **kw: calls.append("chunk"))
    monkeypatch.setattr(R, "fused_recurrent_kda_traced", lambda *a, **kw: calls.append("recurrent"))
    q, k, v, g, beta, h0 = inputs("kda", B, T, H, H, K, K, **CASE).take(*NAMES)
    with torch.no_grad():
        o, _ = kdagen.fused_recurrent_kda(q[:, :1], k[:, :1], v[:, :1], g[:, :1], beta[:, :1])
        o2, _ = kdagen.chunk_kda(q[:, :8], k[:, :8], v[:, :8], g[:, :8], beta[:, :8])
    assert o.shape == v[:, :1].shape and o2.shape == v[:, :8].shape and not calls


@pytest.mark.slow
def test_opcheck_chunk_infer():
    q, k, v, g, beta, h0 = inputs("kda", B, T, H, H, K, K, **CASE).take(*NAMES)
    torch.library.opcheck(L.chunk_kda_infer, (q, k, v, g, beta, h0, None, None, None, True, True, False, False, False,
                                              True, -5.0, None, None, None, False))
    cu = torch.tensor([0, 13, T])
    torch.library.opcheck(L.chunk_kda_infer, (q, k, v, g, beta, torch.randn(2, H, K, K), None, None, None, True,
                                              False, False, False, False, True, -5.0, None, cu, None, True))


@pytest.mark.slow
def test_opcheck_chunk_train_and_backward():
    xs = [t.clone().requires_grad_() for t in inputs("kda", B, T, H, H, K, K, **CASE).take(*NAMES)]
    args = (*xs, None, None, None, True, False, True, -5.0, None, False, False)
    torch.library.opcheck(L.chunk_kda_train, args)
    with torch.no_grad():
        out = L.chunk_kda_train(*args)
    plain = [x.detach() for x in xs]
    do, dht = torch.randn_like(out[0]), torch.randn_like(out[1])
    torch.library.opcheck(L.chunk_kda_bwd, (*plain, None, None, list(out[2:]), do, dht, None, True, False, True,
                                            -5.0, None, False, False, [True] * 6 + [False, False]))


def test_opcheck_fused_recurrent_with_a_pool():
    q, k, v, g, beta, _ = inputs("kda", B, T, H, H, K, K, **CASE).take(*NAMES)
    pool = torch.randn(4, H, K, K)
    torch.library.opcheck(L.fused_recurrent_kda_op, (q[:, :1], k[:, :1], v[:, :1], g[:, :1], beta[:, :1], None, None,
                                                     None, pool, True, False, False, False, False, None, None,
                                                     torch.tensor([2]), None, False))


def test_every_keyword_of_the_ops_reaches_the_compiled_path():
    """A keyword added to chunk_kda or fused_recurrent_kda must be routed through
    kdagen.ops.traced too (else a compiled call would drop it)."""
    import inspect

    from kdagen.ops import traced as T

    for op, wrapper in ((kdagen.chunk_kda, T.chunk_kda_traced),
                        (kdagen.fused_recurrent_kda, T.fused_recurrent_kda_traced)):
        mine = set(inspect.signature(op).parameters) - {"kwargs"} - set(T.CHECKED_BEFORE_ROUTING)
        routed = set(inspect.signature(wrapper).parameters) - {"bwd_override"}
        assert mine == routed, f"{op.__name__}: not routed to the compiled path: {sorted(mine ^ routed)}"
