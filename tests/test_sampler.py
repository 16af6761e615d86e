import copy
import math
import sys
import types
from unittest import mock

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastload import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
    _epoch_pieces,
)
from fastload.sampler import draws_arrays, index_batches, lazy_state_getter


def test_sequential_sampler_yields_range_in_order():
    sampler = SequentialSampler(range(5))
    assert list(sampler) == [0, 1, 2, 3, 4]
    assert len(sampler) == 5


def test_base_sampler_has_no_len_and_iter_is_abstract():
    with pytest.raises(NotImplementedError):
        iter(Sampler())
    assert not hasattr(Sampler(), "__len__")


# --- RandomSampler -----------------------------------------------------------


def test_random_sampler_is_a_new_permutation_each_epoch():
    sampler = RandomSampler(range(50), generator=1)
    first, second = list(sampler), list(sampler)
    assert sorted(first) == sorted(second) == list(range(50))
    assert first != second


def test_random_sampler_int_seed_is_reproducible_across_epochs():
    a, b = RandomSampler(range(30), generator=7), RandomSampler(range(30), generator=7)
    assert [list(a) for _ in range(3)] == [list(b) for _ in range(3)]


def test_random_sampler_without_generator_follows_numpy_global_seed():
    np.random.seed(123)
    first = list(RandomSampler(range(20)))
    np.random.seed(123)
    assert list(RandomSampler(range(20))) == first


def test_random_sampler_shares_a_numpy_generator():
    rng = np.random.default_rng(0)
    sampler = RandomSampler(range(10), generator=rng)
    state = rng.bit_generator.state
    list(sampler)
    assert rng.bit_generator.state != state  # one seed drawn per epoch


def test_random_sampler_num_samples_larger_than_dataset_repeats_permutations():
    indices = list(RandomSampler(range(4), num_samples=10, generator=0))
    assert len(indices) == 10
    assert sorted(indices[:4]) == sorted(indices[4:8]) == [0, 1, 2, 3]
    assert len(set(indices[8:])) == 2


def test_random_sampler_with_replacement():
    sampler = RandomSampler(range(3), replacement=True, num_samples=100, generator=0)
    indices = list(sampler)
    assert len(sampler) == len(indices) == 100
    assert set(indices) == {0, 1, 2}


def test_random_sampler_num_samples_follows_dataset_size():
    data = list(range(5))
    sampler = RandomSampler(data)
    data.append(5)
    assert len(sampler) == 6 and sorted(sampler) == list(range(6))


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"replacement": 1}, TypeError),
        ({"num_samples": 0}, ValueError),
        ({"num_samples": -3}, ValueError),
        ({"num_samples": 2.5}, ValueError),
        ({"generator": "seed"}, TypeError),
        ({"generator": True}, TypeError),
    ],
)
def test_random_sampler_rejects_bad_arguments(kwargs, error):
    with pytest.raises(error):
        RandomSampler(range(3), **kwargs)


@pytest.mark.parametrize("replacement", [False, True])
def test_random_sampler_over_an_empty_dataset_says_so(replacement):
    """num_samples from nothing: a ValueError naming it, not numpy's "high <= 0"
    or a ZeroDivisionError; the sampler works again once the data is there."""
    data: list[int] = []
    sampler = RandomSampler(data, replacement=replacement, num_samples=4, generator=0)
    with pytest.raises(ValueError, match="num_samples=4 indices from an empty data_source"):
        list(sampler)
    data.extend(range(3))
    assert len(list(sampler)) == 4


@given(n=st.integers(1, 200), seed=st.integers(0, 2**32))
def test_property_random_sampler_is_a_permutation_and_reproducible(n, seed):
    indices = list(RandomSampler(range(n), generator=seed))
    assert sorted(indices) == list(range(n))
    assert indices == list(RandomSampler(range(n), generator=seed))


@given(n=st.integers(1, 50), count=st.integers(1, 300), replacement=st.booleans(),
       seed=st.integers(0, 1000))
