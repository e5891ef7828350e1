"""Tuning every member of the family (issue 15, item 3): the tuner runs a member's candidates
through the member entries in the spec's own input layout, checks them against the spec's own
float64 recurrence, refuses only what lowering refuses, draws a scalar-diag plan's forward
candidates from a space without the choices its kernels do not read, and `kdagen build` /
`list` store and show each member's winners under its own keys, which its ops find and KDA's
do not.  KDA's path is unchanged (tests/tuning/test_tune.py, test_autotune.py, test_cli.py)."""
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from plain_configs import plain_fwd

from kdagen import spec as S
from kdagen.cache.gpus import get_profile
from kdagen.cache.heuristics import default_config, default_train_config
from kdagen.cli import main
from kdagen.codegen.lower import lower
from kdagen.tuning import candidates as CA, families as F, member_ops as M
from kdagen.tuning.space import SearchSpace, load_space

ROOT = pathlib.Path(__file__).resolve().parents[2]
USER = f"{ROOT / 'examples' / 'custom_member.py'}:SPEC"
ARGS = {"safe_gate": True, "lower_bound": -5.0}


def _args(ref):
    return dict(ARGS) if ref == "kda" else {**ARGS, "spec": ref}


# --- what the tuner refuses -------------------------------------------------------------

@pytest.mark.parametrize("ref", ["gdn", "deltanet", "gla", USER])
def test_every_lowerable_spec_is_tunable(ref):
    F.check_tunable(_args(ref))


def test_a_spec_lowering_refuses_is_refused_with_its_reason(tmp_path):
    # general DPLR lowers (its chunk forward is the chunk_train family: tests/family/test_dplr_chunk.py) ...
    F.check_tunable(_args("dplr"))
    # ... with a per-channel decay only: a general rank-1 part with a scalar decay does not
    path = tmp_path / "scalar_dplr.py"
    path.write_text("from kdagen import spec as S\n"
                    "SPEC = S.Recurrence('scalar_dplr', 'scalar', S.gate_direct(), a=S.a_free, b=S.b_free, "
                    "write_key=S.k, inputs=S.dplr().inputs[:3] + (S.Input('g', 'gate', ()),) + S.dplr().inputs[4:])\n")
    with pytest.raises(ValueError, match="spec 'scalar_dplr' cannot be tuned: its chunk_train kernels cannot be "
                                         "generated: .*general DPLR structure .* this spec has a scalar decay"):
        F.check_tunable(_args(f"{path}:SPEC"))


# --- the candidates: the member's op, its layout, its reference ------------------------

def _candidate(ref, family, shape, launch=None):
    spec = F.family_spec(family, _args(ref))
    plan = F.lower_for(spec, family, 16, 16, torch.float32)
    fwd = default_train_config(plan, {"N": shape[0], "HV": shape[3]}) if family == "chunk_bwd" else None
    cand = CA.KernelCandidate(family, launch, plan, _args(ref), torch.float32, shape, device="cpu", fwd_config=fwd)
    return cand, default_config(family, plan, {"N": shape[0], "HV": shape[3]}, fwd)


def test_kdas_candidates_keep_kdas_ops_and_inputs():
    cand, _ = _candidate("kda", "chunk_fwd", (1, 32, 1, 2))
    assert cand.member is None
    x = cand._check_inputs(seed=3)
    ref = CA.random_inputs(1, 32, 1, 2, 16, 16, torch.float32, "cpu", seed=3)
    assert set(x) == set(ref) and all(torch.equal(x[n], ref[n]) for n in ref)


@pytest.mark.parametrize("ref,g_shape", [("gdn", (1, 32, 2)), ("deltanet", None), (USER, (1, 32, 2, 16))])
def test_a_members_inputs_follow_its_layout(ref, g_shape):
    cand, _ = _candidate(ref, "chunk_fwd", (1, 32, 1, 2))
    assert cand.member == F.family_spec("chunk_fwd", _args(ref))
    x = cand._check_inputs(seed=0)
    assert (None if x["g"] is None else tuple(x["g"].shape)) == g_shape
    assert x["beta"] is not None and tuple(x["beta"].shape) == (1, 32, 2)  # every lowerable member has a rank-1 part
    if x["g"] is not None:
        lb = cand.member.gate.lower_bound
        assert float(x["g"].max()) <= 0.0 and float(x["g"].min()) >= (lb if lb is not None else -5.0)
    if ref == USER:  # its bound is -3: KDA's draw in [-5, 0) is scaled into [-3, 0)
        assert float(x["g"].min()) < -2.0


