"""With prefetch_next_epoch, persistent workers load the next epoch's first
batches before its iter() (NOTE [ Epoch lookahead ] in fastload._lookahead):
the guess never moves the samplers or RNGs, a right guess saves the wait, a
wrong one changes no batch. Without it (the default) nothing of an epoch is
loaded before its iter()."""
import collections
import multiprocessing
import os
import time

import numpy as np
import pytest

import fastload as fl
from fastload._lookahead import next_epoch_head

try:
    import torch
    import torch.utils.data as tud
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


def fastload_samplers():
    data = range(23)
    return {
        "sequential": lambda: fl.SequentialSampler(data),
        "random-int-seed": lambda: fl.RandomSampler(data, generator=5),
        "random-numpy-generator": lambda: fl.RandomSampler(
            data, generator=np.random.default_rng(1)),
        "random-global-rng": lambda: fl.RandomSampler(data),
        "random-replacement": lambda: fl.RandomSampler(
            data, replacement=True, num_samples=40, generator=2),
        "subset": lambda: fl.SubsetRandomSampler([3, 9, 4, 17, 8], generator=3),
        "weighted": lambda: fl.WeightedRandomSampler(
            np.linspace(0.1, 1, 23), 12, replacement=False, generator=4),
        "distributed": lambda: fl.DistributedSampler(data, num_replicas=2, rank=1, seed=6),
        "batches-of-random": lambda: fl.BatchSampler(
            fl.RandomSampler(data, generator=7), 4, drop_last=False),
        "batches-of-distributed": lambda: fl.BatchSampler(
            fl.DistributedSampler(data, num_replicas=3, rank=0), 2, drop_last=True),
    }


def torch_samplers():
    data = range(23)
    return {
        "torch-sequential": lambda: tud.SequentialSampler(data),
        "torch-random-generator": lambda: tud.RandomSampler(
            data, generator=torch.Generator().manual_seed(8)),
        "torch-random-global-rng": lambda: tud.RandomSampler(data),
        "torch-subset": lambda: tud.SubsetRandomSampler([3, 9, 4, 17, 8]),
        "torch-weighted": lambda: tud.WeightedRandomSampler([0.5] * 10 + [2.0] * 13, 9),
        "torch-distributed": lambda: tud.DistributedSampler(data, num_replicas=2, rank=0),
        "torch-batches": lambda: tud.BatchSampler(
            tud.RandomSampler(data, generator=torch.Generator().manual_seed(9)), 5, False),
        "fastload-random-torch-generator": lambda: fl.RandomSampler(
            data, generator=torch.Generator().manual_seed(10)),
    }


def comparable(state):
    """A sampler state with its tensors (a torch.Generator's) as bytes."""
    if isinstance(state, dict):
        return {key: comparable(value) for key, value in state.items()}
    if torch is not None and isinstance(state, torch.Tensor):
        return state.numpy().tobytes()
    return state


def rng_snapshot(sampler):
    """Everything a look ahead must leave as it was."""
    state = comparable(sampler.state_dict()) if hasattr(sampler, "state_dict") else None
    numpy_state = np.random.get_state()[1].tobytes()
    torch_state = torch.random.get_rng_state().numpy().tobytes() if torch else None
    return state, numpy_state, torch_state


def next_epoch_set(sampler):
    """What a training loop does between epochs."""
    inner = getattr(sampler, "sampler", sampler)
    if hasattr(inner, "set_epoch"):
        inner.set_epoch(inner.epoch + 1)


def check_head(make_sampler):
    np.random.seed(0)
    if torch is not None:
        torch.manual_seed(0)
    sampler = make_sampler()
    list(sampler)  # one epoch in, as in the middle of a run
    before = rng_snapshot(sampler)
    head = next_epoch_head(sampler, 3, False)
    assert rng_snapshot(sampler) == before
    assert head == next_epoch_head(sampler, 3, False)  # still the same guess
    next_epoch_set(sampler)
    assert head == list(sampler)[:3]