def test_property_random_sampler_length_and_range(n, count, replacement, seed):
    sampler = RandomSampler(range(n), replacement=replacement, num_samples=count, generator=seed)
    indices = list(sampler)
    assert len(indices) == len(sampler) == count
    assert all(0 <= i < n for i in indices)
    if not replacement:
        # Every full block of n is a permutation.
        for start in range(0, count - count % n, n):
            assert sorted(indices[start : start + n]) == list(range(n))


# --- checkpointing -----------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda g: RandomSampler(range(37), generator=g),
        lambda g: RandomSampler(range(37), replacement=True, num_samples=101, generator=g),
        lambda g: RandomSampler(range(10), num_samples=25, generator=g),
        lambda g: SubsetRandomSampler([3, 5, 8, 13, 21, 34], generator=g),
        lambda g: WeightedRandomSampler([1.0, 2.0, 0.5, 4.0], 9, generator=g),
    ],
)
@pytest.mark.parametrize("stop", [0, 1, 31, 33, 64])
def test_sampler_state_dict_resumes_mid_epoch_and_later_epochs(make, stop):
    original = make(np.random.default_rng(5))
    it = iter(original)
    head = [next(it) for _ in range(min(stop, len(original)))]
    state = original.state_dict()
    rest = list(it)
    next_epoch = list(original)

    resumed = make(np.random.default_rng(999))
    resumed.load_state_dict(state)
    assert head + list(resumed) == head + rest
    assert list(resumed) == next_epoch


@pytest.mark.parametrize("stop", [0, 8191, 8192, 8193, 16390, 20000])
def test_a_long_epoch_turned_into_ints_piecewise_is_one_permutation_and_resumes(stop):
    """A permutation's indices become Python ints a piece at a time
    (_epoch_pieces.LIST_ITEMS): the epoch is still the one permutation its token
    draws, batches run across the pieces, and a state taken anywhere in it,
    at a piece's edge too, resumes at the next index."""
    n = 20000
    assert n > 2 * _epoch_pieces.LIST_ITEMS
    probe = RandomSampler(range(n), generator=np.random.default_rng(5))
    next(iter(probe))
    whole = np.random.default_rng(probe.state_dict()["epoch"]).permutation(n).tolist()
    original = RandomSampler(range(n), generator=np.random.default_rng(5))
    it = iter(original)
    head = [next(it) for _ in range(stop)]
    state = original.state_dict()
    rest = list(it)
    assert head + rest == whole
    resumed = RandomSampler(range(n), generator=np.random.default_rng(999))
    resumed.load_state_dict(state)
    assert list(resumed) == rest
    batches = list(BatchSampler(RandomSampler(range(n), generator=np.random.default_rng(5)),
                                batch_size=1000, drop_last=False))
    assert sum(batches, []) == head + rest and all(len(b) == 1000 for b in batches)


def test_sampler_state_dict_between_epochs_restores_generator_only():
    original = RandomSampler(range(20), generator=3)
    list(original)
    state = original.state_dict()
    assert state["epoch"] is None and state["yielded"] == 0
    expected = list(original)
    resumed = RandomSampler(range(20), generator=4)
    resumed.load_state_dict(state)
    assert list(resumed) == expected


# --- SubsetRandomSampler, WeightedRandomSampler --------------------------------


@pytest.mark.parametrize("indices", [[4, 8, 15, 16, 23, 42], np.array([4, 8, 15, 16, 23, 42])])
def test_subset_random_sampler_permutes_the_given_indices(indices):
    sampler = SubsetRandomSampler(indices, generator=0)
    assert len(sampler) == 6
    drawn = list(sampler)
    assert sorted(drawn) == [4, 8, 15, 16, 23, 42]
    assert all(type(i) is int for i in drawn)


def test_weighted_sampler_never_draws_zero_weights():
    sampler = WeightedRandomSampler([0.0, 1.0, 0.0, 3.0], 500, generator=0)
    counts = np.bincount(list(sampler), minlength=4)
    assert counts[0] == counts[2] == 0
    assert 300 < counts[3] < 450  # expectation 375


def test_weighted_sampler_without_replacement_draws_distinct():
    drawn = list(WeightedRandomSampler([0.1, 0.9, 0.4, 0.7, 3.0, 0.6], 6, replacement=False,
                                       generator=1))
    assert sorted(drawn) == list(range(6))


