"""chunk_kda (the chunkwise Triton kernels, run in the CPU interpreter) against the float64
token-by-token reference ``naive_recurrent_kda``.

The matrix is a hand-picked cover, not a Cartesian product: every value of every axis
(T, K/V, varlen, initial state, GVA, gate path, gate at its bound, beta at 0/1, in-kernel
gate forms, chunk sizes, dtypes) appears in at least one case.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pytest
import torch

from cases import in_kernel_gate, make_inputs, reference
from conftest import F64, TOL, assert_close, cdiv, params, rel_err, run_poisoned
from plain_configs import plain_fwd

import kdagen
from kdagen.config import ChunkFwdConfig
from kdagen.ops.chunk import chunk_kda_launches
from kdagen.spec.reference import kda_gate, naive_recurrent_kda

VARLEN = [0, 1, 40, 41, 105]  # a length-1 sequence, lengths straddling chunk boundaries


@dataclass
class Case:
    id: str
    B: int
    T: int
    H: int
    HV: int
    K: int
    V: int
    dtype: torch.dtype = torch.float32
    gate: str = "safe"  # safe | free | gik_lb | gik_sp
    h0: bool = True
    cu: Optional[list] = None
    g_mode: str = "random"  # random | lb
    g_lo: float = -5.0  # random gates lie in [g_lo, 0)
    beta: str = "random"  # random | zero | one
    C: Optional[int] = None  # chunk size via config (None: the op's default config)
    cfg: Optional[dict] = None  # other ChunkFwdConfig fields (with C, or C=64)
    seed: int = 0

    @property
    def Ttot(self):
        return self.cu[-1] if self.cu else self.T


F32, F16 = torch.float32, torch.float16

CASES = [
    # --- lengths x head dims x gate paths (fp32)
    Case("T1-K16V16-safe-B2", 2, 1, 1, 1, 16, 16, gate="safe"),
    Case("T1-K64V64-free-noh0", 1, 1, 1, 2, 64, 64, gate="free", h0=False),
    Case("T17-K64V64-free-gva2x4-B2", 2, 17, 2, 4, 64, 64, gate="free"),
    Case("T17-K96V96-safe", 1, 17, 1, 1, 96, 96, gate="safe"),
    Case("T64-K64V64-safe-gva1x2-noh0", 1, 64, 1, 2, 64, 64, gate="safe", h0=False),
    Case("T64-K16V64-free", 1, 64, 1, 1, 16, 64, gate="free"),
    Case("T130-K96V16-safe", 1, 130, 1, 1, 96, 16, gate="safe"),
    Case("T130-K16V64-free-gva1x2-B2", 2, 130, 1, 2, 16, 64, gate="free"),
    Case("T130-K96V96-free-noh0", 1, 130, 1, 1, 96, 96, gate="free", h0=False),
    Case("T130-K64V96-safe-gva2x4", 1, 130, 2, 4, 64, 96, gate="safe"),
    # --- varlen (length-1 sequence, lengths straddling chunks)
    Case("varlen-K64V64-safe-gva1x2", 1, 105, 1, 2, 64, 64, gate="safe", cu=VARLEN),
    Case("varlen-K96V16-free-noh0", 1, 105, 1, 1, 96, 16, gate="free", cu=VARLEN, h0=False),
    Case("varlen-K16V64-safe-C32", 1, 105, 1, 1, 16, 64, gate="safe", cu=VARLEN, C=32),
    Case("varlen-single-token", 1, 1, 1, 1, 64, 64, gate="free", cu=[0, 1]),
    Case("varlen-empty-sequences", 1, 37, 1, 2, 32, 32, gate="safe", cu=[0, 0, 20, 20, 37]),
    # --- gates exactly at the lower bound everywhere
    Case("g-at-lb-safe-T130", 1, 130, 1, 1, 64, 64, gate="safe", g_mode="lb"),
    Case("g-at-lb-free-T64-C64", 1, 64, 1, 2, 64, 64, gate="free", g_mode="lb", C=64),
    # --- beta identically 0 / 1
    # (beta = 0 leaves only the decayed initial state: milder gates keep it above fp32's
    # underflow after 64 tokens, exp(-5 * 64) would be 0 in any float32 computation)
    Case("beta0-safe", 1, 64, 1, 1, 64, 64, gate="safe", beta="zero", g_lo=-1.0),
    Case("beta1-free", 1, 130, 1, 1, 64, 64, gate="free", beta="one"),
    Case("beta1-safe-lb", 1, 64, 1, 2, 64, 64, gate="safe", beta="one", g_mode="lb"),
    # --- in-kernel gate: lower-bound and softplus forms
    Case("gik-lowerbound", 1, 64, 1, 2, 64, 64, gate="gik_lb"),
    Case("gik-lowerbound-varlen", 1, 105, 1, 2, 96, 16, gate="gik_lb", cu=VARLEN),
    Case("gik-softplus", 1, 130, 1, 2, 64, 64, gate="gik_sp"),
    Case("gik-softplus-varlen-noh0", 1, 105, 1, 1, 16, 64, gate="gik_sp", cu=VARLEN, h0=False),
    # --- chunk sizes and the other config choices
    Case("C32-safe-T130", 1, 130, 1, 1, 64, 64, gate="safe", C=32),
    Case("C32-free-T130", 1, 130, 1, 2, 64, 64, gate="free", C=32),
    Case("C64-safe-T130", 1, 130, 1, 1, 64, 64, gate="safe", C=64),
    Case("C64-free-T130-K96", 1, 130, 1, 1, 96, 96, gate="free", C=64),
    Case("no-prefetch-2stages-BV16-safe-g-at-lb-T130", 1, 130, 1, 1, 64, 64, gate="safe", g_mode="lb",
         cfg=dict(state_prefetch=False, state_num_stages=2, state_block_v=16)),
    Case("factors-fp32-gik-varlen-C32", 1, 105, 1, 2, 96, 16, gate="gik_lb", cu=VARLEN, C=32,
         cfg=dict(factor_precision="fp32", state_block_v=64)),
    # --- the solve's loads issued ahead (solve_load_ahead): each half's together, and the second
    # half's before the first half's inverse; masked channels, varlen, the element-wise path
    Case("load-ahead-2-safe-varlen-K96V16", 1, 105, 1, 2, 96, 16, gate="safe", cu=VARLEN, C=64,
         cfg=dict(solve_load_ahead=2)),
    Case("load-ahead-1-below-bound-T130", 1, 130, 1, 1, 64, 64, gate="safe", g_mode="below", C=64,
         cfg=dict(solve_load_ahead=1)),
    Case("load-ahead-2-gik-T100", 1, 100, 1, 2, 64, 64, gate="gik_lb", C=64, cfg=dict(solve_load_ahead=2)),
    Case("fp16-load-ahead-1-C32-free", 1, 64, 1, 1, 64, 64, dtype=F16, gate="free", C=32,
         cfg=dict(solve_load_ahead=1)),
    # --- the solve over K tiles (solve_k_tile): one and two halves, masked channels (K=96 on 128), varlen,
    # an in-kernel gate (its bias per tile), the element-wise path after the tiles, fp16, tiles of 16
    Case("k-tiles-32-safe-varlen-K96V16", 1, 105, 1, 2, 96, 16, gate="safe", cu=VARLEN, C=64,
         cfg=dict(solve_k_tile=32)),
    Case("k-tiles-64-free-C32-K96", 1, 130, 1, 1, 96, 96, gate="free", C=32, cfg=dict(solve_k_tile=64)),
    Case("k-tiles-32-gik-softplus-T100", 1, 100, 1, 2, 64, 64, gate="gik_sp", C=64, cfg=dict(solve_k_tile=32)),
    Case("k-tiles-16-below-bound-T130", 1, 130, 1, 1, 64, 64, gate="safe", g_mode="below", C=64,
         cfg=dict(solve_k_tile=16)),
    Case("k-tiles-32-minus-inf-C32-varlen", 1, 105, 1, 1, 64, 32, gate="free", g_mode="inf", cu=VARLEN, C=32,
         cfg=dict(solve_k_tile=32)),
    Case("fp16-k-tiles-32-gva2x4", 1, 105, 2, 4, 64, 64, dtype=F16, gate="safe", cu=VARLEN, C=64,
         cfg=dict(solve_k_tile=32)),
    # --- gates the factorised path cannot take (below the promised bound, -inf resets): the
    # element-wise path of the sub-tiles concerned gives the recurrence's answer
    Case("g-below-bound-safe-T130", 1, 130, 1, 2, 64, 64, gate="safe", g_mode="below"),
    Case("g-minus-inf-free-varlen", 1, 105, 1, 1, 32, 32, gate="free", g_mode="inf", cu=VARLEN),
    Case("g-minus-inf-safe-C32", 1, 100, 1, 1, 64, 64, gate="safe", g_mode="inf", C=32),
    # --- fp16 inputs (g and state float32)
    Case("fp16-T1-safe-B2", 2, 1, 1, 1, 64, 64, dtype=F16, gate="safe"),
    Case("fp16-T64-safe", 1, 64, 1, 1, 64, 64, dtype=F16, gate="safe"),
    Case("fp16-T130-free-K96V16", 1, 130, 1, 1, 96, 16, dtype=F16, gate="free"),
    Case("fp16-varlen-free-gva2x4", 1, 105, 2, 4, 64, 64, dtype=F16, gate="free", cu=VARLEN),
    Case("fp16-T17-free-K16V96-C64", 1, 17, 1, 1, 16, 96, dtype=F16, gate="free", C=64),
    Case("fp16-C32-below-bound", 1, 64, 1, 1, 64, 64, dtype=F16, gate="safe", g_mode="below", C=32),
]


def _gate_kwargs(case: Case, x, gen_seed: int):
    """(kwargs for chunk_kda, the float64 log decay the reference uses)."""
    if case.gate == "safe":
        return dict(safe_gate=True, lower_bound=-5.0), x.g.to(F64)
    if case.gate == "free":
        return {}, x.g.to(F64)
    A_log, dt_bias = in_kernel_gate(gen_seed, case.HV, case.K)
    lb = -5.0 if case.gate == "gik_lb" else None
    kw = dict(use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
    if lb is not None:
        kw["lower_bound"] = lb
    return kw, kda_gate(x.g, A_log, dt_bias, lower_bound=lb)


def _inputs(case: Case):
    return make_inputs(case.B, case.Ttot, case.H, case.HV, case.K, case.V, dtype=case.dtype, seed=case.seed,
                       h0=case.h0, gate="raw" if case.gate.startswith("gik") else case.g_mode,
                       beta=case.beta, cu_seqlens=case.cu, g_lo=case.g_lo)


def _config(case: Case):
    if case.C is None and not case.cfg:
        return None
    cfg = dict(case.cfg or {})
    if case.dtype == F16:  # bf16 operands are wrong in Triton's interpreter: the tf32 inverse
        cfg.setdefault("inverse_precision", "tf32")
    return plain_fwd(chunk_size=case.C or 64, **cfg)


# the cases the interpreter takes well over half a second for (the quick subset leaves them out)
SLOW = {
    'C64-free-T130-K96', 'T130-K16V64-free-gva1x2-B2', 'T130-K64V96-safe-gva2x4', 'T17-K64V64-free-gva2x4-B2',
    'factors-fp32-gik-varlen-C32', 'fp16-T130-free-K96V16', 'g-below-bound-safe-T130', 'fp16-varlen-free-gva2x4', 'gik-lowerbound',
    'gik-lowerbound-varlen', 'gik-softplus', 'gik-softplus-varlen-noh0', 'varlen-K64V64-safe-gva1x2'
}


@pytest.mark.parametrize("case", params(CASES, [c.id for c in CASES], SLOW))
def test_chunk_kda_matches_reference(case: Case):
    x = _inputs(case)
    kw, g64 = _gate_kwargs(case, x, case.seed)
    h0_before = None if x.h0 is None else x.h0.clone()
    o, ht = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, output_final_state=True,
                             cu_seqlens=x.cu_seqlens, config=_config(case), **kw)
    ro, rh = reference("kda", x, g=g64)
    tol = TOL[case.dtype]
    assert o.dtype == case.dtype and tuple(o.shape) == (case.B, case.Ttot, case.HV, case.V)
    assert ht.dtype == torch.float32 and tuple(ht.shape) == tuple(rh.shape)
    assert_close(o, ro, tol, "o")
    assert_close(ht, rh, tol, "final state")
    if h0_before is not None:
        assert torch.equal(x.h0, h0_before), "chunk_kda modified initial_state"


# ------------------------------------------------------------------ every element written

POISON_CASES = [c for c in CASES if c.id in {
    "T130-K96V16-safe", "varlen-K96V16-free-noh0", "varlen-K16V64-safe-C32", "T17-K64V64-free-gva2x4-B2",
    "g-minus-inf-safe-C32"}]


@pytest.mark.parametrize("case", params(POISON_CASES, [c.id for c in POISON_CASES], {
    'T17-K64V64-free-gva2x4-B2', 'varlen-K96V16-free-noh0'
}))
def test_chunk_kda_writes_every_element(case: Case):
    """The op's outputs and the intermediates between its two launches are filled with NaN
    before the kernels run: nothing may stay unwritten or be read from a masked-off row."""
    x = _inputs(case)
    kw, g64 = _gate_kwargs(case, x, case.seed)
    launches, (o, ht, hs) = chunk_kda_launches(
        x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, output_final_state=True,
        return_intermediate_states=True, cu_seqlens=x.cu_seqlens, config=_config(case), **kw)
    run_poisoned(launches, (o, ht, hs))
    ro, rh = reference("kda", x, g=g64)
    assert_close(o, ro, TOL[case.dtype], "o")
    assert_close(ht, rh, TOL[case.dtype], "final state")
    assert torch.isfinite(hs).all(), "some intermediate state was not written"


# ------------------------------------------------------------------ intermediate states


def _prefix_states(x, g64, C, seqlens):
    """Reference state entering every chunk, in chunk_kda's order (sequence-major)."""
    q, k, v, _, beta = x.ref_args()
    h0 = x.h0.to(F64)
    states = []
    for n, (a, b) in enumerate(zip(seqlens, seqlens[1:])):
        for c in range(cdiv(b - a, C)):
            if c == 0:
                states.append(h0[n])
                continue
            e = a + c * C
            sl = lambda t: t[:, a:e]  # noqa: E731
            _, s = naive_recurrent_kda(sl(q), sl(k), sl(v), sl(g64), sl(beta), initial_state=h0[n:n + 1],
                                       output_final_state=True)
            states.append(s[0])
    return torch.stack(states)


