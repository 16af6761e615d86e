"""Small gathers made by the main thread, with either worker method (NOTE
[ Small gathers ] in fastload/_fast_path.py): the batches, states and
statistics are those of the workers' own gathers, and what a worker does
besides (raising for a bad index, dying) still shows."""
import os
import pickle
import signal
import time

import numpy as np
import pytest

import fastload as fl
import fastload._fast_path as fast_path
from fastload._worker_group import WorkerGroup

pytestmark = pytest.mark.usefixtures("earlier_garbage_collected")

try:
    import torch
except ImportError:
    torch = None

METHODS = ["multiprocessing", "thread"]


@pytest.fixture
def tasks_to_workers(monkeypatch):
    """Counts the tasks sent to worker processes and threads."""
    from fastload._thread_workers import ThreadIter

    sent = []
    send_record = WorkerGroup.send_record
    monkeypatch.setattr(WorkerGroup, "send_record",
                        lambda group, worker_id, data: (sent.append(worker_id),
                                                        send_record(group, worker_id, data))[1])
    send_task = ThreadIter._send_task

    def counted(it, worker_id, index, *rest):
        before = it._workers[worker_id].tasks.qsize()
        task_id = send_task(it, worker_id, index, *rest)
        if it._workers[worker_id].tasks.qsize() > before:
            sent.append(worker_id)
        return task_id

    monkeypatch.setattr(ThreadIter, "_send_task", counted)
    return sent


def _gathered_datasets():
    rng = np.random.default_rng(7)
    rows = rng.standard_normal((600, 16)).astype(np.float32)
    labels = rng.integers(0, 1000, 600)
    array_dataset = fl.ArrayDataset(rows, labels)
    yield "ArrayDataset", array_dataset
    yield "Subset", fl.Subset(array_dataset, rng.permutation(600)[:450])
    if torch is not None:
        yield "TensorDataset", torch.utils.data.TensorDataset(torch.from_numpy(rows),
                                                              torch.from_numpy(labels))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name, dataset", list(_gathered_datasets()),
                         ids=[name for name, _ in _gathered_datasets()])
