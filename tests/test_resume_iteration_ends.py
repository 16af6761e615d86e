"""A state taken where an iteration ended, or before the next one yielded,
resumes as the saved run went on, whether what it holds then still
describes the ended iteration or already the next one: an iterable
dataset's stream, and a custom index sampler's epoch (NOTE [ A stream
restored at its end ])."""
import json

import numpy as np
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


class PositionAndEpoch:
    """A state of where the epoch stands and which epoch it is."""

    def state_dict(self):
        return {"position": self.position, "epoch": self.epoch}

    def load_state_dict(self, state):
        self.position, self.epoch = state["position"], state["epoch"]


class ResetAtEnd(PositionAndEpoch, fl.IterableDataset):
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


def _listed(batch):
    return batch.tolist() if hasattr(batch, "tolist") else batch


def _epoch(loader):
    return [_listed(batch) for batch in loader]


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


class ResetAtEndSampler(PositionAndEpoch):
    """Its position and epoch; an epoch that runs out resets the position
    and counts the next epoch, so a state taken after a short last batch
    (which drew past the end) already describes the next epoch."""

    def __init__(self, rows):
        self.rows, self.position, self.epoch = rows, 0, 0

    def __iter__(self):
        order = np.random.default_rng(self.epoch).permutation(self.rows)
        while self.position < self.rows:
            self.position += 1
            yield int(order[self.position - 1])
        self.position, self.epoch = 0, self.epoch + 1

    def __len__(self):
        return self.rows


class ResetAtStartSampler(ResetAtEndSampler):
    """An epoch that ran out is only left at the next ``__iter__``."""

    def __iter__(self):
        if self.position >= self.rows:
            self.position, self.epoch = 0, self.epoch + 1
        yield from super().__iter__()


SAMPLER_CONFIGS = {key: CONFIGS[key] for key in ("main", "threads", "persistent-processes")}


def _assert_every_state_resumes(loader, reshuffles=True, epochs_checked=2):
    """States after each batch of the first ``epochs_checked`` epochs of
    ``loader()``'s run, and after each of them ran out: resumed in a new
    loader, the rest of that epoch, then the next, come as they did.
    ``reshuffles``: the first two epochs differ."""
    uninterrupted = loader()
    epochs = [_epoch(uninterrupted) for _ in range(epochs_checked + 2)]
    assert (epochs[0] != epochs[1]) == reshuffles
    for epoch in range(epochs_checked):
        for taken in [*range(len(epochs[epoch]) + 1), None]:
            saved = loader()
            for _ in range(epoch):
                _epoch(saved)
            delivered = []
            if taken is None:
                delivered = _epoch(saved)
            else:
                iterator = iter(saved)
                delivered = [_listed(next(iterator)) for _ in range(taken)]
            state = saved.state_dict()
            resumed = loader()
            resumed.load_state_dict(state)
            where = f"state after {taken} batches of epoch {epoch}"
            if taken is None:
                assert _epoch(resumed) == epochs[epoch + 1], where
            else:
                assert delivered + _epoch(resumed) == epochs[epoch], where
                assert _epoch(resumed) == epochs[epoch + 1], where


@pytest.mark.parametrize("every", [1, 3])
@pytest.mark.parametrize("config", SAMPLER_CONFIGS)
@pytest.mark.parametrize("rows,drop_last", [(10, False), (12, False), (10, True)])
@pytest.mark.parametrize("sampler", [ResetAtEndSampler, ResetAtStartSampler])
def test_a_custom_samplers_state_at_any_step_resumes_as_the_saved_run_went_on(
        sampler, rows, drop_last, config, every):
    _assert_every_state_resumes(lambda: fl.DataLoader(
        np.arange(rows), sampler=sampler(rows), batch_size=4, drop_last=drop_last,
        snapshot_every_n_steps=every, **SAMPLER_CONFIGS[config]))