@pytest.mark.parametrize("name", sorted(fastload_samplers()))
def test_head_is_the_next_epoch_and_moves_nothing(name):
    check_head(fastload_samplers()[name])


@needs_torch
@pytest.mark.parametrize("name", sorted(torch_samplers()))
def test_head_of_torch_samplers_is_the_next_epoch_and_moves_nothing(name):
    check_head(torch_samplers()[name])


def test_head_is_shorter_for_a_short_epoch():
    assert next_epoch_head(fl.BatchSampler(fl.SequentialSampler(range(5)), 2, False), 8,
                           False) == [
        [0, 1], [2, 3], [4]]


class Reversed(fl.Sampler):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n - 1, -1, -1))

    def __len__(self):
        return self.n


def test_no_head_for_samplers_it_does_not_know():
    assert next_epoch_head(Reversed(5), 2, False) is None
    assert next_epoch_head(fl.BatchSampler(Reversed(5), 2, False), 2, False) is None


def test_no_head_when_the_next_epoch_would_raise():
    data = list(range(8))
    sampler = fl.DistributedSampler(data, num_replicas=2, rank=0)
    data.clear()  # the real iteration raises, in its place
    assert next_epoch_head(sampler, 2, False) is None


class Logged(fl.Dataset):
    """Sample i is i; every load is appended to a per-process file in
    ``log_dir`` (all start methods see it), after ``delay`` seconds."""

    def __init__(self, log_dir, n=24, delay=0.0, fail_at=()):
        self.log_dir = str(log_dir)
        self.n = n
        self.delay = delay
        self.fail_at = set(fail_at)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.delay:
            time.sleep(self.delay)
        with open(os.path.join(self.log_dir, f"{os.getpid()}.log"), "a") as log:
            log.write(f"{i}\n")
        if i in self.fail_at:
            raise LookupError(f"sample {i} is broken")
        return np.int64(i)


def loads(log_dir):
    return sum(open(os.path.join(log_dir, name)).read().count("\n")
               for name in os.listdir(log_dir))


def wait_for_loads(log_dir, count, within=10.0):
    deadline = time.monotonic() + within
    while loads(log_dir) < count:
        assert time.monotonic() < deadline, f"{loads(log_dir)} loads, expected {count}"
        time.sleep(0.01)


class PlainRandomSampler(fl.RandomSampler):
    """A sampler type the look ahead does not know: loading without it."""


# Worker processes of each start method, and worker threads.
WORKERS = {"fork": {"multiprocessing_context": "fork"},
           "spawn": {"multiprocessing_context": "spawn"},
           "thread": {"worker_method": "thread"}}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", sorted(WORKERS))
def test_first_batches_of_a_new_epoch_are_loaded_before_iter(tmp_path, method):
    def shuffled(log_dir, sampler_type):
        # shuffle=True with generator=11, the sampler's type chosen.
        generator = np.random.default_rng(11)
        dataset = Logged(log_dir, n=24)
        sampler = sampler_type(dataset, generator=generator)
        return fl.DataLoader(dataset, batch_size=4, sampler=sampler, generator=generator,
                             num_workers=2, persistent_workers=True, prefetch_next_epoch=True,
                             **WORKERS[method])

    reference = shuffled(tmp_path, PlainRandomSampler)
    want = [[b.tolist() for b in reference] for _ in range(3)]
    log = tmp_path / "workers"
    log.mkdir()
    loader = shuffled(log, fl.RandomSampler)
    first = [b.tolist() for b in loader]
    # Two workers, two batches each in flight: the next epoch's first four.
    wait_for_loads(log, 24 + 4 * 4)
    time.sleep(0.05)
    assert loads(log) == 24 + 4 * 4
    later = [[b.tolist() for b in loader] for _ in range(2)]
    assert [first, *later] == want
    # The later epochs' first batches were not loaded again.
    wait_for_loads(log, 72 + 4 * 4)
    time.sleep(0.05)
    assert loads(log) == 72 + 4 * 4