@pytest.mark.slow
@pytest.mark.parametrize("C,cu,gate", [(32, None, "safe"), (64, VARLEN, "free")], ids=["B1-T100-C32", "varlen-C64"])
def test_chunk_kda_intermediate_states(C, cu, gate):
    T = cu[-1] if cu else 100
    x = make_inputs(1, T, 1, 2, 32, 48, seed=7, cu_seqlens=cu)
    kw = dict(safe_gate=True, lower_bound=-5.0) if gate == "safe" else {}
    out = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, output_final_state=True,
                           return_intermediate_states=True, cu_seqlens=x.cu_seqlens,
                           config=plain_fwd(chunk_size=C), **kw)
    assert len(out) == 3
    o, ht, hs = out
    seqlens = cu if cu else [0, T]
    ref = _prefix_states(x, x.g.to(F64), C, seqlens)
    # FLA's layout: [B, NT, HV, K, V] (B = 1 here), [1, NT_total, HV, K, V] with cu_seqlens
    assert tuple(hs.shape) == (1,) + tuple(ref.shape), (tuple(hs.shape), tuple(ref.shape))
    assert hs.dtype == torch.float32
    hs = hs[0]
    for c in range(ref.shape[0]):
        assert_close(hs[c], ref[c], TOL[torch.float32], f"state entering chunk {c}")
    q, k, v, g, beta = x.ref_args()
    ro, rh = naive_recurrent_kda(q, k, v, g, beta, initial_state=x.h0.to(F64), output_final_state=True,
                                 cu_seqlens=x.cu_seqlens)
    assert_close(o, ro, TOL[torch.float32], "o")
    assert_close(ht, rh, TOL[torch.float32], "final state")


