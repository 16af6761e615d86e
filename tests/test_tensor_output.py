"""Tensors out when tensors go in, whatever num_workers; numpy in, numpy out;
``output`` forces one kind."""
import numpy as np
import pytest

import fastload as fl
from fastload_c.slab import Lease

torch = pytest.importorskip("torch", reason="tensor batches need torch installed")
from torch.utils import data as td  # noqa: E402


class TensorSamples(fl.Dataset):
    """Tensor leaves (an image and a 0-d label) beside a numpy leaf and an int."""

    def __len__(self):
        return 10

    def __getitem__(self, i):
        image = torch.arange(12, dtype=torch.float32).reshape(3, 4) * (i + 1)
        return {"image": image, "label": torch.tensor(i), "mask": np.full(2, i % 2, np.bool_),
                "index": i}


class MixedDtypes(TensorSamples):
    """Samples whose image dtypes differ: torch.stack promotes them, which
    the slot writer leaves to default_collate (the general path)."""

    def __getitem__(self, i):
        sample = super().__getitem__(i)
        sample["image"] = sample["image"].to(torch.float64 if i % 2 else torch.float32)
        return sample


def torchs_batches(dataset):
    return list(td.DataLoader(dataset, batch_size=4))


def assert_tensor_equal(ours, theirs):
    assert type(ours) is torch.Tensor, type(ours)
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("dataset_type", [TensorSamples, MixedDtypes])
@pytest.mark.parametrize("num_workers,context", [(0, None), (2, "fork"), (2, "spawn")])
def test_tensor_samples_give_torchs_batches(dataset_type, num_workers, context):
    dataset = dataset_type()
    loader = fl.DataLoader(dataset, batch_size=4, num_workers=num_workers,
                           multiprocessing_context=context)
    ours = list(loader)
    theirs = torchs_batches(dataset)
    assert len(ours) == len(theirs) == 3
    for a, b in zip(ours, theirs):
        assert_tensor_equal(a["image"], b["image"])
        assert_tensor_equal(a["label"], b["label"])
        # numpy leaves stay numpy; torch's loader turns them into tensors.
        assert type(a["mask"]) is np.ndarray and np.array_equal(a["mask"], b["mask"].numpy())
        assert type(a["index"]) is np.ndarray and a["index"].tolist() == b["index"].tolist()


def _lease_of(array):
    base = array
    while base is not None and not isinstance(base, Lease):
        base = base.base
    return base


def test_tensor_batches_from_workers_lie_in_the_slot():
    loader = fl.DataLoader(TensorSamples(), batch_size=4, num_workers=2)
    for batch in loader:
        # The numpy leaf of the same batch names the slot (its lease).
        lease = _lease_of(batch["mask"])
        assert lease is not None
        slot = np.frombuffer(lease, np.uint8)
        for key in ("image", "label"):
            assert np.shares_memory(batch[key].numpy(), slot), key


@pytest.mark.parametrize("num_workers", [0, 2])
def test_output_numpy_forces_numpy_arrays(num_workers):
    dataset = TensorSamples()
    ours = list(fl.DataLoader(dataset, batch_size=4, num_workers=num_workers, output="numpy"))
    for a, b in zip(ours, torchs_batches(dataset)):
        for key in ("image", "label", "mask", "index"):
            assert type(a[key]) is np.ndarray, key
            assert a[key].dtype == b[key].numpy().dtype and np.array_equal(a[key], b[key].numpy())
    if num_workers:
        assert np.shares_memory(ours[0]["image"], np.frombuffer(_lease_of(ours[0]["mask"]),
                                                                np.uint8))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_output_torch_forces_tensors_and_numpy_in_gives_numpy_out(num_workers):
    dataset = TensorSamples()
    forced = next(iter(fl.DataLoader(dataset, batch_size=4, num_workers=num_workers,
                                     output="torch")))
    assert all(type(forced[key]) is torch.Tensor for key in ("image", "label", "mask", "index"))
    arrays = fl.ArrayDataset(np.zeros((8, 2), np.float32), np.arange(8))
    x, y = next(iter(fl.DataLoader(arrays, batch_size=4, num_workers=num_workers)))
    assert type(x) is np.ndarray and type(y) is np.ndarray


