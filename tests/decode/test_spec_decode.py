"""Speculative decoding in the decode ops (FLA's fused_recurrent_kda_fwd keywords): a 2-D ssm_state_indices
[N, T_max] gives every token a pool slot, each token's state is written to its slot as it is consumed, and
num_accepted_tokens [N] picks the slot a sequence starts from ([n, accepted - 1]; [n, 0] without it).
Checked in Triton's interpreter against the float64 recurrence, token by token: rejected drafts, fully
accepted drafts, sequences without tokens, padding, the in-kernel flags, both pool layouts, fp32 and fp16
pools (bf16 pools: the interpreter cannot run bf16 and no emulation covers pools; tests/gpu/spec_decode_bench.py
checks them on a GPU), and a serving loop that drafts, verifies and accepts a random prefix, compared with
plain one-token decoding of the accepted tokens."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from plain_configs import plain_decode

import kdagen
from kdagen.cache.keys import TOKEN_SLOTS_SUFFIX, call_bucket
from kdagen.codegen.lower import lower
from kdagen.codegen.render import render
from kdagen.config import RecurrentConfig
from kdagen.ops import recurrent as R
from kdagen.spec.load import load_spec
from kdagen.spec.reference import (kda_gate, naive_recurrent_deltanet, naive_recurrent_gdn, naive_recurrent_gla,
                                   naive_recurrent_kda)

H, K, V = 2, 16, 16


def draw(lens, *, seed, member="kda", flags=False):
    """Packed inputs of sequences of ``lens`` tokens ([1, sum(lens), H, ..]) and cu_seqlens.  ``flags``: raw
    q, k, beta logits and a raw gate for the in-kernel flags (qk l2norm, gate from A_log/dt_bias, beta sigmoid)."""
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)
    q = torch.randn(1, T, H, K, generator=gen)
    k = torch.randn(1, T, H, K, generator=gen)
    if not flags:
        k = F.normalize(k, dim=-1)
    v = torch.randn(1, T, H, V, generator=gen)
    if member in ("kda", "gla"):
        g = 1.5 * torch.randn(1, T, H, K, generator=gen) if flags else -torch.rand(1, T, H, K, generator=gen)
    else:  # (DeltaNet's is not read)
        g = -torch.rand(1, T, H, generator=gen)
    beta = torch.randn(1, T, H, generator=gen) if flags else torch.rand(1, T, H, generator=gen)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int64)
    x = dict(q=q, k=k, v=v, g=g, beta=beta)
    if flags:
        x.update(A_log=torch.rand(H, generator=gen),
                 dt_bias=0.5 * torch.randn(H * K if member == "kda" else H, generator=gen))
    return x, cu


def reference_tokens(x, cu, starts, member="kda", flags=False):
    """The float64 recurrence token by token: for sequence n from state ``starts[n]`` ([H, K, V], float64),
    ([o_t], [S_t]) after each of its tokens."""
    q, k, v, g, beta = (x[n][0].double() for n in ("q", "k", "v", "g", "beta"))
    if flags:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        beta = torch.sigmoid(beta)
        if member == "kda":
            g = kda_gate(x["g"], x["A_log"], x["dt_bias"])[0]
        else:  # GDN's gate, one per head: KDA's with one channel
            g = kda_gate(x["g"][..., None], x["A_log"], x["dt_bias"])[0, ..., 0]
    naive = dict(kda=naive_recurrent_kda, gdn=naive_recurrent_gdn, delta=naive_recurrent_deltanet,
                 gla=naive_recurrent_gla)[member]
    inputs = dict(delta=(q, k, v, beta), gla=(q, k, v, g)).get(member, (q, k, v, g, beta))
    out = []
    for n in range(len(cu) - 1):
        S, os_, ss = starts[n], [], []
        for t in range(int(cu[n]), int(cu[n + 1])):
            one = [z[t:t + 1][None] for z in inputs]
            o, S = naive(*one, initial_state=S[None], output_final_state=True)
            S = S[0]
            os_.append(o[0, 0])
            ss.append(S)
        out.append((os_, ss))
    return out


def run_op(member, x, cu, pool, idx, accepted, *, state_v_first=False, flags=False, config=None, check=None):
    out = torch.full_like(x["v"], float("nan"))
    kw = dict(initial_state=pool, ssm_state_indices=idx, num_accepted_tokens=accepted, cu_seqlens=cu, out=out,
              state_v_first=state_v_first, config=config, check_inputs=check)
    if flags:
        kw.update(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                  A_log=x["A_log"], dt_bias=x["dt_bias"])
    tensors = {n: x[n] for n in ("q", "k", "v", "g", "beta")}
    if member == "kda":
        o, ht = kdagen.fused_recurrent_kda(**tensors, **kw)
    elif member == "gdn":
        o, ht = kdagen.fused_recurrent_gated_delta_rule(**tensors, **kw)
    elif member == "delta":
        o, ht = kdagen.fused_recurrent_delta_rule(x["q"], x["k"], x["v"], beta=x["beta"], **kw)
    else:
        o, ht = kdagen.fused_recurrent_gla(x["q"], x["k"], x["v"], gk=x["g"], **kw)
    assert ht is pool and o is out
    return out


def kv(pool, state_v_first):
    """The pool's states as [.., K, V] float64."""
    return (pool.transpose(-1, -2) if state_v_first else pool).double()


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


