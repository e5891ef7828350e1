"""A bench/ script loaded as a module in a test (bench/ is a folder of scripts, not a package).

The folder goes on the end of ``sys.path`` so that a script's imports of its siblings (serving,
forward_vs_fla, ...) resolve, without shadowing anything already importable."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def load_bench(name: str):
    """bench/<name>.py, executed as the module ``name``."""
    if str(BENCH) not in sys.path:
        sys.path.append(str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
