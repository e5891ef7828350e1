"""`kdagen bench` on the CPU: kdagen in Triton's interpreter, a fake FLA, a fake timer.  What it
checks against float64, the numbers it derives from the times, the files it writes, and the
command line around it."""
import csv
import json
import sys
import types

import pytest
import torch
from click.testing import CliRunner

from kdagen.cli import main
from kdagen.spec.reference import naive_recurrent_kda
from kdagen.tuning import benchmark as BM

SHAPE = BM.Shape(1, 24, 2, 16, 16)


def _fake_fla(monkeypatch, broken: bool = False):
    """A module tree `fla.ops.kda` whose ops are the float64 reference cast to v's dtype
    (differentiable, so fwdbwd runs), recording each call."""
    calls = []

    def chunk_kda(q, k, v, g, beta, initial_state=None, output_final_state=False, safe_gate=False,
                  lower_bound=None, **kw):
        calls.append(("chunk", tuple(q.shape), safe_gate, lower_bound))
        if broken:
            raise RuntimeError("fake FLA failure\nsecond line")
        o, s = naive_recurrent_kda(q, k, v, g, beta, initial_state=initial_state, output_final_state=True)
        return o.to(v.dtype), s.float()

    def fused_recurrent_kda(q, k, v, g, beta, initial_state=None, output_final_state=False, **kw):
        calls.append(("recurrent", tuple(q.shape)))
        o, s = naive_recurrent_kda(q, k, v, g, beta, initial_state=initial_state, output_final_state=True)
        return o.to(v.dtype), s.float()

    fla, ops, kda = (types.ModuleType(n) for n in ("fla", "fla.ops", "fla.ops.kda"))
    fla.__version__ = "9.9.9"
    kda.chunk_kda, kda.fused_recurrent_kda = chunk_kda, fused_recurrent_kda
    fla.ops, ops.kda = ops, kda
    for name, mod in (("fla", fla), ("fla.ops", ops), ("fla.ops.kda", kda)):
        monkeypatch.setitem(sys.modules, name, mod)
    return calls


class FakeTimer:
    """Runs the timed callable once (so it must work) and answers the next time in ``times``."""

    def __init__(self, times):
        self.times, self.calls = list(times), 0

    def __call__(self, fn):
        fn()
        self.calls += 1
        return self.times.pop(0)


def test_run_checks_both_libraries_against_float64_and_derives_the_bandwidth(monkeypatch):
    calls = _fake_fla(monkeypatch)
    timer = FakeTimer([0.5, 2.0, 4.0, 0.01, 0.03])  # copy; fwd kdagen, fla; decode kdagen, fla
    libs = [BM.kdagen_library(), BM.fla_library()]
    res = BM.run([SHAPE], libs, ["fwd", "decode"], device="cpu", dtype=torch.float32, timer=timer,
                 echo=lambda s: None, copy_bytes=1 << 20)
    assert timer.calls == 5 and res["copy_gbs"] == pytest.approx(2 * (1 << 20) / 0.5e-3 / 1e9)
    assert res["env"]["fla"] == "9.9.9" and res["env"]["kdagen"] and res["dtype"] == "float32"
    rows = {(r["pass"], r["library"]): r for r in res["rows"]}
    assert list(rows) == [("fwd", "kdagen"), ("fwd", "fla"), ("decode", "kdagen"), ("decode", "fla")]
    for r in rows.values():
        assert r["failed"] is None and r["error"] == max(r["err_o"], r["err_state"])
    assert rows[("fwd", "kdagen")]["error"] < 1e-4  # the kernels in the interpreter, fp32
    assert rows[("fwd", "fla")]["error"] < 1e-6  # the fake is the reference
    # the least traffic of the forward: every input once, o and the fp32 final state once
    B, T, H, K, V = 1, 24, 2, 16, 16
    fwd_bytes = 4 * (2 * B * T * H * K + B * T * H * V + B * T * H * K + B * T * H + B * H * K * V) + \
        4 * (B * T * H * V + B * H * K * V)
    r = rows[("fwd", "fla")]
    assert r["bytes"] == fwd_bytes and r["ms"] == 4.0
    assert r["tbs"] == pytest.approx(fwd_bytes / 4e-3 / 1e12)
    assert r["pct_copy"] == pytest.approx(100 * r["tbs"] * 1e3 / res["copy_gbs"])
    assert rows[("decode", "kdagen")]["T"] == 24 and rows[("decode", "kdagen")]["timing"] == "eager"
    # FLA was called with the gate bound, warmed up before it was timed, and decode with one token
    assert ("chunk", (B, T, H, K), True, BM.LOWER) in calls and ("recurrent", (B, 1, H, K)) in calls
    lines = BM.table_lines(res)
    (fwd_line,) = [ln for ln in lines if " fwd " in ln]
    assert "2.000 ms" in fwd_line and "4.000 ms" in fwd_line and fwd_line.rstrip().endswith("x2.00")
    (dec_line,) = [ln for ln in lines if " decode " in ln]
    assert "10.0 us" in dec_line and "30.0 us" in dec_line and dec_line.rstrip().endswith("x3.00")
    assert "fla/kdagen > 1: kdagen is faster" in lines[0]


