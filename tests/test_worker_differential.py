"""Workers compute exactly what the main process computes.

For generated dataset compositions (tests/_compositions.py), the whole
outcome of an epoch (every batch's types, dtypes, shapes and bytes, every
exception's type, in order) is the same with num_workers 0, 1 and 3, with
worker processes under fork and spawn and with worker threads
(worker_method="thread"): NOTE [ Fast paths ] in fastload/_fast_path.py,
NOTE [ Thread workers ] in fastload/_thread_workers.py.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastload as fl
import fastload._fast_path as fast_path

from _compositions import COLLATE_FNS, build, canonical, epoch_outcome, leaf, torch

LEAF_KINDS = ["f32", "u8img", "i64", "int", "float", "bool", "mixnum", "wildnum", "str",
              "longstr",
              "bytes", "ragged", "obj", "empty", "deep", "none", "f32be", "padded", "bigint", "ulonglong"]
if torch is not None:
    LEAF_KINDS += ["tensor", "tensor_i", "empty_t"]

seeds = st.integers(0, 2**16)
leaves = st.sampled_from(LEAF_KINDS).map(lambda kind: ("leaf", kind))
structures = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=3).map(lambda items: ("tuple", tuple(items))),
        st.lists(inner, min_size=1, max_size=2).map(lambda items: ("list", tuple(items))),
        st.lists(inner, min_size=1, max_size=3).map(
            lambda items: ("dict", tuple((f"f{j}", s) for j, s in enumerate(items)))),
        st.tuples(inner, inner).map(lambda pair: ("pair",) + pair),
    ),
    max_leaves=4,
)


@st.composite
def python_datasets(draw, n):
    structure = draw(structures)
    failing = tuple(draw(st.lists(st.integers(0, n - 1), max_size=2, unique=True)))
    return ("python", n, structure, failing, draw(st.booleans()), draw(seeds))


def array_datasets(n):
    dtypes = st.lists(st.sampled_from(["float32", "int64", "uint8", "bool", "float16"]),
                      min_size=1, max_size=3).map(tuple)
    return st.one_of(st.tuples(st.just("array"), st.just(n), dtypes, seeds),
                     st.tuples(st.just("strings"), st.just(n), seeds))


@st.composite
def compositions(draw):
    n = draw(st.integers(4, 14))
    base = st.one_of(array_datasets(n), python_datasets(n))
    shape = draw(st.sampled_from(
        ["plain", "subset", "subset_array", "reversed_subset", "split", "nested_subset",
         "concat", "stack_tuple", "stack_dict"]))
    if shape == "plain":
        return draw(base)
    if shape in ("subset", "subset_array", "reversed_subset", "split"):
        return (shape, draw(base), draw(seeds))
    if shape == "nested_subset":
        return ("subset", ("subset_array", draw(base), draw(seeds)), draw(seeds))
    parts = tuple(draw(st.lists(base, min_size=2, max_size=2)))
    return (shape, parts)


loader_settings = st.fixed_dictionaries({
    "batch_size": st.one_of(st.none(), st.integers(1, 6)),  # None: no auto-batching
    "shuffle": st.booleans(),
    "drop_last": st.booleans(),
    "collate": st.sampled_from(["default", "default", "keep", "pad"]),
    # False: workers make even the batches the main process would gather
    # (NOTE [ Small gathers ] in fastload/_fast_path.py).
    "small_gathers": st.booleans(),
})


def outcome(description, options, **extra):
    loader = fl.DataLoader(
        build(description), batch_size=options["batch_size"], shuffle=options["shuffle"],
        # torch refuses drop_last without a batch size
        drop_last=options["drop_last"] and options["batch_size"] is not None,
        collate_fn=COLLATE_FNS[options["collate"]],
        generator=7, **extra)
    small_gather_bytes = fast_path.SMALL_GATHER_BYTES
    if not options.get("small_gathers", True):
        fast_path.SMALL_GATHER_BYTES = 0
    try:
        return epoch_outcome(loader)
    finally:
        fast_path.SMALL_GATHER_BYTES = small_gather_bytes


def assert_same_outcome(description, options, context, workers=(1, 3)):
    """Processes under ``context`` and threads, each with every number of
    ``workers``, give the outcome of num_workers=0."""
    expected = outcome(description, options)
    for num_workers in workers:
        got = outcome(description, options, num_workers=num_workers,
                      multiprocessing_context=context)
        assert got == expected, (num_workers, context, description, options)
        threaded = outcome(description, options, num_workers=num_workers,
                           worker_method="thread")
        assert threaded == expected, (num_workers, "thread", description, options)


@pytest.mark.timeout(600)
@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(compositions(), loader_settings)
def test_workers_match_the_main_process_under_fork(description, options):
    assert_same_outcome(description, options, "fork")


@pytest.mark.timeout(600)
@settings(max_examples=4, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(compositions(), loader_settings)
def test_workers_match_the_main_process_under_spawn(description, options):
    assert_same_outcome(description, options, "spawn", workers=(2,))


# Named cases of issue 12, each once more by hand.

TORCH_CASES = [
    ("python", 10, ("leaf", "tensor"), (), False, 1),
    ("python", 10, ("tuple", (("leaf", "tensor"), ("leaf", "tensor_i"))), (), False, 2),
    ("python", 10, ("dict", (("image", ("leaf", "tensor")), ("label", ("leaf", "int")))), (),
     True, 3),
]


class StringRows(fl.Dataset):
    """Strings fetched a batch at a time, as a tuple."""

    def __len__(self):
        return 5

    def __getitem__(self, i):
        return "ab" * i

    def __getitems__(self, indices):
        return tuple(self[i] for i in indices)


@pytest.mark.parametrize("method", ["multiprocessing", "thread"])
def test_a_batch_of_strings_is_the_sequence_the_dataset_gave(method):
    """default_collate returns a batch of strings as it is: the tuple
    __getitems__ made, with workers too (as torch does)."""
    expected = list(fl.DataLoader(StringRows(), batch_size=2))
    assert [type(batch) for batch in expected] == [tuple] * 3
    got = list(fl.DataLoader(StringRows(), batch_size=2, num_workers=2, worker_method=method))
    assert got == expected and [type(batch) for batch in got] == [tuple] * 3


class Numbers(fl.Dataset):
    def __init__(self, numbers):
        self.numbers = numbers

    def __len__(self):
        return len(self.numbers)

    def __getitem__(self, i):
        return {"n": self.numbers[i]}


@pytest.mark.parametrize("numbers", [
    [1, 2**70, 2.5],  # numpy: an object array
    [False, 2**63 + 1, False, 3],  # numpy: float64, rounded
    [False, -5, 2**63 + 3],
    [np.int64(1), 2**70],
    [True, 2.5, 7],
    [1, np.float32(2.5)],
], ids=["past64", "bool-uint64", "bool-negative-uint64", "npint-past64", "bool-float",
        "int-npfloat"])
def test_a_number_leaf_of_mixed_kinds_is_collated_alike_on_every_path(numbers):
    # The C collation took numpy's inference for them: it wrote an object
    # array's pointers into the slot (the main process crashed reading
    # them) or rounded ints past int64 to floats, where the main process
    # raises OverflowError or makes uint64.
    def run(**kwargs):
        return epoch_outcome(fl.DataLoader(Numbers(numbers), batch_size=len(numbers),
                                           **kwargs), states=False)

    expected = run()
    assert run(num_workers=1) == expected
    assert run(num_workers=1, worker_method="thread") == expected


@pytest.mark.parametrize("last", [np.array([1.0, 2.0], ">f8")[::-1],
                                  np.arange(2, dtype=np.ulonglong)], ids=["f8be", "ulonglong"])
def test_a_string_leaf_keeps_a_later_samples_array_as_it_is_on_every_path(last):
    # default_collate keeps a string leaf's samples as they are; the C
    # collation pickled them plainly, which gives such arrays back in
    # native byte order, or as np.uint64's.
    samples = [b"n", b"", last]
    for kwargs in ({}, {"num_workers": 1}, {"num_workers": 1, "worker_method": "thread"}):
        batch = next(iter(fl.DataLoader(Numbers(samples), batch_size=3, **kwargs)))["n"]
        assert batch[:2] == [b"n", b""], kwargs
        assert batch[2].dtype.str == last.dtype.str and batch[2].dtype.char == last.dtype.char
        assert batch[2].tolist() == last.tolist()


DTYPE_LEAVES = ["f32be", "padded", "bigint", "ulonglong"]


@pytest.mark.parametrize("batch_size", [1, 2, 3])
@pytest.mark.parametrize("kind", DTYPE_LEAVES)
def test_a_batch_has_one_dtype_whatever_its_size_and_path(kind, batch_size):
    """Another byte order, padded fields, ints past int64 and np.ulonglong:
    a batch of one sample has the dtype of a batch of several (numpy's
    promotion, which np.array skips for a lone sample), with or without
    workers (the C collation and a pickle give that dtype)."""
    description = ("python", 5, ("tuple", (("leaf", kind), ("leaf", "f32"))), (), False, 4)
    options = {"batch_size": batch_size, "shuffle": False, "drop_last": False,
               "collate": "default"}
    assert_same_outcome(description, options, "fork", workers=(2,))
    batches = list(fl.DataLoader(build(description), batch_size=batch_size))
    dtypes = {batch[0].dtype.descr.__repr__() + batch[0].dtype.char for batch in batches}
    assert len(dtypes) == 1, dtypes
    assert batches[0][0].dtype.isnative


def test_an_empty_arrays_batch_has_numpys_strides_on_every_path():
    """A batch of empty arrays holds no bytes to compare: its strides are
    numpy's for an empty array (all zero, as np.array stacks them), whether
    the main process, a worker's slot or a thread collated it."""
    description = ("python", 5, ("dict", (("e", ("leaf", "empty")), ("x", ("leaf", "f32")))),
                   (), False, 5)
    options = {"batch_size": 2, "shuffle": False, "drop_last": False, "collate": "default"}
    assert_same_outcome(description, options, "fork", workers=(2,))
    batch = next(iter(fl.DataLoader(build(description), batch_size=2, num_workers=2)))
    assert batch["e"].shape == (2, 0, 2) and batch["e"].strides == (0, 0, 0)
    rows = fl.ArrayDataset(np.zeros((6, 0, 3), np.float32))
    for kwargs in ({}, {"num_workers": 2}, {"num_workers": 2, "worker_method": "thread"}):
        (first,) = next(iter(fl.DataLoader(rows, batch_size=4, **kwargs)))
        assert first.shape == (4, 0, 3) and first.strides == (0, 0, 0), kwargs


