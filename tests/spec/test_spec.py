"""The symbolic spec: members, gates and their ranges, structure analysis, sub-chunk
bounds, content hashes, and the sympy -> Triton printer."""
import math
import subprocess
import sys

import pytest
import sympy as sp

from kdagen import spec as S
from kdagen.spec.structure import EXP_BUDGET, analyze_structure, safe_sub_chunk
from kdagen.codegen.triton_printer import to_triton


@pytest.mark.parametrize("name,kind", [("kda", "kda"), ("gdn", "kda"), ("deltanet", "kda"),
                                       ("gla", "gla"), ("dplr", "dplr")])
def test_structure_of_members(name, kind):
    assert analyze_structure(S.get_spec(name)).kind == kind


def test_custom_specs_structure():
    # a not a multiple of k -> general DPLR; write key != a -> DPLR; b not the decayed key -> DPLR
    r = S.Recurrence("x1", "channel", S.gate_direct(), a=S.beta * S.k * S.q, b=sp.exp(S.g) * S.k, write_key=S.beta * S.k)
    assert analyze_structure(r).kind == "dplr"
    r = S.Recurrence("x2", "channel", S.gate_direct(), a=S.beta * S.k, b=sp.exp(S.g) * S.k, write_key=S.k)
    assert analyze_structure(r).kind == "dplr"
    r = S.Recurrence("x3", "channel", S.gate_direct(), a=S.beta * S.k, b=S.k, write_key=S.beta * S.k)
    assert analyze_structure(r).kind == "dplr"  # correction before the decay: not KDA's order
    # a per-token scalar other than beta times k, still tied: 2*beta*k with matching write key
    r = S.Recurrence("x4", "channel", S.gate_direct(), a=2 * S.beta * S.k, b=sp.exp(S.g) * S.k,
                     write_key=2 * S.beta * S.k)
    assert analyze_structure(r).kind == "kda"


def test_gate_ranges():
    lo, hi = S.gate_lower_bound(-5.0).range()
    assert float(lo) == -5.0 and float(hi) == 0.0
    assert S.gate_lower_bound(-5.0).lower_bound == -5.0
    assert S.gate_softplus().lower_bound is None
    assert S.gate_direct().lower_bound is None
    assert S.gate_direct(-3.0).lower_bound == -3.0
    with pytest.raises(ValueError):
        S.gate_lower_bound(2.0)
    with pytest.raises(ValueError):
        S.gate_direct(0.0)


@pytest.mark.parametrize("gate", [S.gate_lower_bound(-5.0), S.gate_softplus()])
def test_builtin_gates_are_monotone_so_limits_give_the_range(gate):
    # range() takes limits at +-oo of the raw input: valid because d g / d z has one sign
    d = sp.diff(gate.substituted, S.z)
    f = sp.lambdify((S.z, S.A_log, S.dt_bias), d,
                    modules=[{"Sigmoid": lambda x: 1 / (1 + math.exp(-x)),
                              "Softplus": lambda x: math.log1p(math.exp(x))}, "math"])
    vals = [f(z, a, b) for z in (-8, -1, 0, 0.5, 7) for a in (-1.0, 0.3) for b in (-0.5, 0.2)]
    assert all(v <= 0 for v in vals) or all(v >= 0 for v in vals)


def test_custom_gate_needs_its_raw_input():
    x = sp.Symbol("x", real=True)
    gate = S.gate_custom("tanhgate", -2 * (1 + sp.tanh(x)) / 2, x)
    assert gate.lower_bound == -2.0
    with pytest.raises(ValueError):
        S.gate_custom("bad", sp.Integer(-1), x)


def test_safe_sub_chunk_from_the_gate_bound():
    b = safe_sub_chunk(S.kda(S.gate_lower_bound(-5.0)))
    assert b.length == 16 and 5 * 16 <= EXP_BUDGET < 5 * 32
    assert safe_sub_chunk(S.kda(S.gate_lower_bound(-2.5))).length == 32
    assert safe_sub_chunk(S.kda(S.gate_lower_bound(-1.0))).length == 64
    b = safe_sub_chunk(S.kda(S.gate_softplus()))
    assert b.length is None and "no lower bound" in b.reason
    assert safe_sub_chunk(S.kda()).length is None
    d = safe_sub_chunk(S.deltanet())
    assert d.length is None and "no decay" in d.reason


@pytest.mark.slow
def test_hash_is_stable_across_processes_and_changes_with_the_spec():
    code = "from kdagen import spec as S; print(S.kda(S.gate_lower_bound(-5.0)).hash)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == S.kda(S.gate_lower_bound(-5.0)).hash
    hashes = {S.kda().hash, S.kda(S.gate_lower_bound(-5.0)).hash, S.kda(S.gate_lower_bound(-4.0)).hash,
              S.kda(S.gate_softplus()).hash, S.gdn().hash, S.deltanet().hash, S.gla().hash, S.dplr().hash}
    assert len(hashes) == 8


def test_get_spec_errors():
    with pytest.raises(ValueError, match="unknown spec"):
        S.get_spec("mamba")
    with pytest.raises(ValueError, match="no decay"):
        S.get_spec("deltanet", gate="softplus")
    with pytest.raises(ValueError, match="unknown gate"):
        S.get_spec("kda", gate="relu")


def test_printer_matches_sympy_numerically():
    # print the gate and its derivative, evaluate the printed text with a tl stand-in
    import types

    import numpy as np

    tl = types.SimpleNamespace(exp=np.exp, log=np.log, fdiv=np.divide,  # fdiv: Triton's fast division
                               where=np.where, minimum=np.minimum, maximum=np.maximum, sqrt=np.sqrt, abs=np.abs)
    names = {S.z: "b_z", S.A_log: "b_A", S.dt_bias: "b_bias"}
    for gate in (S.gate_lower_bound(-5.0), S.gate_softplus()):
        for expr in (gate.substituted, sp.diff(gate.substituted, S.z), sp.diff(gate.substituted, S.A_log)):
            text = to_triton(expr, names)
            zs = np.array([-30.0, -2.0, 0.1, 3.0, 30.0])
            got = eval(text, {"tl": tl, "b_z": zs, "b_A": 0.3, "b_bias": -0.2})
            ref_fn = sp.lambdify((S.z, S.A_log, S.dt_bias),
                                 expr.replace(S.Sigmoid, lambda x: 1 / (1 + sp.exp(-x)))
                                     .replace(S.Softplus, lambda x: sp.log(1 + sp.exp(x))), "numpy")
            np.testing.assert_allclose(got, ref_fn(zs, 0.3, -0.2), rtol=1e-9, atol=1e-12)


def test_printer_refuses_unknown_symbols_and_functions():
    with pytest.raises(ValueError, match="no kernel variable"):
        to_triton(S.z + S.A_log, {S.z: "b_z"})
    with pytest.raises(ValueError, match="cannot print"):
        to_triton(sp.erf(S.z), {S.z: "b_z"})
