"""The backward of `chunk_dplr_delta_rule` (the general DPLR structure, FLA's convention
``S_t = Diag(exp gk_t) S + b_t (a_t^T S) + k_t v_t^T``): the same three launches as KDA's
(:mod:`kdagen.ops.chunk_bwd`), after the forward's intermediates are at hand.

1. reverse state pass (``chunk_bwd_state.py.j2``, DPLR branch; grid: V tiles x sequences x value
   heads): with the forward's w = -W, aqk = A_qb and kg = b exp(G_n - G) KDA's lines are DPLR's
   dU = A_qb^T dO + kg dS and dS_0 = qg^T dO + W^T dU + Diag(exp G_n) dS; the branch adds the raw
   values' part of dv, dv0 = A_qk^T dO + kgv dS (aqv, kgv: the DPLR-only intermediates).  Writes
   dU, dv0, dS per chunk (dhs) and dh0.
2. chunk-parallel products over V (``chunk_bwd_dqkw.py.j2``, DPLR branch): dqg = dO S^T,
   dkg = U dS^T, dw = -dU S^T, dA_qb = dO U^T, dgamma_n and the branch's dkgv = V dS^T and
   dA_qk = dO V^T.
3. intra-chunk gradients (``chunk_bwd_intra_dplr.py.j2``, a template of its own): recomputes G,
   A_ab, A_ak and L = (I - A_ab)^-1 from the inputs, and writes dq, dk (per value head), dv, da,
   db and dgk.

The math.  Per chunk of n rows and head, G = inclusive cumsum of gk, G⁻ = G - gk, G_n = G at the
last row, S_0 the state entering the chunk:

    A_ab[t,s] = Σ_d a_td b_sd exp(G⁻_td - G_sd)  (s < t)     A_ak: the same with k for b
    A_qb[t,s] = scale Σ_d q_td b_sd exp(G_td - G_sd) (s <= t)  A_qk: the same with k for b
    L = (I - A_ab)^-1,  W = L (a ⊙ exp G⁻),  U0 = L A_ak V,  U = W S_0 + U0  (U_t = a_t^T S_{t-1})
    O = scale (q ⊙ exp G) S_0 + A_qb U + A_qk V
    S_n = Diag(exp G_n) S_0 + (b ⊙ exp(G_n - G))^T U + (k ⊙ exp(G_n - G))^T V

and the forward writes qg = scale q ⊙ exp G, w = -W, u = U0, aqk = A_qb, aqv = A_qk,
kg = b ⊙ exp(G_n - G), kgv = k ⊙ exp(G_n - G), gn = G_n, the per-chunk states and U (as V').
Backward, given dO and dS_n (with AG = a ⊙ exp G⁻, QG = qg, BI = b ⊙ exp(-G), KI = k ⊙ exp(-G),
BG = kg, KG = kgv):

    dU = A_qb^T dO + BG dS_n        dS_0 = QG^T dO + W^T dU + Diag(exp G_n) dS_n
    dY = L^T dU    dYw = L^T (dU S_0^T)    dV = A_qk^T dO + KG dS_n + A_ak^T dY
    dA_ab = strict_tril(dYw W^T + dY U0^T)   dA_ak = strict_tril(dY V^T)
    dA_qb = tril(dO U^T)                     dA_qk = tril(dO V^T)
    dAG = dYw + dA_ab BI + dA_ak KI          dQG = dO S_0^T + dA_qb BI + dA_qk KI
    dBI = dA_ab^T AG + dA_qb^T QG            dKI = dA_ak^T AG + dA_qk^T QG
    dBG = U dS_n^T                           dKG = V dS_n^T
    dq = dQG ⊙ exp G (times scale)   da = dAG ⊙ exp G⁻
    db = dBI ⊙ exp(-G) + dBG ⊙ exp(G_n - G)      dk = dKI ⊙ exp(-G) + dKG ⊙ exp(G_n - G)
    dgk_t = Σ_{t'>=t} c_t' + Σ_{t'>t} e_t' + f, with c = QG⊙dQG - BI⊙dBI - KI⊙dKI - BG⊙dBG - KG⊙dKG,
            e = AG⊙dAG and f = exp(G_n)⊙rowsum(S_0⊙dS_n) + Σ_t (BG⊙dBG + KG⊙dKG)

(checked against float64 autograd to 1e-15 in plain torch before the kernels were written; the
kernels compute every product on KDA's anchors, never the unfactorised exponentials above, and
``tests/dplr_chunk_ref.py`` holds the forward's intermediates in float64).
"""
from __future__ import annotations

