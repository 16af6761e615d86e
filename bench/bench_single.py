"""Single-process loading of small samples: fastload vs a pure-Python loop vs torch.

One epoch over an ArrayDataset of N samples (64 float32 features and an int64
label each), shuffled, in batches of 256, without worker processes.

    PYTHONPATH=. python -m pytest bench/bench_single.py --benchmark-only
    PYTHONPATH=. python bench/bench_single.py [--rounds 15] [--json out.json]

The script mode runs the contenders in alternation (so drifting machine load
hits all of them alike), reports the median epoch time of each and the ratio
of each to fastload.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import numpy as np
import pytest

import fastload as fl
from fastload._torch import torch_or_none

SAMPLES = 16384
FEATURES = 64
BATCH = 256


def make_arrays() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((SAMPLES, FEATURES), dtype=np.float32)
    y = rng.integers(0, 10, SAMPLES, dtype=np.int64)
    return x, y


class PerSample(fl.Dataset):
    """The same rows through __getitem__ only: fastload's generic collate path."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = x, y

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.int64]:
        return self.x[i], self.y[i]

    def __len__(self) -> int:
        return len(self.x)


def _loader_epoch(loader):
    """An epoch of any loader yielding (features, labels) batches."""

    def epoch() -> int:
        count = 0
        for features, labels in loader:
            count += len(labels)
        return count

    return epoch


def fastload_epoch(x: np.ndarray, y: np.ndarray):
    return _loader_epoch(fl.DataLoader(fl.ArrayDataset(x, y), batch_size=BATCH, shuffle=True,
                                       generator=0))


def fastload_per_sample_epoch(x: np.ndarray, y: np.ndarray):
    return _loader_epoch(fl.DataLoader(PerSample(x, y), batch_size=BATCH, shuffle=True,
                                       generator=0))


def baseline_epoch(x: np.ndarray, y: np.ndarray):
    """What a loader without batched fetching does: one sample at a time."""
    ds = fl.ArrayDataset(x, y)
    rng = np.random.default_rng(0)

    def epoch() -> int:
        order = rng.permutation(len(ds)).tolist()
        count = 0
        for start in range(0, len(order), BATCH):
            samples = [ds[i] for i in order[start : start + BATCH]]
            features = np.stack([s[0] for s in samples])
            labels = np.stack([s[1] for s in samples])
            count += len(labels) + 0 * features.shape[0]
        return count

    return epoch


def torch_epoch(x: np.ndarray, y: np.ndarray):
    torch = torch_or_none()
    if torch is None:
        return None
    from torch.utils import data as td

    ds = td.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    return _loader_epoch(td.DataLoader(ds, batch_size=BATCH, shuffle=True,
                                       generator=torch.Generator().manual_seed(0)))


CONTENDERS = {
    "fastload": fastload_epoch,
    "fastload_per_sample": fastload_per_sample_epoch,
    "python_baseline": baseline_epoch,
    "torch": torch_epoch,
}


@pytest.fixture(scope="module")
def arrays():
    return make_arrays()


@pytest.mark.parametrize("name", list(CONTENDERS))
def test_epoch(benchmark, arrays, name):
    epoch = CONTENDERS[name](*arrays)
    if epoch is None:
        pytest.skip("torch is not installed")
    benchmark.group = f"one epoch, {SAMPLES} samples, batch {BATCH}"
    assert benchmark(epoch) == SAMPLES


def versions() -> dict[str, str]:
    found = {"python": platform.python_version(), "numpy": np.__version__,
             "fastload": fl.__version__, "machine": platform.machine()}
    torch = torch_or_none()
    if torch is not None:
        found["torch"] = torch.__version__
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args()

    x, y = make_arrays()
    epochs = {name: make(x, y) for name, make in CONTENDERS.items()}
    epochs = {name: epoch for name, epoch in epochs.items() if epoch is not None}
    times: dict[str, list[float]] = {name: [] for name in epochs}
    for epoch in epochs.values():
        epoch()  # warm-up: imports, caches, first allocations
    for _ in range(args.rounds):
        for name, epoch in epochs.items():
            start = time.perf_counter()
            epoch()
            times[name].append(time.perf_counter() - start)

    medians = {name: statistics.median(t) for name, t in times.items()}
    print(" ".join(f"{k}={v}" for k, v in versions().items()))
    print(f"one epoch: {SAMPLES} samples of {FEATURES} float32 + int64 label, "
          f"batch {BATCH}, shuffled, single process; median of {args.rounds} rounds")
    print(f"{'contender':<22}{'epoch ms':>10}{'us/batch':>10}{'samples/s':>14}{'vs fastload':>13}")
    batches = -(-SAMPLES // BATCH)
    for name, median in medians.items():
        print(f"{name:<22}{median * 1e3:>10.2f}{median / batches * 1e6:>10.1f}"
              f"{SAMPLES / median:>14,.0f}{median / medians['fastload']:>12.1f}x")
    ratio = medians["python_baseline"] / medians["fastload"]
    print(f"fastload is {ratio:.1f}x the pure-Python baseline (target: at least 5x)")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"versions": versions(), "samples": SAMPLES, "batch": BATCH,
                       "rounds": args.rounds, "times_s": times, "median_s": medians}, out,
                      indent=2)


if __name__ == "__main__":
    sys.exit(main())