@pytest.mark.skipif(torch is None, reason="needs torch installed")
@pytest.mark.parametrize("kind", ["empty", "empty_t"])
def test_an_empty_tensors_batch_has_torchs_strides_on_every_path(kind):
    """Tensors out, from empty arrays or empty tensors: torch's strides for
    an empty batch (C strides, as default_collate gives), not numpy's."""
    import fastload.torch as flt

    samples = [leaf(kind, 0, i, "") for i in range(3)]
    expected = torch.utils.data.default_collate(
        [torch.as_tensor(sample) for sample in samples]).stride()
    assert expected == (2, 2, 1)
    description = ("python", 5, ("leaf", kind), (), False, 6)
    for kwargs in ({}, {"num_workers": 2}, {"num_workers": 2, "worker_method": "thread"}):
        batch = next(iter(flt.DataLoader(build(description), batch_size=3, **kwargs)))
        assert isinstance(batch, torch.Tensor) and batch.stride() == expected, kwargs


@pytest.mark.parametrize("kwargs", [{"num_workers": 2},
                                    {"num_workers": 2, "worker_method": "thread"}])
def test_an_array_datasets_columns_have_one_dtype_whatever_the_path(kwargs):
    """np.longlong's and np.ulonglong's columns come back under the names a
    pickle gives (np.int64's, np.uint64's), in native byte order, on every path."""
    columns = (np.arange(6, dtype="q"), np.arange(6, dtype=">Q"), np.arange(6, dtype=">f4"))
    described = [[(a.dtype.char, a.dtype.str, a.tolist()) for a in batch]
                 for batch in fl.DataLoader(fl.ArrayDataset(*columns), batch_size=4)]
    assert [char for char, _, _ in described[0]] == ["l", "L", "f"]
    assert [dtype for _, dtype, _ in described[0]] == ["<i8", "<u8", "<f4"]
    got = [[(a.dtype.char, a.dtype.str, a.tolist()) for a in batch]
           for batch in fl.DataLoader(fl.ArrayDataset(*columns), batch_size=4, **kwargs)]
    assert got == described


