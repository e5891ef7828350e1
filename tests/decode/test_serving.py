"""fused_recurrent_kda as a serving engine calls it: nothing on its Python path reads a value
from the device (so it never waits for the GPU and the packed form can be captured in a CUDA
graph), repeated calls of one geometry do no validation work and allocate nothing with
``out=`` and a pool, and the packed form computes what the batch form does.

The device itself is proven by ``tests/gpu/serving.py`` on a GPU (sync-debug mode "error" around
the calls, graph capture and replay of the packed form)."""
from __future__ import annotations

import pytest
import torch

from cases import make_inputs
from conftest import TOL, assert_close, nan_tensor

import kdagen
import kdagen.kernels as kernels_mod
import kdagen.ops.recurrent as R
from kdagen.spec.reference import naive_recurrent_kda

META = torch.device("meta")
B, H, HV, K, V, P = 3, 1, 2, 16, 32, 5
SLOTS = [4, -1, 1]


def _meta_call_args(packed: bool, dtype=torch.bfloat16):
    """One decode step on the meta device: shapes, dtypes and devices, and no values at all."""
    t = lambda *s, dt=dtype: torch.empty(*s, device=META, dtype=dt)  # noqa: E731
    lead = (1, B) if packed else (B, 1)
    x = dict(q=t(*lead, H, K), k=t(*lead, H, K), v=t(*lead, HV, V), g=t(*lead, HV, K, dt=torch.float32),
             beta=t(*lead, HV), initial_state=t(P, HV, K, V, dt=torch.float32),
             ssm_state_indices=t(B, dt=torch.int32), out=t(*lead, HV, V))
    if packed:
        x["cu_seqlens"] = t(B + 1, dt=torch.int64)
    return x


@pytest.fixture
def host_reads_refused(monkeypatch):
    """Every way Python reads a tensor's values (or builds a device tensor from host values)
    fails the test; kernel launches are recorded instead of run."""
    def refuse(what):
        def f(*a, **k):
            raise AssertionError(f"{what} on the op's path: it reads device values (a host synchronisation)")
        return f

    for name in ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "__iter__"):
        monkeypatch.setattr(torch.Tensor, name, refuse(f"Tensor.{name}"))
    for name in ("tensor", "as_tensor", "from_numpy"):
        monkeypatch.setattr(torch, name, refuse(f"torch.{name}"))
    real_to = torch.Tensor.to

    def to(self, *a, **k):
        dev = k.get("device", a[0] if a and isinstance(a[0], (str, torch.device)) else None)
        if dev is not None and torch.device(dev) != self.device:
            raise AssertionError(f"Tensor.to({dev}) from {self.device} on the op's path (a host copy)")
        return real_to(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "to", to)
    launched = []
    monkeypatch.setattr(kernels_mod.Launch, "__call__", lambda self: launched.append(self.fn))
    monkeypatch.setattr(R, "launch", lambda fn, *a: launched.append(fn))
    return launched


@pytest.mark.parametrize("packed", [False, True], ids=["batch", "packed"])
@pytest.mark.parametrize("flags", [{}, dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True)],
                         ids=["plain", "l2norm-sigmoid"])
def test_decode_reads_no_device_value(packed, flags, host_reads_refused):
    """The first call (validation, planning, the kernel's build) and the fast path's later
    calls: neither reads a value, copies to the host or builds a tensor from host values."""
    R._FAST.clear()
    x = _meta_call_args(packed)
    for _ in range(3):
        o, pool = kdagen.fused_recurrent_kda(**x, **flags)
        assert o is x["out"] and pool is x["initial_state"]
    assert len(host_reads_refused) == 3 and len(R._FAST) == 1


def test_decode_reads_no_device_value_with_the_in_kernel_gate(host_reads_refused):
    R._FAST.clear()
    x = _meta_call_args(True)
    x.update(A_log=torch.empty(HV, device=META), dt_bias=torch.empty(HV * K, device=META))
    for _ in range(2):
        kdagen.fused_recurrent_kda(**x, use_gate_in_kernel=True, lower_bound=-5.0)
    assert len(host_reads_refused) == 2