# ------------------------------------------------------------------ return conventions


@pytest.mark.slow
def test_chunk_kda_without_final_state_returns_none():
    x = make_inputs(1, 40, 1, 2, 64, 64, seed=3)
    o, ht = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, safe_gate=True, lower_bound=-5.0)
    assert ht is None
    q, k, v, g, beta = x.ref_args()
    ro, _ = naive_recurrent_kda(q, k, v, g, beta, initial_state=x.h0.to(F64))
    assert_close(o, ro, TOL[torch.float32], "o")
    # no state at all: o must still be right (a zero state, not garbage)
    o2, ht2 = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta)
    assert ht2 is None
    ro2, _ = naive_recurrent_kda(q, k, v, g, beta)
    assert_close(o2, ro2, TOL[torch.float32], "o without initial state")


@pytest.mark.parametrize("K,ahead,k_tile", [(64, 0, 0), (80, 0, 0), (80, 2, 0), (80, 0, 32)])
def test_chunk_kda_in_kernel_preprocessing_and_scale(monkeypatch, K, ahead, k_tile):
    """use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel with allow_neg_eigval and an
    explicit scale, against the reference fed the pre-processed inputs.  An inference call
    computes them inside the kernels: no torch pre-pass runs.  K=80: the norms of rows padded
    to 128 channels.  ahead: the solve's loads issued ahead (``solve_load_ahead``); k_tile: the
    solve over K tiles (``solve_k_tile``: the norms in a pass of their own over the tiles)."""
    from kdagen.ops import chunk_call as chunk_op

    def no_prepass(*a, **k):
        raise AssertionError("an inference call ran the torch pre-processing")

    monkeypatch.setattr(chunk_op, "preprocess", no_prepass)
    gen = torch.Generator().manual_seed(11)
    B, T, H, HV, V = 1, 50, 1, 2, 32
    q = 3 * torch.randn(B, T, H, K, generator=gen)
    k = 2 * torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, HV, V, generator=gen)
    g = -5.0 * (1 - torch.rand(B, T, HV, K, generator=gen))
    braw = 2 * torch.randn(B, T, HV, generator=gen)
    h0 = torch.randn(B, HV, K, V, generator=gen)
    o, ht = kdagen.chunk_kda(q, k, v, g, braw, scale=0.3, initial_state=h0, output_final_state=True,
                             use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True,
                             config=ChunkFwdConfig(solve_load_ahead=ahead, solve_k_tile=k_tile)
                             if ahead or k_tile else None)
    qn = torch.nn.functional.normalize(q.double(), dim=-1)
    kn = torch.nn.functional.normalize(k.double(), dim=-1)
    beta = 2 * torch.sigmoid(braw.double())
    ro, rh = naive_recurrent_kda(qn, kn, v.double(), g.double(), beta, scale=0.3, initial_state=h0.double(),
                                 output_final_state=True)
    assert_close(o, ro, TOL[torch.float32], "o")
    assert_close(ht, rh, TOL[torch.float32], "final state")
    assert rel_err(o, ro) < 1e-5


