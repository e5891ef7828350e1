"""Run a tuning candidate in a child process, so that a config that faults the GPU cannot
poison the tuner.

A CUDA fault (an illegal memory access, a trap) leaves the whole process's CUDA context
unusable: every later launch in it fails.  :class:`IsolatedCandidate` forwards ``build`` /
``check`` / ``time`` to a worker process that holds the real candidate (its inputs stay
on the GPU between calls).  An exception there comes back as :class:`CandidateError` and
becomes a failed trial; after a fatal one (a CUDA error, a crash, no answer within
``timeout_s``) the worker is discarded and the next call starts a fresh one.  Starting a
worker (spawning it, importing torch and kdagen, making the candidate) has its own, longer
limit, ``start_timeout_s``: on a loaded machine it can take longer than a config may take to
answer, and it says nothing about a config.
"""
from __future__ import annotations

import multiprocessing
import traceback
from typing import Any

REMAKE = "__remake__"  # the message that swaps the worker's candidate
START_TIMEOUT_S = 120.0  # the least a worker's start-up is given
FATAL_MARKERS = ("CUDA error", "AcceleratorError", "cudaError", "device-side assert", "illegal memory access")


class CandidateError(RuntimeError):
    """A candidate's build/check/time failed in the worker (the message says how)."""


def is_fatal(type_name: str, message: str) -> bool:
    text = f"{type_name}: {message}"
    return any(m in text for m in FATAL_MARKERS)


def _worker(conn, factory, args: tuple, kwargs: dict) -> None:
    """Child: build the candidate once, then answer (method, config) requests until told to stop
    or until a fatal error (the CUDA context is lost; the parent starts a new worker)."""
    try:
        cand = factory(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        conn.send(("err", type(e).__name__, str(e)[:2000], True))
        return
    conn.send(("ready", None))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        method, config = msg
        if method == REMAKE:  # another candidate for the same worker (its process, CUDA context, imports)
            cand = None
            try:
                factory, args, kwargs = config
                cand = factory(*args, **kwargs)
            except Exception as e:  # noqa: BLE001
                conn.send(("err", type(e).__name__, str(e)[:2000], True))
                return
            conn.send(("ok", None))
            continue
        try:
            conn.send(("ok", getattr(cand, method)(config)))
        except Exception as e:  # noqa: BLE001 - reported to the parent as a failed trial
            fatal = is_fatal(type(e).__name__, str(e))
            conn.send(("err", type(e).__name__, (str(e) or traceback.format_exc(limit=2))[:2000], fatal))
            if fatal:
                return


class IsolatedCandidate:
    """``factory(*args, **kwargs)`` -- a picklable callable, e.g. a class -- is the candidate,
    made in a spawned worker.  Exposes ``build`` / ``check`` / ``time`` and ``tolerance``."""

    def __init__(self, factory, *args, timeout_s: float = 600.0, tolerance: float | None = None,
                 start_timeout_s: float | None = None, **kwargs):
        self.factory, self.args, self.kwargs = factory, args, kwargs
        self.timeout_s = timeout_s
        # a worker's start-up (spawn, imports, the candidate made): at least START_TIMEOUT_S
        self.start_timeout_s = max(timeout_s, START_TIMEOUT_S) if start_timeout_s is None else start_timeout_s
        self.tolerance = tolerance if tolerance is not None else getattr(factory, "tolerance", None)
        self.restarts = 0  # workers discarded after a fatal error
        self._proc = None
        self._conn = None

    # -- worker management
    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(child, self.factory, self.args, self.kwargs), daemon=True)
        proc.start()
        child.close()
        self._proc, self._conn = proc, parent
        reply = self._recv("start", self.start_timeout_s)
        if reply[0] != "ready":
            self._discard()
            raise CandidateError(f"candidate could not be made in the worker: {reply[1]}: {reply[2]}")

    def _discard(self) -> None:
        if self._proc is not None:
            self.restarts += 1
            try:
                self._conn.close()
            except OSError:
                pass
            self._proc.kill()
            self._proc.join(timeout=10)
        self._proc = self._conn = None

    def _recv(self, what: str, timeout_s: float | None = None):
        limit = self.timeout_s if timeout_s is None else timeout_s
        if not self._conn.poll(limit):
            self._discard()
            raise CandidateError(f"{what}: no answer from the worker within {limit:.0f}s (killed)")
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            code = self._proc.exitcode if self._proc is not None else None
            self._discard()
            raise CandidateError(f"{what}: the worker died (exit code {code})") from None

    def _call(self, method: str, config: Any) -> Any:
        if self._proc is None or not self._proc.is_alive():
            if self._proc is not None:
                self._discard()
            self._start()
        try:
            self._conn.send((method, config))
        except (BrokenPipeError, OSError):
            self._discard()
            raise CandidateError(f"{method}: the worker is gone") from None
        reply = self._recv(method)
        if reply[0] == "ok":
            return reply[1]
        _, type_name, message, fatal = reply
        if fatal:
            self._discard()
        raise CandidateError(f"{type_name}: {message}" + (" (worker restarted)" if fatal else ""))

    def remake(self, factory, *args, **kwargs) -> None:
        """Hold another candidate, ``factory(*args, **kwargs)``, from now on.  A live worker
        makes it in place, so its start-up (imports, CUDA context) is paid once for a series of
        candidates (kdagen build: every shape of every family); otherwise the next call starts
        a worker with it.  A candidate that cannot be made raises :class:`CandidateError`."""
        self.factory, self.args, self.kwargs = factory, args, kwargs
        if self._proc is None or not self._proc.is_alive():
            if self._proc is not None:
                self._discard()
            return
        try:
            self._conn.send((REMAKE, (factory, args, kwargs)))
        except (BrokenPipeError, OSError):
            self._discard()
            return
        reply = self._recv("remake")
        if reply[0] != "ok":
            self._discard()
            raise CandidateError(f"candidate could not be made in the worker: {reply[1]}: {reply[2]}")

    # -- the candidate protocol
    def build(self, config: Any) -> Any:
        return self._call("build", config)

    def check(self, built: Any) -> float:
        return self._call("check", built)

    def time(self, built: Any) -> float:
        return self._call("time", built)

    def close(self) -> None:
        if self._proc is not None:
            try:
                self._conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self._proc.join(timeout=10)
            if self._proc.is_alive():
                self._proc.kill()
            self._proc = self._conn = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
