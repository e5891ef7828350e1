"""bf16 tensor-core operands emulated in the interpreter (tests/bf16_interpreter.py's patches)
for general DPLR's chunk forward and backward (chunk_dplr_delta_rule; run as a script, in its own
process: the patches hold for the whole process).

    python tests/bf16_dplr_interpreter.py CASE [CASE ...]    # prints {case: {output: rel. error}}

CASE is name:mode:B,T,H,HV,K,V with mode free (no bound: element-wise diagonal tiles, a strong
decay) or bound5 (safe_gate with gk >= -5 promised: factorised diagonal tiles).
"""
from __future__ import annotations

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import bf16_interpreter  # noqa: E402
import kdagen  # noqa: E402
from kdagen.spec.reference import naive_recurrent_dplr  # noqa: E402


def errors(mode, B, T, H, HV, K, V, seed=0) -> dict[str, float]:
    """Relative Frobenius error of o, the final state and every gradient against float64
    autograd through the token-by-token recurrence (FLA's (a, b) = the spec's (-b, a) inputs)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, HV, V, generator=gen)
    a = F.normalize(torch.randn(B, T, HV, K, generator=gen), dim=-1)
    b = -torch.rand(B, T, HV, 1, generator=gen) * F.normalize(
        a + 0.5 * torch.randn(B, T, HV, K, generator=gen) * K ** -0.5, dim=-1)
    g = F.logsigmoid(torch.randn(B, T, HV, K, generator=gen) + 2.0)
    if mode == "bound5":
        g = g.clamp(min=-5.0)
    else:
        g[:, T // 3] -= 8.0  # a strong decay, far below any bound a factorised tile could take
    h0 = 0.1 * torch.randn(B, HV, K, V, generator=gen)
    do = torch.randn(B, T, HV, V, generator=gen)
    dht = torch.randn(B, HV, K, V, generator=gen)
    leaves = dict(q=q, k=k, v=v, a=a, b=b, gk=g, initial_state=h0)
    gate = dict(safe_gate=True, lower_bound=-5.0) if mode == "bound5" else {}
    x = {n: t.clone().requires_grad_(True) for n, t in leaves.items()}
    o, ht = kdagen.chunk_dplr_delta_rule(**x, output_final_state=True, **gate)
    ((o * do).sum() + (ht * dht).sum()).backward()
    r = {n: t.double().requires_grad_(True) for n, t in leaves.items()}
    ro, rht = naive_recurrent_dplr(r["q"], r["k"], r["v"], -r["b"], r["a"], r["gk"], initial_state=r["initial_state"],
                                   output_final_state=True)
    ((ro * do.double()).sum() + (rht * dht.double()).sum()).backward()

    def rel(u, w):
        return float((u.double() - w).norm() / w.norm())

    out = {"o": rel(o.detach(), ro.detach()), "final_state": rel(ht.detach(), rht.detach())}
    out.update({f"d{n}": rel(x[n].grad, r[n].grad) for n in leaves})
    return out


def main(argv: list[str]) -> None:
    bf16_interpreter.install()
    result = {}
    for arg in argv:
        name, mode, dims = arg.split(":")
        result[name] = errors(mode, *(int(d) for d in dims.split(",")))
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
