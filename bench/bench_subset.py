"""Per-batch cost of a Subset with a large index list, with and without workers (issue 12).

    PYTHONPATH=. python bench/bench_subset.py [--rounds 7] [--batches 200] [--json FILE]

``random_split`` of a 1,000,000-row ArrayDataset gives a Subset of 540,000
list indices; the loader takes ``--batches`` shuffled batches of 64 from it,
with 0 and 2 workers (persistent, so process start-up is not counted: the
first batches of each round are taken before the clock starts). The
contenders alternate round by round; the report gives the median seconds
per batch of each and the ratio of the worker loader to the in-process one.
Issue 12's target: within 2x.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import fastload as fl

ROWS = 1_000_000
SPLIT = 0.54
BATCH = 64
WARM_BATCHES = 8


def make_subset() -> fl.Subset:
    features = np.random.default_rng(0).standard_normal((ROWS, 16), dtype=np.float32)
    dataset = fl.ArrayDataset(features, np.arange(ROWS))
    first, _ = fl.random_split(dataset, [SPLIT, 1 - SPLIT], generator=0)
    return first


def seconds_per_batch(iterator, batches: int) -> float:
    for _ in range(WARM_BATCHES):
        next(iterator)
    started = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return (time.perf_counter() - started) / batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    subset = make_subset()
    loaders = {
        workers: fl.DataLoader(subset, batch_size=BATCH, shuffle=True, generator=1,
                               num_workers=workers, persistent_workers=workers > 0)
        for workers in (0, 2)
    }
    timings: dict[int, list[float]] = {0: [], 2: []}
    for round_number in range(args.rounds):
        order = (0, 2) if round_number % 2 == 0 else (2, 0)
        for workers in order:
            timings[workers].append(seconds_per_batch(iter(loaders[workers]), args.batches))
    medians = {w: statistics.median(t) for w, t in timings.items()}
    ratio = medians[2] / medians[0]
    print(f"Subset of {len(subset)} list indices, batches of {BATCH}, "
          f"median of {args.rounds} rounds of {args.batches} batches")
    for workers, value in medians.items():
        print(f"  num_workers={workers}: {value * 1e6:8.1f} us per batch")
    print(f"  2 workers / 0 workers: {ratio:.2f}x (target: within 2x) "
          f"{'MET' if ratio <= 2 else 'MISSED'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"timings": timings, "medians": medians, "ratio": ratio}, f, indent=1)


if __name__ == "__main__":
    main()
