"""python -m fastload bench: the measurements, their JSON, table, progress,
plot and exit codes."""
import importlib.util
import io
import json
import os
import subprocess
import sys

import pytest

from fastload import __main__ as cli
from fastload._bench import report, runner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_PSUTIL = importlib.util.find_spec("psutil") is not None


def run_cli(*args, timeout=120):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "fastload", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def tiny_bench(tmp_path_factory):
    """One tiny run of the real benchmark: rows, 0 and 2 workers. Batches of
    4096 rows, 16 an epoch: torch's per-batch handoff makes the later epochs
    it times its slowest part (the run took 33 s here, 42 s with batches of
    256)."""
    path = tmp_path_factory.mktemp("bench") / "out.json"
    result = run_cli("bench", "--duration", "0.05", "--repeats", "1", "--epochs",
                     "--workloads", "rows", "--workers", "0,2", "--batch-size", "4096",
                     "--json", str(path))
    return result, path


@pytest.mark.timeout(150)
def test_bench_measures_every_contender_and_writes_json(tiny_bench):
    result, path = tiny_bench
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(path.read_text())
    contenders = ["fastload", "python-mp"] + (["torch"] if HAS_TORCH else [])
    rows = {(r["contender"], r["workers"]): r for r in data["summary"]}
    # Worker threads are measured with workers only (without, they are
    # "fastload"); np.take of the same rows is the small rows' reference.
    assert set(rows) == ({(c, w) for c in contenders for w in (0, 2)}
                         | {("fastload-thread", 2), ("np.take", 0)})
    assert not data["failures"]
    take = rows.pop(("np.take", 0))
    assert take["mb_per_s"] == pytest.approx(take["samples_per_s"] * 264 / 1e6)
    for (contender, workers), row in rows.items():
        assert row["workload"] == "rows" and row["repeats"] == 1
        for metric in ("samples_per_s", "mb_per_s", "first_batch_s", "next_epoch_first_batch_s"):
            assert row[metric] > 0, (contender, workers, metric)
        # 64 float32 features and an int64 label: 264 bytes a sample.
        assert row["mb_per_s"] == pytest.approx(row["samples_per_s"] * 264 / 1e6)
        if HAS_PSUTIL:
            assert row["peak_pss"] > row["baseline_pss"] > 0
        baselines = [b for b in ("torch", "python-mp") if b != contender and b in contenders]
        for baseline in baselines:
            expected = row["samples_per_s"] / rows[(baseline, workers)]["samples_per_s"]
            assert row["ratios"][baseline] == pytest.approx(expected)
        assert row["reference_share"] == pytest.approx(row["mb_per_s"] / take["mb_per_s"])
        if workers:
            alone = rows[("fastload" if contender == "fastload-thread" else contender, 0)]
            expected = row["samples_per_s"] / alone["samples_per_s"]
            assert row["over_0_workers"] == pytest.approx(expected)
    if not HAS_TORCH:
        assert data["skipped"]["torch"] == "torch is not installed"
    environment = data["environment"]
    assert environment["cpus"] >= 1
    for moment in ("before", "after"):
        assert 0 < environment[f"cpu_capacity_{moment}"] <= environment["cpus"] * 1.5
    assert len(data["measurements"]) == len(rows) + 1
    pids = {m["pid"] for m in data["measurements"]}
    assert len(pids) == len(rows) + 1  # one fresh process per measurement


@pytest.mark.timeout(150)
def test_bench_prints_a_table_and_a_progress_bar(tiny_bench):
    result, _ = tiny_bench
    lines = result.stdout.splitlines()
    assert lines[0].split()[:4] == ["workload", "contender", "workers", "samples/s"]
    assert "vs torch" in lines[0] and "vs python-mp" in lines[0]
    body = [line.split() for line in lines[2:] if line.startswith("rows")]
    assert {(cells[1], cells[2]) for cells in body} >= {("fastload", "0"), ("fastload", "2")}
    total = (6 if HAS_TORCH else 4) + 2  # and fastload-thread with 2 workers, np.take
    # Not a terminal: one progress line per measurement, then the last.
    progress = [line for line in result.stderr.splitlines() if line.startswith("[")]
    assert len(progress) == total + 1
    assert progress[-1].startswith(f"[{'#' * report.BAR_WIDTH}] {total}/{total}")


