"""Write an export's files: the package tree from ``templates/export/``, the vendored runtime
(:mod:`.vendor`), the kernel sources and the table and manifest (:mod:`.contents`).  Every file
is a function of the request and the caches, so the same inputs give the same bytes."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import jinja2

from ..resources import templates_dir
from ..version import __version__
from .contents import Contents, ExportError, describe
from .vendor import vendor

RUNTIME = "_runtime"  # the vendored kdagen modules, inside the package


def export_templates_dir() -> Path:
    d = templates_dir() / "export"
    if d.is_dir():
        return d
    # an editable install of another checkout can own kdagen.templates: this checkout's files
    return Path(__file__).resolve().parent.parent.parent / "templates" / "export"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _json(data) -> str:
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def package_files(c: Contents) -> dict[str, str]:
    """Relative path -> text of every file of the export (the project directory's contents)."""
    r = c.request
    name = r.name
    files: dict[str, str] = {}
    runtime = vendor()
    for m in runtime:
        files[f"{name}/{RUNTIME}/{m.relpath}"] = m.text
    tdir = export_templates_dir()
    files[f"{name}/{RUNTIME}/exported.py"] = (tdir / "exported.py").read_text(encoding="utf-8")
    files[f"{name}/kernels/__init__.py"] = '"""The generated Triton kernels of this package (one module each)."""\n'
    for src_name, src in sorted(c.sources.items()):
        files[f"{name}/kernels/{src_name}.py"] = src.text
    contract = describe(c)
    table = {"exported_for": contract, "families": {f: list(k) for f, k in _families().items()},
             "optional_kernels": list(_optional_kernels()),
             "plans": [{"gate": list(gate), "plan": p.to_dict()} for p, gate in zip(c.plans, c.plan_gates)],
             "sources": c.source_rows, "winners": c.winners}
    files[f"{name}/{RUNTIME}/exported.json"] = _json(table)
    manifest = _manifest(c, contract, files)
    files[f"{name}/manifest.json"] = _json(manifest)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(tdir)), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, autoescape=False)
    ctx = dict(name=name, version=__version__, manifest=manifest, contract=contract, runtime=RUNTIME,
               head_dims=r.head_dims, dtypes=r.dtypes, lower_bound=r.lower_bound, gate_in_kernel=r.gate_in_kernel,
               bounds=_bounds(c), gpus=manifest["gpus"], date=manifest["date"])
    files[f"{name}/__init__.py"] = env.get_template("__init__.py.j2").render(**ctx)
    files["pyproject.toml"] = env.get_template("pyproject.toml.j2").render(**ctx)
    files["README.md"] = env.get_template("README.md.j2").render(**ctx)
    files[f"tests/test_{name}.py"] = env.get_template("test_package.py.j2").render(**ctx)
    return files


def _bounds(c: Contents) -> list:
    """The lower bounds chunk_kda's g-given gate is exported for (None: safe_gate=False)."""
    return [key[1] for key in c.variants["chunk"] if key[0] == "direct"]


def _families() -> dict:
    from ..codegen.render import FAMILY_KERNELS

    return FAMILY_KERNELS


def _optional_kernels() -> tuple:
    from ..codegen.render import OPTIONAL_KERNELS

    return OPTIONAL_KERNELS


def _manifest(c: Contents, contract: str, files: dict[str, str]) -> dict:
    r = c.request
    newest = [m["newest"] for m in c.winner_meta.values() if m["newest"]]
    date = r.date or (max(newest) if newest else None)
    specs = [{"form": form, "gate": list(gate), "name": s.name, "hash": s.hash, "text": s.describe()}
             for (form, gate), s in c.specs.items()]
    gpus = []
    for g in r.gpus:
        m = c.winner_meta[g.name]
        gpus.append({"name": g.name, "compute_capability": list(g.compute_capability), "sm_count": g.sm_count,
                     "configs": "tuned" if m["entries"] else "heuristic", "winners": m["entries"],
                     "stale_winners_left_out": m["stale"], "measured_with": m["versions"],
                     "cache_file": Path(r.cache_paths[g.name]).name if g.name in r.cache_paths else None})
    return {
        "package": r.name, "kdagen_version": __version__,
        "date": date, "date_source": "--date" if r.date else ("newest exported winner" if newest else
                                                              "none: no winners and no --date"),
        "exported_for": contract, "specs": specs,
        "head_dims": [list(d) for d in r.head_dims], "dtypes": list(r.dtypes), "lower_bound": r.lower_bound,
        "gates": r.gates, "chunk_gate_bounds": _bounds(c), "gate_in_kernel": r.gate_in_kernel,
        "gpus": gpus,
        "sources": {n: c.sources[n].source_hash[:16] for n in sorted(c.sources)},
        # compiled ahead of time (--aot): loaded by a first call on the same target with the same Triton build
        "binaries": [{k: b[k] for k in ("kernel", "target", "triton", "key", "gpu")} for b in
                     sorted(c.binaries, key=lambda b: (b["kernel"], b["target"], b["key"]))],
        "launch_modules": [{k: m[k] for k in ("module", "key", "suffix", "platform", "triton")} for m in
                           sorted(c.modules, key=lambda m: (m["module"], m["key"]))],
        "runtime": {p: _sha(t) for p, t in sorted(files.items()) if p.startswith(f"{r.name}/{RUNTIME}/")},
        "requires": ["torch", "triton"],
    }


def write(c: Contents, out_dir: str | Path) -> Path:
    """Write the export under ``out_dir/<name>/`` (replacing an earlier export of that name)."""
    root = Path(out_dir) / c.request.name
    files = package_files(c)
    if root.exists():
        if not (root / c.request.name / "manifest.json").is_file():
            raise ExportError(f"{root} exists and is not an earlier export of {c.request.name}; "
                              "choose another --out or --name")
        shutil.rmtree(root)
    for rel, text in sorted(files.items()):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    if c.binaries:
        from ..cache.binaries import binaries_dir
        for b in c.binaries + c.modules:  # the kept folders as they are (the package's runtime serves them from here)
            shutil.copytree(binaries_dir() / b["folder"], root / c.request.name / "binaries" / b["folder"])
    return root
