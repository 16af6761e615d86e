"""Checkpoints of datasets with a state of their own, with torchdata's
semantics (NOTE [ Resume contract ] in fastload._checkpoint): the order of calls,
the end of an epoch, stateful iterators, map-style datasets."""
import json
import time

import numpy as np
import pytest

import fastload as fl


class Cursor(fl.IterableDataset):
    """Sets its cursor up in __iter__ and returns itself: the common way to
    write a resumable stream. Counts its epochs when it runs out."""

    def __init__(self, n=10):
        self.n, self.i, self.epoch = n, 0, 0

    def __iter__(self):
        self.i = 0
        return self

    def __next__(self):
        if self.i >= self.n:
            self.epoch += 1
            raise StopIteration
        self.i += 1
        return self.epoch * 100 + self.i - 1

    def state_dict(self):
        return {"i": self.i, "epoch": self.epoch}

    def load_state_dict(self, state):
        self.i, self.epoch = state["i"], state["epoch"]


class RandomWalk:
    """An iterator with its own randomness and its own state."""

    def __init__(self, seed, n):
        self.rng, self.left = np.random.default_rng(seed), n

    def __iter__(self):
        return self

    def __next__(self):
        if self.left == 0:
            raise StopIteration
        self.left -= 1
        return int(self.rng.integers(0, 1_000_000))

    def state_dict(self):
        return {"rng": self.rng.bit_generator.state, "left": self.left}

    def load_state_dict(self, state):
        self.rng.bit_generator.state, self.left = state["rng"], state["left"]


class Walks(fl.IterableDataset):
    """Stateless itself; each iter() a fresh walk (its seed from the
    global RNG, so a replay from the start would differ)."""

    iterators_made = 0

    def __iter__(self):
        type(self).iterators_made += 1
        return RandomWalk(int(np.random.randint(1 << 30)), 12)


def values(batches):
    return [int(v) for batch in batches for v in batch]


def test_an_empty_state_starts_fresh():
    loader = fl.DataLoader(fl.ArrayDataset(np.arange(8)), batch_size=2)
    loader.load_state_dict({})
    assert values(b[0] for b in loader) == list(range(8))


@pytest.mark.parametrize("workers,method", [(0, "multiprocessing"), (2, "multiprocessing"),
                                            (2, "thread")])
def test_snapshot_every_zero_resumes_by_counting(workers, method):
    def make():
        return fl.DataLoader(fl.ArrayDataset(np.arange(20)), batch_size=2, shuffle=True,
                             generator=3, num_workers=workers, snapshot_every_n_steps=0,
                             worker_method=method)

    full = [b[0].tolist() for b in make()]
    loader = make()
    it = iter(loader)
    head = [next(it)[0].tolist() for _ in range(4)]
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    assert head + [b[0].tolist() for b in resumed] == full


@pytest.mark.parametrize("workers", [0, 2])
def test_a_cursor_set_up_in_iter_is_restored_after_iter(workers):
    loader = fl.DataLoader(Cursor(), batch_size=2, num_workers=workers)
    it = iter(loader)
    head = values(next(it) for _ in range(2))
    state = loader.state_dict()
    resumed = fl.DataLoader(Cursor(), batch_size=2, num_workers=workers)
    resumed.load_state_dict(state)
    rest = values(resumed)
    if workers == 0:
        assert head + rest == list(range(10))
    else:  # each worker streams its own replica of the whole dataset
        assert sorted(head + rest) == sorted(list(range(10)) * 2)


def test_the_end_of_an_epoch_is_taken_after_the_dataset_saw_it():
    dataset = Cursor()
    loader = fl.DataLoader(dataset, batch_size=5)
    assert values(loader) == list(range(10))
    state = loader.state_dict()
    assert state["dataset"] == {"i": 10, "epoch": 1}
    resumed = fl.DataLoader(Cursor(), batch_size=5)
    resumed.load_state_dict(state)
    assert values(resumed) == list(range(100, 110))  # the next epoch, as uninterrupted
    assert values(loader) == list(range(100, 110))