@pytest.mark.parametrize("op", ["kda", "gdn"])
def test_speculative_decoding_reads_no_device_value(op, host_reads_refused):
    """A verify step (a 2-D ssm_state_indices, num_accepted_tokens, 1 + k tokens per sequence packed on the
    device): the first call and the later ones read no value, so the step can be captured in a CUDA graph."""
    R._FAST.clear()
    x = _meta_call_args(True)
    T = 7  # 1 + k tokens per sequence (3 sequences, the offsets' values are never read)
    t = lambda *s, dt=torch.bfloat16: torch.empty(*s, device=META, dtype=dt)  # noqa: E731
    x.update(q=t(1, T, H, K), k=t(1, T, H, K), v=t(1, T, HV, V), g=t(1, T, HV, K, dt=torch.float32),
             beta=t(1, T, HV), out=t(1, T, HV, V), ssm_state_indices=t(B, 4, dt=torch.int32),
             num_accepted_tokens=t(B, dt=torch.int32))
    if op == "gdn":
        x["g"] = t(1, T, HV, dt=torch.float32)
    call = kdagen.fused_recurrent_kda if op == "kda" else kdagen.fused_recurrent_gated_delta_rule
    for _ in range(3):
        o, pool = call(**x, use_qk_l2norm_in_kernel=True)
        assert o is x["out"] and pool is x["initial_state"]
    assert len(host_reads_refused) == 3


def test_the_refusals_catch_what_they_should(host_reads_refused):
    """The fixture is not vacuous: the old decode path's `cu_seqlens.tolist()` fails it."""
    cu = torch.empty(3, device=META, dtype=torch.int64)
    with pytest.raises(AssertionError, match="tolist"):
        cu.tolist()
    from kdagen.ops.inputs import host_seqlens
    with pytest.raises(AssertionError, match="tolist"):
        host_seqlens(cu, 4, sync=True)
    assert host_seqlens(cu, 4, sync=False) is None


def test_a_host_cu_seqlens_under_graph_capture_is_refused_clearly(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(ValueError, match="cu_seqlens is on the host.*CUDA graph"):
        R._on_device(torch.arange(3), torch.device("cuda", 0))
    cu = torch.arange(3)
    assert R._on_device(cu, cu.device) is cu


# ---------------------------------------------------------------- the fast path's per-call work


def _step(gen, packed):
    lead = (1, B) if packed else (B, 1)
    q = torch.randn(*lead, H, K, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(*lead, H, K, generator=gen), dim=-1)
    v = torch.randn(*lead, HV, V, generator=gen)
    g = -5 * torch.rand(*lead, HV, K, generator=gen)
    beta = torch.rand(*lead, HV, generator=gen)
    return q, k, v, g, beta


@pytest.mark.parametrize("packed", [False, True], ids=["batch", "packed"])
def test_later_calls_do_no_validation_work_and_allocate_nothing(packed, monkeypatch):
    R._FAST.clear()
    gen = torch.Generator().manual_seed(0)
    pool = torch.randn(P, HV, K, V, generator=gen)
    idx = torch.tensor(SLOTS, dtype=torch.int32)
    cu = torch.arange(B + 1) if packed else None
    out = torch.empty(*((1, B) if packed else (B, 1)), HV, V)
    kdagen.fused_recurrent_kda(*_step(gen, packed), initial_state=pool, ssm_state_indices=idx, out=out,
                               cu_seqlens=cu)

    counts = {}

    def counted(mod, name):
        real = getattr(mod, name)

        def f(*a, **k):
            counts[name] = counts.get(name, 0) + 1
            return real(*a, **k)
        monkeypatch.setattr(mod, name, f)

    for name in ("_validate", "check_runnable", "select_spec", "lower", "resolve", "build", "prepare_recurrent"):
        counted(R, name)
    for name in ("empty", "empty_like", "zeros", "zeros_like", "full", "full_like", "ones"):
        counted(torch, name)
    steps = [_step(gen, packed) for _ in range(3)]
    ref_state = torch.stack([pool[s].clone() for s in (4, 1)]).double()
    for q, k, v, g, beta in steps:
        o, ret = kdagen.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool, ssm_state_indices=idx, out=out,
                                            cu_seqlens=cu)
        assert o is out and ret is pool
        live = [0, 2]  # sequences 0 and 2 (slot -1 is padding)
        sel = (lambda z: z[0, live].unsqueeze(1)) if packed else (lambda z: z[live])  # noqa: E731  -> [2, 1, ...]
        ro, ref_state = naive_recurrent_kda(*(sel(z).double() for z in (q, k, v, g, beta)),
                                            initial_state=ref_state, output_final_state=True)
        assert_close(sel(o), ro, TOL[torch.float32], "o")
    assert counts == {}, f"a later call of the same geometry did this work: {counts}"
    assert_close(pool[[4, 1]], ref_state, TOL[torch.float32], "pool slots")

    # without out= the only allocation is the output
    kdagen.fused_recurrent_kda(*steps[0], initial_state=pool, ssm_state_indices=idx, cu_seqlens=cu)  # new key
    counts.clear()
    kdagen.fused_recurrent_kda(*steps[0], initial_state=pool, ssm_state_indices=idx, cu_seqlens=cu)
    assert counts == {"empty": 1}, counts


