"""kdagen's modules import each other one way: no cycle anywhere in the package, counting
imports inside functions (a lazy import that closes a loop is still a loop)."""
import ast
from pathlib import Path

from kdagen.codegen.sources import PACKAGE_DIR, import_graph, module_files


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (as a path that ends where it starts), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m):
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_the_graph_sees_every_kind_of_import():
    """The walker itself: module-level, relative, `from package import module`, absolute and
    function-level imports are all edges."""
    g = import_graph()
    assert "kdagen.ops.chunk_bwd" in g["kdagen.ops.chunk_call"]  # from . import chunk_bwd as bwd
    assert "kdagen.kernels" in g["kdagen.ops.chunk_fwd"]  # from ..kernels import Launch, ...
    assert "kdagen.spec" in g["kdagen.codegen.lower"]  # from .. import spec as S
    assert "kdagen.tuning.driver" in g["kdagen.cli"]  # inside a function: from .tuning import driver
    assert "kdagen.codegen.sources" in g["kdagen.cache.keys"]  # inside a function
    assert set(module_files()) == set(g) and len(g) > 30


def test_cycles_are_found():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_cycle_in_kdagen():
    cycle = _cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_module_parses_and_is_in_a_stage_package():
    """One package per pipeline stage: at the top level only the public entry, the shared
    vocabularies (config, dtypes, version, resources), the compile stage and the command line."""
    top = {p.stem for p in PACKAGE_DIR.glob("*.py")}
    assert top == {"__init__", "cli", "config", "dtypes", "kernels", "resources", "version"}
    data = {"templates", "search_spaces"}  # installed as packages of data
    assert {p.name for p in PACKAGE_DIR.iterdir() if (p / "__init__.py").is_file()} - data == {
        "spec", "codegen", "cache", "tuning", "ops", "export"}
    for path in Path(PACKAGE_DIR).rglob("*.py"):
        ast.parse(path.read_text(), filename=str(path))
