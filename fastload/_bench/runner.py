"""Runs the benchmark matrix: every measurement in a fresh process.

Each (workload, contender, workers) measurement runs in its own process
(``fastload._bench.measure``), so contenders never share caches, allocators
or imported modules. Within a repeat the contenders of one (workload,
workers) cell run back to back, their order rotated from cell to cell and
repeat to repeat, so that drifting load from the rest of the machine hits
them alike. While a measurement runs, this process samples the PSS of the
measuring process tree (with psutil, when installed). Medians are taken over
repeats; a ratio is the median of the per-repeat ratios, each taken between
measurements that ran next to each other.
"""
from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import fastload
from fastload._bench.contenders import BASELINES, CONTENDERS, REFERENCES, WORKERS_ONLY, without_workers
from fastload._bench.memory import tree_memory
from fastload._bench.workloads import WORKLOADS

# How often the peak memory of a measuring process tree is sampled. A sample
# reads every process's smaps: about 10 ms of CPU for a loader with two
# workers, which at 50 ms took a fifth of a core from the loader under test
# (worker runs lost most, on two cores). The measuring process adds one
# sample of its own after the timed loop (``final_*``).
MEMORY_SAMPLE_SECONDS = 0.5
# A measurement gets this long beyond its duration before it counts as hung.
GRACE_SECONDS = 60.0
# The numbers every measurement reports; medians of them make the summary.
# Memory is PSS and "charged" memory (see fastload._bench.memory): the peak
# over the measurement, the baseline just before the loader started, and the
# difference, what the loader added to the data and the imports (torch's
# are large).
METRICS = ("samples_per_s", "mb_per_s", "first_batch_s", "next_epoch_first_batch_s",
           "stepping_next_epoch_first_batch_s", "batch_interval_s",
           "peak_pss", "baseline_pss", "loader_pss",
           "peak_charged", "baseline_charged", "loader_charged")


# What `python -m fastload bench` measures unless told otherwise, in about a
# minute on two idle cores: small rows, where handing a batch over costs
# more than making it, and decoding JPEG files, where workers pay off; each
# at 0 and 2 workers, three repeats of half a second (the median of three
# paired ratios moves by a few per cent from run to run, where one repeat of
# a second moved by tens), without the later epochs' timings (--epochs),
# which take whole epochs. The other workloads run with --workloads or --all.
DEFAULT_WORKLOADS = ["rows", "jpeg"]
DEFAULT_WORKERS = [0, 2]
DEFAULT_DURATION = 0.5
DEFAULT_REPEATS = 3


# How to install what a workload needs.
INSTALL = {"torch": "pip install 'fastload[bench]'", "PIL": "pip install 'fastload[bench]'",
           "datasets": "pip install 'fastload[frameworks]'",
           "torchvision": "pip install torchvision, the release made for the installed torch"}


@dataclass
class Plan:
    """What to measure."""

    workloads: list[str]
    contenders: list[str]
    workers: list[int]
    duration: float = DEFAULT_DURATION
    repeats: int = DEFAULT_REPEATS
    memory: bool = True
    # None: each workload's own batch size.
    batch_size: int | None = None
    # Time later epochs' first batches (see fastload._bench.measure).
    epochs: bool = False

    def __post_init__(self) -> None:
        unknown = [w for w in self.workloads if w not in WORKLOADS]
        unknown += [c for c in self.contenders if c not in CONTENDERS]
        if unknown:
            raise ValueError(f"unknown workload or contender: {', '.join(unknown)}; "
                             f"workloads are {', '.join(WORKLOADS)}, "
                             f"contenders {', '.join(CONTENDERS)}")
        if any(w < 0 for w in self.workers) or not self.workers:
            raise ValueError(f"workers must be non-negative counts, got {self.workers}")
        if self.duration <= 0 or self.repeats < 1:
            raise ValueError("duration must be positive and repeats at least 1")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch size must be positive, got {self.batch_size}")


