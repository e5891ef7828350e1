"""Lowering and codegen: plan decisions, deterministic readable source, content-hashed names."""
import subprocess
import sys

import pytest

from plain_configs import plain_fwd, plain_train

from kdagen import __version__
from kdagen import spec as S
from kdagen.codegen.render import render
from kdagen.config import ChunkFwdConfig, ChunkTrainConfig, ConfigError, RecurrentConfig
from kdagen.cache.heuristics import default_chunk_config, default_train_config
from kdagen.codegen.lower import LoweringError, lower
from kdagen.ops.inputs import select_spec
from kdagen.resources import search_spaces_dir, templates_dir


def test_plan_decisions():
    p = lower(S.kda(S.gate_lower_bound(-5.0)), 96, 192, "bfloat16", "chunk", gate_in_kernel=True)
    assert (p.BK, p.BV) == (128, 256)
    assert p.diag_mode == "factorised" and p.safe_sub_chunk == 16
    assert p.stages == ("intra", "state")
    assert "tl.fdiv(1.0, 1.0 + tl.exp(-(" in p.gate_expr and "-5.0" in p.gate_expr and p.gate_has_A and p.gate_has_bias
    p = lower(S.kda(), 64, 64, "float16", "chunk")
    assert p.diag_mode == "elementwise" and p.safe_sub_chunk is None and p.gate_expr == "b_z"
    p = lower(S.kda(S.gate_softplus()), 64, 64, "float16", "recurrent", gate_in_kernel=True)
    assert p.stages == ("recurrent",) and "tl.log" in p.gate_expr


@pytest.mark.parametrize("K,V", [(8, 64), (64, 512), (300, 64)])
def test_head_dims_out_of_range(K, V):
    with pytest.raises(LoweringError, match="outside the supported range"):
        lower(S.kda(), K, V, "bfloat16", "chunk")


def test_unsupported_members_say_so():
    # (gdn and deltanet have the KDA structure, gla GLA's: tests/family/test_family_*.py; general DPLR
    # lowers as FLA's chunk_dplr_delta_rule has it: tests/family/test_dplr_chunk.py)
    assert lower(S.dplr(), 64, 64, "bfloat16", "chunk").structure == "dplr"
    # a general rank-1 part other than free vectors a, b with a per-channel decay is refused
    dplr_scalar = S.Recurrence("dplr_scalar", "scalar", S.gate_direct(), a=S.a_free, b=S.b_free, write_key=S.k)
    with pytest.raises(LoweringError, match="general DPLR structure"):
        lower(dplr_scalar, 64, 64, "bfloat16", "chunk")
    # no rank-1 part lowers only as GLA: a per-channel decay and the write key k
    no_rank1_scalar = S.Recurrence("gla_scalar", "scalar", S.gate_direct(), a=None, b=None, write_key=S.k)
    with pytest.raises(LoweringError, match="GLA's structure only"):
        lower(no_rank1_scalar, 64, 64, "bfloat16", "chunk")
    with pytest.raises(LoweringError, match="needs a gate expression"):
        lower(S.kda(), 64, 64, "bfloat16", "chunk", gate_in_kernel=True)


def _plan():
    return lower(select_spec(False, True, -5.0, False, False), 128, 128, "bfloat16", "chunk", False)


def test_render_is_deterministic_and_named_by_content():
    p = _plan()
    c = default_chunk_config(p)
    a, b = render("chunk_solve", p, c), render("chunk_solve", p, c)
    assert a.text == b.text and a.name == b.name
    assert a.name.startswith("kda_chunk_solve_") and a.source_hash[:12] in a.name
    assert f"def {a.name}(" in a.text
    # another value of a field the source reads, or another plan -> other bytes and another name
    # (launch parameters such as num_warps do not reach the source: see the test below)
    other = render("chunk_solve", p, c.replace(inverse_precision="tf32"))
    assert other.text != a.text and other.name != a.name
    p2 = lower(select_spec(False, True, -5.0, False, False), 96, 128, "bfloat16", "chunk", False)
    assert render("chunk_solve", p2, c).name != a.name


