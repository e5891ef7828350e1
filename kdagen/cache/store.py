"""The persistent tuning cache: one JSON file per GPU.

Layout: ``<cache_dir>/<gpu_name>.json`` where :func:`cache_dir` is ``$KDAGEN_CACHE_DIR``
when set, else ``$XDG_CACHE_HOME/kdagen``, else ``~/.cache/kdagen``.  The file::

    {"schema": 1,
     "metadata": {"gpu_name", "compute_capability", "sm_count",
                  "triton_version", "torch_version", "cuda_version", "kdagen_version"},
     "entries": {key_string: {"config": {...}, "kernel": str, "time_ms": float,
                              "default_time_ms": float | None, "error": float | None,
                              "measured_at": iso date, "key": {the CacheKey fields}}}}

Lookups are exact: an entry is found only under the key string of a :class:`CacheKey`
whose every field is equal (the stored ``"key"`` is compared too).  The only lossy step
is :func:`shape_bucket`, the one declared bucketing function; head dims are never
bucketed.  Writes re-read the file under an exclusive lock, merge, and replace the file
atomically, so concurrent tuners never lose each other's entries or leave a torn file.
"""
from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import json
import math
import os
import re
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator

try:
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX: no inter-process lock
    fcntl = None  # type: ignore[assignment]

from .keys import CacheKey
from .paths import ENV_CACHE_DIR, cache_dir as _cache_dir

SCHEMA_VERSION = 1


class CacheError(RuntimeError):
    """A cache file that cannot be used (corrupt, other schema, other GPU)."""


# --------------------------------------------------------------------------- entries

REQUIRED_ENTRY_FIELDS = ("config", "kernel", "time_ms")


def make_entry(*, config: Any, kernel: str, time_ms: float, error: float | None,
               default_time_ms: float | None = None) -> dict[str, Any]:
    """An entry dict for :meth:`TuningCache.store` (``key``/``measured_at`` filled there).
    ``error``: the winner's relative error against the float64 reference, as the tuner measured
    it (None: not measured)."""
    cfg = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    return {"config": cfg, "kernel": kernel, "time_ms": float(time_ms),
            "default_time_ms": None if default_time_ms is None else float(default_time_ms),
            "error": None if error is None else float(error)}


def _now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _file_name(gpu_name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_.-]+", "_", gpu_name.strip().lower()).strip("._")
    if not s:
        raise ValueError(f"invalid GPU name for a cache file: {gpu_name!r}")
    return s + ".json"


# --------------------------------------------------------------------------- cache


