"""python -m fastload doctor: the checks, their verdicts, the exit code."""
import json
import os
import subprocess
import sys

import pytest

from fastload import _cpus, _doctor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKS = {"cpus", "start_method", "shared_memory", "kernel", "workers", "torch"}


def run_doctor(*args, script=None):
    env = dict(os.environ, PYTHONPATH=ROOT)
    command = [sys.executable, "-c", script] if script else [sys.executable, "-m", "fastload",
                                                             "doctor", *args]
    return subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.timeout(60)
def test_doctor_passes_on_this_machine_and_reports_every_check():
    result = run_doctor("--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True
    checks = {c["name"]: c for c in report["checks"]}
    assert set(checks) == CHECKS
    for check in checks.values():
        assert check["status"] in ("OK", "WARN")
        assert check["summary"] and check["advice"]
    assert checks["kernel"]["status"] == "OK"
    assert checks["kernel"]["details"]["round_trip_s"] > 0
    assert checks["cpus"]["details"]["affinity"] == len(os.sched_getaffinity(0))
    assert checks["shared_memory"]["details"]["available_bytes"] > 0


@pytest.mark.timeout(60)
def test_doctor_text_output_has_a_status_and_advice_per_check():
    result = run_doctor()
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2 * len(CHECKS)
    for verdict, advice in zip(lines[::2], lines[1::2]):
        status, name = verdict.split()[:2]
        assert status in ("OK", "WARN") and name in CHECKS
        assert advice.strip().startswith("->")


def test_a_broken_kernel_mechanism_fails_and_sets_the_exit_code(monkeypatch, capsys):
    def no_memfd(size):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(_doctor.shm, "Segment", no_memfd)
    monkeypatch.setattr(_doctor, "CHECKS", (_doctor.check_cpus, _doctor.check_kernel))
    kernel = _doctor.check_kernel()
    assert kernel.status == "FAIL"
    assert "Function not implemented" in kernel.summary
    assert "num_workers=0" in kernel.advice
    assert _doctor.main() == 1
    assert "FAIL  kernel" in capsys.readouterr().out


@pytest.mark.parametrize("available, status", [(16 << 20, "FAIL"), (512 << 20, "WARN")])
def test_little_shared_memory_is_reported(monkeypatch, available, status):
    monkeypatch.setattr(_doctor.shm, "available", lambda: available)
    check = _doctor.check_shared_memory()
    assert check.status == status
    assert f"{available >> 20} MiB for new segments" in check.summary


def test_a_single_cpu_warns(monkeypatch):
    monkeypatch.setattr(_cpus, "usable_cpus", lambda: (1, 8, None))
    check = _doctor.check_cpus()
    assert check.status == "WARN"
    assert "1 of 8 CPUs" in check.summary and "num_workers=0" in check.advice


def test_workers_slower_than_none_say_so_and_what_to_use(monkeypatch):
    monkeypatch.setattr(_doctor, "batches_per_second", lambda workers: 1000.0 if workers else 5000.0)
    check = _doctor.check_workers()
    assert "1,000/s with 2 workers, 5,000/s with none (slower with workers)" in check.summary
    assert "about 1 ms" in check.summary
    assert "num_workers=0 where a batch takes less than about 1 ms" in check.advice


def test_the_workers_check_measures_both_ways():
    assert _doctor.batches_per_second(0) > 0 and _doctor.batches_per_second(2) > 0
