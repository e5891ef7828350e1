"""What ``kdagen build`` shows while it works and when it is done: a progress bar with an ETA
per family and stage (:class:`Progress`; one line per stage when the output is not a
terminal), notes on padded head dims (:func:`padding_note`), and the closing summary of
what was compiled, dropped and tuned, and where it was put (:class:`BuildSummary`).
:func:`table` lays out the columns of every table the command line prints."""
from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Any, Callable, Sequence, TextIO


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str = "", indent: str = "  ") -> list[str]:
    """Lines of a plain-text table, columns as wide as their widest cell; ``align`` has one
    letter per column, 'l' or 'r' (default: left)."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    align = align.ljust(len(headers), "l")
    lines = []
    for n, r in enumerate(cells):
        parts = [c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(r, widths, align)]
        lines.append((indent + "  ".join(parts)).rstrip())
        if n == 0:
            lines.append(indent + "  ".join("-" * w for w in widths))
    return lines


def padding_note(plan) -> str | None:
    """A note when the kernels pad a head dim to a larger tile (a power of two), with the
    padded sizes and the extra arithmetic on the K x V state it implies; None when K and V
    are their tiles' sizes.  Reads the plan's ``BK``/``BV``."""
    K, V = plan.K, plan.V
    BK, BV = getattr(plan, "BK", K), getattr(plan, "BV", V)
    if (BK, BV) == (K, V):
        return None
    padded = [f"{n}={d} to {b}" for n, d, b in (("K", K, BK), ("V", V, BV)) if b != d]
    return (f"note: the kernels pad {' and '.join(padded)} (tiles are powers of two): they compute on "
            f"{BK}x{BV} state tiles for the {K}x{V} state: {BK * BV / (K * V):.2f}x the arithmetic of the "
            f"state updates and products; head dims that are powers of two avoid it")


def drop_reasons(failures: Sequence[tuple[Any, str]]) -> str:
    """Why candidates were dropped, counted by kind: 'over shared memory' for the ones that
    exceed the GPU's shared memory, else the compiler error's type."""
    kinds = Counter("over shared memory" if "shared memory" in why else (why.split(":", 1)[0] or "failed")
                    for _, why in failures)
    return ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())


def departures(config) -> str:
    """A config's fields that differ from its dataclass's defaults (the heuristic's config for the
    reference call), as ``name=value``; "-" where none does."""
    default = type(config)().to_dict()
    return " ".join(f"{k}={v}" for k, v in config.to_dict().items() if default[k] != v) or "-"


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Progress:
    """Progress of the compile-check and of the tuning, per family (and stage).

    On a terminal: a bar per family or stage with its count, ETA and what survived, drawn by
    tqdm on ``stream``.  Otherwise: one line when a stage ends (the same ``[label n/total] ...``
    line) and, for a stage that takes long, a line every ``every_s`` seconds with its ETA.
    ``enabled=False`` (``--quiet``) shows nothing.  :meth:`echo` prints a line without
    breaking a bar that is being drawn."""

    def __init__(self, enabled: bool = True, stream: TextIO | None = None, bar: bool | None = None,
                 every_s: float = 30.0, clock: Callable[[], float] = time.time):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.bar = enabled and (_isatty(self.stream) if bar is None else bar)
        self.every_s = every_s
        self.clock = clock
        self._label = None
        self._bar = None
        self._t0 = self._last = 0.0

    def _start(self, label: str, total: int):
        self._close()
        self._label, self._t0 = label, self.clock()
        self._last = self._t0
        if self.bar:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=label, file=self.stream, leave=False, dynamic_ncols=True,
                             unit="cfg", bar_format="{desc} {bar} {n_fmt}/{total_fmt} [{elapsed}<{remaining}]"
                                                    "{postfix}")

    def _close(self):
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._label = None

    def compile_step(self, label: str, done: int, total: int, ok: int) -> None:
        """A compile-check callback: ``done`` of ``total`` candidates of ``label`` compiled,
        ``ok`` of them kept (``done`` 0: the stage starts)."""
        if not self.enabled:
            return
        if label != self._label or done == 0:
            self._start(label, total)
            if done == 0 and total:
                return
        if self._bar is not None:
            self._bar.set_postfix_str(f"{ok} ok, {done - ok} dropped", refresh=False)
            self._bar.update(done - self._bar.n)
            if done >= total:
                self._close()
            return
        now = self.clock()
        if done >= total or now - self._last >= self.every_s:
            self._last = now
            elapsed = now - self._t0
            eta = "" if done >= total or not done else f", ETA {elapsed / done * (total - done):.0f}s"
            print(f"  [{label} {done}/{total}] {ok} ok, {done - ok} dropped ({elapsed:.0f}s{eta})",
                  file=self.stream, flush=True)
            if done >= total:
                self._label = None

    def tuning(self, families: Sequence[tuple[str, int]]) -> Callable[[], None]:
        """Bars over the shapes each family is tuned at, one after the other: ``families`` is
        ``[(label, number of shapes)]`` in tuning order.  Returns the callable that advances by
        one shape (a no-op off a terminal, where the tuner's own lines show progress)."""
        todo = [(label, n) for label, n in families if n > 0]
        if not self.bar or not todo:
            return lambda: None
        self._start(*todo.pop(0))

        def step():
            if self._bar is None:
                return
            self._bar.update(1)
            if self._bar.n >= self._bar.total:
                self._close()
                if todo:
                    self._start(*todo.pop(0))

        return step

    def echo(self, line: str = "", err: bool = False) -> None:
        """Print a line (on stderr with ``err``) without breaking the bar being drawn."""
        if self._bar is not None:
            self._bar.clear()
        print(line, file=sys.stderr if err else sys.stdout, flush=True)
        if self._bar is not None:
            self._bar.refresh()

    def close(self) -> None:
        self._close()


def _dims(K: int, V: int) -> str:
    return f"{K}x{V}"


class BuildSummary:
    """What one ``kdagen build`` compiled and tuned, gathered as it runs, and the table it ends
    with (:meth:`lines`)."""

    def __init__(self, gpu_name: str):
        self.gpu_name = gpu_name
        self.compiled: list[tuple] = []  # (family, stage, K, V, survivors, total, failures)
        self.tuned: list[tuple] = []  # (family, K, V, shape, winner, ms, default_ms, error)
        self.kept: list = []  # the configs the ops run there, compiled and kept (driver.Kept)

    def add_surveys(self, surveys_all: dict) -> None:
        """The compile-check's result (:func:`kdagen.tuning.driver.compile_all`)."""
        for (K, V, fam), (_plan, _spec, surveys) in surveys_all.items():
            for s in surveys:
                self.compiled.append((fam, s.stage or "-", K, V, len(s.survivors), s.total, list(s.failures)))

    def add_tuned(self, family: str, K: int, V: int, shape: tuple, winner, ms: float | None,
                  default_ms: float | None, error: float | None) -> None:
        """One family tuned at one shape (``winner`` None: no candidate passed)."""
        self.tuned.append((family, K, V, tuple(shape), winner, ms, default_ms, error))

    def add_kept(self, kept: Sequence) -> None:
        """The configs the ops run on the GPU, compiled and kept (:func:`kdagen.tuning.driver.keep_binaries`)."""
        self.kept.extend(kept)

    def lines(self, duration: Callable[[float], str], error_text: Callable[[float | None], str]) -> list[str]:
        """The summary: the compile table (when every candidate was compiled), the configs the ops run
        there and whether each compiled, the tuning table (when something was tuned); ``duration`` and
        ``error_text`` format a time and an error."""
        out = []
        if self.compiled:
            out.append(f"summary: candidate configs compiled for {self.gpu_name} (each family at its first "
                       "tuning shape)")
            out += table(["family", "stage", "KxV", "compiled", "dropped", "why dropped"],
                         [(fam, st, _dims(K, V), f"{ok}/{total}", len(fails), drop_reasons(fails) or "-")
                          for fam, st, K, V, ok, total, fails in self.compiled], align="lllrr")
        if self.kept:
            out.append(f"{'summary: ' if not out else ''}what the ops run on a {self.gpu_name} at each tuning shape, "
                       "compiled for it and kept")
            rows = []
            for k in self.kept:
                B, T, H, _ = k.shape
                where = f"B={B} H={H}" if k.family == "recurrent" else f"B={B} T={T} H={H}"
                rows.append((k.family, _dims(k.K, k.V), where, "winner" if k.tuned else "heuristic",
                             "kept" if k.why is None else f"failed: {k.why}", departures(k.config)))
            out += table(["family", "KxV", "shape", "config", "binary", "fields other than the defaults"], rows)
        if self.tuned:
            out.append(f"winners measured on this {self.gpu_name} (median times; speed-up: the heuristic default's "
                       "time over the winner's)")
            rows = []
            for fam, K, V, shape, winner, ms, dms, err in self.tuned:
                B, T, H, _ = shape
                where = f"B={B} H={H}" if fam == "recurrent" else f"B={B} T={T} H={H}"
                if winner is None:
                    rows.append((fam, _dims(K, V), where, "none passed", "-", "-", "-", "-"))
                    continue
                rows.append((fam, _dims(K, V), where, duration(ms), duration(dms) if dms else "failed",
                             f"x{dms / ms:.2f}" if dms else "-", error_text(err), winner.short()))
            out += table(["family", "KxV", "shape", "winner", "default", "speed-up", "error", "winner config"], rows,
                         align="lllrrrr")
        return out
