"""Directories kdagen writes to: the user cache (tuning winners, generated sources)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$KDAGEN_CACHE_DIR, else $XDG_CACHE_HOME/kdagen, else ~/.cache/kdagen."""
    env = os.environ.get("KDAGEN_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "kdagen"


def generated_dir() -> Path:
    return cache_root() / "generated"
