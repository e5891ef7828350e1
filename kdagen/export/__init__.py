"""The export stage: tuned kernels as a standalone package (``kdagen export``).

:mod:`.contents` decides what a package holds (plans, winners per GPU, the kernel sources every
config it may run needs), :mod:`.vendor` copies kdagen's run-time modules into it with the
spec/lower/render path cut out, and :mod:`.writer` writes the files from ``templates/export/``.
"""
from __future__ import annotations

from pathlib import Path

from .contents import Contents, ExportError, Request, collect, describe, read_cache_file
from .writer import package_files, write


def export_package(request: Request, out_dir: str | Path) -> tuple[Path, Contents]:
    """Collect and write the package ``out_dir/<request.name>/``: (its path, what it holds)."""
    contents = collect(request)
    return write(contents, out_dir), contents


__all__ = ["ExportError", "Request", "Contents", "collect", "describe", "export_package", "package_files",
           "read_cache_file"]