def test_member_inputs_drop_beta_without_a_rank1_part():
    x = CA.random_inputs(1, 4, 1, 1, 8, 8, torch.float32, "cpu", seed=0)
    gla = S.get_spec("gla", lower_bound=-5.0)
    assert not gla.has_rank1
    y = M.member_inputs(gla, x)
    assert y["beta"] is None and torch.equal(y["g"], x["g"])


@pytest.mark.parametrize("ref,family,shape", [("gdn", "chunk_fwd", (1, 40, 1, 2)), ("gdn", "recurrent", (2, 1, 1, 2)),
                                              ("gdn", "chunk_bwd", (1, 24, 1, 2)),
                                              ("deltanet", "chunk_bwd", (1, 24, 1, 2)),
                                              ("deltanet", "recurrent", (2, 1, 1, 2)),
                                              (USER, "chunk_fwd", (1, 40, 1, 2))])
def test_the_gate_is_the_specs_own_recurrence(ref, family, shape, monkeypatch):
    """A member's default config passes the gate against its own float64 recurrence, and fails
    it against another spec's (the gate tells the members apart)."""
    cand, cfg = _candidate(ref, family, shape)
    assert cand.check(cand.build(cfg)) < cand.tolerance
    t = cand.time(cfg)
    assert t > 0
    other = S.kda(S.gate_direct(-5.0)) if ref != USER else S.gdn()
    wrong = other if cand.member.decay != "identity" else S.gdn()

    def reference(spec, r):
        r = dict(r)
        if wrong.decay == "scalar" and (r["g"] is None or r["g"].dim() == 4):
            base = r["g"][..., 0] if r["g"] is not None else torch.zeros(r["beta"].shape, dtype=torch.float64)
            r["g"] = base - 0.5
        elif wrong.decay == "channel" and r["g"].dim() == 3:
            r["g"] = r["g"].unsqueeze(-1).expand(*r["g"].shape, r["q"].shape[-1]) * torch.linspace(
                0.2, 1.0, r["q"].shape[-1], dtype=torch.float64)
        return M.spec_recurrence(wrong, r["q"], r["k"], r["v"], r["g"], r["beta"], initial_state=r["initial_state"],
                                 output_final_state=True)

    monkeypatch.setattr(M, "reference", reference)
    assert cand.check(cfg) > 10 * cand.tolerance


def test_the_timed_launches_are_the_members_kernels():
    cand, cfg = _candidate("gdn", "chunk_fwd", (1, 40, 1, 2))
    launches = M.chunk_fwd_launches(cand.member, cand.timed_inputs, cfg)
    assert [ln.kernel for ln in launches] == ["chunk_solve", "chunk_pass"]
    assert all(ln.fn.__name__.startswith("gdn_") for ln in launches)
    fwd, bwd = M.chunk_bwd_launches(cand.member, cand.timed_inputs, default_train_config(cand.plan),
                                    default_config("chunk_bwd", cand.plan), with_rerun=True)
    assert all(ln.fn.__name__.startswith("gdn_") for ln in list(fwd) + list(bwd))
    assert [ln.kernel for ln in bwd] == ["chunk_bwd_rerun", "chunk_bwd_state", "chunk_bwd_dqkw", "chunk_bwd_intra"]


# --- the search spaces ------------------------------------------------------------------

def _body(text: str, kind: str) -> str:
    """A kernel's source less its name and the header line naming the config fields it read."""
    text = re.sub(r"\w+_" + kind + r"_[0-9a-f]+", "NAME", text)
    return "\n".join(ln for ln in text.splitlines() if "the other fields are launch parameters" not in ln)


def test_kda_keeps_its_spaces():
    for fam in F.FAMILIES:
        plan = F.lower_for(F.family_spec(fam, ARGS), fam, 64, 64, torch.bfloat16)
        assert F.space_for(fam, plan).fingerprint() == load_space(fam).fingerprint()


