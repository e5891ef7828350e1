"""Shared test setup for the kernel tests.

Triton reads ``TRITON_INTERPRET`` when it is imported, so it is set here, at import time of
the conftest, before any test module (or kdagen) imports triton: every generated kernel then
runs in Triton's CPU interpreter.  Generated sources are written under ``$KDAGEN_CACHE_DIR``;
a fresh temporary directory per session keeps runs independent of the user's cache (and of
any tuned winners stored there).
"""
from __future__ import annotations

import os
import shutil
import tempfile

os.environ["TRITON_INTERPRET"] = "1"
_SESSION_CACHE = tempfile.mkdtemp(prefix="kdagen-test-cache-")
os.environ["KDAGEN_CACHE_DIR"] = _SESSION_CACHE

import pytest  # noqa: E402
import torch  # noqa: E402

F64 = torch.float64
NAN = float("nan")

# tolerances of the kernels against the float64 reference (relative Frobenius error)
TOL = {torch.float32: 1e-5, torch.float16: 2e-3}


# Under pytest-xdist (the README's `-n auto`) each worker is a process of its own: torch's
# intra-op threads are shared out among them rather than each taking every core.  The processes a
# test starts (the compile workers, the emulation scripts, the CLI, the spawned ranks) inherit the
# same share through OMP_NUM_THREADS (torch's and OpenBLAS's default): with every core taken by a
# worker, a child's extra threads only wait on each other (a bf16 emulation script took 1.6x the CPU
# time for the same work).
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _THREADS = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    torch.set_num_threads(_THREADS)
    os.environ.setdefault("OMP_NUM_THREADS", str(_THREADS))


def _boolean_masks_only():
    """Triton >= 3.9's interpreter refuses a load or store whose mask is not boolean (ValueError: mask has
    unsupported dtype); 3.6's casts it.  The same check on every version makes the suite catch such a mask
    on the Triton it runs on, the pinned one included."""
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    for name, at in (("create_masked_load", 1), ("create_masked_store", 2)):  # the mask's position
        plain = getattr(builder, name)

        def checked(self, *args, _plain=plain, _at=at):
            mask = args[_at].data
            if mask.dtype != np.bool_:
                raise ValueError(f"mask has unsupported dtype {mask.dtype}: a load or store mask must be boolean "
                                 "(Triton >= 3.9's interpreter refuses any other)")
            return _plain(self, *args)

        setattr(builder, name, checked)


_boolean_masks_only()


# the interpreter's per-call overheads taken out (tests/interpreter_speed.py)
from interpreter_speed import install as _faster_interpreter  # noqa: E402

_faster_interpreter()


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


# ------------------------------------------------------------------------------------ errors


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64 (Frobenius norm over every element).

    NaN/inf anywhere in ``a`` gives NaN/inf, so ``rel_err(...) <= tol`` fails for it; a zero
    reference is refused, since the comparison would be vacuous."""
    assert tuple(a.shape) == tuple(b.shape), f"shape {tuple(a.shape)} != reference {tuple(b.shape)}"
    a64 = a.detach().to("cpu", F64)
    b64 = b.detach().to("cpu", F64)
    nrm = b64.norm().item()
    assert nrm > 0, "the reference is identically zero: a relative error would say nothing"
    return (a64 - b64).norm().item() / nrm


def assert_close(out: torch.Tensor, ref: torch.Tensor, tol: float, what: str = "output"):
    """Every element checked: finite, the relative Frobenius error within ``tol`` and no single
    element off by more than ``20 * tol`` of the reference's largest magnitude (a stray
    unwritten row would hide in the norm of a large tensor, not in this bound)."""
    assert tuple(out.shape) == tuple(ref.shape), f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    bad = ~torch.isfinite(out)
    assert not bad.any(), f"{what}: {int(bad.sum())} non-finite elements (first at {bad.nonzero()[0].tolist()})"
    err = rel_err(out, ref)
    assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.1e}"
    o64, r64 = out.detach().to(F64), ref.detach().to(F64)
    worst = (o64 - r64).abs().max().item()
    scale = r64.abs().max().item()
    assert worst <= 20 * tol * scale, (
        f"{what}: element-wise error {worst:.3e} > {20 * tol:.1e} x max|ref| = {scale:.3e} "
        f"(at {(o64 - r64).abs().argmax().item()} of the flattened tensor)")


# ------------------------------------------------------------------------------------ poison


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill a floating tensor with NaN in place (and return it): whatever a kernel leaves
    unwritten stays NaN and fails the finiteness checks above."""
    assert t.is_floating_point()
    return t.fill_(NAN)


def nan_tensor(*shape, dtype=torch.float32) -> torch.Tensor:
    return torch.full(shape, NAN, dtype=dtype)


def run_poisoned(launches, outputs):
    """Run ``chunk_kda_launches``' launches after filling every buffer the kernels write --
    the outputs and the intermediates between the two launches -- with NaN.  An element a
    kernel forgets to write (or a masked-off element it reads) then shows up as NaN."""
    first = launches[0]
    # the intermediates of the training forward (intra -> state) and of the inference forward
    # (solve -> pass); the inference pass must not read P's unwritten upper-right block either
    for name in ("qg", "kg", "w", "u", "aqk", "gn", "bk", "kgl", "pm"):
        if name in first.args and first.args[name].numel() > 1:
            poison(first.args[name])
    for t in outputs:
        if t is not None:
            poison(t)
    for launch in launches:
        launch()
    return outputs


# ------------------------------------------------------------------------------------ inputs


