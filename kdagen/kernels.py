"""Compile stage: generated source becomes a loaded ``@triton.jit`` kernel (:func:`build`),
a kernel is compiled for a target GPU without that GPU (:func:`compile_for_target`), and a
launch is described and run (:class:`Launch`)."""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import sys
import tempfile
import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from .cache import binaries
from .cache.paths import fall_back_for_sources, generated_dir, source_dir
from .codegen.lower import Plan
from .codegen.render import GeneratedSource, family_kernels, render

# --- the Triton it compiles with ---------------------------------------------------------
# (major, minor) of the oldest and the newest Triton tested, inclusive: pyproject.toml's triton>=3.6,<3.10.
# CI runs the whole suite on the oldest (the pinned pair of the README) and the quick subset with the
# compile checks on the newest.  Another Triton is not refused (a newer one usually works), but its
# kernels have not been checked there: kdagen's import warns once (:func:`warn_if_untested`).
TESTED_TRITON = ((3, 6), (3, 9))


class UntestedTritonWarning(UserWarning):
    """kdagen runs on a Triton outside :data:`TESTED_TRITON`."""


def _minor(version: str) -> tuple[int, int] | None:
    m = re.match(r"\s*(\d+)\.(\d+)", str(version))
    return (int(m.group(1)), int(m.group(2))) if m else None


def triton_is_tested(version: str) -> bool:
    """Whether ``version`` (a Triton version string, e.g. ``3.9.0`` or ``3.10.0+git1234``) lies in
    :data:`TESTED_TRITON`.  A string that names no version is not tested."""
    v = _minor(version)
    lo, hi = TESTED_TRITON
    return v is not None and lo <= v <= hi


def warn_if_untested(version: str | None = None) -> bool:
    """Warn (an :class:`UntestedTritonWarning`) when the installed Triton -- or ``version`` -- is outside
    the tested range; True when it warned.  Called once, when kdagen is imported."""
    if version is None:
        try:
            import triton
        except ImportError:  # kdagen's own import of triton fails later, with Triton's message
            return False
        version = getattr(triton, "__version__", "unknown")
    if triton_is_tested(version):
        return False
    (a, b), (c, d) = TESTED_TRITON
    warnings.warn(f"kdagen is tested with Triton {a}.{b} to {c}.{d}; this is Triton {version}: its kernels "
                  "have not been checked on it (the interpreter tests and the compile checks of "
                  "README.md tell whether they build and agree with the reference)",
                  UntestedTritonWarning, stacklevel=2)
    return True


_LOADED: dict[str, Any] = {}

# a compile that `kdagen build` (or an exported package) kept ahead of time is loaded, not compiled again
binaries.install()


def write_source(src: GeneratedSource) -> str:
    """Write the source under the cache directory (atomically, once) and return its path.  When
    the cache directory cannot be written (read-only, or a file), the sources go to a temporary
    directory instead, with one warning (:func:`kdagen.cache.paths.fall_back_for_sources`)."""
    d = source_dir()
    try:
        return _write_into(d, src)
    except OSError as e:
        if d != generated_dir():
            raise
        return _write_into(fall_back_for_sources(e), src)


