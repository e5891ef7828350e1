"""The rendered source of every kernel of every default config, as one digest per kernel: what a
refactor of the generator must leave byte-identical (or list and explain).

For every member (KDA with its gates, Gated DeltaNet, DeltaNet, GLA, general DPLR), head dims,
dtype and form, the heuristic config at a handful of call shapes (no shape, a long sequence, many
short ones, a decode step at B=1 and 256, a V-first pool) is taken and each of its kernels
rendered; the digest maps ``member/gate/KxV/dtype/family/shape/kernel`` to the source's sha256.

    python bench/render_digest.py --out after.json [--against before.json] [--show 3]

Run it at two commits (the older through ``bench/ab_snapshot.sh COMMIT before`` and
``PYTHONPATH=.ab/before``): ``--against`` prints the keys whose source differs, is new or is gone,
and with ``--show N`` the unified diff of the first N differing kernels (needs ``--against``'s
commit on PYTHONPATH as ``--before-path``).
"""
from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

if not os.environ.get("PYTHONPATH"):
    # this checkout's kdagen, not an editable install's of another checkout (a worktree beside it):
    # sys.path[0] is bench/, which would leave the import to the installed package
    sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

MEMBERS = (  # (spec name, gate, lower bound, gate in kernel)
    ("kda", "direct", -5.0, False), ("kda", "direct", None, False), ("kda", "lower_bound", -5.0, True),
    ("kda", "softplus", None, True), ("gdn", "direct", None, False), ("gdn", "softplus", None, True),
    ("deltanet", None, None, False), ("gla", "direct", None, False), ("dplr", "direct", None, False),
)
DIMS = ((64, 64), (100, 100), (128, 128), (256, 256), (64, 128))
DTYPES = ("bfloat16", "float16", "float32")
SHAPES = {
    "none": None,
    "long": {"T": 65536, "B": 1, "N": 1, "HV": 8, "T_max": 65536},
    "packed": {"T": 32768, "B": 1, "N": 64, "HV": 32, "T_max": 512},
    "batch": {"T": 4096, "B": 4, "N": 4, "HV": 32, "T_max": 4096},
}
DECODE_SHAPES = {
    "step1": {"T": 1, "B": 1, "N": 1, "HV": 32, "P": 64},
    "step256": {"T": 1, "B": 256, "N": 256, "HV": 32, "P": 512},
    "step256vk": {"T": 1, "B": 256, "N": 256, "HV": 32, "P": 512, "state_v_first": True},
    "tokens4": {"T": 4, "B": 16, "N": 16, "HV": 32},
}


def sources() -> dict[str, str]:
    """key -> rendered source, over the grid above (skipping what a member cannot lower)."""
    from kdagen.cache.heuristics import default_config
    from kdagen.codegen.lower import lower
    from kdagen.codegen.render import family_kernels, render
    from kdagen.spec import get_spec

    out: dict[str, str] = {}
    for name, gate, lb, gik in MEMBERS:
        try:
            spec = get_spec(name, gate=gate if name != "deltanet" else None,
                            lower_bound=lb if gate != "softplus" else None)
        except ValueError:
            continue
        for K, V in DIMS:
            for dt in DTYPES:
                for form in ("chunk", "recurrent"):
                    try:
                        plan = lower(spec, K, V, dt, form, gik)
                    except Exception:  # noqa: BLE001 -- a member's head-dim or gate limits
                        continue
                    if form == "chunk":
                        fams = ("chunk_train", "chunk_bwd") if plan.structure == "dplr" else \
                            ("chunk_fwd", "chunk_train", "chunk_bwd")
                        shapes = SHAPES
                    else:
                        fams, shapes = ("recurrent",), DECODE_SHAPES
                    for fam in fams:
                        for sname, shape in shapes.items():
                            config = default_config(fam, plan, shape)
                            for kind in family_kernels(fam, plan, config):
                                key = f"{name}/{gate}/{lb}/{int(gik)}/{K}x{V}/{dt}/{fam}/{sname}/{kind}"
                                out[key] = render(kind, plan, config).text
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the digest JSON to write")
    ap.add_argument("--against", help="an earlier digest to compare with")
    ap.add_argument("--before-path", help="the earlier commit's checkout (PYTHONPATH), to print diffs")
    ap.add_argument("--show", type=int, default=0, help="print the diff of the first N differing kernels")
    a = ap.parse_args()
    src = sources()
    digest = {k: hashlib.sha256(v.encode()).hexdigest() for k, v in sorted(src.items())}
    Path(a.out).write_text(json.dumps(digest, indent=0, sort_keys=True))
    print(f"{len(digest)} kernels rendered ({len(set(digest.values()))} distinct sources) -> {a.out}")
    if not a.against:
        return
    old = json.loads(Path(a.against).read_text())
    changed = sorted(k for k in digest.keys() & old.keys() if digest[k] != old[k])
    new, gone = sorted(digest.keys() - old.keys()), sorted(old.keys() - digest.keys())
    print(f"identical {len(digest.keys() & old.keys()) - len(changed)}, changed {len(changed)}, "
          f"new {len(new)}, gone {len(gone)}")
    for label, keys in (("changed", changed), ("new", new), ("gone", gone)):
        kinds: dict[str, int] = {}
        for k in keys:
            kinds[k.rsplit("/", 1)[1]] = kinds.get(k.rsplit("/", 1)[1], 0) + 1
        if kinds:
            print(f"  {label} by kernel: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    if a.show and changed and a.before_path:
        code = ("import json,sys; sys.path.insert(0, sys.argv[1]); sys.argv=[sys.argv[0]];"
                "import importlib.util as u; s=u.spec_from_file_location('d', %r); m=u.module_from_spec(s);"
                "s.loader.exec_module(m); print(json.dumps(m.sources()))" % str(Path(__file__).resolve()))
        before = json.loads(subprocess.run([sys.executable, "-c", code, a.before_path], capture_output=True,
                                           text=True, check=True).stdout)
        for k in changed[:a.show]:
            print(f"--- {k}")
            sys.stdout.writelines(difflib.unified_diff(before[k].splitlines(True), src[k].splitlines(True), n=1))


if __name__ == "__main__":
    main()