@pytest.mark.timing
@pytest.mark.timeout(60)
def test_a_slow_first_batch_is_ready_at_iter(tmp_path):
    # Each batch takes 0.2 s to load; the new epoch's first one is already
    # there: it comes within 0.1 s, in the best of three epochs.
    loader = fl.DataLoader(Logged(tmp_path, n=8, delay=0.1), batch_size=2, num_workers=2,
                           persistent_workers=True, prefetch_next_epoch=True)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    latencies = []
    for epoch in range(1, 4):
        wait_for_loads(tmp_path, 8 * (epoch + 1))  # two batches in flight per worker: all four
        started = time.perf_counter()
        it = iter(loader)
        assert next(it).tolist() == [0, 1]
        latencies.append(time.perf_counter() - started)
        assert [b.tolist() for b in it] == [[2, 3], [4, 5], [6, 7]]
    assert min(latencies) < 0.1, latencies


def reference_epochs(make_loader, between, epochs):
    loader = make_loader(0)
    got = []
    for epoch in range(epochs):
        between(loader, epoch)
        got.append([b.tolist() for b in loader])
    return got


def set_epoch(loader, epoch):
    loader.sampler.set_epoch(epoch)


def set_epoch_backwards(loader, epoch):
    loader.sampler.set_epoch(10 - epoch)  # never the epoch + 1 guessed


def reseed(loader, epoch):
    loader.sampler.generator.bit_generator.state = np.random.default_rng(
        100 + epoch).bit_generator.state


def distributed(tmp_path, workers, **method):
    dataset = Logged(tmp_path, n=30)
    sampler = fl.DistributedSampler(dataset, num_replicas=2, rank=1, seed=3)
    return fl.DataLoader(dataset, batch_size=3, sampler=sampler, num_workers=workers,
                         persistent_workers=workers > 0, prefetch_next_epoch=workers > 0,
                         **method)


def weighted(tmp_path, workers, **method):
    dataset = Logged(tmp_path, n=30)
    sampler = fl.WeightedRandomSampler(np.arange(1, 31), 17, generator=np.random.default_rng(4))
    return fl.DataLoader(dataset, batch_size=2, sampler=sampler, num_workers=workers,
                         persistent_workers=workers > 0, prefetch_next_epoch=workers > 0,
                         **method)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["fork", "thread"])
@pytest.mark.parametrize("make, between, guessed", [
    (distributed, set_epoch, True),
    (distributed, set_epoch_backwards, False),
    (weighted, lambda loader, epoch: None, True),
    (weighted, reseed, False),
])
def test_epochs_equal_loading_without_workers_whether_the_guess_is_right(
        tmp_path, make, between, guessed, method):
    want = reference_epochs(lambda w: make(tmp_path, w), between, 4)
    for name in os.listdir(tmp_path):
        os.remove(tmp_path / name)
    loader = make(tmp_path, 2, **WORKERS[method])
    got = reference_epochs(lambda w: loader, between, 4)
    assert got == want
    delivered = sum(len(batch) for epoch in want for batch in epoch)
    # Each epoch's end looks ahead at four batches of the next: a right
    # guess is used, so only the last epoch's look ahead is extra loading;
    # a wrong one is loaded and dropped at every epoch's end.
    looked_ahead = sum(len(batch) for batch in want[0][:4])
    extra = looked_ahead if guessed else 4 * looked_ahead
    wait_for_loads(tmp_path, delivered + extra)
    time.sleep(0.05)
    assert loads(tmp_path) == delivered + extra


def failing_loader(tmp_path, fail_at, method):
    sampler = fl.WeightedRandomSampler(np.ones(200), 8, generator=np.random.default_rng(12))
    return fl.DataLoader(Logged(tmp_path, n=200, fail_at=fail_at), batch_size=2,
                         sampler=sampler, num_workers=2, persistent_workers=True,
                         prefetch_next_epoch=True, **WORKERS[method])