def test_progress_bar_redraws_in_place_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    out = Terminal()
    bar = report.ProgressBar(out)
    bar(0, 4, "rows fastload workers=0")
    bar(2, 4, "rows torch workers=0")
    bar(4, 4, "done")
    text = out.getvalue()
    assert text.count("\r") == 3 and text.endswith("\n") and text.count("\n") == 1
    assert "] 2/4" in text and "#" * (report.BAR_WIDTH // 2) + "." in text


def test_plot_without_matplotlib_fails_before_measuring(monkeypatch, capsys):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a))
    monkeypatch.setattr(runner, "run", lambda *a, **k: pytest.fail("measured anyway"))
    assert cli.main(["bench", "--plot", "out.png"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "matplotlib" in err and "fastload[plot]" in err


def fake_outcome():
    plan = runner.Plan(workloads=["rows"], contenders=["fastload", "torch"], workers=[2],
                       duration=0.1, memory=False)
    outcome = runner.Outcome(plan, environment={"python": "3"})
    for contender, rate in (("fastload", 1000.0), ("torch", 100.0)):
        outcome.measurements.append({
            "workload": "rows", "contender": contender, "workers": 2, "repeat": 0,
            "samples_per_s": rate, "mb_per_s": rate * 264e-6, "first_batch_s": 0.01,
            "next_epoch_first_batch_s": 0.001, "peak_pss": None, "baseline_pss": None})
    return outcome


def test_plot_draws_a_png_with_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "bench.png"
    report.plot(fake_outcome(), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_failed_measurement_exits_non_zero(monkeypatch, capsys):
    def fail(spec, memory):
        raise RuntimeError(f"{runner.describe(spec)} exited with code 1:\nboom")

    monkeypatch.setattr(runner, "run_one", fail)
    code = cli.main(["bench", "--workloads", "rows", "--workers", "0", "--quiet",
                     "--contenders", "fastload"])
    assert code == cli.EXIT_FAILED
    assert "FAILED: rows fastload workers=0 exited with code 1" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--workloads", "rows,video"], "unknown workload or contender: video"),
    (["--contenders", "dali"], "unknown workload or contender: dali"),
    (["--workers", "-1"], "workers must be non-negative"),
    (["--duration", "0"], "duration must be positive"),
])
def test_bad_options_exit_with_usage_error(capsys, args, message):
    assert cli.main(["bench", *args]) == cli.EXIT_USAGE
    assert message in capsys.readouterr().err


def test_schedule_rotates_contenders_and_adds_the_references():
    plan = runner.Plan(workloads=["rows", "large"], contenders=["fastload", "torch", "python-mp"],
                       workers=[0, 2], repeats=3)
    specs = runner.schedule(plan, plan.contenders)
    assert len(specs) == 3 * (2 * 2 * 3 + 2)
    for workload, reference in (("large", "memcpy"), ("rows", "np.take")):
        assert [s for s in specs if s["contender"] == reference] == [
            {"workload": workload, "contender": reference, "workers": 0,
             "duration": runner.DEFAULT_DURATION, "batch_size": None, "epochs": False,
             "repeat": r} for r in range(3)]
    cells: dict = {}
    for spec in specs:
        if spec["contender"] not in ("memcpy", "np.take"):
            key = (spec["workload"], spec["workers"], spec["repeat"])
            cells.setdefault(key, []).append(spec["contender"])
    firsts = [order[0] for order in cells.values()]
    assert all(sorted(order) == sorted(plan.contenders) for order in cells.values())
    assert set(firsts) == set(plan.contenders)  # every contender goes first somewhere


def test_ratios_pair_measurements_of_the_same_repeat():
    measurements = [
        {"workload": "rows", "contender": c, "workers": 2, "repeat": r, "samples_per_s": v}
        for r, (a, b) in enumerate([(10.0, 5.0), (30.0, 10.0), (8.0, 8.0)])
        for c, v in (("fastload", a), ("torch", b))]
    # Per repeat: 2, 3, 1; the median of ratios, not the ratio of medians (10/8).
    assert runner.paired_ratio(measurements, ("rows", "fastload", 2), ("rows", "torch", 2)) == 2.0
    assert runner.paired_ratio(measurements, ("rows", "fastload", 2), ("rows", "torch", 0)) is None
    table = report.table(fake_outcome())
    assert "10.00x" in table.splitlines()[2]


def test_the_table_says_when_workers_are_slower_and_what_to_use():
    plan = runner.Plan(workloads=["rows", "images"], contenders=["fastload"], workers=[0, 2],
                       duration=0.1, memory=False)
    outcome = runner.Outcome(plan, environment={"python": "3"})
    for workload, rates in (("rows", (5000.0, 1000.0)), ("images", (100.0, 190.0))):
        for workers, rate in zip((0, 2), rates):
            outcome.measurements.append({
                "workload": workload, "contender": "fastload", "workers": workers, "repeat": 0,
                "samples_per_s": rate, "mb_per_s": None, "first_batch_s": 0.01})
    notes = [line for line in report.table(outcome).splitlines()
             if line.startswith("SLOWER WITH WORKERS")]
    assert len(notes) == 1
    assert "rows through fastload with 2 workers loads 0.20x" in notes[0]
    assert "use num_workers=0" in notes[0]


def test_the_memmap_workload_writes_its_file_once_and_reads_rows_from_it(monkeypatch, tmp_path):
    from fastload._bench import workloads

    monkeypatch.setattr(workloads, "MEMMAP_ROWS", 5000)  # not 1 GiB in a unit test
    monkeypatch.setattr(workloads.tempfile, "gettempdir", lambda: str(tmp_path))
    rows, labels = workloads.WORKLOADS["memmap"].make_arrays()
    path = workloads.memmap_path()
    assert isinstance(rows, workloads.np.memmap) and rows.shape == (5000, workloads.MEMMAP_WIDTH)
    assert rows[4999].min() == rows[4999].max() == 4999 and len(labels) == 5000
    written = os.stat(path).st_mtime_ns
    again, _ = workloads.WORKLOADS["memmap"].make_arrays()
    assert os.stat(path).st_mtime_ns == written and os.listdir(tmp_path) == [os.path.basename(path)]
    dataset = workloads.WORKLOADS["memmap"].dataset("fastload", (again, labels))
    assert dataset[[3, 7]][0][:, 0].tolist() == [3.0, 7.0]


def test_worker_threads_are_measured_with_workers_only():
    plan = runner.Plan(workloads=["rows"], contenders=["fastload", "fastload-thread"],
                       workers=[0, 2], repeats=2)
    specs = runner.schedule(plan, plan.contenders)
    measured = sorted({(s["contender"], s["workers"]) for s in specs})
    assert measured == [("fastload", 0), ("fastload", 2), ("fastload-thread", 2), ("np.take", 0)]
    assert len(specs) == 2 * 4
    only_threads = runner.Plan(workloads=["rows"], contenders=["fastload-thread"],
                               workers=[0, 2])
    assert [s["workers"] for s in runner.schedule(only_threads, only_threads.contenders)
            if s["contender"] != "np.take"] == [2] * runner.DEFAULT_REPEATS
