"""The opt-in value check of the ops' inputs: ``KDAGEN_CHECK_INPUTS=1`` in the environment (read
when kdagen is imported), or ``check_inputs=True`` on a call (``False`` turns it off for a call).

The ops' own validation (:mod:`kdagen.ops.inputs`) looks at shapes, dtypes and devices only:
reading values would wait for the device on every call (and cannot happen inside a CUDA
graph). This check reads them, so it is off by default. It costs one synchronisation when
everything is fine (a few more to describe the first bad element), and reads every input
once. What it refuses, each with a ValueError that names the argument and its first bad index:

- NaN or +-inf in q, k, v, beta (general DPLR: a, b), initial_state (for a state pool: the slots the call reads),
  A_log, dt_bias, or the raw gate input of ``use_gate_in_kernel``;
- a direct gate g that is NaN or > 0 (a log decay is <= 0). g = -inf is a full reset of that
  channel and is accepted, unless the call promised a lower bound (``safe_gate=True`` /
  ``lower_bound``): then every g below the bound, -inf included, is refused;
- cu_seqlens that does not start at 0, decreases, or does not end at T;
- a state slot >= the pool's size, or one slot given to two sequences (negative slots mark
  padding and are fine).

Without the check, the kernels compute the recurrence for whatever values they get: NaN in
an input gives NaN in that sequence's output and state (and, with a state pool, in its slot,
which is updated in place); see each op's docstring for what a broken gate promise does.
"""
from __future__ import annotations

import os

import torch

ENV = "KDAGEN_CHECK_INPUTS"


def from_env() -> bool:
    """``$KDAGEN_CHECK_INPUTS``: anything but empty or "0" turns the check on."""
    return os.environ.get(ENV, "") not in ("", "0")


DEFAULT = from_env()  # read once, when kdagen is imported (a decode step should not parse the environment)


def wanted(flag: bool | None) -> bool:
    """The call's ``check_inputs`` keyword, or else the environment's default."""
    return DEFAULT if flag is None else bool(flag)


def promised_bound(safe_gate: bool, lower_bound: float | None, gate_in_kernel: bool) -> float | None:
    """The lower bound a direct gate g promises (chunk_kda's ``safe_gate``), or None."""
    if gate_in_kernel or not safe_gate:
        return None
    return -5.0 if lower_bound is None else float(lower_bound)


def _nonfinite(x):
    return ~torch.isfinite(x)


def _seqlens_bad(cu: torch.Tensor, T: int) -> torch.Tensor:
    bad = torch.zeros(cu.shape, dtype=torch.bool, device=cu.device)
    bad[0] = cu[0] != 0
    bad[1:] = cu[1:] < cu[:-1]
    bad[-1] |= cu[-1] != T
    return bad