# (tokens per sequence, slot rows (-1: padding), accepted counts): a fully accepted draft of 3, a rejected draft
# (accepted 1), a sequence without tokens, a plain decode step (k = 0), a sequence whose starting slot is padding,
# and one whose second token's slot is padding (its state is not stored, the recurrence goes on)
LENS = [4, 3, 0, 1, 2, 3]
ROWS = [[0, 1, 2, 3], [4, 5, 6, -1], [7, 8, 9, -1], [10, -1, -1, -1], [-1, 11, -1, -1], [12, -1, 13, -1]]
ACCEPTED = [4, 1, 2, 1, 1, 3]


@pytest.mark.parametrize("member,state_v_first,pool_dtype,flags,accepted", [
    ("kda", False, torch.float32, False, True),
    ("kda", True, torch.float32, False, True),
    ("kda", False, torch.float32, False, False),
    ("kda", True, torch.float16, True, True),
    ("gdn", False, torch.float32, True, True),
    ("gdn", True, torch.float16, False, True),
    ("delta", False, torch.float32, False, True),
    ("gla", True, torch.float32, False, False),
])
def test_step_matches_the_recurrence_token_by_token(member, state_v_first, pool_dtype, flags, accepted):
    """One verify step: o of every token and the state in every token's slot are the float64 recurrence's
    from the slot [n, accepted - 1] ([n, 0] without num_accepted_tokens); padding starts give o = 0 and write
    nothing; a padded token slot stores nothing; every slot not written keeps its bytes."""
    x, cu = draw(LENS, seed=11, member=member, flags=flags)
    P = 20
    gen = torch.Generator().manual_seed(5)
    pool = (0.3 * torch.randn(P, H, K, V, generator=gen)).to(pool_dtype)
    if state_v_first:
        pool = pool.transpose(-1, -2).contiguous()
    before = pool.clone()
    idx = torch.tensor(ROWS, dtype=torch.int32)
    acc = torch.tensor(ACCEPTED, dtype=torch.int32) if accepted else None
    start_col = [a - 1 for a in ACCEPTED] if accepted else [0] * len(LENS)
    starts = [kv(before, state_v_first)[max(ROWS[n][start_col[n]], 0)] for n in range(len(LENS))]
    out = run_op(member, x, cu, pool, idx, acc, state_v_first=state_v_first, flags=flags)
    ref = reference_tokens(x, cu, starts, member, flags)
    tol = 1e-5 if pool_dtype == torch.float32 else 3e-3
    written = set()
    for n, (os_, ss) in enumerate(ref):
        pad = ROWS[n][start_col[n]] < 0
        for j, t in enumerate(range(int(cu[n]), int(cu[n + 1]))):
            if pad:
                assert torch.equal(out[0, t], torch.zeros_like(out[0, t])), f"padding sequence {n}: o must be 0"
                continue
            assert rel(out[0, t].double(), os_[j]) < tol, f"o of sequence {n}, token {j}"
            slot = ROWS[n][j]
            if slot >= 0:
                written.add(slot)
                assert rel(kv(pool, state_v_first)[slot], ss[j]) < tol, f"state of sequence {n}, token {j}"
    assert not torch.isnan(out).any()
    for s in range(P):
        if s not in written:
            assert torch.equal(pool[s], before[s]), f"slot {s} was written though no token's slot is {s}"
    # the rejected draft's and the empty sequence's starting states are not written by a padding start
    assert {0, 1, 2, 3, 4, 5, 6, 10, 12} <= written