def test_small_gathers_give_the_workers_bytes_states_and_statistics(
        name, dataset, method, monkeypatch, tasks_to_workers):
    settings = dict(batch_size=32, shuffle=True, generator=3)
    expected = list(fl.DataLoader(dataset, **settings))
    shares = [(len(expected) + 1) // 2, len(expected) // 2]
    runs, states = [], []
    for small in (fast_path.SMALL_GATHER_BYTES, 0):  # 0: every batch to a worker
        monkeypatch.setattr(fast_path, "SMALL_GATHER_BYTES", small)
        tasks_to_workers.clear()
        loader = fl.DataLoader(dataset, num_workers=2, worker_method=method, **settings)
        it = iter(loader)
        head = [next(it) for _ in range(5)]
        states.append(pickle.dumps(loader.state_dict()))
        runs.append([tuple(np.asarray(column) for column in batch) for batch in [*head, *it]])
        assert len(tasks_to_workers) == (0 if small else len(expected))
        assert [w.batches for w in loader.stats().workers] == shares
        del it, head
    assert states[0] == states[1]
    for got in runs:
        assert len(got) == len(expected)
        for batch, want in zip(got, expected):
            for column, wanted in zip(batch, want):
                wanted = np.asarray(wanted)
                assert column.dtype == wanted.dtype and np.array_equal(column, wanted)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("saved_small, resumed_small", [(True, False), (False, True)])
def test_a_state_taken_with_small_gathers_resumes_on_either_path(
        method, saved_small, resumed_small, monkeypatch):
    # Small gathers draw shuffled indices as arrays (BatchSampler._index_arrays),
    # handed-over batches as lists: a state fits either.
    dataset = fl.ArrayDataset(np.arange(260).reshape(130, 2))
    settings = dict(batch_size=4, shuffle=True, generator=5)
    expected = [b[0].tolist() for b in fl.DataLoader(dataset, **settings)]
    small = fast_path.SMALL_GATHER_BYTES
    monkeypatch.setattr(fast_path, "SMALL_GATHER_BYTES", small if saved_small else 0)
    loader = fl.DataLoader(dataset, num_workers=2, worker_method=method, **settings)
    it = iter(loader)
    assert it._index_arrays is saved_small
    head = [next(it)[0].tolist() for _ in range(7)]
    state = loader.state_dict()
    del it
    monkeypatch.setattr(fast_path, "SMALL_GATHER_BYTES", small if resumed_small else 0)
    resumed = fl.DataLoader(dataset, num_workers=2, worker_method=method, **settings)
    resumed.load_state_dict(state)
    it = iter(resumed)
    assert it._index_arrays is resumed_small
    assert head + [b[0].tolist() for b in it] == expected


@pytest.mark.parametrize("method", METHODS)
def test_a_small_gather_that_fails_is_loaded_and_reported_by_its_worker(
        method, tasks_to_workers):
    loader = fl.DataLoader(fl.ArrayDataset(np.arange(10)), sampler=[0, 1, 5, 99, 2, 3],
                           batch_size=2, num_workers=2, worker_method=method)
    it = iter(loader)
    assert next(it)[0].tolist() == [0, 1]
    with pytest.raises(IndexError, match=r"worker (process|thread) 1 .*\[5, 99\]"):
        next(it)
    assert next(it)[0].tolist() == [2, 3]
    assert tasks_to_workers == [1]


@pytest.mark.parametrize("method", METHODS)
def test_larger_gathers_are_the_workers_own(method, tasks_to_workers):
    rows = np.zeros((8, fast_path.SMALL_GATHER_BYTES // 2 + 64), np.uint8)
    rows[:, 0] = np.arange(8)
    loader = fl.DataLoader(fl.ArrayDataset(rows), batch_size=2, num_workers=2,
                           worker_method=method)
    assert [int(b[0][0, 0]) for b in loader] == [0, 2, 4, 6]
    assert sorted(tasks_to_workers) == [0, 0, 1, 1]


@pytest.mark.timeout(60)
def test_a_worker_process_killed_while_the_main_process_gathers_is_raised():
    loader = fl.DataLoader(fl.ArrayDataset(np.arange(1 << 16)), batch_size=8, num_workers=2)
    it = iter(loader)
    next(it)
    victim = it.worker_pids[1]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 10
    with pytest.raises(fl.WorkerDiedError) as info:
        while time.monotonic() < deadline:
            next(it)
    assert info.value.pid == victim and "while idle" in str(info.value)


def shift_this_workers_rows(worker_id):
    fl.get_worker_info().dataset.arrays[0][:] += 1000  # this worker's copy only (fork)


@pytest.mark.timeout(60)
def test_a_worker_init_fn_may_change_its_workers_rows(tasks_to_workers):
    # NOTE [ Small gathers ]: with worker processes and a worker_init_fn,
    # the workers gather, from the copy worker_init_fn may have changed.
    dataset = fl.ArrayDataset(np.arange(32))
    loader = fl.DataLoader(dataset, batch_size=4, num_workers=2,
                           worker_init_fn=shift_this_workers_rows,
                           multiprocessing_context="fork")
    got = [int(v) for batch in loader for v in batch[0]]
    assert got == [1000 + i for i in range(32)]
    assert dataset.arrays[0][0] == 0 and len(tasks_to_workers) == 8


@pytest.mark.parametrize("method", METHODS)
def test_a_failing_gather_of_drawn_index_arrays_reaches_its_worker_as_a_list(
        method, tasks_to_workers):
    # For small gathers fastload's own samplers draw each batch's indices
    # as an array (BatchSampler._index_arrays); a batch a worker loads after
    # all gets them as iter() yields them, a list.
    sampler = fl.RandomSampler(range(12), generator=0)  # 2 more than the dataset has
    loader = fl.DataLoader(fl.ArrayDataset(np.arange(10)), sampler=sampler, batch_size=12,
                           num_workers=2, worker_method=method)
    it = iter(loader)
    assert it._index_arrays
    with pytest.raises(IndexError, match=r"indices \[\d+(, \d+){11}\]"):
        next(it)
    assert tasks_to_workers == [0]


@pytest.mark.parametrize("settings, drawn_as_arrays", [
    (dict(num_workers=2, shuffle=True), True),
    (dict(num_workers=2, worker_method="thread", shuffle=True), True),
    (dict(num_workers=2), False),  # sequential batches: lists cost less
    (dict(num_workers=2, worker_method="thread", worker_init_fn=int, shuffle=True), True),
    # Without workers ArrayDataset.__getitems__ reads an array as a list.
    (dict(num_workers=0, shuffle=True), True),
    (dict(num_workers=2, worker_init_fn=int, shuffle=True), False),  # the workers gather
    (dict(num_workers=2, sampler=[3, 1, 2]), False),  # the user's sampler
])
def test_which_loaders_draw_index_arrays(settings, drawn_as_arrays):
    dataset = fl.ArrayDataset(np.arange(10))
    loader = fl.DataLoader(dataset, batch_size=2, generator=4, **settings)
    it = iter(loader)
    assert it._index_arrays is drawn_as_arrays
    alone = {k: v for k, v in settings.items() if k in ("shuffle", "sampler")}
    expected = fl.DataLoader(dataset, batch_size=2, generator=4, **alone)
    assert [b[0].tolist() for b in it] == [b[0].tolist() for b in expected]


class OwnArrayDataset(fl.ArrayDataset):
    def __getitems__(self, indices):
        assert type(indices) is list  # torch's batch samplers give lists
        return super().__getitems__(indices)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_subclass_of_array_dataset_gets_lists(num_workers):
    dataset = OwnArrayDataset(np.arange(10))
    loader = fl.DataLoader(dataset, batch_size=3, shuffle=True, generator=1,
                           num_workers=num_workers)
    it = iter(loader)
    assert not it._index_arrays
    assert sorted(i for b in it for i in b[0].tolist()) == list(range(10))
