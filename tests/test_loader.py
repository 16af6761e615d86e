import collections
import multiprocessing
import pickle
import subprocess
import sys
import types
import warnings

import numpy as np
import pytest

import fastload as fl
from fastload import (
    ArrayDataset,
    BatchSampler,
    CollateError,
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    StatefulDataLoader,
    get_worker_info,
)


class Records(Dataset):
    """Map-style, dict samples, no __getitems__."""

    def __init__(self, n):
        self.n = n

    def __getitem__(self, i):
        return {"x": np.full(2, i, dtype=np.float32), "id": i}

    def __len__(self):
        return self.n


class Counting(Dataset):
    def __init__(self, n):
        self.n, self.calls = n, []

    def __getitem__(self, i):
        raise AssertionError("__getitems__ should be used")

    def __getitems__(self, indices):
        self.calls.append(list(indices))
        return [i * 2 for i in indices]

    def __len__(self):
        return self.n


class Stream(IterableDataset):
    def __init__(self, n, reported=None):
        self.n, self.reported = n, reported

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n if self.reported is None else self.reported


class RaggedRows(Dataset):
    def __getitem__(self, i):
        return np.zeros(3 if i == 5 else 2)

    def __len__(self):
        return 8


def labels(loader):
    return [batch[1].tolist() for batch in loader]


def test_batches_of_an_array_dataset(xy):
    batches = list(DataLoader(ArrayDataset(*xy), batch_size=4))
    assert [b[0].shape for b in batches] == [(4, 3), (4, 3), (2, 3)]
    assert batches[0][0].dtype == np.float32 and batches[0][1].dtype == np.int64
    assert labels(DataLoader(ArrayDataset(*xy), batch_size=4)) == [
        [0, 10, 20, 30], [40, 50, 60, 70], [80, 90]]


def test_drop_last_and_len(xy):
    loader = DataLoader(ArrayDataset(*xy), batch_size=4, drop_last=True)
    assert len(loader) == 2 and len(list(loader)) == 2
    assert len(DataLoader(ArrayDataset(*xy), batch_size=4)) == 3


def test_batch_size_none_converts_single_samples(xy):
    samples = list(DataLoader(ArrayDataset(*xy), batch_size=None))
    assert len(samples) == 10
    x, y = samples[3]
    assert x.shape == (3,) and y.shape == () and y == 30


def test_dict_samples_without_getitems():
    batch = next(iter(DataLoader(Records(5), batch_size=3)))
    assert batch["id"].tolist() == [0, 1, 2] and batch["x"].shape == (3, 2)


def test_getitems_is_used_when_defined():
    ds = Counting(5)
    assert [b.tolist() for b in DataLoader(ds, batch_size=2)] == [[0, 2], [4, 6], [8]]
    assert ds.calls == [[0, 1], [2, 3], [4]]


def test_custom_collate_fn_sees_a_list_of_samples(xy):
    seen = []

    def collate(samples):
        seen.append([s[1] for s in samples])
        return len(samples)

    assert list(DataLoader(ArrayDataset(*xy), batch_size=4, collate_fn=collate)) == [4, 4, 2]
    assert seen[0] == [0, 10, 20, 30]


def test_custom_sampler_and_batch_sampler(xy):
    ds = ArrayDataset(*xy)
    assert labels(DataLoader(ds, batch_size=3, sampler=[9, 8, 7, 0])) == [[90, 80, 70], [0]]
    batches = DataLoader(ds, batch_sampler=[[1, 2], [5]])
    assert labels(batches) == [[10, 20], [50]]
    assert len(batches) == 2


def test_shuffle_gives_a_new_order_each_epoch_and_covers(xy):
    loader = DataLoader(ArrayDataset(*xy), batch_size=10, shuffle=True, generator=0)
    first, second = labels(loader), labels(loader)
    assert sorted(first[0]) == sorted(second[0]) == list(range(0, 100, 10))
    assert first != second


