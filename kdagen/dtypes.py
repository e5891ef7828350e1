"""The one dtype vocabulary of kdagen.

Every spelling of a floating dtype kdagen meets -- a torch dtype, its canonical name
(``"bfloat16"``: plans, cache keys, generated headers), its short name (``"bf16"``: the
command line, worker arguments) and its Triton name (``"tl.bfloat16"``: generated source) --
is one :class:`DType`; :func:`dtype` maps any of them to it.  Configs choose where an
intermediate or a state is stored with :data:`STORAGE` (``"input"``: the inputs' dtype, or
``"fp32"``); :func:`storage` turns that choice into a torch dtype.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class DType:
    name: str  # canonical
    short: str
    torch: torch.dtype
    tl: str


FLOAT32 = DType("float32", "fp32", torch.float32, "tl.float32")
FLOAT16 = DType("float16", "fp16", torch.float16, "tl.float16")
BFLOAT16 = DType("bfloat16", "bf16", torch.bfloat16, "tl.bfloat16")
ALL = (FLOAT32, FLOAT16, BFLOAT16)
NAMES = tuple(d.name for d in ALL)
SHORT_NAMES = tuple(d.short for d in ALL)
TORCH_DTYPES = tuple(d.torch for d in ALL)

_LOOKUP: dict[Any, DType] = {}
for _d in ALL:
    _LOOKUP.update({_d.name: _d, _d.short: _d, _d.tl: _d, _d.torch: _d})

STORAGE = ("input", "fp32")


def dtype(x: Any) -> DType:
    """The :class:`DType` of a torch dtype or of any of its names; ValueError for others."""
    if isinstance(x, DType):
        return x
    try:
        return _LOOKUP[x]
    except (KeyError, TypeError):
        raise ValueError(f"unsupported dtype {x!r}; kdagen knows {', '.join(NAMES)} "
                         f"({', '.join(SHORT_NAMES)})") from None


def storage(choice: str, input_dtype: torch.dtype) -> torch.dtype:
    """The torch dtype of a :data:`STORAGE` choice for inputs of ``input_dtype``."""
    if choice == "input":
        return input_dtype
    if choice == "fp32":
        return torch.float32
    raise ValueError(f"storage must be one of {STORAGE}, got {choice!r}")
