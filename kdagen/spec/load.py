"""Specs by reference: a member's name (``kda``, ``gdn``, ...) or a user's Python file,
``path/to/file.py:NAME``, whose attribute ``NAME`` is a :class:`~kdagen.spec.Recurrence` or a
function of no arguments returning one (``path/to/file.py`` alone means ``NAME = SPEC``).

The file is imported afresh on every load, as a module of its own (it is not put on
``sys.path``, so it cannot shadow anything).  A spec's hash is a function of its content only,
so the same file gives the same hash in any process (:attr:`Recurrence.hash`).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import traceback
from pathlib import Path

from .recurrence import MEMBERS, Recurrence, get_spec
from .validate import SpecError, validate_spec

DEFAULT_ATTRIBUTE = "SPEC"


class SpecLoadError(ValueError):
    """A spec reference that names no spec: says which file or name, and why."""


def is_member(ref: str) -> bool:
    return ref in MEMBERS


def split_ref(ref: str) -> tuple[Path, str]:
    """(file, attribute) of a file reference ``path.py:NAME`` (or ``path.py``: ``SPEC``)."""
    path, sep, name = ref.rpartition(":")
    if not sep or not name.isidentifier() or not path:
        # no ':NAME', or the ':' belongs to the path (a drive letter, a URL-like string)
        return Path(ref), DEFAULT_ATTRIBUTE
    return Path(path), name


def looks_like_file(ref: str) -> bool:
    path, _ = split_ref(ref)
    return path.suffix == ".py" or os.sep in str(path) or path.exists()


def canonical_ref(ref: str) -> str:
    """The reference with its file made absolute (another process or directory loads the same
    file); a member's name unchanged."""
    if is_member(ref):
        return ref
    path, name = split_ref(ref)
    return f"{path.expanduser().resolve()}:{name}"


def _import_file(path: Path):
    """Import ``path`` as a fresh module (a name derived from its absolute path)."""
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    mod_name = f"kdagen_user_spec_{digest}"
    module_spec = importlib.util.spec_from_file_location(mod_name, str(path))
    if module_spec is None or module_spec.loader is None:
        raise SpecLoadError(f"spec file {path}: Python cannot import it (not a .py source file?)")
    module = importlib.util.module_from_spec(module_spec)
    old = sys.modules.get(mod_name)
    sys.modules[mod_name] = module  # dataclasses and pickling look a class's module up here
    try:
        module_spec.loader.exec_module(module)
    except SyntaxError as e:
        sys.modules.pop(mod_name, None)
        raise SpecLoadError(f"spec file {path}: syntax error at line {e.lineno}: {e.msg}") from e
    except Exception as e:  # noqa: BLE001 - whatever the user's file raises, named with its line
        sys.modules.pop(mod_name, None)
        if old is not None:
            sys.modules[mod_name] = old
        frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename).resolve() == path]
        where = f" (line {frames[-1].lineno})" if frames else ""
        raise SpecLoadError(f"spec file {path}: importing it failed{where}: {type(e).__name__}: {e}") from e
    return module


def _recurrence_names(module) -> list[str]:
    return sorted(n for n, v in vars(module).items() if isinstance(v, Recurrence) and not n.startswith("_"))


def load_spec_file(path: str | Path, name: str = DEFAULT_ATTRIBUTE) -> Recurrence:
    """The spec ``name`` of the Python file ``path`` (see the module docstring)."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "does not exist"
        raise SpecLoadError(f"spec file {path} {what}")
    module = _import_file(path)
    if not hasattr(module, name):
        found = _recurrence_names(module)
        has = f"; the Recurrence(s) it defines: {', '.join(found)}" if found else "; it defines no Recurrence"
        raise SpecLoadError(f"spec file {path} has no attribute {name!r}{has} (name one as {path.name}:NAME)")
    value = getattr(module, name)
    if callable(value) and not isinstance(value, Recurrence):
        try:
            value = value()
        except TypeError as e:
            raise SpecLoadError(f"{path}:{name} is a function that cannot be called without arguments "
                                f"({e}); name a Recurrence or a function of no arguments returning one") from e
        except Exception as e:  # noqa: BLE001
            raise SpecLoadError(f"{path}:{name}() failed: {type(e).__name__}: {e}") from e
    if not isinstance(value, Recurrence):
        raise SpecLoadError(f"{path}:{name} is a {type(value).__name__}, not a kdagen.spec.Recurrence (or a "
                            "function of no arguments returning one)")
    try:
        return validate_spec(value)
    except SpecError as e:
        raise SpecLoadError(f"{path}:{name}: {e}") from None


def load_spec(ref: str) -> Recurrence:
    """The spec a reference names: a member of :data:`~kdagen.spec.MEMBERS` (with its default,
    direct gate) or ``path/to/file.py:NAME`` (see the module docstring).  Raises
    :class:`SpecLoadError` (a ValueError) naming the file or the members."""
    if isinstance(ref, Recurrence):
        return ref
    if not isinstance(ref, str) or not ref.strip():
        raise SpecLoadError(f"a spec reference is a member name ({', '.join(MEMBERS)}) or path/to/file.py:NAME, "
                            f"got {ref!r}")
    ref = ref.strip()
    if is_member(ref):
        return get_spec(ref)
    if not looks_like_file(ref):
        raise SpecLoadError(f"unknown spec {ref!r}: expected a member name ({', '.join(MEMBERS)}) or "
                            "path/to/file.py:NAME (a Recurrence in your own file)")
    path, name = split_ref(ref)
    return load_spec_file(path, name)