def test_generator_seed_makes_runs_reproducible(xy):
    def run(generator):
        loader = DataLoader(ArrayDataset(*xy), batch_size=3, shuffle=True, generator=generator)
        return [labels(loader) for _ in range(2)]

    assert run(5) == run(5) == run(np.random.default_rng(5))
    np.random.seed(1)
    unseeded = run(None)
    np.random.seed(1)
    assert run(None) == unseeded


def test_iterable_dataset_batches_and_drop_last():
    assert [b.tolist() for b in DataLoader(Stream(7), batch_size=3)] == [[0, 1, 2], [3, 4, 5], [6]]
    assert len(list(DataLoader(Stream(7), batch_size=3, drop_last=True))) == 2
    assert [int(v) for v in DataLoader(Stream(3), batch_size=None)] == [0, 1, 2]


def test_iterable_dataset_len_estimate_and_warning():
    assert len(DataLoader(Stream(7), batch_size=3)) == 3
    assert len(DataLoader(Stream(7), batch_size=3, drop_last=True)) == 2
    assert len(DataLoader(Stream(7), batch_size=None)) == 7
    loader = DataLoader(Stream(5, reported=2), batch_size=1)
    assert len(loader) == 2
    with pytest.warns(UserWarning, match="was reported to be 2"):
        list(loader)


def test_no_warning_when_len_never_asked():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(DataLoader(Stream(5, reported=2), batch_size=1))


def test_collate_error_names_dataset_indices():
    sampler = [0, 1, 2, 5]
    with pytest.raises(CollateError, match=r"sample 3 has shape \(3,\).*dataset indices 5 and 0"):
        list(DataLoader(RaggedRows(), batch_size=4, sampler=sampler))


def test_output_torch_gives_tensors_sharing_memory(xy):
    torch = pytest.importorskip("torch", reason="output='torch' needs torch")
    x, y = next(iter(DataLoader(ArrayDataset(*xy), batch_size=4, output="torch")))
    assert isinstance(x, torch.Tensor) and x.dtype == torch.float32 and y.dtype == torch.int64
    records = next(iter(DataLoader(Records(3), batch_size=3, output="torch")))
    assert isinstance(records["id"], torch.Tensor)


def test_output_must_be_numpy_or_torch(xy):
    with pytest.raises(ValueError, match="output"):
        DataLoader(ArrayDataset(*xy), output="jax")


@pytest.mark.parametrize("steps", [-1, 1.5, True])
def test_snapshot_every_n_steps_is_validated(xy, steps):
    with pytest.raises(ValueError, match="snapshot_every_n_steps"):
        DataLoader(ArrayDataset(*xy), snapshot_every_n_steps=steps)


def test_worker_arguments_are_stored(xy):
    loader = DataLoader(ArrayDataset(*xy), num_workers=2, prefetch_factor=4,
                        persistent_workers=True, multiprocessing_context="spawn",
                        worker_init_fn=print, timeout=3, in_order=False)
    assert loader.prefetch_factor == 4 and loader.persistent_workers
    assert isinstance(loader.multiprocessing_context, multiprocessing.context.BaseContext)
    assert DataLoader(ArrayDataset(*xy), num_workers=1).prefetch_factor == 2


def test_multiprocessing_context_accepts_a_context_object(xy):
    context = multiprocessing.get_context("fork")
    assert DataLoader(ArrayDataset(*xy), num_workers=1,
                      multiprocessing_context=context).multiprocessing_context is context