@pytest.mark.parametrize("ref", ["gdn", "deltanet"])
def test_a_scalar_diag_plans_forward_space_drops_only_choices_that_render_the_same_kernels(ref):
    from kdagen.codegen.render import FAMILY_KERNELS, render

    plan = F.lower_for(F.family_spec("chunk_fwd", _args(ref)), "chunk_fwd", 64, 64, torch.bfloat16)
    kda = F.lower_for(F.family_spec("chunk_fwd", ARGS), "chunk_fwd", 64, 64, torch.bfloat16)
    assert plan.diag_mode == "scalar" and kda.diag_mode == "factorised"
    full, mine = load_space("chunk_fwd"), F.space_for("chunk_fwd", plan)
    assert mine.fingerprint() != full.fingerprint() and mine.kernel == "chunk_fwd"
    assert set(full.params) == set(mine.params) and full.stages == mine.stages
    dropped = {f: [v for v in full.params[f] if v not in mine.params[f]] for f in full.params}
    # (2-warp solves run on K tiles only, which a scalar decay's solve does not take: its 2 warps go with them)
    assert {f: v for f, v in dropped.items() if v} == {"factor_precision": ["fp32"], "solve_load_ahead": [2],
                                                       "solve_k_tile": [16], "intra_num_warps": [2]}
    d = default_config("chunk_fwd", plan)
    for kind in FAMILY_KERNELS["chunk_fwd"]:
        for inv in full.params["inverse_precision"]:
            a = d.replace(inverse_precision=inv, factor_precision="input")
            b = a.replace(factor_precision="fp32")
            assert _body(render(kind, plan, a).text, kind) == _body(render(kind, plan, b).text, kind)
            # KDA's factorised solve does read it: its space keeps both
            if kind == "chunk_solve":
                assert _body(render(kind, kda, a).text, kind) != _body(render(kind, kda, b).text, kind)
    for a, b in ((d.replace(solve_load_ahead=0), d.replace(solve_load_ahead=2)),
                 (d.replace(solve_k_tile=0), d.replace(solve_k_tile=16))):
        assert _body(render("chunk_solve", plan, a).text, "chunk_solve") == _body(render("chunk_solve", plan, b).text,
                                                                                   "chunk_solve")
        assert _body(render("chunk_solve", kda, a).text, "chunk_solve") != _body(render("chunk_solve", kda, b).text,
                                                                                  "chunk_solve")
    # what the scalar space keeps still changes the member's solve
    a, b = d.replace(inverse_precision="bf16"), d.replace(inverse_precision="tf32")
    assert _body(render("chunk_solve", plan, a).text, "chunk_solve") != _body(render("chunk_solve", plan, b).text,
                                                                               "chunk_solve")
    ctx = F.space_context(plan, F.family_spec("chunk_fwd", _args(ref)), get_profile("h800"), 2)
    n_full = len(F.stage_candidates(full, ctx, "solve", d))
    n_mine = len(F.stage_candidates(mine, ctx, "solve", d))
    # per (chunk_size, inverse_precision): the full space's factor_precision (2) x [whole rows at 4 and 8 warps,
    # two load_ahead each (4), or K tiles at 2 and 4 warps (2)], the scalar space's whole rows at 4 and 8 warps
    assert n_mine * 6 == n_full and n_mine > 0


