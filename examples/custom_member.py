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
# Until the generic op (kdagen.ops.member.chunk_member / fused_recurrent_member) is on main, the
# two functions below run the spec's kernels from its plan with kdagen's building blocks; with it:
#   o, ht = chunk_member(SPEC, q, k, v, g=z, beta=beta, dt_bias=dt_bias, use_gate_in_kernel=True,
#                        initial_state=h0, output_final_state=True)

def chunk_forward(spec, q, k, v, z, beta, dt_bias, initial_state):
    """The chunked forward of ``spec``'s kernels with the gate computed in-kernel from ``z``."""
    from kdagen.cache.heuristics import default_config
    from kdagen.codegen.lower import lower
    from kdagen.dtypes import dtype
    from kdagen.kernels import build
    from kdagen.ops.chunk_fwd import prepare_chunk_fwd
    from kdagen.ops.inputs import check_inputs

    dims, seqlens = check_inputs(q, k, v, z, beta, scale=None, initial_state=initial_state, cu_seqlens=None,
                                 dt_bias=dt_bias, gate_in_kernel=True)
    plan = lower(spec, dims.K, dims.V, dtype(q.dtype).name, "chunk", gate_in_kernel=True)
    config = default_config("chunk_fwd", plan, {"N": dims.N, "HV": dims.HV, "T": dims.T, "B": dims.B})
    launches, (o, ht, _) = prepare_chunk_fwd(
        q, k, v, z, beta, scale=dims.K ** -0.5, initial_state=initial_state, output_final_state=True,
        cu_seqlens=None, seqlens=seqlens, dims=dims, plan=plan, config=config, built=build(plan, config),
        dt_bias=dt_bias)
    for launch in launches:
        launch()
    return o, ht


def recurrent_step(spec, q, k, v, z, beta, dt_bias, initial_state):
    """One decode step (T = 1) of ``spec``'s recurrent kernel, the gate computed in-kernel."""
    from kdagen.cache.heuristics import default_config
    from kdagen.codegen.lower import lower
    from kdagen.dtypes import dtype
    from kdagen.kernels import build
    from kdagen.ops.inputs import check_inputs
    from kdagen.ops.recurrent import prepare_recurrent

    dims, _ = check_inputs(q, k, v, z, beta, scale=None, initial_state=initial_state, cu_seqlens=None,
                           dt_bias=dt_bias, gate_in_kernel=True)
    plan = lower(spec, dims.K, dims.V, dtype(q.dtype).name, "recurrent", gate_in_kernel=True)
    launch, (o, ht) = prepare_recurrent(
        q, k, v, z, beta, scale=dims.K ** -0.5, initial_state=initial_state, output_final_state=True,
        cu_seqlens=None, state_indices=None, dims=dims, plan=plan,
        built=build(plan, default_config("recurrent", plan, {"N": dims.N, "HV": dims.HV})), dt_bias=dt_bias)
    launch()
    return o, ht


def main():
    import os

    import torch

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
    o, ht = chunk_forward(SPEC, *pre, dt_bias.to(device), h0.to(device))
    step = [t[:, T:].contiguous() for t in x]
    o1, ht1 = recurrent_step(SPEC, *step, dt_bias.to(device), ht)
    errs = {"prefill o": err(o, ref_o[:, :T]), "decode o": err(o1, ref_o[:, T:]), "final state": err(ht1, ref_s)}
    print("kernels (fp32) rel. error vs the spec's float64 recurrence: "
          + ", ".join(f"{n} {e:.1e}" for n, e in errs.items()))
    assert all(e < 1e-4 for e in errs.values()), errs
    print("OK")


if __name__ == "__main__":
    main()
