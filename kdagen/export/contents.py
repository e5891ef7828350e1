"""What an export holds, decided from the request and the tuning caches: the gate variants and
plans, the tuned winners per GPU (or the heuristic, marked), and the kernel sources every config
the package may run is rendered to.  Nothing is written here (:mod:`.writer` writes)."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cache.gpus import GpuProfile
from ..cache.heuristics import default_config
from ..cache.keys import source_hash
from ..codegen.lower import Plan, lower
from ..codegen.render import GeneratedSource, family_kernels, render
from ..config import ConfigError, RecurrentBwdConfig, config_from_dict
from ..dtypes import dtype as as_dtype
from ..ops.inputs import gate_choice, select_spec
from ..version import __version__

CHUNK_SIZES = (32, 64)  # chunk_kda's chunk_size keyword (FLA's): every exported config also at these
# shapes the heuristics are asked at (a grid over tokens, sequences and value heads): a heuristic
# that varies with the shape gets each of its configs' kernels exported
HEURISTIC_SHAPES = tuple({"T": T, "B": N, "N": N, "HV": HV} for T in (1, 64, 1024, 16384, 1 << 20)
                         for N in (1, 8, 64, 1024) for HV in (1, 8, 32, 128))
FAMILY_FORM = {"chunk_fwd": "chunk", "chunk_bwd": "chunk", "recurrent": "recurrent"}
_CONFIG_LINE = re.compile(r"^# config : (.*) \(the other fields are launch parameters\)$", re.M)


class ExportError(ValueError):
    """A request that cannot be exported (the command line's usage error)."""


@dataclass(frozen=True)
class Request:
    name: str
    gpus: tuple[GpuProfile, ...]
    head_dims: tuple[tuple[int, int], ...]
    dtypes: tuple[str, ...]  # canonical names
    lower_bound: float | None
    caches: dict[str, dict]  # GPU name -> the parsed cache file
    cache_paths: dict[str, str]  # GPU name -> the file it was read from (for the manifest)
    date: str | None = None
    spec_name: str = "kda"
    gate_in_kernel: bool = False  # also FLA's use_gate_in_kernel=True (the KDA layer's call)
    gates: str = "both"  # which g-given gates chunk_kda is exported for (GATES; gate_bounds)
    aot: bool = False  # ship the kept binaries of the exported kernels for the exported GPUs (kdagen.cache.binaries)


@dataclass
class Contents:
    request: Request
    variants: dict[str, list[tuple]]  # form -> the gate variants (gate_choice's tuples) it is exported for
    specs: dict[tuple, Any]  # (form, variant) -> the spec (sympy Recurrence)
    plans: list[Plan]
    plan_gates: list[tuple]  # the variant of each plan
    sources: dict[str, GeneratedSource] = field(default_factory=dict)  # name -> source
    source_rows: list[dict] = field(default_factory=list)  # {kernel, plan, fields, name}
    winners: dict = field(default_factory=dict)  # gpu -> family -> plan id -> state dtype -> bucket -> config
    winner_meta: dict = field(default_factory=dict)  # gpu -> {"entries", "versions", "newest", "stale"}
    warnings: list[str] = field(default_factory=list)
    binaries: list[dict] = field(default_factory=list)  # the kept binaries shipped (--aot): their info.json
    modules: list[dict] = field(default_factory=list)  # the kept launch modules shipped with them (--aot)


def read_cache_file(path: str) -> dict:
    """A tuning cache file (any machine's): its JSON, checked as far as the export reads it."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ExportError(f"cannot read tuning cache {path}: {e}") from None
    if not isinstance(data, dict) or data.get("schema") != 1 or not isinstance(data.get("entries"), dict) \
            or not isinstance(data.get("metadata"), dict) or "gpu_name" not in data["metadata"]:
        raise ExportError(f"{path} is not a kdagen tuning cache (schema 1 with metadata.gpu_name and entries)")
    return data


GATES = ("both", "bounded", "unbounded")  # --gates: which of chunk_kda's g-given gates are exported


def gate_bounds(lower_bound: float | None, gates: str = "both") -> list[float | None]:
    """The lower bounds the gates are exported for (None: unbounded, FLA's default safe_gate=False):
    ``gates`` 'both' gives the unbounded gate and, when ``lower_bound`` is given, the bounded one;
    'unbounded' and 'bounded' give one of them ('bounded' needs a lower bound)."""
    if gates not in GATES:
        raise ExportError(f"gates must be one of {', '.join(GATES)}, got {gates!r}")
    if gates == "bounded" and lower_bound is None:
        raise ExportError("'bounded' exports the gate bounded by --lower-bound, which is 'none': give a bound "
                          "(e.g. --lower-bound -5) or export the unbounded gate ('unbounded' or 'both')")
    bounds: list[float | None] = []
    if gates in ("both", "unbounded"):
        bounds.append(None)
    if gates in ("both", "bounded") and lower_bound is not None:
        bounds.append(float(lower_bound))
    return bounds


def variants(lower_bound: float | None, gate_in_kernel: bool = False, gates: str = "both") -> dict[str, list[tuple]]:
    """The gate variants each form is exported for, at each of :func:`gate_bounds`: g given
    directly, the chunk form without a bound (chunk_kda's safe_gate=False, FLA's default) and with
    it (safe_gate=True, lower_bound), the recurrent form as fused_recurrent_kda chooses it (it
    reads no bound); with ``gate_in_kernel`` also FLA's use_gate_in_kernel=True at each bound
    (the softplus gate without one, lower_bound * sigmoid(..) with it), with and without A_log
    and dt_bias.  (A layer call's training launches the in-kernel gate apart and then runs the
    direct gate at the same bound, which is exported with it.)"""
    bounds = gate_bounds(lower_bound, gates)
    out = {"chunk": [_key(gate_choice(False, b is not None, b, False, False)) for b in bounds],
           "recurrent": [_key(gate_choice(False, False, None, False, False))]}
    if gate_in_kernel:
        for b in bounds:
            for has_A in (True, False):
                for has_bias in (True, False):
                    if b is None and not has_A:
                        continue  # the softplus gate needs A_log (its rate)
                    key = _key(gate_choice(True, False, b, has_A, has_bias))
                    for form in out:
                        out[form].append(key)
    return out


def _spec(key: tuple):
    name, bound, has_A, has_bias = key
    if name == "direct":
        return select_spec(False, bound is not None, bound, False, False)
    return select_spec(True, False, bound, has_A, has_bias)


def _key(choice) -> tuple:
    name, bound, has_A, has_bias = choice
    return (name, None if bound is None else float(bound), bool(has_A), bool(has_bias))


def collect(req: Request) -> Contents:
    var = variants(req.lower_bound, req.gate_in_kernel, req.gates)
    specs = {(form, key): _spec(key) for form, keys in var.items() for key in keys}
    plans, gates = [], []
    for K, V in req.head_dims:
        for dt in req.dtypes:
            for form, key in specs:
                plans.append(lower(specs[(form, key)], K, V, dt, form, key[0] != "direct"))
                gates.append(key)
    c = Contents(req, var, specs, plans, gates)
    for gpu in req.gpus:
        _winners(c, gpu)
    for pid, plan in enumerate(plans):
        for family in (("chunk_fwd", "chunk_bwd") if plan.form == "chunk" else ("recurrent", "recurrent_bwd")):
            for cfg in _configs_of(c, pid, plan, family):
                _render(c, pid, plan, cfg)
    if req.aot:
        _binaries(c)
    return c


def _binaries(c: Contents) -> None:
    """The kept binaries (:mod:`kdagen.cache.binaries`) of the package's kernels for its GPUs' targets."""
    from ..cache.binaries import kept, kept_modules

    targets = {f"cuda:{g.arch}" for g in c.request.gpus}
    c.binaries = [b for b in kept() if b.get("kernel") in c.sources and b.get("target") in targets]
    # the C modules their first launches build (a launcher per signature, the driver's utilities): all that were
    # kept -- a few tens of KiB each; those of another Python or platform are never looked up
    c.modules = kept_modules() if c.binaries else []
    have = {b["target"] for b in c.binaries}
    for g in c.request.gpus:
        if f"cuda:{g.arch}" not in have:
            c.warnings.append(f"{g.name}: no kept binaries of this package's kernels (`kdagen build --gpu {g.name}` "
                              "with these head dims and dtypes keeps them); its first calls there compile")


def _winners(c: Contents, gpu: GpuProfile) -> None:
    """The newest entry per (family, plan, state dtype, bucket) of ``gpu``'s cache whose spec,
    head dims, dtype and kernel sources are the exported ones (any versions: they are recorded)."""
    data = c.request.caches.get(gpu.name)
    meta = {"entries": 0, "versions": [], "newest": None, "stale": 0}
    c.winner_meta[gpu.name] = meta
    c.winners[gpu.name] = {}  # an exported GPU, even without winners (the package runs the heuristic)
    if data is None:
        c.warnings.append(f"{gpu.name}: no tuning cache (kdagen's cache directory has none; --cache FILE takes "
                          "one copied from that GPU's machine); the package runs the heuristic configs there "
                          "(marked in the manifest)")
        return
    chosen: dict[tuple, tuple] = {}
    stale: set[str] = set()
    for key_string, entry in sorted(data["entries"].items()):
        key = entry.get("key") or {}
        family = key.get("kernel")
        if family not in FAMILY_FORM or key.get("gpu_name") != gpu.name:
            continue
        for pid, plan in enumerate(c.plans):
            if (plan.form == FAMILY_FORM[family] and key.get("spec_hash") == plan.tuning_spec_hash
                    and (key.get("K"), key.get("V")) == (plan.K, plan.V) and key.get("dtype") == plan.dtype):
                if key.get("source_hash") != source_hash(family):
                    stale.add(key_string)
                    continue
                slot = (family, pid, key["state_dtype"], key["shape_bucket"])
                old = chosen.get(slot)
                if old is None or (entry.get("measured_at") or "") > (old[1].get("measured_at") or ""):
                    chosen[slot] = (key_string, entry)
    meta["stale"] = len(stale)
    if meta["stale"]:
        c.warnings.append(f"{gpu.name}: {meta['stale']} cached winner(s) were tuned on other kernel sources "
                          "(another kdagen or template version) and are not exported")
    versions, used = set(), set()
    for (family, pid, state, bucket), (key_string, entry) in sorted(chosen.items()):
        try:
            cfg = config_from_dict(family, entry["config"])
        except (ConfigError, TypeError) as e:
            c.warnings.append(f"{gpu.name}: skipped a {family} winner with an unreadable config ({e})")
            continue
        c.winners.setdefault(gpu.name, {}).setdefault(family, {}).setdefault(str(pid), {}).setdefault(
            state, {})[bucket] = cfg.to_dict()
        used.add(key_string)  # one winner serves the direct gate's plan and the in-kernel gates' (same tuning spec)
        meta["entries"] = len(used)
        k = entry["key"]
        versions.add((k.get("triton_version"), k.get("torch_version"), k.get("cuda_version"),
                      k.get("kdagen_version")))
        if entry.get("measured_at") and (meta["newest"] is None or entry["measured_at"] > meta["newest"]):
            meta["newest"] = entry["measured_at"]
    meta["versions"] = [dict(zip(("triton", "torch", "cuda", "kdagen"), v)) for v in sorted(versions, key=str)]
    if not meta["entries"]:
        c.warnings.append(f"{gpu.name}: no tuned winners for these kernels in "
                          f"{c.request.cache_paths.get(gpu.name, 'its cache')}; the package runs the heuristic "
                          "configs there (marked in the manifest)")
        return
    tuned = c.winners[gpu.name].get("chunk_fwd", {})
    for key in c.variants["chunk"]:
        if key[0] == "direct" and not any(str(pid) in tuned for pid, gate in enumerate(c.plan_gates)
                                          if gate == key and c.plans[pid].form == "chunk"):
            how = "--lower-bound none" if key[1] is None else f"--lower-bound {key[1]:g}"
            c.warnings.append(f"{gpu.name}: no tuned chunk winners for chunk_kda with {_direct_text(key[1])} "
                              f"(`kdagen build {how}` tunes them); the package runs the heuristic chunk configs "
                              "for that gate there")


def _configs_of(c: Contents, pid: int, plan: Plan, family: str) -> list:
    """Every config a call of ``family`` on ``plan`` may run in the package: the winners of every
    GPU and the heuristics, each also at chunk_kda's chunk sizes; for the backward, the training
    forward's config it runs with (chosen as kdagen.ops.chunk_call.chunk_configs chooses it).  The recurrent
    backward is not tuned: its default config (all of its fields are launch parameters)."""
    if family == "recurrent_bwd":
        return [RecurrentBwdConfig()]
    base = [config_from_dict(family, d) for gpu in sorted(c.winners)
            for per_state in c.winners[gpu].get(family, {}).get(str(pid), {}).values() for d in per_state.values()]
    base = _once(base + [default_config(family, plan, shape) for shape in HEURISTIC_SHAPES])
    trains = _once([default_config("chunk_train", plan, shape) for shape in HEURISTIC_SHAPES])
    out = []
    for cfg in base:
        if family == "recurrent":
            out.append(cfg)
            continue
        for C in (cfg.chunk_size,) + CHUNK_SIZES:
            if family == "chunk_fwd":
                out.append(cfg.replace(chunk_size=C))
            else:
                for train in trains:
                    train = train.replace(chunk_size=C, sub_chunk=cfg.sub_chunk)
                    out += [train, cfg.with_chunking(C, train.sub_chunk)]
    return _once(out)


def _once(configs: list) -> list:
    """Each config once, in order."""
    return list({(type(x).__name__, x.canonical()): x for x in configs}.values())


def _render(c: Contents, pid: int, plan: Plan, cfg) -> None:
    for kernel in family_kernels(cfg.kernel, plan, cfg):
        src = render(kernel, plan, cfg)
        m = _CONFIG_LINE.search(src.text)
        fields = dict(kv.split("=", 1) for kv in m.group(1).split() if "=" in kv) if m else {}
        row = {"kernel": kernel, "plan": pid, "fields": fields, "name": src.name}
        if row not in c.source_rows:
            c.source_rows.append(row)
        c.sources[src.name] = src


def _direct_text(bound: float | None) -> str:
    return "safe_gate=False (no lower bound)" if bound is None else f"safe_gate=True, lower_bound={bound:g}"


def _in_kernel_text(bound: float | None) -> str:
    return ("the softplus gate (lower_bound=None, A_log required)" if bound is None
            else f"lower_bound={bound:g} (A_log optional)")


def describe(c: Contents) -> str:
    """What the package was exported for, in one paragraph (its contract)."""
    r = c.request
    direct = [k for k in c.variants["chunk"] if k[0] == "direct"]
    gate = ("g given directly; chunk_kda with " + " or ".join(_direct_text(k[1]) for k in direct)
            + ", fused_recurrent_kda with any lower_bound (it reads none); ")
    if r.gate_in_kernel:
        gate += ("use_gate_in_kernel=True with " + " or ".join(_in_kernel_text(k[1]) for k in direct)
                 + ", dt_bias optional")
    else:
        gate += "use_gate_in_kernel=False"
    dims = ", ".join(f"K={K} V={V}" for K, V in r.head_dims)
    dts = ", ".join(r.dtypes)
    gpus = ", ".join(f"{g.name} ({'tuned' if c.winner_meta[g.name]['entries'] else 'heuristic'})" for g in r.gpus)
    hashes = ", ".join(c.specs[("chunk", k)].hash + ("" if len(direct) == 1 else " for safe_gate=False" if k[1] is None
                                                     else f" for lower_bound={k[1]:g}") for k in direct)
    return (f"Exported for: spec {r.spec_name} (chunk form hash{'es' if len(direct) > 1 else ''} {hashes}), "
            f"{gate}; head dims "
            f"{dims}; dtypes {dts}; GPUs {gpus}.")


def as_dtype_names(short: list[str]) -> tuple[str, ...]:
    return tuple(as_dtype(s).name for s in short)


__all__ = ["GATES", "Request", "Contents", "ExportError", "collect", "describe", "gate_bounds", "read_cache_file",
           "variants", "as_dtype_names", "__version__"]
