"""torch's DataPipes load as torch loads them: sharded per worker by
``sharding_filter``, shufflers switched by ``shuffle`` and seeded alike in
every worker (fastload._datapipes)."""
import warnings

import pytest

import fastload as fl

torch = pytest.importorskip("torch", reason="DataPipes are torch's")
from torch.utils.data.datapipes.iter import IterableWrapper  # noqa: E402

CASES = [(0, "multiprocessing"), (2, "multiprocessing"), (3, "multiprocessing"),
         (2, "thread"), (3, "thread")]


def values(loader):
    return [int(x) for x in loader]


@pytest.mark.parametrize("workers,method", CASES)
def test_a_sharded_pipe_yields_each_sample_once_in_a_new_order_each_epoch(workers, method):
    pipe = IterableWrapper(range(60)).shuffle().sharding_filter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # more workers than cores
        loader = fl.DataLoader(pipe, batch_size=None, num_workers=workers,
                               worker_method=method)
        first, second = values(loader), values(loader)
    assert sorted(first) == sorted(second) == list(range(60))
    assert first != list(range(60)) and first != second


@pytest.mark.parametrize("workers,method", CASES[:2] + CASES[3:4])
def test_shuffle_switches_the_pipes_shufflers(workers, method):
    def make(shuffle):
        pipe = IterableWrapper(range(40)).shuffle().sharding_filter()
        return fl.DataLoader(pipe, batch_size=4, num_workers=workers, shuffle=shuffle,
                             worker_method=method, output="numpy")

    unshuffled = [int(x) for batch in make(False) for x in batch]
    assert sorted(unshuffled) == list(range(40))
    if workers == 0:
        assert unshuffled == list(range(40))
    shuffled = [int(x) for batch in make(True) for x in batch]
    assert sorted(shuffled) == list(range(40)) and shuffled != unshuffled


def test_the_shuffled_order_is_reproducible_with_the_loaders_generator():
    def run(workers):
        pipe = IterableWrapper(range(50)).shuffle().sharding_filter()
        return values(fl.DataLoader(pipe, batch_size=None, num_workers=workers, generator=3))

    assert run(0) == run(0)
    assert run(2) == run(2)
