"""Where kdagen writes: the user cache directory and what lives under it (tuning-cache files,
generated sources, Optuna journals)."""
from __future__ import annotations

import os
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



def generated_dir() -> Path:
    """Generated Triton sources (Triton's JIT reads a kernel's source from its file)."""
    return cache_dir() / "generated"


def studies_dir() -> Path:
    """Optuna journal files of tuning studies (a killed run resumes from them)."""
    return cache_dir() / "studies"
