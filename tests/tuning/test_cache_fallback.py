"""An op needs its generated sources in files, not a writable cache directory: when the cache
directory is a file, cannot be created or cannot be written, the sources go to a temporary
directory with one warning that says why; `kdagen list` and `kdagen build` say it plainly."""
import os
import subprocess
import sys
import tempfile
import warnings

import pytest

from kdagen import kernels
from kdagen.cache import paths
from kdagen.codegen.render import GeneratedSource


@pytest.fixture
def fresh(monkeypatch):
    """No fallback chosen yet in this process (and none left behind)."""
    monkeypatch.setattr(paths, "_SOURCE_FALLBACK", None)


def _src(name="kda_test_source_0"):
    return GeneratedSource("test", name, "X = 1\n", "0" * 64)


def test_cache_dir_problem_says_what_is_wrong(tmp_path, monkeypatch):
    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(tmp_path / "cache"))
    assert paths.cache_dir_problem() is None  # missing, but can be created
    (tmp_path / "cache").mkdir()
    assert paths.cache_dir_problem() is None
    f = tmp_path / "file"
    f.write_text("")
    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(f))
    assert paths.cache_dir_problem() == f"the cache directory {f} ($KDAGEN_CACHE_DIR) is a file, not a directory"
    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(f / "sub" / "dir"))
    assert paths.cache_dir_problem().endswith(f"cannot be created: {f} is a file")


def test_a_cache_path_that_is_a_file_falls_back_with_one_warning(tmp_path, monkeypatch, fresh):
    f = tmp_path / "file"
    f.write_text("")
    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(f))
    with pytest.warns(RuntimeWarning, match="is a file, not a directory; generated kernel sources go to") as w:
        p1 = kernels.write_source(_src("kda_test_a"))
    assert len(w) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second source: no second warning
        p2 = kernels.write_source(_src("kda_test_b"))
    assert os.path.dirname(p1) == os.path.dirname(p2) == str(paths.source_dir())
    assert paths.source_dir().is_relative_to(tempfile.gettempdir()) and open(p2).read() == "X = 1\n"
    assert f.read_text() == ""  # the file is left alone


def test_a_read_only_cache_falls_back(tmp_path, monkeypatch, fresh):
    """A cache directory the user cannot write (simulated: writes into it are refused, since
    a test run as root may write anywhere)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(cache))
    real = tempfile.mkstemp

    def refuse(*a, dir=None, **k):
        if str(dir).startswith(str(cache)):
            raise PermissionError(13, "Permission denied", str(dir))
        return real(*a, dir=dir, **k)

    monkeypatch.setattr(kernels.tempfile, "mkstemp", refuse)
    with pytest.warns(RuntimeWarning, match="PermissionError"):
        p = kernels.write_source(_src("kda_test_ro"))
    assert not p.startswith(str(cache)) and open(p).read() == "X = 1\n"


def test_a_writable_cache_is_used(tmp_path, monkeypatch, fresh):
    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(tmp_path / "new" / "cache"))  # created on first use
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = kernels.write_source(_src("kda_test_ok"))
    assert p == str(tmp_path / "new" / "cache" / "generated" / "kda_test_ok.py")


def test_list_says_the_cache_is_a_file(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from kdagen.cli import main

    f = tmp_path / "file"
    f.write_text("")
    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(f))
    r = CliRunner().invoke(main, ["list"])
    assert r.exit_code == 0 and "is a file, not a directory; nothing cached can be read" in r.output


@pytest.mark.slow
def test_ops_run_with_a_cache_path_that_is_a_file(tmp_path):
    """chunk_kda and fused_recurrent_kda in a fresh process (Triton's interpreter): they run,
    and warn once."""
    f = tmp_path / "file"
    f.write_text("")
    code = """
import torch, kdagen
from kdagen.spec.reference import naive_recurrent_kda
g = torch.Generator().manual_seed(0)
q, v = torch.randn(1, 20, 1, 16, generator=g), torch.randn(1, 20, 1, 16, generator=g)
k = torch.nn.functional.normalize(torch.randn(1, 20, 1, 16, generator=g), dim=-1)
gate, beta = -torch.rand(1, 20, 1, 16, generator=g), torch.rand(1, 20, 1, generator=g)
ref, _ = naive_recurrent_kda(q, k, v, gate, beta)
o, _ = kdagen.chunk_kda(q, k, v, gate, beta)
o2, _ = kdagen.fused_recurrent_kda(q, k, v, gate, beta)
print(max(((x.double() - ref).norm() / ref.norm()).item() for x in (o, o2)))
"""
    env = {**os.environ, "KDAGEN_CACHE_DIR": str(f), "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    assert float(r.stdout.strip()) < 1e-4
    assert r.stderr.count("RuntimeWarning") == 1 and "is a file, not a directory" in r.stderr