@pytest.mark.parametrize("kwargs", [{}, {"num_workers": 2},
                                    {"num_workers": 2, "worker_method": "thread"}])
def test_output_torch_takes_arrays_torch_cannot_view(kwargs):
    """Another byte order, a negative stride, np.ulonglong: output="torch"
    gives a tensor of the same values (a copy where torch cannot view)."""
    columns = (np.arange(6, dtype=">i8"), np.arange(12, dtype=np.float32).reshape(6, 2)[::-1],
               np.arange(6, dtype=np.ulonglong), np.arange(6, dtype=">Q"))
    for batch_size in (3, None):
        expected = list(fl.DataLoader(fl.ArrayDataset(*columns), batch_size=batch_size))
        got = list(fl.DataLoader(fl.ArrayDataset(*columns), batch_size=batch_size,
                                 output="torch", **kwargs))
        assert len(got) == len(expected)
        for tensors, arrays in zip(got, expected):
            assert all(type(t) is torch.Tensor for t in tensors)
            assert [t.tolist() for t in tensors] == [a.tolist() for a in arrays]


class TorchLeaves(fl.Dataset):
    """Leaves torch's default_collate takes in the main process but not in
    a worker of its own (it stacks into new shared memory there): a
    negative view, a tensor needing grad; beside numpy, an int, a string."""

    def __init__(self):
        self.negated = torch._neg_view(torch.arange(12.0).reshape(6, 2))
        self.weights = torch.ones(6, 2, requires_grad=True)

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return {"neg": self.negated[i], "grad": self.weights[i],
                "x": np.full(3, i, np.float32), "i": i, "s": "ab"}


class PairOfRows(TorchLeaves):
    """A sample of two rows torch's default_collate stacks into one tensor."""

    def __getitem__(self, i):
        return [self.negated[i], self.weights[i]]


def _same_batches(ours, theirs):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.keys() == b.keys() and a["s"] == b["s"]
        for key in ("neg", "grad", "x", "i"):
            assert type(a[key]) is torch.Tensor and a[key].dtype == b[key].dtype
            assert a[key].requires_grad == b[key].requires_grad
            assert torch.equal(a[key].detach().resolve_neg(), b[key].detach().resolve_neg())


@pytest.mark.parametrize("kwargs", [{}, {"num_workers": 2},
                                    {"num_workers": 2, "worker_method": "thread"}])
def test_torchs_default_collate_as_collate_fn_gives_torchs_main_process_batch(kwargs):
    """torch's own default_collate passed to fastload's loader runs as
    fastload.torch runs it: the batch torch's loader makes without workers,
    at every num_workers."""
    theirs = list(td.DataLoader(TorchLeaves(), batch_size=3))
    ours = list(fl.DataLoader(TorchLeaves(), batch_size=3, collate_fn=td.default_collate,
                              **kwargs))
    _same_batches(ours, theirs)
    # Without batching torch's collate_fn takes one sample: here a pair it stacks.
    pairs = PairOfRows()
    theirs = list(td.DataLoader(pairs, batch_size=None, collate_fn=td.default_collate))
    ours = list(fl.DataLoader(pairs, batch_size=None, collate_fn=td.default_collate, **kwargs))
    assert len(ours) == len(theirs) == 6
    for a, b in zip(ours, theirs):
        assert type(a) is torch.Tensor and a.dtype == b.dtype and a.requires_grad
        assert torch.equal(a.detach(), b.detach())


def test_tensor_batches_without_automatic_batching_stay_tensors():
    loader = fl.DataLoader(TensorSamples(), batch_size=None, num_workers=2)
    sample = next(iter(loader))
    assert type(sample["image"]) is torch.Tensor and type(sample["mask"]) is np.ndarray