def test_explicit_sub_chunk_beyond_the_gate_bound_is_refused_or_exact():
    """lower_bound=-5 makes factorised sub-tiles of at most 16 tokens safe (|g_min| * BC <= 80,
    exp(80) still fits float32).  An explicit config asking for sub_chunk=32 must either be
    refused with a ValueError (ConfigError is one) or still give the right answer -- not
    overflow silently."""
    x = make_inputs(1, 64, 1, 1, 32, 32, seed=9)
    try:
        cfg = plain_fwd(chunk_size=64, sub_chunk=32)
        o, ht = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, output_final_state=True,
                                 safe_gate=True, lower_bound=-5.0, config=cfg)
    except ValueError as e:
        assert "sub_chunk" in str(e)
        return
    q, k, v, g, beta = x.ref_args()
    ro, rh = naive_recurrent_kda(q, k, v, g, beta, initial_state=x.h0.to(F64), output_final_state=True)
    assert_close(o, ro, TOL[torch.float32], "o with sub_chunk=32")
    assert_close(ht, rh, TOL[torch.float32], "final state with sub_chunk=32")


def test_packed_call_with_host_offsets_reads_nothing_back(monkeypatch):
    """cu_seqlens_cpu (FLA's keyword) gives the chunk schedule its lengths: cu_seqlens itself is
    not read on the host (on a GPU that read is a synchronisation), and the result is the same."""
    x = make_inputs(1, VARLEN[-1], 1, 2, 32, 32, seed=5, cu_seqlens=VARLEN)
    ref = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, output_final_state=True,
                           cu_seqlens=x.cu_seqlens, safe_gate=True, lower_bound=-5.0)
    cu = x.cu_seqlens
    real_tolist = torch.Tensor.tolist

    def guarded(t):
        assert t is not cu, "cu_seqlens was read back to the host"
        return real_tolist(t)

    monkeypatch.setattr(torch.Tensor, "tolist", guarded)
    got = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, output_final_state=True,
                           cu_seqlens=cu, cu_seqlens_cpu=torch.tensor(VARLEN), safe_gate=True, lower_bound=-5.0)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    with pytest.raises(ValueError, match="cu_seqlens_cpu"):
        kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, cu_seqlens=cu, cu_seqlens_cpu=torch.tensor([0, 3]))