BAD_ARGUMENTS = [
    ({"num_workers": -1}, ValueError),
    ({"timeout": -1}, ValueError),
    ({"prefetch_factor": 2}, ValueError),
    ({"num_workers": 1, "prefetch_factor": -1}, ValueError),
    ({"persistent_workers": True}, ValueError),
    ({"multiprocessing_context": "fork"}, ValueError),
    ({"num_workers": 1, "multiprocessing_context": "nonsense"}, ValueError),
    ({"num_workers": 1, "multiprocessing_context": 3}, TypeError),
    ({"shuffle": True, "sampler": [0, 1]}, ValueError),
    ({"batch_sampler": [[0]], "batch_size": 2}, ValueError),
    ({"batch_sampler": [[0]], "shuffle": True}, ValueError),
    ({"batch_sampler": [[0]], "sampler": [0]}, ValueError),
    ({"batch_sampler": [[0]], "drop_last": True}, ValueError),
    ({"batch_size": None, "drop_last": True}, ValueError),
    ({"batch_size": 0}, ValueError),
    ({"batch_size": -2}, ValueError),
    ({"drop_last": "yes"}, ValueError),
    ({"generator": "seed"}, TypeError),
]


@pytest.mark.parametrize("kwargs, error", BAD_ARGUMENTS)
def test_bad_arguments_raise_like_torch(xy, kwargs, error):
    with pytest.raises(error):
        DataLoader(ArrayDataset(*xy), **kwargs)


@pytest.mark.parametrize(
    "kwargs", [{"shuffle": True}, {"sampler": [0]}, {"batch_sampler": [[0]]}]
)
def test_iterable_dataset_refuses_sampling_options(kwargs):
    with pytest.raises(ValueError, match="IterableDataset"):
        DataLoader(Stream(3), **kwargs)


def test_timeout_without_workers_fails_on_iteration(xy):
    loader = DataLoader(ArrayDataset(*xy), timeout=1)
    with pytest.raises(AssertionError):
        iter(loader)


@pytest.mark.parametrize(
    "name", ["batch_size", "batch_sampler", "sampler", "drop_last", "dataset",
             "persistent_workers"],
)
def test_sampling_attributes_are_frozen(xy, name):
    loader = DataLoader(ArrayDataset(*xy))
    with pytest.raises(ValueError, match="should not be set"):
        setattr(loader, name, None)
    loader.collate_fn = len  # others stay settable


def test_default_samplers(xy):
    ds = ArrayDataset(*xy)
    assert isinstance(DataLoader(ds).sampler, SequentialSampler)
    shuffled = DataLoader(ds, shuffle=True, batch_size=2)
    assert isinstance(shuffled.sampler, RandomSampler)
    assert isinstance(shuffled.batch_sampler, BatchSampler)
    assert DataLoader(ds, batch_size=None).batch_sampler is None


def test_pin_memory_without_accelerator_warns(xy, monkeypatch):
    monkeypatch.setattr("fastload._pinning.torch_or_none", lambda: None)
    with pytest.warns(UserWarning, match="no accelerator"):
        batches = list(DataLoader(ArrayDataset(*xy), batch_size=5, pin_memory=True))
    assert len(batches) == 2


def test_main_process_has_no_worker_info():
    assert get_worker_info() is None


def test_stateful_dataloader_is_the_same_class():
    assert StatefulDataLoader is DataLoader


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_pickles_after_and_during_iteration_as_torchs(workers):
    loader = DataLoader(np.arange(8), batch_size=2, num_workers=workers)
    list(loader)
    it = iter(loader)
    next(it)
    copied = pickle.loads(pickle.dumps(loader))
    assert copied.state_dict()["yielded"] == 1  # where the pickled one stood
    assert copied.stats().batches == 1  # the latest iterator's, as it was
    assert [b.tolist() for b in copied] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    persistent = DataLoader(np.arange(8), batch_size=2, num_workers=2, persistent_workers=True)
    list(persistent)
    with pytest.raises(NotImplementedError):  # its workers' iterator, as torch's
        pickle.dumps(persistent)


def test_iterator_cannot_be_pickled(xy):
    with pytest.raises(NotImplementedError):
        pickle.dumps(iter(DataLoader(ArrayDataset(*xy))))


