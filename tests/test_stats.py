"""Loader statistics and the bottleneck verdict."""
import time

import numpy as np
import pytest

import fastload as fl


class SlowDataset(fl.Dataset):
    def __init__(self, n, delay):
        self.n, self.delay = n, delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.delay)
        return np.full(8, i, dtype=np.float32)


@pytest.mark.parametrize("workers", [0, 2])
def test_slow_training_loop_is_not_a_loader_bottleneck(workers):
    loader = fl.DataLoader(fl.ArrayDataset(np.zeros((64, 8), np.float32)), batch_size=4,
                           num_workers=workers)
    for _ in loader:
        time.sleep(0.01)  # the "training step"
    stats = loader.stats()
    assert stats.batches == 16
    assert not stats.is_bottleneck
    assert "not the bottleneck" in stats.verdict
    assert stats.step_seconds >= 0.15
    assert stats.batches_per_second > 0


@pytest.mark.parametrize("workers", [0, 2])
def test_slow_dataset_is_the_bottleneck(workers):
    loader = fl.DataLoader(SlowDataset(24, 0.01), batch_size=4, num_workers=workers)
    for _ in loader:
        pass
    stats = loader.stats()
    assert stats.is_bottleneck
    assert stats.verdict.startswith("data loading is the bottleneck")
    assert stats.wait_seconds > 0.03


def test_worker_stats_and_occupancy():
    loader = fl.DataLoader(SlowDataset(16, 0.002), batch_size=4, num_workers=2)
    it = iter(loader)
    held = [next(it) for _ in range(2)]
    stats = it.stats()
    assert len(stats.workers) == 2
    assert sum(w.batches for w in stats.workers) >= 2
    assert sum(w.fetch_seconds for w in stats.workers) >= 2 * 4 * 0.002
    assert stats.slots_leased >= 2  # the two held batches keep their slots
    assert stats.pool_bytes > 0
    as_dict = stats.as_dict()
    assert as_dict["batches"] == 2 and len(as_dict["workers"]) == 2
    assert "worker 0" in str(stats)
    del held, it


def test_stats_is_none_before_iterating():
    assert fl.DataLoader(SlowDataset(2, 0), batch_size=1).stats() is None