@pytest.mark.slow
def test_render_is_identical_in_a_fresh_process():
    code = ("from kdagen.codegen.lower import lower; from kdagen.ops.inputs import select_spec; "
            "from kdagen.codegen.render import render; from kdagen.cache.heuristics import default_chunk_config; "
            "p = lower(select_spec(False, True, -5.0, False, False), 128, 128, 'bfloat16', 'chunk', False); "
            "import hashlib, sys; s = render('chunk_pass', p, default_chunk_config(p)); "
            "sys.stdout.write(hashlib.sha256(s.text.encode()).hexdigest())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    p = _plan()
    import hashlib
    assert out == hashlib.sha256(render("chunk_pass", p, default_chunk_config(p)).text.encode()).hexdigest()


def test_templates_compiled_once_are_read_back_and_a_changed_template_is_compiled_again(tmp_path, monkeypatch):
    """A fresh process (a first call with kept binaries) reads Jinja's compiled templates from the cache
    directory instead of compiling them; a template whose text changed is compiled again; a cache
    directory that cannot be written costs only the compile."""
    import jinja2

    import kdagen.codegen.render as R

    compiles = []
    plain_compile = jinja2.Environment.compile

    def counted(self, source, name=None, *args, **kwargs):
        compiles.append(name)
        return plain_compile(self, source, name, *args, **kwargs)

    monkeypatch.setattr(jinja2.Environment, "compile", counted)
    p = _plan()
    c = default_chunk_config(p)
    try:
        monkeypatch.setenv("KDAGEN_CACHE_DIR", str(tmp_path / "cache"))
        R._env.cache_clear()
        first = render("chunk_solve", p, c)
        assert compiles and any((tmp_path / "cache" / "templates" / __version__).iterdir())
        compiles.clear()
        R._env.cache_clear()  # as a fresh process
        assert render("chunk_solve", p, c).text == first.text and compiles == []
        # another text under the same template name (a checkout whose template was edited): compiled again
        copy = tmp_path / "templates"
        import shutil
        shutil.copytree(templates_dir(), copy)
        edited = copy / R.KERNELS["chunk_solve"].template(p, R._template_vars("chunk_solve", p, c))
        edited.write_text(edited.read_text() + "\n# edited\n")
        monkeypatch.setattr(R, "templates_dir", lambda: copy)
        R._env.cache_clear()
        assert render("chunk_solve", p, c).text.endswith("# edited\n") and compiles
        # a cache directory that is a file: rendering works, nothing is kept
        (tmp_path / "file").write_text("")
        monkeypatch.setenv("KDAGEN_CACHE_DIR", str(tmp_path / "file"))
        R._env.cache_clear()
        assert render("chunk_solve", p, c).text.endswith("# edited\n")
    finally:
        R._env.cache_clear()


def test_header_names_spec_config_and_version():
    p = _plan()
    c = default_chunk_config(p)
    text = render("chunk_state", p, default_train_config(p)).text
    head = "\n".join(text.splitlines()[:8])
    assert f"kdagen {__version__}" in head
    assert f"spec   : kda (hash {p.spec_hash})" in head
    t = default_train_config(p)
    assert f"config : state_prefetch={t.state_prefetch} (the other fields are launch parameters)" in head
    sched = render("chunk_schedule", p, c).text.splitlines()[5]
    assert sched == "# config : none read by this source (the other fields are launch parameters)"
    intra = render("chunk_intra", p, t).text.splitlines()[5]
    assert intra == (f"# config : chunk_size={t.chunk_size} sub_chunk={t.sub_chunk} intra_block_k={t.intra_block_k} "
                     f"inverse_precision={t.inverse_precision} cumsum={t.cumsum} diag_precision={t.diag_precision} "
                     f"intra_load_ahead={t.intra_load_ahead} check_gate_bound={t.check_gate_bound} "
                     "(the other fields are launch parameters)")
    solve = render("chunk_solve", p, c).text.splitlines()[5]
    assert solve == (f"# config : chunk_size={c.chunk_size} sub_chunk={c.sub_chunk} inverse_precision="
                     f"{c.inverse_precision} factor_precision={c.factor_precision} solve_load_ahead={c.solve_load_ahead} "
                     f"(the other fields are launch parameters)")
    # the solve over K tiles: named in the line (solve_k_tile at 0 renders nothing of its own: left out above);
    # it issues each tile's loads where it reads them, so solve_load_ahead is not read
    tiled = render("chunk_solve", p, c.replace(solve_k_tile=16)).text.splitlines()[5]
    assert tiled == (f"# config : chunk_size={c.chunk_size} sub_chunk={c.sub_chunk} inverse_precision="
                     f"{c.inverse_precision} factor_precision={c.factor_precision} solve_k_tile=16 "
                     f"(the other fields are launch parameters)")
    state = render("chunk_pass", p, c).text.splitlines()[5]
    assert state == (f"# config : chunk_size={c.chunk_size} state_prefetch={c.state_prefetch} (the other fields are "
                     f"launch parameters)")
    compile(text, "<generated>", "exec")  # valid Python


@pytest.mark.parametrize("kernel,same,other", [
    ("chunk_intra", dict(state_block_v=16, state_num_warps=8, intra_num_warps=8, intra_num_stages=1),
     dict(intra_block_k=64)),
    ("chunk_state", dict(intra_block_k=64, chunk_size=64, state_block_v=64, cumsum="dot"), dict(state_prefetch=True)),
    ("chunk_solve", dict(state_block_v=16, state_num_warps=8, intra_num_warps=8, state_prefetch=False),
     dict(factor_precision="fp32")),
    ("chunk_pass", dict(state_block_v=64, state_num_warps=8, state_num_stages=2, inverse_precision="tf32",
                        intra_num_warps=8), dict(state_prefetch=False)),
    ("recurrent", dict(block_v=16, num_warps=1), None),
])
def test_a_kernel_is_the_same_source_for_configs_that_differ_only_in_launch_parameters(kernel, same, other):
    """What reaches a kernel only as a launch parameter (tiles, warps, stages, and the other
    launch's fields) must not change its source: each distinct source is a kernel Triton
    compiles, so a header naming the whole config would compile every intra candidate again for
    each state tile.  A field the source reads does change it."""
    from kdagen.cache.heuristics import default_recurrent_config

    p = _plan() if kernel != "recurrent" else lower(select_spec(False, False, None, False, False), 128, 128,
                                                     "bfloat16", "recurrent", False)
    if kernel == "recurrent":
        c = default_recurrent_config(p)
    else:
        c = default_chunk_config(p) if kernel in ("chunk_solve", "chunk_pass") else default_train_config(p)
    a, b = render(kernel, p, c), render(kernel, p, c.replace(**same))
    assert a.text == b.text and a.name == b.name
    if other:
        assert render(kernel, p, c.replace(**other)).name != a.name


def test_generated_source_is_unrolled_per_sub_tile():
    p = _plan()
    text = render("chunk_intra", p, plain_train(chunk_size=64, sub_chunk=16)).text
    assert "b_Akk_3_0" in text and "b_Akk_4_0" not in text  # 4 sub-tiles of 16 in a chunk of 64
    text32 = render("chunk_intra", p, plain_train(chunk_size=32, sub_chunk=16)).text
    assert "b_Akk_1_0" in text32 and "b_Akk_2_0" not in text32


def test_the_forward_solve_is_built_from_halves():
    """A chunk of 64 rows is two 32-row halves and their coupling; a chunk of 32 is one half."""
    p = _plan()
    two = render("chunk_solve", p, plain_fwd(chunk_size=64)).text
    one = render("chunk_solve", p, plain_fwd(chunk_size=32)).text
    assert "b_Lba = " in two and "b_Lba = " not in one
    assert two.count("# ================= rows") == 2 and one.count("# ================= rows") == 1


def test_render_rejects_mismatched_config():
    with pytest.raises(TypeError):
        render("chunk_intra", _plan(), RecurrentConfig())
    with pytest.raises(TypeError):
        render("chunk_solve", _plan(), ChunkTrainConfig())
    with pytest.raises(ValueError, match="unknown kernel"):
        render("chunk_backward", _plan(), ChunkFwdConfig())


def test_config_validation():
    with pytest.raises(ConfigError):
        ChunkFwdConfig(chunk_size=48)
    with pytest.raises(ConfigError):
        ChunkFwdConfig(chunk_size=128)
    with pytest.raises(ConfigError):
        ChunkFwdConfig(sub_chunk=32)
    with pytest.raises(ConfigError):
        ChunkFwdConfig(inverse_precision="fp8")
    with pytest.raises(ConfigError):
        ChunkFwdConfig(state_prefetch=1)
    with pytest.raises(ConfigError):
        ChunkTrainConfig(chunk_size=16, sub_chunk=32)
    with pytest.raises(ConfigError):
        ChunkTrainConfig(inverse_precision="bf16")
    with pytest.raises(ConfigError, match="unknown config fields"):
        ChunkFwdConfig.from_dict({"chunk": 64})


def test_data_dirs_are_found():
    assert (templates_dir() / "chunk_intra.py.j2").is_file()
    assert (templates_dir() / "chunk_solve.py.j2").is_file() and (templates_dir() / "chunk_pass.py.j2").is_file()
    assert (search_spaces_dir() / "chunk_fwd.json").is_file()


@pytest.mark.parametrize("kernel", ["chunk_intra", "chunk_bwd_rerun"])
def test_training_kg_takes_the_decay_to_come_by_difference_in_half_precision(kernel):
    """kg = k exp(G_n - G): half-precision plans take G_n - G as the difference of the cumsum they hold
    (one scan of the gate per sub-tile; on the H200 the forward intra launch 1.397 -> 1.211 ms and the re-run
    0.444 -> 0.366 at (2, 16384, 16, 128)); fp32 plans keep the reverse cumsum of the rows after each row,
    whose rounding does not grow with |G| (codegen.render._rest_by_difference)."""
    from kdagen.cache.heuristics import default_chunk_bwd_config

    sel = select_spec(False, True, -5.0, False, False)
    for dt, by_difference in (("bfloat16", True), ("float16", True), ("float32", False)):
        plan = lower(sel, 128, 128, dt, "chunk", False)
        cfg = default_train_config(plan) if kernel == "chunk_intra" else default_chunk_bwd_config(plan)
        src = render(kernel, plan, cfg).text
        assert ("reverse=True" not in src) == by_difference, (dt, kernel)
        assert ("b_c[None, :] - b_G0" in src) == by_difference, (dt, kernel)


def test_the_solve_takes_k_tiles_only_where_they_are_narrower_than_its_rows():
    """ChunkFwdConfig.solve_k_tile picks templates/chunk_solve_ktiled.py.j2 for a per-channel decay when the
    tile is narrower than the padded K (BK); a tile as wide (or 0) renders the whole-row solve, byte for byte,
    and a scalar decay's solve reads no tile.  A tile outside the allowed widths is refused."""
    from kdagen.codegen import render as R
    from kdagen.config import ConfigError
    from kdagen.ops.inputs import select_spec

    kda = lower(select_spec(False, True, -5.0, False, False), 64, 64, "bfloat16", "chunk")
    c = ChunkFwdConfig()
    whole = render("chunk_solve", kda, c).text
    assert R.KERNELS["chunk_solve"].template(kda, R._template_vars("chunk_solve", kda, c.replace(solve_k_tile=32))) \
        == "chunk_solve_ktiled.py.j2"
    tiled = render("chunk_solve", kda, c.replace(solve_k_tile=32)).text
    assert "loop 1: the K tiles" in tiled and "tl.arange(0, 32)" in tiled and "loop 1" not in whole
    assert render("chunk_solve", kda, c.replace(solve_k_tile=64)).text == whole  # BK = 64: whole rows
    gdn = lower(S.gdn(), 64, 64, "bfloat16", "chunk")
    assert gdn.diag_mode == "scalar"
    assert render("chunk_solve", gdn, c.replace(solve_k_tile=16)).text == render("chunk_solve", gdn, c).text
    for bad in (8, 48, 256, True):
        with pytest.raises(ConfigError, match="solve_k_tile"):
            ChunkFwdConfig(solve_k_tile=bad)