def test_packed_decode_equals_the_batch_form():
    """One token per sequence packed along T with cu_seqlens computes what [B, 1, ...] does,
    and takes the fast path too."""
    R._FAST.clear()
    gen = torch.Generator().manual_seed(1)
    q, k, v, g, beta = _step(gen, False)
    pool_a = torch.randn(P, HV, K, V, generator=gen)
    pool_b = pool_a.clone()
    idx = torch.tensor(SLOTS, dtype=torch.int64)
    cu = torch.arange(B + 1, dtype=torch.int32)
    pack = lambda z: z.transpose(0, 1).contiguous()  # noqa: E731  [B, 1, ...] -> [1, B, ...]
    for _ in range(2):
        oa, _ = kdagen.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool_a, ssm_state_indices=idx)
        ob, _ = kdagen.fused_recurrent_kda(pack(q), pack(k), pack(v), pack(g), pack(beta), initial_state=pool_b,
                                           ssm_state_indices=idx, cu_seqlens=cu)
        assert torch.equal(pack(oa), ob)
        assert torch.equal(pool_a, pool_b)
    assert len(R._FAST) == 2


def test_the_fast_path_keeps_no_tensor_and_a_bounded_number_of_geometries(monkeypatch):
    import gc
    import weakref

    R._FAST.clear()
    monkeypatch.setattr(R, "_FAST_MAX", 2)
    gen = torch.Generator().manual_seed(3)
    for n in (1, 2, 3):  # three packed batch sizes: three geometries
        pool = torch.randn(P, HV, K, V, generator=gen)
        idx = torch.arange(n, dtype=torch.int32)
        x = [z[:, :n].contiguous() for z in _step(gen, True)]
        kdagen.fused_recurrent_kda(*x, initial_state=pool, ssm_state_indices=idx, cu_seqlens=torch.arange(n + 1))
        assert 1 <= len(R._FAST) <= 2
    alive = weakref.ref(pool)
    del pool
    gc.collect()
    assert alive() is None, "a fast-path entry keeps the caller's pool alive"


def test_direct_launch_passes_pointers_as_integers_and_rechecks_alignment(monkeypatch):
    """The fast path's GPU launcher (exercised here with a stand-in compiled kernel)."""
    seen = []

    class Kernel:
        function, packed_metadata = "fn", "meta"

        def run(self, *a):
            seen.append(a)

    base = torch.zeros(64)
    args = dict(q=base[:8], o=base[8:16], T=3, scale=0.5)
    direct = R._Direct(Kernel(), args, dict(H=1, BV=16), (2, 6))
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1234, raising=False)
    assert direct(args)
    assert seen == [(2, 6, 1, 1234, "fn", "meta", None, None, None,
                     base[:8].data_ptr(), base[8:16].data_ptr(), 3, 0.5, 1, 16)]
    assert not direct(dict(q=base[1:9], o=base[8:16], T=3, scale=0.5))  # 4 bytes off: another specialisation
    assert len(seen) == 1


