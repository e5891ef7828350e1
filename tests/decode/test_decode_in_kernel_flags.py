"""FLA's in-kernel flags in the decode kernel itself: ``use_qk_l2norm_in_kernel`` and
``use_beta_sigmoid_in_kernel`` (twice the sigmoid with ``allow_neg_eigval``) are applied by the
recurrent kernel to the raw q, k and beta it loads, and a Gated DeltaNet gate's ``dt_bias`` [HV]
is read per head, so a decode step with them is one launch: no torch pre-processing, no
per-call copy of dt_bias.  Checked against the float64 recurrence (fp32 and fp16, interpreter)
through every kind of program (one item per program, persistent programs in either readout), with
varlen sequences of length 0, 1 and several tokens, GVA, a state pool with a padding slot, and the
per-geometry fast path; and against the autograd path, which applies the same flags as torch ops."""
import pytest
import torch

from cases import inputs
from plain_configs import plain_decode

import kdagen
import kdagen.ops.member as M
import kdagen.ops.recurrent as R
from kdagen.spec.reference import naive_recurrent_gdn, naive_recurrent_kda

CONFIGS = {
    "one-item": None,
    "pipelined-updated": plain_decode(block_v=16, programs_per_sm=2, num_stages=3),
    "pipelined": plain_decode(block_v=16, programs_per_sm=2, num_stages=2, readout="loaded"),
}
TOL = {torch.float32: 2e-5, torch.float16: 4e-3}


def _rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def _normalize(x):  # F.normalize in float64: x / max(||x||, 1e-12)
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


# the layer's raw inputs (tests/cases.py): q = 3 N(0, 1) and k = 2 N(0, 1) for the kernel's l2-norm, the gate's
# input z, beta = 2 N(0, 1) through the sigmoid, A_log = log(1 + 3 U[0, 1)), dt_bias = 0.5 N(0, 1) ([HV] for GDN,
# [HV * K] for KDA); no initial state
FLAGS = dict(q_scale=3.0, key="raw", k_scale=2.0, gate="raw", beta="raw", beta_scale=2.0, params="log1p",
             order=("gate", "beta", "params"), gate_in_dtype=False, h0=False)
NAMES = ("q", "k", "v", "g", "beta", "A_log", "dt_bias")


def _pool_ref(ref, q, k, v, gate, beta, pool, idx, cu):
    """Each sequence through the float64 recurrence from its pool slot: (o, pool after)."""
    o = torch.zeros(v.shape, dtype=torch.float64)
    after = pool.double().clone()
    for n in range(len(idx)):
        bos, eos = int(cu[n]), int(cu[n + 1])
        if idx[n] < 0:
            continue
        h0 = pool[idx[n]].double()[None]
        if eos > bos:
            o_n, h_n = ref(q[:, bos:eos], k[:, bos:eos], v[:, bos:eos], gate[:, bos:eos], beta[:, bos:eos],
                           initial_state=h0, output_final_state=True)
            o[:, bos:eos] = o_n
            after[idx[n]] = h_n[0]
    return o, after