def test_namedtuple_and_tuple_samples():
    Pair = collections.namedtuple("Pair", "a b")

    class Pairs(Dataset):
        def __getitem__(self, i):
            return Pair(i, (float(i), "s"))

        def __len__(self):
            return 4

    batch = next(iter(DataLoader(Pairs(), batch_size=4)))
    assert type(batch) is Pair and batch.a.tolist() == [0, 1, 2, 3]
    assert batch.b[0].dtype == np.float64 and list(batch.b[1]) == ["s"] * 4


def test_fastload_never_imports_torch():
    code = (
        "import sys, numpy as np, fastload as fl\n"
        "ds = fl.ArrayDataset(np.zeros((8, 2)), np.arange(8))\n"
        "for loader in (fl.DataLoader(ds, batch_size=3, shuffle=True),\n"
        "               fl.DataLoader(ds, batch_size=None)):\n"
        "    list(loader)\n"
        "fl.DistributedSampler(ds, 2, 0); fl.random_split(ds, [0.5, 0.5])\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr


def test_public_names():
    for name in fl.__all__:
        assert getattr(fl, name) is not None


def test_output_torch_without_torch_says_so(xy, monkeypatch):
    monkeypatch.setattr("fastload.loader.torch_or_none", lambda: None)
    with pytest.raises(ImportError, match="needs PyTorch"):
        DataLoader(ArrayDataset(*xy), output="torch")


def test_pin_memory_device_is_deprecated(xy, monkeypatch):
    monkeypatch.setattr("fastload._pinning.torch_or_none", lambda: None)
    with pytest.warns(UserWarning) as record:
        iter(DataLoader(ArrayDataset(*xy), pin_memory=True, pin_memory_device="cuda"))
    assert any("pin_memory_device is deprecated" in str(w.message) for w in record)
    assert all(w.filename == __file__ for w in record)  # points at the user's line


def test_pinning_copies_every_numeric_array_and_keeps_structure(xy, monkeypatch):
    pinned = []

    class FakeTensor:
        def __init__(self, array):
            self.array = array

        def pin_memory(self):
            pinned.append(self.array)
            return self

        def numpy(self):
            return self.array

    fake_torch = types.SimpleNamespace(
        from_numpy=FakeTensor, Tensor=FakeTensor,
        accelerator=types.SimpleNamespace(is_available=lambda: True),
    )
    monkeypatch.setattr("fastload._pinning.torch_or_none", lambda: fake_torch)
    Pair = collections.namedtuple("Pair", "x y")

    def collate(samples):
        return {"pair": Pair(np.ones(2), "label"), "list": [np.zeros(1), np.array(["s"])]}

    batch = next(iter(DataLoader(ArrayDataset(*xy), batch_size=2, pin_memory=True,
                                 collate_fn=collate)))
    assert type(batch["pair"]) is Pair and batch["pair"].y == "label"
    assert len(pinned) == 2  # the two numeric arrays, not the string array


def test_pin_memory_on_a_machine_without_accelerator_warns_like_torch(xy):
    torch = pytest.importorskip("torch", reason="checks torch's accelerator detection")
    if torch.accelerator.is_available():
        pytest.skip("this machine has an accelerator")
    with pytest.warns(UserWarning, match="no accelerator is found"):
        iter(DataLoader(ArrayDataset(*xy), pin_memory=True))


def test_too_many_workers_warns_at_the_callers_line(xy):
    with pytest.warns(UserWarning, match="worker processes in total") as record:
        DataLoader(ArrayDataset(*xy), num_workers=10_000)
    assert record[0].filename == __file__


def test_a_worker_error_abridges_a_long_batch_of_indices():
    class FailsInCollate(fl.Dataset):
        def __len__(self):
            return 1000

        def __getitem__(self, i):
            return i

    def collate(samples):
        raise KeyError("bad batch")

    loader = fl.DataLoader(FailsInCollate(), batch_size=500, num_workers=1, collate_fn=collate)
    with pytest.raises(KeyError) as caught:
        next(iter(loader))
    message = str(caught.value)
    assert "[0, 1, 2, 3, 4, 5, 6, 7, ..., 498, 499] (500 indices)" in message
    assert len(message) < 2000
