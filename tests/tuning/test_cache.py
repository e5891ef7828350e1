import dataclasses
import json
import multiprocessing as mp
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kdagen.cache import paths, store as cache_mod
from kdagen.cache.keys import CacheKey, shape_bucket
from kdagen.cache.store import CacheError, TuningCache, make_entry

BASE = dict(kernel="chunk_fwd", spec_hash="spec123", source_hash="src456", K=128, V=128,
            dtype="bfloat16", state_dtype="float32", shape_bucket="t4096_s4", gpu_name="h100",
            compute_capability=(9, 0), sm_count=132, triton_version="3.6.0",
            torch_version="2.13.0", cuda_version="12.8", kdagen_version="0.1.0")


def key(**kw):
    return CacheKey(**{**BASE, **kw})


def _changed(name, value):
    if name == "compute_capability":
        return (value[0], value[1] + 1)
    if isinstance(value, int):
        return value + 1
    return value + "x"


def test_key_fields_are_exactly_the_declared_ones():
    assert [f.name for f in dataclasses.fields(CacheKey)] == list(BASE)


def test_changing_any_single_field_changes_the_key_string():
    base = key()
    seen = {base.key_string()}
    for f in dataclasses.fields(CacheKey):
        other = key(**{f.name: _changed(f.name, BASE[f.name])})
        ks = other.key_string()
        assert ks != base.key_string(), f.name
        assert ks not in seen, f.name
        seen.add(ks)
    assert key().key_string() == base.key_string()
    assert base.key_string().startswith("chunk_fwd-K128-V128-bfloat16-float32-t4096_s4-")


@pytest.mark.slow
def test_same_fields_same_key_in_a_fresh_process():
    code = ("import json,sys; from kdagen.cache.keys import CacheKey; "
            "d=json.loads(sys.argv[1]); print(CacheKey(**d).key_string())")
    d = dict(BASE, compute_capability=[9, 0])
    pythonpath = os.pathsep.join([str(Path(cache_mod.__file__).parent.parent.parent)] + sys.path)
    env = dict(os.environ, PYTHONPATH=pythonpath, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(d)], env=env,
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == key().key_string()
    assert CacheKey.from_dict(key().to_dict()) == key()


def test_key_string_accepts_torch_dtypes():
    import torch

    assert key(dtype=torch.bfloat16).key_string() == key().key_string()


def test_shape_bucket():
    assert shape_bucket("chunk_fwd", 3000, 1, 1) == shape_bucket("chunk_fwd", 4096, 1, 1) == "t4096_s1"
    assert shape_bucket("chunk_fwd", 4097, 1, 1) == "t8192_s1"
    assert shape_bucket("chunk_fwd", 1024, 4, 4) == "t4096_s4"
    assert shape_bucket("chunk_fwd", 1 << 24, 8, 8) == "t1048576_s8"  # capped
    assert shape_bucket("chunk_fwd", 10, 1, 1000) == "t256_s64"
    assert shape_bucket("recurrent", 1, 48, 48) == "s64"
    with pytest.raises(ValueError):
        shape_bucket("chunk_fwd", 0, 1, 1)
    with pytest.raises(ValueError):
        shape_bucket("nope", 1, 1, 1)


def test_env_var_overrides_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.cache_dir() == tmp_path / "mine"
    c = TuningCache("h100")
    assert c.path == tmp_path / "mine" / "h100.json"
    monkeypatch.delenv("KDAGEN_CACHE_DIR")
    assert paths.cache_dir() == tmp_path / "xdg" / "kdagen"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert paths.cache_dir() == Path.home() / ".cache" / "kdagen"


def _entry(t=1.5):
    return make_entry(config={"block_v": 32}, kernel="recurrent", time_ms=t, error=1e-4,
                      default_time_ms=2.0)


def test_store_lookup_roundtrip(tmp_path):
    c = TuningCache("h100", tmp_path)
    assert c.lookup(key()) is None and c.entries() == {}
    c.store(key(), _entry())
    got = c.lookup(key())
    assert got["config"] == {"block_v": 32} and got["time_ms"] == 1.5
    assert got["default_time_ms"] == 2.0 and got["error"] == 1e-4
    assert got["key"] == key().to_dict() and "measured_at" in got
    assert c.lookup(key(K=64)) is None  # exact match only
    # A fresh instance reads the file.
    data = json.loads((tmp_path / "h100.json").read_text())
    assert data["schema"] == 1
    assert data["metadata"]["gpu_name"] == "h100"
    assert data["metadata"]["compute_capability"] == [9, 0]
    assert data["metadata"]["triton_version"] == "3.6.0"
    assert list(TuningCache("h100", tmp_path).entries()) == [key().key_string()]
    # An entry whose stored key differs from the lookup key is not returned.
    data["entries"][key().key_string()]["key"]["K"] = 64
    (tmp_path / "h100.json").write_text(json.dumps(data))
    assert TuningCache("h100", tmp_path).lookup(key()) is None


def test_store_rejects_other_gpu_key(tmp_path):
    with pytest.raises(ValueError):
        TuningCache("h100", tmp_path).store(key(gpu_name="a100", compute_capability=(8, 0)), _entry())


def test_metadata_mismatch_is_a_clear_error(tmp_path):
    path = tmp_path / "h100.json"
    path.write_text(json.dumps({"schema": 1, "metadata": {"gpu_name": "h100",
                                "compute_capability": [8, 0]}, "entries": {}}))
    c = TuningCache("h100", tmp_path)
    with pytest.raises(CacheError) as ei:
        c.lookup(key())
    assert str(path) in str(ei.value) and "delete or move" in str(ei.value)
    with pytest.raises(CacheError):
        c.store(key(), _entry())
    path.write_text(json.dumps({"schema": 1, "metadata": {"gpu_name": "a100",
                                "compute_capability": [9, 0]}, "entries": {}}))
    with pytest.raises(CacheError, match="belongs to GPU"):
        TuningCache("h100", tmp_path).lookup(key())