@pytest.mark.parametrize("program", list(CONFIGS))
@pytest.mark.parametrize("dt", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_gated_deltanet_decode_with_the_layer_flags_matches_the_recurrence(program, dt):
    """fused_recurrent_gated_delta_rule(use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log,
    dt_bias [HV]) on packed sequences of 0, 1, 3 and 1 tokens into a pool with a padding slot;
    the same geometry twice (the second call through the fast path)."""
    H, HV, K, V = 1, 2, 24, 40
    cu = torch.tensor([0, 0, 1, 4, 5], dtype=torch.int64)
    idx = torch.tensor([3, 0, 5, -1], dtype=torch.int32)
    gen = torch.Generator().manual_seed(9)
    pool = 0.3 * torch.randn(6, HV, K, V, generator=gen)
    M._FAST.clear()
    for step in range(2):
        q, k, v, z, beta, A_log, dt_bias = inputs("gdn", 1, 5, H, HV, K, V, dtype=dt, seed=step, **FLAGS).take(*NAMES)
        g = -torch.exp(A_log.double()) * torch.nn.functional.softplus(z.double() + dt_bias.double())
        ro, rpool = _pool_ref(naive_recurrent_gdn, _normalize(q.double()), _normalize(k.double()), v.double(), g,
                              beta.double(), pool, idx.tolist(), cu.tolist())
        out = torch.full_like(v, float("nan"))
        o, ht = kdagen.fused_recurrent_gated_delta_rule(
            q, k, v, z, beta=beta, initial_state=pool, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
            A_log=A_log, dt_bias=dt_bias, cu_seqlens=cu, ssm_state_indices=idx, out=out, config=CONFIGS[program])
        assert o is out and ht is pool
        assert _rel(o, ro) < TOL[dt], (step, _rel(o, ro))
        assert _rel(pool, rpool) < TOL[dt], (step, _rel(pool, rpool))
        assert torch.all(o[:, 4] == 0)  # the padding slot's token: o = 0, its pool slot untouched
        pool = pool.clone()  # the next step's pool (ht is this one)


@pytest.mark.parametrize("program", list(CONFIGS))
def test_kda_decode_with_the_layer_flags_matches_the_recurrence(program):
    """fused_recurrent_kda with the l2-norm, twice the beta sigmoid (allow_neg_eigval: the
    transition's eigenvalue may go negative) and the in-kernel gate, batch form with a final state."""
    B, H, HV, K, V = 3, 1, 2, 20, 36
    x = [inputs("kda", 1, 1, H, HV, K, V, seed=s, **FLAGS).take(*NAMES) for s in range(B)]
    q, k, v, z, beta = (torch.cat([xi[i] for xi in x]) for i in range(5))
    A_log, dt_bias = x[0][5], x[0][6]
    h0 = 0.3 * torch.randn(B, HV, K, V, generator=torch.Generator().manual_seed(4))
    g = -torch.exp(A_log.double())[:, None] * torch.nn.functional.softplus(
        z.double() + dt_bias.double().reshape(HV, K))
    ro, rs = naive_recurrent_kda(_normalize(q.double()), _normalize(k.double()), v.double(), g,
                                 2 * torch.sigmoid(beta.double()), initial_state=h0.double(),
                                 output_final_state=True)
    R._FAST.clear()
    for _ in range(2):  # the first call plans; the second goes through the fast path
        o, s = kdagen.fused_recurrent_kda(q, k, v, z, beta, initial_state=h0, output_final_state=True,
                                          use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                                          allow_neg_eigval=True, use_gate_in_kernel=True, A_log=A_log,
                                          dt_bias=dt_bias, config=CONFIGS[program])
        assert _rel(o, ro) < 2e-5 and _rel(s, rs) < 2e-5
    assert len(R._FAST) == 1


def test_the_decode_step_is_one_launch_on_the_callers_tensors(monkeypatch):
    """No torch pre-processing (preprocess raises if called) and dt_bias passed as given ([HV]):
    the kernel receives the raw q, k, beta and the flags as constexprs."""
    def refuse(*a, **kw):
        raise AssertionError("the decode path pre-processed its inputs with torch ops")

    monkeypatch.setattr(M, "preprocess", refuse)
    monkeypatch.setattr(R, "preprocess", refuse)
    seen = []
    real = R.prepare_recurrent

    def spy(q, k, v, g, beta, **kw):
        seen.append((q, k, beta, kw["dt_bias"], kw))
        return real(q, k, v, g, beta, **kw)

    monkeypatch.setattr(R, "prepare_recurrent", spy)
    monkeypatch.setattr(M, "prepare_recurrent", spy)  # the member ops' decode imports it from kdagen.ops.recurrent
    H, HV, K, V = 1, 2, 16, 16
    q, k, v, z, beta, A_log, dt_bias = inputs("gdn", 1, 2, H, HV, K, V, seed=0, **FLAGS).take(*NAMES)
    M._FAST.clear()
    kdagen.fused_recurrent_gated_delta_rule(q, k, v, z, beta=beta, use_qk_l2norm_in_kernel=True,
                                            use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
    assert len(seen) == 1
    q_in, k_in, beta_in, bias_in, kw = seen[0]
    assert q_in is q and k_in is k and beta_in is beta and bias_in is dt_bias
    assert kw["qk_l2norm"] and not kw["beta_sigmoid"]
    # and the KDA op: the l2-norm and the sigmoid reach the kernel as flags
    R._FAST.clear()
    qk, kk, vk, zk, bk, Ak, dk = inputs("kda", 1, 2, H, HV, K, V, seed=1, **FLAGS).take(*NAMES)
    for _ in range(2):
        o, _ = kdagen.fused_recurrent_kda(qk, kk, vk, zk, bk, use_qk_l2norm_in_kernel=True,
                                          use_beta_sigmoid_in_kernel=True, use_gate_in_kernel=True, A_log=Ak,
                                          dt_bias=dk)
        assert torch.isfinite(o).all()
    assert len(R._FAST) == 1


def test_the_autograd_path_and_the_decode_path_agree_on_the_flags():
    """The same call with inputs requiring grad (torch ops for the flags, dt_bias expanded) gives
    the decode kernel's output, and its gradients exist for the raw inputs."""
    H, HV, K, V = 1, 2, 16, 24
    q, k, v, z, beta, A_log, dt_bias = inputs("gdn", 1, 6, H, HV, K, V, seed=3, **FLAGS).take(*NAMES)
    kw = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=A_log, output_final_state=True)
    with torch.no_grad():
        o0, s0 = kdagen.fused_recurrent_gated_delta_rule(q, k, v, z, beta=beta, dt_bias=dt_bias, **kw)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, dt_bias)]
    o1, s1 = kdagen.fused_recurrent_gated_delta_rule(leaves[0], leaves[1], v, z, beta=beta, dt_bias=leaves[2], **kw)
    assert _rel(o0, o1.detach().double()) < 1e-5 and _rel(s0, s1.detach().double()) < 1e-5
    (o1.sum() + s1.sum()).backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0 for t in leaves)


def test_a_dt_bias_of_the_wrong_size_is_refused():
    H, HV, K, V = 1, 2, 16, 16
    q, k, v, z, beta, A_log, _ = inputs("gdn", 1, 1, H, HV, K, V, seed=0, **FLAGS).take(*NAMES)
    with pytest.raises(ValueError, match="dt_bias"):
        kdagen.fused_recurrent_gated_delta_rule(q, k, v, z, beta=beta, use_gate_in_kernel=True, A_log=A_log,
                                                dt_bias=torch.zeros(HV + 1))
