"""The Triton versions kdagen is tested on (pyproject.toml's ``triton`` range, the CI's two jobs), and
the one warning that a Triton outside them gets when kdagen is imported: it is not refused, since a newer
Triton usually works, but its kernels have not been checked there."""
from __future__ import annotations

import re
import warnings

# (major, minor) of the oldest and the newest Triton tested, inclusive: pyproject.toml's triton>=3.6,<3.10.
# CI runs the whole suite on the oldest (the pinned pair of the README) and the quick subset with the
# compile checks on the newest.
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