def test_a_failing_library_gets_a_row_that_says_why_and_the_run_goes_on(monkeypatch):
    _fake_fla(monkeypatch, broken=True)
    so_far = []
    res = BM.run([SHAPE], [BM.kdagen_library(), BM.fla_library()], ["fwd"], device="cpu", dtype=torch.float32,
                 timer=FakeTimer([1.0, 2.0]), echo=lambda s: None, copy_bytes=1 << 20,
                 on_row=lambda r: so_far.append(len(r["rows"])))
    assert so_far == [1, 2]  # the result is handed out after each row (a run cut short keeps them)
    kd, fl = res["rows"]
    assert kd["failed"] is None and kd["ms"] == 2.0
    assert fl["failed"] == "RuntimeError: fake FLA failure" and fl["ms"] is None
    lines = BM.table_lines(res)
    assert any("failed" in ln and "2.000 ms" in ln for ln in lines)
    assert lines[-1] == "  fla fwd 1,24,2,16 failed: RuntimeError: fake FLA failure"


def test_a_repair_launch_counts_its_flags_and_the_share_of_chunks_they_flag(monkeypatch):
    """The backward's repair launches (REPAIR) re-run only the chunks the forward flagged: their traffic in the
    per-launch floor is the flags plus that share of their tensors, not a second full launch."""
    import kdagen.kernels as KK

    monkeypatch.setattr(KK, "launch", lambda *a: None)  # recorded, not run
    x = torch.zeros(1000)  # 4,000 bytes

    def call(n_flagged):
        bad = torch.zeros(10, dtype=torch.int8)
        bad[:n_flagged] = 1

        def fn():
            def kernel():
                pass
            kernel.__name__ = "chunk_bwd_wy"
            KK.launch(kernel, (10,), dict(x=x, bad=bad), dict(REPAIR=False), 4, 1)
            KK.launch(kernel, (10,), dict(x=x, bad=bad), dict(REPAIR=True), 4, 1)
        return BM.launch_bytes(fn)["chunk_bwd_wy"]

    assert call(0) == 4010 + 10  # the full launch, then the repair launch's flags alone
    assert call(3) == 4010 + 10 + 1200  # three chunks in ten re-run
    assert call(10) == 2 * 4010


