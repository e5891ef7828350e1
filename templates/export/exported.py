"""What this package was exported for, and the look-ups that stand in for kdagen's
spec -> lower -> render path and its tuning cache (written by ``kdagen export``; the rest
of this runtime is kdagen's own code).

``exported.json`` beside this file holds the table: the gate variants and plans exported, the
pre-rendered kernel source of each (plan, config fields the source reads), and the tuned
winners per GPU, family, plan, state dtype and shape bucket (kdagen's buckets,
:func:`.cache.keys.call_bucket`).  A call outside it raises a ValueError that says what the
package was exported for.
"""
from __future__ import annotations

import importlib
import json
import warnings
from pathlib import Path

PACKAGE = __name__.split(".")[0]
TABLE = json.loads((Path(__file__).with_name("exported.json")).read_text(encoding="utf-8"))
_PLANS: dict = {}  # Plan -> its index in TABLE["plans"]
_BUILT: dict = {}
_WARNED: set = set()


def exported_for() -> str:
    """One paragraph: the spec, gates, head dims, dtypes and GPUs of this package."""
    return TABLE["exported_for"]


def _refuse(what: str, hint: str = "export another package with kdagen for it"):
    raise ValueError(f"{PACKAGE}: {what} was not exported. {exported_for()} ({hint})")


def _gate_text(key) -> str:
    name, bound, has_A, has_bias = key
    if name == "direct":
        return "g given directly, " + ("no lower bound (safe_gate=False)" if bound is None else
                                       f"safe_gate=True, lower_bound={bound:g}")
    return (f"use_gate_in_kernel=True with the {name} gate" + ("" if bound is None else f" (lower_bound={bound:g})")
            + ("" if has_A else ", no A_log") + ("" if has_bias else ", no dt_bias"))


def binaries_dir() -> Path:
    """The kernels compiled ahead of time that this package ships (``kdagen export --aot``), which its
    first calls load instead of compiling (on the same target, with the same Triton build)."""
    return Path(__file__).resolve().parent.parent / "binaries"


def select_spec(use_gate_in_kernel, safe_gate, lower_bound, has_A, has_bias):
    """The exported gate variant FLA's flags choose (kdagen's choice, :func:`.ops.inputs.gate_choice`)."""
    from .ops.inputs import gate_choice

    name, bound, has_A, has_bias = gate_choice(use_gate_in_kernel, safe_gate, lower_bound, has_A, has_bias)
    return (name, None if bound is None else float(bound), bool(has_A), bool(has_bias))


def lower(spec, K, V, dtype, form, gate_in_kernel=False):
    """The exported plan of a gate variant at head dims K, V for ``dtype`` in ``form``."""
    from .codegen.lower import Plan

    if not _PLANS:
        for i, p in enumerate(TABLE["plans"]):
            _PLANS[Plan(**{**p["plan"], "stages": tuple(p["plan"]["stages"])})] = i
    for plan in _PLANS:
        p = TABLE["plans"][_PLANS[plan]]
        if (tuple(p["gate"]) == tuple(spec) and plan.form == form and (plan.K, plan.V) == (K, V)
                and plan.dtype == dtype and plan.gate_in_kernel == gate_in_kernel):
            return plan
    op = "chunk_kda" if form == "chunk" else "fused_recurrent_kda"
    others = sorted({tuple(TABLE["plans"][i]["gate"]) for plan, i in _PLANS.items()
                     if plan.form == form and (plan.K, plan.V) == (K, V) and plan.dtype == dtype
                     and plan.gate_in_kernel == gate_in_kernel}, key=str)
    if others:  # the head dims and dtype were exported, this gate was not
        _refuse(f"{op} with {_gate_text(spec)}",
                "this call's gates exported: " + "; ".join(_gate_text(g) for g in others)
                + "; `kdagen export --gates both --lower-bound L` exports the gates without and with a lower bound")
    _refuse(f"{op} with {_gate_text(spec)}, head dims K={K}, V={V}, dtype {dtype}")


def lookup_winner(plan, kernel, shape, state_dtype="float32"):
    """The winner exported for this GPU, plan, state dtype and shape bucket, or None."""
    from .cache.keys import call_bucket, lookup_buckets
    from .cache.lookup import _current_gpu
    from .config import config_from_dict

    gpu = _current_gpu()
    if gpu is None or not shape:
        return None
    per_gpu = TABLE["winners"].get(gpu.name)
    if per_gpu is None:
        if gpu.name not in _WARNED:
            _WARNED.add(gpu.name)
            warnings.warn(f"{PACKAGE}: no configs were exported for this GPU ({gpu.name}); the heuristic "
                          f"configs run. {exported_for()}", stacklevel=4)
        return None
    table = per_gpu.get(kernel, {}).get(str(_PLANS.get(plan, -1)), {}).get(state_dtype, {})
    for heads in lookup_buckets(kernel, shape):  # kdagen's own key: value heads, layout and step included
        d = table.get(call_bucket(kernel, shape, heads))
        if d is not None:
            return config_from_dict(kernel, d)
    return None


def build(plan, config):
    """The pre-rendered kernels of ``config``'s family for ``plan``, imported from ``kernels/``."""
    key = (plan, config)
    built = _BUILT.get(key)
    if built is not None:
        return built
    from .kernels import Built

    pid = _PLANS.get(plan)
    names, fns, kinds = [], [], []
    # a field a source's header leaves out at its default (QUIET_AT_DEFAULT, e.g. the recurrent kernel's
    # token_slots) must be at its default in the config for that source to be the config's kernel
    quiet = {f: config.__dataclass_fields__[f].default for f in getattr(config, "QUIET_AT_DEFAULT", ())}
    for kernel in TABLE["families"][config.kernel]:
        name = None
        for src in TABLE["sources"]:
            if src["kernel"] == kernel and src["plan"] == pid and all(
                    str(getattr(config, f)) == v for f, v in src["fields"].items()) and all(
                    f in src["fields"] or getattr(config, f) == d for f, d in quiet.items()):
                name = src["name"]
                break
        if name is None:
            if kernel in TABLE.get("optional_kernels", ()):  # a launch this config does not take
                continue
            _refuse(f"a {kernel} kernel for config {config.short()}")
        mod = importlib.import_module(f"{PACKAGE}.kernels.{name}")
        names.append(name)
        fns.append(getattr(mod, name))
        kinds.append(kernel)
    built = _BUILT[key] = Built(plan, config, tuple(names), tuple(fns), tuple(kinds))
    return built
