"""Mid-epoch resume: state_dict / load_state_dict deliver exactly the batches
that were still to come (NOTE [ Resume contract ])."""
import json
import pickle
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import fastload as fl

N = 37
BATCH = 4
BATCHES_PER_EPOCH = -(-N // BATCH)  # 10


class Augmented(fl.Dataset):
    """Map-style; each sample carries a random 'augmentation' from sample_rng()."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return np.array([i], dtype=np.int64), fl.sample_rng().random(2)


class Counting(fl.IterableDataset):
    """Iterable with state: the position of its iterator, sharded by worker."""

    def __init__(self, n=N, stateful=True):
        self.n = n
        self.position = 0
        self.stateful = stateful

    def __iter__(self):
        info = fl.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        items = list(range(start, self.n, step))
        while self.position < len(items):
            self.position += 1
            yield np.array([items[self.position - 1]], dtype=np.int64)
        self.position = 0

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


class Stateless(Counting):
    state_dict = None
    load_state_dict = None


class Reversed(fl.Sampler):
    """A custom sampler with state: indices from the end, a step of two."""

    def __init__(self, n):
        self.n = n
        self.done = 0
        self.resume_at = 0

    def __iter__(self):
        self.done = self.resume_at
        self.resume_at = 0
        order = list(range(self.n - 1, -1, -2))
        while self.done < len(order):
            self.done += 1
            yield order[self.done - 1]
        self.done = 0  # run out: the next iteration starts from the top

    def __len__(self):
        return (self.n + 1) // 2

    def state_dict(self):
        return {"done": self.done}

    def load_state_dict(self, state):
        self.resume_at = state["done"]


CONFIGS = {
    "sequential": lambda w, p=False: fl.DataLoader(Augmented(), batch_size=BATCH, num_workers=w,
                                             persistent_workers=p, generator=5),
    "shuffled": lambda w, p=False: fl.DataLoader(Augmented(), batch_size=BATCH, shuffle=True,
                                           num_workers=w, persistent_workers=p, generator=5),
    "custom_sampler": lambda w, p=False: fl.DataLoader(Augmented(), batch_size=BATCH,
                                                 sampler=Reversed(N), num_workers=w,
                                                 persistent_workers=p, generator=5),
    "stateless_sampler": lambda w, p=False: fl.DataLoader(Augmented(), batch_size=BATCH,
                                                    sampler=list(range(N))[::-1], num_workers=w,
                                                    persistent_workers=p, generator=5),
    "iterable": lambda w, p=False: fl.DataLoader(Counting(), batch_size=BATCH, num_workers=w,
                                           persistent_workers=p),
    "iterable_stateless": lambda w, p=False: fl.DataLoader(Stateless(), batch_size=BATCH,
                                                     num_workers=w, persistent_workers=p),
}


def as_bytes(batch):
    if isinstance(batch, (list, tuple)):
        return b"|".join(as_bytes(b) for b in batch)
    return np.ascontiguousarray(batch).tobytes()


def epochs(loader, count):
    return [[as_bytes(b) for b in loader] for _ in range(count)]


def run_with_interruption(make, stop_after, run_out=False):
    """Take `stop_after` batches (across epochs) and, with `run_out`, the
    StopIteration after them; checkpoint, resume in a fresh loader, and
    return everything delivered, epoch by epoch."""
    loader = make()
    got, taken = [], 0
    it = iter(loader)
    current = []
    while taken < stop_after:
        try:
            current.append(as_bytes(next(it)))
            taken += 1
        except StopIteration:
            got.append(current)
            current = []
            it = iter(loader)
    if run_out:
        assert next(it, None) is None
        got.append(current)
        current = []
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    del it, loader
    resumed = make()
    resumed.load_state_dict(state)
    current += [as_bytes(b) for b in resumed]
    got.append(current)
    while len(got) < 2:
        got.append([as_bytes(b) for b in resumed])
    return got


@pytest.mark.parametrize("workers, persistent", [(0, False), (2, False), (2, True)])
@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("stop", ["start", "middle", "last_batch", "all_batches", "ran_out",
                                  "next_epoch"])
def test_resume_yields_exactly_the_remaining_batches(config, workers, persistent, stop):
    make = lambda: CONFIGS[config](workers, persistent)  # noqa: E731
    want = epochs(make(), 2)
    per_epoch = len(want[0])
    if config.startswith("iterable") and workers:
        # Two shards of 37 items: 19 and 18, so 5 + 5 batches per epoch.
        assert per_epoch == 10
    stop_after = {"start": 0, "middle": per_epoch // 2, "last_batch": per_epoch - 1,
                  "all_batches": per_epoch, "ran_out": per_epoch,
                  "next_epoch": per_epoch + 2}[stop]
    assert run_with_interruption(make, stop_after, run_out=stop == "ran_out") == want


def test_state_is_json_serialisable_for_numpy_generators():
    loader = CONFIGS["shuffled"](2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    resumed = CONFIGS["shuffled"](2)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    rest = [as_bytes(b) for b in resumed]
    want = epochs(CONFIGS["shuffled"](0), 1)[0]
    assert rest == want[1:]


def test_resume_in_a_fresh_process(tmp_path):
    loader = CONFIGS["shuffled"](2)
    it = iter(loader)
    for _ in range(4):
        next(it)
    (tmp_path / "state.pkl").write_bytes(pickle.dumps(loader.state_dict()))
    script = textwrap.dedent(f"""
        import pickle, sys
        sys.path.insert(0, {str(__import__('os').path.dirname(__file__))!r})
        from test_resume import CONFIGS, as_bytes
        loader = CONFIGS["shuffled"](2)
        loader.load_state_dict(pickle.loads(open({str(tmp_path / 'state.pkl')!r}, "rb").read()))
        pickle.dump([as_bytes(b) for b in loader], sys.stdout.buffer)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    want = epochs(CONFIGS["shuffled"](0), 1)[0]
    assert pickle.loads(out.stdout) == want[4:]


def test_resume_does_not_fetch_skipped_samples():
    fetched = []

    class Recording(fl.Dataset):
        def __len__(self):
            return 100

        def __getitem__(self, i):
            fetched.append(i)
            return i

    loader = fl.DataLoader(Recording(), batch_size=10, shuffle=True, generator=1)
    it = iter(loader)
    first = [next(it) for _ in range(6)]
    state = loader.state_dict()
    fetched.clear()
    resumed = fl.DataLoader(Recording(), batch_size=10, shuffle=True, generator=1)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(fetched) == 40  # only the four remaining batches were read
    assert sorted(np.concatenate(first + rest).tolist()) == list(range(100))


@pytest.mark.parametrize("workers", [0, 1, 2, 4])
def test_sample_rng_makes_epochs_independent_of_worker_count(workers):
    want = epochs(CONFIGS["shuffled"](0), 2)
    assert epochs(CONFIGS["shuffled"](workers), 2) == want


def test_sample_rng_outside_a_loader_says_how_to_use_it():
    with pytest.raises(RuntimeError, match="sample_rng"):
        fl.sample_rng()


@pytest.mark.parametrize("change, message", [
    (dict(batch_size=5), "batch_size is 5 here but 4"),
    (dict(drop_last=True), "drop_last is True here but False"),
])
def test_incompatible_state_is_refused(change, message):
    """As torchdata: the load goes through and the iter() that would resume
    raises, a ValueError and the AssertionError torchdata raises; again at
    every iter() until another state is loaded."""
    loader = fl.DataLoader(Augmented(), batch_size=4)
    next(iter(loader))
    state = loader.state_dict()
    other = fl.DataLoader(Augmented(), **{"batch_size": 4, **change})
    other.load_state_dict(state)
    for error in (ValueError, AssertionError, fl.StateMismatchError):
        with pytest.raises(error, match=message):
            iter(other)
    other.load_state_dict({})
    assert len(list(other)) == len(other)


def test_state_of_another_dataset_length_is_refused():
    loader = fl.DataLoader(fl.ArrayDataset(np.arange(10)), batch_size=2)
    next(iter(loader))
    state = loader.state_dict()
    other = fl.DataLoader(fl.ArrayDataset(np.arange(11)), batch_size=2)
    other.load_state_dict(state)
    with pytest.raises(fl.StateMismatchError, match="dataset_length is 11 here but 10"):
        iter(other)


def test_a_refused_state_that_ran_out_restores_nothing():
    """A state taken after its epoch ran out restores the sampler at
    load_state_dict, unless it does not fit: then nothing is touched."""
    loader = fl.DataLoader(fl.ArrayDataset(np.arange(10)), batch_size=2, shuffle=True,
                           generator=5)
    list(loader)
    state = loader.state_dict()
    other = fl.DataLoader(fl.ArrayDataset(np.arange(10)), batch_size=3, shuffle=True,
                          generator=5)
    fresh = fl.DataLoader(fl.ArrayDataset(np.arange(10)), batch_size=3, shuffle=True,
                          generator=5)
    other.load_state_dict(state)
    with pytest.raises(fl.StateMismatchError, match="batch_size is 3 here but 2"):
        iter(other)
    other.load_state_dict({})
    assert [b[0].tolist() for b in other] == [b[0].tolist() for b in fresh]


def test_a_refused_state_resumes_once_the_loader_is_set_to_fit_it():
    """A state refused at iter() is kept: set the loader to fit it (here
    its num_workers) and the next iter() resumes it whole, the restores of
    a state taken between epochs included."""
    class Stream(fl.IterableDataset):
        def __init__(self):
            self.epoch = 0

        def __iter__(self):
            yield from range(self.epoch * 100, self.epoch * 100 + 4)
            self.epoch += 1

        def state_dict(self):
            return {"epoch": self.epoch}

        def load_state_dict(self, state):
            self.epoch = state["epoch"]

    saved = fl.DataLoader(Stream(), batch_size=2)
    list(saved)
    state = saved.state_dict()
    other = fl.DataLoader(Stream(), batch_size=2, num_workers=1)
    other.load_state_dict(state)
    with pytest.raises(fl.StateMismatchError, match="num_workers is 1 here but 0"):
        iter(other)
    other.num_workers = 0
    assert [b.tolist() for b in other] == [[100, 101], [102, 103]]


def test_iterable_state_needs_the_same_worker_count():
    loader = fl.DataLoader(Counting(), batch_size=2, num_workers=2)
    next(iter(loader))
    state = loader.state_dict()
    other = fl.DataLoader(Counting(), batch_size=2)
    other.load_state_dict(state)
    with pytest.raises(fl.StateMismatchError, match="num_workers is 0 here but 2"):
        iter(other)


def test_not_a_state_is_refused():
    with pytest.raises(ValueError, match="not a fastload DataLoader state"):
        fl.DataLoader(Augmented()).load_state_dict({"foo": 1})


def test_snapshot_every_n_steps_still_resumes_exactly():
    make = lambda: fl.DataLoader(Counting(), batch_size=2, num_workers=2,  # noqa: E731
                                 snapshot_every_n_steps=3)
    want = epochs(make(), 2)
    assert run_with_interruption(make, 5) == want


def test_samplers_resume_in_constant_time():
    sampler = fl.RandomSampler(range(10**6), generator=3)
    it = iter(sampler)
    head = [next(it) for _ in range(10)]
    state = sampler.state_dict()
    again = fl.RandomSampler(range(10**6), generator=3)
    again.load_state_dict(state)
    rest = list(itertools_islice(iter(again), 5))
    full = list(itertools_islice(iter(fl.RandomSampler(range(10**6), generator=3)), 15))
    assert head + rest == full


def itertools_islice(it, n):
    import itertools
    return itertools.islice(it, n)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_positions_match_torchdata(workers, shuffle):
    torch = pytest.importorskip("torch", reason="the reference implementation needs torch")
    stateful = pytest.importorskip("torchdata.stateful_dataloader",
                                   reason="torchdata's StatefulDataLoader is the reference")
    data = list(range(50))

    def reference():
        generator = torch.Generator().manual_seed(9)
        return stateful.StatefulDataLoader(data, batch_size=4, shuffle=shuffle,
                                           num_workers=workers, generator=generator)

    def ours():
        generator = torch.Generator().manual_seed(9)
        return fl.DataLoader(data, batch_size=4, shuffle=shuffle, num_workers=workers,
                             generator=generator)

    def remaining_after(make, taken):
        loader = make()
        it = iter(loader)
        head = [np.asarray(next(it)).tolist() for _ in range(taken)]
        state = loader.state_dict()
        del it
        resumed = make()
        resumed.load_state_dict(state)
        return head, [np.asarray(b).tolist() for b in resumed]

    ours_head, ours_rest = remaining_after(ours, 5)
    ref_head, ref_rest = remaining_after(reference, 5)
    if not shuffle:
        assert (ours_head, ours_rest) == (ref_head, ref_rest)
    # torchdata shuffles with its own sampler (and differently per worker
    # count), so with shuffle the positions are compared, not the indices:
    # the same batches remain, of the same sizes, completing the epoch.
    assert [len(b) for b in ours_rest] == [len(b) for b in ref_rest]
    for head, rest in ((ours_head, ours_rest), (ref_head, ref_rest)):
        assert sorted(sum(head + rest, [])) == data


def test_state_before_the_first_batch_of_a_later_epoch():
    make = lambda: fl.DataLoader(Augmented(), batch_size=4, generator=5,  # noqa: E731
                                 sampler=fl.RandomSampler(range(N), generator=1))
    want = epochs(make(), 2)[1]
    loader = make()
    list(loader)
    it = iter(loader)
    state = loader.state_dict()
    del it
    resumed = make()
    list(resumed)  # the sampler object of a rebuilt loader starts elsewhere
    resumed.load_state_dict(state)
    assert [as_bytes(b) for b in resumed] == want


@pytest.mark.parametrize("persistent", [False, True])
def test_state_of_a_loader_never_iterated(persistent):
    make = lambda: CONFIGS["shuffled"](2, persistent)  # noqa: E731
    want = epochs(make(), 2)
    resumed = make()
    resumed.load_state_dict(make().state_dict())
    assert epochs(resumed, 2) == want


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_taken_at_iter_after_an_epoch_left_early_starts_the_new_epoch(workers):
    # The sampler's iteration starts at iter(): a state taken before the new
    # epoch's first batch no longer holds the position of the one left.
    def make():
        return fl.DataLoader(np.arange(40), batch_size=4, shuffle=True, generator=7,
                             num_workers=workers)

    loader = make()
    left = iter(loader)
    next(left), next(left)
    it = iter(loader)
    state = json.loads(json.dumps(loader.state_dict()))
    expected = [b.tolist() for b in it] + [b.tolist() for b in loader]
    resumed = make()
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] + [b.tolist() for b in resumed] == expected