def kda_training_launches(dtype, K, V, config, bwd_config, T=45, cu=None, HV=2):
    """chunk_kda's training launches ``(fwd, bwd, bwd outputs)`` on seeded inputs (one q/k head, ``HV``
    value heads, g >= -5 promised) with random dO and dht: for tests that compare configs launch by launch."""
    from cases import make_inputs
    from kdagen.ops.chunk import chunk_kda_bwd_launches

    x = make_inputs(1, T, 1, HV, K, V, dtype=dtype, seed=3, cu_seqlens=cu)
    gen = torch.Generator().manual_seed(9)
    do = torch.randn(x.v.shape, generator=gen).to(dtype)
    dht = torch.randn(x.h0.shape[0], HV, K, V, generator=gen)
    return chunk_kda_bwd_launches(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, output_final_state=True,
                                  cu_seqlens=x.cu_seqlens, safe_gate=True, lower_bound=-5.0, config=config,
                                  bwd_config=bwd_config, do=do, dht=dht)


@pytest.fixture
def inputs_factory():
    from cases import make_inputs

    return make_inputs


@pytest.fixture
def no_launch(monkeypatch):
    """Make any kernel launch fail the test: validation must happen before launching.

    Both ways a kernel is started are blocked: ``Launch.__call__`` and the module-level
    ``launch`` function (which a fast path may call directly)."""
    import kdagen.kernels as kernels_mod
    from kdagen.ops import chunk as chunk_mod
    from kdagen.ops import recurrent as recurrent_mod

    calls = []

    def _refuse_fn(fn, *args, **kwargs):
        calls.append(fn)
        raise AssertionError(f"a kernel was launched ({getattr(fn, '__name__', fn)}) "
                             "before the invalid input was rejected")

    def _refuse(self):
        _refuse_fn(self.fn)

    monkeypatch.setattr(kernels_mod.Launch, "__call__", _refuse)
    monkeypatch.setattr(kernels_mod, "launch", _refuse_fn)
    for mod in (chunk_mod, recurrent_mod):
        if hasattr(mod, "launch"):
            monkeypatch.setattr(mod, "launch", _refuse_fn)
    return calls


def params(cases, ids, slow):
    """``pytest.param`` per case; the cases named in ``slow`` (the interpreter runs them for well
    over half a second) are marked ``slow``, so ``pytest -m "not slow"`` keeps a quick subset of
    each family of cases and the full suite runs them all."""
    unknown = set(slow) - set(ids)
    assert not unknown, f"no such cases: {sorted(unknown)}"
    return [pytest.param(c, id=i, marks=pytest.mark.slow if i in slow else ()) for c, i in zip(cases, ids)]


def cdiv(a, b):
    return -(-a // b)



@pytest.fixture
def h200(tmp_path, monkeypatch):
    """The tuning cache's look-up on an H200 profile, with a cache directory of the test's own."""
    import kdagen.cache.lookup as lookup
    from kdagen.cache.gpus import get_profile

    monkeypatch.setenv("KDAGEN_CACHE_DIR", str(tmp_path))
    prof = get_profile("h200")
    monkeypatch.setattr(lookup, "_current_gpu", lambda: prof)
    lookup._cache_for.cache_clear()
    lookup._MEMO.clear()
    yield prof
    lookup._cache_for.cache_clear()
    lookup._MEMO.clear()


# ------------------------------------------------------------------------------------ xdist


# `--dist loadscope` hands out a module at a time, by default those with the most tests first: a module of a
# few long tests (a compile worker's fixture, an emulation script, spawned processes) then comes near the end,
# and one worker runs it alone while the others have finished.  These modules go first, the longest first
# (roughly their seconds on one worker of two CPUs; only the order counts); every other module follows in
# xdist's order.  A module missing here only starts later.
LONG_SCOPES = {
    "test_family_compile_sm90.py": 250, "test_compile_sm90.py": 210, "test_bf16_emulated.py": 180,
    "test_dplr_compile_sm90.py": 155, "test_gla_wide_heads.py": 150, "test_ops_chunk_bwd.py": 120,
    "test_cp.py": 100, "test_dplr_bwd_compile_sm90.py": 95, "test_cli.py": 95, "test_smem_fit_sm90.py": 85,
    "test_chunk16_compile_sm90.py": 75, "test_examples.py": 70, "test_isolation.py": 70,
    "test_gla_wide_heads_compile_sm90.py": 60, "test_tune_family.py": 60, "test_kept_binaries.py": 55,
    "test_export.py": 55, "test_tune.py": 55, "test_autotune.py": 50, "test_serving.py": 45,
    "test_pipelined_loads_sm90.py": 35, "test_family_bf16.py": 30, "test_dplr_bwd_bf16.py": 20,
    "test_decode_slot_grid.py": 20, "test_dplr_decode.py": 20, "test_library.py": 20,
}


@pytest.hookimpl(optionalhook=True)  # (a hook of pytest-xdist's: none without it)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from collections import OrderedDict

    from xdist.scheduler import LoadScopeScheduling

    class LongScopesFirst(LoadScopeScheduling):
        def _assign_work_unit(self, node):
            if not getattr(self, "_long_first", False):  # the first assignment: the queue is complete
                self._long_first = True
                order = sorted(self.workqueue, key=lambda scope: -LONG_SCOPES.get(scope.rsplit("/", 1)[-1], 0))
                self.workqueue = OrderedDict((scope, self.workqueue[scope]) for scope in order)
            super()._assign_work_unit(node)

    return LongScopesFirst(config, log)