def test_fast_path_uses_the_direct_launcher_when_there_is_one(monkeypatch):
    R._FAST.clear()
    tried = []

    class Declines:  # a direct launcher that declines (as for a misaligned pointer): the generic one runs
        dummy = 0

        def launch(self, ptrs):
            tried.append(len(ptrs))
            return False

        def __call__(self, args):
            tried.append(sorted(args))
            return False

    monkeypatch.setattr(R._Direct, "of", staticmethod(lambda desc: Declines()))
    gen = torch.Generator().manual_seed(2)
    pool = torch.randn(P, HV, K, V, generator=gen)
    idx = torch.tensor(SLOTS, dtype=torch.int32)
    for _ in range(3):
        x = _step(gen, False)
        p0 = pool.clone()
        o, _ = kdagen.fused_recurrent_kda(*x, initial_state=pool, ssm_state_indices=idx)
        ro, _ = naive_recurrent_kda(*(z[[0, 2]].double() for z in x), initial_state=p0[[4, 1]].double())
        assert_close(o[[0, 2]], ro, TOL[torch.float32], "o")
    # the two later calls: ten addresses (q, k, v, g, beta, o, h0, ht, slots, cu_seqlens), then the
    # arguments by name for the generic path's own try
    assert len(tried) == 4 and tried[0] == tried[2] == 10
    assert "q" in tried[1] and "cu_seqlens" in tried[1] and tried[1] == tried[3]


# ---------------------------------------------------------------- gates outside any bound


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("packed", [False, True], ids=["batch", "packed"])
def test_decode_gives_the_recurrence_for_g_below_any_bound_and_minus_inf(dtype, packed):
    """g at -5, below it (-8, -20, -200) and -inf (a full reset of a channel, and of a whole
    token's state): the output and pool are the float64 recurrence's, finite; no NaN."""
    R._FAST.clear()
    Bn, T = 4, 6
    x = make_inputs(Bn, T, H, HV, K, V, dtype=dtype, seed=3)
    g = x.g.clone()
    g[0, 1, 0, :4] = -5.0
    g[1, 2, 1, 3:9] = -8.0
    g[2, 0, 0, :] = -20.0
    g[3, 4, 1, 5] = -200.0
    g[0, 3, 1, 7:] = float("-inf")  # some channels reset
    g[2, 5, :, :] = float("-inf")  # the whole state reset: o is the fresh write alone
    pool = torch.randn(Bn + 2, HV, K, V)
    slots = torch.tensor([5, 0, 2, 3], dtype=torch.int32)
    ref_o, ref_s = naive_recurrent_kda(*(z.double() for z in (x.q, x.k, x.v, g, x.beta)),
                                       initial_state=pool[slots.long()].double(), output_final_state=True)
    outs = []
    for t in range(T):
        step = [z[:, t:t + 1].contiguous() for z in (x.q, x.k, x.v, g, x.beta)]
        if packed:
            step = [z.transpose(0, 1).contiguous() for z in step]
        o, _ = kdagen.fused_recurrent_kda(*step, initial_state=pool, ssm_state_indices=slots,
                                          cu_seqlens=torch.arange(Bn + 1) if packed else None)
        outs.append(o.transpose(0, 1) if packed else o)
    o = torch.cat(outs, dim=1)
    assert_close(o, ref_o, TOL[dtype], "o")
    assert_close(pool[slots.long()], ref_s, TOL[torch.float32], "pool")


