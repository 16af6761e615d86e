"""Thread workers against worker processes and num_workers=0 (issue 18).

    PYTHONPATH=. python bench/bench_threads.py [--repeats 5] [--duration 2] [--workers 2]

Two workloads: ``small-rows`` (an ArrayDataset of 65536 rows of 16 float32
and an int64 label, batches of 64: the work is a gather, which fastload does
in C without the GIL) and ``augment`` (the per-sample Python crop, flip and
normalisation of ``python -m fastload bench``). Contenders: fastload with
``worker_method="thread"``, with worker processes (both persistent, shuffled)
and with no workers; for small-rows also a single-core ``np.take`` of the
same rows, the copy's ceiling. Each repeat measures every contender once,
in rotating order, in this process (one loader alive at a time), for
``--duration`` seconds after a warm-up; the table gives medians over the
repeats and ratios paired within each repeat.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import fastload as fl
from fastload._bench.workloads import AugmentDataset, _augment_sources, _fastload_rng

WARMUP_SECONDS = 0.3


def small_rows() -> fl.ArrayDataset:
    count = 65536
    rng = np.random.default_rng(0)
    return fl.ArrayDataset(rng.standard_normal((count, 16), dtype=np.float32),
                           rng.integers(0, 1000, count, dtype=np.int64))


def augment() -> AugmentDataset:
    images, labels = _augment_sources()
    return AugmentDataset(images, labels, _fastload_rng)


WORKLOADS: dict[str, tuple[Callable[[], Any], int]] = {
    "small-rows": (small_rows, 64),
    "augment": (augment, 128),
}


def loader_rate(dataset: Any, batch_size: int, duration: float, **kwargs: Any) -> float:
    """Samples/s of a persistent shuffled loader over ``duration`` seconds, after
    a warm-up (batches of arrays: a tuple, or a dict)."""
    loader = fl.DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=0,
                           persistent_workers=kwargs.get("num_workers", 0) > 0, **kwargs)
    return measured_rate(loader, duration, lambda batch: len(
        next(iter(batch.values())) if isinstance(batch, dict) else batch[0]))


def measured_rate(loader: Any, duration: float, count: Callable[[Any], int]) -> float:
    """``count(batch)`` summed per second while ``loader`` is drained, epoch
    after epoch, for ``duration`` seconds after a warm-up; the loader is
    dropped at the end (its workers with it)."""
    total, started, measuring = 0, time.perf_counter(), False
    while True:
        for batch in loader:
            now = time.perf_counter()
            if not measuring and now - started >= WARMUP_SECONDS:
                total, started, measuring = 0, now, True
            elif measuring:
                total += count(batch)
                if now - started >= duration:
                    del loader, batch
                    gc.collect()
                    return total / (now - started)


def take_rate(dataset: fl.ArrayDataset, batch_size: int, duration: float) -> float:
    """Samples/s of np.take of the same rows in this thread: the copy's ceiling."""
    features, labels = dataset.arrays
    rng = np.random.default_rng(0)
    samples, started = 0, time.perf_counter()
    while True:
        order = rng.permutation(len(features))
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
            np.take(features, rows, axis=0)
            np.take(labels, rows, axis=0)
            samples += len(rows)
            if samples % (batch_size * 64) == 0 and time.perf_counter() - started >= duration:
                return samples / (time.perf_counter() - started)


def method_arguments(doc: str) -> argparse.Namespace:
    """The arguments of the benches that compare worker methods (this one
    and bench_main_loop): --repeats, --duration, --workers."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--workers", type=int, default=2)
    return parser.parse_args()


def main() -> None:
    args = method_arguments(__doc__)
    workers = args.workers
    contenders: dict[str, dict[str, Any]] = {
        "thread": dict(num_workers=workers, worker_method="thread"),
        "process": dict(num_workers=workers),
        "0 workers": {},
    }
    for name, (make, batch_size) in WORKLOADS.items():
        dataset = make()
        names = [*contenders, *(["np.take"] if name == "small-rows" else [])]
        rates: dict[str, list[float]] = {c: [] for c in names}
        for repeat in range(args.repeats):
            shift = repeat % len(names)
            for contender in names[shift:] + names[:shift]:
                if contender == "np.take":
                    rate = take_rate(dataset, batch_size, args.duration)
                else:
                    rate = loader_rate(dataset, batch_size, args.duration,
                                       **contenders[contender])
                rates[contender].append(rate)
        print(f"\n{name} (batch {batch_size}, {workers} workers, {args.repeats} repeats, "
              f"{args.duration:g} s each): median samples/s")
        for contender in names:
            print(f"  {contender:<10} {statistics.median(rates[contender]):>12,.0f}")

        def ratio(a: str, b: str) -> float:
            return statistics.median(x / y for x, y in zip(rates[a], rates[b]))

        pairs = [("thread", "process"), ("thread", "0 workers"), ("process", "0 workers")]
        if name == "small-rows":
            pairs.append(("thread", "np.take"))
        for a, b in pairs:
            print(f"  {a} / {b}: {ratio(a, b):.2f}x")


if __name__ == "__main__":
    main()
