"""BucketBatchSampler and PackedBatchSampler: every index once per epoch,
budgets kept, exact resume, equal batch counts on every rank."""
import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastload as fl


def make_sampler(kind, lengths, seed=0, inner=None, **options):
    inner = fl.RandomSampler(range(len(lengths)), generator=seed) if inner is None else inner
    options.setdefault("generator", seed + 1)
    if kind == "count":
        return fl.BucketBatchSampler(inner, lengths, batch_size=4, bucket_size=8, **options)
    if kind == "tokens":
        return fl.BucketBatchSampler(inner, lengths, max_tokens=60, bucket_size=16, **options)
    return fl.PackedBatchSampler(inner, lengths, max_tokens=60, strategy=kind, bucket_size=16,
                                 **options)


KINDS = ("count", "tokens", "first_fit", "best_fit")
lengths_lists = st.lists(st.integers(0, 60), min_size=1, max_size=80)


@given(st.sampled_from(KINDS), lengths_lists, st.integers(0, 1000))
def test_every_index_once_per_epoch_within_the_budget(kind, lengths, seed):
    lengths = np.array(lengths)
    sampler = make_sampler(kind, lengths, seed)
    for _ in range(2):
        expected_len = len(sampler)
        batches = list(sampler)
        assert len(batches) == expected_len
        assert sorted(itertools.chain.from_iterable(batches)) == list(range(len(lengths)))
        for batch in batches:
            assert batch
            if kind == "count":
                assert len(batch) <= 4
            elif kind == "tokens":
                assert len(batch) * max(1, lengths[batch].max()) <= 60
            else:
                assert lengths[batch].sum() <= 60


def test_by_count_it_makes_as_many_batches_as_batch_sampler():
    lengths = np.arange(50) % 7
    for drop_last in (False, True):
        sampler = fl.BucketBatchSampler(range(50), lengths, batch_size=8, drop_last=drop_last)
        batches = list(sampler)
        assert len(batches) == len(sampler) == len(fl.BatchSampler(range(50), 8, drop_last))
        assert [len(b) for b in batches].count(8) == 6


def test_a_bucket_is_sorted_by_length_before_it_is_cut():
    lengths = np.random.default_rng(0).integers(1, 100, 64)
    sampler = fl.BucketBatchSampler(fl.RandomSampler(range(64), generator=0), lengths,
                                    batch_size=8, bucket_size=64, shuffle=False)
    in_order = np.concatenate([lengths[batch] for batch in sampler])
    assert (np.diff(in_order) >= 0).all()
    shuffled = fl.BucketBatchSampler(range(64), lengths, batch_size=8, generator=3)
    firsts = [batch[0] for batch in shuffled]
    assert firsts != sorted(firsts, key=lambda i: lengths[i])


def test_first_fit_takes_the_first_bin_and_best_fit_the_fullest():
    lengths = np.array([5, 7, 3, 5])

    def bins(strategy):
        return list(fl.PackedBatchSampler(range(4), lengths, max_tokens=10, strategy=strategy,
                                          shuffle=False))

    # 3 fits both bins (room 5 and 3): first fit takes bin 0, so the last 5
    # needs a new bin; best fit takes bin 1, where 3 fills it exactly.
    assert bins("first_fit") == [[0, 2], [1], [3]]
    assert bins("best_fit") == [[0, 3], [1, 2]]


def test_best_fit_leaves_no_more_room_than_first_fit():
    lengths = np.random.default_rng(1).integers(1, 40, 400)

    def bins(strategy):
        return len(list(fl.PackedBatchSampler(range(400), lengths, max_tokens=64,
                                              strategy=strategy, bucket_size=400)))

    assert bins("best_fit") <= bins("first_fit")
    assert lengths.sum() / (bins("best_fit") * 64) > 0.9


@given(st.sampled_from(KINDS), lengths_lists, st.integers(0, 30), st.integers(0, 1000))
def test_resume_continues_exactly(kind, lengths, stop, seed):
    lengths = np.array(lengths)
    original = make_sampler(kind, lengths, seed)
    epoch = iter(original)
    taken = list(itertools.islice(epoch, stop))
    state = original.state_dict()
    rest, following = list(epoch), list(original)
    resumed = make_sampler(kind, lengths, seed + 7)  # other seeds: the state must decide
    resumed.load_state_dict(state)
    if len(taken) < stop:
        # The epoch ran out while batches were taken: the state starts the next.
        assert list(resumed) == following
        return
    assert len(resumed) == len(taken) + len(rest)
    assert list(resumed) == rest
    assert list(resumed) == following


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stop", [0, 3])
def test_without_a_generator_a_resume_continues_exactly_later_epochs_too(kind, stop):
    # Without ``generator`` each epoch's seed came from numpy's global RNG
    # and the state held none: the epochs after a resume were others.
    lengths = np.arange(40) % 13

    def sampler():
        inner = fl.RandomSampler(range(len(lengths)), generator=1)
        return make_sampler(kind, lengths, inner=inner, generator=None)

    np.random.seed(3)
    original = sampler()
    epoch = iter(original)
    taken = list(itertools.islice(epoch, stop))
    state = original.state_dict()
    expected = list(epoch) + list(original) + list(original)
    np.random.seed(4)  # another run's global RNG: the state must decide
    resumed = sampler()
    resumed.load_state_dict(state)
    assert len(taken) == stop
    assert list(resumed) + list(resumed) + list(resumed) == expected


