"""A member of the DPLR family that no library ships, written as a spec file.

KDA's recurrence, S_t = (I - beta_t k_t k_t^T) Diag(exp g_t) S_{t-1} + beta_t k_t v_t^T, with its
own bounded gate written in sympy:

    g = -C * sigmoid(z + dt_bias)        range (-C, 0), C = 3

(Kimi's gate is lower_bound * sigmoid(exp(A_log) (z + dt_bias)); this one has no rate and a
fixed bound of its own.)  Nothing else is needed: kdagen analyses the spec (KDA structure,
channel decay, gate bounded below by -3, so 16-token factorised sub-tiles are safe), lowers it,
prints the gate and its derivatives into the templates, and checks the kernels against the
spec's own float64 recurrence.

As a spec file for the command line (the file's ``SPEC``)::

    kdagen verify  --spec examples/custom_member.py:SPEC
    kdagen inspect --spec examples/custom_member.py:SPEC --head-dim 64 --gate-in-kernel spec
    kdagen build   --spec examples/custom_member.py:SPEC --gpu h100 --compile-only

Run as a script, it checks the spec against its own float64 recurrence and runs its generated
kernels -- the chunked forward (prefill) and the recurrent step (decode), with the gate computed
inside the kernels from the raw z -- on small shapes (a CPU runs them in Triton's interpreter:
``TRITON_INTERPRET=1 python examples/custom_member.py``).
"""
import sympy as sp

from kdagen import spec as S

C = 3.0  # the gate's bound: g lies in (-C, 0)

_c = sp.Symbol("c", positive=True)
GATE = S.gate_custom("sigmoid3", -_c * S.Sigmoid(S.z + S.dt_bias), S.z,
                     params=((S.dt_bias, "channel"),), constants=((_c, C),))

SPEC = S.Recurrence(
    "kda_sigmoid3", "channel", GATE,
    a=S.beta * S.k,                    # the rank-1 correction erases along beta k ...
    b=sp.exp(S.g) * S.k,               # ... from the decayed state (KDA's order)
    write_key=S.beta * S.k,            # and writes beta k v^T
    inputs=(S.Input("q", "query", ("K",)), S.Input("k", "key", ("K",)), S.Input("v", "value", ("V",)),
            S.Input("z", "gate", ("K",)), S.Input("beta", "beta", ())),
)


# --- running it -----------------------------------------------------------------------------
# kdagen.ops.member's generic entries run any spec the templates lower, with FLA's keywords:
# chunk_member (prefill and training, differentiable) and fused_recurrent_member (decode).


def main():
    import os

    import torch

    from kdagen.ops.member import chunk_member, fused_recurrent_member
    from kdagen.spec.evaluate import gate_values, spec_recurrence
    from kdagen.spec.structure import analyze_structure, safe_sub_chunk
    from kdagen import check_lowerable
    from kdagen.spec.verify import run_verify

    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU: run it in Triton's interpreter, TRITON_INTERPRET=1 python "
                         "examples/custom_member.py")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(SPEC.describe())
    print(f"  structure  : {analyze_structure(SPEC).kind}; sub-chunk {safe_sub_chunk(SPEC).length}")
    plans = check_lowerable(SPEC)  # raises NotLowerable, with the reason, for a spec the templates cannot lower
    print(f"  lowers to  : {', '.join(sorted({p.form + (' (gate in kernel)' if p.gate_in_kernel else '') for p in plans.values()}))}")
    print(f"  gate       : {plans[('chunk', True)].gate_expr}")

    # 1. the spec against its own float64 recurrence (what `kdagen verify --spec FILE:SPEC` prints)
    assert run_verify(SPEC, None, None, echo=lambda line: None), "the float64 self-checks failed"
    print("float64 self-checks: chunkwise form == the spec's own recurrence")

    # 2. its kernels against that recurrence: prefill of T tokens, then one decode step
    B, T, H, K, V = 1, 19, 2, 32, 32
    gen = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q, k, v = r(B, T + 1, H, K), torch.nn.functional.normalize(r(B, T + 1, H, K), dim=-1), r(B, T + 1, H, V)
    z, beta = 2.0 * r(B, T + 1, H, K), torch.rand(B, T + 1, H, generator=gen)
    dt_bias, h0 = 0.5 * r(H * K), r(B, H, K, V)
    g = gate_values(SPEC, z.double(), {S.dt_bias: dt_bias.double().view(H, K)})  # the gate in float64
    ref_o, ref_s = spec_recurrence(SPEC, q, k, v, g, beta, initial_state=h0.double(), output_final_state=True)
    err = lambda a, b: ((a.double().cpu() - b).norm() / b.norm()).item()  # noqa: E731
    x = [t.to(device) for t in (q, k, v, z, beta)]
    pre = [t[:, :T].contiguous() for t in x]
    gate = dict(use_gate_in_kernel=True, dt_bias=dt_bias.to(device).view(H, K))
    with torch.no_grad():  # prefill (the inference kernels compute the gate from z) ...
        o, ht = chunk_member(SPEC, *pre, initial_state=h0.to(device), output_final_state=True, **gate)
        step = [t[:, T:].contiguous() for t in x]  # ... then one decode step from its state
        o1, ht1 = fused_recurrent_member(SPEC, *step, initial_state=ht, output_final_state=True, **gate)
    errs = {"prefill o": err(o, ref_o[:, :T]), "decode o": err(o1, ref_o[:, T:]), "final state": err(ht1, ref_s)}

    # 3. training: the gradient of z through the spec's own gate derivative (sympy's, in the kernels)
    zl = pre[3].clone().requires_grad_(True)
    o2, _ = chunk_member(SPEC, pre[0], pre[1], pre[2], zl, pre[4], initial_state=h0.to(device), **gate)
    (dz,) = torch.autograd.grad(o2.sum(), zl)
    z64 = z[:, :T].double().requires_grad_(True)
    g64 = gate_values(SPEC, z64, {S.dt_bias: dt_bias.double().view(H, K)})
    r_o, _ = spec_recurrence(SPEC, q[:, :T], k[:, :T], v[:, :T], g64, beta[:, :T], initial_state=h0.double())
    (r_dz,) = torch.autograd.grad(r_o.sum(), z64)
    errs["dz"] = err(dz, r_dz)
    print("kernels (fp32) rel. error vs the spec's float64 recurrence: "
          + ", ".join(f"{n} {e:.1e}" for n, e in errs.items()))
    assert all(e < 1e-4 for e in errs.values()), errs
    print("OK")


if __name__ == "__main__":
    main()