def _object_column(n):
    column = np.empty(n, dtype=object)
    for i in range(n):
        column[i] = {"id": i, "tags": [f"t{i}", f"u{i}"]}
    return column


@pytest.mark.parametrize("kwargs", [{}, {"num_workers": 2},
                                    {"num_workers": 2, "worker_method": "thread"}])
def test_an_array_datasets_batch_is_the_default_collate_of_its_samples(kwargs):
    """Gathering columns is an optimisation of collating the samples
    ``dataset[i]``: the batch is the same, containers included (strings
    and bytes stay the tuple the samples' transposition gives, as in torch),
    dtypes too (another byte order made native, np.longlong named np.int64)."""
    n = 10
    columns = (np.arange(n * 2, dtype=np.float32).reshape(n, 2),
               np.array([f"w{i}" for i in range(n)]), np.array([b"b%d" % i for i in range(n)]),
               _object_column(n), np.arange(n, dtype=">i2"),
               np.arange(n * 6, dtype=">f8").reshape(n, 2, 3), np.arange(n, dtype=np.longlong))
    dataset = fl.ArrayDataset(*columns)
    expected = [canonical(fl.default_collate([dataset[i] for i in range(start, min(start + 4, n))]))
                for start in range(0, n, 4)]
    got = [canonical(batch) for batch in fl.DataLoader(dataset, batch_size=4, **kwargs)]
    assert got == expected
    assert isinstance(got[0][1][1], tuple) and got[0][1][1][0] == "tuple"