def test_nan_in_g_reaches_only_its_own_sequence_and_slot():
    """NaN is the recurrence's answer to NaN: the sequence with a NaN gate gets NaN in its
    output and its slot; every other sequence and slot is exact. (The opt-in value check is
    how a caller catches it beforehand: tests/compat/test_value_check.py.)"""
    x = make_inputs(3, 1, H, HV, K, V, seed=4)
    g = x.g.clone()
    g[1, 0, 0, 2] = float("nan")
    pool = torch.randn(4, HV, K, V)
    before = pool.clone()
    slots = torch.tensor([2, 0, 3], dtype=torch.int32)
    o, _ = kdagen.fused_recurrent_kda(x.q, x.k, x.v, g, x.beta, initial_state=pool, ssm_state_indices=slots)
    assert torch.isnan(o[1, 0, 0]).all() and torch.isnan(pool[0, 0]).any()
    ro, rs = naive_recurrent_kda(*(z[[0, 2]].double() for z in (x.q, x.k, x.v, x.g, x.beta)),
                                 initial_state=before[[2, 3]].double(), output_final_state=True)
    assert_close(o[[0, 2]], ro, TOL[torch.float32], "o of the other sequences")
    assert_close(pool[[2, 3]], rs, TOL[torch.float32], "their slots")
    assert torch.equal(pool[1], before[1])
    assert torch.isfinite(o[1, 0, 1]).all()  # the other value head of that sequence is untouched by it


def test_bad_offsets_stay_inside_the_tensors():
    """Offsets are not checked on the device's behalf; in-kernel they are clamped to [0, T], so a
    bad cu_seqlens (past T, decreasing) never reads or writes outside q..o (o rows outside every
    clamped range keep their poison)."""
    R._FAST.clear()
    T = 4
    x = make_inputs(1, T, H, HV, K, V, seed=5)
    pool = torch.randn(3, HV, K, V)
    cu = torch.tensor([0, 2, 9])  # ends past T
    out = nan_tensor(1, T, HV, V)
    from kdagen.ops.recurrent import fused_recurrent_kda_launch

    desc, (o, _), _ = fused_recurrent_kda_launch(x.q, x.k, x.v, x.g, x.beta, initial_state=pool,
                                                 ssm_state_indices=torch.tensor([0, 1]), out=out,
                                                 cu_seqlens=torch.tensor([0, 2, T]))
    desc.args["cu_seqlens"] = cu
    desc()
    assert torch.isfinite(out).all()
    desc.args["cu_seqlens"] = torch.tensor([0, 3, 1])  # decreasing: the second sequence is empty
    out.fill_(float("nan"))
    desc()
    assert torch.isfinite(out[0, :3]).all() and torch.isnan(out[0, 3]).all()


@pytest.mark.slow
def test_the_gpu_script_dry_runs_on_the_cpu(tmp_path):
    """tests/gpu/serving.py's proofs run their Python in the interpreter (the GPU-only parts say SKIP):
    the graph section's replay loop matches the eager op, the gates match float64, the lean body's
    mixed items (0-3 tokens, padding, a shared slot) match float64 on both layouts, the bf16 pool's drift
    over 300 steps stays bounded."""
    import json
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    env = dict(os.environ, TRITON_INTERPRET="1", KDAGEN_CACHE_DIR=str(tmp_path), PYTHONPATH=str(root))
    r = subprocess.run([sys.executable, str(root / "tests" / "gpu" / "serving.py"), "--out", str(tmp_path),
                        "--suite", "sync,graph,gates,lean,timing,drift", "--drift-steps", "300"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    claims = json.loads((tmp_path / "serving.json").read_text())["claims"]
    results = {c["name"]: c["result"] for c in claims}
    assert not [n for n, v in results.items() if v in ("FAIL", "MISS")], results
    assert sum(v == "PASS" for v in results.values()) >= 7, results
    drift = [c for c in claims if c["name"].startswith("bf16 pool drift")]
    assert drift and drift[0]["result"] == "PASS"
    assert sum(n.startswith("the lean body gives the recurrence") and v == "PASS" for n, v in results.items()) == 2
