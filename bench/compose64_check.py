"""Design check (CPU, Triton's interpreter): the state passes on 64-row steps fed by the 32-row intra
launches.  Not a kernel: it checks the algebra a future pair-composition launch and 64-row passes
would use against the per-chunk tensors today's kernels write.

The training forward's states-only pass walks 32-row chunks, two dependent dots per chunk
(V' = U - W S, then S <- Diag(exp G_n) S + kg^T V'); FLA's state kernels walk 64-row chunks, so half
the sequential steps (bench/RESULTS.md, session 19).  For a pair of chunks (a, b) the two steps
compose into one, with per-pair tensors that do not depend on S (computable chunk-parallel):

    P      = W_b kg_a^T                                   [C, C]
    W64    = [W_a ; W_b Diag(exp gn_a) - P W_a]           [2C, K]
    U64    = [U_a ; U_b - P U_a]                          [2C, V]
    kg64   = [kg_a Diag(exp gn_b) ; kg_b]                 [2C, K]
    V'64   = U64 - W64 S          (= [V'_a ; V'_b])
    S_end  = Diag(exp(gn_a + gn_b)) S + kg64^T V'64
    S_mid  = Diag(exp gn_a) S + kg_a^T V'64[:C]           (off the chain: hs of chunk b)

The reverse pass likewise (dS: the gradient w.r.t. the state leaving b; Q = kg_a W_b^T = P^T):

    KG64   = [kg_a Diag(exp gn_b) - Q kg_b ; kg_b]
    A64^T  = [[A_a^T, kg_a qg_b^T - Q A_b^T], [0, A_b^T]]  [2C, 2C]
    dV'64  = A64^T dO64 + KG64 dS  (= [dV'_a ; dV'_b], the du rows)
    dS_out = Diag(exp(gn_a + gn_b)) dS + [qg_a ; qg_b Diag(exp gn_a)]^T dO64
             - [W_a ; W_b Diag(exp gn_a)]^T dV'64
    dS_mid = Diag(exp gn_b) dS + qg_b^T dO_b - W_b^T dV'64[C:]   (off the chain: dhs of chunk a)

    TRITON_INTERPRET=1 PYTHONPATH=. python3 bench/compose64_check.py

prints the largest relative difference of each composed quantity from what the kernels wrote (fp32
inputs: ~1e-6 expected).  tests/test_compose64_check.py runs it.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

C = 32


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def check(T: int = 128, K: int = 32, V: int = 24, HV: int = 2, seed: int = 3) -> dict:
    """Run KDA's training launches (fp32, one sequence of ``T`` tokens, ``T`` a multiple of 64) in
    the interpreter and compare the composed 64-row steps with the per-chunk tensors they wrote."""
    import torch.nn.functional as F

    from kdagen.config import ChunkBwdConfig, ChunkTrainConfig
    from kdagen.ops.chunk import chunk_kda_bwd_launches

    assert T % (2 * C) == 0, "whole pairs of chunks only"
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, T, 1, K, generator=gen)
    k = F.normalize(torch.randn(1, T, 1, K, generator=gen), dim=-1)
    v = torch.randn(1, T, HV, V, generator=gen)
    g = F.logsigmoid(torch.randn(1, T, HV, K, generator=gen) + 3.0).clamp_min(-5.0)
    beta = torch.rand(1, T, HV, generator=gen)
    do = torch.randn(1, T, HV, V, generator=gen)
    h0 = torch.randn(1, HV, K, V, generator=gen)
    dht = torch.randn(1, HV, K, V, generator=gen)
    fwd, bwd, _ = chunk_kda_bwd_launches(q, k, v, g, beta, initial_state=h0, output_final_state=True, safe_gate=True,
                                         lower_bound=-5.0, config=ChunkTrainConfig(), bwd_config=ChunkBwdConfig(),
                                         do=do, dht=dht)
    for ln in list(fwd) + list(bwd):
        ln()
    st = fwd[1].args
    rev = next(ln for ln in bwd if ln.kernel == "chunk_bwd_state").args
    NT = T // C
    ch = lambda x, c: x[0, c * C:(c + 1) * C, h]  # noqa: E731  [C, D] rows of chunk c, head h
    worst = dict(fwd_vn=0.0, fwd_s_end=0.0, fwd_s_mid=0.0, rev_du=0.0, rev_ds_out=0.0, rev_ds_mid=0.0)
    for h in range(HV):
        for a in range(0, NT, 2):
            b = a + 1
            # -- forward
            Wa, Wb, Ua, Ub = ch(st["w"], a), ch(st["w"], b), ch(st["u"], a), ch(st["u"], b)
            ka, kb = ch(st["kg"], a), ch(st["kg"], b)
            ea, eb = st["gn"][a, h].exp(), st["gn"][b, h].exp()
            S = st["hs"][a, h].float()
            P = Wb @ ka.T
            W64 = torch.cat([Wa, Wb * ea[None, :] - P @ Wa])
            U64 = torch.cat([Ua, Ub - P @ Ua])
            kg64 = torch.cat([ka * eb[None, :], kb])
            vn64 = U64 - W64 @ S
            s_end = (ea * eb)[:, None] * S + kg64.T @ vn64
            s_mid = ea[:, None] * S + ka.T @ vn64[:C]
            want_end = st["hs"][a + 2, h] if a + 2 < NT else st["ht"][0, h]
            worst["fwd_vn"] = max(worst["fwd_vn"], _rel(vn64, torch.cat([ch(st["vn"], a), ch(st["vn"], b)])))
            worst["fwd_s_end"] = max(worst["fwd_s_end"], _rel(s_end, want_end.float()))
            worst["fwd_s_mid"] = max(worst["fwd_s_mid"], _rel(s_mid, st["hs"][b, h].float()))
            # -- reverse (the re-run's tiles, as the reverse pass reads them)
            Wa, Wb = ch(rev["w"], a), ch(rev["w"], b)
            # (the re-run's qg is q exp(G) where the pass takes the scale itself: qg here carries it)
            sq = rev.get("scale", 1.0)
            ka, kb, qa, qb = ch(rev["kg"], a), ch(rev["kg"], b), ch(rev["qg"], a) * sq, ch(rev["qg"], b) * sq
            Aa, Ab = ch(rev["aqk"], a), ch(rev["aqk"], b)  # [C, C]: row i, column j <= i
            ea, eb = rev["gn"][a, h].exp(), rev["gn"][b, h].exp()
            dO = torch.cat([ch(rev["do"], a), ch(rev["do"], b)])
            dS = rev["dhs"][b, h].float()  # the gradient w.r.t. the state leaving b
            Q = ka @ Wb.T
            KG64 = torch.cat([ka * eb[None, :] - Q @ kb, kb])
            A64t = torch.zeros(2 * C, 2 * C)
            A64t[:C, :C], A64t[C:, C:] = Aa.T, Ab.T
            A64t[:C, C:] = ka @ qb.T - Q @ Ab.T
            dvn64 = A64t @ dO + KG64 @ dS
            QG64 = torch.cat([qa, qb * ea[None, :]])
            Wr64 = torch.cat([Wa, Wb * ea[None, :]])
            ds_out = (ea * eb)[:, None] * dS + QG64.T @ dO - Wr64.T @ dvn64
            ds_mid = eb[:, None] * dS + qb.T @ dO[C:] - Wb.T @ dvn64[C:]
            want_out = rev["dhs"][a - 1, h] if a > 0 else rev["dh0"][0, h]
            worst["rev_du"] = max(worst["rev_du"], _rel(dvn64, torch.cat([ch(rev["du"], a), ch(rev["du"], b)])))
            worst["rev_ds_out"] = max(worst["rev_ds_out"], _rel(ds_out, want_out.float()))
            worst["rev_ds_mid"] = max(worst["rev_ds_mid"], _rel(ds_mid, rev["dhs"][a, h].float()))
    return worst


def main():
    res = check()
    for n, e in res.items():
        print(f"{n:12s} max rel. difference {e:.2e}")


if __name__ == "__main__":
    main()