class EpochCounting:
    """A sampler whose state is its epoch and its place in it; running out
    moves it to the next epoch, which is shuffled another way."""

    def __init__(self, n):
        self.n, self.epoch, self.done = n, 0, 0

    def __iter__(self):
        order = np.random.default_rng(self.epoch).permutation(self.n).tolist()
        while self.done < self.n:
            self.done += 1
            yield order[self.done - 1]
        self.epoch, self.done = self.epoch + 1, 0

    def __len__(self):
        return self.n

    def state_dict(self):
        return {"epoch": self.epoch, "done": self.done}

    def load_state_dict(self, state):
        self.epoch, self.done = state["epoch"], state["done"]


def torch_batch_sampler(sampler, batch_size):
    torch = pytest.importorskip("torch", reason="torch's BatchSampler")
    return torch.utils.data.BatchSampler(sampler, batch_size, drop_last=False)


@pytest.mark.parametrize("workers", [{}, dict(num_workers=2),
                                     dict(num_workers=2, worker_method="thread")],
                         ids=["0 workers", "processes", "threads"])
@pytest.mark.parametrize("batching", [
    lambda sampler: dict(sampler=sampler, batch_size=3),
    lambda sampler: dict(batch_sampler=fl.BatchSampler(sampler, 3, drop_last=False)),
    lambda sampler: dict(batch_sampler=torch_batch_sampler(sampler, 3)),
], ids=["sampler", "fastload's batch sampler", "torch's batch sampler"])
@pytest.mark.parametrize("done, stop", [(0, 2), (0, 4), (1, 2)],
                         ids=["mid-epoch", "after the last batch", "in a later epoch"])
