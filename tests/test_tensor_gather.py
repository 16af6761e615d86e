"""An ArrayDataset over torch tensors, and torch's own TensorDataset:
workers gather their rows in C (NOTE [ Fast paths ]) and the batches are
torch's TensorDataset batches, tensors included, whatever num_workers."""
import multiprocessing

import numpy as np
import pytest

import fastload as fl
from fastload import _memory
from fastload.dataset import gathered_columns
from fastload_c import pack

torch = pytest.importorskip("torch", reason="tensor datasets need torch installed")
from torch.utils import data as td  # noqa: E402

# (num_workers, worker_method, multiprocessing_context)
WORKERS = [(0, "multiprocessing", None), (2, "multiprocessing", "fork"), (2, "thread", None)]
DTYPES = [torch.bool, torch.float16, torch.int64, torch.uint8, torch.float32, torch.int32]


def _tensors(seed):
    """Generated columns: every dtype above, various row shapes, one of them
    a transposed (non-contiguous) tensor."""
    rng = np.random.default_rng(seed)
    count = int(rng.integers(5, 40))
    columns = []
    for dtype in rng.permutation(len(DTYPES))[:int(rng.integers(2, len(DTYPES) + 1))]:
        dtype = DTYPES[dtype]
        shape = (count,) + tuple(int(d) for d in rng.integers(1, 4, rng.integers(0, 3)))
        values = torch.from_numpy(rng.integers(-100, 100, shape)).to(dtype)
        columns.append(values)
    columns.append(torch.from_numpy(rng.standard_normal((3, count))).T)  # non-contiguous
    return columns, rng


def _assert_same(ours, theirs):
    if isinstance(theirs, torch.Tensor):
        assert type(ours) is torch.Tensor, type(ours)
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        assert torch.equal(ours, theirs)
        return
    assert type(ours) is type(theirs) and len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        _assert_same(a, b)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("num_workers,method,context", WORKERS)
