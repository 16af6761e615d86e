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


def _loader(workers, persistent=False, dataset=None):
    threads = {"worker_method": "thread", "persistent_workers": persistent} if workers else {}
    dataset = Drawing() if dataset is None else dataset
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


def _stacked(samples):
    """A collate_fn of the user's own (not fastload's default collation)."""
    return np.stack(samples)


@pytest.mark.parametrize("collate_fn", [None, _stacked])
@pytest.mark.parametrize("persistent", [False, True])
def test_an_epoch_left_early_leaves_the_dataset_where_the_main_process_would(
        persistent, collate_fn):
    """Batches prefetched and never delivered were fetched: the next epoch
    starts from the state after the last delivered batch, as with
    num_workers=0, whatever the threads' timing."""
    def epochs(loader):
        iterator = iter(loader)
        head = [next(iterator).tolist() for _ in range(2)]
        del iterator
        return head, _epoch(loader)

    main = _loader(0)
    main.collate_fn = collate_fn or main.collate_fn
    threads = _loader(3, persistent)
    threads.collate_fn = collate_fn or threads.collate_fn
    assert epochs(threads) == epochs(main)


class SlowDrawing(Drawing):
    def __getitem__(self, i):
        time.sleep(0.25)
        return np.array([i, self.rng.integers(1000)])


def test_the_tasks_of_an_epoch_left_early_are_not_fetched():
    """With persistent threads, iter() waits for the tasks of the epoch it
    leaves: they pass their turn unfetched (three queued fetches of 0.25 s
    each per thread would outlast the timeout)."""
    loader = fl.DataLoader(SlowDrawing(), batch_size=1, num_workers=3, worker_method="thread",
                           persistent_workers=True, prefetch_factor=3, timeout=1.5)
    iterator = iter(loader)
    next(iterator)
    iterator = iter(loader)
    assert next(iterator).shape == (1, 2)


class LiveState(fl.Dataset):
    """A state_dict() that returns the object the dataset keeps updating."""

    def __init__(self):
        self.state = {"served": 0}

    def __len__(self):
        return 24

    def __getitem__(self, i):
        self.state["served"] += 1
        return np.array([i, self.state["served"]])

    def state_dict(self):
        return self.state

    def load_state_dict(self, state):
        self.state = dict(state)


@pytest.mark.parametrize("workers,every", [(0, 3), (2, 1), (2, 3)])
def test_a_state_dict_the_dataset_keeps_updating_is_recorded_as_it_was(workers, every):
    def loader():
        threads = {"worker_method": "thread"} if workers else {}
        return fl.DataLoader(LiveState(), batch_size=3, num_workers=workers,
                             snapshot_every_n_steps=every, **threads)

    expected = _epoch(loader())
    for taken in range(len(expected) + 1):
        saved = loader()
        iterator = iter(saved)
        delivered = [next(iterator).tolist() for _ in range(taken)]
        state = saved.state_dict()
        del iterator
        resumed = loader()
        resumed.load_state_dict(state)
        assert delivered + _epoch(resumed) == expected, f"state after {taken} batches"


class SlowCollating:
    """A collate_fn that is slow for one batch, which without order would
    be delivered after those sent later."""

    def __call__(self, samples):
        if any(sample[0] == 10 for sample in samples):
            time.sleep(0.2)
        return np.stack(samples)


def test_in_order_false_delivers_a_stateful_datasets_batches_in_order():
    def loader(workers):
        threads = {"worker_method": "thread", "in_order": False} if workers else {}
        dataset = Drawing()
        return fl.DataLoader(dataset, batch_size=3, num_workers=workers,
                             collate_fn=SlowCollating(), **threads)

    expected = _epoch(loader(0))
    assert _epoch(loader(3)) == expected
    saved = loader(3)
    iterator = iter(saved)
    delivered = [next(iterator).tolist() for _ in range(4)]
    state = saved.state_dict()
    del iterator
    resumed = loader(0)
    resumed.load_state_dict(state)
    assert delivered + _epoch(resumed) == expected


class FailingAfterDrawing(Drawing):
    """Sample 11 draws, then raises: its batch is delivered as the error,
    and what it drew counts."""

    def __getitem__(self, i):
        sample = super().__getitem__(i)
        if i == 11:
            raise ValueError("sample 11 is broken")
        return sample


def _outcomes(iterator, count=None):
    """Each next batch as a list, or the name of the error it raised."""
    outcomes = []
    while count is None or len(outcomes) < count:
        try:
            outcomes.append(next(iterator).tolist())
        except StopIteration:
            break
        except ValueError as error:
            outcomes.append(type(error).__name__)
    return outcomes


@pytest.mark.parametrize("save_workers,resume_workers", [(0, 0), (2, 2), (2, 0)])
def test_a_state_after_a_failed_batch_holds_what_its_fetch_drew(save_workers, resume_workers):
    def loader(workers):
        return _loader(workers, dataset=FailingAfterDrawing())

    expected = _outcomes(iter(loader(0)))
    assert "ValueError" in expected
    for taken in range(len(expected) + 1):
        saved = loader(save_workers)
        iterator = iter(saved)
        delivered = _outcomes(iterator, taken)
        state = saved.state_dict()
        del iterator
        resumed = loader(resume_workers)
        resumed.load_state_dict(state)
        assert delivered + _outcomes(iter(resumed)) == expected, f"state after {taken} batches"


class Epochs(fl.Dataset):
    """A dataset with a state whose set_epoch() the program calls."""

    def __init__(self):
        self.epoch, self.served = 0, 0

    def set_epoch(self, epoch):
        self.epoch, self.served = epoch, 0

    def __len__(self):
        return 12

    def __getitem__(self, i):
        self.served += 1
        return np.array([100 * self.epoch + self.served])

    def state_dict(self):
        return {"epoch": self.epoch, "served": self.served}

    def load_state_dict(self, state):
        self.epoch, self.served = state["epoch"], state["served"]


@pytest.mark.parametrize("persistent", [False, True])
def test_what_the_program_does_to_the_dataset_after_leaving_an_epoch_stays(persistent):
    def run(**threads):
        dataset = Epochs()
        loader = fl.DataLoader(dataset, batch_size=2, **threads)
        seen = []
        for epoch in range(3):
            dataset.set_epoch(epoch)
            for step, batch in enumerate(loader):
                seen.append(batch.ravel().tolist())
                if step == 1:
                    break
        return seen

    expected = run()
    assert run(num_workers=2, worker_method="thread", persistent_workers=persistent) == expected


def test_a_state_loaded_after_an_epoch_was_left_is_what_the_next_epoch_starts_from():
    def loader(**threads):
        return fl.DataLoader(Epochs(), batch_size=2, **threads)

    saved = loader()
    _epoch(saved)
    state = saved.state_dict()
    expected = _epoch(saved)
    threads = loader(num_workers=2, worker_method="thread")
    for _ in threads:
        break
    threads.load_state_dict(state)
    assert _epoch(threads) == expected
