"""Compile stage: turn generated source into a launchable Triton kernel, or compile it for
a target GPU without that GPU (``compile_for_target``)."""
from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

import torch

from .codegen import GeneratedSource
from .paths import generated_dir

_LOADED: dict[str, Any] = {}

_PTR_TYPES = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16",
              torch.int32: "*i32", torch.int64: "*i64"}


def write_source(src: GeneratedSource) -> str:
    """Write the source under the cache directory (atomically, once) and return its path."""
    d = generated_dir()
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
class CompileReport:
    name: str
    target: str
    shared_bytes: int
    num_warps: int
    n_regs: int | None
    n_spills: int | None


def signature_of(args: dict[str, Any], constexprs: dict[str, Any]) -> dict[str, str]:
    sig = {}
    for name, val in args.items():
        if isinstance(val, torch.Tensor):
            sig[name] = _PTR_TYPES[val.dtype]
        elif val is None:
            sig[name] = "*i8"  # an unused pointer argument
        elif isinstance(val, bool):
            sig[name] = "i1"
        elif isinstance(val, int):
            sig[name] = "i64" if abs(val) >= 2 ** 31 else "i32"
        elif isinstance(val, float):
            sig[name] = "fp32"
        else:
            raise TypeError(f"cannot type kernel argument {name}={val!r}")
    for name in constexprs:
        sig[name] = "constexpr"
    return sig


def compile_for_target(fn, args: dict[str, Any], constexprs: dict[str, Any], target, num_warps: int,
                       num_stages: int) -> CompileReport:
    """Compile a jitted kernel for ``target`` (a triton GPUTarget) with no GPU present."""
    import triton
    from triton.compiler import ASTSource

    src = ASTSource(fn=fn, signature=signature_of(args, constexprs), constexprs=dict(constexprs))
    out = triton.compile(src, target=target, options={"num_warps": num_warps, "num_stages": num_stages})
    md = out.metadata
    return CompileReport(name=fn.__name__, target=f"{target.backend}:{target.arch}",
                         shared_bytes=int(getattr(md, "shared", 0)), num_warps=num_warps,
                         n_regs=getattr(out, "n_regs", None), n_spills=getattr(out, "n_spills", None))


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


def launch(fn, grid, args: dict, constexprs: dict, num_warps: int, num_stages: int):
    """Launch ``fn[grid](**args, **constexprs)``, reusing the compiled kernel when possible."""
    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        fn[grid](**args, **constexprs, num_warps=num_warps, num_stages=num_stages)
        return
    vals = list(args.values())
    key = (fn, tuple(_spec_key(v) for v in vals), tuple(constexprs.values()), num_warps, num_stages,
           vals[0].device.index if isinstance(vals[0], torch.Tensor) else None)
    kernel = _COMPILED.get(key)
    if kernel is None:
        kernel = fn[grid](**args, **constexprs, num_warps=num_warps, num_stages=num_stages)
        if kernel is not None and hasattr(kernel, "run"):
            _COMPILED[key] = kernel
        return
    stream = torch.cuda.current_stream(vals[0].device).cuda_stream
    g0, g1, g2 = (tuple(grid) + (1, 1))[:3]
    kernel.run(g0, g1, g2, stream, kernel.function, kernel.packed_metadata, None, None, None,
               *vals, *constexprs.values())


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

    fn: Any
    grid: tuple[int, ...]
    args: dict[str, Any]
    constexprs: dict[str, Any]
    num_warps: int
    num_stages: int

    def __call__(self):
        launch(self.fn, self.grid, self.args, self.constexprs, self.num_warps, self.num_stages)