class _KeptOrder:
    """The iterator of IteratorKeptSampler: its state is the generator's as
    its order was drawn, and how many indices it gave."""

    def __init__(self, sampler):
        self.sampler, self.given = sampler, 0
        self.start = sampler.rng.bit_generator.state
        self.order = sampler.rng.permutation(sampler.rows).tolist()

    def __iter__(self):
        return self

    def __next__(self):
        if self.given == len(self.order):
            raise StopIteration
        self.given += 1
        return self.order[self.given - 1]

    def state_dict(self):
        return {"start": self.start, "given": self.given}

    def load_state_dict(self, state):
        self.sampler.rng.bit_generator.state = state["start"]
        self.order = self.sampler.rng.permutation(self.sampler.rows).tolist()
        self.start, self.given = state["start"], state["given"]


class IteratorKeptSampler:
    """torchdata's protocol: the sampler keeps no state, its iterator does."""

    def __init__(self, rows):
        self.rows, self.rng = rows, np.random.default_rng(5)

    def __iter__(self):
        return _KeptOrder(self)

    def __len__(self):
        return self.rows


@pytest.mark.parametrize("config", SAMPLER_CONFIGS)
@pytest.mark.parametrize("batch_size", [4, None])
@pytest.mark.parametrize("every", [1, 3])
def test_a_samplers_state_kept_by_its_iterator_is_resumed(every, batch_size, config):
    _assert_every_state_resumes(lambda: fl.DataLoader(
        np.arange(10), sampler=IteratorKeptSampler(10), batch_size=batch_size,
        snapshot_every_n_steps=every, **SAMPLER_CONFIGS[config]))


def _torchdata_loaders(rows):
    torch = pytest.importorskip("torch")
    samplers = pytest.importorskip("torchdata.stateful_dataloader.sampler")

    def generator():
        return torch.Generator().manual_seed(7)

    data = np.arange(rows)
    return {
        "RandomSampler": lambda **kw: fl.DataLoader(
            data, sampler=samplers.RandomSampler(data, generator=generator()), batch_size=4,
            **kw),
        "BatchSampler": lambda **kw: fl.DataLoader(
            data, batch_sampler=samplers.BatchSampler(
                samplers.RandomSampler(data, generator=generator()), 4, False), **kw),
        "StatefulDistributedSampler": lambda **kw: fl.DataLoader(
            data, sampler=samplers.StatefulDistributedSampler(data, num_replicas=1, rank=0),
            batch_size=4, **kw),
    }


@pytest.mark.parametrize("kind", ["RandomSampler", "BatchSampler", "StatefulDistributedSampler"])
@pytest.mark.parametrize("every", [1, 3])
def test_torchdatas_stateful_samplers_resume_as_the_saved_run_went_on(kind, every):
    make = _torchdata_loaders(10)[kind]
    # StatefulDistributedSampler's order changes with set_epoch() only.
    _assert_every_state_resumes(lambda: make(snapshot_every_n_steps=every),
                                reshuffles=kind != "StatefulDistributedSampler")


class ShortLastBatch(PendingCursor):
    """Eleven rows: the stream runs out inside the last, short batch, so a
    state taken after it was taken once the stream had ended."""

    def __iter__(self):
        worker, workers = _shard()
        start = 0 if self.pending is None else self.pending
        self.pending = None
        for row in range(start, ROWS - 1):
            self.position = row + 1
            if row % workers == worker:
                yield row


@pytest.mark.parametrize("config", ["main", "persistent-threads", "persistent-processes"])
def test_a_stream_that_ran_out_inside_the_last_batch_resumes_the_next_epoch_whole(config):
    _assert_every_state_resumes(
        lambda: fl.DataLoader(ShortLastBatch(), batch_size=2, **CONFIGS[config]),
        reshuffles=False)