def _write_into(d, src: GeneratedSource) -> str:
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{src.name}.py"
    if not path.exists() or path.read_text() != src.text:
        fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{src.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(src.text)
        os.replace(tmp, path)
    return str(path)


def load(src: GeneratedSource):
    """Import the generated module and return its @triton.jit function."""
    fn = _LOADED.get(src.name)
    if fn is not None:
        return fn
    path = write_source(src)
    spec = importlib.util.spec_from_file_location(f"kdagen_generated.{src.name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    fn = getattr(mod, src.name)
    _LOADED[src.name] = fn
    return fn


@dataclass(frozen=True)
class Built:
    """The kernels of one config family, rendered for a plan and a config, and loaded."""

    plan: Plan
    config: Any
    sources: tuple[GeneratedSource, ...]
    fns: tuple[Any, ...]  # in the family's launch order (codegen.render.family_kernels)
    kinds: tuple[str, ...] = ()  # the kernel kind of each, e.g. "chunk_bwd_wy"

    def fn(self, kernel: str):
        """The loaded kernel of one kind, wherever the optional kinds before it put it."""
        if kernel not in self.kinds:
            raise KeyError(f"no {kernel} kernel for config {self.config.short()}; built: {', '.join(self.kinds)}")
        return self.fns[self.kinds.index(kernel)]


@lru_cache(maxsize=256)
def build(plan: Plan, config) -> Built:
    """Render and load every kernel of ``config``'s family for ``plan``."""
    kinds = family_kernels(config.kernel, plan, config)
    srcs = tuple(render(kind, plan, config) for kind in kinds)
    return Built(plan, config, srcs, tuple(load(s) for s in srcs), kinds)


@dataclass(frozen=True)
class CompileReport:
    name: str
    target: str
    shared_bytes: int
    num_warps: int
    n_regs: int | None
    n_spills: int | None
    cache_key: str = ""  # Triton's on-disk cache key of the binary


def jit_source(fn, args: dict[str, Any], constexprs: dict[str, Any], target, num_warps: int, num_stages: int):
    """``(ASTSource, options)`` exactly as Triton's JIT builds them when :func:`launch` runs ``fn[grid](**args,
    **constexprs, num_warps=..., num_stages=..., **launch options)`` on a ``target`` GPU: the same
    specialisation of every argument (16-byte alignment of pointers, divisibility by 16 of
    integers, integers equal to 1 made constant) and the same options.  A kernel compiled
    from it therefore has the on-disk cache key of the JIT's own compile, and the device
    loads it instead of compiling again.  No GPU is needed (the binder is Triton's, built for
    ``target``'s backend); this follows Triton 3.6's ``JITFunction.run``."""
    from triton import knobs
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    kwargs = {**args, **constexprs, "num_warps": num_warps, "num_stages": num_stages, **compile_options(),
              **launch_options(constexprs)}  # (launch_pdl is a compile option: part of the binary's key)
    kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    bound_args, specialization, options = binder(**kwargs)
    options, signature, consts, attrs = fn._pack_args(backend, kwargs, bound_args, specialization, options)
    return ASTSource(fn, signature, consts, attrs), options.__dict__


_WARNED_MODULES_NOT_KEPT = False


def _warn_modules_not_kept(e: Exception) -> None:
    """One warning a process: the launch modules could not be built here."""
    global _WARNED_MODULES_NOT_KEPT
    if _WARNED_MODULES_NOT_KEPT:
        return
    _WARNED_MODULES_NOT_KEPT = True
    warnings.warn(f"the kernels' launch modules were not kept ({type(e).__name__}: {str(e)[:200]}): a first "
                  "launch on the GPU builds them with its C compiler (about 0.2 s each)", stacklevel=3)


def compile_for_target(fn, args: dict[str, Any], constexprs: dict[str, Any], target, num_warps: int,
                       num_stages: int, keep: dict | None = None) -> CompileReport:
    """Compile a jitted kernel for ``target`` (a triton GPUTarget) with no GPU present, as the
    JIT would on that GPU for these arguments (:func:`jit_source`).  ``keep``: keep the binary
    (:func:`kdagen.cache.binaries.keep`, which this dict describes: the GPU, the family, the config),
    so that a first call on that GPU loads it."""
    import triton

    src, options = jit_source(fn, args, constexprs, target, num_warps, num_stages)
    out = triton.compile(src, target=target, options=options)
    if keep is not None:
        binaries.keep(out.hash, {**keep, "kernel": fn.__name__, "target": f"{target.backend}:{target.arch}",
                                 "num_warps": num_warps, "num_stages": num_stages})
        if target.backend == "cuda":  # and the C modules its first launch would build (its launcher)
            try:
                binaries.keep_launch_modules(src, out.metadata)
            except Exception as e:  # noqa: BLE001 - no C compiler here: the first launch builds them, as before
                _warn_modules_not_kept(e)
    md = out.metadata
    return CompileReport(name=fn.__name__, target=f"{target.backend}:{target.arch}",
                         shared_bytes=int(getattr(md, "shared", 0)), num_warps=num_warps,
                         n_regs=getattr(out, "n_regs", None), n_spills=getattr(out, "n_spills", None),
                         cache_key=out.hash)


# --- launching ------------------------------------------------------------------------
# Triton's JIT dispatch binds and re-specialises every argument on each call (tens of us).
# For a hot path (decode: one launch per token) we keep the CompiledKernel that the first
# launch produced, keyed by everything Triton specialises on, and call it directly.
_COMPILED: dict[tuple, Any] = {}


def _spec_key(v):
    if isinstance(v, torch.Tensor):
        return (v.dtype, v.data_ptr() % 16 == 0)
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, int):
        return ("i", v == 1, v % 16 == 0, not -2 ** 31 <= v < 2 ** 31)
    if isinstance(v, float):
        return "f"
    return ("c", v)


def specialisation(fn, vals, constexprs: dict, num_warps: int, num_stages: int) -> tuple:
    """What Triton tells launches of ``fn`` apart by (``vals``: the argument values in order): launches with equal
    keys on one device run one compiled kernel."""
    return (fn, tuple(_spec_key(v) for v in vals), tuple(constexprs.values()), num_warps, num_stages)


# Floating-point fusion (a * b + c contracted to one fused multiply-add by LLVM and ptxas): Triton enables it
# by default up to 3.9 and disables it by default from 3.10 (TRITON_DEFAULT_FP_FUSION; 3.9 warns).  kdagen's
# kernels were tuned and checked against float64 with it on, so every compile asks for it explicitly and a
# newer Triton builds the same code.  (TRITON_FORCE_DISABLE_FP_FUSION=1 still turns it off.)
FP_FUSION = True


def compile_options() -> dict:
    """The compile options every kdagen kernel is built with, whatever the Triton version's defaults: FP
    fusion on (:data:`FP_FUSION`).  The launch, the compile-check (:func:`jit_source`) and the decode fast
    path's look-up of the JIT's binary all pass them, so they build and find the same binary."""
    return {"enable_fp_fusion": FP_FUSION}


def launch_options(constexprs: dict) -> dict:
    """The launch options a kernel's constexprs ask for: a kernel generated with PDL=True (it waits
    for the previous grid with griddepcontrol.wait before it reads anything) is launched as a
    programmatic dependent launch, so that it can be made resident while the previous grid drains."""
    return {"launch_pdl": True} if constexprs.get("PDL") else {}


def launch(fn, grid, args: dict, constexprs: dict, num_warps: int, num_stages: int):
    """Launch ``fn[grid](**args, **constexprs)``, reusing the compiled kernel when possible."""
    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        fn[grid](**args, **constexprs, num_warps=num_warps, num_stages=num_stages, **compile_options())
        return
    vals = list(args.values())
    key = specialisation(fn, vals, constexprs, num_warps, num_stages) + (
        vals[0].device.index if isinstance(vals[0], torch.Tensor) else None,)
    kernel = _COMPILED.get(key)
    if kernel is None:
        kernel = fn[grid](**args, **constexprs, num_warps=num_warps, num_stages=num_stages, **compile_options(),
                          **launch_options(constexprs))
        if kernel is not None and hasattr(kernel, "run"):
            _COMPILED[key] = kernel
        return
    stream = torch.cuda.current_stream(vals[0].device).cuda_stream
    g0, g1, g2 = (tuple(grid) + (1, 1))[:3]
    kernel.run(g0, g1, g2, stream, kernel.function, kernel.packed_metadata, None, None, None,
               *vals, *constexprs.values())


def has_repair(fn) -> bool:
    """Whether a generated kernel takes a repair launch (its REPAIR argument: codegen.render diag_checked),
    read off the kernel itself so that an exported package, which renders nothing, decides the same."""
    return "REPAIR" in getattr(fn, "arg_names", ())


def with_repairs(launches) -> list:
    """Each launch followed by the repair launch it runs after itself (:attr:`Launch.then`), if any: what
    running ``launches`` launches, for compile checks."""
    return [x for ln in launches for x in (ln, ln.then) if x is not None]


_DUMMY: dict[torch.device, torch.Tensor] = {}


def dummy_pointer(device) -> torch.Tensor:
    """A one-element tensor passed for pointer arguments a launch does not use."""
    t = _DUMMY.get(device)
    if t is None:
        t = _DUMMY[device] = torch.zeros(1, dtype=torch.float32, device=device)
    return t


@dataclass
class Launch:
    """One kernel launch, described: run it, time it, or compile it for another GPU."""

    kernel: str  # the template kind, e.g. "chunk_intra" (codegen.render.KERNELS)
    fn: Any
    grid: tuple[int, ...]
    args: dict[str, Any]
    constexprs: dict[str, Any]
    num_warps: int
    num_stages: int
    # a launch that runs right after this one (the repair launch of a checked diagonal: the same kernel
    # with REPAIR=True, re-running the programs this one flagged; codegen.render diag_checked)
    then: Any = None

    def __call__(self):
        launch(self.fn, self.grid, self.args, self.constexprs, self.num_warps, self.num_stages)
        if self.then is not None:
            self.then()

    def with_repair(self, repair_grid: tuple[int, ...] | None = None) -> "Launch":
        """This launch (REPAIR=False) followed by its repair launch (REPAIR=True), same arguments; the
        repair launch's grid ``repair_grid`` (default: this one's)."""
        fast = dataclasses.replace(self, constexprs={**self.constexprs, "REPAIR": False}, then=None)
        repair = dataclasses.replace(fast, constexprs={**fast.constexprs, "REPAIR": True},
                                     grid=tuple(repair_grid or fast.grid))
        return dataclasses.replace(fast, then=repair)