def test_a_sampler_with_a_state_resumed_at_any_batch_goes_on_to_its_next_epochs(
        batching, workers, done, stop):
    """torchdata's contract: a sampler restored from its state continues the
    saved epoch at its next iteration, so the resumed epoch runs it out (the
    state taken right after the last batch included, before StopIteration)
    and it counts that epoch as done. Under torch's BatchSampler too, which
    keeps no state of its own."""
    def make():
        return fl.DataLoader(np.arange(12), **workers, **batching(EpochCounting(12)))

    def lists(loader, count):
        return [[b.tolist() for b in loader] for _ in range(count)]

    expected = lists(make(), 3)
    loader = make()
    before = lists(loader, done)
    it = iter(loader)
    head = [next(it).tolist() for _ in range(stop)]
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    resumed = make()
    resumed.load_state_dict(state)
    rest = lists(resumed, 3 - done)
    assert before + [head + rest[0]] + rest[1:] == expected


@pytest.mark.parametrize("workers,method", [(0, "multiprocessing"), (2, "multiprocessing"),
                                            (2, "thread")])
def test_enumerate_counts_on_from_where_a_loaded_state_resumes(workers, method):
    """torchdata's StatefulDataLoader.enumerate: positions in the epoch."""
    def make():
        return fl.DataLoader(np.arange(20), batch_size=2, shuffle=True, generator=4,
                             num_workers=workers, worker_method=method)

    loader = make()
    assert [i for i, _ in loader.enumerate(start=7)] == list(range(7, 17))
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    rest = [b.tolist() for b in it]
    resumed = make()
    resumed.load_state_dict(state)
    numbered = list(resumed.enumerate())
    assert [i for i, _ in numbered] == list(range(3, 10))
    assert [b.tolist() for _, b in numbered] == rest
    # The next epoch is a new one: counted from start again.
    assert [i for i, _ in resumed.enumerate(start=1)] == list(range(1, 11))