@pytest.mark.parametrize("member", ["deltanet", "gdn"])
def test_a_foldable_plans_backward_space_adds_the_fold_and_its_intra_stage_times_dqkw(member):
    """DeltaNet (no decay) and Gated DeltaNet (a scalar decay given as g) tune ChunkBwdConfig.intra_fold: their
    backward space is KDA's plus that field (read only with intra_split, the constraint), and the intra stage
    times dqkw with the intra launches for every candidate (the fold moves work into dqkw: timed alone, a folded
    wy launch would look free).  KDA's space and its intra stage's launches are unchanged."""
    from kdagen.codegen.render import render
    from kdagen.kernels import Launch

    plan = F.lower_for(F.family_spec("chunk_bwd", _args(member)), "chunk_bwd", 128, 128, torch.bfloat16)
    kda = F.lower_for(F.family_spec("chunk_bwd", ARGS), "chunk_bwd", 128, 128, torch.bfloat16)
    full, mine = load_space("chunk_bwd"), F.space_for("chunk_bwd", plan)
    assert F.space_for("chunk_bwd", kda).fingerprint() == full.fingerprint()
    assert set(mine.params) - set(full.params) == {"intra_fold"} and mine.params["intra_fold"] == [False, True]
    assert mine.stages["intra"] == full.stages["intra"] + ["intra_fold"]
    d = default_config("chunk_bwd", plan)
    assert d.folds_intra(plan)
    ctx = F.space_context(plan, F.family_spec("chunk_bwd", _args(member)), get_profile("h200"), 2)
    cands = F.stage_candidates(mine, ctx, "intra", d)
    kinds = {(c.intra_split, c.intra_fold) for c in cands}
    assert kinds == {(False, False), (True, False), (True, True)}  # no fused launch asked to fold
    assert sum(c.folds_intra(plan) for c in cands) * 3 == len(cands)
    # the folded candidate's dqkw is a different kernel: what the stage times must include it
    fold, split = d, d.replace(intra_fold=False)
    assert render("chunk_bwd_dqkw", plan, fold).text != render("chunk_bwd_dqkw", plan, split).text
    launches = [Launch(k, None, (1,), {}, {}, 4, 2) for k in ("chunk_bwd_rerun", "chunk_bwd_state", "chunk_bwd_dqkw",
                                                          "chunk_bwd_wy", "chunk_bwd_intra")]
    names = lambda p, st: [ln.kernel for ln in F.timed_launches(launches, st, p)]  # noqa: E731
    assert names(plan, "chunk_bwd_intra") == ["chunk_bwd_dqkw", "chunk_bwd_wy", "chunk_bwd_intra"]
    assert names(kda, "chunk_bwd_intra") == ["chunk_bwd_wy", "chunk_bwd_intra"]
    assert names(plan, "chunk_bwd_dqkw") == names(kda, "chunk_bwd_dqkw") == ["chunk_bwd_dqkw"]
    assert names(plan, None) == [ln.kernel for ln in launches]


def test_the_backward_candidates_follow_gated_deltanets_64_row_chunks():
    """Gated DeltaNet's bf16 backward defaults to 64-row chunks (kdagen/cache/heuristics.py
    trains_on_64_row_chunks): its state stage's candidates are the space's on those chunks, less the
    reverse-pass tiles they refuse (16-wide: min_state_block_v), not an error (``kdagen build --spec gdn``
    raised ConfigError here before); the other stages keep every candidate."""
    from kdagen.config import min_state_block_v

    plan = F.lower_for(F.family_spec("chunk_bwd", _args("gdn")), "chunk_bwd", 128, 128, torch.bfloat16)
    space = F.space_for("chunk_bwd", plan)
    ctx = F.space_context(plan, F.family_spec("chunk_bwd", _args("gdn")), get_profile("h800"), 2)
    d = default_config("chunk_bwd", plan, {"N": 2, "HV": 16})
    assert d.chunk_size == 64
    state = F.stage_candidates(space, ctx, "state", d)
    assert state and all(c.chunk_size == 64 and c.state_block_v >= min_state_block_v(64) for c in state)
    widths = {c.state_block_v for c in space.candidates(ctx)}
    assert 16 in widths and {c.state_block_v for c in state} == widths - {16}
    for stage in set(space.stages) - {"state"}:
        assert len(F.stage_candidates(space, ctx, stage, d)) == len(
            F.stage_candidates(space, ctx, stage, d.replace(chunk_size=32, sub_chunk=16))), stage


# --- build, list ------------------------------------------------------------------------

@pytest.fixture
def on_h200(tmp_path, monkeypatch):
    """A faked H200 whose compile-check keeps the default config and whose tuner 'wins' with a
    recognisable config; returns the specs the tuner was asked for."""
    import kdagen.cache.gpus
    import kdagen.cache.lookup as TU
    from kdagen.tuning import compile_pool as CP, driver as D

    h200 = get_profile("h200")
    monkeypatch.setattr(kdagen.cache.gpus, "detect_current", lambda *a, **k: h200)
    monkeypatch.setattr(TU, "_current_gpu", lambda: h200)
    monkeypatch.setattr(TU, "_MEMO", {})
    TU._cache_for.cache_clear()
    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(D, "compile_check",
                        lambda fam, plan, *a, **k: [CP.CompileSurvey(fam, None, 1, [default_config(fam, plan)])])
    seen = []

    def fake_tune_family(fam, plan, spec, spec_args, gpu, dt, shape, fwd_config=None, **kw):
        seen.append((fam, spec.name, spec_args.get("spec")))
        d = default_config(fam, plan, {"N": shape[0], "HV": shape[3]}, fwd_config)
        win = d.replace(num_warps=2) if fam == "recurrent" else d.replace(chunk_size=32, state_block_v=16) \
            if fam == "chunk_fwd" else d.replace(chunk_size=32, dqkw_block_v=16)
        return win, 1.0, 2.0, 1e-3, {}

    monkeypatch.setattr(D, "tune_family", fake_tune_family)
    yield seen
    TU._cache_for.cache_clear()


