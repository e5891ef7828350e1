"""``kdagen bench``, the one bench harness: kdagen's ops -- and, to compare, flash-linear-attention's
(FLA) -- checked against the float64 reference and timed in one process, on the same inputs, at the
user's cases (member x pass x shape x dtype, :mod:`kdagen.tuning.bench_cases`); then a table, JSON,
CSV, (with matplotlib) a chart, and from the JSON ``docs/PERF.md`` and the README's table
(:mod:`kdagen.tuning.perf_doc`).

Each row is one library at one case (a member: kda, gdn, deltanet, gla, dplr):

- ``fwd``: the chunk op (``chunk_kda``, ``chunk_gated_delta_rule``, ...) with the final state (no autograd);
- ``fwdbwd``: the chunk op forward and backward, gradients of every input (the initial state
  included) from ``o`` and the final state;
- ``decode``: one step of the recurrent op (``fused_recurrent_kda``, ...) of B sequences, replayed
  from a CUDA graph as a decode loop runs it.

``error`` is the larger relative error of ``o`` and the final state against the member's float64
recurrence (:mod:`kdagen.spec.reference`) on the same inputs (the forward's;
``fwdbwd`` rows carry none: the gradients are checked by the tests and ``tests/gpu/sweep.py``).
``TB/s`` is the least traffic a pass must move (every input, output, cotangent and gradient
once; the backward reads the inputs again) over its median time, and ``% copy`` compares it
with a device-to-device copy measured in the same process.

With a ``launch_timer`` (``kdagen bench --per-launch``: :func:`profile_kernels`, the CUDA kernels of one
call under torch.profiler) each forward and forward+backward row also lists its kernels: time per call
and launches per call, and for kdagen's the bytes its launches' tensors hold (:func:`launch_bytes`) and
the time a copy of them would take at the measured copy bandwidth -- each launch's floor, which no
launch that must read its inputs and write its outputs can beat.

Everything takes its timer and device as arguments, so that the tests run it on the CPU with
a fake timer and a fake FLA.  FLA autotunes its kernels on first use (minutes: each candidate
compiles in turn); :func:`warm_fla` compiles its candidates in parallel processes first, and
every library is called once per shape and pass before it is timed."""
from __future__ import annotations

import csv
import datetime
import json
import os
import platform
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable

import torch

from . import bench_cases as BC

COPY_BYTES = 1 << 30  # the copy that measures the bandwidth ceiling (read once, written once)
LOWER = BC.LOWER  # KDA's gate bound (safe_gate=True): g is drawn in [-5, 0)
PASSES = BC.PASSES
GRAD_NAMES = BC.MEMBERS["kda"].grads
CSV_FIELDS = ("member", "shape", "B", "T", "H", "K", "V", "pass", "library", "ms", "bytes", "tbs", "pct_copy", "error",
              "err_o", "err_state", "timing", "failed")
FLA_MISSING = "flash-linear-attention is not importable here ({}); install it with `pip install flash-linear-attention`"
PLOT_MISSING = "--plot needs matplotlib, which is not installed: pip install 'kdagen[plot]' (or pip install matplotlib)"


class Unavailable(RuntimeError):
    """Something the benchmark needs is missing here (a GPU, FLA, matplotlib); the message says
    what and how to get it."""


@dataclass(frozen=True)
class Shape:
    """A benchmark shape: B sequences of T tokens, H heads, head dims K and V (decode: B
    sequences, one token each)."""

    B: int
    T: int
    H: int
    K: int
    V: int

    @property
    def label(self) -> str:
        return f"{self.B},{self.T},{self.H},{self.K}" + (f",{self.V}" if self.V != self.K else "")