@pytest.mark.slow
def test_the_training_steps_repair_launches_add_only_their_flags_on_gates_within_the_bound(monkeypatch):
    """KDA's training step on gates within the promised bound (nothing flagged): each kernel with a repair launch
    is recorded as its fast launches' tensors and the repair launch's flags, not twice its traffic."""
    import kdagen.kernels as KK

    launched = []
    inner = KK.launch

    def spy(fn_, grid, args, constexprs, num_warps, num_stages):
        launched.append((fn_.__name__, bool(constexprs.get("REPAIR")), args))
        return inner(fn_, grid, args, constexprs, num_warps, num_stages)

    monkeypatch.setattr(KK, "launch", spy)
    x = BM.inputs(BM.Shape(1, 40, 1, 16, 16), torch.float32, "cpu", 0)
    fn, _, _ = BM.pass_fn(BM.kdagen_library(), "fwdbwd", x)
    recorded = BM.launch_bytes(fn)

    def held(args):
        return sum(t.numel() * t.element_size() for t in {t.data_ptr(): t for t in args.values()
                                                          if isinstance(t, torch.Tensor)}.values())

    repaired = {name for name, repair, _ in launched if repair}
    assert repaired, [n for n, *_ in launched]  # the checked backward has its repair launch
    for name in repaired:
        fast = [held(a) for n, r, a in launched if n == name and not r]
        flags = [a["bad"] for n, r, a in launched if n == name and r]
        assert fast and all(int(torch.count_nonzero(b)) == 0 for b in flags)
        assert recorded[name] == sum(fast) + sum(b.numel() for b in flags), name


def test_per_launch_rows_name_each_kernel_with_kdagen_bytes_and_floor(monkeypatch):
    """--per-launch: each forward row lists its kernels; kdagen's carry the bytes their launches' tensors
    hold (recorded from kdagen.kernels.launch) and that traffic's time at the measured copy bandwidth."""
    _fake_fla(monkeypatch)
    timed = []

    def fake_launch_timer(fn):  # the kernels of one call: kdagen's as launched, plus one that is not kdagen's
        names = list(BM.launch_bytes(fn)) or ["fla_kernel"]
        timed.append(names)
        return {n: (0.25 * (i + 1), 1.0) for i, n in enumerate(names)} | {"elementwise_kernel": (0.01, 2.0)}

    res = BM.run([SHAPE], [BM.kdagen_library(), BM.fla_library()], ["fwd", "decode"], device="cpu",
                 dtype=torch.float32, timer=FakeTimer([0.5, 2.0, 4.0, 0.01, 0.03]), echo=lambda s: None,
                 copy_bytes=1 << 20, launch_timer=fake_launch_timer)
    rows = {(r["pass"], r["library"]): r for r in res["rows"]}
    assert "launches" not in rows[("decode", "kdagen")] and "launches" not in rows[("decode", "fla")]
    kd, fl = rows[("fwd", "kdagen")]["launches"], rows[("fwd", "fla")]["launches"]
    kernels = [k for k in kd if k["name"] != "elementwise_kernel"]
    assert len(kernels) >= 2 and all(k["name"].startswith("kda") for k in kernels)  # the solve and the pass
    for k in kernels:
        assert k["bytes"] > 0 and k["floor_ms"] == pytest.approx(k["bytes"] / (res["copy_gbs"] * 1e9) * 1e3)
    # every input and output of the pass is an argument of some launch: their bytes cover its least traffic
    assert sum(k["bytes"] for k in kernels) >= rows[("fwd", "kdagen")]["bytes"]
    (other,) = [k for k in kd if k["name"] == "elementwise_kernel"]
    assert other["bytes"] is None and other["floor_ms"] is None and other["count"] == 2.0
    assert [k["name"] for k in fl] == ["fla_kernel", "elementwise_kernel"] and fl[0]["bytes"] is None
    assert BM.kernel_table([("a", 10.0), ("b", 30.0), ("a", 10.0)], 2) == {"b": (0.015, 0.5), "a": (0.01, 1.0)}