@dataclass
class Outcome:
    """Every measurement taken, the contenders left out and why, and what
    ran them."""

    plan: Plan
    measurements: list[dict[str, Any]] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)


def environment() -> dict[str, Any]:
    """Versions and machine facts to print beside the numbers."""
    found: dict[str, Any] = {
        "python": platform.python_version(), "numpy": np.__version__,
        "fastload": fastload.__version__, "machine": platform.machine(),
        "cpus": len(os.sched_getaffinity(0)),
    }
    for name in ("torch", "psutil", "PIL", "datasets", "torchvision"):
        if importlib.util.find_spec(name) is not None:
            found[name] = __import__(name).__version__
    return found


def _spin(count: int) -> float:
    started = time.perf_counter()
    while count:
        count -= 1
    return time.perf_counter() - started


def cpu_capacity(spins: int = 2_000_000) -> float:
    """How many CPUs' worth of pure-Python work this process's CPUs give now,
    one busy process per CPU: their number on an idle machine, less while
    other programs hold some of them. Parallel speed-ups are capped by it."""
    cpus = len(os.sched_getaffinity(0))
    alone = _spin(spins)
    with multiprocessing.get_context("fork").Pool(cpus) as pool:
        together = pool.map(_spin, [spins] * cpus)
    return cpus * alone / max(together)


def schedule(plan: Plan, contenders: list[str]) -> list[dict[str, Any]]:
    """The measurements in the order they run (see the module docstring)."""
    specs = []
    cell_number = 0
    for repeat in range(plan.repeats):
        for name in plan.workloads:
            measured = [c for c in contenders if c not in WORKLOADS[name].without]
            cells = [(w, [c for c in measured if w > 0 or c not in WORKERS_ONLY])
                     for w in plan.workers]
            reference = WORKLOADS[name].reference
            if reference is not None:
                cells.append((0, [reference]))
            for workers, names in cells:
                if not names:
                    continue
                shift = cell_number % len(names)
                cell_number += len(names) > 1  # a reference alone does not rotate
                for contender in names[shift:] + names[:shift]:
                    specs.append({"workload": name, "contender": contender,
                                  "workers": workers, "duration": plan.duration,
                                  "batch_size": plan.batch_size, "epochs": plan.epochs,
                                  "repeat": repeat})
    return specs


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(fastload.__file__)))


