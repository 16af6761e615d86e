"""Collation and gather into slots equal their references: default_collate
(written here from its rules, with np.stack) and numpy fancy indexing."""
import collections
import copy
import os
from collections.abc import Mapping, MutableMapping

import numpy as np
import pytest
from _mapped import mapped_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastload_c.errors import CollateError
from fastload_c.pack import (
    SlotTooSmallError,
    arrays_alike,
    collate_into,
    gather_into,
    layout_end,
    unpack,
)
from fastload_c.shm import Segment

Point = collections.namedtuple("Point", "x y")


class Record(dict):
    """A Mapping type of its own, kept through collation."""


def reference_collate(batch):
    """default_collate's rules, with np.stack, as torch structures them.
    (To be replaced by fastload.default_collate.)"""
    elem = batch[0]
    if isinstance(elem, (str, bytes)):
        return batch  # as given: a tuple where zip transposed a sequence
    if isinstance(elem, (np.ndarray, np.generic)):
        arrays = [np.asarray(b) for b in batch]
        for i, a in enumerate(arrays):
            if a.dtype.char in "SaUO":
                raise TypeError("found {}".format(a.dtype))
            if a.shape != arrays[0].shape:
                raise CollateError("default_collate: sample {} has shape {} but sample 0 has "
                                   "shape {}".format(i, a.shape, arrays[0].shape))
        return np.stack(arrays)
    if isinstance(elem, float):
        return np.array(batch, dtype=np.float64)
    if isinstance(elem, int):  # and bool: the dtype all of them make
        return np.array(batch)
    if isinstance(elem, Mapping):
        out = {key: reference_collate([b[key] for b in batch]) for key in elem}
        if isinstance(elem, MutableMapping):
            clone = copy.copy(elem)
            clone.update(out)
            return clone
        try:
            return type(elem)(out)
        except TypeError:
            return out
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        return type(elem)(*(reference_collate(s) for s in zip(*batch)))
    if isinstance(elem, (list, tuple)):
        if any(len(b) != len(elem) for b in batch):
            raise RuntimeError("each element in list of batch should be of equal size")
        return [reference_collate(s) for s in zip(*batch)]
    raise TypeError("default_collate: found {}".format(type(elem)))


def assert_same(got, want):
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.flags.c_contiguous
        assert got.tobytes() == want.tobytes()
    elif isinstance(want, Mapping):
        assert list(got) == list(want)
        for key in want:
            assert_same(got[key], want[key])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w)
    else:
        assert got == want


@pytest.fixture(scope="module")
def seg():
    return Segment(8 << 20)


def collate(samples, seg):
    # A slot that does not start the segment: offsets are the slot's own.
    return unpack(memoryview(seg)[64:], collate_into(samples, seg, 64, seg.size - 64))


def collate_through_file(samples, seg):
    """As collate, the arrays' rows written to the segment's memfd (NOTE [
    Unmapped slots ]); the slot is zeroed first, so a row the write missed
    shows."""
    np.frombuffer(seg, np.uint8)[:] = 0
    layout = collate_into(samples, seg, 64, seg.size - 64, fd=seg.fd)
    return unpack(memoryview(seg)[64:], layout)


# -- random sample structures ------------------------------------------------

DTYPES = [
    "?", "i1", "u1", "<i2", ">i2", "<i4", ">u4", "<i8", "<f2", ">f2", "<f4", ">f4", "<f8",
    ">f8", "<c8", ">c16", "<M8[s]",
    np.dtype([("a", "<i4"), ("b", ">f8", (2,))]),
    np.dtype({"names": ["x"], "formats": ["<i2"], "offsets": [2], "itemsize": 8}),  # padded
]

shapes = st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple)
leaf_schemas = st.one_of(
    st.tuples(st.just("array"), st.sampled_from(DTYPES), shapes, st.sampled_from(["c", "step", "rev", "T"])),
    st.tuples(st.just("npscalar"), st.sampled_from(["?", "i1", "<i8", "<f2", "<f4", "<c16"])),
    st.tuples(st.sampled_from(["int", "float", "bool", "str", "bytes"])),
)
schemas = st.recursive(
    leaf_schemas,
    lambda inner: st.one_of(
        st.tuples(st.sampled_from(["list", "tuple"]), st.lists(inner, min_size=1, max_size=3)),
        st.tuples(st.just("dict"), st.dictionaries(st.sampled_from("abcd"), inner, min_size=1, max_size=3)),
        st.tuples(st.sampled_from(["record", "defaultdict"]),
                  st.dictionaries(st.sampled_from("xyz"), inner, min_size=1, max_size=2)),
        st.tuples(st.just("point"), st.tuples(inner, inner)),
    ),
    max_leaves=6,
)


