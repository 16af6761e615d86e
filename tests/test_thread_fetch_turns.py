"""Worker threads share a map-style dataset; when it keeps a state, its
fetches take turns in the sampler's order (FetchTurns, NOTE [ Thread
workers ]): the batches and the state at each step are num_workers=0's."""
import threading
import time

import numpy as np
import pytest

import fastload as fl
from fastload._worker_thread import JOIN_SECONDS

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker")]


class Drawing(fl.Dataset):
    """Each sample draws from the dataset's own generator, its state. Some
    indices are slower, so threads left alone would fetch out of order."""

    def __init__(self, rows=24):
        self.rows, self.rng = rows, np.random.default_rng(0)

    def __len__(self):
        return self.rows

    def __getitem__(self, i):
        time.sleep(0.002 * (i * 7 % 3))
        return np.array([i, self.rng.integers(1000)])

    def state_dict(self):
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state):
        self.rng.bit_generator.state = state["rng"]


def _loader(workers, persistent=False):
    threads = {"worker_method": "thread", "persistent_workers": persistent} if workers else {}
    dataset = Drawing()
    # A generator of the sampler's own: persistent workers draw fewer base
    # seeds from the loader's, as in torch.
    sampler = fl.RandomSampler(dataset, generator=np.random.default_rng(3))
    return fl.DataLoader(dataset, batch_size=3, sampler=sampler, num_workers=workers,
                         **threads)


def _epoch(loader):
    return [batch.tolist() for batch in loader]


@pytest.mark.parametrize("workers,persistent", [(2, False), (3, False), (2, True)])
def test_a_stateful_datasets_batches_are_those_of_the_main_process(workers, persistent):
    main = _loader(0)
    expected = [_epoch(main) for _ in range(2)]
    threads = _loader(workers, persistent)
    assert [_epoch(threads) for _ in range(2)] == expected


@pytest.mark.parametrize("resume_workers", [0, 2])
def test_a_state_of_any_step_resumes_exactly_with_either_path(resume_workers):
    expected = _epoch(_loader(0))
    for taken in range(len(expected) + 1):
        saved = _loader(2)
        iterator = iter(saved)
        delivered = [next(iterator).tolist() for _ in range(taken)]
        state = saved.state_dict()
        del iterator
        resumed = _loader(resume_workers)
        resumed.load_state_dict(state)
        assert delivered + _epoch(resumed) == expected, f"state after {taken} batches"


def test_threads_waiting_for_their_turn_stop_with_the_iterator():
    before = threading.active_count()
    loader = _loader(3)
    iterator = iter(loader)
    next(iterator)
    del iterator  # its threads are mid-epoch, some waiting for their turn
    deadline = time.monotonic() + JOIN_SECONDS + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() <= before
    # The loader goes on: a new epoch is whole.
    assert sorted(row[0] for batch in _epoch(loader) for row in batch) == list(range(24))
