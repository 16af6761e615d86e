"""torchdata's keys in a state (NOTE [ torchdata's keys ] in
fastload._torchdata_layout): the values torchdata's StatefulDataLoader would
give them, derived from fastload's fields and ignored by loading."""
import copy
import json
import time

import numpy as np
import pytest
from _cursor import Cursor

import fastload as fl
from fastload._torchdata_layout import TORCHDATA_KEYS


class Counting:
    """A map-style dataset whose state counts the samples its replica read."""

    def __init__(self):
        self.calls = 0

    def __len__(self):
        return 10

    def __getitem__(self, i):
        self.calls += 1
        return i

    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, state):
        self.calls = state["calls"]


class CountingMap(Counting, fl.Dataset):
    pass


class Stream(Cursor, fl.IterableDataset):
    pass


def state_after(make_loader, dataset, workers, taken, **kwargs):
    """The state of a new loader after ``taken`` batches (None: before any
    ``iter()``)."""
    loader = make_loader(dataset(), batch_size=2, num_workers=workers, **kwargs)
    if taken is None:
        return loader.state_dict()
    it = iter(loader)
    for _ in range(taken):
        next(it)
    return loader.state_dict()


def torchdata_state_after(dataset, workers, taken, **kwargs):
    """``state_after`` for torchdata's StatefulDataLoader, over the twin of
    ``dataset`` with torch's base class (torchdata tells the kinds apart by
    torch's classes); skipped without torchdata."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader",
                                   reason="torchdata's StatefulDataLoader is the reference")
    import torch.utils.data as torch_data
    bases = ((Cursor, torch_data.IterableDataset) if dataset is Stream
             else (Counting, torch_data.Dataset))
    return state_after(stateful.StatefulDataLoader, type(dataset.__name__, bases, {}), workers,
                       taken, **kwargs)


def torchdata_part(state):
    """The torchdata keys of ``state``, without the two whose values are each
    loader's own draws: the base seed, and the sampler iterator's position
    that torchdata's wrapper of a sampler keeps."""
    part = copy.deepcopy({key: value for key, value in state.items() if key in TORCHDATA_KEYS})
    main = part["_snapshot"]["_main_snapshot"] if "_snapshot" in part else part
    main.pop("_base_seed", None)  # with workers only
    del main["_sampler_iter_state"]
    return part


# The last: a map-style epoch's last batch; an iterable stream's (every
# worker streams it whole) where it ran out in a worker, or without workers.
CASES = [(dataset, workers, taken)
         for dataset, last in ((CountingMap, (5, 5)), (Stream, (5, 9)))
         for workers in (0, 2)
         for taken in (None, 0, 3, last[bool(workers)])]


@pytest.mark.parametrize("dataset,workers,taken", CASES)
def test_torchdata_keys_hold_what_torchdata_says(dataset, workers, taken):
    theirs = torchdata_part(torchdata_state_after(dataset, workers, taken))
    ours = state_after(fl.DataLoader, dataset, workers, taken)
    # A map-style state with workers: each replica's own count.
    assert torchdata_part(ours) == theirs
    assert ("_snapshot" in ours) == (workers > 0)
    assert ("dataset_state" in ours) == (workers == 0)


@pytest.mark.parametrize("method", ["multiprocessing", "thread"])
def test_a_worker_snapshot_per_worker_before_and_during_an_epoch(method):
    for taken in (None, 2):
        state = state_after(fl.DataLoader, Stream, 3, taken, worker_method=method)
        snapshots = state["_snapshot"]["_worker_snapshots"]
        assert list(snapshots) == ["worker_0", "worker_1", "worker_2"]
        assert [s["worker_id"] for s in snapshots.values()] == [0, 1, 2]
        cursors = [s["fetcher_state"]["dataset_iter_state"]["i"] for s in snapshots.values()]
        # Every worker streams the whole dataset; after two batches the
        # first two replicas have each delivered one.
        assert cursors == ([0, 0, 0] if taken is None else [2, 2, 0])


def test_torchdata_keys_are_derived_and_loading_ignores_them():
    def make():
        return fl.DataLoader(fl.ArrayDataset(np.arange(40)), batch_size=4, shuffle=True,
                             generator=3, num_workers=2)

    loader = make()
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))  # plain JSON, like the rest
    rest = [np.asarray(b).tolist() for b in it]
    state["_snapshot"]["_snapshot_step"] = 0
    state["_snapshot"]["_worker_snapshots"].clear()
    resumed = make()
    resumed.load_state_dict(state)
    assert [np.asarray(b).tolist() for b in resumed] == rest


def test_the_state_of_a_resumed_loader_is_the_one_it_loaded():
    loader = fl.DataLoader(Stream(), batch_size=2, num_workers=2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    resumed = fl.DataLoader(Stream(), batch_size=2, num_workers=2)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state


def test_a_state_torchdata_wrote_is_refused_saying_so():
    written_by_torchdata = {
        "_snapshot": {"_snapshot_step": 2, "_worker_snapshots": {}, "_main_snapshot": {}},
        "_steps_since_snapshot": 0, "_iterator_finished": False}
    loader = fl.DataLoader(fl.ArrayDataset(np.arange(8)), batch_size=2)
    with pytest.raises(ValueError, match="written by torchdata's StatefulDataLoader"):
        loader.load_state_dict(written_by_torchdata)
    assert len(list(loader)) == 4  # and the loader goes on, fresh


def step_keys(state):
    snapshot = state["_snapshot"]
    return (snapshot["_snapshot_step"], state["_steps_since_snapshot"],
            snapshot["_main_snapshot"]["_sampler_iter_yielded"])


@pytest.mark.parametrize("dataset,taken", [(CountingMap, 2), (CountingMap, 4), (Stream, 4)])
def test_snapshot_steps_as_torchdata_counts_them_between_snapshots(dataset, taken):
    theirs = torchdata_state_after(dataset, 2, taken, snapshot_every_n_steps=3)
    ours = state_after(fl.DataLoader, dataset, 2, taken, snapshot_every_n_steps=3)
    assert step_keys(ours) == step_keys(theirs)


class SlowStart(Counting, fl.Dataset):
    """Its first batch comes last: batches are delivered out of order."""

    def __getitem__(self, i):
        if i < 2:
            time.sleep(0.5)
        return super().__getitem__(i)


def test_batches_delivered_out_of_order_count_as_steps_since_the_snapshot():
    loader = fl.DataLoader(SlowStart(), batch_size=2, num_workers=2, in_order=False)
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    state = loader.state_dict()
    assert 0 not in np.concatenate(first)  # the slow batch is still to come
    assert step_keys(state) == (0, 3, 0)
