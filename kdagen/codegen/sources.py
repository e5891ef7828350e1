"""What a generated kernel's text is made from, besides its plan and config: the templates of
its family and every kdagen module that lowering and rendering import (found by reading the
package's import statements, so a module added to that path is counted without a list to keep).
:func:`kdagen.cache.keys.source_hash` hashes these files: a change to any of them may change
the kernels, and invalidates the winners tuned on the old ones; a change elsewhere does not."""
from __future__ import annotations

import ast
import hashlib
import re
from pathlib import Path

from ..resources import templates_dir
from .render import FAMILY_KERNELS, KERNELS

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # kdagen/
RENDERING = ("kdagen.codegen.lower", "kdagen.codegen.render")  # what turns a spec into source
_PARTIAL = re.compile(r'{%-?\s*(?:include|import|from)\s+"([^"]+)"')  # a template's partials, by name


def module_files(root: Path | None = None) -> dict[str, Path]:
    """kdagen's modules by dotted name (a package by its ``__init__.py``); ``root``: the package
    directory (default: this one)."""
    root = root or PACKAGE_DIR
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name of ``from <level dots><name> import ...`` written in ``module``."""
    if level == 0:
        return name or ""
    base = module.split(".")
    base = base[:len(base) - level + (1 if is_package else 0)]
    return ".".join(base + ([name] if name else []))


def imports_of(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The kdagen modules ``module`` imports anywhere in its body (in functions too): for
    ``from X import a``, the submodule ``X.a`` when there is one, else ``X``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.level, node.module)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        out.update(t for t in targets if t in known and t != module)
    return out


def import_graph(root: Path | None = None) -> dict[str, set[str]]:
    """module -> the kdagen modules it imports (statically, including function-level imports)."""
    known = module_files(root)
    return {m: imports_of(m, p, known) for m, p in known.items()}


def render_inputs(family: str, root: Path | None = None, templates: Path | None = None) -> list[Path]:
    """The files a ``family``'s kernels are rendered from: its templates (with the partials,
    ``_*.py.j2``, they include or import) and the modules :data:`RENDERING` imports, transitively."""
    templates = templates or templates_dir()
    todo = [t for k in FAMILY_KERNELS[family] for t in KERNELS[k].templates]
    names = set()
    while todo:  # the kernels' templates and the partials they include or import, transitively
        name = todo.pop()
        if name not in names:
            names.add(name)
            todo.extend(_PARTIAL.findall((templates / name).read_text(encoding="utf-8")))
    files = sorted(p for p in templates.glob("*.py.j2") if p.name in names)
    known = module_files(root)
    seen, todo = set(), list(RENDERING)
    while todo:  # only the modules on the path are read
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(imports_of(m, known[m], known))
    return files + sorted(known[m] for m in seen)


def source_stamp(family: str, root: Path | None = None, templates: Path | None = None) -> str:
    """A fingerprint of every file ``family``'s kernels could be rendered from, cheap to take: the name, size
    and modification time of every template and every kdagen module (a superset of :func:`render_inputs`,
    one ``stat`` each instead of parsing the modules' imports).  Any edit, checkout or install changes it;
    :func:`kdagen.cache.keys.source_hash` keeps its result under it between processes."""
    templates = templates or templates_dir()
    root = root or PACKAGE_DIR
    h = hashlib.sha256(family.encode())
    for base, pattern in ((templates, "*.py.j2"), (root, "*.py")):
        for path in sorted(base.rglob(pattern)):
            st = path.stat()
            h.update(f"\0{path.relative_to(base).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return h.hexdigest()[:32]