def test_serving_loop_matches_plain_decoding_of_the_accepted_tokens():
    """Draft, verify and accept a random prefix for several steps; every accepted token's o and the state
    after the last accepted token equal plain one-token decoding (1-D slots) of the accepted tokens alone, and
    the float64 recurrence's."""
    N, W, steps = 3, 4, 4  # sequences, slots per sequence (1 + k <= W), steps
    gen = torch.Generator().manual_seed(3)
    P = N * W
    pool = 0.3 * torch.randn(P, H, K, V, generator=gen)
    idx = torch.arange(P, dtype=torch.int32).view(N, W)  # sequence n owns slots n*W .. n*W + W - 1
    plain = pool[idx[:, 0].long()].clone()  # the plain decoder's pool: a slot per sequence
    plain_slots = torch.arange(N, dtype=torch.int32)
    ref_state = [pool[idx[n, 0]].double() for n in range(N)]
    accepted = torch.ones(N, dtype=torch.int32)
    for step in range(steps):
        lens = torch.randint(1, W + 1, (N,), generator=gen).tolist()
        lens[step % N] = 1  # (a plain decode step among the drafts)
        x, cu = draw(lens, seed=100 + step)
        out = run_op("kda", x, cu, pool, idx, accepted)
        take = [int(torch.randint(1, L + 1, (1,), generator=gen)) for L in lens]
        if step == 1:
            take[0] = 1  # every draft of sequence 0 rejected
        ref = reference_tokens(x, cu, ref_state)
        for j in range(max(take)):  # the plain decoder: the accepted tokens one at a time
            live = [n for n in range(N) if take[n] > j]
            pos = torch.tensor([int(cu[n]) + j for n in live])
            one = {name: x[name][:, pos] for name in x}
            pcu = torch.tensor([0] + [sum(1 for m in live if m <= n) for n in range(N)], dtype=torch.int64)
            o1, _ = kdagen.fused_recurrent_kda(**one, initial_state=plain, ssm_state_indices=plain_slots,
                                               cu_seqlens=pcu)
            for i, n in enumerate(live):
                t = int(cu[n]) + j
                assert torch.allclose(out[0, t], o1[0, i], rtol=0, atol=1e-5), f"step {step}: o, seq {n}, token {j}"
                assert rel(out[0, t].double(), ref[n][0][j]) < 1e-5
        for n in range(N):
            last = idx[n, take[n] - 1].long()
            assert torch.allclose(pool[last], plain[n], rtol=0, atol=1e-5), f"step {step}: state of sequence {n}"
            assert rel(pool[last].double(), ref[n][1][take[n] - 1]) < 1e-5
            ref_state[n] = ref[n][1][take[n] - 1]
        accepted = torch.tensor(take, dtype=torch.int32)