def test_perf_page_lists_each_launch_against_its_floor():
    from kdagen.tuning import perf_doc

    res = _result()
    row = next(r for r in res["rows"] if r["library"] == "kdagen" and r["pass"] == "fwd")
    row["launches"] = [dict(name="kda_chunk_solve", ms=0.9, count=1.0, bytes=1.5e9, floor_ms=0.5),
                       dict(name="kda_chunk_pass", ms=0.6, count=1.0, bytes=1.2e9, floor_ms=0.4)]
    page = perf_doc.perf_markdown(res)
    assert "## Per launch" in page and "### KDA chunk forward, 1,8192,96,128" in page
    assert "| kdagen | `kda_chunk_solve` | 1 | 0.900 ms | 60% | 1500.0 MB | 0.500 ms | 1.8× |" in page
    assert "| kdagen | `kda_chunk_pass` | 1 | 0.600 ms | 40% | 1200.0 MB | 0.400 ms | 1.5× |" in page
    assert "## Per launch" not in perf_doc.perf_markdown(_result())


@pytest.mark.slow
def test_forward_and_backward_are_timed_with_gradients_of_every_input(monkeypatch):
    _fake_fla(monkeypatch)
    seen = []

    def timer(fn):
        grads = fn()
        seen.append([g.shape for g in grads])
        return 3.0

    res = BM.run([SHAPE], [BM.kdagen_library(), BM.fla_library()], ["fwdbwd"], device="cpu", dtype=torch.float32,
                 timer=timer, echo=lambda s: None, copy_bytes=1 << 20)
    x = BM.inputs(SHAPE, torch.float32, "cpu", 0)
    for r in res["rows"]:
        assert r["failed"] is None and r["error"] is None  # no gradient check here (the tests have it)
        n_in = sum(t.numel() * t.element_size() for t in x.values())
        n_out = x["v"].numel() * 4 + x["initial_state"].numel() * 4
        assert r["bytes"] == 3 * n_in + 2 * n_out
    assert seen[1:] == [[x[n].shape for n in BM.GRAD_NAMES]] * 2


def test_decode_is_timed_from_a_cuda_graph_or_eagerly_when_it_cannot_be_captured(monkeypatch):
    _fake_fla(monkeypatch)
    graphed = []

    def graph_timer(fn):
        fn()
        graphed.append(1)
        if len(graphed) == 2:
            raise RuntimeError("operation not permitted when stream is capturing")
        return 0.002

    res = BM.run([SHAPE], [BM.kdagen_library(), BM.fla_library()], ["fwd", "decode"], device="cpu",
                 dtype=torch.float32, timer=FakeTimer([1.0, 2.0, 3.0, 0.02]), graph_timer=graph_timer,
                 echo=lambda s: None, copy_bytes=1 << 20)
    assert [(r["pass"], r["library"], r["timing"], r["ms"]) for r in res["rows"]] == [
        ("fwd", "kdagen", "eager", 2.0), ("fwd", "fla", "eager", 3.0),
        ("decode", "kdagen", "graph", 0.002), ("decode", "fla", "eager", 0.02)]