def test_weighted_sampler_without_replacement_favours_heavy_weights():
    firsts = [next(iter(WeightedRandomSampler([1.0, 9.0], 1, False, generator=s)))
              for s in range(400)]
    assert 320 < sum(firsts) < 390  # P(first == 1) = 0.9


@pytest.mark.parametrize(
    "args, error",
    [
        (([1.0, 2.0], 0), ValueError),
        (([1.0, 2.0], True), ValueError),
        (([1.0, 2.0], 2, 1), ValueError),
        (([[1.0, 2.0]], 2), ValueError),
    ],
)
def test_weighted_sampler_rejects_bad_arguments(args, error):
    with pytest.raises(error):
        WeightedRandomSampler(*args)


@pytest.mark.parametrize(
    "weights, count, replacement",
    [([-1.0, 2.0], 2, True), ([0.0, 0.0], 1, True), ([1.0, 2.0], 3, False),
     ([1.0, 0.0, 0.0], 2, False), ([np.nan, 1.0], 1, True)],
)
def test_weighted_sampler_invalid_distribution_raises_runtime_error_on_iteration(
    weights, count, replacement
):
    sampler = WeightedRandomSampler(weights, count, replacement, generator=0)
    with pytest.raises(RuntimeError):
        list(sampler)


# --- golden vectors: the numpy-path order is part of the API ------------------


def test_golden_orders_for_fixed_seeds():
    np.random.seed(2024)
    assert list(RandomSampler(range(8))) == GOLDEN["global"]
    sampler = RandomSampler(range(8), generator=42)
    assert [list(sampler), list(sampler)] == GOLDEN["random"]
    assert list(RandomSampler(range(8), True, 10, generator=42)) == GOLDEN["replacement"]
    assert list(SubsetRandomSampler([10, 20, 30, 40], generator=42)) == GOLDEN["subset"]
    weights = [0.1, 0.9, 0.4, 0.7, 3.0, 0.6]
    assert list(WeightedRandomSampler(weights, 6, True, generator=42)) == GOLDEN["weighted"]
    assert list(WeightedRandomSampler(weights, 4, False, generator=42)) == GOLDEN["weighted_norep"]
    assert list(DistributedSampler(range(10), 3, 1, seed=42)) == GOLDEN["distributed"]


GOLDEN = {
    "global": [7, 2, 5, 6, 0, 4, 3, 1],  # one seed from np.random, then its own stream
    "random": [[7, 5, 6, 2, 3, 4, 0, 1], [2, 0, 3, 6, 7, 4, 1, 5]],
    "replacement": [5, 2, 1, 5, 2, 2, 5, 7, 5, 7],
    "subset": [40, 30, 10, 20],
    "weighted": [3, 4, 3, 5, 5, 1],
    "weighted_norep": [1, 4, 5, 2],
    "distributed": [6, 3, 9, 5],
}


# --- BatchSampler ------------------------------------------------------------


def test_batch_sampler_groups_and_keeps_last():
    batches = list(BatchSampler(SequentialSampler(range(10)), 3, False))
    assert batches == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


def test_batch_sampler_drop_last():
    sampler = BatchSampler(SequentialSampler(range(10)), 3, True)
    assert list(sampler) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert len(sampler) == 3


@pytest.mark.parametrize(
    "batch_size, drop_last", [(0, False), (-1, False), (2.0, False), (True, False), (2, 0)]
)
def test_batch_sampler_rejects_bad_arguments(batch_size, drop_last):
    with pytest.raises(ValueError):
        BatchSampler(range(4), batch_size, drop_last)


@given(n=st.integers(0, 100), batch_size=st.integers(1, 20), drop_last=st.booleans())
def test_property_batch_sampler_length_and_content(n, batch_size, drop_last):
    sampler = BatchSampler(range(n), batch_size, drop_last)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    assert all(len(b) == batch_size for b in batches[:-1])
    flat = [i for b in batches for i in b]
    expected = n - n % batch_size if drop_last else n
    assert flat == list(range(expected))


def reference_batches(indices, batch_size, drop_last):
    batches = [indices[i : i + batch_size] for i in range(0, len(indices), batch_size)]
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    return batches


