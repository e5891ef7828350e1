"""Directories kdagen writes to, all under the user cache (see :func:`kdagen.cache.cache_dir`)."""
from __future__ import annotations

from pathlib import Path

from .cache import cache_dir


def generated_dir() -> Path:
    """Generated Triton sources (Triton's JIT reads a kernel's source from its file)."""
    return cache_dir() / "generated"


def studies_dir() -> Path:
    """Optuna journal files of tuning studies (a killed run resumes from them)."""
    return cache_dir() / "studies"
