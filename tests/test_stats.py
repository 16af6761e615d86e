"""Loader statistics and the bottleneck verdict."""
import time

import numpy as np
import pytest

import fastload as fl
from fastload._stats import WorkerStats


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


def busy_loop_stats(wait_ms_per_batch, work_ms_per_batch, batches=100):
    """Stats of a loop that only waited, fed by two workers."""
    half, work = batches // 2, work_ms_per_batch * batches / 2e3
    workers = [WorkerStats(batches=half, fetch_seconds=work / 2, collate_seconds=work / 2)
               for _ in range(2)]
    return fl.LoaderStats(batches=batches, wait_seconds=wait_ms_per_batch * batches / 1e3,
                          step_seconds=0.001 * batches / 1e3, workers=workers)


def test_workers_slower_than_the_main_process_say_so_and_what_to_use():
    stats = busy_loop_stats(wait_ms_per_batch=0.5, work_ms_per_batch=0.01)
    assert stats.workers_cost_more_than_they_save and stats.is_bottleneck
    assert stats.verdict.startswith("data loading is the bottleneck")
    assert "num_workers=0" in stats.verdict and "0.5 ms" in stats.verdict
    assert stats.as_dict()["workers_cost_more_than_they_save"] is True


@pytest.mark.parametrize("wait_ms,work_ms,batches", [
    (0.5, 1.0, 100),   # the work outweighs the handoff: workers pay off
    (0.5, 0.01, 20),   # too few batches to tell startup from steady state
])
def test_workers_that_pay_off_or_too_few_batches_are_not_blamed(wait_ms, work_ms, batches):
    stats = busy_loop_stats(wait_ms, work_ms, batches)
    assert not stats.workers_cost_more_than_they_save
    assert "num_workers=0" not in stats.verdict


def test_cheap_batches_in_the_main_process_are_not_sent_to_workers():
    cheap = fl.LoaderStats(batches=100, wait_seconds=100 * 20e-6, step_seconds=100 * 1e-6)
    assert cheap.is_bottleneck and "keep num_workers=0" in cheap.verdict
    costly = fl.LoaderStats(batches=100, wait_seconds=100 * 5e-3, step_seconds=100 * 1e-3)
    assert "add workers" in costly.verdict
