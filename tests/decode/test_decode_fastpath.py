"""fused_recurrent_kda's per-token fast path: repeated calls of one geometry skip
validation and planning, stay correct, and any other geometry is validated again."""
import pytest
import torch

from cases import make_inputs

import kdagen
import kdagen.ops.recurrent as R
from kdagen.spec.reference import naive_recurrent_kda


def _rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def _step(gen, B, H, HV, K, V):
    q = torch.randn(B, 1, H, K, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(B, 1, H, K, generator=gen), dim=-1)
    v = torch.randn(B, 1, HV, V, generator=gen)
    g = -5 * torch.rand(B, 1, HV, K, generator=gen)
    beta = torch.rand(B, 1, HV, generator=gen)
    return q, k, v, g, beta


def test_repeated_decode_steps_use_the_fast_path_and_stay_exact():
    R._FAST.clear()
    gen = torch.Generator().manual_seed(0)
    B, H, HV, K, V = 3, 1, 2, 32, 48
    pool = torch.randn(6, HV, K, V, generator=gen)
    idx = torch.tensor([5, 0, 3], dtype=torch.int32)
    ref_state = pool[idx.long()].double()
    untouched = pool[[1, 2, 4]].clone()
    for step in range(4):
        q, k, v, g, beta = _step(gen, B, H, HV, K, V)
        out = torch.full_like(v, float("nan"))
        o, ht = kdagen.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool, ssm_state_indices=idx, out=out)
        ro, ref_state = naive_recurrent_kda(q, k, v, g, beta, initial_state=ref_state, output_final_state=True)
        assert o is out and ht is pool
        assert _rel(o, ro) < 1e-5 and _rel(pool[idx.long()], ref_state) < 1e-5
        assert len(R._FAST) == 1  # the first call filled it; later calls hit it
    assert torch.equal(pool[[1, 2, 4]], untouched)


def test_other_geometry_is_validated_again():
    R._FAST.clear()
    gen = torch.Generator().manual_seed(1)
    q, k, v, g, beta = _step(gen, 2, 1, 1, 16, 16)
    h0 = torch.randn(2, 1, 16, 16, generator=gen)
    kdagen.fused_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    with pytest.raises(ValueError, match="initial_state"):
        kdagen.fused_recurrent_kda(q, k, v, g, beta, initial_state=h0[:1].contiguous(), output_final_state=True)
    with pytest.raises(ValueError, match="beta"):
        kdagen.fused_recurrent_kda(q, k, v, g, beta[:, :, :0], initial_state=h0, output_final_state=True)
    # a non-contiguous input takes the full path (and is made contiguous there), still correct
    qt = q.transpose(2, 3).contiguous().transpose(2, 3)
    assert not qt.is_contiguous() or qt.shape[2] == 1
    o, s = kdagen.fused_recurrent_kda(qt, k, v, g, beta, initial_state=h0, output_final_state=True)
    ro, rs = naive_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert _rel(o, ro) < 1e-5 and _rel(s, rs) < 1e-5


def test_slots_outside_the_pool_write_nothing():
    gen = torch.Generator().manual_seed(2)
    q, k, v, g, beta = _step(gen, 3, 1, 1, 16, 16)
    pool = torch.randn(4, 1, 16, 16, generator=gen)
    before = pool.clone()
    idx = torch.tensor([1, 4, -1], dtype=torch.int32)  # 4 is one past the pool's end
    out = torch.full_like(v, float("nan"))
    kdagen.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool, ssm_state_indices=idx, out=out)
    assert torch.equal(pool[[0, 2, 3]], before[[0, 2, 3]])  # only slot 1 was written
    assert not torch.equal(pool[1], before[1])
    assert torch.equal(out[1:], torch.zeros_like(out[1:]))  # skipped sequences read 0
    ro, _ = naive_recurrent_kda(q[:1], k[:1], v[:1], g[:1], beta[:1], initial_state=before[1:2])
    assert _rel(out[:1], ro) < 1e-5


def test_non_contiguous_steps_are_never_taken_by_the_fast_path():
    """Slicing one token out of a [B, T, ...] tensor gives non-contiguous views; they must
    be copied every time (the fast path would pass their strides to the kernel)."""
    R._FAST.clear()
    B, T, H, K, V = 2, 3, 1, 16, 16
    x = make_inputs(B, T, H, H, K, V, seed=3)
    q, k, v, g, beta, pool = x.q, x.k, x.v, x.g, x.beta, x.h0
    ref, _ = naive_recurrent_kda(q, k, v, g, beta, initial_state=pool.clone())
    idx = torch.arange(B, dtype=torch.int32)
    for t in range(T):
        o, _ = kdagen.fused_recurrent_kda(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], g[:, t:t + 1],
                                          beta[:, t:t + 1], initial_state=pool, ssm_state_indices=idx)
        assert _rel(o, ref[:, t:t + 1]) < 1e-5, t
    assert not R._FAST


