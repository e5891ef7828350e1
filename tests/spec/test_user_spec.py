"""Specs from a user's Python file (:func:`kdagen.load_spec`), their validation, whether the
templates can lower them (:func:`kdagen.check_lowerable`), and the float64 checks made from a
spec's expressions alone (:mod:`kdagen.spec.evaluate`, :func:`kdagen.spec.verify.spec_checks`)."""
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import sympy as sp
import torch

import kdagen
from kdagen import spec as S
from kdagen.spec import reference as R
from kdagen.spec.evaluate import gate_values, spec_recurrence
from kdagen.spec.load import SpecLoadError, load_spec
from kdagen.spec.validate import NotLowerable, SpecError, check_lowerable, lowering_status, validate_spec

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "custom_member.py"

SIGMOID_SPEC = """
import sympy as sp
from kdagen import spec as S

c = sp.Symbol("c", positive=True)
GATE = S.gate_custom("sig2", -c * S.Sigmoid(S.z + S.dt_bias), S.z, params=((S.dt_bias, "channel"),),
                     constants=((c, 2.0),))
SPEC = S.Recurrence("my_kda", "channel", GATE, a=S.beta * S.k, b=sp.exp(S.g) * S.k, write_key=S.beta * S.k)
OTHER = S.gla()

def make():
    return S.Recurrence("made", "scalar", S.gate_direct(-4.0), a=S.beta * S.k, b=sp.exp(S.g) * S.k,
                        write_key=S.beta * S.k)

def needs_an_argument(x):
    return SPEC

NOT_A_SPEC = 42
"""


@pytest.fixture
def spec_file(tmp_path):
    p = tmp_path / "my_spec.py"
    p.write_text(SIGMOID_SPEC)
    return p


def _write(tmp_path, text, name="s.py"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_members_by_name_are_the_members():
    for name in S.MEMBERS:
        assert load_spec(name) == S.get_spec(name)
    assert kdagen.load_spec is load_spec and kdagen.check_lowerable is check_lowerable


def test_a_file_reference_loads_its_attribute_a_factory_or_SPEC(spec_file):
    s = load_spec(f"{spec_file}:SPEC")
    assert s.name == "my_kda" and s.gate.lower_bound == -2.0
    assert load_spec(str(spec_file)) == s  # no ':NAME' means SPEC
    assert load_spec(f"{spec_file}:OTHER") == S.gla()
    made = load_spec(f"{spec_file}:make")  # a function of no arguments
    assert made.name == "made" and made.decay == "scalar"


def test_the_same_file_gives_the_same_hash_in_another_process(spec_file):
    here = load_spec(f"{spec_file}:SPEC").hash
    assert load_spec(f"{spec_file}:SPEC").hash == here  # loaded again
    code = f"import kdagen; print(kdagen.load_spec({str(spec_file) + ':SPEC'!r}).hash)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"},
                            "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == here
    # and a different gate constant is a different spec
    spec_file.write_text(SIGMOID_SPEC.replace("(c, 2.0)", "(c, 2.5)"))
    assert load_spec(f"{spec_file}:SPEC").hash != here


@pytest.mark.parametrize("ref,says", [
    ("{d}/missing.py:SPEC", ["missing.py", "does not exist"]),
    ("{d}:SPEC", ["is a directory"]),
    ("{f}:NOPE", ["my_spec.py", "no attribute 'NOPE'", "OTHER", "SPEC"]),
    ("{f}:NOT_A_SPEC", ["NOT_A_SPEC is a int", "not a kdagen.spec.Recurrence"]),
    ("{f}:needs_an_argument", ["needs_an_argument", "without arguments"]),
    ("kdx", ["unknown spec 'kdx'", "kda", "dplr", "file.py:NAME"]),
])
def test_load_errors_name_the_file_and_what_is_wrong(spec_file, ref, says):
    with pytest.raises(SpecLoadError) as e:
        load_spec(ref.format(d=spec_file.parent, f=spec_file))
    for s in says:
        assert s in str(e.value), str(e.value)


def test_a_file_that_fails_to_import_is_named_with_its_line(tmp_path):
    p = _write(tmp_path, """
        import sympy
        x = 1
        raise RuntimeError("boom")
        """)
    with pytest.raises(SpecLoadError) as e:
        load_spec(f"{p}:SPEC")
    assert str(p) in str(e.value) and "line 4" in str(e.value) and "RuntimeError: boom" in str(e.value)
    p = _write(tmp_path, "SPEC = (\n", name="syntax.py")
    with pytest.raises(SpecLoadError, match="syntax error"):
        load_spec(str(p))


