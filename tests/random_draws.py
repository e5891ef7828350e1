"""Seeded draws for the randomized differential tests (tests/decode/test_decode_random_cases.py,
tests/chunk/test_chunk_random_cases.py): each takes a torch.Generator, so a case is its seed."""
from __future__ import annotations

import torch


def pick(gen, choices):
    """One of ``choices``, uniformly."""
    return choices[int(torch.randint(len(choices), (1,), generator=gen))]


def integer(gen, lo, hi):
    """A uniform integer in [lo, hi]."""
    return int(torch.randint(lo, hi + 1, (1,), generator=gen))


def uniform(gen):
    """A uniform float in [0, 1)."""
    return float(torch.rand((), generator=gen))
