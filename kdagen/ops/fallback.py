"""The run-time fallback: a config whose launch does not compile on the GPU the call runs on
(``triton.runtime.errors.OutOfResources``: more shared memory or registers than a block may take;
or a ``CompilationError``) is replaced by the next config down (:func:`kdagen.cache.smem.step_down`
for the launch that failed), with one warning per kernel and config, and the call's launches are
described and run again from the start.  A compile fails before its kernel runs, so the launches
that ran before it only wrote buffers the new launches write again; nothing of a failed config
reaches the outputs.  The replacement is remembered per (family, plan, config): later calls go
straight to it."""
from __future__ import annotations

import warnings

from triton.compiler.errors import CompilationError
from triton.runtime.errors import OutOfResources

from ..cache import smem

_NEXT: dict = {}  # (family, plan, config) -> the config that replaced it
_WARNED: set = set()


FAILURES = (OutOfResources, CompilationError)  # a failed compile: too much shared memory, or a compiler error


def replacement(family: str, plan, config):
    """The config calls of ``config`` run: itself, or what replaced it after a failed compile."""
    seen = set()
    while (family, plan, config) in _NEXT and config not in seen:
        seen.add(config)
        config = _NEXT[(family, plan, config)]
    return config


def run(family: str, plan, config, describe, *, after=None):
    """Describe (``describe(config) -> (launches, result)``) and run the launches of ``config`` (its
    replacement, :func:`replacement`, if it has one); on a failed compile, the next config down, until one
    compiles or none is left (then the error is raised).  ``after(launches)``: called once the launches ran.
    Returns ``(config that ran, launches, result)``."""
    config = replacement(family, plan, config)
    while True:
        launches, result = describe(config)
        failed = None
        try:
            for launch in launches:
                failed = launch
                launch()
        except FAILURES as e:
            kind = getattr(failed, "kernel", None)
            nxt = smem.step_down(family, plan, config, kind)
            if nxt is None or nxt == config:
                raise
            key = (kind, config)
            if key not in _WARNED:
                _WARNED.add(key)
                warnings.warn(f"kdagen: {kind} of {family} config ({config.short()}) does not compile on this GPU "
                              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); running "
                              f"({nxt.short()}) instead", RuntimeWarning, stacklevel=3)
            _NEXT[(family, plan, config)] = nxt
            config = nxt
            continue
        if after is not None:
            after(launches)
        return config, launches, result