def test_recurrent_takes_the_autograd_path_even_after_a_fast_path_entry():
    """A decode geometry's fast-path entry never serves a call whose input wants a gradient: that
    call goes through the autograd Function (and its gradient is the reference's); under
    no_grad the same tensor gets no graph; once autograd is back, the graph again."""
    R._FAST.clear()
    gen = torch.Generator().manual_seed(4)
    q, k, v, g, beta = _step(gen, 2, 1, 1, 16, 16)
    h0 = torch.randn(2, 1, 16, 16, generator=gen)
    kdagen.fused_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert len(R._FAST) == 1
    qg = q.clone().requires_grad_()
    o, ht = kdagen.fused_recurrent_kda(qg, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert o.requires_grad and type(o.grad_fn).__name__.startswith("RecurrentFunction")
    do = torch.randn(o.shape, generator=gen)
    (o * do).sum().backward()
    q64 = q.to(torch.float64).requires_grad_()
    ro, _ = naive_recurrent_kda(q64, *(t.to(torch.float64) for t in (k, v, g, beta)),
                                initial_state=h0.to(torch.float64))
    (ro * do.to(torch.float64)).sum().backward()
    assert _rel(qg.grad, q64.grad) < 1e-5
    with torch.no_grad():  # fine without autograd
        o, _ = kdagen.fused_recurrent_kda(qg, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert not o.requires_grad
    o, _ = kdagen.fused_recurrent_kda(qg, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert o.requires_grad  # autograd is back
    assert len(R._FAST) == 2  # the no_grad call's own entry; no entry for the calls with gradients


def test_chunk_schedule_of_a_packed_batch():
    from kdagen.ops.schedule import chunk_schedule

    total, idx, offs = chunk_schedule([0, 1, 40, 40, 105], 1, 105, 32, "cpu")  # lengths 1, 39, 0, 65
    assert total == 1 + 2 + 0 + 3
    assert idx.tolist() == [[0, 0], [1, 0], [1, 1], [3, 0], [3, 1], [3, 2]]
    assert offs.tolist() == [0, 1, 3, 3]
    assert chunk_schedule(None, 2, 70, 32, "cpu") == (6, None, None)


def test_cpu_tensors_outside_the_interpreter_are_refused(monkeypatch):
    gen = torch.Generator().manual_seed(5)
    q, k, v, g, beta = _step(gen, 1, 1, 1, 16, 16)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    R._FAST.clear()
    with pytest.raises(ValueError, match="CUDA tensors"):
        kdagen.fused_recurrent_kda(q, k, v, g, beta)
    with pytest.raises(ValueError, match="CUDA tensors"):
        kdagen.chunk_kda(q, k, v, g, beta)


class _Recorder:
    """Stands in for Triton's compiled launcher: records what the fast path would launch."""

    def __init__(self, scratch=0, packed_args=False):
        self.calls = []
        self.global_scratch_size = self.profile_scratch_size = scratch
        self.launch_cooperative_grid, self.launch_pdl = 0, 0
        if packed_args:  # Triton 3.7+'s launcher: its C entry point takes these, then the arguments as one tuple
            self.arg_annotations, self.kernel_signature = ("annotations",), b"signature"

    def launch(self, *a):
        self.calls.append(("c", a))

    def __call__(self, *a):
        self.calls.append(("run", a))


class _FakeKernel:
    def __init__(self, run):
        self.run, self.function, self.packed_metadata = run, 1234, (4, 1, 0)


@pytest.mark.parametrize("packed", (False, True), ids=("batch", "packed"))
@pytest.mark.parametrize("scratch", (0, 64), ids=("c-launch", "launcher"))
@pytest.mark.parametrize("triton_form", ("3.6", "3.7+"))
def test_direct_launch_passes_what_the_generic_launcher_would(monkeypatch, packed, scratch, triton_form):
    """On a GPU the fast path lays the pointers out itself (kdagen.ops.recurrent._Direct).  Here
    a recording launcher stands in for the compiled kernel: the arguments of a fast-path call
    must be exactly the generic launch's -- each tensor's address in the kernel's order, then
    T, P, scale, NS and the constexprs -- with the C entry point taken only when no scratch memory
    is needed, in the layout of the Triton at hand (3.6: one by one after the head; 3.7+: the
    launcher's annotations and signature, then the arguments as one tuple), and a misaligned
    pointer must fall back to the generic launch."""
    rec = _Recorder(scratch, packed_args=triton_form == "3.7+")
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 99, raising=False)
    monkeypatch.setattr(R._Direct, "of", classmethod(
        lambda cls, desc: cls(_FakeKernel(rec), desc.args, desc.constexprs, desc.grid)))
    R._FAST.clear()
    gen = torch.Generator().manual_seed(7)
    B, H, HV, K, V = 3, 1, 2, 16, 32
    q, k, v, g, beta = _step(gen, B, H, HV, K, V)
    cu = torch.arange(B + 1, dtype=torch.int32) if packed else None
    if packed:
        q, k, v, g, beta = (x.reshape(1, B, *x.shape[2:]).contiguous() for x in (q, k, v, g, beta))
    pool = torch.randn(5, HV, K, V, generator=gen)
    idx = torch.tensor([4, 0, 2], dtype=torch.int32)
    out = torch.empty_like(v)
    kw = dict(initial_state=pool, ssm_state_indices=idx, out=out, cu_seqlens=cu)
    kdagen.fused_recurrent_kda(q, k, v, g, beta, **kw)  # the full path: runs, fills the entry
    assert not rec.calls
    entry = next(iter(R._FAST.values()))
    o, ht = kdagen.fused_recurrent_kda(q, k, v, g, beta, **kw)
    assert o is out and ht is pool and len(rec.calls) == 1
    kind, a = rec.calls[0]
    _, _, args = R._outputs_and_args(q, k, v, g, beta, scale=entry.scale, initial_state=pool, output_final_state=False,
                                     state_indices=idx, out=out, dims=entry.dims, cu_seqlens=cu)
    args.update(entry.extra)  # NS, the sequences' count, as the generic path adds it
    assert args["NS"] == B
    want = [x.data_ptr() if isinstance(x, torch.Tensor) else x for x in args.values()] + list(entry.constexprs.values())
    grid = (tuple(entry.grid) + (1, 1))[:3]
    assert kind == ("c" if scratch == 0 else "run")
    assert a[:3] == grid and a[3] == 99 and a[4] == 1234
    if kind == "c" and triton_form == "3.7+":
        # (coop, pdl, metadata, launch metadata, 2 hooks, 2 scratch, annotations, signature, (arguments))
        assert len(a) == 16 and a[5:7] == (0, 0) and a[7] == (4, 1, 0) and a[8:13] == (None,) * 5
        assert a[13] == ("annotations",) and a[14] == b"signature"
        assert isinstance(a[15], tuple) and list(a[15]) == want
    else:
        head = 8 if kind == "c" else 4  # (coop, pdl, scratch, scratch, metadata, 3 hooks) or (metadata, 3 hooks)
        assert list(a[5 + head:]) == want
        assert a[5:5 + head][-4] == (4, 1, 0)  # the packed metadata
    # a pointer the kernel was specialised as 16-byte aligned, now misaligned: the generic launch
    calls = []
    monkeypatch.setattr(R, "launch", lambda *x: calls.append(x))
    q_odd = torch.empty(q.numel() + 1)[1:].view(q.shape).copy_(q)
    assert q_odd.data_ptr() % 16 and q_odd.is_contiguous()
    kdagen.fused_recurrent_kda(q_odd, k, v, g, beta, **kw)
    assert len(rec.calls) == 1 and len(calls) == 1


def test_direct_launch_reads_the_installed_tritons_launcher_form():
    """The fast path tells Triton 3.6's C entry point from 3.7+'s by the launcher object's
    attributes (``arg_annotations`` and ``kernel_signature`` exist only where the arguments go as
    one tuple).  Checked here against the installed Triton's own launcher source, so that a Triton
    whose launcher changes again fails this test instead of a decode step on a GPU."""
    import inspect

    from triton.backends.nvidia.driver import CudaLauncher
    init, call = inspect.getsource(CudaLauncher.__init__), inspect.getsource(CudaLauncher.__call__)
    launch = " ".join(call[call.index("self.launch("):].split())
    launch = launch[:launch.index(")") + 1]
    if "self.arg_annotations =" in init and "self.kernel_signature =" in init:
        assert launch.startswith("self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, "
                                 "self.launch_pdl, kernel_metadata, launch_metadata, launch_enter_hook, "
                                 "launch_exit_hook, global_scratch, profile_scratch, self.arg_annotations, "
                                 "self.kernel_signature, "), launch
        assert launch.endswith("args)") and "*" not in launch, launch
    else:
        assert launch == ("self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, "
                          "self.launch_pdl, global_scratch, profile_scratch, *args)"), launch
