"""bf16 tensor-core operands emulated in the interpreter (tests/bf16_interpreter.py's patches)
for Gated DeltaNet and DeltaNet's chunk forward and backward (run as a script, in its own
process: the patches hold for the whole process).

    python tests/bf16_family_interpreter.py CASE [CASE ...]    # prints {case: {output: rel. error}}

CASE is name:member:B,T,H,HV,K,V with member gdn, deltanet, deltanet_fold (DeltaNet's backward with
the split intra gradients folded into dqkw and chunk_bwd_wy, ChunkBwdConfig.intra_fold), gla (no bound:
element-wise diagonal tiles) or gla5 (GLA told g >= -5: factorised diagonal tiles, and the inputs kept
above it).
"""
from __future__ import annotations

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import bf16_interpreter  # noqa: E402
import kdagen  # noqa: E402
from kdagen.spec.reference import naive_recurrent_deltanet, naive_recurrent_gdn, naive_recurrent_gla  # noqa: E402


def errors(member, B, T, H, HV, K, V, seed=0) -> dict[str, float]:
    """Relative Frobenius error of o, the final state and every gradient against float64
    autograd through the token-by-token recurrence."""
    if member == "deltanet_fold":
        from kdagen.ops.chunk import chunk_bwd_config
        from plain_configs import plain_bwd

        with chunk_bwd_config(plain_bwd(intra_split=True, intra_fold=True, intra_block_k=16, dqkw_block_k=32)):
            return errors("deltanet", B, T, H, HV, K, V, seed)
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, HV, V, generator=gen)
    gla = member in ("gla", "gla5")
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, HV, *((K,) if gla else ()), generator=gen) + 2.0)
    if member == "gla5":
        g = g.clamp(min=-5.0)
    else:
        g[:, T // 3] -= 8.0  # a strong decay, far below any bound a factorised tile could take
    beta = torch.sigmoid(torch.randn(B, T, HV, generator=gen))
    h0 = 0.1 * torch.randn(B, HV, K, V, generator=gen)
    do = torch.randn(B, T, HV, V, generator=gen)
    dht = torch.randn(B, HV, K, V, generator=gen)
    leaves = dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0)
    if member == "deltanet":
        del leaves["g"]
    if gla:
        del leaves["beta"]
    op = kdagen.chunk_gated_delta_rule if member == "gdn" else kdagen.chunk_delta_rule
    if gla:
        op = (lambda **a: kdagen.chunk_gla(**a, safe_gate=True, lower_bound=-5.0)) if member == "gla5" else kdagen.chunk_gla
    with torch.no_grad():  # the inference kernels (solve and pass; the pass's dots take bf16 operands)
        oi, hti = op(**leaves, output_final_state=True)
    x = {n: t.clone().requires_grad_(True) for n, t in leaves.items()}
    r = {n: t.double().requires_grad_(True) for n, t in leaves.items()}
    if gla:
        o, ht = op(**x, output_final_state=True)
        ro, rht = naive_recurrent_gla(r["q"], r["k"], r["v"], r["g"], initial_state=r["initial_state"],
                                      output_final_state=True)
    elif member == "gdn":
        o, ht = kdagen.chunk_gated_delta_rule(**x, output_final_state=True)
        ro, rht = naive_recurrent_gdn(r["q"], r["k"], r["v"], r["g"], r["beta"], initial_state=r["initial_state"],
                                      output_final_state=True)
    else:
        o, ht = kdagen.chunk_delta_rule(**x, output_final_state=True)
        ro, rht = naive_recurrent_deltanet(r["q"], r["k"], r["v"], r["beta"], initial_state=r["initial_state"],
                                           output_final_state=True)
    ((o * do).sum() + (ht * dht).sum()).backward()
    ((ro * do.double()).sum() + (rht * dht.double()).sum()).backward()

    def rel(a, b):
        return float((a.double() - b).norm() / b.norm())

    out = {"o": rel(o.detach(), ro.detach()), "final_state": rel(ht.detach(), rht.detach()),
           "o_inference": rel(oi, ro.detach()), "final_state_inference": rel(hti, rht.detach())}
    out.update({f"d{n}": rel(x[n].grad, r[n].grad) for n in leaves})
    return out


def main(argv: list[str]) -> None:
    bf16_interpreter.install()
    result = {}
    for arg in argv:
        name, member, dims = arg.split(":")
        result[name] = errors(member, *(int(d) for d in dims.split(",")))
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