@pytest.mark.parametrize("workers", [0, 1])
def test_a_stateful_iterator_is_checkpointed_itself(workers):
    np.random.seed(0)
    loader = fl.DataLoader(Walks(), batch_size=3, num_workers=workers)
    uninterrupted = values(loader)
    np.random.seed(0)
    loader = fl.DataLoader(Walks(), batch_size=3, num_workers=workers)
    it = iter(loader)
    head = values(next(it) for _ in range(2))
    state = loader.state_dict()
    np.random.seed(12345)  # a replay from the start would draw another walk
    resumed = fl.DataLoader(Walks(), batch_size=3, num_workers=workers)
    resumed.load_state_dict(state)
    assert head + values(resumed) == uninterrupted


def test_a_state_before_the_first_batch_holds_the_dataset():
    dataset = Cursor()
    dataset.epoch = 3
    loader = fl.DataLoader(dataset, batch_size=5)
    before = loader.state_dict()
    iter(loader)
    right_after_iter = loader.state_dict()
    for state in (before, right_after_iter):
        moved_on = Cursor()
        moved_on.epoch, moved_on.i = 7, 4
        resumed = fl.DataLoader(moved_on, batch_size=5)
        resumed.load_state_dict(state)
        assert values(resumed) == list(range(300, 310))


class Counting(fl.Dataset):
    """A map-style dataset with a state: how many samples it served."""

    def __init__(self):
        self.served = 0

    def __len__(self):
        return 12

    def __getitem__(self, i):
        self.served += 1
        return np.array([i, self.served])

    def state_dict(self):
        return {"served": self.served}

    def load_state_dict(self, state):
        self.served = state["served"]


def test_a_map_style_dataset_state_is_saved_and_restored():
    full = [b.tolist() for b in fl.DataLoader(Counting(), batch_size=3)]
    loader = fl.DataLoader(Counting(), batch_size=3)
    it = iter(loader)
    head = [next(it).tolist() for _ in range(2)]
    state = loader.state_dict()
    assert state["dataset"] == {"served": 6}
    resumed = fl.DataLoader(Counting(), batch_size=3)
    resumed.load_state_dict(state)
    assert head + [b.tolist() for b in resumed] == full


class ShardedCursor(Cursor):
    """Cursor, each worker streaming its own share."""

    def __iter__(self):
        info = fl.get_worker_info()
        self.i = 0 if info is None else info.id
        self.step = 1 if info is None else info.num_workers
        return self

    def __next__(self):
        if self.i >= self.n:
            self.epoch += 1
            raise StopIteration
        self.i += self.step
        return self.epoch * 100 + self.i - self.step


def test_persistent_workers_resumed_between_epochs_start_where_their_streams_ended():
    def make():
        return fl.DataLoader(ShardedCursor(), batch_size=2, num_workers=2,
                             persistent_workers=True)

    uninterrupted = make()
    epochs = [sorted(values(uninterrupted)) for _ in range(2)]
    assert epochs[1] == list(range(100, 110))  # each replica counted its epoch
    saved = make()
    sorted(values(saved))
    state = saved.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    assert sorted(values(resumed)) == epochs[1]


@pytest.mark.parametrize("method", ["multiprocessing", "thread"])
@pytest.mark.parametrize("every", [0, 1, 2])
def test_a_state_before_a_persistent_workers_first_batch_of_an_epoch_holds_its_stream(
        every, method):
    """Persistent workers' streams in a later epoch go on from the earlier
    ones (their epoch counter moved on): a state taken before a worker
    delivers in that epoch holds the stream it started (its STARTED), not
    a fresh copy's."""
    def make():
        return fl.DataLoader(ShardedCursor(6), batch_size=2, num_workers=2,
                             persistent_workers=True, worker_method=method,
                             snapshot_every_n_steps=every)

    for taken in (0, 1):
        def run(loader, interrupt):
            values(loader)
            it = iter(loader)
            for _ in range(taken):
                next(it)
            return loader.state_dict() if interrupt else values(it)

        expected = run(make(), False)
        assert len(expected) == 6 - 2 * taken and min(expected) >= 100  # the second epoch
        resumed = make()
        resumed.load_state_dict(json.loads(json.dumps(run(make(), True))))
        assert values(resumed) == expected, taken