@pytest.mark.parametrize("method", ["thread", "multiprocessing"])
def test_a_replica_that_ended_ahead_of_delivery_resumes_the_next_epoch_whole(method):
    """With in_order=False a worker's end (ENDED) can come before the state
    is taken, with its last batch still to come from the other worker."""
    def loader():
        return fl.DataLoader(PendingCursor(), batch_size=2, num_workers=2,
                             worker_method=method, persistent_workers=True, in_order=False)

    for _ in range(3):
        saved = loader()
        iterator = iter(saved)
        for _ in range(ROWS // 2):
            next(iterator)
        resumed = loader()
        resumed.load_state_dict(saved.state_dict())
        assert _epoch(resumed) == []
        assert sorted(row for batch in _epoch(resumed) for row in batch) == list(range(ROWS))


# The rows of each epoch: the second is empty.
ROWS_BY_EPOCH = [[0, 1, 2, 3], [], [4, 5, 6, 7], [8, 9], [10, 11], [0, 1]]


class EpochFiles(PositionAndEpoch, fl.IterableDataset):
    """A stream whose epochs differ in length, one of them empty; its state
    (position, epoch) moves on to the next epoch as a stream ends."""

    def __init__(self):
        self.position, self.epoch = 0, 0

    def __iter__(self):
        rows = ROWS_BY_EPOCH[self.epoch]
        for i in range(self.position, len(rows)):
            self.position = i + 1
            yield rows[i]
        self.position, self.epoch = 0, self.epoch + 1


class EpochCurriculum(EpochFiles):
    """The same as an index sampler."""

    def __len__(self):
        return len(ROWS_BY_EPOCH[self.epoch])


@pytest.mark.parametrize("every", [1, 3])
@pytest.mark.parametrize("kind", ["dataset", "sampler"])
def test_an_empty_epoch_is_resumed_as_an_epoch(kind, every):
    def loader():
        if kind == "dataset":
            return fl.DataLoader(EpochFiles(), batch_size=2, snapshot_every_n_steps=every)
        return fl.DataLoader(np.arange(12), sampler=EpochCurriculum(), batch_size=2,
                             snapshot_every_n_steps=every)

    _assert_every_state_resumes(loader, epochs_checked=3)


def _torchdata_random_loader(every=1):
    torch = pytest.importorskip("torch")
    samplers = pytest.importorskip("torchdata.stateful_dataloader.sampler")
    data = np.arange(12)
    return fl.DataLoader(
        data, sampler=samplers.RandomSampler(data, generator=torch.Generator().manual_seed(7)),
        batch_size=4, snapshot_every_n_steps=every)


@pytest.mark.parametrize("every,taken", [(1, 0), (3, 1)])
def test_an_iterators_state_resumed_twice_keeps_its_epoch(every, taken):
    """Resumed between epochs, then checkpointed again before the loaded
    state reached an iterator (or before the next snapshot)."""
    uninterrupted = _torchdata_random_loader(every)
    expected = [_epoch(uninterrupted) for _ in range(2)][1]
    first = _torchdata_random_loader(every)
    _epoch(first)
    second = _torchdata_random_loader(every)
    second.load_state_dict(first.state_dict())
    iterator = iter(second)
    delivered = [next(iterator).tolist() for _ in range(taken)]
    third = _torchdata_random_loader(every)
    third.load_state_dict(second.state_dict())
    assert delivered + _epoch(third) == expected


@pytest.mark.parametrize("every,taken", [(1, 0), (3, 1)])
def test_an_iterators_state_after_an_epoch_left_early_is_the_new_epochs(every, taken):
    uninterrupted = _torchdata_random_loader(every)
    next(iter(uninterrupted))
    expected = _epoch(uninterrupted)
    saved = _torchdata_random_loader(every)
    next(iter(saved))
    iterator = iter(saved)
    delivered = [next(iterator).tolist() for _ in range(taken)]
    resumed = _torchdata_random_loader(every)
    resumed.load_state_dict(saved.state_dict())
    assert delivered + _epoch(resumed) == expected


def test_a_loader_whose_sampler_iterator_keeps_the_state_pickles_after_an_epoch():
    """torchdata's BatchSampler iterator holds its sampler's generator,
    which does not pickle: a copy starts its next iteration afresh."""
    import copy
    import pickle

    samplers = pytest.importorskip("torchdata.stateful_dataloader.sampler")
    data = np.arange(12)
    loader = fl.DataLoader(data, batch_sampler=samplers.BatchSampler(
        samplers.StatefulDistributedSampler(data, num_replicas=1, rank=0), 4, False))
    first = _epoch(loader)
    assert _epoch(copy.deepcopy(loader)) == first
    assert _epoch(pickle.loads(pickle.dumps(loader))) == first
    assert _epoch(loader) == first


class _GuardedOrder:
    """An iterator whose state_dict() raises unless checkpointing is on."""

    def __init__(self, rows):
        self.rows, self.given = rows, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.given == self.rows:
            raise StopIteration
        self.given += 1
        return self.given - 1

    def state_dict(self):
        raise NotImplementedError("checkpointing is off")

    def load_state_dict(self, state):
        self.given = state["given"]


class GuardedSampler:
    def __len__(self):
        return 6

    def __iter__(self):
        return _GuardedOrder(6)


@pytest.mark.parametrize("config", SAMPLER_CONFIGS)
def test_a_sampler_iterator_that_cannot_give_its_state_still_iterates(config):
    loader = fl.DataLoader(np.arange(6), sampler=GuardedSampler(), batch_size=2,
                           **SAMPLER_CONFIGS[config])
    assert _epoch(loader) == [[0, 1], [2, 3], [4, 5]]
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    resumed = fl.DataLoader(np.arange(6), sampler=GuardedSampler(), batch_size=2)
    resumed.load_state_dict(state)
    with pytest.raises(ValueError, match="checkpointing is off"):
        iter(resumed)


@pytest.mark.parametrize("batch_sampler", ["fastload", "torch"])
def test_a_batch_size_set_on_the_loaders_batch_sampler_is_honoured(batch_sampler):
    """torch's loader reads its batch_sampler's fields at each iteration."""
    sampler = IteratorKeptSampler(8)
    if batch_sampler == "torch":
        torch_data = pytest.importorskip("torch.utils.data")
        loader = fl.DataLoader(np.arange(8), batch_sampler=torch_data.BatchSampler(
            sampler, 2, False))
    else:
        loader = fl.DataLoader(np.arange(8), sampler=sampler, batch_size=2)
    assert len(loader) == 4
    loader.batch_sampler.batch_size = 4
    assert len(loader) == 2
    assert [len(batch) for batch in loader] == [4, 4]


@pytest.mark.parametrize("every", [0, 3])
@pytest.mark.parametrize("taken", [2, 3])
def test_a_state_taken_in_a_resumed_stream_before_its_next_snapshot_resumes_it(taken, every):
    """After a restore the dataset is asked for its state again, as torchdata
    asks; a stream that applies a loaded position at its next __iter__
    still answers from before. Its first batch records its own."""
    def loader():
        return fl.DataLoader(PendingCursor(), batch_size=2, snapshot_every_n_steps=every)

    expected = _epoch(loader())
    first = loader()
    iterator = iter(first)
    delivered = [next(iterator).tolist() for _ in range(taken)]
    second = loader()
    second.load_state_dict(first.state_dict())
    iterator = iter(second)
    delivered.append(next(iterator).tolist())
    third = loader()
    third.load_state_dict(second.state_dict())
    assert delivered + _epoch(third) == expected


class LiveStateSampler(ResetAtEndSampler):
    """A state_dict() that returns the dict the sampler keeps updating."""

    def __init__(self, rows):
        self.kept = {"position": 0, "epoch": 0}
        super().__init__(rows)

    position = property(lambda self: self.kept["position"],
                        lambda self, value: self.kept.__setitem__("position", value))
    epoch = property(lambda self: self.kept["epoch"],
                     lambda self, value: self.kept.__setitem__("epoch", value))

    def state_dict(self):
        return self.kept


@pytest.mark.parametrize("config", SAMPLER_CONFIGS)
def test_a_checkpoint_of_a_sampler_that_keeps_its_state_dict_does_not_move_on(config):
    def loader():
        return fl.DataLoader(np.arange(10), sampler=LiveStateSampler(10), batch_size=4,
                             **SAMPLER_CONFIGS[config])

    saved = loader()
    iterator = iter(saved)
    next(iterator)
    state = saved.state_dict()
    kept = json.dumps(state, default=str)
    rest = [batch.tolist() for batch in iterator]
    assert json.dumps(state, default=str) == kept
    resumed = loader()
    resumed.load_state_dict(state)
    assert _epoch(resumed) == rest
    _assert_every_state_resumes(loader)
