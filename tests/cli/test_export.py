"""`kdagen export`: the package it writes runs without kdagen (proved: its import is blocked in
the subprocess), passes its own float64 test file, gives kdagen's bits (outputs and gradients,
fp32 in the interpreter), compiles with torch.compile and passes opcheck; its selector runs the
exported winners per GPU and bucket; the same inputs give byte-identical files.  By default it
serves FLA's default gate (safe_gate=False) and the bounded one; `--gates` narrows it, and the
package refuses the gate it was not exported for."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import kdagen
from kdagen.cache.gpus import get_profile
from kdagen.cache.keys import cache_key
from kdagen.cache.store import TuningCache, make_entry
from kdagen.cli import main
from kdagen.codegen.lower import lower
from kdagen.config import ChunkFwdConfig, RecurrentConfig
from kdagen.export.contents import GATES
from kdagen.export.vendor import vendor
from kdagen.ops.inputs import select_spec
from kdagen.spec.reference import naive_recurrent_kda

NAME = "kda_ci"
K = V = 32
WHEN = "2026-11-30T12:00:00+00:00"
CHUNK_WINNER = ChunkFwdConfig(chunk_size=32, state_block_v=16, state_num_warps=2, solve_load_ahead=0)
DECODE_WINNER = RecurrentConfig(block_v=16, num_warps=2, readout="updated")


def _cache_file(d: Path) -> Path:
    """An h800 tuning cache as `kdagen build` writes it: a chunk forward winner at the bucket of
    (1, 40) tokens, a decode winner for one sequence, and a winner tuned on other sources."""
    gpu = get_profile("h800")
    cache = TuningCache("h800", cache_dir=d)
    chunk = lower(select_spec(False, True, -5.0, False, False), K, V, "float32", "chunk")
    rec = lower(select_spec(False, False, None, False, False), K, V, "float32", "recurrent")
    # the decode winner at a decode step's bucket (one token per sequence: the key tells a step from a
    # multi-token call)
    for plan, family, cfg, shape in ((chunk, "chunk_fwd", CHUNK_WINNER, {"T": 40, "B": 1, "N": 1}),
                                     (rec, "recurrent", DECODE_WINNER, {"T": 1, "B": 1, "N": 1})):
        entry = make_entry(config=cfg, kernel=family, time_ms=1.0, error=1e-7)
        entry["measured_at"] = WHEN
        cache.store(cache_key(plan, family, shape, gpu), entry)
    stale = cache_key(rec, "recurrent", {"T": 1, "B": 64, "N": 64}, gpu)
    from dataclasses import replace
    entry = make_entry(config=RecurrentConfig(block_v=32, num_warps=4, readout="updated"), kernel="recurrent", time_ms=1.0, error=None)
    entry["measured_at"] = "2026-12-01T00:00:00+00:00"
    cache.store(replace(stale, source_hash="0" * 16), entry)
    return cache.path


def _export(out: Path, cache: Path, *extra):
    r = CliRunner().invoke(main, ["export", "--gpu", "h800,h20", "--head-dim", str(K), "--dtype", "fp32",
                                  "--lower-bound", "-5", "--gate-in-kernel", "--cache", str(cache), "--out", str(out), "--name", NAME,
                                  *extra])
    assert r.exit_code == 0, r.output
    return r.output


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("export")
    cache = _cache_file(d / "cache")
    output = _export(d / "out", cache)
    return d, cache, d / "out" / NAME, output


def _package_env(home: Path, pythonpath: str) -> dict:
    """The environment a package's subprocess runs in: this process's, so that the numeric libraries
    pick the same kernels (OpenBLAS reads OPENBLAS_CORETYPE, and the interpreter's dots run through
    numpy's BLAS: another core type rounds the last bits differently), with its own home, no kdagen
    cache and only the package (and the test's helpers) on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "KDAGEN_"))}
    return {**env, "PYTHONPATH": pythonpath, "HOME": str(home), "TRITON_INTERPRET": "1",
            "KDAGEN_CACHE_DIR": str(home / "nocache")}


def _files(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_same_inputs_give_byte_identical_files(exported, tmp_path):
    d, cache, root, _ = exported
    _export(tmp_path / "again", cache)
    first, second = _files(root), _files(tmp_path / "again" / NAME)
    assert first.keys() == second.keys() and len(first) > 30
    assert [p for p in first if first[p] != second[p]] == []
    # and the recorded date is an input: another --date changes the manifest, not the kernels
    _export(tmp_path / "dated", cache, "--date", "2027-01-01")
    dated = _files(tmp_path / "dated" / NAME)
    assert {p for p in first if first[p] != dated[p]} == {f"{NAME}/manifest.json", "README.md"}


def test_the_manifest_records_what_was_exported_and_warns_about_heuristic_gpus(exported):
    d, cache, root, output = exported
    m = json.loads((root / NAME / "manifest.json").read_text())
    assert m["kdagen_version"] == kdagen.__version__ and m["date"] == WHEN and m["date_source"] == "newest exported winner"
    gpus = {g["name"]: g for g in m["gpus"]}
    assert gpus["h800"]["configs"] == "tuned" and gpus["h800"]["winners"] == 2
    assert gpus["h800"]["compute_capability"] == [9, 0] and gpus["h800"]["stale_winners_left_out"] == 1
    assert gpus["h800"]["measured_with"][0]["torch"] == torch.__version__
    assert gpus["h20"]["configs"] == "heuristic" and gpus["h20"]["winners"] == 0
    assert "warning: h20: no tuning cache" in output and "warning: h800: 1 cached winner(s) were tuned on other" in output
    # the cache tuned the bounded chunk gate only: FLA's default gate runs the heuristic there, said once
    assert "warning: h800: no tuned chunk winners for chunk_kda with safe_gate=False" in output
    assert "lower_bound=-5" not in output.split("no tuned chunk winners for chunk_kda with ", 1)[1].split("\n")[0]
    assert m["gates"] == "both" and m["chunk_gate_bounds"] == [None, -5.0]
    assert "chunk_kda with safe_gate=False (no lower bound) or safe_gate=True, lower_bound=-5" in m["exported_for"]
    assert "use_gate_in_kernel=True with the softplus gate" in m["exported_for"]
    spec = select_spec(False, True, -5.0, False, False)
    specs = {(sp["form"], tuple(sp["gate"])): sp for sp in m["specs"]}
    assert specs[("chunk", ("direct", -5.0, False, False))]["hash"] == spec.hash
    assert specs[("chunk", ("direct", -5.0, False, False))]["text"] == spec.describe()
    gik = select_spec(True, False, -5.0, True, False)  # --gate-in-kernel: A_log given, no dt_bias
    assert specs[("recurrent", ("lower_bound", -5.0, True, False))]["hash"] == gik.hash
    unbounded = select_spec(False, False, None, False, False)
    assert specs[("chunk", ("direct", None, False, False))]["hash"] == unbounded.hash
    assert specs[("chunk", ("softplus", None, True, True))]["hash"] == select_spec(True, False, None, True, True).hash
    # chunk: the two direct gates, lower_bound x (A_log, dt_bias) 4, softplus (A_log required) 2;
    # recurrent: the direct gate (it reads no bound) and the same 6 in-kernel gates
    assert len(specs) == 15
    kernels = {p.stem for p in (root / NAME / "kernels").glob("kda_*.py")}
    assert kernels == set(m["sources"])
    # every kernel family's sources are there: inference and training forward, backward, decode
    kinds = {n.split("_", 1)[1].rsplit("_", 1)[0] for n in kernels}
    assert kinds == {"chunk_solve", "chunk_pass", "chunk_seg_state", "chunk_seg_combine", "chunk_seg_pass",
                     "chunk_schedule", "chunk_intra", "chunk_state", "chunk_bwd_rerun", "chunk_bwd_state", "chunk_bwd_dqkw", "chunk_bwd_intra", "recurrent",
                     "recurrent_bwd", "qk_l2norm", "qk_l2norm_bwd"}
    for name in kernels:  # readable, with kdagen's header
        assert (root / NAME / "kernels" / f"{name}.py").read_text().startswith(f"# Generated by kdagen {kdagen.__version__}")
    assert "requires-python" in (root / "pyproject.toml").read_text() and "torch" in m["requires"]


def test_the_runtime_is_kdagens_code_with_only_the_generation_cut_out(exported):
    d, cache, root, _ = exported
    rt = root / NAME / "_runtime"
    for m in vendor():
        text = (rt / m.relpath).read_text()
        assert text == m.text
        for banned in ("import sympy", "import jinja2", "import optuna", "from ..spec", "codegen.render import"):
            assert banned not in text, (m.relpath, banned)
    # the launch code is kdagen's, byte for byte
    for rel in ("ops/chunk.py", "ops/chunk_bwd.py", "ops/recurrent.py", "ops/library.py", "config.py"):
        assert (rt / rel).read_text() == (Path(kdagen.__file__).parent / rel).read_text(), rel


def test_the_selector_runs_each_gpus_exported_winners(exported, monkeypatch):
    """The package's look-up (kdagen's shape buckets) on an h800 finds the winners, on an h20 the
    heuristic, on a GPU the package was not exported for the heuristic with one warning."""
    d, cache, root, _ = exported
    monkeypatch.syspath_prepend(str(root))
    import importlib

    pkg = importlib.import_module(NAME)
    lookup = importlib.import_module(f"{NAME}._runtime.cache.lookup")
    exported_mod = importlib.import_module(f"{NAME}._runtime.exported")
    spec = exported_mod.select_spec(False, True, -5.0, False, False)
    plan = exported_mod.lower(spec, K, V, "float32", "chunk")
    rplan = exported_mod.lower(exported_mod.select_spec(False, False, None, False, False), K, V, "float32", "recurrent")
    for gpu, chunk_want, dec_want in (("h800", CHUNK_WINNER, DECODE_WINNER), ("h20", None, None)):
        monkeypatch.setattr(lookup, "_current_gpu", lambda g=gpu: get_profile(g))
        exported_mod._WARNED.clear()
        got = lookup.resolve("chunk_fwd", plan, None, {"T": 40, "B": 1, "N": 1, "HV": 2})
        assert got.to_dict() == (chunk_want or pkg.ChunkFwdConfig(**_heuristic("chunk_fwd", K))).to_dict()
        dec = lookup.resolve("recurrent", rplan, None, {"T": 1, "B": 1, "N": 1})
        assert dec.to_dict() == (dec_want or pkg.RecurrentConfig(**_heuristic("recurrent", K, {"T": 1, "B": 1, "N": 1}))
                                 ).to_dict()
        # another bucket: no winner, the heuristic
        far_shape = {"T": 65536, "B": 8, "N": 8, "HV": 2}
        far = lookup.resolve("chunk_fwd", plan, None, far_shape)
        assert far.to_dict() == _heuristic("chunk_fwd", K, far_shape)
    monkeypatch.setattr(lookup, "_current_gpu", lambda: get_profile("a100"))
    with pytest.warns(UserWarning, match="no configs were exported for this GPU .a100."):
        lookup.resolve("recurrent", rplan, None, {"T": 1, "B": 1, "N": 1})
    # a config whose kernel source was not exported is refused, naming what was exported
    assert exported_mod.build(plan, pkg.ChunkFwdConfig(chunk_size=32, solve_load_ahead=0)).fns  # the winner's
    with pytest.raises(ValueError, match="chunk_solve kernel for config .*factor_precision=fp32.* was not exported"
                                         ".*Exported for: spec kda"):
        exported_mod.build(plan, pkg.ChunkFwdConfig(factor_precision="fp32"))


def _heuristic(family, K, shape=None):
    from kdagen.cache.heuristics import default_config

    spec = select_spec(False, family != "recurrent", -5.0, False, False)
    plan = lower(spec, K, K, "float32", "recurrent" if family == "recurrent" else "chunk")
    return default_config(family, plan, shape or {"T": 40, "B": 1, "N": 1, "HV": 2}).to_dict()


def test_a_cache_file_of_another_gpu_or_not_a_cache_is_a_usage_error(exported, tmp_path):
    d, cache, root, _ = exported
    bad = tmp_path / "junk.json"
    bad.write_text("{}")
    for args, says in (([str(cache)], "holds the winners of 'h800', which is not among --gpu (h20)"),
                       ([str(bad)], "is not a kdagen tuning cache")):
        r = CliRunner().invoke(main, ["export", "--gpu", "h20", "--out", str(tmp_path), "--name", "p",
                                      "--cache", *args])
        assert r.exit_code == 2 and r.output.count("Error:") == 1 and says in r.output, r.output
    assert not (tmp_path / "p").exists()


# The calls both processes make, with kdagen's ops here and the package's in the subprocess.
CALLS = textwrap.dedent('''
    import torch


    def calls(ops, x):
        """Every output and gradient of the calls, by name: the plain call and the KDA layer's call
        (gate, l2-norm and beta sigmoid in the kernels), inference, training and decode."""
        args = [x[n] for n in ("q", "k", "v", "g", "beta", "h0")]
        out = {}
        with torch.no_grad():
            out["o"], out["ht"] = ops.chunk_kda(*args[:5], initial_state=args[5], output_final_state=True,
                                                safe_gate=True, lower_bound=-5.0)
            out["o1"], out["h1"] = ops.fused_recurrent_kda(*(a[:, :1] for a in args[:5]), initial_state=args[5],
                                                           output_final_state=True)
        leaves = [a.clone().requires_grad_() for a in args]
        o, ht = ops.chunk_kda(*leaves[:5], initial_state=leaves[5], output_final_state=True, safe_gate=True,
                              lower_bound=-5.0)
        ((o * x["do"]).sum() + (ht * x["dht"]).sum()).backward()
        for n, leaf in zip(("q", "k", "v", "g", "beta", "h0"), leaves):
            out["d" + n] = leaf.grad
        leaves = [a.clone().requires_grad_() for a in args]  # the recurrent form's backward
        o1, h1 = ops.fused_recurrent_kda(*leaves[:5], initial_state=leaves[5], output_final_state=True)
        ((o1 * x["do"]).sum() + (h1 * x["dht"]).sum()).backward()
        for n, leaf in zip(("q", "k", "v", "g", "beta", "h0"), leaves):
            out["recurrent d" + n] = leaf.grad
        with torch.no_grad():  # FLA's default call: safe_gate=False, g unbounded below
            out["o_unbounded"], out["ht_unbounded"] = ops.chunk_kda(*args[:5], initial_state=args[5],
                                                                    output_final_state=True)
        leaves = [a.clone().requires_grad_() for a in args]
        o, ht = ops.chunk_kda(*leaves[:5], initial_state=leaves[5], output_final_state=True, safe_gate=False)
        ((o * x["do"]).sum() + (ht * x["dht"]).sum()).backward()
        for n, leaf in zip(("q", "k", "v", "g", "beta", "h0"), leaves):
            out["unbounded d" + n] = leaf.grad
        with torch.no_grad():  # FLA's V-first state layout
            out["o_v_first"], out["ht_v_first"] = ops.chunk_kda(
                *args[:5], initial_state=args[5].transpose(-1, -2).contiguous(), output_final_state=True,
                safe_gate=True, lower_bound=-5.0, state_v_first=True)
        with torch.no_grad():  # decode from the training forward's state
            out["o1_after_training"], _ = ops.fused_recurrent_kda(*(a[:, :1] for a in args[:5]),
                                                                  initial_state=ht.detach())
        layer = dict(use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=-5.0,
                     use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True)
        z = x["z"]
        with torch.no_grad():
            out["o_gate"], out["ht_gate"] = ops.chunk_kda(*args[:3], z, args[4], initial_state=args[5],
                                                          output_final_state=True, safe_gate=True, **layer)
            out["o1_gate"], _ = ops.fused_recurrent_kda(*(a[:, :1] for a in args[:3]), z[:, :1], args[4][:, :1],
                                                        initial_state=args[5], **layer)
        with torch.no_grad():  # the layer's call without a bound: the softplus gate
            out["o_gate_softplus"], out["ht_gate_softplus"] = ops.chunk_kda(
                *args[:3], z, args[4], initial_state=args[5], output_final_state=True, **{**layer, "lower_bound": None})
        gl = [t.clone().requires_grad_() for t in (z, x["A_log"], x["dt_bias"])]
        o, _ = ops.chunk_kda(*args[:3], gl[0], args[4], safe_gate=True, **{**layer, "A_log": gl[1], "dt_bias": gl[2]})
        (o * x["do"]).sum().backward()
        out["dz"], out["dA_log"], out["ddt_bias"] = (t.grad for t in gl)
        return out
''')

SUBPROCESS = textwrap.dedent('''
    import os, sys
    os.environ["TRITON_INTERPRET"] = "1"

    class Block:  # kdagen and the generator's dependencies cannot be imported here
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("kdagen", "jinja2", "optuna", "click"):
                raise ImportError(name + " is blocked in this process")

    sys.meta_path.insert(0, Block())
    for banned in ("kdagen", "jinja2", "optuna"):
        try:
            __import__(banned)
        except ImportError:
            pass
        else:
            raise SystemExit(banned + " could be imported")
    print("kdagen, jinja2, optuna: not importable")

    import pytest
    rc = pytest.main(["-q", "-p", "no:cacheprovider", sys.argv[2]])
    assert rc == 0, "the package's own tests failed"

    import torch
    import NAME as pkg
    from NAME._runtime.ops import library
    from calls import calls
    assert "sympy" not in sys.modules, "the package (or torch's import) pulled in sympy"

    x = torch.load(sys.argv[1])
    out = calls(pkg, x)

    def layer(q, k, v, g, beta, h0):  # compiled: no graph break (fullgraph), eager's bits
        o, ht = pkg.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, safe_gate=True,
                              lower_bound=-5.0)
        with torch.no_grad():
            o1, _ = pkg.fused_recurrent_kda(q[:, :1].detach(), k[:, :1].detach(), v[:, :1].detach(),
                                            g[:, :1].detach(), beta[:, :1].detach(), initial_state=ht.detach())
        return (o * x["do"]).sum() + (ht * x["dht"]).sum(), o1

    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    leaves = [x[n].clone().requires_grad_() for n in ("q", "k", "v", "g", "beta", "h0")]
    loss, o1 = compiled(*leaves)
    loss.backward()
    assert torch.equal(o1, out["o1_after_training"]), "compiled decode"
    for n, leaf in zip(("q", "k", "v", "g", "beta", "h0"), leaves):
        assert torch.equal(leaf.grad, out["d" + n]), "compiled d" + n
    pool = torch.randn(3, *x["h0"].shape[1:])
    torch.library.opcheck(library.fused_recurrent_kda_op, (*(x[n][:, :1] for n in ("q", "k", "v", "g", "beta")),
                          None, None, None, pool, True, False, False, False, False, None, None, torch.tensor([1]),
                          None, False))
    assert hasattr(torch.ops.NAME, "chunk_kda_train")
    torch.save(out, sys.argv[3])
    print("done")
''')


@pytest.mark.slow
def test_the_package_runs_without_kdagen_and_gives_kdagens_bits(exported, tmp_path):
    d, cache, root, _ = exported
    gen = torch.Generator().manual_seed(3)
    B, T, H = 1, 40, 2
    x = dict(q=torch.randn(B, T, H, K, generator=gen),
             k=torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1),
             v=torch.randn(B, T, H, V, generator=gen), g=-5 * torch.rand(B, T, H, K, generator=gen),
             beta=torch.rand(B, T, H, generator=gen), h0=torch.randn(B, H, K, V, generator=gen),
             do=torch.randn(B, T, H, V, generator=gen), dht=torch.randn(B, H, K, V, generator=gen),
             z=torch.randn(B, T, H, K, generator=gen), A_log=torch.randn(H, generator=gen),
             dt_bias=torch.randn(H * K, generator=gen))
    torch.save(x, tmp_path / "in.pt")
    (tmp_path / "calls.py").write_text(CALLS)
    script = tmp_path / "run.py"
    script.write_text(SUBPROCESS.replace("NAME", NAME))
    env = _package_env(tmp_path, f"{root}:{tmp_path}")
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "in.pt"), str(root / "tests"),
                        str(tmp_path / "out.pt")], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    # the package's own tests: forward and gradients at both gates, the layer call with and without a bound
    assert "kdagen, jinja2, optuna: not importable" in r.stdout and "8 passed" in r.stdout and "done" in r.stdout
    got = torch.load(tmp_path / "out.pt")
    ns = {}
    exec(CALLS, ns)
    want = ns["calls"](kdagen, x)
    assert got.keys() == want.keys() and len(want) == 35
    for n, w in want.items():
        assert torch.equal(got[n], w), n


