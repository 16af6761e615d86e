"""The main loop's CPU per batch, and what it costs the workers (issue 18).

    PYTHONPATH=. python bench/bench_main_loop.py [--repeats 5] [--duration 2] [--workers 2]

Part 1, main-loop CPU: tiny batches (4 samples of three small arrays, an
``ArrayDataset``, not shuffled, default ``snapshot_every_n_steps``) so that
the workers' part is negligible and what is measured is the loop that hands
batches out: drawing the index, sending the task, reading the answer,
building the views, the bookkeeping. It reports the CPU the consumer spends
per batch over ``--duration`` seconds: for worker processes the whole main
process (``getrusage(RUSAGE_SELF)``); for worker threads the consuming
thread only (``time.thread_time()``; RUSAGE_SELF would add the workers).
``num_workers=0`` is beside them: there the loop also loads the batch.
fastload gathers such small batches of an ``ArrayDataset`` in the main
thread whatever the workers (NOTE [ Small gathers ] in
fastload/_fast_path.py): the ``process`` and ``thread`` lines turn that off,
so that every batch is handed over; the ``gathered`` lines are what
fastload runs.

Part 2, small-row dict batches: a map-style dataset whose samples are dicts
of a 16-float32 array and an int label, batches of 64, shuffled; samples/s
with 2 worker processes, 2 worker threads and none, each repeat in
rotating order, ratios paired within a repeat.
"""
from __future__ import annotations

import gc
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from bench_threads import loader_rate, method_arguments  # one definition of each

import fastload as fl
import fastload._fast_path as fast_path

WARMUP_SECONDS = 0.3
# fastload's own threshold, before the bench turns it off for the handoff.
SMALL_GATHER_BYTES = fast_path.SMALL_GATHER_BYTES


def tiny_arrays() -> fl.ArrayDataset:
    count = 4096
    rng = np.random.default_rng(0)
    return fl.ArrayDataset(rng.standard_normal((count, 4), dtype=np.float32),
                           rng.integers(0, 1000, count, dtype=np.int64),
                           rng.integers(0, 256, (count, 8), dtype=np.uint8))


class DictRows:
    """Small rows as dict samples: default collation of Python samples."""

    def __init__(self, count: int = 65536) -> None:
        rng = np.random.default_rng(0)
        self.features = rng.standard_normal((count, 16), dtype=np.float32)
        self.labels = rng.integers(0, 1000, count).tolist()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"x": self.features[index], "y": self.labels[index]}


def _process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main_loop_cpu(duration: float, clock: Callable[[], float], small_gathers: bool = False,
                  **kwargs: Any) -> float:
    """CPU seconds per batch of ``clock`` while a persistent loader of tiny
    batches is drained for ``duration`` seconds, after a warm-up. Unless
    ``small_gathers``, the workers make every batch: the main process does
    not gather them itself (NOTE [ Small gathers ] in fastload/_fast_path.py,
    which fastload does for these batches), so what is measured is the loop
    that hands batches over."""
    workers = kwargs.get("num_workers", 0)
    fast_path.SMALL_GATHER_BYTES = SMALL_GATHER_BYTES if small_gathers else 0
    loader = fl.DataLoader(tiny_arrays(), batch_size=4, persistent_workers=workers > 0,
                           **kwargs)
    batches, measuring = 0, False
    started = time.perf_counter()
    cpu = clock()
    while True:
        for _ in loader:
            now = time.perf_counter()
            if not measuring and now - started >= WARMUP_SECONDS:
                batches, started, cpu, measuring = 0, now, clock(), True
            elif measuring:
                batches += 1
                if now - started >= duration:
                    spent = clock() - cpu
                    del loader
                    gc.collect()
                    return spent / batches


def main() -> None:
    args = method_arguments(__doc__)
    workers = args.workers

    # "gathered": as fastload runs these batches, the main thread gathering
    # them; the others hand every batch over.
    loops: dict[str, tuple[Callable[[], float], dict[str, Any]]] = {
        "process": (_process_cpu, dict(num_workers=workers)),
        "thread": (time.thread_time, dict(num_workers=workers, worker_method="thread")),
        "0 workers": (time.thread_time, {}),
        "process, gathered": (_process_cpu, dict(num_workers=workers, small_gathers=True)),
        "thread, gathered": (time.thread_time, dict(num_workers=workers, worker_method="thread",
                                                    small_gathers=True)),
    }
    cpu: dict[str, list[float]] = {name: [] for name in loops}
    for repeat in range(args.repeats):
        names = list(loops)
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            clock, kwargs = loops[name]
            cpu[name].append(main_loop_cpu(args.duration, clock, **kwargs))
    print(f"main-loop CPU per batch (batches of 4 samples of 3 small arrays, {workers} "
          f"workers, {args.repeats} repeats, {args.duration:g} s each): median, min")
    for name, values in cpu.items():
        print(f"  {name:<17} {statistics.median(values) * 1e6:7.1f} µs "
              f"{min(values) * 1e6:7.1f} µs")

    contenders: dict[str, dict[str, Any]] = {
        "process": dict(num_workers=workers),
        "thread": dict(num_workers=workers, worker_method="thread"),
        "0 workers": {},
    }
    dataset = DictRows()
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for repeat in range(args.repeats):
        names = list(contenders)
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            rates[name].append(loader_rate(dataset, 64, args.duration, **contenders[name]))
    print(f"\nsmall-row dict batches (batch 64, {workers} workers): median samples/s")
    for name, values in rates.items():
        print(f"  {name:<10} {statistics.median(values):>12,.0f}")
    for name in ("process", "thread"):
        ratio = statistics.median(a / b for a, b in zip(rates[name], rates["0 workers"]))
        print(f"  {name} / 0 workers: {ratio:.2f}x")


if __name__ == "__main__":
    main()