def test_results_round_trip_through_json_and_csv(tmp_path):
    res = {"env": {"device": "test"}, "dtype": "bfloat16", "copy_gbs": 4000.0, "rows": [
        dict(shape="1,64,2,64", B=1, T=64, H=2, K=64, V=64, library="kdagen", timing="eager", error=1e-3,
             err_o=1e-3, err_state=5e-4, ms=1.0, bytes=10, tbs=1.0, pct_copy=25.0, failed=None, **{"pass": "fwd"})]}
    BM.write_json(res, tmp_path / "r.json")
    assert BM.read_json(tmp_path / "r.json") == res
    BM.write_csv(res, tmp_path / "r.csv")
    with open(tmp_path / "r.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert tuple(row) == BM.CSV_FIELDS and row["library"] == "kdagen" and float(row["ms"]) == 1.0


def test_plot_draws_a_png(tmp_path):
    import matplotlib  # noqa: F401 - part of the test extra: this test runs in CI

    res = {"env": {"device": "test", "kdagen": "0", "fla": "1"}, "dtype": "bfloat16", "copy_gbs": 1.0, "rows": [
        dict(shape=s, library=lib, ms=ms, failed=None, **{"pass": p})
        for s in ("1,64,2,64", "2,64,2,64") for p in ("fwd", "decode") for lib, ms in (("kdagen", 1.0), ("fla", 2.0))]}
    BM.plot(res, str(tmp_path / "c.png"))
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(BM.Unavailable, match=r"pip install 'kdagen\[plot\]'"):
        BM.check_plot_available()


def test_each_warm_up_process_compiles_its_share_of_the_autotuning_candidates():
    from triton.runtime import autotuner

    original = autotuner.Autotuner.prune_configs
    try:
        autotuner.Autotuner.prune_configs = lambda self, kwargs: list(range(10))
        with BM._ConfigShare(1, 4):
            assert autotuner.Autotuner.prune_configs(None, {}) == [1, 5, 9]
        with BM._ConfigShare(12, 14):  # a share with nothing in it keeps the first
            assert autotuner.Autotuner.prune_configs(None, {}) == [0]
        assert autotuner.Autotuner.prune_configs(None, {}) == list(range(10))
    finally:
        autotuner.Autotuner.prune_configs = original


def test_a_warm_up_worker_runs_fla_at_its_cases_and_no_others(monkeypatch):
    from kdagen.tuning.bench_cases import Case

    calls = _fake_fla(monkeypatch)
    cases = [Case("kda", "fwd", (1, 24, 2, 16, 16)), Case("kda", "decode", (2, 1, 1, 16, 32)),
             Case("kda", "fwd", (2, 8, 1, 16, 32))]
    msg = BM.fla_share_worker(0, 2, cases, "fp32", device="cpu")
    assert msg == "worker 0: 3 calls"
    assert calls == [("chunk", (1, 24, 2, 16), True, BM.LOWER), ("recurrent", (2, 1, 1, 16)),
                     ("chunk", (2, 8, 1, 16), True, BM.LOWER)]


@pytest.fixture
def cpu_bench(monkeypatch):
    """`kdagen bench` measuring on the CPU with a fake FLA and a fake timer; ``warmed`` records
    the FLA warm-up's arguments."""
    _fake_fla(monkeypatch)
    monkeypatch.setattr(BM, "cuda_device", lambda: "cpu")
    monkeypatch.setattr(BM, "median_timer", lambda fn: (fn(), 1.5)[1])
    monkeypatch.setattr(BM, "graph_median_timer", lambda fn: (fn(), 0.5)[1])
    monkeypatch.setattr(BM, "COPY_BYTES", 1 << 20)
    warmed = []
    monkeypatch.setattr(BM, "warm_fla", lambda *a, **k: warmed.append(a))
    return warmed


@pytest.mark.parametrize("when", ["warming FLA", "after a row"])
def test_an_interrupted_bench_says_truly_whether_rows_were_kept(cpu_bench, tmp_path, monkeypatch, when):
    """Interrupted (a device call's timeout) while FLA's autotuning warms, no row exists to point at; after a
    row, the JSON holds it."""
    out = tmp_path / "res"
    if when == "warming FLA":
        monkeypatch.setattr(BM, "warm_fla", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    else:
        plain = BM.run

        def run_then_stop(*a, on_row=None, **k):
            plain(*a, on_row=on_row, **k)
            raise KeyboardInterrupt

        monkeypatch.setattr(BM, "run", run_then_stop)
    r = CliRunner().invoke(main, ["bench", "--compare", "fla", "--shapes", "1,24,2,16", "--dtype", "fp32",
                                  "--out", str(out)])
    assert r.exit_code == 130, r.output
    if when == "warming FLA":
        assert "interrupted before any row was measured" in r.output and not out.with_suffix(".json").exists()
    else:
        assert f"the rows measured so far are in {out}.json" in r.output
        assert [row["library"] for row in json.loads(out.with_suffix(".json").read_text())["rows"]] == ["kdagen", "fla"]


def test_bench_compare_fla_prints_a_table_and_writes_json_and_csv(cpu_bench, tmp_path, monkeypatch):
    out = tmp_path / "res"
    r = CliRunner().invoke(main, ["bench", "--compare", "fla", "--shapes", "1,24,2,16", "--dtype", "fp32",
                                  "--out", str(out), "--fla-warm-jobs", "3"])
    assert r.exit_code == 0, r.output
    ((cases, dt, jobs),) = cpu_bench
    assert [(c.member, c.pass_, c.shape) for c in cases] == [("kda", "fwd", (1, 24, 2, 16, 16))]
    assert dt == torch.float32 and jobs == 3
    assert "kdagen time" in r.output and "fla time" in r.output and "x1.00" in r.output
    assert f"wrote {out}.json, {out}.csv" in r.output
    res = json.loads(out.with_suffix(".json").read_text())
    assert [row["library"] for row in res["rows"]] == ["kdagen", "fla"]
    assert out.with_suffix(".csv").read_text().startswith(",".join(BM.CSV_FIELDS))
    # an earlier run printed again, where there is no GPU
    monkeypatch.setattr(BM, "cuda_device", lambda: pytest.fail("--from measured"))
    again = CliRunner().invoke(main, ["bench", "--from", str(out) + ".json"])
    assert again.exit_code == 0, again.output
    table = [ln for ln in r.output.splitlines() if ln.startswith("  ")][-3:]
    assert table == [ln for ln in again.output.splitlines() if ln.startswith("  ")][-3:]


def test_bench_alone_times_kdagen_without_fla(cpu_bench, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "fla", None)  # not needed without --compare
    r = CliRunner().invoke(main, ["bench", "--shapes", "1,24,2,16", "--dtype", "fp32", "--passes", "decode",
                                  "--out", str(tmp_path / "k")])
    assert r.exit_code == 0, r.output
    assert "kdagen time" in r.output and "fla" not in r.output and not cpu_bench


def test_an_interrupted_bench_keeps_the_rows_it_measured(cpu_bench, tmp_path, monkeypatch):
    real_run = BM.run

    def cut_after_one_row(*a, on_row=None, **k):
        def row_then_interrupt(so_far):
            on_row(so_far)
            raise KeyboardInterrupt  # e.g. `timeout -s INT`

        return real_run(*a, on_row=row_then_interrupt, **k)

    monkeypatch.setattr(BM, "run", cut_after_one_row)
    out = tmp_path / "cut"
    r = CliRunner().invoke(main, ["bench", "--compare", "fla", "--shapes", "1,24,2,16", "--dtype", "fp32",
                                  "--out", str(out)])
    assert r.exit_code == 130 and "Traceback" not in r.output
    assert f"the rows measured so far are in {out}.json" in r.output
    assert [row["library"] for row in BM.read_json(str(out) + ".json")["rows"]] == ["kdagen"]


# --- the family's cases, the suites, PERF.md and the README's table ---------------------------

@pytest.mark.slow
@pytest.mark.parametrize("member", ["gdn", "deltanet", "gla", "dplr"])
def test_every_member_is_checked_against_its_float64_recurrence(member):
    """Each member's chunk op and recurrent op (fp32, the interpreter) agree with the member's float64
    recurrence on the harness's inputs, and the forward+backward pass differentiates every input."""
    from kdagen.tuning import bench_cases as BC

    seen = []

    def timer(fn):
        out = fn()
        seen.append(out)
        return 1.0

    shape = BM.Shape(1, 40, 2, 32, 32)
    res = BM.run([shape], [BM.kdagen_library()], ["fwd", "fwdbwd", "decode"], members=[member], device="cpu",
                 dtype=torch.float32, timer=timer, echo=lambda s: None, copy_bytes=1 << 20)
    rows = {r["pass"]: r for r in res["rows"]}
    assert list(rows) == ["fwd", "fwdbwd", "decode"] and all(r["member"] == member for r in rows.values())
    for p in ("fwd", "decode"):
        assert rows[p]["failed"] is None and rows[p]["error"] < 1e-5, rows[p]
    assert rows["fwdbwd"]["failed"] is None
    x = BC.inputs(member, (1, 40, 2, 32, 32), torch.float32, "cpu", 0)
    grads = seen[2]  # copy, fwd, fwdbwd, decode
    assert [g.shape for g in grads] == [x[n].shape for n in BC.member(member).grads]
    assert all(torch.isfinite(g).all() for g in grads)


def test_the_readme_suite_names_known_members_and_passes():
    from kdagen.tuning import bench_cases as BC

    cases = BC.SUITES["readme"]
    assert {c.member for c in cases} == set(BC.MEMBERS) and {c.pass_ for c in cases} == set(BC.PASSES)
    assert [c.shape[0] for c in cases if c.pass_ == "decode"] == [1, 16, 256]


def _result():
    rows = []
    for member, p, shape, (k_ms, f_ms) in (("kda", "fwd", "1,8192,96,128", (1.5, 3.0)),
                                           ("kda", "decode", "256,1,32,128", (0.05, 0.06)),
                                           ("gdn", "fwd", "2,16384,16,128", (1.0, None))):
        B, T, H, K = (int(n) for n in shape.split(","))
        for lib, ms in (("kdagen", k_ms), ("fla", f_ms)):
            rows.append(dict(member=member, shape=shape, B=B, T=T, H=H, K=K, V=K, library=lib, ms=ms,
                             pct_copy=None if ms is None else 50.0, tbs=None if ms is None else 1.5, error=1e-3 if lib == "kdagen" else None,
                             failed=None if ms else "RuntimeError: no", **{"pass": p}))
    env = dict(date="2026-01-02T03:04:05", device="NVIDIA H100 80GB HBM3", torch="2.13.0", triton="3.6.0",
               cuda="13.0", python="3.12", kdagen="0.1.0", fla="0.6.0", fla_backend_dispatch="off")
    return {"env": env, "dtype": "bfloat16", "copy_gbs": 3000.0, "rows": rows}


def test_perf_page_lists_every_case_with_gpu_date_and_versions():
    from kdagen.tuning import perf_doc

    page = perf_doc.perf_markdown(_result(), "perf.json")
    assert "NVIDIA H100 80GB HBM3, 2026-01-02, kdagen 0.1.0, FLA 0.6.0" in page and "Triton 3.6.0" in page
    assert "| kda | fwd | 1,8192,96,128 | 1.500 ms | 3.000 ms | 2.00× | 50% | 1.0e-03 |" in page
    assert "| kda | decode | 256,1,32,128 | 50.0 µs | 60.0 µs | 1.20× |" in page
    assert "| gdn | fwd | 2,16384,16,128 | 1.000 ms | failed | - |" in page
    assert "- fla gdn fwd 2,16384,16,128: RuntimeError: no" in page


def test_the_readme_table_is_rewritten_between_its_markers(tmp_path, monkeypatch):
    from kdagen.tuning import perf_doc

    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{perf_doc.BEGIN}\nold table\n{perf_doc.END}\n\nafter\n")
    res = tmp_path / "perf.json"
    BM.write_json(_result(), str(res))
    monkeypatch.setattr(BM, "cuda_device", lambda: pytest.fail("--from measured"))
    r = CliRunner().invoke(main, ["bench", "--from", str(res), "--perf-md", str(tmp_path / "PERF.md"),
                                  "--readme", str(readme)])
    assert r.exit_code == 0, r.output
    text = readme.read_text()
    assert "old table" not in text and text.startswith("# x\n") and text.endswith("\nafter\n")
    assert "| KDA chunk forward | 1,8192,96,128 | 1.500 ms | 3.000 ms | **2.00×** |" in text
    assert "(`perf.json`)" in (tmp_path / "PERF.md").read_text()
    readme.write_text("no markers\n")
    r = CliRunner().invoke(main, ["bench", "--from", str(res), "--readme", str(readme)])
    assert r.exit_code == 2 and "perf-table:begin" in r.output


def test_bench_members_and_suite_choose_the_cases(cpu_bench, tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(BM, "run", lambda *a, cases=None, **k: seen.append(cases) or {
        "env": {}, "dtype": "float32", "copy_gbs": 1.0, "rows": []})
    r = CliRunner().invoke(main, ["bench", "--members", "kda,gla", "--shapes", "1,24,2,16", "--passes", "fwd,decode",
                                  "--out", str(tmp_path / "m")])
    assert r.exit_code == 0, r.output
    assert [(c.member, c.pass_, c.shape) for c in seen[0]] == [
        (m, p, (1, 24, 2, 16, 16)) for m in ("kda", "gla") for p in ("fwd", "decode")]
    r = CliRunner().invoke(main, ["bench", "--suite", "readme", "--compare", "fla", "--out", str(tmp_path / "s")])
    assert r.exit_code == 0, r.output
    from kdagen.tuning.bench_cases import SUITES
    assert seen[1] == SUITES["readme"]
    # FLA is warmed at the suite's cases, not at every member x shape x pass they span (45 calls, each
    # autotuned: longer than a device call)
    assert list(cpu_bench[-1][0]) == SUITES["readme"]
    r = CliRunner().invoke(main, ["bench", "--suite", "readme", "--members", "gdn"])
    assert r.exit_code == 2 and "--suite" in r.output


def test_runs_of_one_gpu_join_into_one_page_and_a_case_never_mixes_runs(tmp_path, monkeypatch):
    """``--from`` repeated joins runs of one GPU and one set of versions (a suite measured in several
    sittings); a case found in two runs, or runs of another GPU or Triton, are refused, so that every
    FLA/kdagen ratio on the page stays a same-process ratio."""
    whole = _result()
    one, two = dict(whole), dict(whole)
    one["rows"] = [r for r in whole["rows"] if r["pass"] != "decode"]
    two["rows"] = [r for r in whole["rows"] if r["pass"] == "decode"]
    two["env"] = {**whole["env"], "date": "2026-01-01T00:00:00"}
    paths = []
    for n, res in (("a", one), ("b", two)):
        paths.append(tmp_path / f"{n}.json")
        BM.write_json(res, str(paths[-1]))
    monkeypatch.setattr(BM, "cuda_device", lambda: pytest.fail("--from measured"))
    r = CliRunner().invoke(main, ["bench", "--from", str(paths[0]), "--from", str(paths[1]),
                                  "--perf-md", str(tmp_path / "PERF.md"), "--out", str(tmp_path / "joined")])
    assert r.exit_code == 0, r.output
    page = (tmp_path / "PERF.md").read_text()
    assert "from the JSON results of 2 runs on one GPU (`a.json, b.json`" in page
    assert "2026-01-01" in page  # the earliest run's date
    assert "| kda | fwd | 1,8192,96,128 | 1.500 ms | 3.000 ms | 2.00× | 50% | 1.0e-03 |" in page
    assert "| kda | decode | 256,1,32,128 | 50.0 µs | 60.0 µs | 1.20× |" in page
    joined = BM.read_json(str(tmp_path / "joined.json"))
    assert len(joined["rows"]) == len(whole["rows"]) and joined["runs"] == [str(p) for p in paths]
    # a case in both runs: refused, whichever library each holds
    BM.write_json(dict(whole, rows=[r for r in whole["rows"] if r["library"] == "fla"]), str(tmp_path / "c.json"))
    r = CliRunner().invoke(main, ["bench", "--from", str(paths[0]), "--from", str(tmp_path / "c.json")])
    assert r.exit_code == 2 and "in both" in r.output and "one run" in r.output
    # another Triton: refused
    BM.write_json(dict(two, env={**two["env"], "triton": "3.9.0"}), str(tmp_path / "d.json"))
    r = CliRunner().invoke(main, ["bench", "--from", str(paths[0]), "--from", str(tmp_path / "d.json")])
    assert r.exit_code == 2 and "triton" in r.output and "3.9.0" in r.output