def random_array(rng, dtype, shape, layout):
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * 2 + 2
    raw = rng.integers(0, 256, size=n * dtype.itemsize, dtype=np.uint8)
    flat = raw.view(dtype) if dtype != np.bool_ else raw.astype(np.bool_)
    if dtype.kind == "M":
        flat = (raw.view("<i8") % 10**9).astype(dtype)
    if layout == "step" and shape:
        # Every other element of a longer last axis: not contiguous.
        wide = shape[:-1] + (shape[-1] * 2,)
        return flat[: int(np.prod(wide))].reshape(wide)[..., ::2]
    if layout == "rev" and shape:
        return flat[: int(np.prod(shape))].reshape(shape)[::-1]
    if layout == "T" and len(shape) >= 2:
        return flat[: int(np.prod(shape))].reshape(shape[::-1]).T
    return flat[: int(np.prod(shape))].reshape(shape)


def make_sample(schema, rng):
    kind = schema[0]
    if kind == "array":
        return random_array(rng, schema[1], schema[2], schema[3])
    if kind == "npscalar":
        return random_array(rng, schema[1], (), "c")[()]
    if kind == "int":
        return int(rng.integers(-2**62, 2**62))
    if kind == "float":
        return float(rng.standard_normal())
    if kind == "bool":
        return bool(rng.integers(2))
    if kind == "str":
        return "s{}".format(rng.integers(1000))
    if kind == "bytes":
        return bytes(rng.integers(0, 256, size=3, dtype=np.uint8))
    if kind == "list":
        return [make_sample(s, rng) for s in schema[1]]
    if kind == "tuple":
        return tuple(make_sample(s, rng) for s in schema[1])
    if kind == "dict":
        return {k: make_sample(s, rng) for k, s in schema[1].items()}
    if kind == "record":
        return Record({k: make_sample(s, rng) for k, s in schema[1].items()})
    if kind == "defaultdict":
        return collections.defaultdict(list, {k: make_sample(s, rng) for k, s in schema[1].items()})
    return Point(*(make_sample(s, rng) for s in schema[1]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=schemas, batch=st.integers(1, 5), seed=st.integers(0, 2**32 - 1))
def test_collate_into_slot_equals_default_collate(seg, schema, batch, seed):
    rng = np.random.default_rng(seed)
    samples = [make_sample(schema, rng) for _ in range(batch)]
    assert_same(collate(samples, seg), reference_collate(samples))
    # Again: the plan cached from this batch must serve the next one.
    samples = [make_sample(schema, rng) for _ in range(batch)]
    assert_same(collate(samples, seg), reference_collate(samples))
    assert_same(collate_through_file(samples, seg), reference_collate(samples))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=schemas, batch=st.integers(1, 5), seed=st.integers(0, 2**32 - 1))