def test_tensor_array_dataset_gives_torchs_batches(seed, num_workers, method, context):
    columns, rng = _tensors(seed)
    count = len(columns[0])
    order = rng.permutation(count).tolist()
    batch_size = int(rng.integers(1, 9))
    kept = rng.permutation(count)[:max(1, count // 2)].tolist()
    options = dict(num_workers=num_workers, worker_method=method,
                   multiprocessing_context=context)
    ours = fl.ArrayDataset(*columns)
    theirs = td.TensorDataset(*columns)
    cases = [
        (fl.DataLoader(ours, batch_size=batch_size, sampler=order, **options),
         td.DataLoader(theirs, batch_size=batch_size, sampler=order)),
        (fl.DataLoader(fl.Subset(fl.Subset(ours, order), kept), batch_size=batch_size,
                       **options),
         td.DataLoader(td.Subset(td.Subset(theirs, order), kept), batch_size=batch_size)),
        (fl.DataLoader(ours, batch_size=None, sampler=order[:5], **options),
         td.DataLoader(theirs, batch_size=None, sampler=order[:5])),
    ]
    # torch's own datasets under fastload's loader (fastload.torch's names).
    cases.append((fl.DataLoader(td.Subset(theirs, order), batch_size=batch_size, **options),
                  td.DataLoader(td.Subset(theirs, order), batch_size=batch_size)))
    for loader, reference in cases:
        _assert_same(list(loader), list(reference))


class _GatherSpy:
    """Counts the C gathers (gather_into, RowGather.into) that wrote tensor
    columns without raising, across forked worker processes too."""

    def __init__(self, monkeypatch):
        self.count = multiprocessing.get_context("fork").Value("i", 0)
        real_gather_into, real_row_gather = pack.gather_into, pack.RowGather
        spy = self

        def gather_into(columns, *args, **kwargs):
            return spy.counted(columns, real_gather_into(columns, *args, **kwargs))

        class RowGather:
            def __init__(self, columns):
                self.columns, self.real = columns, real_row_gather(columns)

            def into(self, *args, **kwargs):
                return spy.counted(self.columns, self.real.into(*args, **kwargs))

        monkeypatch.setattr(pack, "gather_into", gather_into)
        monkeypatch.setattr(pack, "RowGather", RowGather)

    def counted(self, columns, layout):
        if any(isinstance(column, torch.Tensor) for column in columns):
            with self.count.get_lock():
                self.count.value += 1
        return layout


@pytest.mark.parametrize("wrapper", [None, "subset", "concat", "torch", "torch subset"])
@pytest.mark.parametrize("num_workers,method,context", WORKERS[1:])
def test_workers_gather_tensor_columns_in_c(monkeypatch, wrapper, num_workers, method, context):
    # A write that raised would fall back to the general path unseen: only
    # gather_into's successful writes are counted, and every batch needs one.
    spy = _GatherSpy(monkeypatch)
    columns, _ = _tensors(7)
    dataset = fl.ArrayDataset(*columns, np.arange(len(columns[0])))
    if wrapper and wrapper.startswith("torch"):
        dataset = td.TensorDataset(*columns, torch.arange(len(columns[0])))
    if wrapper == "torch subset":
        dataset = td.Subset(dataset, list(range(len(columns[0])))[::-1])
    elif wrapper == "subset":
        dataset = fl.Subset(dataset, list(range(len(columns[0])))[::-1])
    elif wrapper == "concat":  # its batches are the dataset's GatheredTensors
        dataset = fl.ConcatDataset([dataset])
    batches = list(fl.DataLoader(dataset, batch_size=4, num_workers=num_workers,
                                 worker_method=method, multiprocessing_context=context))
    assert spy.count.value == len(batches)
    assert all(type(leaf) is torch.Tensor for batch in batches for leaf in batch[:-1])
    last = torch.Tensor if wrapper and wrapper.startswith("torch") else np.ndarray
    assert all(type(batch[-1]) is last for batch in batches)


def test_tensors_numpy_cannot_view_take_the_general_path():
    # Needing grad: torch.stack's batch is part of the graph; no C copy is.
    weights = torch.ones(6, 2, requires_grad=True)
    assert _memory.batch_slot_bytes(td.TensorDataset(weights), 2) is None
    batches = list(fl.DataLoader(td.TensorDataset(weights), batch_size=3, num_workers=2,
                                 worker_method="thread"))
    assert all(batch[0].requires_grad for batch in batches)


@pytest.mark.parametrize("num_workers,method,context", WORKERS)
def test_dtypes_numpy_lacks_are_kept(num_workers, method, context):
    """bfloat16 and float8 tensors, which numpy cannot view: fastload's
    TensorDataset holds their bytes and gives torch's batches back."""
    rows = torch.from_numpy(np.random.default_rng(0).standard_normal((7, 2)))
    columns = [rows.to(torch.bfloat16), rows.to(torch.float8_e4m3fn), torch.arange(7)]
    options = dict(num_workers=num_workers, worker_method=method,
                   multiprocessing_context=context)
    for batch_size in (3, None):
        ours = fl.DataLoader(fl.TensorDataset(*columns), batch_size=batch_size, **options)
        theirs = td.DataLoader(td.TensorDataset(*columns), batch_size=batch_size)
        got, want = list(ours), list(theirs)
        assert [[t.dtype for t in batch] for batch in got] == [
            [t.dtype for t in batch] for batch in want]
        _assert_same([[t.view(torch.uint8) for t in batch[:2]] for batch in got],
                     [[t.view(torch.uint8) for t in batch[:2]] for batch in want])


@pytest.mark.parametrize("num_workers,method,context", WORKERS)
def test_lazily_conjugated_or_negated_tensors_are_taken(num_workers, method, context):
    """A conjugate or negative view (a bit torch resolves lazily, which numpy
    cannot view) is a column like any other: torch's batches."""
    rng = np.random.default_rng(1)
    values = torch.from_numpy(rng.standard_normal((6, 2)) + 1j * rng.standard_normal((6, 2)))
    columns = [values.conj(), torch._neg_view(values.real), torch.arange(6)]
    assert columns[0].is_conj() and columns[1].is_neg()
    ours = fl.DataLoader(fl.TensorDataset(*columns), batch_size=4, num_workers=num_workers,
                         worker_method=method, multiprocessing_context=context)
    theirs = td.DataLoader(td.TensorDataset(*columns), batch_size=4)
    _assert_same([[t.resolve_conj().resolve_neg() for t in batch] for batch in ours],
                 [[t.resolve_conj().resolve_neg() for t in batch] for batch in theirs])


def test_gather_into_gives_tensor_columns_back_as_tensors():
    images = torch.arange(24, dtype=torch.float16).reshape(6, 2, 2)
    labels = np.arange(6)
    out = bytearray(4096)
    x, y = pack.unpack(out, pack.gather_into((images, labels), [4, -1, 0], out))
    assert type(x) is torch.Tensor and torch.equal(x, images[[4, -1, 0]])
    assert type(y) is np.ndarray and y.tolist() == [4, 5, 0]
    single = pack.unpack(out, pack.gather_into(images.permute(2, 1, 0), [1], out))
    assert type(single) is torch.Tensor and torch.equal(single, images.permute(2, 1, 0)[[1]])


def test_slots_are_sized_from_a_tensor_dataset_batch():
    # Gathered whole, a batch's size is known before the first one is made.
    dataset = fl.ArrayDataset(torch.zeros(8, 3), torch.arange(8))
    assert _memory.batch_slot_bytes(dataset, 4) == 64 + 4 * 8
    assert _memory.batch_slot_bytes(fl.Subset(dataset, [1, 2]), 4) == 96
    theirs = td.TensorDataset(torch.zeros(8, 3), torch.arange(8))
    assert _memory.batch_slot_bytes(td.Subset(theirs, [1, 2]), 4) == 96


def test_the_tensor_rows_workload_measures_an_array_dataset_of_tensors():
    from fastload._bench import workloads

    workload = workloads.WORKLOADS["tensor-rows"]
    arrays = workload.make_arrays()
    ours, theirs = workload.dataset("fastload", arrays), workload.dataset("torch", arrays)
    assert type(theirs) is td.TensorDataset
    assert gathered_columns(ours) is not None  # the workers' C gather
    first = next(iter(fl.DataLoader(ours, batch_size=workload.batch_size, num_workers=2)))
    _assert_same(first, next(iter(td.DataLoader(theirs, batch_size=workload.batch_size))))