def test_a_spec_in_unknown_symbols_is_refused_when_loaded(tmp_path):
    p = _write(tmp_path, """
        import sympy as sp
        from kdagen import spec as S
        w = sp.Symbol("w", real=True)
        SPEC = S.Recurrence("odd", "channel", S.gate_direct(), a=S.beta * S.k, b=sp.exp(S.g) * S.k,
                            write_key=w * S.k)
        """)
    with pytest.raises(SpecLoadError) as e:
        load_spec(str(p))
    assert "write_key" in str(e.value) and "uses w" in str(e.value) and "beta" in str(e.value)
    # a gate reading a symbol it does not declare
    tau = sp.Symbol("tau", real=True)
    bad_gate = S.gate_custom("t", -tau * S.Sigmoid(S.z), S.z)
    with pytest.raises(SpecError, match="tau"):
        validate_spec(S.kda(bad_gate))
    # deltanet has no decay: g is not an input of it
    with pytest.raises(SpecError, match="identity"):
        validate_spec(S.Recurrence("dn", "identity", None, a=S.beta * S.k, b=sp.exp(S.g) * S.k,
                                     write_key=S.beta * S.k))


def test_check_lowerable_gives_the_plans_of_a_kda_structured_spec(spec_file):
    plans = check_lowerable(load_spec(f"{spec_file}:SPEC"), K=32)
    assert set(plans) == {("chunk", False), ("chunk", True), ("recurrent", False), ("recurrent", True)}
    p = plans[("chunk", True)]
    assert p.structure == "kda" and p.K == 32 and p.gate_has_bias and not p.gate_has_A
    assert "-2.0" in p.gate_expr and "b_bias" in p.gate_expr and p.lower_bound == -2.0
    assert set(check_lowerable(S.kda())) == {("chunk", False), ("recurrent", False)}


@pytest.mark.parametrize("spec,says", [
    (S.Recurrence("wk", "channel", S.gate_direct(), a=S.beta * S.k, b=sp.exp(S.g) * S.k, write_key=S.k),
     ["write key k differs from a", "general DPLR structure"]),
    (S.Recurrence("ro", "channel", S.gate_direct(), a=S.beta * S.k, b=sp.exp(S.g) * S.k, write_key=S.beta * S.k,
                  readout=S.k), ["read out scale * q", "scale * (k)"]),
    (S.Recurrence("b2", "channel", S.gate_direct(), a=2 * S.beta * S.k, b=sp.exp(S.g) * S.k,
                  write_key=2 * S.beta * S.k), ["a = 2*beta*k", "from the beta input"]),
    (S.kda(S.gate_custom("rate", -sp.exp(S.A_log + S.g_min) * S.Softplus(S.z), S.z,
                         params=((S.A_log, "head"), (S.g_min, "head")))),
     ["gate 'rate' cannot be computed in the kernels", "g_min", "z (raw input), A_log", "dt_bias"]),
])
def test_check_lowerable_says_why_a_spec_is_not_lowered(spec, says):
    with pytest.raises(NotLowerable) as e:
        check_lowerable(spec)
    for s in says:
        assert s in str(e.value), str(e.value)
    ok, why = lowering_status(spec)
    assert not ok and why == e.value.reason
    core = why.split(": ", 1)[1] if why.startswith("gate in kernel: ") else why.rsplit(" (", 1)[0]
    assert core in str(e.value), (why, str(e.value))


def test_dplr_lowers_its_recurrent_form_and_names_a_missing_chunk_form(monkeypatch):
    """General DPLR: both forms lower (kernels listed); a build whose chunk templates had no DPLR
    branch (kdagen.codegen.forms) would refuse its chunk form with the reason."""
    from kdagen.ops.dplr import chunk_form_available
    from kdagen.spec.validate import ChunkFormMissing

    plans = check_lowerable(S.dplr(), forms=("recurrent",))
    assert set(plans) == {("recurrent", False)} and plans[("recurrent", False)].structure == "dplr"
    ok, what = lowering_status(S.dplr())
    assert ok, what
    assert chunk_form_available()
    assert check_lowerable(S.dplr())[("chunk", False)].structure == "dplr"
    monkeypatch.setattr("kdagen.codegen.forms.CHUNK_STRUCTURES", frozenset({"kda", "gla"}))  # a build without it
    with pytest.raises(ChunkFormMissing) as e:
        check_lowerable(S.dplr())
    for s in ("'dplr'", "general DPLR structure", "do not lower yet in this build", "--form recurrent"):
        assert s in str(e.value), str(e.value)
    assert lowering_status(S.dplr()) == (True, "recurrent (the chunk form is not generated in this build)")


