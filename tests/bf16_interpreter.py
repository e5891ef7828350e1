"""bf16 tensor-core operands, emulated in Triton's CPU interpreter (run as a script, in its own
process: it patches the interpreter and the renderer for the whole process).

Triton 3.6's interpreter cannot run bf16 (it stores bf16 as uint16 and computes with fp16's
range), and fp16 hides what bf16's 8-bit mantissa exposes: on the H200, commit bce5f2d's
factorised backward diagonal left dg with 3.4x the error of every other gradient, and no fp16
or fp32 test saw it.  Here the kernels are rendered for float32 inputs with
the dot dtype set to float64 (a marker), and the interpreter's float32 -> float64 cast rounds to
bf16's mantissa (round to nearest even) while keeping float32's range.  So every operand the
templates cast to the dot dtype is rounded exactly as a bf16 operand is on the GPU; the dots
multiply and add in float64 and their results are cast to float32, like the GPU's fp32
accumulator (whose own error is 2^16 times smaller than the operand rounding).  What it does
not model: bf16 storage of inputs, intermediates and outputs (they stay float32 here).

    python tests/bf16_interpreter.py CASE [CASE ...]     # prints {case: {output: rel. error}}

CASE is name:B,T,H,HV,K,V[:free][:ieee|:split][:bench][:seedN][:c16|:c32|:c64] (free: the
unbounded plan, checked diagonals -- factorised where a sub-tile's span allows, element-wise else; bench: inputs rounded to bf16 and dO, dht drawn as
bench.py's GPU check draws them; seedN: the inputs' seed; c16/c32/c64: the chunk length; ieee:
diag_precision="ieee", the factorised diagonal's operands in fp32 -- tf32's operand rounding is not
emulated; split: diag_precision="split", bf16 operands with the backward's upstream diagonal tiles
as hi + lo).
"""
from __future__ import annotations

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton.language as tl  # noqa: E402
import triton.language.semantic as semantic  # noqa: E402
import triton.runtime.interpreter as interp  # noqa: E402

import kdagen  # noqa: E402
import kdagen.codegen.render as codegen  # noqa: E402
from kdagen.spec.reference import naive_recurrent_kda  # noqa: E402

MARKER = "tl.float64"


def round_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bf16 value (ties to even), kept as float32."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def install() -> None:
    import interpreter_speed  # (beside this script)

    interpreter_speed.install()
    render_vars = codegen._template_vars

    exact = set(filter(None, os.environ.get("KDAGEN_EMULATE_EXACT", "").split(",")))

    def bf16_operands(kernel, plan, config):
        v = render_vars(kernel, plan, config)
        if plan.dtype != "float32":
            raise ValueError("the bf16 emulation renders float32 plans")
        if kernel in exact:  # (KDAGEN_EMULATE_EXACT: kernels left in fp32, to see whose rounding counts)
            return v
        v["dot_dtype"], v["dot_kw"] = MARKER, ""
        factorised = plan.diag_mode == "factorised" or v.get("diag_checked", False)
        if "diag_dtype" in v and (not factorised or config.diag_precision in ("input", "split")):
            v["diag_dtype"], v["diag_kw"] = MARKER, ""  # the diagonal in bf16 too, as on the GPU by default
        # (diag_precision tf32 / ieee: the factorised -- or checked -- diagonal's operands stay fp32, ieee dots)
        return v

    codegen._template_vars = bf16_operands
    cast = interp.InterpreterBuilder.cast_impl

    def cast_rounding(self, src, dst_type):
        if dst_type.scalar == tl.float64 and src.dtype.scalar == tl.float32:
            return interp.TensorHandle(round_to_bf16(src.data).astype(np.float64), tl.float64)
        return cast(self, src, dst_type)

    interp.InterpreterBuilder.cast_impl = cast_rounding
    dot = semantic.TritonSemantic.dot

    def dot_fp32_result(self, lhs, rhs, *args, **kwargs):  # as a bf16 dot's fp32 accumulator
        res = dot(self, lhs, rhs, *args, **kwargs)
        return self.cast(res, tl.float32) if res.dtype == tl.float64 else res

    semantic.TritonSemantic.dot = dot_fp32_result


