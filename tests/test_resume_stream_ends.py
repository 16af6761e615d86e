"""An iterable dataset's state taken before a stream yielded anything (at
an epoch's start, or after its stream ran out) resumes as the saved run
went on, whether the dataset's state then still describes the ended stream
or already the next one (NOTE [ A stream restored at its end ])."""
import pytest

import fastload as fl

pytestmark = pytest.mark.timeout(120)

ROWS = 12


def _shard():
    info = fl.get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


class PendingCursor(fl.IterableDataset):
    """torchdata's usual pattern: the position of the last sample given,
    applied at the next ``__iter__``. After a stream ran out, and until the
    next one yields, its state is the ended stream's."""

    def __init__(self):
        self.position, self.pending = 0, None

    def __iter__(self):
        worker, workers = _shard()
        start = 0 if self.pending is None else self.pending
        self.pending = None
        for row in range(start, ROWS):
            self.position = row + 1
            if row % workers == worker:
                yield row

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.pending = state["position"]


class ResetAtEnd(fl.IterableDataset):
    """A stream that resets its position and counts an epoch as it ends:
    its state after the end already describes the next stream."""

    def __init__(self):
        self.position, self.epoch = 0, 0

    def __iter__(self):
        worker, workers = _shard()
        for row in range(self.position, ROWS):
            self.position = row + 1
            if row % workers == worker:
                yield row + 100 * self.epoch
        self.position, self.epoch = 0, self.epoch + 1

    def state_dict(self):
        return {"position": self.position, "epoch": self.epoch}

    def load_state_dict(self, state):
        self.position, self.epoch = state["position"], state["epoch"]


CONFIGS = {
    "main": {"num_workers": 0},
    "processes": {"num_workers": 2},
    "persistent-processes": {"num_workers": 2, "persistent_workers": True},
    "threads": {"num_workers": 2, "worker_method": "thread"},
    "persistent-threads": {"num_workers": 2, "worker_method": "thread",
                           "persistent_workers": True},
}

# Batches of the second epoch delivered before the state is taken; None:
# the state is taken after the first epoch ran out, before the second.
TAKEN = [None, 0, 1, 2, 5]


def _epoch(loader):
    return [batch.tolist() for batch in loader]


@pytest.mark.parametrize("every", [1, 3])
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("dataset", [PendingCursor, ResetAtEnd])
def test_a_state_before_a_streams_first_sample_resumes_as_the_saved_run_went_on(
        dataset, config, every):
    def loader():
        return fl.DataLoader(dataset(), batch_size=2, snapshot_every_n_steps=every,
                             **CONFIGS[config])

    uninterrupted = loader()
    epochs = [_epoch(uninterrupted) for _ in range(3)]
    assert all(len(epoch) == ROWS // 2 for epoch in epochs)
    for taken in TAKEN:
        saved = loader()
        assert _epoch(saved) == epochs[0]
        delivered = []
        if taken is not None:
            iterator = iter(saved)
            delivered = [next(iterator).tolist() for _ in range(taken)]
        state = saved.state_dict()
        resumed = loader()
        resumed.load_state_dict(state)
        assert delivered + _epoch(resumed) == epochs[1], f"state after {taken} batches"
        assert _epoch(resumed) == epochs[2], f"state after {taken} batches"