def test_a_state_between_epochs_starts_the_next_epoch():
    lengths = np.arange(30) % 9
    original = make_sampler("best_fit", lengths)
    list(original)
    state = original.state_dict()
    expected = list(original)
    resumed = make_sampler("best_fit", lengths, seed=5)
    resumed.load_state_dict(state)
    assert list(resumed) == expected


def test_len_does_not_move_the_inner_sampler():
    lengths = np.arange(40) % 11
    measured, untouched = make_sampler("tokens", lengths), make_sampler("tokens", lengths)
    assert len(measured) == len(list(untouched))
    assert list(measured) == list(make_sampler("tokens", lengths))


@pytest.mark.parametrize("kind", KINDS)
@given(lengths=lengths_lists, world=st.integers(2, 4), epoch=st.integers(0, 3))
def test_every_rank_yields_as_many_batches(kind, lengths, world, epoch):
    lengths = np.array(lengths)
    counts, seen = [], []
    for rank in range(world):
        shard = fl.DistributedSampler(range(len(lengths)), num_replicas=world, rank=rank,
                                      seed=3)
        sampler = make_sampler(kind, lengths, inner=shard)
        sampler.set_epoch(epoch)
        batches = list(sampler)
        counts.append(len(batches))
        assert len(sampler) == len(batches)
        shard.set_epoch(epoch)
        assert sorted(itertools.chain.from_iterable(batches)) == sorted(shard)
        seen.extend(itertools.chain.from_iterable(batches))
    assert len(set(counts)) == 1
    assert set(seen) == set(range(len(lengths)))


@pytest.mark.parametrize("kind", ["tokens", "best_fit"])
def test_a_rank_resumes_its_own_batches(kind):
    lengths = np.random.default_rng(4).integers(0, 60, 90)

    def sampler():
        shard = fl.DistributedSampler(range(90), num_replicas=3, rank=1, seed=2)
        shard.set_epoch(5)
        return make_sampler(kind, lengths, inner=shard)

    original = sampler()
    epoch = iter(original)
    next(epoch), next(epoch)
    state = original.state_dict()
    rest = list(epoch)
    resumed = fl.DistributedSampler(range(90), num_replicas=3, rank=1, seed=2)
    resumed_batches = make_sampler(kind, lengths, inner=resumed)
    resumed_batches.load_state_dict(state)
    assert list(resumed_batches) == rest and resumed.epoch == 5


def test_lengths_from_a_callable_are_computed_once():
    calls = []

    def lengths():
        calls.append(1)
        return np.arange(20) % 5

    sampler = fl.PackedBatchSampler(range(20), lengths, max_tokens=8)
    assert calls == []
    list(sampler), list(sampler), len(sampler)
    assert calls == [1]


def test_the_loader_resumes_a_bucketed_epoch():
    lengths = np.random.default_rng(2).integers(1, 30, 64)
    dataset = [np.arange(n, dtype=np.int32) for n in lengths]

    def loader():
        sampler = fl.BucketBatchSampler(fl.RandomSampler(dataset, generator=4), lengths,
                                        max_tokens=64, generator=5)
        return fl.StatefulDataLoader(dataset, batch_sampler=sampler,
                                     collate_fn=fl.pack_collate())

    original = loader()
    epoch = iter(original)
    next(epoch), next(epoch)
    state = original.state_dict()
    rest = [batch.values.tolist() for batch in epoch]
    resumed = loader()
    resumed.load_state_dict(state)
    assert [batch.values.tolist() for batch in resumed] == rest


def test_bad_arguments_are_named():
    lengths = np.arange(10)
    with pytest.raises(fl.InvalidArgumentError, match="exactly one of batch_size and max_tokens"):
        fl.BucketBatchSampler(range(10), lengths)
    with pytest.raises(fl.InvalidArgumentError, match="multiple of batch_size"):
        fl.BucketBatchSampler(range(10), lengths, batch_size=4, bucket_size=6)
    with pytest.raises(fl.InvalidArgumentError, match="index 9 has length 9, more than"):
        fl.PackedBatchSampler(range(10), lengths, max_tokens=8)
    with pytest.raises(fl.InvalidArgumentError, match="strategy"):
        fl.PackedBatchSampler(range(10), lengths, max_tokens=20, strategy="worst_fit")
    with pytest.raises(fl.InvalidArgumentError, match="1-d sequence of integers"):
        fl.BucketBatchSampler(range(10), np.ones((2, 5)), batch_size=2)
    with pytest.raises(fl.InvalidArgumentError, match="yielded index 12 but lengths has 10"):
        list(fl.BucketBatchSampler([12], lengths, batch_size=2))