def test_opt_in_value_check_names_the_first_bad_element():
    """check_inputs=True: a g below the promised bound is refused with its index; the default
    (no check) computes the recurrence for it (the inference kernels' element-wise path)."""
    x = make_inputs(1, 40, 1, 1, 32, 32, seed=2)
    g = x.g.clone()
    g[0, 7, 0, 3] = -9.0
    with pytest.raises(ValueError, match=r"g\[0, 7, 0, 3\]"):
        kdagen.chunk_kda(x.q, x.k, x.v, g, x.beta, safe_gate=True, lower_bound=-5.0, check_inputs=True)
    o, _ = kdagen.chunk_kda(x.q, x.k, x.v, g, x.beta, safe_gate=True, lower_bound=-5.0)
    q, k, v, _, beta = x.ref_args()
    ro, _ = naive_recurrent_kda(q, k, v, g.to(F64), beta)
    assert_close(o, ro, TOL[torch.float32], "o with g below the bound, unchecked")


def test_chunk_size_keyword_as_fla(monkeypatch):
    """chunk_size=32 or 64 pins the chunk length (of the training forward and backward too);
    anything else is FLA's ValueError, not an unexpected-keyword TypeError."""
    from kdagen.kernels import Launch

    x = make_inputs(1, 70, 1, 1, 32, 32, seed=4)
    seen = []
    real = Launch.__call__

    def spy(self):
        seen.append(self.constexprs["BT"])
        return real(self)

    monkeypatch.setattr(Launch, "__call__", spy)
    q, k, v, g, beta = x.ref_args()
    ro, _ = naive_recurrent_kda(q, k, v, g, beta, initial_state=x.h0.to(F64))
    for C in (32, 64):
        seen.clear()
        o, _ = kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, chunk_size=C)
        assert seen == [C, C]
        assert_close(o, ro, TOL[torch.float32], f"o at chunk_size={C}")
    seen.clear()
    leaves = {n: t.clone().requires_grad_(True) for n, t in dict(q=x.q, k=x.k, v=x.v).items()}
    o, _ = kdagen.chunk_kda(**leaves, g=x.g, beta=x.beta, chunk_size=64)
    o.sum().backward()
    assert seen and all(c == 64 for c in seen)  # training forward, re-run and backward
    for bad in (16, 48, 128):
        with pytest.raises(ValueError, match=r"`chunk_size` must be either 32 or 64"):
            kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, chunk_size=bad)
    with pytest.raises(ValueError, match="disagrees"):
        kdagen.chunk_kda(x.q, x.k, x.v, x.g, x.beta, chunk_size=32, config=ChunkFwdConfig(chunk_size=64))