SAMPLER_MAKERS = {
    "sequential": lambda n, seed: SequentialSampler(range(n)),
    "random": lambda n, seed: RandomSampler(range(n), generator=seed),
    "random_repeat": lambda n, seed: RandomSampler(range(n), num_samples=2 * n + 3,
                                                   generator=seed),
    "replacement": lambda n, seed: RandomSampler(range(n), True, 3 * n + 1, generator=seed),
    "subset": lambda n, seed: SubsetRandomSampler(list(range(0, 2 * n, 2)), generator=seed),
    "weighted": lambda n, seed: WeightedRandomSampler(np.arange(1.0, n + 1), n, generator=seed),
}


@given(kind=st.sampled_from(sorted(SAMPLER_MAKERS)), n=st.integers(1, 80),
       batch_size=st.integers(1, 40), drop_last=st.booleans(), seed=st.integers(0, 99))
def test_property_batch_sampler_fast_paths_match_generic_batching(kind, n, batch_size,
                                                                  drop_last, seed):
    make = SAMPLER_MAKERS[kind]
    batches = list(BatchSampler(make(n, seed), batch_size, drop_last))
    assert batches == reference_batches(list(make(n, seed)), batch_size, drop_last)
    assert all(type(b) is list for b in batches)


def test_batch_sampler_respects_a_subclass_iteration_order():
    class Reversed(RandomSampler):
        def __iter__(self):
            return reversed(sorted(super().__iter__()))

    assert list(BatchSampler(Reversed(range(5)), 2, False)) == [[4, 3], [2, 1], [0]]


def test_state_dict_taken_through_batch_sampler():
    sampler = RandomSampler(range(100), generator=2)
    batches = iter(BatchSampler(sampler, 16, False))
    head = [next(batches) for _ in range(3)]
    state = sampler.state_dict()
    assert state["yielded"] == 48
    rest = list(batches)
    resumed = RandomSampler(range(100), generator=0)
    resumed.load_state_dict(state)
    assert list(BatchSampler(resumed, 16, False)) == rest
    assert sorted(i for b in head + rest for i in b) == list(range(100))


# --- DistributedSampler --------------------------------------------------------


def test_distributed_sampler_pads_by_repetition():
    shares = [list(DistributedSampler(range(5), 3, r, shuffle=False)) for r in range(3)]
    assert shares == [[0, 3], [1, 4], [2, 0]]


def test_distributed_sampler_drop_last_cuts_the_tail():
    shares = [list(DistributedSampler(range(5), 3, r, shuffle=False, drop_last=True))
              for r in range(3)]
    assert shares == [[0], [1], [2]]


def test_distributed_sampler_padding_longer_than_dataset():
    shares = [list(DistributedSampler(range(2), 5, r, shuffle=False)) for r in range(5)]
    assert shares == [[0], [1], [0], [1], [0]]


def test_distributed_sampler_set_epoch_reshuffles_identically_on_all_ranks():
    samplers = [DistributedSampler(range(40), 4, r, seed=3) for r in range(4)]
    first = [list(s) for s in samplers]
    for s in samplers:
        s.set_epoch(1)
    second = [list(s) for s in samplers]
    assert first != second
    for epoch in (first, second):
        assert sorted(i for share in epoch for i in share) == list(range(40))


@pytest.mark.parametrize("rank", [-1, 4])
def test_distributed_sampler_invalid_rank(rank):
    with pytest.raises(ValueError, match="Invalid rank"):
        DistributedSampler(range(8), num_replicas=4, rank=rank)


@given(n=st.integers(1, 60), replicas=st.integers(1, 8), drop_last=st.booleans(),
       shuffle=st.booleans(), seed=st.integers(0, 100))