def test_fixed_length_batch_and_the_fast_path():
    """Without cu_seqlens (each sequence T tokens, T_max = T), a repeated geometry (the fast path) gives the
    same answer as the first call, and the step the bucket and config name are speculative decoding's."""
    B, T = 2, 3
    gen = torch.Generator().manual_seed(8)
    x = dict(q=torch.randn(B, T, H, K, generator=gen), k=F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1),
             v=torch.randn(B, T, H, V, generator=gen), g=-torch.rand(B, T, H, K, generator=gen),
             beta=torch.rand(B, T, H, generator=gen))
    pool0 = 0.3 * torch.randn(7, H, K, V, generator=gen)
    idx = torch.tensor([[6, 0, 2], [3, 4, 5]], dtype=torch.int32)
    acc = torch.tensor([1, 2], dtype=torch.int32)
    runs = []
    for _ in range(2):
        pool = pool0.clone()
        o, _ = kdagen.fused_recurrent_kda(**x, initial_state=pool, ssm_state_indices=idx, num_accepted_tokens=acc)
        runs.append((o, pool))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    o, pool = runs[0]
    for n, start in enumerate((6, 4)):
        xs = {k_: z[n:n + 1] for k_, z in x.items()}
        ro, _ = naive_recurrent_kda(*(xs[m].double() for m in ("q", "k", "v", "g", "beta")),
                                    initial_state=pool0[start][None].double(), output_final_state=True)
        assert rel(o[n].double(), ro[0]) < 1e-5
        _, rs = naive_recurrent_kda(*(xs[m].double() for m in ("q", "k", "v", "g", "beta")),
                                    initial_state=pool0[start][None].double(), output_final_state=True)
        assert rel(pool[int(idx[n, T - 1])].double(), rs[0]) < 1e-5
    shape = {"T": T, "B": B, "N": B, "token_slots": True}
    assert call_bucket("recurrent", shape).endswith(TOKEN_SLOTS_SUFFIX)
    assert not call_bucket("recurrent", {"T": T, "B": B, "N": B}).endswith(TOKEN_SLOTS_SUFFIX)
    assert R.token_slot_config(RecurrentConfig(programs_per_sm=4, num_stages=2), idx).token_slots
    assert R.token_slot_config(RecurrentConfig(programs_per_sm=4, num_stages=2), idx).programs_per_sm == 0
    assert not R.token_slot_config(RecurrentConfig(token_slots=True), idx[:, 0]).token_slots


def test_the_plain_kernel_source_is_unchanged_by_the_feature():
    """token_slots renders a kernel of its own (num_accepted_tokens and the row length as arguments); at its
    default the source has none of it and its header does not name the field."""
    plan = lower(load_spec("kda"), 16, 16, "float32", "recurrent", False)
    plain = render("recurrent", plan, plain_decode()).text
    slots = render("recurrent", plan, plain_decode(token_slots=True)).text
    assert "accepted" not in plain and "TS" not in plain and "token_slots" not in plain
    assert "cu_seqlens, accepted," in slots and "ACCEPTED: tl.constexpr" in slots and "token_slots=True" in slots