class TuningCache:
    """The tuning cache of one GPU.

    ``compute_capability`` / ``sm_count`` describe the GPU; when omitted they come from
    the registry profile of ``gpu_name`` (if it has one) or from the first stored key.
    ``on_error="warn"`` makes :meth:`lookup` warn and miss, instead of raising, on an
    unusable file (store always raises: an unusable file is never overwritten).
    """

    def __init__(self, gpu_name: str, cache_dir: str | os.PathLike | None = None, *,
                 compute_capability: tuple[int, int] | None = None,
                 sm_count: int | None = None, on_error: str = "raise"):
        if on_error not in ("raise", "warn"):
            raise ValueError("on_error must be 'raise' or 'warn'")
        self.gpu_name = str(gpu_name)
        if compute_capability is None:
            try:
                from .gpus import get_profile

                prof = get_profile(self.gpu_name)
                compute_capability = prof.compute_capability
                sm_count = prof.sm_count if sm_count is None else sm_count
            except ValueError:
                pass
        self.compute_capability = None if compute_capability is None else tuple(compute_capability)
        self.sm_count = sm_count
        self.on_error = on_error
        self.dir = Path(cache_dir).expanduser() if cache_dir is not None else _cache_dir()
        self.path = self.dir / _file_name(self.gpu_name)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self._data: dict[str, Any] | None = None
        self._stamp: tuple[int, int, int] | None = None
        self._warned = False

    def __repr__(self) -> str:
        return f"TuningCache({self.gpu_name!r}, path={str(self.path)!r})"

    # ---------------------------------------------------------------- file handling

    def _fix_hint(self) -> str:
        return (f"delete or move {self.path} (e.g. `mv {self.path} {self.path}.bak`) to start a "
                f"fresh cache, or point ${ENV_CACHE_DIR} at another directory")

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _read(self) -> dict[str, Any] | None:
        """Parse and validate the file; None if absent; CacheError if unusable."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as e:
            raise CacheError(f"cannot read tuning cache {self.path}: {e}") from None
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CacheError(f"tuning cache {self.path} is corrupt (not valid JSON: {e}); "
                             f"{self._fix_hint()}") from None
        self._validate(data)
        return data

    def _validate(self, data: Any, key: CacheKey | None = None) -> None:
        if not isinstance(data, dict):
            raise CacheError(f"tuning cache {self.path} is malformed (top level is not a JSON "
                             f"object); {self._fix_hint()}")
        if data.get("schema") != SCHEMA_VERSION:
            raise CacheError(f"tuning cache {self.path} has schema version {data.get('schema')!r}, "
                             f"this kdagen reads schema {SCHEMA_VERSION}; {self._fix_hint()}")
        if not isinstance(data.get("metadata"), dict) or not isinstance(data.get("entries"), dict):
            raise CacheError(f"tuning cache {self.path} is malformed (expected 'metadata' and "
                             f"'entries' objects); {self._fix_hint()}")
        meta = data["metadata"]
        if meta.get("gpu_name") != self.gpu_name:
            raise CacheError(f"tuning cache {self.path} belongs to GPU {meta.get('gpu_name')!r}, "
                             f"not {self.gpu_name!r}; {self._fix_hint()}")
        file_cc = meta.get("compute_capability")
        file_cc = tuple(file_cc) if isinstance(file_cc, (list, tuple)) else file_cc
        want_cc = self.compute_capability if key is None else key.compute_capability
        if want_cc is not None and file_cc != tuple(want_cc):
            raise CacheError(f"tuning cache {self.path} was written for compute capability "
                             f"{file_cc!r}, but {self.gpu_name!r} here is {tuple(want_cc)!r}; "
                             f"{self._fix_hint()}")

    def _load(self) -> dict[str, Any] | None:
        stamp = self._stat()
        if self._data is None or stamp != self._stamp:
            self._data = self._read()
            self._stamp = stamp
        return self._data

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a+") as fh:
            if fcntl is not None:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                if fcntl is not None:
                    fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    def _write_atomic(self, data: dict[str, Any]) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.dir)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(data, fh, indent=1, sort_keys=True)
                fh.write("\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    # ---------------------------------------------------------------- public API

    def lookup(self, key: CacheKey) -> dict[str, Any] | None:
        """The entry stored under exactly this key, or None."""
        try:
            data = self._load()
        except CacheError as e:
            if self.on_error == "raise":
                raise
            if not self._warned:
                warnings.warn(f"kdagen: ignoring tuning cache: {e}", stacklevel=2)
                self._warned = True
            return None
        if data is None:
            return None
        entry = data["entries"].get(key.key_string())
        if not isinstance(entry, dict) or entry.get("key") != key.to_dict():
            return None
        return copy.deepcopy(entry)

    def store(self, key: CacheKey, entry: dict[str, Any]) -> dict[str, Any]:
        """Add/replace the entry of ``key``, merging with the file as it is now on disk."""
        if key.gpu_name != self.gpu_name:
            raise ValueError(f"key is for GPU {key.gpu_name!r}, this cache is {self.gpu_name!r}")
        if self.compute_capability is not None and key.compute_capability != self.compute_capability:
            raise ValueError(f"key compute capability {key.compute_capability} != cache's "
                             f"{self.compute_capability} for {self.gpu_name!r}")
        missing = [f for f in REQUIRED_ENTRY_FIELDS if f not in entry]
        if missing:
            raise ValueError(f"cache entry is missing fields {missing}")
        new = dict(entry)
        if hasattr(new["config"], "to_dict"):
            new["config"] = new["config"].to_dict()
        t = float(new["time_ms"])
        if not math.isfinite(t) or t <= 0:
            raise ValueError(f"cache entry time_ms must be a positive finite number, got {t!r}")
        new["time_ms"] = t
        new.setdefault("default_time_ms", None)
        new.setdefault("error", None)
        new.setdefault("measured_at", _now_iso())
        new["key"] = key.to_dict()
        json.dumps(new)  # fail here, not half-way through the write, if not serialisable

        with self._locked():
            data = self._read()  # fresh, under the lock
            if data is not None:
                self._validate(data, key)
            else:
                data = {"schema": SCHEMA_VERSION, "metadata": {
                    "gpu_name": self.gpu_name,
                    "compute_capability": list(key.compute_capability),
                    "sm_count": key.sm_count,
                }, "entries": {}}
            data["metadata"].update({
                "triton_version": key.triton_version, "torch_version": key.torch_version,
                "cuda_version": key.cuda_version, "kdagen_version": key.kdagen_version,
            })
            data["entries"][key.key_string()] = new
            self._write_atomic(data)
            self._data, self._stamp = data, self._stat()
        return copy.deepcopy(new)

    def entries(self) -> dict[str, dict[str, Any]]:
        """All entries (key string -> entry); empty when there is no file yet."""
        data = self._load()
        return copy.deepcopy(data["entries"]) if data else {}

    def metadata(self) -> dict[str, Any] | None:
        data = self._load()
        return copy.deepcopy(data["metadata"]) if data else None