def run_one(spec: dict[str, Any], memory: bool) -> dict[str, Any]:
    """Run one measurement in a fresh process; its result, with the peak
    PSS seen when ``memory``. Raises RuntimeError when it fails or hangs."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_package_root(), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="fastload-bench-") as tmp:
        result_path = os.path.join(tmp, "result.json")
        log_path = os.path.join(tmp, "log")
        with open(log_path, "wb") as log:
            child = subprocess.Popen(
                [sys.executable, "-m", "fastload._bench.measure", json.dumps(spec), result_path],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                start_new_session=True)
        peak: dict[str, int] = {}
        deadline = time.monotonic() + spec["duration"] * 10 + GRACE_SECONDS
        try:
            while True:
                try:
                    child.wait(MEMORY_SAMPLE_SECONDS)
                    break
                except subprocess.TimeoutExpired:
                    pass
                seen = tree_memory(child.pid) if memory else None
                for kind, size in (seen or {}).items():
                    peak[kind] = max(peak.get(kind, 0), size)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{describe(spec)} hung; killed")
        finally:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)  # the child and its workers
                child.wait()
        if child.returncode != 0:
            with open(log_path, errors="replace") as log:
                tail = log.read()[-2000:]
            raise RuntimeError(f"{describe(spec)} exited with code {child.returncode}:\n{tail}")
        with open(result_path) as result_file:
            result = json.load(result_file)
    result.update(spec)
    for kind in ("pss", "charged"):
        sampled = [size for size in (peak.get(kind), result.pop(f"final_{kind}", None))
                   if size is not None]
        top, baseline = max(sampled, default=None), result.get(f"baseline_{kind}")
        result[f"peak_{kind}"] = top
        result[f"loader_{kind}"] = None if top is None or baseline is None else top - baseline
    return result


def describe(spec: dict[str, Any]) -> str:
    return f"{spec['workload']} {spec['contender']} workers={spec['workers']}"


def run(plan: Plan, progress: Callable[[int, int, str], None] | None = None) -> Outcome:
    """Take every measurement of ``plan``; ``progress(done, total, label)``
    is called before each one and once at the end."""
    outcome = Outcome(plan, environment=environment())
    outcome.environment["cpu_capacity_before"] = round(cpu_capacity(), 2)
    contenders = list(plan.contenders)
    if importlib.util.find_spec("torch") is None and "torch" in contenders:
        contenders.remove("torch")
        outcome.skipped["torch"] = "torch is not installed"
    for name in list(plan.workloads):
        missing = WORKLOADS[name].missing()
        if missing:
            plan.workloads.remove(name)
            outcome.skipped[name] = "not installed: " + ", ".join(
                f"{module} ({INSTALL[module]})" for module in missing)
    memory = plan.memory and importlib.util.find_spec("psutil") is not None
    if plan.memory and not memory:
        outcome.skipped["memory"] = "psutil is not installed: peak memory not measured"
    specs = schedule(plan, contenders)
    for done, spec in enumerate(specs):
        if progress is not None:
            progress(done, len(specs), describe(spec))
        try:
            outcome.measurements.append(run_one(spec, memory))
        except RuntimeError as exc:
            outcome.failures.append(str(exc))
    outcome.environment["cpu_capacity_after"] = round(cpu_capacity(), 2)
    if progress is not None:
        progress(len(specs), len(specs), "done")
    return outcome


def _key(measurement: dict[str, Any]) -> tuple[str, str, int]:
    return measurement["workload"], measurement["contender"], measurement["workers"]


def _median(values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def paired_ratio(measurements: list[dict[str, Any]], numerator: tuple[str, str, int],
                 denominator: tuple[str, str, int], metric: str = "samples_per_s") -> float | None:
    """Median over repeats of ``metric`` of one (workload, contender,
    workers) over another's, each ratio within one repeat; None when either
    was not measured."""
    by_repeat: dict[int, dict[tuple[str, str, int], float]] = {}
    for m in measurements:
        if m.get(metric) is not None:
            by_repeat.setdefault(m["repeat"], {})[_key(m)] = m[metric]
    ratios = [values[numerator] / values[denominator] for values in by_repeat.values()
              if numerator in values and values.get(denominator)]
    return statistics.median(ratios) if ratios else None


def summarize(outcome: Outcome) -> list[dict[str, Any]]:
    """One row per (workload, contender, workers): the medians of every
    metric, the ratio of samples/s to each baseline at the same number of
    workers and to the same contender without workers, and where the
    workload has a reference (memcpy, np.take) the share of its MB/s."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for m in outcome.measurements:
        groups.setdefault(_key(m), []).append(m)
    rows = []
    for key, group in groups.items():
        workload, contender, workers = key
        row: dict[str, Any] = {"workload": workload, "contender": contender,
                               "workers": workers, "repeats": len(group)}
        for metric in METRICS:
            row[metric] = _median([m.get(metric) for m in group])
        if contender not in REFERENCES:
            row["ratios"] = {
                baseline: paired_ratio(outcome.measurements, key, (workload, baseline, workers))
                for baseline in BASELINES if baseline != contender}
            row["over_0_workers"] = (paired_ratio(outcome.measurements, key,
                                                  (workload, without_workers(contender), 0))
                                     if workers else None)
            reference = WORKLOADS[workload].reference
            if reference is not None:
                row["reference_share"] = paired_ratio(outcome.measurements, key,
                                                      (workload, reference, 0), "mb_per_s")
        rows.append(row)
    order = {name: i for i, name in enumerate([*CONTENDERS, *REFERENCES])}
    rows.sort(key=lambda r: (list(WORKLOADS).index(r["workload"]), r["workers"],
                             order[r["contender"]]))
    return rows