@pytest.mark.parametrize("ref", ["gdn", "deltanet"])
def test_build_stores_a_members_winners_which_its_ops_find_and_kdas_do_not(on_h200, ref):
    import kdagen.cache.lookup as TU
    from kdagen.cache.store import TuningCache
    from kdagen.ops.family import gdn_spec

    r = CliRunner().invoke(main, ["build", "--gpu", "h200", "--spec", ref, "--head-dim", "32", "--dtype", "fp32",
                                  "--shapes", "1,64,2,32", "--decode-batches", "2"])
    assert r.exit_code == 0, r.output
    assert {s[2] for s in on_h200} == {ref} and {s[0] for s in on_h200} == set(F.FAMILIES)
    entries = TuningCache("h200").entries()
    assert len(entries) == 3
    op_spec = gdn_spec() if ref == "gdn" else S.deltanet()  # what chunk_gated_delta_rule / chunk_delta_rule lower
    kda = S.kda(S.gate_direct(-5.0))
    shape = {"T": 64, "B": 1, "N": 1, "HV": 2}
    dec = {"T": 1, "B": 2, "N": 2, "HV": 32}
    TU._MEMO.clear()
    mine = lower(op_spec, 32, 32, "float32", "chunk")
    assert TU.resolve("chunk_fwd", mine, None, shape).state_block_v == 16
    assert TU.resolve("chunk_bwd", mine, None, shape).dqkw_block_v == 16
    assert TU.resolve("recurrent", lower(op_spec, 32, 32, "float32", "recurrent"), None, dec).num_warps == 2
    theirs = lower(kda, 32, 32, "float32", "chunk")
    assert TU.resolve("chunk_fwd", theirs, None, shape) == default_config("chunk_fwd", theirs, shape)
    kda_dec = lower(S.kda(S.gate_direct(None)), 32, 32, "float32", "recurrent")
    assert TU.resolve("recurrent", kda_dec, None, dec) == default_config("recurrent", kda_dec, dec)
    # list names the winners' spec
    listed = CliRunner().invoke(main, ["list"]).output
    rows = [ln for ln in listed.splitlines() if ln.startswith("    ") and "-K32-V32-" in ln]
    assert len(rows) == 3 and all(f": spec {ref}, 1.000 ms  x2.00 vs default" in ln for ln in rows), listed


def test_list_names_each_members_winners(on_h200):
    for ref in ("kda", "gdn"):
        r = CliRunner().invoke(main, ["build", "--gpu", "h200", "--spec", ref, "--head-dim", "32", "--dtype", "fp32",
                                      "--shapes", "1,64,2,32", "--decode-batches", "2", "--family", "recurrent"])
        assert r.exit_code == 0, r.output
    listed = CliRunner().invoke(main, ["list"]).output
    assert "h200: 2 winner(s)" in listed
    owners = sorted(re.findall(r": spec (\w+), ", listed))
    assert owners == ["gdn", "kda"], listed


def test_tune_a_user_spec_file_on_this_gpu(on_h200):
    """`kdagen tune --spec FILE.py:SPEC` (build --gpu auto) on the faked H200: the spec file's
    decode winner lands under its own key, which its kernels (gate in-kernel) look up."""
    import kdagen.cache.lookup as TU
    from kdagen.cache.store import TuningCache
    from kdagen.spec.load import load_spec

    r = CliRunner().invoke(main, ["tune", "--spec", USER, "--head-dim", "32", "--dtype", "fp32",
                                  "--decode-batches", "2", "--family", "recurrent"])
    assert r.exit_code == 0, r.output
    assert on_h200 == [("recurrent", "kda_sigmoid3", USER)]
    assert len(TuningCache("h200").entries()) == 1
    TU._MEMO.clear()
    dec = {"T": 1, "B": 2, "N": 2, "HV": 32}
    assert TU.resolve("recurrent", lower(load_spec(USER), 32, 32, "float32", "recurrent", True), None,
                      dec).num_warps == 2
    kda_dec = lower(S.kda(S.gate_direct(None)), 32, 32, "float32", "recurrent")
    assert TU.resolve("recurrent", kda_dec, None, dec) == default_config("recurrent", kda_dec, dec)