def sampled_epochs(epochs):
    sampler = fl.WeightedRandomSampler(np.ones(200), 8, generator=np.random.default_rng(12))
    return [list(sampler) for _ in range(epochs)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["fork", "thread"])
def test_a_failure_in_a_wrong_guess_is_never_raised(tmp_path, method):
    first, guessed = sampled_epochs(2)
    broken = next(i for i in guessed[:2] if i not in first)
    loader = failing_loader(tmp_path, {broken}, method)
    assert sum(len(b) for b in loader) == 8
    # The guessed epoch, up to the broken sample in the first batch.
    wait_for_loads(tmp_path, 8 + 6 + guessed.index(broken) + 1)
    loader.sampler.generator.bit_generator.state = np.random.default_rng(
        broken).bit_generator.state
    real = [i for b in loader for i in b.tolist()]
    assert len(real) == 8 and broken not in real


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["fork", "thread"])
def test_a_failure_in_a_right_guess_is_raised_when_its_batch_is_due(tmp_path, method):
    first, second = sampled_epochs(2)
    broken = next(i for i in second[2:4] if i not in first and i not in second[:2])
    loader = failing_loader(tmp_path, {broken}, method)
    assert sum(len(b) for b in loader) == 8  # its failure was loaded meanwhile
    it = iter(loader)
    assert next(it).tolist() == second[:2]
    with pytest.raises(LookupError, match=f"sample {broken} is broken"):
        next(it)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["fork", "thread"])
def test_no_lookahead_for_a_sampler_it_does_not_know(tmp_path, method):
    loader = fl.DataLoader(Logged(tmp_path, n=12), batch_size=2, sampler=Reversed(12),
                           num_workers=2, persistent_workers=True, prefetch_next_epoch=True,
                           **WORKERS[method])
    assert [i for b in loader for i in b.tolist()] == list(range(11, -1, -1))
    time.sleep(0.2)
    assert loads(tmp_path) == 12
    assert [i for b in loader for i in b.tolist()] == list(range(11, -1, -1))


class StatefulLogged(Logged):
    """Logged with a state: the count of samples read."""

    def __getitem__(self, i):
        self.read = getattr(self, "read", 0) + 1
        return super().__getitem__(i)

    def state_dict(self):
        return {"read": getattr(self, "read", 0)}

    def load_state_dict(self, state):
        self.read = state["read"]


@pytest.mark.timeout(60)
def test_threads_do_not_look_ahead_over_a_shared_dataset_with_a_state(tmp_path):
    # The threads share the dataset: a state taken at the next iter() would
    # hold the lookahead's reads. Worker processes read their own replicas.
    dataset = StatefulLogged(tmp_path, n=12)
    loader = fl.DataLoader(dataset, batch_size=2, num_workers=2, persistent_workers=True,
                           prefetch_next_epoch=True, worker_method="thread")
    assert [i for b in loader for i in b.tolist()] == list(range(12))
    time.sleep(0.2)
    assert loads(tmp_path) == 12
    it = iter(loader)
    assert loader.state_dict()["dataset"] == {"read": 12}
    assert [i for b in it for i in b.tolist()] == list(range(12))


class SharedLevel(fl.Dataset):
    """Samples read a value the training loop sets before each epoch, shared
    with the persistent workers (their dataset is a copy): a curriculum."""

    def __init__(self):
        self.level = multiprocessing.get_context("fork").Value("i", 0)

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return i * 100 + self.level.value


@pytest.mark.timeout(60)
def test_by_default_an_epoch_is_loaded_after_its_iter():
    """A change the program makes between epochs reaches every batch of the
    next one, as with torch's persistent workers (and with no workers)."""
    dataset = SharedLevel()
    loader = fl.DataLoader(dataset, batch_size=2, num_workers=2, persistent_workers=True)
    epochs = []
    for level in range(3):
        dataset.level.value = level
        epochs.append([i for b in loader for i in b.tolist()])
        time.sleep(0.1)  # time enough to load ahead, were it allowed
    assert epochs == [[i * 100 + level for i in range(8)] for level in range(3)]