def test_check_lowerable_refuses_head_dims_outside_the_range():
    with pytest.raises(NotLowerable, match="K=8"):
        check_lowerable(S.kda(), K=8)


def test_the_spec_recurrence_is_made_from_the_expressions(spec_file):
    """The custom gate evaluated from sympy equals the same gate written in torch, and the
    spec's recurrence then equals KDA's hand-written one on that g (GVA, initial state)."""
    spec = load_spec(f"{spec_file}:SPEC")
    gen = torch.Generator().manual_seed(3)
    B, T, H, HV, K, V = 1, 13, 1, 2, 16, 8
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    z, bias = 3 * r(B, T, HV, K), r(HV, K)
    g = gate_values(spec, z, {S.dt_bias: bias})
    torch.testing.assert_close(g, -2.0 * torch.sigmoid(z + bias), rtol=1e-14, atol=0)
    q, k, v, beta, h0 = r(B, T, H, K), r(B, T, H, K), r(B, T, HV, V), torch.rand(B, T, HV, dtype=torch.float64), \
        r(B, HV, K, V)
    o, s = spec_recurrence(spec, q, k, v, g, beta, initial_state=h0, output_final_state=True)
    ro, rs = R.naive_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    torch.testing.assert_close(o, ro, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s, rs, rtol=1e-12, atol=1e-12)
    # a write key that differs from the erase key changes the result (the expression is used)
    other = S.Recurrence("w", "channel", S.gate_direct(), a=S.beta * S.k, b=sp.exp(S.g) * S.k, write_key=S.k)
    o2, _ = spec_recurrence(other, q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert (o2 - ro).norm() > 1e-3 * ro.norm()


def test_verify_checks_a_user_spec_against_its_own_recurrence(spec_file):
    from kdagen.spec.verify import run_verify, spec_checks

    lines = []
    assert run_verify(load_spec(f"{spec_file}:SPEC"), echo=lines.append)
    text = "\n".join(lines)
    assert "spec: chunk vs rec." in text and "spec: state carry" in text and "spec: gate range" in text
    assert "kernels    : chunk forward" in text and "0 failed" in text
    # the general DPLR structure: no chunkwise form, the state carried across a split instead
    rows = spec_checks(S.dplr(), torch.Generator().manual_seed(0))
    assert [r[0] for r in rows] == ["spec: state carry"] and rows[0][2] <= rows[0][3]


def test_a_gate_whose_declared_range_is_wrong_fails_the_range_check():
    """The range row is a real check: a gate whose expression leaves the range sympy derives
    from limits (a non-monotone gate) is caught."""
    from kdagen.spec.verify import spec_checks

    # -sin(z)^2 - 1 has limits that do not exist at +-oo: declare the gate with a wrong range
    gate = S.Gate("wiggle", -1 - sp.sin(S.z) ** 2, (S.z,), declared_range=(sp.Float(-1.5), sp.Float(-1.0)))
    spec = S.kda(gate)
    with pytest.raises(ValueError, match="cannot evaluate sin"):
        spec_checks(spec, torch.Generator().manual_seed(0))
    gate = S.Gate("tight", -2 * S.Sigmoid(S.z), (S.z,), declared_range=(sp.Float(-1.0), sp.Integer(0)))
    rows = {r[0]: r for r in spec_checks(S.kda(gate), torch.Generator().manual_seed(0))}
    assert rows["spec: gate range"][2] > 0  # values below -1 exist: the row fails


def test_the_example_spec_is_a_member_no_library_ships():
    spec = load_spec(f"{EXAMPLE}:SPEC")
    assert spec.name not in S.MEMBERS and spec.gate.lower_bound == -3.0
    assert all(spec.hash != S.get_spec(m).hash for m in S.MEMBERS)
    assert check_lowerable(spec)[("chunk", True)].safe_sub_chunk == 16


def test_loading_and_checking_specs_is_not_a_render_input():
    """The modules that load, validate and evaluate specs do not feed the kernels' text: editing
    them must not change the templates' source hash (which keys every tuned winner)."""
    from kdagen.codegen.sources import render_inputs

    for family in ("chunk_fwd", "chunk_bwd", "recurrent"):
        names = {p.name for p in render_inputs(family)}
        assert "recurrence.py" in names  # the spec's own modules are
        assert not names & {"load.py", "validate.py", "evaluate.py", "verify.py", "reference.py"}, names
