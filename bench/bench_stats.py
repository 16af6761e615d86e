"""Overhead of the always-on loader statistics (fastload._stats).

    PYTHONPATH=. python bench/bench_stats.py [--rounds 7] [--json FILE]

Per batch, the main process reads the clock twice in ``BaseIter.__next__``
and adds to a LoaderStats; a worker reads it twice more, sends two floats in
its DONE message, and the main process adds them to a WorkerStats. This
script measures

1. ``BaseIter.__next__`` around a ``_next_data`` that returns a ready batch
   (a real iterator, its ``_next_data`` replaced on the instance): the
   statistics of the main process plus the counters beside them, so an
   upper bound of what the statistics cost there;
2. the worker's share: two clock reads, ``WorkerStats.add``, and pickling and
   unpickling a DONE message with its two floats against one without;
3. the time per batch of the fastest real loops, ``rows`` with batches of
   256 and 16, 0 and 2 workers, by the benchmark runner (fresh processes);

and reports (1), and (1) + (2) with workers, as a share of (3).
"""
from __future__ import annotations

import argparse
import json
import pickle
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

import fastload as fl
from fastload._bench import runner
from fastload._protocol import DONE
from fastload._stats import WorkerStats

CALLS = 100_000
BATCH_SIZES = (256, 16)


def per_call(function: Callable[[], object], rounds: int) -> float:
    """Median seconds per call of ``function`` over ``rounds`` rounds of CALLS."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(CALLS):
            function()
        times.append((time.perf_counter() - start) / CALLS)
    return statistics.median(times)


def main_process_cost(rounds: int) -> float:
    """Seconds per batch that ``BaseIter.__next__`` adds around ``_next_data``."""
    loader = fl.DataLoader(fl.ArrayDataset(np.zeros((4, 1), np.float32)), batch_size=1)
    batches = iter(loader)
    batch = next(batches)
    batches._next_data = lambda: batch  # type: ignore[method-assign]
    wrapped = per_call(lambda: next(batches), rounds)
    bare = per_call(lambda: batches._next_data(), rounds)  # the same lambda layer
    return wrapped - bare


def worker_cost(rounds: int) -> float:
    """Seconds per batch of the worker's statistics, as the sum of their parts."""
    empty = per_call(lambda: None, rounds)  # the lambda layer, not the worker's
    clock = (per_call(lambda: time.perf_counter(), rounds) - empty) * 2
    stats = WorkerStats()
    add = per_call(lambda: stats.add(0.001, 0.002), rounds) - empty
    layout = b"x" * 64  # the size of a two-array layout
    with_floats = (DONE, 12345, layout, 0.001, 0.002, False, None, False)
    without = (DONE, 12345, layout, False, None, False)
    message = per_call(lambda: pickle.loads(pickle.dumps(with_floats, protocol=5)), rounds)
    bare = per_call(lambda: pickle.loads(pickle.dumps(without, protocol=5)), rounds)
    return clock + add + max(0.0, message - bare)


def batch_times(rounds: int) -> dict[tuple[int, int], float]:
    """Seconds per batch of fastload on ``rows`` by (batch size, workers)."""
    found = {}
    for size in BATCH_SIZES:
        plan = runner.Plan(workloads=["rows"], contenders=["fastload"], workers=[0, 2],
                           duration=1.0, repeats=max(1, rounds // 2), memory=False,
                           batch_size=size)
        outcome = runner.run(plan)
        if outcome.failures:
            raise RuntimeError("\n".join(outcome.failures))
        for row in runner.summarize(outcome):
            found[(size, row["workers"])] = size / row["samples_per_s"]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    main_cost = main_process_cost(args.rounds)
    worker = worker_cost(args.rounds)
    batches = batch_times(args.rounds)
    print(" ".join(f"{k}={v}" for k, v in runner.environment().items()))
    print(f"statistics per batch: main process {main_cost * 1e9:.0f} ns "
          f"(__next__'s bookkeeping, an upper bound), worker {worker * 1e9:.0f} ns")
    print(f"{'batch':>6}{'workers':>9}{'us/batch':>10}{'stats ns':>10}{'overhead':>10}")
    rows = []
    for (size, workers), seconds in sorted(batches.items()):
        cost = main_cost + (worker if workers else 0.0)
        rows.append({"batch_size": size, "workers": workers, "batch_s": seconds,
                     "stats_s": cost, "overhead": cost / seconds})
        print(f"{size:>6}{workers:>9}{seconds * 1e6:>10.1f}{cost * 1e9:>10.0f}"
              f"{cost / seconds:>10.2%}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"environment": runner.environment(), "main_process_s": main_cost,
                       "worker_s": worker, "rows": rows}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