@pytest.mark.skipif(torch is None, reason="needs torch installed")
@pytest.mark.parametrize("kind", ["f32be", "bigint", "ulonglong"])
@pytest.mark.parametrize("kwargs", [{}, {"num_workers": 2},
                                    {"num_workers": 2, "worker_method": "thread"}])
def test_torch_output_of_those_dtypes_with_and_without_workers(kind, kwargs):
    """torch refuses np.ulonglong and another byte order by name: output="torch"
    gives the tensor whichever path collated the batch."""
    dataset = build(("python", 3, ("leaf", kind), (), False, 5))
    expected = fl.DataLoader(dataset, batch_size=1)
    got = fl.DataLoader(dataset, batch_size=1, output="torch", **kwargs)
    for want, batch in zip(expected, got, strict=True):
        assert isinstance(batch, torch.Tensor)
        assert np.array_equal(batch.numpy(), want)


@pytest.mark.skipif(torch is None, reason="needs torch installed")
@pytest.mark.parametrize("description", TORCH_CASES)
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_torch_tensor_samples_as_with_no_workers(description, context):
    options = {"batch_size": 4, "shuffle": True, "drop_last": False, "collate": "default"}
    assert_same_outcome(description, options, context, workers=(2,))


@pytest.mark.skipif(torch is None, reason="needs torch installed")
def test_torch_tensor_samples_with_torch_output_and_pinning():
    dataset = build(TORCH_CASES[2])
    kwargs = dict(batch_size=4, output="torch", pin_memory=True)
    expected = [(b["image"].tolist(), b["label"].tolist()) for b in fl.DataLoader(dataset, **kwargs)]
    got = [(b["image"].tolist(), b["label"].tolist())
           for b in fl.DataLoader(dataset, num_workers=2, **kwargs)]
    assert got == expected and len(got) == 3


def test_subset_subclasses_are_called_not_bypassed():
    description = ("reversed_subset", ("array", 12, ("float32", "int64"), 5), 9)
    options = {"batch_size": 3, "shuffle": False, "drop_last": False, "collate": "default"}
    assert_same_outcome(description, options, "fork")
    dataset = build(description)
    first = next(iter(fl.DataLoader(dataset, batch_size=3, num_workers=2)))
    assert first[0].tolist() == [dataset[i][0].tolist() for i in range(3)]


class LongStrings(fl.Dataset):
    def __init__(self, length, distinct=True):
        self.length, self.distinct = length, distinct

    def __len__(self):
        return 512

    def __getitem__(self, i):
        return (f"{i:06d}" if self.distinct else "") + "x" * self.length


