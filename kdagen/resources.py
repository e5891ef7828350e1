"""Where the packaged data lives: Jinja templates and search-space files.

``templates/`` and ``search_spaces/`` sit at the repository's top level and are installed
as the packages ``kdagen.templates`` / ``kdagen.search_spaces`` (see pyproject.toml), so
both a plain and an editable install find them through importlib.resources.  A source
checkout that was never installed falls back to the directories next to the package.
"""
from __future__ import annotations

import importlib.resources
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent


def _data_dir(package: str, fallback: str) -> Path:
    try:
        p = Path(str(importlib.resources.files(package)))
        if p.is_dir():
            return p
    except (ModuleNotFoundError, TypeError):
        pass
    p = _REPO / fallback
    if p.is_dir():
        return p
    raise FileNotFoundError(f"kdagen data directory {fallback!r} not found (package {package}); "
                            "reinstall kdagen with `pip install .`")


def templates_dir() -> Path:
    return _data_dir("kdagen.templates", "templates")


def search_spaces_dir() -> Path:
    return _data_dir("kdagen.search_spaces", "search_spaces")
