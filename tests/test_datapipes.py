"""torch's DataPipes load as torch loads them: sharded per worker by
``sharding_filter``, shufflers switched by ``shuffle`` and seeded alike in
every worker (fastload._datapipes)."""
import warnings

import pytest

import fastload as fl

torch = pytest.importorskip("torch", reason="DataPipes are torch's")
from torch.utils.data.datapipes.iter import IterableWrapper  # noqa: E402

CASES = [(0, "multiprocessing"), (2, "multiprocessing"), (3, "multiprocessing"),
         (2, "thread"), (3, "thread")]


def values(loader):
    return [int(x) for x in loader]


@pytest.mark.parametrize("workers,method", CASES)
def test_a_sharded_pipe_yields_each_sample_once_in_a_new_order_each_epoch(workers, method):
    pipe = IterableWrapper(range(60)).shuffle().sharding_filter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # more workers than cores
        loader = fl.DataLoader(pipe, batch_size=None, num_workers=workers,
                               worker_method=method)
        first, second = values(loader), values(loader)
    assert sorted(first) == sorted(second) == list(range(60))
    assert first != list(range(60)) and first != second


@pytest.mark.parametrize("workers,method", CASES[:2] + CASES[3:4])
def test_shuffle_switches_the_pipes_shufflers(workers, method):
    def make(shuffle):
        pipe = IterableWrapper(range(40)).shuffle().sharding_filter()
        return fl.DataLoader(pipe, batch_size=4, num_workers=workers, shuffle=shuffle,
                             worker_method=method, output="numpy")

    unshuffled = [int(x) for batch in make(False) for x in batch]
    assert sorted(unshuffled) == list(range(40))
    if workers == 0:
        assert unshuffled == list(range(40))
    shuffled = [int(x) for batch in make(True) for x in batch]
    assert sorted(shuffled) == list(range(40)) and shuffled != unshuffled


def test_the_shuffled_order_is_reproducible_with_the_loaders_generator():
    def run(workers):
        pipe = IterableWrapper(range(50)).shuffle().sharding_filter()
        return values(fl.DataLoader(pipe, batch_size=None, num_workers=workers, generator=3))

    assert run(0) == run(0)
    assert run(2) == run(2)


def epochs_after_reseeding(data_module, workers, persistent):
    """Three epochs, the first two each after torch.manual_seed(123), and
    a draw from torch's global RNG after each: what torch's own test of
    shuffled pipes compares (test_shuffler_iterdatapipe)."""
    pipe = IterableWrapper(range(40)).shuffle(buffer_size=7).sharding_filter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # more workers than cores
        loader = data_module.DataLoader(pipe, num_workers=workers, shuffle=True,
                                        persistent_workers=persistent)
        runs = []
        for seed in (123, 123, 321):
            torch.manual_seed(seed)
            runs.append((values(loader), int(torch.randint(1 << 30, ()))))
    return runs


@pytest.mark.parametrize("workers,persistent", [(0, False), (1, False), (2, False), (2, True)])
def test_fastload_torch_draws_the_pipes_seeds_as_torch_does(workers, persistent):
    import torch.utils.data as torch_data

    import fastload.torch as flt

    ours = epochs_after_reseeding(flt, workers, persistent)
    assert ours == epochs_after_reseeding(torch_data, workers, persistent)
    assert ours[0][0] == ours[1][0] != ours[2][0]


@pytest.mark.parametrize("workers,method", [(0, "multiprocessing"), (2, "multiprocessing"),
                                            (2, "thread")])
def test_a_checkpoint_keeps_the_epochs_pipe_seed(workers, method):
    def make():
        pipe = IterableWrapper(range(48)).shuffle().sharding_filter()
        return fl.DataLoader(pipe, batch_size=4, num_workers=workers, worker_method=method,
                             output="numpy")

    loader = make()
    it = iter(loader)
    [next(it) for _ in range(3)]
    state = loader.state_dict()
    assert state["datapipe_seed"] is not None
    rest = [b.tolist() for b in it] + [b.tolist() for b in loader]
    resumed = make()
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] + [b.tolist() for b in resumed] == rest