@dataclass(frozen=True)
class Library:
    name: str
    version: str
    chunk: Callable  # chunk_kda, FLA's signature
    recurrent: Callable  # fused_recurrent_kda
    module: str | None = None  # where a member's ops are: None for kdagen, "fla" for FLA (its member modules)

    def ops(self, member: str) -> tuple[Callable, Callable]:
        """(chunk op, recurrent op) of ``member``; raises when this library has none."""
        if member == "kda":
            return self.chunk, self.recurrent
        m = BC.member(member)
        if self.module is None:
            import kdagen as mod
        else:
            import importlib

            mod = importlib.import_module(m.fla_module)
        return getattr(mod, m.ops[0]), getattr(mod, m.ops[1])


def kdagen_library() -> Library:
    import kdagen

    return Library("kdagen", kdagen.__version__, kdagen.chunk_kda, kdagen.fused_recurrent_kda)


def fla_library() -> Library:
    """FLA's ops (KDA's imported here, the other members' on first use), with FLA's backend
    dispatch off (``FLA_DISABLE_BACKEND_DISPATCH=1``, unless set otherwise): FLA's own Triton
    kernels are measured.  :class:`Unavailable` when FLA cannot be imported."""
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
    try:
        import fla
        from fla.ops.kda import chunk_kda, fused_recurrent_kda
    except Exception as e:  # noqa: BLE001 - FLA missing, or importing it failed
        raise Unavailable(FLA_MISSING.format(f"{type(e).__name__}: {e}")) from None
    return Library("fla", str(getattr(fla, "__version__", "?")), chunk_kda, fused_recurrent_kda, module="fla")


def check_plot_available() -> None:
    """:class:`Unavailable` unless matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise Unavailable(PLOT_MISSING) from None


def cuda_device() -> str:
    """The device the benchmark measures on: 'cuda'; :class:`Unavailable` without a CUDA GPU."""
    if not torch.cuda.is_available():
        raise Unavailable("kdagen bench measures on a CUDA GPU and none is visible here (`kdagen bench --from "
                          "FILE.json` prints and plots an earlier run without one)")
    return "cuda"


def median_timer(fn: Callable[[], Any]) -> float:
    """Milliseconds per call of ``fn``: the median of Triton's ``do_bench``."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=50, rep=200, return_mode="median")


def graph_median_timer(fn: Callable[[], Any]) -> float:
    """Milliseconds per call of ``fn`` captured in a CUDA graph and replayed, as a decode loop
    runs it (the tuner times decode alike): the median of Triton's ``do_bench_cudagraph``."""
    from triton.testing import do_bench_cudagraph

    return float(do_bench_cudagraph(fn, rep=100, return_mode="median"))


def _sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double().to(a.device)
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def inputs(shape: Shape, dtype: torch.dtype, device: str, seed: int, decode: bool = False,
           member: str = "kda") -> dict:
    """The inputs of every library for ``member`` at ``shape`` (``decode``: one token per sequence)."""
    s = shape
    return BC.inputs(member, (s.B, s.T, s.H, s.K, s.V), dtype, device, seed, decode=decode)


def reference(x: dict, member: str = "kda") -> tuple[torch.Tensor, torch.Tensor]:
    """(o, final state) of the member's float64 recurrence on ``x``, on x's device."""
    return BC.reference(member, x)


def pass_fn(lib: Library, pass_: str, x: dict, member: str = "kda") -> tuple[Callable[[], Any], Callable[[], tuple], int]:
    """``(fn, outputs, bytes)`` of one library at one pass on inputs ``x``: ``fn`` runs it once;
    ``outputs()`` runs the forward once more and returns (o, final state) to check (None for
    ``fwdbwd``); ``bytes``: the least traffic ``fn`` must move."""
    nbytes = sum(t.numel() * t.element_size() for t in x.values())
    out_bytes = x["v"].numel() * x["v"].element_size() + x["initial_state"].numel() * 4
    if pass_ not in PASSES:
        raise ValueError(f"unknown pass {pass_!r}; known: {', '.join(PASSES)}")
    chunk, recurrent = lib.ops(member)
    if pass_ == "fwd":
        def fwd():
            with torch.no_grad():
                return BC.call(member, chunk, x, chunk=True)

        return fwd, fwd, nbytes + out_bytes
    if pass_ == "decode":
        def step():
            with torch.no_grad():
                return BC.call(member, recurrent, x, chunk=False)

        return step, step, nbytes + out_bytes
    grads = BC.member(member).grads
    leaves = {n: t.detach().requires_grad_(n in grads) for n, t in x.items()}
    gen = torch.Generator(device=x["v"].device).manual_seed(7)
    do = torch.randn(x["v"].shape, generator=gen, device=x["v"].device).to(x["v"].dtype)
    dht = torch.randn(x["initial_state"].shape, generator=gen, device=x["v"].device)

    def fwd_bwd():
        o, s = BC.call(member, chunk, leaves, chunk=True)
        return torch.autograd.grad((o, s), [leaves[n] for n in grads], (do, dht))

    # forward, then the backward re-reading the inputs, the cotangents and writing the gradients
    return fwd_bwd, None, 2 * nbytes + out_bytes + out_bytes + nbytes


