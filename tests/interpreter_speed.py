"""Two per-call overheads of Triton's CPU interpreter taken out, leaving what it computes unchanged.  Installed
by the conftest (the processes of the interpreter tests) and by the processes the tests start that run the
interpreter themselves (the bf16 emulation scripts, the context-parallel ranks).  Either is skipped on a
Triton whose interpreter lacks the function it replaces."""
from __future__ import annotations

import inspect

import triton.language as tl
from triton.runtime import interpreter


def _builtins_listed_once() -> None:
    """The interpreter patches triton.language's builtins on every launch and on every call of a jitted helper
    inside a kernel, listing each package's members (``inspect.getmembers``: every attribute, sorted) each
    time.  Here each package's builtins are listed once; each call then patches, in the same (sorted) order,
    those of them still builtin -- as Triton's ``_patch_builtin`` does, which finds no builtin under a name
    already patched."""
    if not (hasattr(interpreter, "_patch_builtin") and hasattr(interpreter, "_patch_attr")):
        return
    listed = {}

    def patch_builtin(pkg, builder, scope):
        names = listed.get(pkg)
        if names is None:
            names = listed[pkg] = [n for n, m in inspect.getmembers(pkg) if tl.core.is_builtin(m)]
        for name in names:
            member = getattr(pkg, name, None)
            if tl.core.is_builtin(member):
                interpreter._patch_attr(pkg, name, member, builder, scope)

    interpreter._patch_builtin = patch_builtin


def _np_dtypes_remembered() -> None:
    """The numpy dtype of a Triton type (``_get_np_dtype``, millions of calls) builds its table of every type
    on each call; a block type's is its element type's.  Each answer is remembered per type here."""
    if not hasattr(interpreter, "_get_np_dtype"):
        return
    plain, memo = interpreter._get_np_dtype, {}

    def get_np_dtype(tt_dtype):
        if isinstance(tt_dtype, tl.block_type):  # (a block of pointers: the pointer's, uint64)
            tt_dtype = tt_dtype.element_ty
        try:
            return memo[tt_dtype]
        except KeyError:
            np_dtype = memo[tt_dtype] = plain(tt_dtype)
            return np_dtype
        except TypeError:  # an unhashable type: Triton's own answer (or error)
            return plain(tt_dtype)

    interpreter._get_np_dtype = get_np_dtype


def install() -> None:
    _builtins_listed_once()
    _np_dtypes_remembered()