def test_property_distributed_sampler_partitions(n, replicas, drop_last, shuffle, seed):
    shares = [DistributedSampler(range(n), replicas, r, shuffle, seed, drop_last)
              for r in range(replicas)]
    lists = [list(s) for s in shares]
    assert all(len(share) == len(s) for share, s in zip(lists, shares))
    assert len({len(share) for share in lists}) == 1
    union = [i for share in lists for i in share]
    if drop_last:
        assert len(set(union)) == len(union) == (n // replicas) * replicas
    else:
        assert set(union) == set(range(n)) and len(union) == math.ceil(n / replicas) * replicas


def test_distributed_sampler_state_dict_resumes():
    sampler = DistributedSampler(range(30), 2, 1, seed=1)
    sampler.set_epoch(4)
    it = iter(sampler)
    head = [next(it) for _ in range(6)]
    state = sampler.state_dict()
    rest = list(it)
    resumed = DistributedSampler(range(30), 2, 1, seed=1)
    resumed.load_state_dict(state)
    assert resumed.epoch == 4
    assert head + list(resumed) == head + rest


def test_distributed_discovery_from_environment(monkeypatch, no_distributed_env):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    sampler = DistributedSampler(range(8), shuffle=False)
    assert (sampler.rank, sampler.num_replicas) == (2, 4)
    assert list(sampler) == [2, 6]


def test_distributed_discovery_from_slurm(monkeypatch, no_distributed_env):
    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    sampler = DistributedSampler(range(8), shuffle=False)
    assert (sampler.rank, sampler.num_replicas) == (1, 2)


def test_distributed_discovery_only_fills_missing_arguments(monkeypatch, no_distributed_env):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert DistributedSampler(range(8), num_replicas=2).rank == 1
    assert DistributedSampler(range(8), rank=0).num_replicas == 4


def test_distributed_discovery_from_initialised_jax(monkeypatch, no_distributed_env):
    jax = types.ModuleType("jax")
    jax.distributed = types.SimpleNamespace(is_initialized=lambda: True)
    jax.process_index = lambda: 3
    jax.process_count = lambda: 5
    monkeypatch.setitem(sys.modules, "jax", jax)
    sampler = DistributedSampler(range(10))
    assert (sampler.rank, sampler.num_replicas) == (3, 5)


def test_distributed_discovery_ignores_uninitialised_jax(monkeypatch, no_distributed_env):
    jax = types.ModuleType("jax")
    jax.distributed = types.SimpleNamespace(is_initialized=lambda: False)
    monkeypatch.setitem(sys.modules, "jax", jax)
    with pytest.raises(ValueError, match="num_replicas= and rank="):
        DistributedSampler(range(10))


def test_distributed_discovery_failure_names_the_arguments(no_distributed_env):
    with pytest.raises(ValueError, match="num_replicas= and rank="):
        DistributedSampler(range(10))


@pytest.mark.parametrize("make_generator", [lambda: 0, lambda: np.random.default_rng(5)])
def test_the_generator_state_read_once_per_epoch_is_the_generators(make_generator):
    # state_dict() keeps the generator's state while the epoch draws nothing
    # more from it; once the epoch ends it is read anew.
    sampler = RandomSampler(range(20), generator=make_generator())
    batches = iter(BatchSampler(sampler, 4, False))
    next(batches)
    for _ in range(3):
        assert sampler.state_dict()["generator"] == sampler._rng.bit_generator.state
        next(batches)
    list(batches)
    sampler._rng.integers(10)  # the loader draws its seeds from a shared one
    assert sampler.state_dict()["generator"] == sampler._rng.bit_generator.state


def test_an_epoch_of_a_whole_permutation_draws_one_with_numpy_two_with_torch(monkeypatch):
    # torch draws the empty remainder's permutation too, so a torch.Generator
    # ends where torch's does; an epoch's numpy generator is its own, and
    # drawing that permutation only cost a whole one more.
    from fastload import _seed

    drawn = []
    permutation = _seed.permutation
    monkeypatch.setattr(_seed, "permutation",
                        lambda rng, n: (drawn.append(n), permutation(rng, n))[1])
    order = list(RandomSampler(range(50), generator=3))
    assert sorted(order) == list(range(50)) and drawn == [50]
    torch = pytest.importorskip("torch")
    drawn.clear()
    generator, torch_generator = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    ours = list(RandomSampler(range(50), generator=generator))
    theirs = list(torch.utils.data.RandomSampler(range(50), generator=torch_generator))
    assert ours == theirs and drawn == [50, 50]
    assert torch.equal(generator.get_state(), torch_generator.get_state())


@pytest.mark.parametrize("generator", ["seed", "torch"])
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("num_samples", [None, 45])  # 45: a permutation and part of a second
def test_a_lazy_state_made_later_is_the_state_dict_at_its_draw(generator, batched, num_samples):
    # A DataLoader records these at every snapshot step and makes few into
    # dicts, some long after later draws moved the sampler on (a
    # torch.Generator draws each permutation from itself).
    if generator == "torch":
        torch = pytest.importorskip("torch", reason="a torch.Generator needs torch")
        generator = torch.Generator().manual_seed(3)
    sampler = RandomSampler(range(20), num_samples=num_samples,
                            generator=3 if generator == "seed" else generator)
    index_sampler = BatchSampler(sampler, 4, False) if batched else sampler
    lazy = lazy_state_getter(index_sampler)
    recorded, eager = [lazy()], [index_sampler.state_dict()]
    for _ in range(2):  # two epochs
        for _ in index_sampler:
            recorded.append(lazy())
            eager.append(copy.deepcopy(index_sampler.state_dict()))
        recorded.append(lazy())
        eager.append(copy.deepcopy(index_sampler.state_dict()))
    assert [state() for state in recorded] == eager
    assert len({str(state) for state in eager}) > len(eager) // 2  # the states moved


def test_only_fastloads_own_random_sampler_states_are_lazy():
    class OwnState(RandomSampler):
        def state_dict(self):
            return {"mine": 1}

    assert lazy_state_getter(BatchSampler(OwnState(range(4)), 2, False)) is None
    assert lazy_state_getter(SequentialSampler(range(4))) is None
    assert lazy_state_getter(BatchSampler(RandomSampler(range(4)), 2, False)) is not None


def as_list(batch):
    return batch.tolist() if isinstance(batch, np.ndarray) else batch


@given(kind=st.sampled_from(sorted(SAMPLER_MAKERS)), n=st.integers(1, 80),
       batch_size=st.integers(1, 40), drop_last=st.booleans(), seed=st.integers(0, 99),
       piece=st.sampled_from([8192, 7]), stop=st.integers(0, 12))
def test_property_index_arrays_are_iters_batches_with_its_states(kind, n, batch_size, drop_last,
                                                                  seed, piece, stop):
    # The loader draws these for batches it gathers itself (NOTE [ Small
    # gathers ]): the same indices, and a state after each batch that
    # resumes either way. piece=7: batches cut across pieces of a chunk.
    make = SAMPLER_MAKERS[kind]
    with mock.patch.object(_epoch_pieces, "LIST_ITEMS", piece):
        listed = BatchSampler(make(n, seed), batch_size, drop_last)
        arrayed = BatchSampler(make(n, seed), batch_size, drop_last)
        states = []
        for _ in range(2):  # two epochs
            batches = list(iter(listed))
            drawn = []
            for batch in index_batches(arrayed, as_arrays=True):
                drawn.append(batch)
                states.append(copy.deepcopy(arrayed.state_dict()))
            assert [as_list(b) for b in drawn] == batches
            if kind not in ("subset", "sequential"):  # the user's list; lists cost less
                assert all(isinstance(b, np.ndarray) and b.dtype.kind == "i" for b in drawn)
            assert arrayed.state_dict() == listed.state_dict()
        if stop < len(states) and kind != "sequential":
            resumed = BatchSampler(make(n, 1000 + seed), batch_size, drop_last)
            resumed.load_state_dict(states[stop])
            reference = BatchSampler(make(n, 1000 + seed), batch_size, drop_last)
            reference.load_state_dict(states[stop])
            assert [as_list(b) for b in index_batches(resumed, True)] == list(reference)


def test_index_arrays_only_for_fastloads_own_samplers():
    class Reversed(RandomSampler):
        def __iter__(self):
            return reversed(sorted(super().__iter__()))

    assert BatchSampler(Reversed(range(5)), 2, False)._index_arrays() is None
    assert BatchSampler(list(range(5)), 2, False)._index_arrays() is None
    assert not draws_arrays(BatchSampler(SequentialSampler(range(5)), 2, False))
    assert draws_arrays(BatchSampler(RandomSampler(range(5)), 2, False))