@pytest.mark.parametrize("kwargs", [{"num_workers": 2},
                                    {"num_workers": 2, "worker_method": "thread"}])
def test_prefetch_next_epoch_needs_persistent_workers(kwargs):
    with pytest.raises(ValueError, match="prefetch_next_epoch needs persistent workers"):
        fl.DataLoader(range(4), prefetch_next_epoch=True, **kwargs)


@pytest.mark.timeout(60)
def test_no_lookahead_without_persistent_workers(tmp_path):
    loader = fl.DataLoader(Logged(tmp_path, n=12), batch_size=2, num_workers=2)
    assert len(list(loader)) == 6
    assert loads(tmp_path) == 12


def counted_permutations(monkeypatch):
    from fastload import _seed

    drawn = []
    permutation = _seed.permutation
    monkeypatch.setattr(_seed, "permutation",
                        lambda rng, n: (drawn.append(n), permutation(rng, n))[1])
    return drawn


@pytest.mark.parametrize("guessed", [True, False])
def test_a_random_samplers_epoch_the_lookahead_drew_is_not_drawn_again(monkeypatch, guessed):
    drawn = counted_permutations(monkeypatch)
    generator, twin = np.random.default_rng(3), np.random.default_rng(3)
    sampler = fl.BatchSampler(fl.RandomSampler(range(40), generator=generator), 6, False)
    reference = fl.BatchSampler(fl.RandomSampler(range(40), generator=twin), 6, False)
    got, want = [], []
    for _ in range(4):
        got.append(list(sampler))
        want.append(list(reference))
        assert next_epoch_head(sampler, 3, False) is not None
        if not guessed:  # the next epoch is not the one the lookahead drew
            generator.random(), twin.random()
    assert got == want
    # The reference: one permutation an epoch. The sampler: its first epoch,
    # one per look ahead, and each epoch not guessed.
    assert len(drawn) == 4 + 1 + 4 + (0 if guessed else 3)


def test_a_sampler_with_an_epoch_drawn_ahead_pickles_and_copies_without_it():
    import copy
    import pickle

    sampler = fl.RandomSampler(range(30), generator=np.random.default_rng(5))
    list(sampler)
    head = next_epoch_head(sampler, 5, False)
    for duplicate in (pickle.loads(pickle.dumps(sampler)), copy.deepcopy(sampler)):
        assert duplicate._drawn_ahead.key is None
        assert list(duplicate)[:5] == head
    assert list(sampler)[:5] == head


class Growing(fl.Dataset):
    def __init__(self):
        self.n = 20

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["fork", "thread"])
def test_shuffled_epochs_equal_those_without_lookahead(method):
    def epochs(lookahead):
        dataset = Growing()
        loader = fl.DataLoader(dataset, batch_size=3, shuffle=True, generator=11, num_workers=2,
                               persistent_workers=True, prefetch_next_epoch=lookahead,
                               **WORKERS[method])
        got = []
        for epoch in range(4):
            got.append([batch.tolist() for batch in loader])
            if epoch == 1:
                dataset.n = 26  # the guess of epoch 2 drew a permutation of 20
        return got

    assert epochs(True) == epochs(False)


def test_a_guess_of_index_arrays_is_adopted_when_it_is_right():
    # Small gathers draw index arrays (BatchSampler._index_arrays), which
    # the lookahead guesses too.
    from fastload._lookahead import CarriedTasks

    carried = CarriedTasks(collections.deque([(7, np.arange(4), 0), (8, np.arange(4, 8), 1)]))
    assert carried.adopt(np.arange(4), 0) == (7, [])
    assert carried.adopt(np.arange(5, 9), 1) == (None, [8])
    assert CarriedTasks(collections.deque([(7, [0, 1], 0)])).adopt(np.arange(2), 0) == (None, [7])