def test_unregistered_gpu_compute_capability_mismatch_on_store(tmp_path):
    path = tmp_path / "mygpu.json"
    path.write_text(json.dumps({"schema": 1, "metadata": {"gpu_name": "mygpu",
                                "compute_capability": [8, 0]}, "entries": {}}))
    c = TuningCache("mygpu", tmp_path)  # not in the registry: cc known only from keys
    assert c.entries() == {}
    with pytest.raises(CacheError, match="compute capability"):
        c.store(key(gpu_name="mygpu"), _entry())


def test_other_schema_is_refused(tmp_path):
    path = tmp_path / "h100.json"
    path.write_text(json.dumps({"schema": 2, "metadata": {}, "entries": {}}))
    with pytest.raises(CacheError) as ei:
        TuningCache("h100", tmp_path).store(key(), _entry())
    assert "schema" in str(ei.value) and str(path) in str(ei.value)
    assert json.loads(path.read_text())["schema"] == 2  # untouched


def test_corrupt_file_is_a_clear_error(tmp_path):
    path = tmp_path / "h100.json"
    path.write_text('{"schema": 1, "entr')
    c = TuningCache("h100", tmp_path)
    with pytest.raises(CacheError) as ei:
        c.lookup(key())
    assert "corrupt" in str(ei.value) and str(path) in str(ei.value)
    assert "delete or move" in str(ei.value)
    with pytest.raises(CacheError):
        c.store(key(), _entry())
    assert path.read_text() == '{"schema": 1, "entr'  # never overwritten
    w = TuningCache("h100", tmp_path, on_error="warn")
    with pytest.warns(UserWarning, match="corrupt"):
        assert w.lookup(key()) is None


def _worker(cache_dir, worker_id, n):
    c = TuningCache("h100", cache_dir)
    for i in range(n):
        c.store(key(spec_hash=f"w{worker_id}-{i}"), _entry(1.0 + i))


def test_concurrent_stores_merge_atomically(tmp_path):
    ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    procs = [ctx.Process(target=_worker, args=(str(tmp_path), w, 20)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    data = json.loads((tmp_path / "h100.json").read_text())
    assert len(data["entries"]) == 40
    c = TuningCache("h100", tmp_path)
    for w in range(2):
        for i in range(20):
            assert c.lookup(key(spec_hash=f"w{w}-{i}"))["time_ms"] == 1.0 + i
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


def test_store_merges_with_what_another_instance_wrote(tmp_path):
    a, b = TuningCache("h100", tmp_path), TuningCache("h100", tmp_path)
    assert a.entries() == {} and b.entries() == {}  # both loaded the (absent) file
    a.store(key(spec_hash="a"), _entry())
    b.store(key(spec_hash="b"), _entry())
    assert len(TuningCache("h100", tmp_path).entries()) == 2
    assert a.lookup(key(spec_hash="b")) is not None  # a sees b's write (file changed)


def test_source_hashes_are_kept_between_processes_under_the_stamp_of_the_files(tmp_path, monkeypatch):
    """source_hash (a tuning key's hash of a family's render inputs) is kept in the cache directory under the
    stamp of the package's files (names, sizes, modification times): a later process takes it from there
    without reading the inputs; any edit or touch of a file changes the stamp; a torn memo or a cache directory
    that cannot be written only costs the reading."""
    import os
    import shutil

    from kdagen.cache import keys
    from kdagen.codegen import sources

    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(tmp_path / "cache"))
    keys.source_hash.cache_clear()
    want = keys._source_hash("chunk_fwd")
    assert keys.source_hash("chunk_fwd") == want
    memo = json.loads((tmp_path / "cache" / "source_hashes.json").read_text())
    assert memo == {sources.source_stamp("chunk_fwd"): want}
    # a fresh process (the in-process memo cleared) takes it from the file: nothing is read or parsed
    keys.source_hash.cache_clear()
    with monkeypatch.context() as m:
        m.setattr(sources, "render_inputs", lambda *a, **k: pytest.fail("render inputs read again"))
        assert keys.source_hash("chunk_fwd") == want
    # the stamp follows every file: an edit, and a touch alone
    pkg, tpl = tmp_path / "kdagen", tmp_path / "templates"
    shutil.copytree(sources.PACKAGE_DIR, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(sources.templates_dir(), tpl)
    stamp = lambda: sources.source_stamp("chunk_fwd", root=pkg, templates=tpl)  # noqa: E731
    first = stamp()
    assert stamp() == first and sources.source_stamp("chunk_bwd", root=pkg, templates=tpl) != first
    solve = tpl / "chunk_solve.py.j2"
    solve.write_text(solve.read_text() + "\n")
    edited = stamp()
    st = (pkg / "codegen" / "lower.py").stat()
    os.utime(pkg / "codegen" / "lower.py", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert len({first, edited, stamp()}) == 3
    # a torn memo, then a cache directory that is a file: the hash is still the files'
    (tmp_path / "cache" / "source_hashes.json").write_text("{not json")
    keys.source_hash.cache_clear()
    assert keys.source_hash("chunk_fwd") == want
    assert json.loads((tmp_path / "cache" / "source_hashes.json").read_text())  # written again, whole
    (tmp_path / "cache" / "source_hashes.json").write_text("[1, 2]")  # JSON, but not a memo
    keys.source_hash.cache_clear()
    assert keys.source_hash("chunk_fwd") == want
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(tmp_path / "file"))
    keys.source_hash.cache_clear()
    assert keys.source_hash("chunk_fwd") == want
    keys.source_hash.cache_clear()
