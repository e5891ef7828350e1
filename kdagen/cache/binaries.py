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

Launch modules: a kernel's first launch also builds two C extensions with the host's C compiler --
Triton's driver utilities (``cuda_utils``, once per Triton and machine) and a launcher for the kernel's
argument signature (``__triton_launcher``) -- each cached by Triton under the hash of its C source and
the platform.  :func:`keep_launch_modules` builds them as Triton would and keeps them beside the kernels,
under that same key, with the Python extension suffix in the file's name; the cache manager serves them
like the kernels (a Python or platform other than the build's has another name or key and builds its
own).  On a machine without the CUDA driver they are linked against a stub that names ``libcuda.so.1``,
so the driver's library is loaded with the module where it runs.  A module that fails to load there is
rebuilt by Triton, as when none was kept.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sysconfig
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


def module_key(src: str) -> str:
    """Triton's cache key of the C extension built from ``src`` (``triton.runtime.build.compile_module_from_src``)."""
    from triton.runtime.build import platform_key
    return hashlib.sha256((src + platform_key()).encode("utf-8")).hexdigest()


def builds_launchers() -> bool:
    """Whether this Triton's CUDA driver builds a C launcher per kernel signature at first launch (Triton 3.6;
    from 3.7 one generic launcher lives in the driver utilities, built once per machine under a key that names
    the machine's driver folder, so there is nothing worth keeping)."""
    from triton.backends.nvidia import driver as nv
    return hasattr(nv, "make_launcher") and hasattr(nv, "compile_module_from_src")


def launch_module_sources(src, metadata) -> dict[str, str]:
    """The C sources Triton's CUDA driver builds at the first launch of the kernel compiled from the
    ``ASTSource`` ``src`` (with ``metadata``): its driver utilities and the kernel's launcher, by module
    name -- as ``CudaUtils`` and ``CudaLauncher`` (Triton 3.6) make them; none where the driver builds no
    launcher per signature (:func:`builds_launchers`)."""
    from triton.backends.nvidia import driver as nv
    if not builds_launchers():
        return {}
    arg_idx = lambda x: (src.fn.arg_names.index(x),) if isinstance(x, str) else x  # noqa: E731
    constants = {arg_idx(idx): value for idx, value in getattr(src, "constants", {}).items()}
    launcher = nv.make_launcher(constants, dict(src.signature), getattr(metadata, "tensordesc_meta", None))
    return {"cuda_utils": Path(nv.dirname, "driver.c").read_text(), "__triton_launcher": launcher}


def _cuda_library_dirs(text: str, scratch: Path) -> list[str]:
    """The library folders Triton links the C extension ``text`` with: the driver's where it is installed,
    else a stub ``libcuda.so.1`` defining the driver functions the source names (empty bodies, never run:
    the linker records the library, which is the real one where the module is loaded)."""
    from triton.backends.nvidia import driver as nv
    try:
        return list(nv.library_dirs())
    except Exception:  # noqa: BLE001 - no CUDA driver on this machine (libcuda_dirs asserts)
        from triton.runtime.build import _build
        stub = scratch / "stub"
        stub.mkdir()
        names = sorted(set(re.findall(r"\b(cu[A-Z][A-Za-z0-9_]*)\b", text)))
        (stub / "stub.c").write_text("".join(f"void {n}(void) {{}}\n" for n in names))
        so = _build("stub", str(stub / "stub.c"), str(stub), [], [], [], ["-Wl,-soname,libcuda.so.1"])
        os.replace(so, stub / "libcuda.so.1")
        return [nv.libdevice_dir, str(stub)]


def keep_launch_modules(src, metadata) -> list[Path]:
    """Build and keep (see the module's docstring; docs/decisions/0038-kept-launch-modules.md) the C extensions
    a first launch of the kernel compiled from ``src`` builds; the kept folders.  Modules kept already are not built again.  Raises what the C
    compiler raises (none on the machine, a failed build)."""
    import triton
    from triton.backends.nvidia import driver as nv
    from triton.runtime.build import _build, platform_key
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    out = []
    for name, text in launch_module_sources(src, metadata).items():
        key = module_key(text)
        final = binaries_dir() / _triton_folder(key).name  # the folder Triton's cache manager looks in
        if not (final / INFO).exists():
            final.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix=f".{key[:12]}-", dir=final.parent) as tmp:
                scratch = Path(tmp)
                (scratch / f"{name}.c").write_text(text)
                so = _build(name, str(scratch / f"{name}.c"), tmp, _cuda_library_dirs(text, scratch), nv.include_dirs,
                            nv.libraries, [])
                folder = scratch / "kept"
                folder.mkdir()
                shutil.copyfile(so, folder / f"{name}{suffix}")
                (folder / INFO).write_text(json.dumps({"module": name, "key": key, "folder": final.name,
                                                       "suffix": suffix, "platform": platform_key(),
                                                       "triton": triton.__version__}, sort_keys=True))
                try:
                    os.rename(folder, final)
                except OSError:  # another process kept it first
                    pass
        out.append(final)
    return out


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


def _infos() -> list[dict]:
    return [json.loads((d / INFO).read_text()) for d in sorted(binaries_dir().glob("*")) if (d / INFO).exists()]


def kept() -> list[dict]:
    """The info of every kept kernel binary."""
    return [i for i in _infos() if "module" not in i]


def kept_modules() -> list[dict]:
    """The info of every kept launch module (:func:`keep_launch_modules`)."""
    return [i for i in _infos() if "module" in i]


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

        def get_file(self, filename: str):  # a C extension's look-up (a launch module's)
            path = super().get_file(filename)
            if path is None and self._serves_kept and restore(self.key, Path(self.cache_dir)):
                path = super().get_file(filename)
            return path

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