def test_a_state_of_a_run_resumed_between_epochs_holds_every_replica():
    """Persistent worker processes resumed from an end-of-epoch state start
    each replica where the saved run left it; a state taken before a worker
    delivers in that epoch holds that replica too, not a fresh copy."""
    def make():
        return fl.DataLoader(Counting(), batch_size=4, num_workers=2, persistent_workers=True)

    def served(batches):
        return [int(batch[0][1]) for batch in batches]

    uninterrupted = make()
    list(uninterrupted)
    end_of_epoch = json.loads(json.dumps(uninterrupted.state_dict()))
    expected = served(uninterrupted)
    resumed = make()
    resumed.load_state_dict(end_of_epoch)
    it = iter(resumed)
    head = served([next(it)])  # worker 0's; worker 1 has delivered nothing yet
    state = json.loads(json.dumps(resumed.state_dict()))
    del it
    again = make()
    again.load_state_dict(state)
    assert head + served(again) == expected and len(expected) == 3


@pytest.mark.parametrize("workers,method", [(1, "multiprocessing"), (2, "multiprocessing"),
                                            (2, "thread")])
@pytest.mark.parametrize("every", [0, 7])
def test_a_worker_stream_that_ran_out_inside_a_batch_is_saved_at_its_end(workers, method,
                                                                          every):
    """The batch inside which a worker's stream runs out carries the
    stream's state then, whatever the snapshot step: a state taken before
    the StopIteration, resumed, run out and saved again, still starts the
    next epoch where the uninterrupted run does."""
    def make():
        return fl.DataLoader(ShardedCursor(10), batch_size=4, num_workers=workers,
                             worker_method=method, persistent_workers=True,
                             snapshot_every_n_steps=every)

    uninterrupted = make()
    it = iter(uninterrupted)
    for _ in range(3 if workers == 1 else 4):  # 4+4+2 or 4+1 each: all, no StopIteration
        next(it)
    last_batch = json.loads(json.dumps(uninterrupted.state_dict()))
    values(it)
    expected = values(uninterrupted)
    resumed = make()
    resumed.load_state_dict(last_batch)
    assert values(resumed) == []
    again = make()
    again.load_state_dict(json.loads(json.dumps(resumed.state_dict())))
    assert values(again) == expected and min(expected) >= 100


class CountingFailing(Counting):
    """Counting whose sample 2 raises, after counting it."""

    def __getitem__(self, i):
        sample = super().__getitem__(i)
        if i == 2:
            raise KeyError("no sample two")
        return sample


@pytest.mark.parametrize("workers,method", [(0, "multiprocessing"), (1, "multiprocessing"),
                                            (1, "thread")])
def test_what_a_failed_batch_did_to_the_dataset_is_resumed_too(workers, method):
    """A batch delivered as its exception still moved the dataset (its
    fetch counted): a state taken after it resumes from there, with worker
    processes too (their FAILED carries the replica's state)."""
    def make():
        return fl.DataLoader(CountingFailing(), batch_size=1, num_workers=workers,
                             worker_method=method)

    loader = make()
    it = iter(loader)
    next(it), next(it)
    with pytest.raises(KeyError, match="no sample two"):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    rest = [b.tolist() for b in it]
    resumed = make()
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == rest
    assert [row[0][1] for row in rest][:1] == [4]


class SlowAfterTwo(Counting):
    """Counting whose samples from 2 on take a while: an abandoned epoch's
    prefetched fetches are still running when the next iter() comes."""

    def __getitem__(self, i):
        if i >= 2:
            time.sleep(0.1)
        return super().__getitem__(i)


@pytest.mark.parametrize("method", ["multiprocessing", "thread"])
def test_a_new_epoch_saves_its_dataset_after_an_abandoned_epochs_fetches(method):
    """iter() after an epoch left early waits until the workers are done
    with its prefetched tasks (their STARTED): the dataset's state taken
    then (the threads' shared one, each process's replica) is where the new
    epoch starts, those fetches included."""
    def make():
        return fl.DataLoader(SlowAfterTwo(), batch_size=1, num_workers=1,
                             worker_method=method, persistent_workers=True)

    loader = make()
    it = iter(loader)
    next(it), next(it)
    it = iter(loader)  # the epoch left early, tasks still being fetched
    state = json.loads(json.dumps(loader.state_dict()))
    rest = [b.tolist() for b in it]
    resumed = make()
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == rest
    dataset = state["dataset"] if method == "thread" else state["workers"][0]["state"]
    assert dataset["served"] == rest[0][0][1] - 1


