"""The DPLR training forward's intermediates in plain float64 torch (kdagen.ops.dplr_bwd's chunk
form, FLA's convention): what the backward kernels read, so they can be tested on their own.

``chunk_forward(q, k, v, a, b, g, h0, scale, C, cu)`` walks the chunks of every sequence and
returns dict(o, ht, hs [NT_total, HV, K, V] (the state entering each chunk), vn (U, the
pseudo-values), qg, kg, w, aqk, gn, aqv, kgv) with the fixed names and meanings.  gk below -40
(-inf included) is raised to -40, as the kernels do."""
from __future__ import annotations

import torch

F64 = torch.float64
G_FLOOR = -40.0


def _seq_bounds(B, T, cu):
    if cu is None:
        return [(n, 0, T) for n in range(B)]
    cu = [int(x) for x in cu]
    return [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]


def chunk_forward(q, k, v, a, b, g, h0, scale, C, cu=None):
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    q, k, v, a, b, g = (x.to(F64) for x in (q, k, v, a, b, g))
    q = q.repeat_interleave(HV // H, dim=2)
    k = k.repeat_interleave(HV // H, dim=2)
    g = g.clamp_min(G_FLOOR)
    out = dict(o=torch.zeros(B, T, HV, V, dtype=F64), vn=torch.zeros(B, T, HV, V, dtype=F64),
               qg=torch.zeros(B, T, HV, K, dtype=F64), kg=torch.zeros(B, T, HV, K, dtype=F64),
               w=torch.zeros(B, T, HV, K, dtype=F64), kgv=torch.zeros(B, T, HV, K, dtype=F64),
               aqk=torch.zeros(B, T, HV, C, dtype=F64), aqv=torch.zeros(B, T, HV, C, dtype=F64))
    hs, gn, ht = [], [], []
    for n, bos, eos in _seq_bounds(B, T, cu):
        S = (h0[len(ht)].to(F64) if h0 is not None else torch.zeros(HV, K, V, dtype=F64)).clone()
        for c0 in range(bos, eos, C):
            sl = slice(c0, min(c0 + C, eos))
            m = sl.stop - sl.start
            hs.append(S.clone())
            qq, kk, vv, aa, bb, gg = (x[n, sl].transpose(0, 1) for x in (q, k, v, a, b, g))  # [HV, m, .]
            G = gg.cumsum(1)
            Gm = G - gg
            Gn = G[:, -1]
            gn.append(Gn)
            st = torch.tril(torch.ones(m, m, dtype=torch.bool), -1)
            inc = torch.tril(torch.ones(m, m, dtype=torch.bool))
            AG, QG = aa * Gm.exp(), scale * qq * G.exp()
            BG, KG = bb * (Gn[:, None] - G).exp(), kk * (Gn[:, None] - G).exp()

            def prod(x, X, y, mask):
                e = torch.exp(X[:, :, None, :] - G[:, None, :, :])  # [HV, i, j, K]
                e = torch.where(mask[None, :, :, None], e, 0.)
                return torch.einsum("hid,hjd,hijd->hij", x, y, e)
            Aab, Aak = prod(aa, Gm, bb, st), prod(aa, Gm, kk, st)
            Aqb, Aqk = scale * prod(qq, G, bb, inc), scale * prod(qq, G, kk, inc)
            L = torch.linalg.inv(torch.eye(m, dtype=F64) - Aab)
            W = L @ AG
            U = W @ S + L @ (Aak @ vv)
            O = QG @ S + Aqb @ U + Aqk @ vv
            for name, x in (("o", O), ("vn", U), ("qg", QG), ("kg", BG), ("w", -W), ("kgv", KG)):
                out[name][n, sl] = x.transpose(0, 1)
            out["aqk"][n, sl, :, :m] = Aqb.transpose(0, 1)
            out["aqv"][n, sl, :, :m] = Aqk.transpose(0, 1)
            S = Gn.exp()[:, :, None] * S + BG.transpose(1, 2) @ U + KG.transpose(1, 2) @ vv
        ht.append(S)
    out["hs"] = torch.stack(hs) if hs else torch.zeros(1, HV, K, V, dtype=F64)
    out["gn"] = torch.stack(gn) if gn else torch.zeros(1, HV, K, dtype=F64)
    out["ht"] = torch.stack(ht)
    return out