def copy_gbs(timer: Callable, device: str, n_bytes: int = 1 << 30) -> float:
    """GB/s of a device-to-device copy of ``n_bytes`` (read and written)."""
    a = torch.empty(n_bytes // 4, dtype=torch.float32, device=device).uniform_()
    b = torch.empty_like(a)
    ms = timer(lambda: b.copy_(a))
    return 2 * n_bytes / (ms * 1e-3) / 1e9


def measure(lib: Library, pass_: str, shape: Shape, x: dict, ref, timer: Callable, copy: float,
            device: str, graph_timer: Callable | None = None, member: str = "kda",
            launch_timer: Callable | None = None) -> dict:
    """One row: check ``lib`` at ``pass_`` against ``ref`` and time it (decode with
    ``graph_timer`` when given and the call can be captured, else eagerly with ``timer``); with
    ``launch_timer``, a forward's or forward+backward's kernels too (:func:`launches`).  A
    library that fails gets a row that says why, and the benchmark goes on."""
    row: dict[str, Any] = dict(member=member, shape=shape.label, **asdict(shape), library=lib.name, timing="eager", error=None,
                               err_o=None, err_state=None, ms=None, bytes=None, tbs=None, pct_copy=None, failed=None)
    row["pass"] = pass_
    try:
        fn, outputs, nbytes = pass_fn(lib, pass_, x, member)
        fn()  # first use: FLA autotunes here, not inside the timing
        _sync(device)
        if outputs is not None:
            o, s = outputs()
            _sync(device)
            row["err_o"], row["err_state"] = rel(o, ref[0]), rel(s, ref[1])
            row["error"] = max(row["err_o"], row["err_state"])
        ms = None
        if pass_ == "decode" and graph_timer is not None:
            try:
                ms, row["timing"] = graph_timer(fn), "graph"
            except Exception:  # noqa: BLE001 - a call that cannot be captured is timed eagerly
                _sync_quietly(device)
        if ms is None:
            ms = timer(fn)
        gbs = nbytes / (ms * 1e-3) / 1e9
        row.update(ms=ms, bytes=nbytes, tbs=gbs / 1e3, pct_copy=100 * gbs / copy)
        if launch_timer is not None and pass_ != "decode":
            row["launches"] = launches(fn, launch_timer, copy, kdagen=lib.module is None)
    except Exception as e:  # noqa: BLE001 - one library's failure is reported in its row
        _sync_quietly(device)
        row["failed"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return row


def launch_bytes(fn: Callable[[], Any]) -> dict[str, int]:
    """Run ``fn`` once, recording every kdagen launch (:func:`kdagen.kernels.launch`): the bytes the
    tensors of each kernel's arguments hold, summed over its launches of the call, by kernel name.
    A tensor counts once per launch (every argument is read or written at least once).  A repair launch
    (constexpr ``REPAIR``, docs/decisions/0013-gate-bound-checked-by-repair-launches.md) re-runs only the
    chunks its ``bad`` flags name: it counts its flags and that share of its other tensors (none on gates
    within the bound), not a whole launch's."""
    import kdagen.kernels as KK

    seen: dict[str, int] = {}
    inner = KK.launch

    def recording(fn_, grid, args, constexprs, num_warps, num_stages):
        tensors = {t.data_ptr(): t for t in args.values() if isinstance(t, torch.Tensor)}
        held = sum(t.numel() * t.element_size() for t in tensors.values())
        if constexprs.get("REPAIR") and isinstance(args.get("bad"), torch.Tensor):
            flags = args["bad"]
            share = int(torch.count_nonzero(flags)) / max(flags.numel(), 1)  # (a sync: the forward wrote them)
            flag_bytes = flags.numel() * flags.element_size()
            held = flag_bytes + round(share * (held - flag_bytes))
        name = getattr(fn_, "__name__", str(fn_))
        seen[name] = seen.get(name, 0) + held
        return inner(fn_, grid, args, constexprs, num_warps, num_stages)

    KK.launch = recording
    try:
        fn()
    finally:
        KK.launch = inner
    return seen


def profile_kernels(fn: Callable[[], Any], reps: int = 10) -> dict[str, tuple[float, float]]:
    """``{kernel name: (ms per call, launches per call)}`` of ``fn``'s CUDA kernels over ``reps``
    calls under torch.profiler (after one untimed call)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    events = [(e.name, e.device_time_total) for e in prof.events()
              if e.device_type == torch.autograd.DeviceType.CUDA]
    return kernel_table(events, reps)


def kernel_table(events: Iterable[tuple[str, float]], reps: int) -> dict[str, tuple[float, float]]:
    """``{name: (ms per call, launches per call)}`` from (kernel name, device microseconds) events of
    ``reps`` calls, the slowest first."""
    total: dict[str, list] = {}
    for name, us in events:
        t = total.setdefault(name, [0.0, 0])
        t[0] += us
        t[1] += 1
    rows = {n: (us / reps / 1e3, count / reps) for n, (us, count) in total.items()}
    return dict(sorted(rows.items(), key=lambda kv: -kv[1][0]))


def launches(fn: Callable[[], Any], launch_timer: Callable, copy_gbs: float, kdagen: bool) -> list[dict]:
    """A row's kernels: name, ms and launches per call (``launch_timer(fn)``); for kdagen's, the bytes
    their tensors hold and ``floor_ms``, the time a copy moves them in (``copy_gbs``: read + written)."""
    nbytes = launch_bytes(fn) if kdagen else {}
    out = []
    for name, (ms, count) in launch_timer(fn).items():
        b = nbytes.get(name)
        out.append(dict(name=name, ms=ms, count=count, bytes=b,
                        floor_ms=None if b is None else b / (copy_gbs * 1e9) * 1e3))
    return out


def _sync_quietly(device: str) -> None:
    try:
        _sync(device)
    except Exception:  # noqa: BLE001
        pass


def environment(libraries: Iterable[Library], device: str) -> dict:
    import triton

    gpu = torch.cuda.get_device_name() if str(device).startswith("cuda") else platform.processor() or "cpu"
    env = dict(date=datetime.datetime.now().isoformat(timespec="seconds"), device=gpu, torch=torch.__version__,
               triton=triton.__version__, cuda=torch.version.cuda, python=platform.python_version())
    env.update({lib.name: lib.version for lib in libraries})
    if any(lib.module == "fla" for lib in libraries):
        env["fla_backend_dispatch"] = "off" if os.environ.get("FLA_DISABLE_BACKEND_DISPATCH") == "1" else "on"
    return env


def run(shapes: list[Shape], libraries: list[Library], passes: Iterable[str], *, device: str, dtype=torch.bfloat16,
        timer: Callable = median_timer, graph_timer: Callable | None = None, seed: int = 0,
        echo: Callable[[str], None] = print, copy_bytes: int = 1 << 30,
        on_row: Callable[[dict], None] | None = None, members: Iterable[str] = ("kda",),
        cases: list | None = None, launch_timer: Callable | None = None) -> dict:
    """Check and time every library at every case -- ``cases`` (:class:`kdagen.tuning.bench_cases.Case`),
    or every member at every shape and pass -- (decode from a CUDA graph with ``graph_timer``, see
    :func:`measure`); returns ``{"env", "dtype", "copy_gbs", "rows"}`` (what :func:`write_json`
    writes).  ``on_row(result so far)`` after each row (the command line writes it: a run cut short
    keeps what it measured).  ``launch_timer``: see :func:`measure`."""
    if cases is None:
        cases = BC.cases(members, [(s.B, s.T, s.H, s.K, s.V) for s in shapes], passes)
    groups: dict[tuple, list[str]] = {}  # cases on the same inputs share them (and their reference)
    for c in cases:
        BC.member(c.member)
        groups.setdefault((c.member, tuple(c.shape), c.pass_ == "decode"), []).append(c.pass_)
    copy = copy_gbs(timer, device, copy_bytes)
    echo(f"device copy: {copy / 1e3:.2f} TB/s (read + write, median)")
    rows = []
    result = {"env": environment(libraries, device), "dtype": str(dtype).replace("torch.", ""), "copy_gbs": copy,
              "rows": rows}
    for (member, shape, decode), todo in groups.items():
        shape = Shape(*shape)
        x = inputs(shape, dtype, device, seed, decode=decode, member=member)
        ref = reference(x, member)
        for pass_ in todo:
            for lib in libraries:
                row = measure(lib, pass_, shape, x, ref, timer, copy, device, graph_timer, member=member,
                              launch_timer=launch_timer)
                rows.append(row)
                if on_row is not None:
                    on_row(result)
                echo(f"  {member:<8} {pass_:<6} {shape.label:<18} {lib.name:<7} " + (
                    f"failed: {row['failed']}" if row["failed"] else
                    f"{_ms(row['ms'])}  error {'-' if row['error'] is None else format(row['error'], '.1e')}"))
        del x, ref
        if str(device).startswith("cuda"):
            torch.cuda.empty_cache()
    return result


def _ms(ms: float) -> str:
    return f"{ms * 1e3:.1f} us" if ms < 0.1 else f"{ms:.3f} ms"


def table_lines(result: dict) -> list[str]:
    """The comparison table: one line per member, shape and pass, each library's time, TB/s (and the
    share of the copy ceiling) and error, and kdagen's speed-up over the others."""
    from .report import table

    rows = result["rows"]
    libs = list(dict.fromkeys(r["library"] for r in rows))
    others = [lib for lib in libs if lib != "kdagen"]
    groups: dict[tuple, dict] = {}
    for r in rows:
        groups.setdefault((r.get("member", "kda"), r["shape"], r["pass"]), {})[r["library"]] = r
    headers = ["member", "shape B,T,H,K[,V]", "pass"]
    for lib in libs:
        headers += [f"{lib} time", f"{lib} TB/s (copy %)", f"{lib} error"]
    headers += [f"{o}/kdagen" for o in others if "kdagen" in libs]
    out = []
    for (member, shape, pass_), by_lib in groups.items():
        line = [member, shape, pass_]
        for lib in libs:
            r = by_lib.get(lib)
            if r is None or r["failed"]:
                line += ["failed" if r else "-", "-", "-"]
                continue
            line += [_ms(r["ms"]), f"{r['tbs']:.2f} ({r['pct_copy']:.0f}%)",
                     "-" if r["error"] is None else f"{r['error']:.1e}"]
        for o in others:
            if "kdagen" not in libs:
                continue
            a, b = by_lib.get("kdagen"), by_lib.get(o)
            ok = a and b and not a["failed"] and not b["failed"]
            line.append(f"x{b['ms'] / a['ms']:.2f}" if ok else "-")
        out.append(line)
    lines = [f"{result['env'].get('device', '?')}, {result.get('dtype', '?')} inputs, KDA's gate >= {LOWER:g}; device copy "
             f"{result['copy_gbs'] / 1e3:.2f} TB/s; times are medians"
             + (f"; {', '.join(others)}/kdagen > 1: kdagen is faster" if others and "kdagen" in libs else "")]
    lines += table(headers, out, align="lll" + "rrr" * len(libs) + "r" * len(others))
    failed = [r for r in rows if r["failed"]]
    for r in failed:
        member = r.get("member", "kda")
        lines.append(f"  {r['library']} {'' if member == 'kda' else member + ' '}{r['pass']} {r['shape']} failed: "
                     f"{r['failed']}")
    return lines


def write_json(result: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


def read_json(path: str) -> dict:
    with open(path) as f:
        result = json.load(f)
    if not isinstance(result, dict) or not isinstance(result.get("rows"), list):
        raise ValueError(f"{path} is not a kdagen bench result (no 'rows' list)")
    return result


# what runs whose rows one page shows together must share (the date and the copy's speed may differ)
MERGE_KEYS = ("device", "torch", "triton", "cuda", "kdagen", "fla", "fla_backend_dispatch")


def merge_results(results: list[dict], names: list[str]) -> dict:
    """One result from several runs' (a suite measured in several sittings, e.g. under a time limit
    per command): the runs must share the GPU, the versions and the dtype, and each case (member,
    pass, shape) must come from one run only, so that every FLA/kdagen ratio stays a same-process
    ratio.  The merged result keeps the earliest date and the first run's copy speed (each row's
    share of the copy was computed against its own run's).  ValueError names what disagrees."""
    if len(results) == 1:
        return results[0]
    first, env0 = results[0], results[0].get("env", {})
    seen: dict[tuple, str] = {}
    rows = []
    for res, name in zip(results, names):
        env = res.get("env", {})
        for k in MERGE_KEYS:
            if env.get(k) != env0.get(k):
                raise ValueError(f"{name} was measured with {k} {env.get(k)!r}, {names[0]} with {env0.get(k)!r}: "
                                 f"one page shows one GPU and one set of versions")
        if res.get("dtype") != first.get("dtype"):
            raise ValueError(f"{name} measured {res.get('dtype')}, {names[0]} {first.get('dtype')}")
        cases = {(r.get("member", "kda"), r["pass"], r["shape"]) for r in res["rows"]}
        for c in sorted(cases):
            if c in seen:
                raise ValueError(f"{' '.join(c)} is in both {seen[c]} and {name}: each case must come from one run "
                                 f"(its libraries measured in one process)")
            seen[c] = name
        rows += res["rows"]
    dates = sorted(r.get("env", {}).get("date", "") for r in results)
    return {**first, "env": {**env0, "date": dates[0]}, "rows": rows, "runs": list(names)}


def write_csv(result: dict, path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in result["rows"]:
            w.writerow(r)


def plot(result: dict, path: str) -> None:
    """A chart of the time per shape for each library, one panel per pass, to ``path``."""
    check_plot_available()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if not r["failed"]]
    passes = list(dict.fromkeys(r["pass"] for r in rows))
    libs = list(dict.fromkeys(r["library"] for r in rows))
    titles = {"fwd": "forward", "fwdbwd": "forward + backward", "decode": "decode step"}
    fig, axes = plt.subplots(1, max(1, len(passes)), figsize=(5.5 * max(1, len(passes)), 4.2), squeeze=False)
    for ax, pass_ in zip(axes[0], passes):
        shapes = list(dict.fromkeys(_case_label(r) for r in rows if r["pass"] == pass_))
        width = 0.8 / max(1, len(libs))
        for i, lib in enumerate(libs):
            ms = {_case_label(r): r["ms"] for r in rows if r["pass"] == pass_ and r["library"] == lib}
            xs = [j + (i - (len(libs) - 1) / 2) * width for j in range(len(shapes))]
            ys = [ms.get(s, 0.0) for s in shapes]
            bars = ax.bar(xs, ys, width, label=lib)
            ax.bar_label(bars, labels=[_ms(y) if y else "" for y in ys], fontsize=7, padding=2)
        ax.set_xticks(range(len(shapes)), shapes, fontsize=8, rotation=20 if len(shapes) > 3 else 0)
        ax.set_xlabel("[member] (B, T, H, K[, V])")
        ax.set_ylabel("median time (ms)")
        ax.set_title(titles.get(pass_, pass_))
        ax.legend()
    env = result.get("env", {})
    members = list(dict.fromkeys(r.get("member", "kda") for r in rows))
    fig.suptitle(f"{', '.join(m.upper() if m == 'kda' else m for m in members)} on {env.get('device', '?')}, {result.get('dtype', '')}: " + ", ".join(
        f"{lib} {env.get(lib, '')}".strip() for lib in libs), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def _case_label(r: dict) -> str:
    member = r.get("member", "kda")
    return ("" if member == "kda" else member + " ") + f"({r['shape']})"


# --- FLA's autotuning, compiled ahead in parallel -------------------------------------------

class _ConfigShare:
    """Within the block, Triton's autotuners keep only candidates ``index``, ``index + count``,
    ... (at least one): ``count`` processes running the same calls then compile every candidate
    once between them, into Triton's shared on-disk cache."""

    def __init__(self, index: int, count: int):
        self.index, self.count = index, count

    def __enter__(self):
        from triton.runtime import autotuner

        self._cls, self._original = autotuner.Autotuner, autotuner.Autotuner.prune_configs
        original, index, count = self._original, self.index, self.count

        def my_share(tuner, kwargs):
            configs = original(tuner, kwargs)
            return configs[index::count] or configs[:1]

        self._cls.prune_configs = my_share
        return self

    def __exit__(self, *exc):
        self._cls.prune_configs = self._original


def fla_share_worker(index: int, count: int, cases: list, dtype_name: str, device: str = "cuda") -> str:
    """One warm-up process: FLA at every case (:class:`kdagen.tuning.bench_cases.Case`), autotuning
    over its share of the candidates (the timings are thrown away; only the compiles are kept, in
    Triton's cache)."""
    from ..dtypes import dtype as as_dtype

    done, errors = 0, []
    with _ConfigShare(index, count):
        lib = fla_library()
        for c in cases:
            shape = Shape(*c.shape)
            try:
                fn, _, _ = pass_fn(lib, c.pass_, inputs(shape, as_dtype(dtype_name).torch, device, 0,
                                                        decode=c.pass_ == "decode", member=c.member), c.member)
                fn()
                _sync(device)
                done += 1
            except Exception as e:  # noqa: BLE001 - e.g. a share with only configs too large to run
                errors.append(f"{c.member} {c.pass_} {shape.label}: {type(e).__name__}")
    return f"worker {index}: {done} calls" + (f", {len(errors)} failed ({errors[0]})" if errors else "")


def warm_fla(cases: list, dtype, jobs: int, echo: Callable[[str], None] = print) -> float:
    """Compile FLA's autotuning candidates at these cases (the ones the run will time, no others) in
    ``jobs`` spawned processes (each a share, :func:`fla_share_worker`), so that the measuring
    process's own autotuning finds them compiled and only benchmarks them.  Returns the seconds it took."""
    import multiprocessing
    import time
    from concurrent.futures import ProcessPoolExecutor

    from ..dtypes import dtype as as_dtype

    if jobs <= 1:
        return 0.0
    t0 = time.time()
    echo(f"compiling FLA's autotuning candidates for {len(cases)} cases in {jobs} processes ...")
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as ex:
        futs = [ex.submit(fla_share_worker, i, jobs, list(cases), as_dtype(dtype).short, "cuda")
                for i in range(jobs)]
        failed = 0
        for f in futs:
            try:
                f.result()
            except Exception:  # noqa: BLE001 - a lost worker: the measuring process compiles its share itself
                failed += 1
    echo(f"  done in {time.time() - t0:.0f}s" + (f" ({failed} of {jobs} processes failed)" if failed else ""))
    return time.time() - t0


def default_warm_jobs() -> int:
    return max(1, min(14, os.cpu_count() or 1))