def _chunk_inputs(seed, low):
    gen = torch.Generator().manual_seed(seed)
    B, T, H = 1, 40, 2
    return [torch.randn(B, T, H, K, generator=gen),
            torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1),
            torch.randn(B, T, H, V, generator=gen), low * torch.rand(B, T, H, K, generator=gen),
            torch.rand(B, T, H, generator=gen), torch.randn(B, H, K, V, generator=gen)]


@pytest.mark.slow
def test_the_default_export_serves_fla_s_default_gate_and_the_bounded_one(exported, monkeypatch):
    """chunk_kda(..., safe_gate=False) (FLA's default, g below -5 too) and (..., safe_gate=True,
    lower_bound=-5) in the package: kdagen's bits and float64's values (fp32, interpreter)."""
    d, cache, root, _ = exported
    monkeypatch.syspath_prepend(str(root))
    import importlib

    pkg = importlib.import_module(NAME)
    for gate, low in ((dict(), -8.0), (dict(safe_gate=False), -8.0), (dict(safe_gate=True, lower_bound=-5.0), -5.0)):
        q, k, v, g, beta, h0 = _chunk_inputs(5, low)
        with torch.no_grad():
            o, ht = pkg.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, **gate)
            ko, kht = kdagen.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, **gate)
        assert torch.equal(o, ko) and torch.equal(ht, kht), gate
        ro, rht = naive_recurrent_kda(*(x.double() for x in (q, k, v, g, beta)), initial_state=h0.double(),
                                      output_final_state=True)
        for a, b in ((o, ro), (ht, rht)):
            assert ((a.double() - b).norm() / b.norm()).item() <= 1e-5, gate