class BareTensors(fl.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.full((2,), float(i))


def test_pin_memory_without_an_accelerator_leaves_tensor_batches_as_they_are():
    batches = list(fl.DataLoader(BareTensors(), batch_size=4, num_workers=2, pin_memory=True))
    assert [b[:, 0].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("num_workers,method", [(0, "multiprocessing"), (2, "multiprocessing"),
                                                (2, "thread")])
def test_array_dataset_of_tensors_gives_torchs_batches(num_workers, method):
    rng = np.random.default_rng(5)
    images = torch.from_numpy(rng.standard_normal((37, 3, 4)).astype(np.float32))
    labels = torch.from_numpy(rng.integers(0, 10, 37))
    flags = np.arange(37) % 2 == 0  # a numpy column stays numpy
    ours = fl.ArrayDataset(images, labels, flags)
    order = rng.permutation(37).tolist()
    loaders = [
        fl.DataLoader(ours, batch_size=8, sampler=order, num_workers=num_workers,
                      worker_method=method),
        fl.DataLoader(fl.Subset(ours, order), batch_size=8, num_workers=num_workers,
                      worker_method=method),
    ]
    theirs = list(td.DataLoader(td.TensorDataset(images, labels), batch_size=8, sampler=order))
    for loader in loaders:
        batches = list(loader)
        assert len(batches) == len(theirs) == 5
        for start, ((x, y, flag), (tx, ty)) in zip(range(0, 37, 8), zip(batches, theirs)):
            assert_tensor_equal(x, tx)
            assert_tensor_equal(y, ty)
            assert type(flag) is np.ndarray
            assert flag.tolist() == [i % 2 == 0 for i in order[start:start + 8]]
    one = next(iter(fl.DataLoader(ours, batch_size=None, num_workers=num_workers,
                                  worker_method=method)))
    assert_tensor_equal(one[0], images[0])
    assert_tensor_equal(one[1], labels[0])


def collate_views(samples):
    """A custom collate_fn's tensors: odd dtypes, and two views of one storage."""
    x = torch.stack([torch.full((3,), s, dtype=torch.float32) for s in samples])
    return {"x": x, "row": x[1], "t": x.t(), "u16": x.to(torch.uint16),
            "bf16": x.to(torch.bfloat16), "u64": x.to(torch.uint64)}


def collate_first_values(rows):
    return collate_views([int(row[0]) for row in rows])


@pytest.mark.parametrize("method", ["multiprocessing", "thread"])
def test_tensors_of_a_custom_collate_fn_arrive_as_they_left(method):
    """Tensors a custom collate_fn made travel from worker processes as
    their storage's bytes: every dtype (uint16 to uint64 and bfloat16,
    which torch's pickle of a storage cannot load), strides and views, and
    views of one storage still share it."""
    loader = fl.DataLoader(fl.ArrayDataset(np.arange(6)), batch_size=2, num_workers=2,
                           worker_method=method, collate_fn=collate_first_values)
    expected = [collate_views([2 * i, 2 * i + 1]) for i in range(3)]
    got = list(loader)
    for batch, want in zip(got, expected):
        for key in want:
            assert batch[key].dtype == want[key].dtype and batch[key].stride() == want[key].stride()
            assert torch.equal(batch[key].to(torch.float64), want[key].to(torch.float64))
    batch = got[0]
    batch["x"][1, 0] = 99  # the views share the storage, as they left
    assert batch["row"][0] == 99 and batch["t"][0, 1] == 99


def collate_nested(rows):
    return torch.nested.nested_tensor([torch.arange(float(int(row[0]) + 1)) for row in rows])


def test_tensors_torch_pickles_its_own_way_still_arrive():
    """A nested tensor is not a plain strided one: it goes through torch's
    own pickle, as before (torch's test_nested_tensor_multiprocessing)."""
    loader = fl.DataLoader(fl.ArrayDataset(np.arange(4)), batch_size=2, num_workers=2,
                           collate_fn=collate_nested)
    got = [[t.tolist() for t in batch.unbind()] for batch in loader]
    assert got == [[[0.0], [0.0, 1.0]], [[0.0, 1.0, 2.0], [0.0, 1.0, 2.0, 3.0]]]
