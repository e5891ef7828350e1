"""Where kdagen writes: the user cache directory and what lives under it (tuning-cache files,
generated sources, Jinja's compiled templates, Optuna journals), and where generated sources go when it
cannot be written."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import warnings
from pathlib import Path

ENV_CACHE_DIR = "KDAGEN_CACHE_DIR"


def cache_dir() -> Path:
    """``$KDAGEN_CACHE_DIR`` if set, else the user cache dir (``$XDG_CACHE_HOME/kdagen``,
    default ``~/.cache/kdagen``; ``%LOCALAPPDATA%\\kdagen\\Cache`` on Windows)."""
    env = os.environ.get(ENV_CACHE_DIR)
    if env:
        return Path(env).expanduser()
    if os.name == "nt" and os.environ.get("LOCALAPPDATA"):  # pragma: no cover
        return Path(os.environ["LOCALAPPDATA"]) / "kdagen" / "Cache"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "kdagen"



def cache_dir_problem(d: Path | None = None) -> str | None:
    """Why files cannot be written under the cache directory ``d`` (default :func:`cache_dir`),
    in words; None when they can (it is a writable directory, or one that can be created)."""
    d = cache_dir() if d is None else d
    name = f"{d} (${ENV_CACHE_DIR})" if os.environ.get(ENV_CACHE_DIR) else str(d)
    p = d
    while not p.exists() and p != p.parent:
        p = p.parent
    if not p.is_dir():
        return (f"the cache directory {name} is a file, not a directory" if p == d else
                f"the cache directory {name} cannot be created: {p} is a file")
    if not os.access(p, os.W_OK | os.X_OK):
        return (f"the cache directory {name} is not writable" if p == d else
                f"the cache directory {name} cannot be created: {p} is not writable")
    return None


_SOURCE_FALLBACK: Path | None = None


def source_dir() -> Path:
    """Where generated sources are written: :func:`generated_dir`, or the temporary directory
    this process fell back to (:func:`fall_back_for_sources`)."""
    return _SOURCE_FALLBACK or generated_dir()


def fall_back_for_sources(error: OSError) -> Path:
    """A temporary directory for this process's generated sources, after writing under the cache
    directory failed with ``error``; the first call warns, saying why, and the directory is
    removed at exit.  (Only the tuning cache needs the cache directory; an op needs its sources
    in files because Triton's JIT reads a kernel's source from its file.)"""
    global _SOURCE_FALLBACK
    if _SOURCE_FALLBACK is None:
        _SOURCE_FALLBACK = Path(tempfile.mkdtemp(prefix="kdagen-generated-"))
        atexit.register(shutil.rmtree, _SOURCE_FALLBACK, True)
        why = cache_dir_problem() or f"{type(error).__name__}: {error}"
        warnings.warn(f"kdagen: {why}; generated kernel sources go to {_SOURCE_FALLBACK} for this process "
                      f"(set {ENV_CACHE_DIR} to a writable directory to keep them, and tuned winners, between "
                      "runs)", RuntimeWarning, stacklevel=3)
    return _SOURCE_FALLBACK


def generated_dir() -> Path:
    """Generated Triton sources (Triton's JIT reads a kernel's source from its file)."""
    return cache_dir() / "generated"


def compiled_templates_dir(version: str) -> Path:
    """Jinja's compiled templates (kdagen ``version``'s): a fresh process renders without compiling them."""
    return cache_dir() / "templates" / version


def studies_dir() -> Path:
    """Optuna journal files of tuning studies (a killed run resumes from them)."""
    return cache_dir() / "studies"


def source_hashes_file() -> Path:
    """The source hashes (:func:`kdagen.cache.keys.source_hash`) of earlier processes, by the stamp of the files
    they were taken from (:func:`kdagen.codegen.sources.source_stamp`)."""
    return cache_dir() / "source_hashes.json"