def test_decode_is_tuned_at_the_models_value_heads_and_its_winner_found_by_them(on_h200):
    """`--decode-heads 16`: the decode step is tuned on 16 value heads and its winner keyed by them (the heuristic
    counts (sequence, head) pairs): found by a step of 16 heads (or 12: the same power of two), not by one of 32."""
    import kdagen.cache.lookup as TU
    from kdagen.cache.store import TuningCache
    from kdagen.spec.load import load_spec

    r = CliRunner().invoke(main, ["tune", "--spec", USER, "--head-dim", "32", "--dtype", "fp32",
                                  "--decode-batches", "2", "--decode-heads", "16", "--family", "recurrent"])
    assert r.exit_code == 0, r.output
    (key,) = [e["key"]["shape_bucket"] for e in TuningCache("h200").entries().values()]
    assert key == "s2_h16", key
    TU._MEMO.clear()
    plan = lower(load_spec(USER), 32, 32, "float32", "recurrent", True)
    for hv, found in ((16, True), (12, True), (32, False)):
        dec = {"T": 1, "B": 2, "N": 2, "HV": hv}
        got = TU.resolve("recurrent", plan, None, dec)
        assert (got.num_warps == 2) == found and (found or got == default_config("recurrent", plan, dec)), (hv, got)


# --- compile-only, for a GPU that is not here ------------------------------------------

def _build_compile_only(tmp_path, ref, family, params):
    space = tmp_path / f"{family}.json"
    body = {"kernel": family, "params": params}
    if family == "chunk_fwd":
        body["stages"] = load_space("chunk_fwd").to_dict()["stages"]
    space.write_text(json.dumps(body))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(KDAGEN_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "kdagen.cli", "build", "--gpu", "h800", "--spec", ref, "--head-dim",
                           "32", "--space", str(space), "--jobs", "1", "--compile-only", "--quiet"],
                          capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)


@pytest.mark.parametrize("ref,family,params,says", [
    ("gdn", "recurrent", {"block_v": [16, 32], "num_warps": [4]}, ["recurrent K=32 V=32: 2/2 candidate configs"]),
    ("deltanet", "chunk_fwd", {"chunk_size": [64], "state_block_v": [16, 32]},
     ["chunk_fwd/solve K=32 V=32: 1/1 candidate configs", "chunk_fwd/state K=32 V=32: 2/2 candidate configs"]),
])
def test_build_compile_only_compiles_a_members_candidates_for_another_gpu(tmp_path, ref, family, params, says):
    r = _build_compile_only(tmp_path, ref, family, params)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"spec {ref} hash" in r.stdout and "compile-check only" in r.stdout
    for s in says:
        assert s + " compiled for h800; 0 dropped" in r.stdout, r.stdout


# --- a real tuning run, on the interpreter ---------------------------------------------