@pytest.mark.slow
@pytest.mark.parametrize("gates, refused, says", [
    ("bounded", dict(safe_gate=False), "g given directly, no lower bound .safe_gate=False. was not exported"),
    ("unbounded", dict(safe_gate=True, lower_bound=-5.0), "g given directly, safe_gate=True, lower_bound=-5 was not "
                                                          "exported")], ids=["bounded", "unbounded"])
def test_a_narrowed_export_refuses_the_other_gate(exported, tmp_path, gates, refused, says):
    """`--gates bounded|unbounded` exports one gate: the other raises a ValueError naming the gate
    exported and --gates (never a wrong answer), and the package's own tests pass."""
    d, cache, root, _ = exported
    name = f"kda_{gates}"
    r = CliRunner().invoke(main, ["export", "--gpu", "h800", "--head-dim", str(K), "--dtype", "fp32", "--gates", gates,
                                  "--cache", str(cache), "--out", str(tmp_path), "--name", name])
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / name / name / "manifest.json").read_text())
    assert m["gates"] == gates and m["chunk_gate_bounds"] == ([-5.0] if gates == "bounded" else [None])
    assert "chunk_kda gates: " + ("safe_gate=True, lower_bound=-5" if gates == "bounded" else "safe_gate=False") \
        in r.output
    kept = "safe_gate=True, lower_bound=-5" if gates == "bounded" else "safe_gate=False (no lower bound)"
    assert f"chunk_kda with {kept}, fused_recurrent_kda" in m["exported_for"]
    check = textwrap.dedent(f'''
        import sys, torch, pytest
        import {name} as pkg
        q, k, v, g = (torch.zeros(1, 40, 2, {K}) for _ in range(4))
        beta = torch.rand(1, 40, 2)
        with pytest.raises(ValueError) as e:
            pkg.chunk_kda(q, k, v, g, beta, **{refused!r})
        print(str(e.value))
        sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", sys.argv[1]]))
    ''')
    env = _package_env(tmp_path, str(tmp_path / name))
    run = subprocess.run([sys.executable, "-c", check, str(tmp_path / name / "tests")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    first = run.stdout.splitlines()[0]
    assert first.startswith(f"{name}: chunk_kda with ") and "Exported for: spec kda" in first, first
    import re
    assert re.search(says, first) and f"this call's gates exported: g given directly, " in first, first
    assert "--gates both" in first and "4 passed" in run.stdout, run.stdout[-2000:]


def test_the_gates_option_is_the_exports_and_its_help_says_what_it_does():
    """(A bad --gates is one error line: tests/cli/test_cli_errors.py.)"""
    from kdagen.cli import EXPORT_GATES

    assert EXPORT_GATES == GATES
    help_text = " ".join(CliRunner().invoke(main, ["export", "--help"]).output.split())
    assert "--gates [both|bounded|unbounded]" in help_text and "FLA's default call (safe_gate=False" in help_text
    assert "raises a ValueError in the package" in help_text