def test_errors():
    x, cu = draw([2, 1], seed=2)
    pool = torch.zeros(8, H, K, V)
    idx = torch.tensor([[0, 1], [2, -1]], dtype=torch.int32)
    acc = torch.tensor([1, 2], dtype=torch.int32)
    t = {n: x[n] for n in ("q", "k", "v", "g", "beta")}
    op = kdagen.fused_recurrent_kda
    with pytest.raises(ValueError, match="narrower than the longest sequence"):  # host cu_seqlens: known
        op(**t, initial_state=pool, ssm_state_indices=idx[:, :1].contiguous(), cu_seqlens=cu)
    x2, _ = draw([2, 2], seed=3)
    with pytest.raises(ValueError, match="narrower than each sequence's T"):  # [B, T]: each sequence T tokens
        op(**{n: x2[n].view(2, 2, *x2[n].shape[2:]) for n in t}, initial_state=pool,
           ssm_state_indices=idx[:, :1].contiguous())
    with pytest.raises(ValueError, match="2-D ssm_state_indices"):
        op(**t, initial_state=pool, ssm_state_indices=idx[:, 0].contiguous(), cu_seqlens=cu, num_accepted_tokens=acc)
    with pytest.raises(ValueError, match="2-D ssm_state_indices"):
        op(**t, initial_state=pool, cu_seqlens=cu, num_accepted_tokens=acc)
    with pytest.raises(ValueError, match="num_accepted_tokens must be a 1-D int32/int64 tensor of 2"):
        op(**t, initial_state=pool, ssm_state_indices=idx, cu_seqlens=cu, num_accepted_tokens=acc[:1])
    with pytest.raises(ValueError, match="state_indices must be an int32/int64 tensor of 2 slots"):
        op(**t, initial_state=pool, ssm_state_indices=idx[:1], cu_seqlens=cu)
    with pytest.raises(ValueError, match=r"num_accepted_tokens\[1\] = 3 is outside 1..2"):
        op(**t, initial_state=pool, ssm_state_indices=idx, cu_seqlens=cu, num_accepted_tokens=acc + 1,
           check_inputs=True)
    with pytest.raises(ValueError, match="repeats a slot an earlier token already uses"):
        op(**t, initial_state=pool, ssm_state_indices=torch.tensor([[0, 1], [1, -1]], dtype=torch.int32),
           cu_seqlens=cu, check_inputs=True)
    with pytest.raises(ValueError, match="inplace_final_state=False"):
        op(**t, initial_state=pool, ssm_state_indices=idx, cu_seqlens=cu, inplace_final_state=False)
    with pytest.raises(ValueError, match="num_accepted_tokens have no gradient"):
        op(**{**t, "q": t["q"].clone().requires_grad_()}, initial_state=pool[:2], cu_seqlens=cu,
           num_accepted_tokens=acc)
    with pytest.raises(ValueError, match="2-D ssm_state_indices"):
        kdagen.fused_recurrent_gated_delta_rule(t["q"], t["k"], t["v"], t["g"][..., 0], beta=t["beta"],
                                                initial_state=pool, cu_seqlens=cu, num_accepted_tokens=acc)
    # an accepted count outside 1..T_max without the value check: padding, nothing read or written
    pool2 = torch.randn(8, H, K, V)
    before = pool2.clone()
    o, _ = op(**t, initial_state=pool2, ssm_state_indices=idx, cu_seqlens=cu, num_accepted_tokens=acc * 0,
              inplace_final_state=True)
    assert torch.equal(pool2, before) and torch.equal(o, torch.zeros_like(o))


def test_compiled_step_matches_eager():
    """Under torch.compile (fullgraph) the verify step is the registered op, num_accepted_tokens included: the
    same o and pool as the eager call, bit for bit."""
    x, cu = draw([3, 1, 2], seed=21)
    idx = torch.tensor([[0, 1, 2], [3, -1, -1], [4, 5, -1]], dtype=torch.int32)
    acc = torch.tensor([2, 1, 1], dtype=torch.int32)
    pool0 = torch.randn(6, H, K, V, generator=torch.Generator().manual_seed(4))

    def f(q, k, v, g, beta, pool, idx, acc, cu):
        return kdagen.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool, ssm_state_indices=idx,
                                          num_accepted_tokens=acc, cu_seqlens=cu)[0]

    torch._dynamo.reset()
    pools = [pool0.clone(), pool0.clone()]
    with torch.no_grad():
        got = torch.compile(f, backend="aot_eager", fullgraph=True)(*(x[n] for n in ("q", "k", "v", "g", "beta")),
                                                                    pools[0], idx, acc, cu)
        want = f(*(x[n] for n in ("q", "k", "v", "g", "beta")), pools[1], idx, acc, cu)
    assert torch.equal(got, want) and torch.equal(pools[0], pools[1]) and not torch.equal(pools[0], pool0)