def test_a_gdn_tuning_run_end_to_end_through_the_real_engine(tmp_path, monkeypatch):
    """tune_family as `kdagen build` runs it (an isolated worker builds, checks against gdn's own
    float64 recurrence and 'times' every stage's candidates, on the interpreter), then the
    winner stored under the key of the family's plan is what chunk_gated_delta_rule's plan
    resolves to -- and a KDA plan does not see it."""
    import kdagen.cache.lookup as TU
    from kdagen.cache.keys import cache_key
    from kdagen.cache.store import TuningCache, make_entry
    from kdagen.config import ChunkFwdConfig
    from kdagen.ops.family import gdn_spec
    from kdagen.tuning import driver as D

    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(tmp_path))
    h200 = get_profile("h200")
    args = _args("gdn")
    spec = F.family_spec("chunk_fwd", args)
    plan = F.lower_for(spec, "chunk_fwd", 16, 16, torch.float32)
    space = SearchSpace.from_dict({"kernel": "chunk_fwd", "params": {"chunk_size": [32], "state_prefetch": [True, False]},
                                   "stages": load_space("chunk_fwd").to_dict()["stages"]})
    shape = (1, 40, 1, 2)
    winner, ms, default_ms, error, results = D.tune_family("chunk_fwd", plan, spec, args, h200, torch.float32, shape,
                                                           space=space, progress=False, isolate=True, device="cpu")
    assert isinstance(winner, ChunkFwdConfig) and winner.chunk_size in (32, 64)  # the default (C=64) is timed too
    assert set(results) == {"solve", "state"} and ms > 0 and default_ms > 0
    for r in results.values():
        assert r.n_failed == 0 and r.n_rejected == 0 and r.trials and all(t.error < 1e-4 for t in r.trials)
    assert 0 < error < 1e-4
    hint = dict(T=40, B=1, N=1)
    TuningCache("h200").store(cache_key(plan, "chunk_fwd", hint, h200), make_entry(
        config=winner.to_dict(), kernel="chunk_fwd", time_ms=ms, error=error, default_time_ms=default_ms))
    monkeypatch.setattr(TU, "_current_gpu", lambda: h200)
    monkeypatch.setattr(TU, "_MEMO", {})
    TU._cache_for.cache_clear()
    try:
        ops_plan = lower(gdn_spec(), 16, 16, "float32", "chunk")
        assert TU.resolve("chunk_fwd", ops_plan, None, {**hint, "HV": 2}) == winner
        kda = lower(S.kda(S.gate_direct(-5.0)), 16, 16, "float32", "chunk")
        assert TU.resolve("chunk_fwd", kda, None, {**hint, "HV": 2}) == default_config("chunk_fwd", kda,
                                                                                         {**hint, "HV": 2})
    finally:
        TU._cache_for.cache_clear()


# --- what a shape's search leaves out ---------------------------------------------------

def test_the_sequence_parallel_pass_is_timed_only_where_it_can_win(tmp_path, monkeypatch):
    """The forward's state stage times state_segment_chunks > 0 only at shapes with few state-pass
    programs (below twice the heuristic's 48, at BV=32) and enough chunks for 4 segments: at the
    default build shapes the stage times 48 candidates, not 96 (~75 s a shape:
    docs/decisions/0004-sequence-parallel-segment-pass.md)."""
    from kdagen.cache.heuristics import worth_timing
    from kdagen.tuning import driver as D

    plan = lower(S.kda(S.gate_direct(-5.0)), 128, 128, "bfloat16", "chunk")
    seg = plain_fwd(chunk_size=64, state_segment_chunks=32)
    assert worth_timing("chunk_fwd", plan, seg, {"N": 1, "HV": 8, "T": 65536})  # 32 programs, 1,024 chunks
    assert not worth_timing("chunk_fwd", plan, seg, {"N": 2, "HV": 16, "T": 16384})  # 128 programs
    assert not worth_timing("chunk_fwd", plan, seg, {"N": 1, "HV": 8, "T": 4096})  # 64 chunks: 2 segments
    assert worth_timing("chunk_fwd", plan, seg.replace(state_segment_chunks=0), {"N": 2, "HV": 16, "T": 16384})
    assert worth_timing("chunk_bwd", plan, default_config("chunk_bwd", plan), {"N": 2, "HV": 16, "T": 16384})

    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(D, "precompile", lambda *a, **k: None)
    timed = {}

    class Stop(Exception):
        pass

    def fake_tune(cands, cand, *, study_name, **kw):
        stage = study_name.split("-")[1]
        timed[stage] = cands
        if stage == "state":
            raise Stop

    monkeypatch.setattr(D, "tune", fake_tune)
    spec = F.family_spec("chunk_fwd", _args("kda"))
    h200 = get_profile("h200")
    for shape, segmented in (((2, 16384, 16, 16), False), ((1, 65536, 8, 8), True)):
        with pytest.raises(Stop):
            D.tune_family("chunk_fwd", plan, spec, _args("kda"), h200, torch.bfloat16, shape, progress=False,
                          device="cpu")
        counts = [c.state_segment_chunks for c in timed["state"]]
        assert (max(counts) > 0) == segmented and counts.count(0) == 48, (shape, counts)
