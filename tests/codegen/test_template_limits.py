"""The templates stay small enough to read: one per launched kernel and algorithm (codegen.render picks
among a kernel's), none over 300 lines or 25 lines with an `{% if %}`, `{% if %}` nested at most 3 deep;
what two templates share is a macro file (``_*.py.j2``).  Every kernel template is one a KernelSpec
names, and every one it names exists."""
import re

from kdagen.codegen.render import KERNELS
from kdagen.resources import templates_dir

MAX_LINES, MAX_IFS, MAX_NESTING = 300, 25, 3
_IF_LINE = re.compile(r"{%-?\s*if\b")
_IF_TAG = re.compile(r"{%-?\s*(if|endif)\b")


def _nesting(text: str) -> int:
    depth = deepest = 0
    for m in _IF_TAG.finditer(text):
        depth += 1 if m.group(1) == "if" else -1
        deepest = max(deepest, depth)
    assert depth == 0
    return deepest


def test_templates_are_within_the_limits():
    over = {}
    for path in sorted(templates_dir().glob("*.py.j2")):
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        ifs = sum(1 for line in lines if _IF_LINE.search(line))
        if len(lines) > MAX_LINES or ifs > MAX_IFS or _nesting(text) > MAX_NESTING:
            over[path.name] = (len(lines), ifs, _nesting(text))
    assert not over, f"(lines, lines with an if, if nesting) over ({MAX_LINES}, {MAX_IFS}, {MAX_NESTING}): {over}"


def test_every_kernel_template_is_named_by_a_kernel():
    named = {t for spec in KERNELS.values() for t in spec.templates}
    present = {p.name for p in templates_dir().glob("*.py.j2") if not p.name.startswith("_")}
    assert named <= present, sorted(named - present)
    assert present <= named, sorted(present - named)
