"""Where the packaged data lives: Jinja templates and search-space files.

``templates/`` and ``search_spaces/`` sit at the repository's top level and are installed
as the packages ``kdagen.templates`` / ``kdagen.search_spaces`` (see pyproject.toml), so
both a plain and an editable install find them through importlib.resources.  A source
checkout that was never installed falls back to the directories next to the package, and so
does a checkout imported while an editable install maps the data packages into another
checkout (a git worktree beside it).
"""
from __future__ import annotations

import importlib.resources
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent


def _data_dir(package: str, fallback: str) -> Path:
    own = _REPO / fallback
    try:
        p = Path(str(importlib.resources.files(package)))
        if p.is_dir():
            # an editable install of another checkout (a git worktree's sibling) maps the data
            # packages into that checkout: a source checkout imported from elsewhere reads its own
            # directories, or it would silently render its code with the other checkout's files
            if p.resolve() != own.resolve() and (p.parent / "pyproject.toml").is_file() \
                    and (_REPO / "pyproject.toml").is_file() and own.is_dir():
                return own
            return p
    except (ModuleNotFoundError, TypeError):
        pass
    if own.is_dir():
        return own
    raise FileNotFoundError(f"kdagen data directory {fallback!r} not found (package {package}); "
                            "reinstall kdagen with `pip install .`")


def templates_dir() -> Path:
    return _data_dir("kdagen.templates", "templates")


def search_spaces_dir() -> Path:
    return _data_dir("kdagen.search_spaces", "search_spaces")
