"""Resume, as a property: for generated sampler configurations, stop points,
worker counts and persistence, with and without a generator, a loader built
afresh (numpy's global RNG elsewhere, as in another process) that loads the
state delivers exactly what the uninterrupted run delivers next: the rest of
the epoch and the epoch after it (NOTE [ Resume contract ] in fastload._state)."""
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastload as fl

N = 23


class Rows(fl.Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return i


class EveryOther(fl.Sampler):
    """A custom sampler without state: fast-forwarded by counting."""

    def __iter__(self):
        return iter(list(range(0, N, 2)) + list(range(1, N, 2)))

    def __len__(self):
        return N


def make_loader(config, workers, persistent):
    kind, generator = config["sampler"], config["generator"]
    kwargs = dict(num_workers=workers, persistent_workers=persistent and workers > 0,
                  batch_size=config["batch_size"], drop_last=config["drop_last"])
    if kind == "sequential":
        return fl.DataLoader(Rows(), **kwargs)
    if kind == "shuffle":
        return fl.DataLoader(Rows(), shuffle=True, generator=generator, **kwargs)
    if kind == "replacement":
        sampler = fl.RandomSampler(Rows(), replacement=True, num_samples=17,
                                   generator=generator)
    elif kind == "num_samples":
        sampler = fl.RandomSampler(Rows(), num_samples=31, generator=generator)
    elif kind == "subset":
        sampler = fl.SubsetRandomSampler(list(range(3, N, 2)), generator=generator)
    elif kind == "weighted":
        sampler = fl.WeightedRandomSampler(np.arange(1.0, N + 1), 19, replacement=False,
                                           generator=generator)
    elif kind == "distributed":
        sampler = fl.DistributedSampler(Rows(), num_replicas=2, rank=1, seed=4)
    else:
        sampler = EveryOther()
    if config["batch_sampler"]:
        batch_sampler = fl.BatchSampler(sampler, kwargs.pop("batch_size"),
                                        kwargs.pop("drop_last"))
        return fl.DataLoader(Rows(), batch_sampler=batch_sampler, **kwargs)
    return fl.DataLoader(Rows(), sampler=sampler, **kwargs)


def batches(iterator):
    return [batch.tolist() for batch in iterator]


configs = st.fixed_dictionaries({
    "sampler": st.sampled_from(["sequential", "shuffle", "replacement", "num_samples",
                                "subset", "weighted", "distributed", "custom"]),
    "generator": st.sampled_from([None, 7]),
    "batch_size": st.integers(1, 5),
    "drop_last": st.booleans(),
    "batch_sampler": st.booleans(),
})
# Where the state is taken: before iter(); after iter() and k batches (k=0:
# right after iter()); "end": every batch taken, StopIteration not seen;
# "after": after the StopIteration; epochs before that.
stops = st.tuples(st.integers(0, 2), st.sampled_from(["before", "k", "end", "after"]),
                  st.integers(0, 3))


@pytest.mark.timeout(600)
@settings(max_examples=80, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(configs, stops, st.sampled_from([0, 2]), st.booleans())
def test_a_resumed_loader_goes_on_as_the_uninterrupted_run(config, stop, workers, persistent):
    epochs_before, where, k = stop

    def run(loader, interrupt):
        """Up to the stop point, then (interrupt) the state, or the rest of
        that epoch and one more epoch."""
        for _ in range(epochs_before):
            batches(iter(loader))
        if where == "before":
            if interrupt:
                return loader.state_dict()
            return batches(iter(loader)) + batches(iter(loader))
        it = iter(loader)
        taken, over = 0, False
        limit = k if where == "k" else len(loader)
        while taken < limit and not over:
            over = next(it, None) is None
            taken += 1
        if where == "after":
            over = next(it, None) is None
            assert over
        if interrupt:
            return loader.state_dict()
        if over:  # the epoch is over: the next two follow
            return batches(iter(loader)) + batches(iter(loader))
        return batches(it) + batches(iter(loader))

    np.random.seed(11)
    expected = run(make_loader(config, workers, persistent), interrupt=False)
    np.random.seed(11)
    state = json.loads(json.dumps(run(make_loader(config, workers, persistent), True)))
    np.random.seed(99)  # whatever another process's global RNG holds
    resumed = make_loader(config, workers, persistent)
    resumed.load_state_dict(state)
    # The rest of the saved epoch (or, once it was over, the next one), then one more.
    got = batches(iter(resumed)) + batches(iter(resumed))
    assert got == expected


@pytest.mark.parametrize("workers", [0, 2])
def test_three_save_and_load_cycles_inside_an_epoch_equal_one_run(workers):
    def make():
        return fl.DataLoader(Rows(), batch_size=2, shuffle=True, num_workers=workers)

    np.random.seed(3)
    loader = make()
    expected = batches(iter(loader)) + batches(iter(loader))
    np.random.seed(3)
    loader, got = make(), []
    for cycle in range(3):
        it = iter(loader)
        got += [next(it).tolist() for _ in range(2 + cycle)]
        state = json.loads(json.dumps(loader.state_dict()))
        np.random.seed(100 + cycle)  # as in a fresh process
        loader = make()
        loader.load_state_dict(state)
    got += batches(iter(loader)) + batches(iter(loader))
    assert got == expected
