"""The run-time modules an exported package carries: kdagen's own source, copied, with the
stages that need sympy, jinja2 or optuna cut out.

The ops' code (validation, configs, launch descriptions, autograd, the torch.library ops) is
kdagen's, byte for byte, so there is one source of truth.  What an export cannot carry is the
"spec -> lower -> render" path and the tuning cache's files; the few definitions that use them
are replaced by look-ups in the package's table (``templates/export/exported.py``):

- :data:`REPLACED`: definitions whose name is imported from ``exported`` instead;
- :data:`DROPPED`: definitions the ops never call that reach what the package lacks.

Which modules are copied is not listed: it is the import closure of :data:`ROOTS` after those
cuts (function-level imports included), minus :data:`BLOCKED`.  Imports of blocked modules and of
sympy/jinja2/optuna/click are removed, and :func:`vendor` fails (:class:`VendorError`) if a name
they bound is still used, if a copied module still imports a blocked one, or if an import names
something a cut module no longer defines -- so a change to kdagen that the cuts no longer cover
stops the export instead of shipping a broken package.
"""
from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from ..codegen.sources import PACKAGE_DIR, module_files

ROOTS = ("kdagen.ops.chunk", "kdagen.ops.recurrent", "kdagen.ops.library")
REPLACED = {
    "kdagen.ops.inputs": ("select_spec",),
    "kdagen.codegen.lower": ("lower",),
    "kdagen.kernels": ("build",),
    "kdagen.cache.binaries": ("binaries_dir",),
    "kdagen.cache.lookup": ("lookup_winner",),
}
DROPPED = {
    "kdagen.codegen.lower": ("tuning_spec", "GATE_NAMES", "spec_max_head_dim"),
    "kdagen.kernels": ("load", "write_source", "_write_into", "_LOADED"),
    "kdagen.cache.lookup": ("_cache_for", "_MEMO"),
    "kdagen.cache.keys": ("source_hash", "_source_hash", "SOURCE_HASHES_KEPT", "cache_key"),
}
BLOCKED = ("kdagen.spec", "kdagen.codegen.render", "kdagen.codegen.triton_printer", "kdagen.codegen.sources",
           "kdagen.cache.paths", "kdagen.cache.store", "kdagen.tuning", "kdagen.resources", "kdagen.cli",
           "kdagen.export")
THIRD_PARTY_ALLOWED = ("torch", "triton")
REPLACEMENT_MODULE = "exported"  # the table-backed module beside the copied ones (kdagen/ level)


class VendorError(RuntimeError):
    """kdagen's run-time modules no longer fit the cuts above."""


@dataclass(frozen=True)
class VendoredModule:
    name: str  # kdagen's dotted name
    relpath: str  # path inside the runtime package, e.g. "ops/chunk.py"
    text: str


def _blocked(module: str) -> bool:
    return any(module == b or module.startswith(b + ".") for b in BLOCKED)


def _third_party_ok(module: str) -> bool:
    top = module.split(".")[0]
    return top in THIRD_PARTY_ALLOWED or top in sys.stdlib_module_names or top == "__future__"


def _target(module: str, is_package: bool, node: ast.ImportFrom | ast.Import, known) -> list[str]:
    """The kdagen modules (or foreign top-level names) an import statement reaches."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level == 0:
        base = node.module or ""
    else:
        parts = module.split(".")
        parts = parts[:len(parts) - node.level + (1 if is_package else 0)]
        base = ".".join(parts + ([node.module] if node.module else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


def _span(node: ast.stmt) -> tuple[int, int]:
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return start, node.end_lineno


def _defined(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    return []


def _used_names(tree: ast.AST) -> set[str]:
    """Names read anywhere outside annotations (the modules use postponed annotations)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            skip.update(id(n) for n in ast.walk(node.annotation))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            skip.update(id(n) for n in ast.walk(node.returns))
        elif isinstance(node, ast.AnnAssign):
            skip.update(id(n) for n in ast.walk(node.annotation))
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and id(n) not in skip}