import torch
import triton

from ..kernels import Launch, build, dummy_pointer
from .inputs import state_shape

# what the backward reads of the forward's intra launch (U comes from the state pass's V')
DPLR_KEPT_INTERMEDIATES = ("qg", "kg", "w", "aqk", "gn", "aqv", "kgv")


def prepare_dplr_bwd(meta, inputs: dict[str, torch.Tensor], inter: dict[str, torch.Tensor], hs: torch.Tensor,
                     vn: torch.Tensor, do: torch.Tensor, dht: torch.Tensor | None, need_dh0: bool, built=None):
    """Allocate the gradient buffers and describe the three backward launches (run or compile).
    ``meta``: a :class:`kdagen.ops.chunk_bwd.BwdMeta` of a DPLR plan; ``inputs``: q, k, v, a, b, g
    (g is FLA's gk); ``inter``: :data:`DPLR_KEPT_INTERMEDIATES`."""
    plan, cfg = meta.plan, meta.config
    assert plan.structure == "dplr"
    if built is None:
        built = build(plan, cfg)
    B, T, H, HV, K, V, N, C = meta.B, meta.T, meta.H, meta.HV, meta.K, meta.V, meta.N, meta.C
    q = inputs["q"]
    dev = q.device
    f32 = torch.float32
    NTt = max(meta.NT_total, 1)
    bv = cfg.reverse_pass_block_v(plan)
    dummy = dummy_pointer(dev)
    du = torch.empty(B, T, HV, V, dtype=q.dtype, device=dev)  # a dot operand only (as KDA's)
    dv0 = torch.empty(B, T, HV, V, dtype=f32, device=dev)
    dhs = torch.empty(NTt, HV, K, V, dtype=hs.dtype, device=dev)
    dh0 = torch.empty(state_shape(N, HV, K, V, meta.state_v_first), dtype=f32, device=dev) if need_dh0 else None
    state_args = dict(qg=inter["qg"], kg=inter["kg"], w=inter["w"], aqk=inter["aqk"], gn=inter["gn"],
                      do=do, dht=dht if dht is not None else dummy, aqv=inter["aqv"], kgv=inter["kgv"],
                      du=du, dhs=dhs, dh0=dh0 if dh0 is not None else dummy, dv0=dv0,
                      cu_seqlens=meta.cu_seqlens, chunk_offsets=meta.chunk_offsets, T=T, NT=meta.NT)
    state = Launch("chunk_bwd_state", built.fns[0], (triton.cdiv(V, bv), N * HV), state_args,
                   dict(HV=HV, K=K, V=V, BT=C, BK=plan.BK, BV=bv, USE_DHT=dht is not None,
                        STORE_DH0=need_dh0, IS_VARLEN=meta.is_varlen, STATE_V_FIRST=meta.state_v_first),
                   cfg.state_num_warps, cfg.state_num_stages)
    dqg = torch.empty(B, T, HV, K, dtype=f32, device=dev)
    dkg = torch.empty_like(dqg)
    dkgv = torch.empty_like(dqg)
    dw = torch.empty(B, T, HV, K, dtype=q.dtype, device=dev)  # a dot operand only
    daqk = torch.empty(B, T, HV, C, dtype=f32, device=dev)
    daqv = torch.empty_like(daqk)
    dgn = torch.empty(NTt, HV, K, dtype=f32, device=dev)
    dqkw_args = dict(vn=vn, hs=hs, dhs=dhs, du=du, do=do, v=inputs["v"],
                     dqg=dqg, dkg=dkg, dw=dw, daqk=daqk, dgn=dgn, dkgv=dkgv, daqv=daqv,
                     cu_seqlens=meta.cu_seqlens, chunk_indices=meta.chunk_indices, T=T, NT=meta.NT)
    bk = min(cfg.dqkw_block_k, plan.BK)
    dqkw = Launch("chunk_bwd_dqkw", built.fns[1], (meta.NT_total, HV, triton.cdiv(K, bk)), dqkw_args,
                  dict(HV=HV, K=K, V=V, BT=C, BK=bk, BV=min(cfg.dqkw_block_v, plan.BV), IS_VARLEN=meta.is_varlen),
                  cfg.dqkw_num_warps, cfg.dqkw_num_stages)
    # dq and dk per value head (fp32 until the GVA sum when HV > H); da, db, dv in their inputs' dtypes
    dqk_dtype = q.dtype if HV == H else f32
    dq = torch.empty(B, T, HV, K, dtype=dqk_dtype, device=dev)
    dk = torch.empty_like(dq)
    da = torch.empty(B, T, HV, K, dtype=inputs["a"].dtype, device=dev)
    db = torch.empty(B, T, HV, K, dtype=inputs["b"].dtype, device=dev)
    dg = torch.empty(B, T, HV, K, dtype=f32, device=dev)
    dv = torch.empty(B, T, HV, V, dtype=inputs["v"].dtype, device=dev)
    intra_args = dict(q=q, k=inputs["k"], v=inputs["v"], a=inputs["a"], b=inputs["b"], g=inputs["g"],
                      du=du, vn=vn, dv0=dv0, dqg=dqg, dkg=dkg, dkgv=dkgv, dw=dw, daqk=daqk, daqv=daqv, dgn=dgn,
                      dq=dq, dk=dk, dv=dv, da=da, db=db, dg=dg,
                      cu_seqlens=meta.cu_seqlens, chunk_indices=meta.chunk_indices, T=T, NT=meta.NT,
                      scale=float(meta.scale))
    intra = Launch("chunk_bwd_intra", built.fns[2], (meta.NT_total, HV), intra_args,
                   dict(H=H, HV=HV, K=K, V=V, BT=C, BC=cfg.sub_chunk, BK=min(cfg.intra_block_k, plan.BK),
                        BV=min(cfg.intra_block_v, plan.BV), IS_VARLEN=meta.is_varlen),
                   cfg.intra_num_warps, cfg.intra_num_stages)
    outputs = dict(dq=dq, dk=dk, dv=dv, da=da, db=db, dg=dg, dh0=dh0)
    return (state, dqkw, intra), outputs


def run_dplr_bwd(meta, inputs, inter, hs, vn, do, dht, need_dh0):
    """Run the three launches; the gradients of q, k (summed over a q/k head's value heads),
    v, a, b, g (fp32) and the initial state (fp32, or None)."""
    launches, out = prepare_dplr_bwd(meta, inputs, inter, hs, vn, do.contiguous(),
                                     None if dht is None else dht.contiguous(), need_dh0)
    for launch in launches:
        launch()
    B, T, H, HV, K = meta.B, meta.T, meta.H, meta.HV, meta.K
    dq, dk = out["dq"], out["dk"]
    if HV != H:  # GVA: value heads hv of one q/k head h are h * (HV // H) ... (h + 1) * (HV // H) - 1
        dq = dq.view(B, T, H, HV // H, K).sum(3)
        dk = dk.view(B, T, H, HV // H, K).sum(3)
    return dict(out, dq=dq, dk=dk)