@pytest.mark.parametrize("length,batch_size", [(2048, 256), (3 << 20, 1)])
def test_strings_of_any_length(length, batch_size):
    dataset = LongStrings(length)
    loader = fl.DataLoader(dataset, batch_size=batch_size, num_workers=2)
    count = 0
    for batch in loader:
        assert all(len(s) == 6 + length for s in batch)
        count += 1
        if count == 4:
            break
    assert count == min(4, len(dataset) // batch_size)


def test_a_batch_larger_than_any_ring():
    data = np.arange(600_000, dtype=np.int32)
    dataset = fl.ArrayDataset(data)
    kwargs = dict(batch_size=300_000, shuffle=True, generator=3)
    expected = [b[0] for b in fl.DataLoader(dataset, **kwargs)]
    got = [b[0] for b in fl.DataLoader(dataset, num_workers=2, **kwargs)]
    assert len(got) == 2 and all(np.array_equal(a, b) for a, b in zip(got, expected))
    assert sorted(np.concatenate(got).tolist()) == data.tolist()


def test_collate_errors_fail_their_batch_only():
    description = ("python", 12, ("leaf", "ragged"), (), False, 4)
    options = {"batch_size": 3, "shuffle": False, "drop_last": False, "collate": "default"}
    with_workers = outcome(description, options, num_workers=2)
    assert ("raised", "CollateError") in with_workers
    assert any(item[0] != "raised" for item in with_workers), "every batch failed"
    assert_same_outcome(description, options, "fork", workers=(2,))


def test_persistent_workers_survive_failing_batches():
    description = ("python", 12, ("leaf", "f32"), (1, 7), False, 4)
    loader = fl.DataLoader(build(description), batch_size=2, num_workers=2,
                           persistent_workers=True)
    expected = epoch_outcome(fl.DataLoader(build(description), batch_size=2), states=False)
    assert expected.count(("raised", "ValueError")) == 2
    for _ in range(2):
        assert epoch_outcome(loader, states=False) == expected


class FirstBatchHuge(fl.Dataset):
    """Samples 0-3 are 4 MiB each; the others are small."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        return np.full((1 << 20) if i < 4 else 4, i, dtype=np.float32)


def test_a_batch_past_the_shared_memory_cap_fails_alone(monkeypatch):
    from fastload import _memory

    monkeypatch.setattr(_memory, "default_max_bytes", lambda: 8 << 20)
    loader = fl.DataLoader(FirstBatchHuge(), batch_size=4, num_workers=2,
                           persistent_workers=True)
    for _ in range(2):  # and the loader stays usable
        it = iter(loader)
        with pytest.raises(fl.ShmError, match="batch_size"):
            next(it)
        rest = [batch[:, 0].tolist() for batch in it]
        assert rest == [[4, 5, 6, 7], [8, 9, 10, 11]]


class Tagged(list):
    """A list subclass: default_collate keeps its type."""


def _outcome(loader):
    try:
        return [("batch", type(b).__name__, repr(b)) for b in loader]
    except TypeError as error:
        return [("error", type(error).__name__, str(error).splitlines()[0][-60:])]


@pytest.mark.parametrize("sample", [
    lambda i: Tagged([np.float32(i), np.arange(2) + i]),
    lambda i: np.datetime64(i, "D"),
    lambda i: np.zeros(1, dtype=[("a", "i4"), ("b", "f8")])[0],
], ids=["list subclass", "datetime64 scalar", "structured scalar"])
@pytest.mark.parametrize("method", ["multiprocessing", "thread"])
def test_what_the_c_collation_does_not_rebuild_exactly_takes_the_general_path(sample, method):
    """Samples default_collate keeps the type of, or refuses, are not
    collated in C: workers give what num_workers=0 gives (the batch, or the
    same exception)."""
    class Samples(fl.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return sample(i)

    expected = _outcome(fl.DataLoader(Samples(), batch_size=2))
    got = _outcome(fl.DataLoader(Samples(), batch_size=2, num_workers=2, worker_method=method))
    assert [row[:2] for row in got] == [row[:2] for row in expected]
    if expected[0][0] == "batch":
        assert got == expected


if torch is not None:
    class Marked(torch.Tensor):
        """A tensor subclass: torch.stack keeps it."""


class MarkedSamples(fl.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.arange(3.0).as_subclass(Marked) + i


@pytest.mark.skipif(torch is None, reason="a torch.Tensor subclass needs torch")
def test_a_tensor_subclass_keeps_its_class_with_workers():
    for kwargs in ({}, {"num_workers": 2}, {"num_workers": 2, "worker_method": "thread"}):
        batches = list(fl.DataLoader(MarkedSamples(), batch_size=2, **kwargs))
        assert [type(b) for b in batches] == [Marked, Marked], kwargs
        assert torch.equal(batches[1].as_subclass(torch.Tensor),
                           torch.arange(3.0).repeat(2, 1) + torch.tensor([[2.0], [3.0]]))