class SlowFirst(fl.Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        if i == 0:
            time.sleep(1.0)  # batch 0 comes after the first few others
        return i


@pytest.mark.parametrize("method", ["multiprocessing", "thread"])
@pytest.mark.parametrize("resume_workers", [0, 2])
def test_in_order_false_with_workers_resumes_every_batch_exactly_once(resume_workers, method):
    def make(workers, in_order):
        return fl.DataLoader(SlowFirst(), batch_size=2, num_workers=workers,
                             in_order=in_order, worker_method=method)

    loader = make(2, False)
    it = iter(loader)
    head = [next(it).tolist() for _ in range(6)]
    state = loader.state_dict()
    assert state["delivered_beyond"], "the slow batches came later: a gap is expected"
    assert len(str(state)) < 4096
    resumed = make(resume_workers, resume_workers == 0)
    resumed.load_state_dict(state)
    rest = [batch.tolist() for batch in resumed]
    delivered = sorted(v for batch in head + rest for v in batch)
    assert delivered == list(range(40))  # each sample exactly once
    assert sorted(map(tuple, head + rest)) == sorted(
        map(tuple, (b.tolist() for b in make(0, True))))


def test_a_stateful_stream_with_snapshot_every_zero_resumes_in_worker_threads():
    def make():
        return fl.DataLoader(Cursor(12), batch_size=2, num_workers=2, worker_method="thread",
                             snapshot_every_n_steps=0)

    full = values(make())
    loader = make()
    it = iter(loader)
    head = values(next(it) for _ in range(3))
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    assert head + values(resumed) == full


@pytest.mark.parametrize("persistent", [False, True])
def test_map_style_dataset_states_are_kept_per_worker_replica(persistent):
    """Each worker process's replica counts what it served; a resumed loader
    puts each replica back, so the counts go on as in the uninterrupted run."""
    def make():
        return fl.DataLoader(Counting(), batch_size=3, num_workers=2,
                             persistent_workers=persistent)

    def rows(batches):
        return [b.tolist() for b in batches]

    uninterrupted = make()
    full = rows(uninterrupted) + rows(uninterrupted)
    # Each replica's count goes on over its batches, not the whole epoch's.
    assert [row[1] for row in full[0]] == [1, 2, 3] and [row[1] for row in full[1]] == [1, 2, 3]
    assert [row[1] for row in full[2]] == [4, 5, 6]
    for taken in range(5):
        loader = make()
        it = iter(loader)
        head = rows(next(it) for _ in range(taken))
        state = json.loads(json.dumps(loader.state_dict()))
        resumed = make()
        resumed.load_state_dict(state)
        got = head + rows(resumed)
        if not persistent:
            # New worker processes copy the main process's dataset again.
            assert got == full[:4]
            continue
        assert got + rows(resumed) == full, taken


@pytest.mark.parametrize("taken", [0, 1, 3])
def test_persistent_replicas_are_checkpointed_in_later_epochs_too(taken):
    """In the second epoch of persistent workers the replicas go on from the
    first: a state taken there keeps each one's count, not the main
    process's dataset."""
    def make():
        return fl.DataLoader(Counting(), batch_size=3, num_workers=2, persistent_workers=True)

    def rows(batches):
        return [b.tolist() for b in batches]

    loader = make()
    rows(loader)
    it = iter(loader)
    head = rows(next(it) for _ in range(taken))
    state = json.loads(json.dumps(loader.state_dict()))
    rest = rows(it) + rows(loader)
    assert state["workers"] is not None and state["dataset"] is None
    resumed = make()
    resumed.load_state_dict(state)
    assert rows(resumed) + rows(resumed) == rest and len(head) == taken


def test_map_style_replica_states_fit_only_as_many_worker_processes():
    loader = fl.DataLoader(Counting(), batch_size=3, num_workers=2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    # Worker 1 has delivered nothing: its replica as it started (its STARTED).
    assert [worker["state"] for worker in state["workers"]] == [{"served": 3}, {"served": 0}]
    for workers, method, difference in (
            (0, "multiprocessing", "num_workers is 0 here but 2 in the state"),
            (3, "multiprocessing", "num_workers is 3 here but 2 in the state"),
            (2, "thread", "worker_method is 'thread' here but 'multiprocessing' in the state")):
        other = fl.DataLoader(Counting(), batch_size=3, num_workers=workers,
                              worker_method=method)
        other.load_state_dict(state)
        with pytest.raises(fl.StateMismatchError, match=difference):
            iter(other)


def test_a_map_style_state_before_any_worker_loaded_seeds_every_replica():
    dataset = Counting()
    dataset.served = 50
    state = fl.DataLoader(dataset, batch_size=3, num_workers=2).state_dict()
    resumed = fl.DataLoader(Counting(), batch_size=3, num_workers=2)
    resumed.load_state_dict(state)
    assert [row[1] for b in resumed for row in b.tolist()][:6] == [51, 52, 53] * 2


@pytest.mark.parametrize("method", ["multiprocessing", "thread"])
def test_persistent_workers_of_either_method_resume_where_their_streams_ended(method):
    def make():
        return fl.DataLoader(ShardedCursor(), batch_size=2, num_workers=2,
                             persistent_workers=True, worker_method=method)

    uninterrupted = make()
    epochs = [sorted(values(uninterrupted)) for _ in range(2)]
    saved = make()
    sorted(values(saved))
    resumed = make()
    resumed.load_state_dict(saved.state_dict())
    assert sorted(values(resumed)) == epochs[1] == list(range(100, 110))


def test_worker_threads_checkpoint_the_map_style_dataset_they_share():
    def make():
        return fl.DataLoader(Counting(), batch_size=3, num_workers=2, worker_method="thread")

    loader = make()
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    assert state["workers"] is None
    # The shared dataset right after the fetch of the last delivered batch:
    # its fetches take turns, so the prefetched ones came after it.
    served = state["dataset"]["served"]
    assert served == 6
    resumed = make()
    resumed.load_state_dict(state)
    counts = sorted(row[1] for batch in resumed for row in batch.tolist())
    assert counts == list(range(served + 1, served + 7))  # the two batches left


class Drawing(fl.Dataset):
    """A map-style dataset whose every sample draws from its own generator,
    which is its state (as torchdata's tests checkpoint torch's RNG)."""

    def __init__(self):
        self.rng = np.random.default_rng(0)

    def __len__(self):
        return 30

    def __getitem__(self, i):
        return np.array([i, self.rng.integers(1000)])

    def state_dict(self):
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state):
        self.rng.bit_generator.state = state["rng"]


@pytest.mark.parametrize("every", [1, 4, 0])
def test_batches_after_a_dataset_snapshot_are_fetched_again_for_their_side_effects(every):
    """torchdata's semantics: the dataset's state at its last snapshot, then
    the batches delivered since fetched again (and dropped), so the draws
    of the rest of the epoch are the uninterrupted run's."""
    def make():
        return fl.DataLoader(Drawing(), batch_size=3, shuffle=True, generator=1,
                             snapshot_every_n_steps=every)

    full = [b.tolist() for b in make()]
    loader = make()
    it = iter(loader)
    head = [next(it).tolist() for _ in range(6)]
    resumed = make()
    resumed.load_state_dict(json.loads(json.dumps(loader.state_dict())))
    assert head + [b.tolist() for b in resumed] == full


@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
@pytest.mark.parametrize("every", [1, 4, 0])
def test_a_state_of_any_step_resumes_the_dataset_and_the_next_epoch(every, workers, persistent):
    """A state taken at any step, not only at a snapshot step, puts the
    dataset where it stood (a replica in a worker process records its state
    with every batch; in the main process the batches since the snapshot
    are fetched again), and the epoch after it shuffles as it would have,
    the last step's state included (torchdata's TestSnapshotZero and
    TestSnapshotEnd map cases)."""
    def make():
        return fl.DataLoader(Drawing(), batch_size=3, shuffle=True, generator=1,
                             num_workers=workers, snapshot_every_n_steps=every,
                             persistent_workers=persistent)

    def rows(batches):
        return [b.tolist() for b in batches]

    uninterrupted = make()
    full = rows(uninterrupted) + rows(uninterrupted)
    for taken in (0, 1, 2, 5, 10):
        loader = make()
        it = iter(loader)
        head = rows(next(it) for _ in range(taken))
        state = json.loads(json.dumps(loader.state_dict()))
        del it, loader
        resumed = make()
        resumed.load_state_dict(state)
        assert head + rows(resumed) + rows(resumed) == full, taken


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("every", [0, 2, 3])
def test_a_map_style_dataset_in_this_process_is_saved_where_its_epoch_ended(every, workers):
    """After the StopIteration, the state holds where the dataset loaded in
    this process (0 workers, threads) ended, not its last snapshot: the
    next epoch draws on from there."""
    def make():
        return fl.DataLoader(Drawing(), batch_size=4, snapshot_every_n_steps=every,
                             num_workers=workers, worker_method="thread")

    uninterrupted = make()
    list(uninterrupted)
    expected = [b.tolist() for b in uninterrupted]
    saved = make()
    list(saved)
    resumed = make()
    resumed.load_state_dict(json.loads(json.dumps(saved.state_dict())))
    assert [b.tolist() for b in resumed] == expected


@pytest.mark.parametrize("every", [0, 2, 3])
def test_a_stream_that_ran_out_inside_the_last_batch_is_saved_at_its_end(every):
    """A stream that runs out while the last (short) batch is read has seen
    its end then: a state taken before the StopIteration starts the next
    epoch where the uninterrupted run does (its epoch counter moved on)."""
    def make():
        return fl.DataLoader(Cursor(10), batch_size=4, snapshot_every_n_steps=every)

    def run(loader, interrupt):
        it = iter(loader)
        for _ in range(3):  # 4 + 4 + 2 samples: the stream ran out in the last
            next(it)
        if interrupt:
            return loader.state_dict()
        return values(it) + values(loader) + values(loader)

    expected = run(make(), False)
    assert expected == list(range(100, 110)) + list(range(200, 210))
    resumed = make()
    resumed.load_state_dict(json.loads(json.dumps(run(make(), True))))
    assert values(resumed) + values(resumed) + values(resumed) == expected


@pytest.mark.parametrize("persistent", [False, True])
def test_worker_threads_save_their_shared_dataset_where_an_epoch_starts(persistent):
    """A state taken right after iter() holds the shared dataset's state
    then (threads fetch only once tasks are sent), in later epochs too."""
    def make():
        return fl.DataLoader(Counting(), batch_size=2, num_workers=1, worker_method="thread",
                             persistent_workers=persistent)

    uninterrupted = make()
    list(uninterrupted)
    expected = [b.tolist() for b in uninterrupted]
    loader = make()
    list(loader)
    iter(loader)
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["dataset"] == {"served": 12} and state["dataset_step"] == 0
    resumed = make()
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == expected


@pytest.mark.parametrize("every", [1, 100])
def test_torchs_random_sampler_resumes_beside_a_dataset_that_sets_torchs_rng(every):
    """torch's RandomSampler draws its epoch's seed from torch's global RNG
    at its first step; a dataset whose state is that RNG is restored after,
    from a state taken after that draw when no snapshot came since the
    epoch began (``every`` past the batches delivered; torchdata's
    test_map_iterrupted_shuffle). (Not with worker threads: they draw from
    that RNG while the main thread does, as the threads' warning says.)"""
    torch = pytest.importorskip("torch", reason="torch's RandomSampler and RNG")

    class TorchDrawing(fl.Dataset):
        def __len__(self):
            return 40

        def __getitem__(self, i):
            return np.array([i, int(torch.randint(1000, ()))])

        def state_dict(self):
            return {"rng": torch.get_rng_state().tolist()}

        def load_state_dict(self, state):
            torch.set_rng_state(torch.tensor(state["rng"], dtype=torch.uint8))

    def make():
        data = TorchDrawing()
        return fl.DataLoader(data, batch_size=4, sampler=torch.utils.data.RandomSampler(data),
                             snapshot_every_n_steps=every)

    torch.manual_seed(0)
    full = [b.tolist() for b in make()]
    torch.manual_seed(0)
    loader = make()
    it = iter(loader)
    head = [next(it).tolist() for _ in range(3)]
    state = loader.state_dict()
    torch.manual_seed(0)  # as the saved run started: torch's sampler keeps no state
    resumed = make()
    resumed.load_state_dict(state)
    assert head + [b.tolist() for b in resumed] == full


class DrawingStream:
    """An iterator whose samples are draws from torch's global RNG, which it
    checkpoints (torchdata's test datasets do this)."""

    def __init__(self, torch, values):
        self.torch, self.values, self.i = torch, values, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.i >= len(self.values):
            raise StopIteration
        self.i += 1
        return self.values[int(self.torch.randint(len(self.values), ()))]

    def state_dict(self):
        return {"i": self.i, "rng": self.torch.get_rng_state().tolist()}

    def load_state_dict(self, state):
        self.i = state["i"]
        self.torch.set_rng_state(self.torch.tensor(state["rng"], dtype=self.torch.uint8))


class DrawingShards(fl.IterableDataset):
    def __iter__(self):
        import torch
        info = fl.get_worker_info()
        return DrawingStream(torch, list(range(info.id * 10, info.id * 10 + 10)))


def test_persistent_workers_resumed_after_an_epoch_restore_their_iterators_end():
    """The end-of-epoch state of a stateful iterator is loaded into a fresh
    iterator before the next epoch, as torchdata does: its side effects
    (here torch's RNG in each worker process) then stand."""
    pytest.importorskip("torch", reason="the stream draws from torch's RNG")

    def make():
        return fl.DataLoader(DrawingShards(), batch_size=None, num_workers=2,
                             persistent_workers=True, generator=4)

    loader = make()
    list(loader)
    state = loader.state_dict()
    expected = [int(x) for x in loader]
    resumed = make()
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert [int(x) for x in resumed] == expected


def test_a_resume_calls_iter_on_an_iterable_dataset_once():
    """As torchdata: one iter() per epoch, resumed or not (a dataset that
    sets its cursor up in __iter__ must not be iterated twice)."""
    class Counted(Cursor):
        calls = 0

        def __iter__(self):
            Counted.calls += 1
            return super().__iter__()

    loader = fl.DataLoader(Counted(), batch_size=2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    resumed = fl.DataLoader(Counted(), batch_size=2)
    resumed.load_state_dict(state)
    Counted.calls = 0
    assert values(resumed) == list(range(2, 10))
    assert Counted.calls == 1


class UnevenShards(fl.IterableDataset):
    """Worker w yields its own numbers, each worker a different count, and
    worker 1 slowly at first: batches arrive out of order. ``stateful``:
    its cursor is its state; else a resume reads its stream again."""

    def __init__(self, stateful):
        self.stateful, self.i = stateful, 0
        if not stateful:
            self.state_dict = self.load_state_dict = None

    def __iter__(self):
        info = fl.get_worker_info()
        self.worker, self.count, self.i = info.id, 7 + 5 * info.id, 0
        return self

    def __next__(self):
        if self.i >= self.count:
            raise StopIteration
        if self.worker == 1 and self.i < 2:
            time.sleep(0.2)
        self.i += 1
        return self.worker * 100 + self.i - 1

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, state):
        self.i = state["i"]


@pytest.mark.parametrize("method", ["multiprocessing", "thread"])
@pytest.mark.parametrize("stateful", [True, False])
@pytest.mark.parametrize("stop", [1, 4, 8])
def test_an_iterable_dataset_out_of_order_resumes_every_sample_exactly_once(method, stateful,
                                                                              stop):
    """torchdata's test_out_of_order_iterable_ds: with in_order=False a worker's
    batches still arrive in the order it made them, so its delivered ones
    are a prefix of its stream, which is what its state holds."""
    def make():
        return fl.DataLoader(UnevenShards(stateful), batch_size=2, num_workers=2,
                             in_order=False, worker_method=method)

    loader = make()
    head = []
    for step, batch in enumerate(loader):
        head += batch.tolist()
        if step == stop:
            break
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = make()
    resumed.load_state_dict(state)
    rest = values(resumed)
    assert sorted(head + rest) == list(range(7)) + list(range(100, 112))


class LiveCounter(fl.IterableDataset):
    """Its state is how often it was iterated; loading a state leaves that."""

    def __init__(self):
        self.iterated = 0

    def __iter__(self):
        self.iterated += 1
        return iter(range(6))

    def state_dict(self):
        return {"iterated": self.iterated}

    def load_state_dict(self, state):
        pass


class LiveMapCounter(fl.Dataset):
    def __init__(self):
        self.loaded = 0

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return i

    def state_dict(self):
        return {"loaded": self.loaded}

    def load_state_dict(self, state):
        self.loaded += 1


@pytest.mark.parametrize("make, expected", [(LiveCounter, {"iterated": 2}),
                                            (LiveMapCounter, {"loaded": 1})])
def test_a_state_right_after_a_resume_is_what_the_dataset_says_then(make, expected):
    """As torchdata (its TestSingleIterCalled): once restored, the dataset is
    asked for its state again, not its loaded state copied."""
    dataset = make()
    loader = fl.DataLoader(dataset, batch_size=2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    resumed = fl.DataLoader(dataset, batch_size=2)
    resumed.load_state_dict(state)
    it = iter(resumed)
    assert resumed.state_dict()["dataset"] == expected
