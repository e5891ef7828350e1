"""Kept binaries: kernels compiled ahead of time (by ``kdagen build --gpu NAME``, on any machine) that
the first call on a matching GPU loads instead of compiling.

A kept binary is the folder Triton's compiler writes for one compile (the cubin, its PTX and IRs, the
metadata), stored under ``<cache dir>/binaries/<key>/`` with an ``info.json`` that names the kernel, the
target and the Triton version.  ``<key>`` is Triton's own cache key (its folder's name): the hash of the kernel's source and
everything it depends on, the argument specialisation, the compile options, the target's architecture
and ptxas version, and the Triton build itself (its Python sources and ``libtriton``).  So a binary is
found only by a compile that would produce exactly it: another source, Triton build, target or
specialisation has another key and compiles as before -- no stale binary can be served.

Loading: :func:`install` sets Triton's cache manager to a ``FileCacheManager`` whose miss in Triton's
cache directory looks in the kept folder (:func:`binaries_dir`: the cache dir's; in an exported package,
the package's) and copies a hit into Triton's cache directory, where Triton then loads it as its own.
A cache manager the user set (``TRITON_CACHE_MANAGER``) is left alone.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from .paths import cache_dir

INFO = "info.json"
_GROUP_PREFIX = "__grp__"


def binaries_dir() -> Path:
    """The cache directory's kept binaries (``<cache dir>/binaries``)."""
    return cache_dir() / "binaries"


def _triton_folder(key: str) -> Path:
    """Triton's cache folder of the compile whose hash is ``key`` (``CompiledKernel.hash``)."""
    from triton.runtime.cache import get_cache_manager
    return Path(get_cache_manager(key).cache_dir)


def keep(key: str, info: dict) -> Path:
    """Copy the compile whose Triton cache key is ``key`` (just compiled in this process's Triton cache
    directory) into the kept binaries, with ``info`` (kernel, target, ...).  Returns the kept folder;
    raises FileNotFoundError when Triton's cache lacks the key."""
    src = _triton_folder(key)
    groups = list(src.glob(_GROUP_PREFIX + "*"))
    if not groups:
        raise FileNotFoundError(f"no compiled kernel {key} in Triton's cache {src.parent}")
    final = binaries_dir() / src.name  # the folder's name is the one Triton's cache manager looks up
    if (final / INFO).exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=final.parent))
    try:
        for group in groups:
            children = json.loads(group.read_text())["child_paths"]
            for name, path in children.items():
                shutil.copyfile(path, tmp / name)
            # the group names its files relative to the folder (restore() makes the paths absolute again)
            (tmp / group.name).write_text(json.dumps({"child_paths": {n: n for n in children}}))
        import triton
        (tmp / INFO).write_text(json.dumps({**info, "key": key, "folder": final.name, "triton": triton.__version__},
                                           sort_keys=True))
        try:
            os.rename(tmp, final)
        except OSError:  # another process kept it first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def restore(key: str, dest: Path) -> bool:
    """Copy the kept binary ``key`` (a cache manager's key: its folder's name) into Triton's cache folder
    ``dest``; False when it was not kept."""
    kept = binaries_dir() / key
    if not (kept / INFO).exists():
        return False
    dest.mkdir(parents=True, exist_ok=True)
    for f in kept.iterdir():
        if f.name != INFO and not f.name.startswith(_GROUP_PREFIX):
            _copy_atomic(f, dest / f.name)
    for group in kept.glob(_GROUP_PREFIX + "*"):  # last: a group names files that are in place
        children = json.loads(group.read_text())["child_paths"]
        _write_atomic(dest / group.name, json.dumps({"child_paths": {n: str(dest / p) for n, p in children.items()}}))
    return True


def _copy_atomic(src: Path, dst: Path) -> None:
    tmp = dst.with_name(f"{dst.name}.tmp.{os.getpid()}")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def _write_atomic(dst: Path, data: str) -> None:
    tmp = dst.with_name(f"{dst.name}.tmp.{os.getpid()}")
    tmp.write_text(data)
    os.replace(tmp, dst)


def kept() -> list[dict]:
    """The info of every kept binary."""
    return [json.loads((d / INFO).read_text()) for d in sorted(binaries_dir().glob("*")) if (d / INFO).exists()]


def _manager_class():
    from triton.runtime.cache import FileCacheManager

    class KeptBinaryCache(FileCacheManager):
        """Triton's file cache, which on a miss looks in the kept binaries (:func:`restore`)."""

        def __init__(self, key, override=False, dump=False):
            super().__init__(key, override=override, dump=dump)
            self._serves_kept = not (override or dump)

        def get_group(self, filename: str):
            group = super().get_group(filename)
            if group is None and self._serves_kept and restore(self.key, Path(self.cache_dir)):
                group = super().get_group(filename)
            return group

    KeptBinaryCache.__qualname__ = KeptBinaryCache.__name__
    return KeptBinaryCache


_CLASS = None


def manager_class():
    """The cache manager class :func:`install` gives Triton (one class per process)."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _manager_class()
    return _CLASS


def install() -> bool:
    """Let Triton's compiles find kept binaries: set its cache manager to :func:`manager_class`, unless one
    is set already (``TRITON_CACHE_MANAGER``, or by the program).  True when the kept binaries are served."""
    from triton import knobs
    current = knobs.cache.manager_class
    if current is not None:
        return current is manager_class()
    if os.environ.get("TRITON_CACHE_MANAGER"):
        return False
    knobs.cache.manager_class = manager_class()
    return True