def errors(B, T, H, HV, K, V, free=False, seed=0, diag="input", as_bench=False,
           chunk_size=None) -> dict[str, float]:
    """Relative Frobenius error of o, the final state and every gradient against float64
    autograd through the token-by-token recurrence; inputs as the former GPU check script bench.py drew
    them (removed from the tree; git history keeps it).
    ``diag``: the training forward's and the backward's ``diag_precision``.  ``as_bench``: q, k, v, beta and
    dO rounded to bf16 before the call (the reference takes the rounded values, as bench.py's check on
    the GPU does) and dO, dht drawn as bench.py draws them (seed 7 + seed); else unrounded inputs, whose
    rounding at the dots adds to every error."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, HV, V, generator=gen)
    g = -5.0 * torch.sigmoid(torch.randn(B, T, HV, K, generator=gen) + 2.0)
    beta = torch.sigmoid(torch.randn(B, T, HV, generator=gen))
    h0 = 0.1 * torch.randn(B, HV, K, V, generator=gen)
    do = torch.randn(B, T, HV, V, generator=gen)
    dht = torch.randn(B, HV, K, V, generator=gen)
    if as_bench:
        q, k, v, beta = (torch.from_numpy(round_to_bf16(t.numpy())) for t in (q, k, v, beta))
        gen = torch.Generator().manual_seed(7 + seed)
        do = torch.from_numpy(round_to_bf16(torch.randn(B, T, HV, V, generator=gen).numpy()))
        dht = torch.randn(B, HV, K, V, generator=gen)
    leaves = dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0)
    gate = {} if free else dict(safe_gate=True, lower_bound=-5.0)
    x = {n: t.clone().requires_grad_(True) for n, t in leaves.items()}
    from kdagen.cache.heuristics import default_chunk_bwd_config, default_train_config
    from kdagen.codegen.lower import lower
    from kdagen.ops.chunk import chunk_bwd_config
    from kdagen.ops.inputs import select_spec

    plan = lower(select_spec(False, not free, -5.0 if not free else None, False, False), K, V, "float32", "chunk")
    with chunk_bwd_config(default_chunk_bwd_config(plan).replace(diag_precision=diag)):
        train = default_train_config(plan).replace(diag_precision=diag)
        if chunk_size is not None:
            train = train.replace(chunk_size=chunk_size)
        o, ht = kdagen.chunk_kda(**x, output_final_state=True, config=train, **gate)
        ((o * do).sum() + (ht * dht).sum()).backward()
    r = {n: t.double().requires_grad_(True) for n, t in leaves.items()}
    ro, rht = naive_recurrent_kda(r["q"], r["k"], r["v"], r["g"], r["beta"], initial_state=r["initial_state"],
                                  output_final_state=True)
    ((ro * do.double()).sum() + (rht * dht.double()).sum()).backward()

    def rel(a, b):
        return float((a.double() - b).norm() / b.norm())

    out = {"o": rel(o.detach(), ro.detach()), "final_state": rel(ht.detach(), rht.detach())}
    out.update({f"d{n}": rel(x[n].grad, r[n].grad) for n in leaves})
    return out


def main(argv: list[str]) -> None:
    install()
    result = {}
    for arg in argv:
        name, dims, *flags = arg.split(":")
        diag = next((f for f in flags if f in ("tf32", "ieee", "split")), "input")
        seed = next((int(f[4:]) for f in flags if f.startswith("seed")), 0)
        result[name] = errors(*(int(d) for d in dims.split(",")), free="free" in flags, diag=diag, seed=seed,
                              as_bench="bench" in flags,
                              chunk_size=next((int(f[1:]) for f in flags if f in ("c16", "c32", "c64")), None))
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