@pytest.mark.parametrize("workers", [0, 2])
def test_enumerate_of_an_iterable_dataset_and_of_a_state_at_an_epochs_end(workers):
    loader = fl.DataLoader(Counting(), batch_size=BATCH, num_workers=workers)
    assert [i for i, _ in loader.enumerate()] == list(range(BATCHES_PER_EPOCH))
    state = loader.state_dict()  # the epoch ran out: the next one is new
    resumed = fl.DataLoader(Counting(), batch_size=BATCH, num_workers=workers)
    resumed.load_state_dict(state)
    assert [i for i, _ in resumed.enumerate()] == list(range(BATCHES_PER_EPOCH))


class SlowFirstBatch(fl.Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        if i < 2:
            time.sleep(0.5)
        return i


def test_enumerate_counts_batches_delivered_out_of_order():
    def make():
        return fl.DataLoader(SlowFirstBatch(), batch_size=2, num_workers=2, in_order=False)

    loader = make()
    numbered = loader.enumerate()
    head = [next(numbered) for _ in range(3)]
    assert [i for i, _ in head] == [0, 1, 2]
    assert 0 not in np.concatenate([b for _, b in head])  # the slow one is still to come
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    rest = list(resumed.enumerate())
    assert [i for i, _ in rest] == [3, 4, 5]
    assert sorted(np.concatenate([b for _, b in head + rest]).tolist()) == list(range(12))