def _slots_bad(idx: torch.Tensor, P: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(slot >= P, the later of two sequences that share a slot), per position of idx."""
    idx = idx.long()
    outside = idx >= P
    srt, perm = torch.sort(idx, stable=True)
    repeat = (srt[1:] == srt[:-1]) & (srt[1:] >= 0)
    dup = torch.zeros_like(outside)
    dup[perm[1:]] = repeat
    return outside, dup


def check_values(op: str, *, q, k, v, g, beta, initial_state=None, cu_seqlens=None, state_indices=None,
                 gate_bound: float | None = None, raw_gate: bool = False, A_log=None, dt_bias=None, a=None,
                 b=None, accepted=None) -> None:
    """Raise a ValueError naming the first bad argument and its first bad index (see the module).

    ``gate_bound``: the lower bound g was promised to respect (None: only g <= 0 is required).
    ``raw_gate``: g is the raw gate input of ``use_gate_in_kernel`` (only required finite).
    Shapes are assumed already validated.  A 2-D ``state_indices`` [N, T_max] (speculative decoding, a
    slot per token): no slot may appear twice (two tokens' states would go to one slot), ``accepted``
    (``num_accepted_tokens``) must lie in 1..T_max, and the initial-state check covers the slots read (each
    sequence's starting slot)."""
    T = q.shape[1]
    # (argument, mask of bad elements, what is wrong with them), in the order they are reported
    found: list[tuple[str, torch.Tensor, str]] = []
    if cu_seqlens is not None:
        found.append(("cu_seqlens", _seqlens_bad(cu_seqlens, T),
                      f"breaks the offsets' contract (start at 0, non-decreasing, end at T={T})"))
    used = None
    if state_indices is not None and initial_state is not None:
        P = initial_state.shape[0]
        outside, dup = _slots_bad(state_indices.reshape(-1), P)
        outside, dup = outside.view(state_indices.shape), dup.view(state_indices.shape)
        found.append(("ssm_state_indices", outside, f"is a slot outside the pool's {P} slots [0, {P}) "
                      "(negative slots mark padding)"))
        if state_indices.dim() == 2:
            found.append(("ssm_state_indices", dup, "repeats a slot an earlier token already uses "
                          "(two tokens' states would go to one slot)"))
        else:
            found.append(("ssm_state_indices", dup, "repeats a slot an earlier sequence already uses "
                          "(two sequences would update one slot)"))
        idx = state_indices.long()
        if idx.dim() == 2:  # the slots read: each sequence's starting slot
            width = idx.shape[1]
            if accepted is not None:
                acc = accepted.long()
                found.append(("num_accepted_tokens", (acc < 1) | (acc > width),
                              f"is outside 1..{width} (the columns of ssm_state_indices)"))
                col = (acc - 1).clamp(0, width - 1)
            else:
                col = torch.zeros(idx.shape[0], dtype=torch.long, device=idx.device)
            idx = idx.gather(1, col[:, None])[:, 0]
        used = torch.zeros(P, dtype=torch.bool, device=idx.device)
        used[idx[(idx >= 0) & (idx < P)]] = True
    for name, x in (("q", q), ("k", k), ("v", v), ("beta", beta)):
        found.append((name, _nonfinite(x), "is NaN or infinite"))
    if raw_gate:
        found.append(("g", _nonfinite(g), "(the raw gate input of use_gate_in_kernel) is NaN or infinite"))
    else:
        found.append(("g", torch.isnan(g), "is NaN"))
        found.append(("g", g > 0, "is > 0 (g is a log decay: it must be <= 0)"))
        if gate_bound is not None:
            found.append(("g", g < gate_bound, f"is below the promised lower_bound={gate_bound} "
                          "(safe_gate=True / lower_bound: g must be >= the bound)"))
    for name, x in (("a", a), ("b", b), ("A_log", A_log), ("dt_bias", dt_bias)):
        if x is not None:
            found.append((name, _nonfinite(x), "is NaN or infinite"))
    if initial_state is not None:
        bad = _nonfinite(initial_state)
        what = "is NaN or infinite"
        if used is not None:
            bad &= used.view(-1, *([1] * (bad.dim() - 1)))
            what = "(a slot this call reads) is NaN or infinite"
        found.append(("initial_state", bad, what))

    flags = torch.stack([m.any() for _, m, _ in found]).tolist()  # the one synchronisation
    for (name, mask, what), bad in zip(found, flags):
        if bad:
            where = tuple(mask.nonzero()[0].tolist())
            x = {"cu_seqlens": cu_seqlens, "ssm_state_indices": state_indices, "num_accepted_tokens": accepted,
                 "q": q, "k": k, "v": v, "g": g,
                 "beta": beta, "a": a, "b": b, "A_log": A_log, "dt_bias": dt_bias, "initial_state": initial_state}[name]
            at = ", ".join(map(str, where))
            raise ValueError(f"{op}: {name}[{at}] = {x[where].item()} {what} "
                             f"({int(mask.sum())} such element(s); found by the value check, "
                             f"check_inputs=True / {ENV}=1)")