def _cut(name: str, path: Path, known) -> tuple[str, set[str]]:
    """Module ``name``'s text with its replaced and dropped definitions and its imports of
    blocked or foreign modules removed; and the names those imports bound."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    tree = ast.parse(text)
    is_package = path.name == "__init__.py"
    replaced, dropped = set(REPLACED.get(name, ())), set(DROPPED.get(name, ()))
    missing = (replaced | dropped) - {n for node in tree.body for n in _defined(node)}
    if missing:
        raise VendorError(f"{name} no longer defines {sorted(missing)}: update kdagen.export.vendor's cuts")
    remove: dict[int, int] = {}  # first line -> last line (1-based, inclusive)
    insert_at = None
    unbound: set[str] = set()
    rewritten: dict[int, str] = {}  # first line of an import -> its shortened text
    for node in tree.body:
        names = _defined(node)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            targets = _target(name, is_package, node, known)
            bad = [t for t in targets if (t.startswith("kdagen") and _blocked(t))
                   or (not t.startswith("kdagen") and not _third_party_ok(t))]
            if bad:
                if len(bad) != len(targets):
                    raise VendorError(f"{name}: one import statement mixes blocked and kept modules ({targets})")
                remove[_span(node)[0]] = _span(node)[1]
                unbound.update(names)
            elif isinstance(node, ast.ImportFrom) and node.level > 0:
                # names a cut module no longer defines leave the import too
                base = _target(name, is_package, ast.ImportFrom(module=node.module, names=[ast.alias(name="*")],
                                                                level=node.level), known)[0]
                keep = [a for a in node.names if a.name not in DROPPED.get(base, ())]
                if len(keep) != len(node.names):
                    start, end = _span(node)
                    remove[start] = end
                    unbound.update(a.asname or a.name for a in node.names if a not in keep)
                    if keep:
                        rewritten[start] = (f"from {'.' * node.level}{node.module or ''} import "
                                            f"{', '.join(a.name + (f' as {a.asname}' if a.asname else '') for a in keep)}\n")
            continue
        if names and set(names) <= replaced | dropped:
            start, end = _span(node)
            remove[start] = end
            if set(names) & replaced and insert_at is None:
                insert_at = start
        elif set(names) & (replaced | dropped):
            raise VendorError(f"{name}: {names} are defined together; cannot cut only some of them")
    out = []
    skip_to = 0
    dots = "." * name.count(".")
    for i, line in enumerate(lines, start=1):
        if i == insert_at:
            out.append(f"from {dots}{REPLACEMENT_MODULE} import {', '.join(sorted(replaced))}"
                       f"  # kdagen: {', '.join(sorted(replaced))} (export: a look-up)\n")
        if i in remove:
            skip_to = remove[i]
            out.append(rewritten.get(i, ""))
        if i <= skip_to:
            continue
        out.append(line)
    text = re.sub(r"\n{4,}", "\n\n\n", "".join(out))  # what a cut leaves: at most two blank lines
    return text, unbound


def vendor() -> list[VendoredModule]:
    """The run-time closure of :data:`ROOTS`, cut (see the module): every module once, in name order."""
    known = module_files()
    done: dict[str, str] = {}
    todo = list(ROOTS)
    while todo:
        name = todo.pop()
        if name in done:
            continue
        if name not in known:
            raise VendorError(f"{name} is not a kdagen module")
        text, unbound = _cut(name, known[name], known)
        tree = ast.parse(text)
        still = unbound & _used_names(tree)
        if still:
            raise VendorError(f"{name}: {sorted(still)} came from an import the export removes (sympy, jinja2, "
                              "optuna or a blocked kdagen stage) and is still used; add its user to the cuts")
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for t in _target(name, known[name].name == "__init__.py", node, known):
                    if t.startswith("kdagen.") or t == "kdagen":
                        if _blocked(t):
                            raise VendorError(f"{name} still imports {t}, which an export cannot carry")
                        if t in known and t not in done:
                            todo.append(t)
                    elif not _third_party_ok(t) and node.col_offset > 0:
                        raise VendorError(f"{name} imports {t} inside a function; an export carries torch and "
                                          "triton only")
        done[name] = text
    # a package's __init__ is not part of the closure: each is written with its docstring only
    for pkg in sorted({n.rsplit(".", 1)[0] for n in done if "." in n} | {"kdagen"}):
        if pkg not in done:
            doc = ast.get_docstring(ast.parse(known[pkg].read_text(encoding="utf-8"))) or ""
            done[pkg] = f'"""{doc}"""\n' if doc and pkg != "kdagen" else ""
    _check_names(done, known)
    out = []
    for name in sorted(done):
        path = known[name].relative_to(PACKAGE_DIR).as_posix()
        out.append(VendoredModule(name, path, done[name]))
    return out


def _check_names(done: dict[str, str], known) -> None:
    """Every ``from <copied module> import x`` finds x in the copy (or x is a copied submodule)."""
    defined = {}
    for name, text in done.items():
        tree = ast.parse(text)
        defined[name] = {n for node in tree.body for n in _defined(node)}
        if REPLACED.get(name):
            defined[name] |= set(REPLACED[name])
    for name, text in done.items():
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                base = _target(name, known[name].name == "__init__.py", ast.ImportFrom(
                    module=node.module, names=[ast.alias(name="*")], level=node.level), known)[0]
                if base.endswith("." + REPLACEMENT_MODULE) or base not in done:
                    continue
                for a in node.names:
                    if a.name not in defined[base] and f"{base}.{a.name}" not in done:
                        raise VendorError(f"{name} imports {a.name} from {base}, which the export cut")
