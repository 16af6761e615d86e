"""The checkpoint as a unit: the state's definition (fastload._loader_state),
its versions and the errors for anything that is not a state
(NOTE [ Resume contract ] in fastload._checkpoint). What a state resumes is
tested in test_resume*.py."""
import json

import numpy as np
import pytest
from _cursor import Cursor

import fastload as fl
from fastload._loader_state import STATE_VERSION, LoaderState, WorkerState
from fastload._torchdata_layout import fastload_fields


class Stream(Cursor, fl.IterableDataset):
    pass


def states():
    """States of several configurations, mid-epoch."""
    loaders = [
        fl.DataLoader(fl.ArrayDataset(np.arange(20)), batch_size=3, shuffle=True),
        fl.DataLoader(fl.ArrayDataset(np.arange(20)), batch_size=3, shuffle=True, generator=5,
                      num_workers=2, in_order=False),
        fl.DataLoader(Stream(), batch_size=2, num_workers=2),
    ]
    for loader in loaders:
        it = iter(loader)
        next(it)
        yield loader.state_dict()
        del it


def test_a_state_is_plain_json_and_round_trips_through_its_type():
    for state in states():
        assert state["version"] == STATE_VERSION
        plain = json.loads(json.dumps(state))
        # torchdata's keys beside fastload's are derived (test_torchdata_layout.py).
        typed = LoaderState.from_dict(fastload_fields(plain))
        assert typed.to_dict() == fastload_fields(plain)
        if typed.workers is not None:
            assert all(isinstance(worker, WorkerState) for worker in typed.workers)


def make_shuffled():
    return fl.DataLoader(fl.ArrayDataset(np.arange(30)), batch_size=4, shuffle=True)


def test_states_of_earlier_versions_load_and_resume_as_their_current_twin():
    np.random.seed(0)
    loader = make_shuffled()
    it = iter(loader)
    head = [next(it)[0].tolist() for _ in range(3)]
    state = json.loads(json.dumps(loader.state_dict()))
    rest = [b[0].tolist() for b in it]
    # What fastload wrote before version 3: no DataPipe seed; before 2, no
    # out-of-order record either.
    version_2 = {key: value for key, value in state.items() if key != "datapipe_seed"}
    version_2["version"] = 2
    version_1 = {key: value for key, value in version_2.items() if key != "delivered_beyond"}
    version_1["version"] = 1
    for saved in (state, version_2, version_1):
        resumed = make_shuffled()
        resumed.load_state_dict(saved)
        assert [b[0].tolist() for b in resumed] == rest
    assert len(head) == 3


@pytest.mark.parametrize("bad,message", [
    ([1, 2], "expected the dict that DataLoader.state_dict.. returns, got list"),
    ({"epoch": 0}, "without a 'version'"),
    ({"version": 4}, "version 4: this fastload reads versions 1 to 3"),
    ({"version": "2"}, "version '2'"),
])
def test_what_is_not_a_state_is_refused_saying_why(bad, message):
    with pytest.raises(ValueError, match=message):
        make_shuffled().load_state_dict(bad)


def test_a_state_missing_fields_or_with_unknown_ones_is_refused_naming_them():
    state = next(states())
    del state["sampler"], state["next_worker"]
    state["extra"] = 1
    with pytest.raises(ValueError, match="missing sampler, next_worker; unknown extra"):
        make_shuffled().load_state_dict(state)


def one_batch_in():
    """A shuffled loader one batch into its epoch, its state, and a new
    loader that loaded that state."""
    loader = make_shuffled()
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    resumed = make_shuffled()
    resumed.load_state_dict(state)
    return loader, state, resumed


def test_a_refused_state_leaves_the_loader_as_it_was():
    loader, _, resumed = one_batch_in()
    with pytest.raises(ValueError):
        resumed.load_state_dict({"version": 9})
    assert len(list(resumed)) == len(loader) - 1  # the state loaded before still holds


def test_load_state_dict_does_not_keep_the_callers_dict():
    loader, state, resumed = one_batch_in()
    state["yielded"] = 99  # the caller reuses its dict
    assert resumed.state_dict()["yielded"] == 1
    assert len(list(resumed)) == len(loader) - 1


def test_an_empty_state_drops_a_pending_one():
    loader, _, resumed = one_batch_in()
    resumed.load_state_dict({})
    assert len(list(resumed)) == len(loader)


@pytest.mark.parametrize("saved_with", [(0, "multiprocessing"), (2, "multiprocessing"),
                                        (2, "thread")])
def test_a_map_style_state_loads_into_any_number_of_workers(saved_with):
    def make(workers, method="multiprocessing"):
        return fl.DataLoader(fl.ArrayDataset(np.arange(40)), batch_size=3, shuffle=True,
                             num_workers=workers, worker_method=method)

    np.random.seed(5)
    loader = make(*saved_with)
    it = iter(loader)
    head = [next(it)[0].tolist() for _ in range(4)]
    rest = [b[0].tolist() for b in it]
    np.random.seed(5)
    loader = make(*saved_with)
    it = iter(loader)
    assert [next(it)[0].tolist() for _ in range(4)] == head
    state = json.loads(json.dumps(loader.state_dict()))
    assert len(json.dumps(state)) < 4096  # a map-style checkpoint stays small
    for workers, method in ((0, "multiprocessing"), (1, "multiprocessing"),
                            (3, "multiprocessing"), (2, "thread")):
        resumed = make(workers, method)
        resumed.load_state_dict(state)
        assert [b[0].tolist() for b in resumed] == rest, (workers, method)


def test_a_state_with_a_torch_generator_is_json_and_resumes():
    torch = pytest.importorskip("torch", reason="a torch.Generator")

    def make():
        return fl.DataLoader(fl.ArrayDataset(np.arange(30)), batch_size=4, shuffle=True,
                             generator=torch.Generator().manual_seed(7))

    full = [b[0].tolist() for b in make()] + [b[0].tolist() for b in make()]
    loader = make()
    it = iter(loader)
    head = [next(it)[0].tolist() for _ in range(3)]
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = make()
    resumed.load_state_dict(state)
    rest = [b[0].tolist() for b in resumed]
    assert head + rest == full[:len(head) + len(rest)]


class Refusing(fl.Dataset):
    """Rows whose state cannot be loaded while ``refuse`` is set (a state
    from another version of the dataset, say)."""

    refuse = False

    def __len__(self):
        return 12

    def __getitem__(self, i):
        return np.full(1, i)

    def state_dict(self):
        return {"version": 1}

    def load_state_dict(self, state):
        if Refusing.refuse:
            raise ValueError("a state of another version")


@pytest.mark.parametrize("workers", [
    {}, dict(num_workers=2), dict(num_workers=2, persistent_workers=True),
    dict(num_workers=2, worker_method="thread")],
    ids=["0 workers", "processes", "persistent processes", "threads"])
def test_a_resume_that_failed_is_tried_again_at_every_iter_not_dropped(workers):
    """As torchdata's: a retry after the dataset refused its state does not
    start the epoch afresh; once the dataset takes it, the epoch resumes."""
    def make():
        return fl.DataLoader(Refusing(), batch_size=2, **workers)

    loader = make()
    it = iter(loader)
    head = [next(it)[:, 0].tolist() for _ in range(2)]
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    resumed = make()
    resumed.load_state_dict(state)
    Refusing.refuse = True
    try:
        for _ in range(2):
            with pytest.raises(ValueError, match="another version"):
                iter(resumed)
    finally:
        Refusing.refuse = False
    rest = [batch[:, 0].tolist() for batch in resumed]
    assert head + rest == [[i, i + 1] for i in range(0, 12, 2)]
