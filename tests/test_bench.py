import json
import subprocess
import sys

import pytest
import torch

from book import plotting as book_plotting
from studylog import bench, plotting, verify

REQUIRED = {"chapter", "device", "versions", "date", "git_commit", "command", "ceilings", "measurements"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_cli_refuses_without_gpu(tmp_path):
    out = subprocess.run([sys.executable, "-m", "studylog", "bench", "env", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    assert "needs a CUDA GPU" in out.stderr and "interpreter" in out.stderr
    assert not any(tmp_path.iterdir()), "nothing may be written on a refusal"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_bench_run_refuses_without_gpu():
    with pytest.raises(bench.NoGPUError):
        bench.BenchRun("env", command="test")


def test_info_command():
    out = subprocess.run([sys.executable, "-m", "studylog", "info"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "mode" in out.stdout


def test_gpu_slug():
    assert bench.gpu_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"


@pytest.mark.parametrize("path", sorted(bench.DEFAULT_OUT.glob("*/*.json")), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_results_are_complete(path):
    """Committed results carry what makes them reproducible, and no failed check."""
    data = json.loads(path.read_text())
    assert REQUIRED <= set(data), REQUIRED - set(data)
    assert data["chapter"] == path.stem
    assert bench.gpu_slug(data["device"]["name"]) == path.parent.name
    assert data["command"].startswith("python -m studylog bench")
    assert data["ceilings"]["copy_bandwidth_gbs"] > 100
    assert data["measurements"], "no measurements"
    assert all(r["ms"] > 0 and r["role"] in bench.ROLES for r in data["measurements"])
    assert not bench.failed_checks(data), "a correctness check of our kernels failed in this run"


def test_a_failed_check_of_a_peer_is_a_finding_not_a_failure():
    data = {"measurements": [{"series": "gemlite_w2", "role": "peer"}, {"series": "step11", "role": "kernel"}],
            "checks": [{"name": "gemlite_w2 within bf16 rounding", "passed": False},
                       {"name": "step11 equals float64 reference", "passed": False},
                       {"name": "other", "passed": False, "peer": True},
                       {"name": "step11 equals float64 reference", "passed": True}]}
    assert [c["name"] for c in bench.failed_checks(data)] == ["step11 equals float64 reference"]
    assert [c["name"] for c in bench.failed_checks(data, peers=True)] == ["gemlite_w2 within bf16 rounding", "other"]


def test_plot_helpers_on_a_small_results_file(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    _results_file(tmp_path, "demo", [row for n in (10, 100, 1000) for row in (
        {"series": "dense", "role": "baseline", "params": {"n": n, "b": 1}, "ms": 1.0},
        {"series": "ours", "role": "kernel", "params": {"n": n, "b": 1}, "ms": n / 1000, "floor_ms": n / 2000})])
    res = plotting.load_results("demo", root=tmp_path)
    assert res.gpu == "Test GPU" and "2026-01-02" in res.caption()
    assert res.ms("ours", n=100) == pytest.approx(0.1)
    ax = book_plotting.plot_speedup(res, "n", "dense", ["ours"])
    (line,) = [ln for ln in ax.get_lines() if ln.get_label() == "ours"]
    assert list(line.get_ydata()) == pytest.approx([100.0, 10.0, 1.0])
    assert ax.get_yscale() == "linear"  # speedups read on a linear axis
    ax = book_plotting.plot_times(res, "n", ["dense", "ours"])
    assert any("floor" in ln.get_label() for ln in ax.get_lines())
    md = book_plotting.table(res, ["n"], ["dense", "ours"], where={"b": 1})
    assert md.splitlines()[2] == "| 10 | 1000.0 | 10.0 |"


def test_missing_results_say_how_to_make_them(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m studylog bench nope"):
        plotting.load_results("nope", root=tmp_path)


def test_readme_results_are_generated_from_the_committed_json():
    """The README's numbers are never typed by hand: its results block equals what the JSON gives."""
    readme = (bench.REPO_ROOT / "README.md").read_text()
    assert book_plotting.readme_results_block() in readme, "README results are stale: run `python -m book plot all`"


def test_headline_tables_show_every_card_and_say_where_they_differ():
    """One table per chapter and GPU; a headline whose speedup differs by more than 15% between two cards is
    named with both numbers, one that agrees is not."""
    rows = [dict(kernel="k", baseline="b", case="c", speedup=s, gpu=g) for s, g in ((4.0, "A"), (3.0, "B"))]
    rows += [dict(kernel="k", baseline="b", case="d", speedup=s, gpu=g) for s, g in ((2.0, "A"), (2.2, "B"))]
    said = book_plotting.card_differences(rows)
    assert len(said) == 1 and "4.00× on the A" in said[0] and "3.00× on the B" in said[0] and "(c)" in said[0]
    text = book_plotting.headline_markdown()
    for f in plotting.result_files("masked_lm_head"):
        gpu = plotting.load_results("masked_lm_head", gpu=f.parent.name).gpu
        assert f"**masked_lm_head** — {gpu}," in text


@pytest.mark.gpu
def test_kernel_time_sees_the_kernel_without_the_launch():
    """BenchRun.kernel_time: the profiler's span of fn's kernels, below do_bench's event time for a short
    kernel (no launch or event overhead) and close to it for a long one."""
    run = bench.BenchRun("ternary", command="test")
    a = torch.empty(64 * 1024 * 1024, device="cuda")
    long_event, long_kernel = run.time(lambda: a.mul_(1.0)), run.kernel_time(lambda: a.mul_(1.0))
    assert 0.8 * long_event <= long_kernel <= 1.05 * long_event, (long_event, long_kernel)
    b = torch.empty(1024, device="cuda")
    short_event, short_kernel = run.time(lambda: b.mul_(1.0)), run.kernel_time(lambda: b.mul_(1.0))
    assert 0 < short_kernel < short_event, (short_event, short_kernel)
    two = run.kernel_time(lambda: (a.mul_(1.0), a.mul_(1.0)))  # both kernels of a call are in its span
    assert 1.7 * long_kernel <= two <= 2.3 * long_kernel, (long_kernel, two)


def test_rotation_covers_four_times_the_l2():
    run = bench.BenchRun.__new__(bench.BenchRun)  # no GPU needed: only the device record
    run.device = {"l2_cache_bytes": 60 * 2**20}
    assert run.rotation(15 * 2**20) == 16 and run.rotation(61 * 2**20) == 4 and run.rotation(10**9) == 1
    run.device = {"l2_cache_bytes": None}  # unknown: 64 MiB
    assert run.rotation(2**20) == 256
    # BenchRun.rotated: that many copies, equal and apart, of a tensor or of a dataclass holding one in .data
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Packed:
        data: torch.Tensor
        n: int

    t = torch.arange(2**18, dtype=torch.int32)  # 1 MiB: 256 copies in all
    for weights, data in ((t, lambda c: c), (Packed(t, 7), lambda c: c.data)):
        copies = run.rotated(weights)
        assert len(copies) == 256 and copies[0] is weights
        assert all(torch.equal(data(c), t) for c in copies)
        assert len({data(c).data_ptr() for c in copies}) == 256
        assert all(c.n == 7 for c in copies if isinstance(c, Packed))
    with pytest.raises(ValueError, match="at least one call"):
        run.graph_time([])


@pytest.mark.gpu
def test_graph_time_leaves_the_host_out_and_the_weights_cold():
    """BenchRun.graph_time: a kernel behind a slow host costs the GPU time alone in a graph (do_bench
    waits for the host), and rotating copies of a tensor larger than L2 in total keeps it out of L2."""
    import time
    run = bench.BenchRun("ternary", command="test")
    b = torch.empty(1024, device="cuda")

    def slow_host():
        time.sleep(200e-6)  # a host that takes 200 µs to launch
        b.mul_(1.0)
    assert run.graph_time([slow_host]) < 0.05 < run.time(slow_host)
    # a read of 24 MB: from L2 when one copy is replayed, from DRAM when they rotate
    copies = [torch.ones(6 * 1024 * 1024, device="cuda") for _ in range(run.rotation(24 * 2**20))]
    hot = run.graph_time([lambda: copies[0].sum()])
    cold = run.graph_time([lambda c=c: c.sum() for c in copies])
    assert cold > 1.2 * hot, (hot, cold)
    # a long kernel: graph time is the kernel's time
    a = torch.empty(64 * 1024 * 1024, device="cuda")
    long_kernel = run.kernel_time(lambda: a.mul_(1.0))
    assert 0.9 * long_kernel <= run.graph_time([lambda: a.mul_(1.0)], min_calls=10) <= 1.1 * long_kernel


def test_read_only_refuses_what_it_cannot_read():
    with pytest.raises(ValueError, match="contiguous CUDA tensor"):
        bench.read_only(torch.zeros(64, dtype=torch.uint8))  # on the CPU (and on a GPU machine too)


@pytest.mark.gpu
@pytest.mark.parametrize("nbytes", [16, 4096, 1 << 20, (1 << 20) + 48])
def test_gpu_read_only_reads_every_16_bytes(nbytes):
    """Zeros but one 16-byte piece, whose first word the kernel's sink test looks for: wherever the
    piece lies (the first, the last of the grid's strides, the odd one out), the sink must see it."""
    magic = 0x9E3779B9 - (1 << 32)  # as an int32
    n16 = nbytes // 16
    for piece in sorted({0, n16 // 2, n16 - 1}):
        data = torch.zeros(nbytes // 4, dtype=torch.int32, device="cuda")
        data[4 * piece] = magic
        sink = torch.full((1,), -1, dtype=torch.int32, device="cuda")
        bench.read_only(data, sink)()
        torch.cuda.synchronize()
        assert int(sink.item()) == magic, f"piece {piece} of {n16} not read"
    quiet = torch.full((1,), -1, dtype=torch.int32, device="cuda")
    bench.read_only(torch.zeros(nbytes // 4, dtype=torch.int32, device="cuda"), quiet)()
    assert int(quiet.item()) == -1


def test_timing_keeps_the_spread():
    t = bench.Timing.of([0.012, 0.010, 0.011], clock="gpu")
    assert t.median == pytest.approx(0.011) and t.spread == pytest.approx([0.010, 0.011, 0.012])
    with pytest.raises(ValueError, match="at least one sample"):
        bench.Timing.of([], clock="gpu")


def test_record_says_which_clock_and_keeps_spread_and_host_time():
    run = bench.BenchRun.__new__(bench.BenchRun)  # recording needs no GPU
    run.rows = []
    gpu = bench.Timing.of([2e-3, 3e-3, 4e-3], clock="gpu")
    host = bench.Timing.of([5e-3, 6e-3, 9e-3], clock="host")
    row = run.record("step04", gpu, params={"n": 1}, host=host)
    assert row["ms"] == 3e-3 and row["clock"] == "gpu" and row["spread_ms"] == [2e-3, 3e-3, 4e-3]
    assert row["host_ms"] == 6e-3 and row["host_spread_ms"] == [5e-3, 6e-3, 9e-3]
    assert run.record("cublas", 0.5, params={}, role="baseline")["clock"] == "do_bench"
    assert run.record("xgrammar", 0.5, params={}, role="peer", clock="cpu")["clock"] == "cpu"
    with pytest.raises(ValueError, match="clock must be one of"):
        run.record("x", 0.5, params={}, clock="stopwatch")
    with pytest.raises(ValueError, match="recorded as clock 'host'"):
        run.record("x", gpu, params={}, clock="host")
    with pytest.raises(ValueError, match="role must be one of"):
        run.record("x", 0.5, params={}, role="ours")


def _results_file(root, chapter, rows, gpu="Test GPU", commit="abc"):
    data = {"chapter": chapter, "device": {"name": gpu}, "versions": {"torch": "x", "triton": "y"},
            "date": "2026-01-02T00:00:00+00:00", "git_commit": commit, "command": f"python -m studylog bench {chapter}",
            "ceilings": {"copy_bandwidth_gbs": 3000.0}, "measurements": rows, "schema": 2}
    folder = root / bench.gpu_slug(gpu)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{chapter}.json").write_text(json.dumps(data))


def test_verify_reports_what_moved_and_which_headlines_no_longer_hold(tmp_path, monkeypatch):
    import types

    from studylog import chapter
    from studylog.chapter import Chapter

    def headline(results):
        return [{"kernel": "step02", "baseline": "torch", "case": f"n = {n}",
                 "speedup": results.ms("torch", n=n) / results.ms("step02", n=n)} for n in (1, 2)]

    demo = types.ModuleType("studylog_demo_chapter")
    demo.CHAPTER = Chapter("demo", 9, "Demo", (), (), headline=headline)
    monkeypatch.setitem(sys.modules, "studylog_demo_chapter", demo)
    monkeypatch.setitem(chapter.CHAPTERS, "demo", "studylog_demo_chapter")

    def rows(step_ms):
        return [{"series": s, "role": r, "params": {"n": n}, "ms": ms, "clock": "gpu"}
                for n in (1, 2) for s, r, ms in (("torch", "baseline", 1.0), ("step02", "kernel", step_ms[n]))]

    committed, fresh = tmp_path / "committed", tmp_path / "fresh"
    _results_file(committed, "demo", rows({1: 0.10, 2: 0.10}))
    _results_file(fresh, "demo", rows({1: 0.11, 2: 0.20}))  # n=1 within 15%, n=2 twice as slow
    report = verify.verify(fresh, committed)
    (entry,) = report["files"]
    assert entry["same_gpu"] and entry["rows_compared"] == 4
    assert [(m["series"], m["params"]["n"]) for m in entry["moved"]] == [("step02", 2)]
    holds = {h["case"]: h["holds"] for h in entry["headlines"]}
    assert holds == {"n = 1": True, "n = 2": False}
    text = verify.verify_markdown(report)
    assert "**no**" in text and "step02" in text
    # the command line: exit status 3 when a headline no longer holds, and the report files
    from studylog.__main__ import main

    monkeypatch.setattr(bench, "DEFAULT_OUT", committed)
    monkeypatch.setattr(verify.verify, "__defaults__", (committed,))
    assert main(["bench", "verify", str(fresh), "--report", str(tmp_path / "out" / "verify")]) == 3
    assert (tmp_path / "out" / "verify.md").read_text().startswith("# bench verify")
    with pytest.raises(ValueError, match="no results files"):
        verify.verify(tmp_path / "empty", committed)


@pytest.mark.gpu
def test_gpu_time_and_host_time_tell_a_slow_host_from_a_slow_kernel():
    """A kernel behind a slow host: its GPU time stays the kernel's, its host time per call shows the host;
    each is three repetitions, kept as [min, median, max]."""
    import time
    run = bench.BenchRun("env", command="test")
    b = torch.empty(1024, device="cuda")

    def slow_host():
        time.sleep(200e-6)
        b.mul_(1.0)
    gpu = run.gpu_time(lambda: [slow_host])
    host = run.host_time(slow_host, calls=50)
    assert gpu.clock == "gpu" and host.clock == "host" and len(gpu.samples) == len(host.samples) == 3
    assert gpu.median < 0.05 < 0.2 <= host.median, (gpu, host)
    assert run.empty_launch_host.median < host.median
    row = run.measure("demo", lambda: [lambda: b.mul_(1.0)], params={}, host=lambda: b.mul_(1.0))
    assert row["clock"] == "gpu" and row["spread_ms"][0] <= row["ms"] <= row["spread_ms"][2] and row["host_ms"] > 0


def test_headline_row_takes_both_times_their_spread_and_the_host_time(tmp_path):
    rows = [{"series": "step04", "role": "kernel", "params": {"n": 1}, "ms": 0.010, "clock": "gpu",
             "spread_ms": [0.009, 0.010, 0.012], "host_ms": 0.020},
            {"series": "torch", "role": "baseline", "params": {"n": 1}, "ms": 0.100, "clock": "gpu",
             "spread_ms": [0.095, 0.100, 0.110]},
            {"series": "torch_eager", "role": "baseline", "params": {"n": 1}, "ms": 0.200, "clock": "do_bench"}]
    _results_file(tmp_path, "demo", rows)
    res = plotting.load_results("demo", root=tmp_path)
    row = plotting.headline_row(res, "step04", "torch", "n = 1", n=1)
    assert row["speedup"] == pytest.approx(10.0) and row["clock"] == "gpu" and row["host_ms"] == 0.020
    assert row["speedup_range"] == pytest.approx([0.095 / 0.012, 0.110 / 0.009])
    with pytest.raises(ValueError, match="not the same clock"):
        plotting.headline_row(res, "step04", "torch_eager", "n = 1", n=1)
    with pytest.raises(KeyError, match="0 and 0 rows"):
        plotting.headline_row(res, "step04", "torch", "n = 2", n=2)


def test_verify_says_when_two_runs_share_no_clock(tmp_path, monkeypatch):
    row = {"series": "copy", "role": "baseline", "params": {"bytes": 1}, "ms": 1.0}
    _results_file(tmp_path / "committed", "env", [row | {"clock": "do_bench"}])
    _results_file(tmp_path / "fresh", "env", [row | {"clock": "gpu"}])
    report = verify.verify(tmp_path / "fresh", tmp_path / "committed")
    (entry,) = report["files"]
    assert entry["rows_compared"] == 0 and entry["committed_clocks"] == ["do_bench"] and entry["fresh_clocks"] == ["gpu"]
    assert "Nothing to compare" in verify.verify_markdown(report)
    from studylog.__main__ import main

    monkeypatch.setattr(verify.verify, "__defaults__", (tmp_path / "committed",))
    assert main(["bench", "verify", str(tmp_path / "fresh")]) == 3


def test_collector_paused_turns_the_collector_off_and_back():
    import gc

    from studylog.bench import collector_paused

    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(KeyError):
        with collector_paused():
            raise KeyError("inside")
    assert gc.isenabled(), "an exception inside the block must not leave the collector off"
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled(), "a collector that was off before stays off"
    finally:
        gc.enable()


def test_a_lab_output_is_read_back_where_load_lab_looks(tmp_path):
    from studylog.bench import write_lab_output
    from studylog.plotting import load_lab

    data = {"rows": [{"ms": 1.5}], "gpu": "NVIDIA H100 80GB HBM3"}
    path = write_lab_output(tmp_path / "decode" / "results", data["gpu"], "gc_pauses", data)
    assert path == tmp_path / "decode" / "results" / "nvidia-h100-80gb-hbm3" / "gc_pauses.json"
    assert load_lab("decode", "gc_pauses", gpu="nvidia-h100-80gb-hbm3", root=tmp_path) == data