def test_layout_end_is_the_slot_size_a_batch_needs(seg, schema, batch, seed):
    # What NOTE [ Slots after a spike ] (fastload/_memory.py) reads: a slot
    # of layout_end bytes holds the batch, one byte fewer does not.
    rng = np.random.default_rng(seed)
    samples = [make_sample(schema, rng) for _ in range(batch)]
    end = layout_end(collate_into(samples, seg, 64, seg.size - 64))
    assert_same(unpack(memoryview(seg)[64:], collate_into(samples, seg, 64, end)),
                reference_collate(samples))
    if end > 0:
        with pytest.raises(SlotTooSmallError) as small:
            collate_into(samples, seg, 64, end - 1)
        assert small.value.needed == end


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@settings(max_examples=60, deadline=None)
@given(dtypes=st.lists(st.sampled_from(["?", "i1", "<i4", ">i4", "<i8", "<f4", ">f8", "<c8"]),
                       min_size=2, max_size=5),
       scalars=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_samples_of_different_dtypes_promote_as_np_stack(seg, dtypes, scalars, seed):
    rng = np.random.default_rng(seed)
    shape = () if scalars else (3,)
    leaves = [random_array(rng, d, shape, "c") for d in dtypes]
    if scalars:
        leaves = [a[()] for a in leaves]
    samples = [(leaf, i) for i, leaf in enumerate(leaves)]
    assert_same(collate(samples, seg), reference_collate(samples))


@pytest.mark.parametrize("samples", [
    [np.zeros(3, np.int64), np.zeros(3, np.float32)],
    [(1, "a"), (2.5, "b")],
    [{"x": np.uint8(1)}, {"x": np.int8(2)}],
])
def test_without_numpy_rules_samples_that_differ_in_dtype_are_refused(seg, samples):
    """numpy_rules=False: the caller promotes by another rule (torch's)."""
    with pytest.raises(TypeError, match="differ in dtype"):
        collate_into(samples, seg, numpy_rules=False)
    assert_same(collate(samples, seg), reference_collate(samples))
    same = [samples[0]] * 2
    assert_same(unpack(seg, collate_into(same, seg, numpy_rules=False)),
                reference_collate(same))


@pytest.mark.parametrize("leaf", [
    np.arange(2).astype("datetime64[s]"), np.arange(2).astype("timedelta64[ms]"),
    np.zeros(2, dtype=[("a", "i1"), ("b", "f8")])])
def test_without_numpy_rules_arrays_of_no_number_dtype_are_refused(seg, leaf):
    samples = [(leaf, 1), (leaf, 2)]
    with pytest.raises(TypeError, match="not a number's dtype"):
        collate_into(samples, seg, numpy_rules=False)
    assert_same(collate(samples, seg), reference_collate(samples))


def test_samples_viewing_one_array_and_mixed_contiguity(seg):
    base = np.arange(40, dtype=np.float32).reshape(10, 4)
    samples = [base[i] for i in range(10)] + [base[::-1][2], base.T[1, :4].copy()]
    assert_same(collate(samples, seg), reference_collate(samples))


def test_a_collation_through_the_file_maps_none_of_the_arrays_pages():
    segment = Segment(8 << 20)
    rows = np.arange(1 << 20, dtype=np.float32).reshape(8, -1)  # rows of 512 KiB
    # Rows of one array (one iovec), separate arrays, a strided one (copied
    # to private memory first), numbers.
    samples = [(rows[i] if i < 4 else rows[i].copy(), i) for i in range(8)]
    samples[6] = (rows[::-1][1], 6)
    layout = collate_into(samples, segment, 4096, 6 << 20, fd=segment.fd)
    # The page of the labels, at most.
    assert mapped_bytes(segment.address, segment.size) <= 2 * 4096
    batch = unpack(memoryview(segment)[4096:], layout)
    assert_same(batch, reference_collate(samples))
    # Written through the mapping, every page of the batch is mapped.
    other = Segment(8 << 20)
    collate_into(samples, other, 4096, 6 << 20)
    assert mapped_bytes(other.address, other.size) >= 4 << 20


def test_a_failed_write_through_the_file_raises_and_the_next_collation_works(seg):
    samples = [np.ones(1024, np.float32)] * 4
    with open(os.devnull, "rb") as read_only:
        with pytest.raises(OSError, match="cannot write the batch to its slot's file"):
            collate_into(samples, seg, fd=read_only.fileno())
    assert_same(collate_through_file(samples, seg), reference_collate(samples))


def test_shape_mismatch_names_both_samples_and_shapes(seg):
    samples = [np.zeros((2, 3))] * 3 + [np.zeros((2, 4))]
    with pytest.raises(CollateError, match=r"^default_collate: sample 3 has shape \(2, 4\) but "
                                           r"sample 0 has shape \(2, 3\)$"):
        collate_into(samples, seg)
    assert issubclass(CollateError, RuntimeError)
    with pytest.raises(CollateError, match=r"sample 1 has shape \(\) but sample 0 has shape \(2,\)"):
        collate_into([(np.zeros(2),), (np.float64(1),)], seg)


def test_unsupported_leaves_in_later_samples_are_type_errors_too(seg):
    with pytest.raises(TypeError, match="found <class 'NoneType'>"):
        collate_into([(np.zeros(2), 1), (None, 2)], seg)
    with pytest.raises(TypeError, match="found <class 'NoneType'>"):
        collate_into([1, None], seg)


@pytest.mark.parametrize("samples", [
    [(1, 1.5, True), (np.int32(2), np.float32(2.5), np.bool_(False)), (3, 4, True)],
    [(1, 1.5, True), (2.5, 2, 7), (3, True, False)],
    [(True, 0.5), (np.uint8(200), np.int64(2))],
])
def test_numbers_of_other_kinds_in_later_samples_infer_the_dtype(seg, samples):
    assert_same(collate(samples, seg), reference_collate(samples))


def test_a_defaultdict_keeps_its_factory(seg):
    samples = [collections.defaultdict(list, a=np.arange(2)) for _ in range(3)]
    got = collate(samples, seg)
    assert type(got) is collections.defaultdict and got.default_factory is list
    assert_same(got, reference_collate(samples))


def test_unequal_lengths_and_kinds_raise(seg):
    with pytest.raises(RuntimeError, match="sample 1 has 3 elements but sample 0 has 2"):
        collate_into([[1, 2], [1, 2, 3]], seg)
    with pytest.raises(CollateError, match="sample 1 is a str but sample 0 is a numpy.ndarray"):
        collate_into([np.zeros(2), "x"], seg)
    with pytest.raises(CollateError, match="sample 2 is a str but sample 0 is a int"):
        collate_into([1, 2, "3"], seg)
    with pytest.raises(KeyError):
        collate_into([{"a": 1}, {"b": 1}], seg)


@pytest.mark.parametrize("leaf", [None, object(), np.array(["a", "b"]), np.array([b"x"]),
                                  np.array([1, None], dtype=object),
                                  np.zeros(2, dtype=[("o", "O")])])
def test_unsupported_leaves_raise_type_error(seg, leaf):
    with pytest.raises(TypeError):
        collate_into([(leaf, 1), (leaf, 2)], seg)


def test_empty_batch_is_refused(seg):
    with pytest.raises(ValueError, match="empty"):
        collate_into([], seg)


def test_strings_travel_in_the_layout_and_structures_come_back(seg):
    samples = [{"name": "img%d.png" % i, "pt": Point(i, [float(i)]), "raw": b"\0\1"} for i in range(3)]
    got = collate(samples, seg)
    assert got["name"] == ["img0.png", "img1.png", "img2.png"]
    assert got["raw"] == [b"\0\1"] * 3
    assert type(got["pt"]) is Point
    assert_same(got, reference_collate(samples))
    # Items of a sequence are transposed with zip: torch gives them as a tuple.
    assert collate([(np.zeros(1), "a"), (np.ones(1), "b")], seg)[1] == ("a", "b")


def test_a_batch_too_large_for_its_slot_writes_nothing(seg):
    view = np.frombuffer(seg, dtype=np.uint8)
    view[:4096] = 0xAB
    samples = [np.ones(256, dtype=np.float64)] * 4  # 8192 bytes
    with pytest.raises(SlotTooSmallError, match="need 8192 bytes, the slot holds 4096") as info:
        collate_into(samples, seg, 0, 4096)
    assert info.value.needed == 8192
    assert (view[:4096] == 0xAB).all()
    import pickle

    again = pickle.loads(pickle.dumps(info.value))
    assert again.needed == 8192 and str(again) == str(info.value)


def test_layout_bytes_are_reused_for_batches_of_the_same_structure(seg):
    samples = [(np.zeros(3, np.float32), 1) for _ in range(4)]
    assert collate_into(samples, seg) is collate_into(samples, seg)


# -- gather ------------------------------------------------------------------

columns = st.tuples(
    st.sampled_from(["?", "<i2", ">f4", "<f8", "<c8", "U3",
                     np.dtype([("a", "<i4"), ("b", ">f8", (2,))])]),
    st.lists(st.integers(0, 3), min_size=0, max_size=2).map(tuple),
    st.sampled_from(["c", "step", "rev", "T"]),
)


@settings(max_examples=200, deadline=None)
@given(cols=st.lists(columns, min_size=1, max_size=3), length=st.integers(1, 12),
       data=st.data(), as_array=st.booleans(), single=st.booleans())
def test_gather_equals_fancy_indexing(seg, cols, length, data, as_array, single):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    arrays = []
    for dtype, rest, layout in cols:
        if np.dtype(dtype).kind == "U":
            arrays.append(np.array(["a%d" % i for i in range(length)], dtype=dtype))
        else:
            shape = (length,) + rest
            a = random_array(rng, dtype, shape[::-1] if layout == "T" else shape, "c")
            a = a.T if layout == "T" else a
            arrays.append(a[::-1] if layout == "rev" else a)
    idx = data.draw(st.lists(st.integers(-length, length - 1), max_size=20))
    indices = np.array(idx, dtype=np.int32) if as_array else idx
    if single:
        got = unpack(seg, gather_into(arrays[0], indices, seg))
        want = arrays[0][np.array(idx, dtype=np.intp)]
    else:
        got = unpack(seg, gather_into(arrays, indices, seg))
        want = [a[np.array(idx, dtype=np.intp)] for a in arrays]
    assert_same(got, want)


def test_gather_bounds_are_checked_like_numpy(seg):
    a = np.arange(10)
    with pytest.raises(IndexError, match="index 10 is out of bounds for axis 0 with size 10"):
        gather_into(a, [1, 10], seg)
    with pytest.raises(IndexError, match="index -11 is out of bounds for axis 0 with size 10"):
        gather_into((a, a), [-11], seg)
    with pytest.raises(TypeError):
        gather_into(a, [1.5], seg)
    with pytest.raises(TypeError):
        gather_into(a, np.array([True, False]), seg)


def test_gather_columns_of_different_lengths(seg):
    a, b = np.arange(10), np.arange(5) * 10
    got = unpack(seg, gather_into((a, b), (i for i in [-1, 0, 2]), seg))   # read once
    assert_same(got, [a[[-1, 0, 2]], b[[-1, 0, 2]]])
    indices = np.array([-1, 0, 2])
    gather_into((a, b), indices, seg)
    assert indices.tolist() == [-1, 0, 2]                                     # left as given


def test_gather_of_consecutive_rows_is_fancy_indexing_too(seg):
    a = np.arange(1000, dtype=np.int64).reshape(100, 10)
    idx = list(range(20, 60)) + [3, 4, 5, 99]
    assert_same(unpack(seg, gather_into(a, idx, seg)), a[idx])


def _torch():
    return pytest.importorskip("torch", reason="tensor collation needs torch installed")


def test_tensors_collate_into_the_slot_as_default_collate_does():
    torch = _torch()
    from fastload import default_collate

    samples = [{"image": torch.arange(12, dtype=torch.float32).reshape(3, 4)[:, ::2] + i,
                "label": torch.tensor(i)} for i in range(5)]
    slot = bytearray(1 << 16)
    batch = unpack(slot, collate_into(samples, slot))
    expected = default_collate(samples)
    for key in ("image", "label"):
        assert type(batch[key]) is type(expected[key]) is torch.Tensor
        assert batch[key].dtype == expected[key].dtype and torch.equal(batch[key], expected[key])


@pytest.mark.parametrize("make", [
    lambda torch: [torch.zeros(2), torch.zeros(2, dtype=torch.float64)],  # torch promotes
    lambda torch: [torch.zeros(2, requires_grad=True)] * 2,  # numpy cannot view it
    lambda torch: [torch.zeros(2, dtype=torch.bfloat16)] * 2,  # numpy has no bfloat16
    lambda torch: [torch.zeros(2), np.zeros(2, dtype=np.float32)],  # mixed kinds
])
def test_tensors_the_slot_writer_leaves_to_default_collate_raise(make):
    # The worker then collates them with default_collate (NOTE [ Fast paths ]).
    torch = _torch()
    with pytest.raises((TypeError, RuntimeError, CollateError)):
        collate_into(make(torch), bytearray(1 << 12))


@pytest.mark.parametrize("samples,alike", [
    ([np.zeros(2)] * 3, True),
    ([np.zeros(2, "Q"), np.zeros(3, "L")], True),      # one dtype under two names
    ([np.zeros(2, np.int32), np.zeros(2, np.uint16)], False),
    ([np.zeros(2, ">f4"), np.zeros(2, "<f4")], False),
    ([np.zeros(2), 1.0], False),
    ([np.zeros(2), np.zeros(2).view(np.matrix)], False),  # another class
    ([1.0, 1.0], False),
    ([], True),
])
def test_arrays_alike_tells_mixed_leaves_apart(samples, alike):
    assert arrays_alike(samples) is alike
