import collections
import types

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fastload import CollateError, GatheredBatch, default_collate, default_convert

Point = collections.namedtuple("Point", ["x", "y"])


def assert_same(a, b):
    """Equal structure, types, dtypes and values."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


def test_arrays_are_stacked():
    batch = [np.full((2, 3), i, dtype=np.float32) for i in range(4)]
    out = default_collate(batch)
    assert out.shape == (4, 2, 3) and out.dtype == np.float32
    np.testing.assert_array_equal(out, np.stack(batch))


def test_array_dtypes_are_promoted_like_np_stack():
    out = default_collate([np.zeros(2, np.int32), np.zeros(2, np.float32)])
    assert out.dtype == np.stack([np.zeros(2, np.int32), np.zeros(2, np.float32)]).dtype


def test_zero_dim_arrays_stack_to_a_vector():
    out = default_collate([np.array(1.5), np.array(2.5)])
    assert out.shape == (2,) and out.dtype == np.float64


def test_shape_mismatch_names_positions_and_shapes():
    batch = [np.zeros((2, 3))] * 3 + [np.zeros((2, 4))]
    with pytest.raises(CollateError) as info:
        default_collate(batch)
    assert str(info.value) == (
        "default_collate: sample 3 has shape (2, 4) but sample 0 has shape (2, 3)"
    )
    assert isinstance(info.value, RuntimeError)


def test_rank_mismatch_is_a_collate_error():
    with pytest.raises(CollateError, match=r"sample 1 has shape \(3, 1\)"):
        default_collate([np.zeros(3), np.zeros((3, 1))])


@pytest.mark.parametrize("value", [np.array(["a"]), np.array([b"a"]), np.array([object()])])
def test_string_and_object_arrays_raise_type_error(value):
    with pytest.raises(TypeError, match="default_collate: batch must contain"):
        default_collate([value, value])


@pytest.mark.parametrize(
    "batch, dtype",
    [
        ([1.5, 2.0], np.float64),
        ([1, 2], np.int64),
        ([True, False], np.bool_),
        ([np.float32(1), np.float32(2)], np.float32),
        ([np.int16(1), np.int16(2)], np.int16),
        ([np.bool_(True), np.bool_(False)], np.bool_),
    ],
)
def test_numbers_become_arrays_of_their_dtype(batch, dtype):
    out = default_collate(batch)
    assert isinstance(out, np.ndarray) and out.dtype == dtype
    assert out.tolist() == [v.item() if isinstance(v, np.generic) else v for v in batch]


@pytest.mark.parametrize("batch", [["a", "b"], [b"a", b"b"]])
def test_strings_and_bytes_are_kept(batch):
    assert default_collate(batch) is batch


@pytest.mark.parametrize("batch, position, kind", [
    ([1, None, 3], 1, "NoneType"),      # numpy: an object array
    ([2.5, None], 1, "NoneType"),       # numpy: NaN in its place
    ([1, "x"], 1, "str"),               # numpy: the string array ['1', 'x']
    ([1.5, "2.5"], 1, "str"),           # numpy, forced to float: 2.5
    ([np.int64(1), b"x"], 1, "bytes"),
    ([1, {"a": 1}], 1, "dict"),
    ([1, [2]], 1, "list"),
])
def test_numbers_beside_something_else_raise_naming_it(batch, position, kind):
    """A number beside a non-number is refused, as torch refuses it, never
    turned into an object, string or NaN-holding array."""
    with pytest.raises(CollateError, match=f"sample {position} is a {kind} but sample 0") as info:
        default_collate(batch)
    assert info.value.positions == (position, 0)


def test_numpy_scalars_of_any_kind_still_stack():
    deltas = default_collate([np.timedelta64(5, "ms"), np.timedelta64(6, "ms")])
    assert deltas.dtype == np.dtype("m8[ms]") and deltas.astype(np.int64).tolist() == [5, 6]
    assert default_collate([np.float32(1), np.int8(2)]).dtype == np.float32


def test_ints_on_both_sides_of_2_63_keep_every_value():
    """numpy makes float64 of them, rounding 2**63 + 1 (a 64-bit hash as a
    sample id, say); they are exact uint64, or OverflowError with a negative."""
    ids = default_collate([1, 2**63 + 1])
    assert ids.dtype == np.uint64 and ids.tolist() == [1, 2**63 + 1]
    with pytest.raises(OverflowError, match="negative ints and ints past int64"):
        default_collate([-1, 2**63])


def test_an_int_past_64_bits_is_an_overflow_error():
    with pytest.raises(OverflowError, match="sample 1 is an int that fits in no 64-bit"):
        default_collate([1, 2**70])
    assert default_collate([2**63, 2**64 - 1]).dtype == np.uint64  # they fit one


class MissingLabel:
    """Labels are ints, but sample 5's is missing."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {"x": np.full(3, i, np.float32), "label": None if i == 5 else i}


@pytest.mark.parametrize("kwargs", [{}, {"num_workers": 2},
                                    {"num_workers": 2, "worker_method": "thread"}])
def test_a_missing_number_fails_its_batch_naming_the_dataset_index(kwargs):
    import fastload as fl

    outcome = []
    it = iter(fl.DataLoader(MissingLabel(), batch_size=4, **kwargs))
    for _ in range(2):
        try:
            outcome.append(next(it)["label"].tolist())
        except CollateError as error:
            outcome.append(str(error).splitlines()[-1] if kwargs else str(error))
    assert outcome[0] == [0, 1, 2, 3]
    assert "sample 1 is a NoneType but sample 0 is a int (dataset indices 5 and 4)" in outcome[1]


def test_dict_samples_collate_per_key():
    out = default_collate([{"a": 0, "b": np.ones(2)}, {"a": 1, "b": np.zeros(2)}])
    assert list(out) == ["a", "b"]
    assert out["a"].tolist() == [0, 1] and out["b"].shape == (2, 2)


def test_mapping_types_are_kept():
    ordered = default_collate([collections.OrderedDict(a=1), collections.OrderedDict(a=2)])
    assert type(ordered) is collections.OrderedDict
    counts = default_collate([collections.defaultdict(list, a=1)] * 2)
    assert type(counts) is collections.defaultdict and counts.default_factory is list
    proxy = default_collate([types.MappingProxyType({"a": 1})] * 2)
    assert type(proxy) is types.MappingProxyType and proxy["a"].tolist() == [1, 1]

    class Fields(collections.abc.Mapping):
        def __init__(self, **fields):
            self._values = fields

        def __getitem__(self, key):
            return self._values[key]

        def __iter__(self):
            return iter(self._values)

        def __len__(self):
            return len(self._values)

    fallback = default_collate([Fields(a=1), Fields(a=2)])
    assert type(fallback) is dict and fallback["a"].tolist() == [1, 2]


def test_namedtuple_is_kept_and_tuple_becomes_list():
    out = default_collate([Point(1, 2.0), Point(3, 4.0)])
    assert type(out) is Point and out.x.tolist() == [1, 3] and out.y.dtype == np.float64
    assert_same(default_collate([(0, 1), (2, 3)]), [np.array([0, 2]), np.array([1, 3])])
    assert_same(default_collate([[0, 1], [2, 3]]), [np.array([0, 2]), np.array([1, 3])])


def test_nested_strings_are_kept_as_collected():
    out = default_collate([("a", 1), ("b", 2)])
    assert list(out[0]) == ["a", "b"] and out[1].tolist() == [1, 2]


def test_other_sequences_keep_their_type_or_fall_back_to_list():
    class Row(list):
        pass

    out = default_collate([Row([1, 2]), Row([3, 4])])
    assert type(out) is Row
    assert type(default_collate([range(2), range(2)])) is list


def test_unequal_sequence_lengths_raise_runtime_error():
    with pytest.raises(RuntimeError, match="equal size"):
        default_collate([[1, 2], [3]])


@pytest.mark.parametrize("batch", [[None, None], [object(), object()], [{1, 2}, {3, 4}]])
def test_unsupported_types_raise_type_error(batch):
    with pytest.raises(TypeError, match="default_collate: batch must contain"):
        default_collate(batch)


def test_gathered_batch_collates_to_its_columns_without_copy():
    columns = (np.arange(6.0).reshape(3, 2), np.arange(3))
    batch = GatheredBatch(columns)
    out = default_collate(batch)
    assert out[0] is columns[0] and out[1] is columns[1]


def test_gathered_batch_behaves_as_a_list_of_samples():
    batch = GatheredBatch((np.arange(6.0).reshape(3, 2), np.arange(3)))
    assert len(batch) == 3
    x, y = batch[1]
    assert x.tolist() == [2.0, 3.0] and y == 1
    assert [s[1] for s in batch] == [0, 1, 2]
    assert len(batch[1:]) == 2 and batch[-1][1] == 2


def test_gathered_string_column_collates_like_samples():
    batch = GatheredBatch((np.array(["a", "b"]), np.array([1, 2])))
    out = default_collate(batch)
    assert list(out[0]) == ["a", "b"] and out[1].tolist() == [1, 2]
    with pytest.raises(TypeError):
        default_collate(GatheredBatch((np.array([["a"], ["b"]]),)))


def test_default_convert():
    assert default_convert(3) == 3 and default_convert("s") == "s"
    array = np.ones(2)
    assert default_convert(array) is array
    scalar = default_convert(np.float32(2))
    assert isinstance(scalar, np.ndarray) and scalar.shape == () and scalar.dtype == np.float32
    assert isinstance(default_convert(np.str_("a")), np.str_)
    out = default_convert((np.int64(1), Point(np.float64(1), "a"), {"k": [np.int8(3)]}))
    assert type(out) is list and type(out[1]) is Point and out[1].y == "a"
    assert out[0].shape == () and out[2]["k"][0].dtype == np.int8
    assert default_convert(GatheredBatch((np.arange(2),)))[1][0].tolist() == 1


# --- properties: values, dtypes and structure against np.stack -----------------

numeric_dtypes = st.sampled_from(
    [np.bool_, np.int8, np.uint16, np.int32, np.int64, np.float16, np.float32, np.float64,
     np.complex64]
)


@given(
    dtype=numeric_dtypes,
    shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
    count=st.integers(1, 6),
    data=st.data(),
)
def test_property_arrays_collate_like_np_stack(dtype, shape, count, data):
    batch = [data.draw(hnp.arrays(dtype, shape)) for _ in range(count)]
    expected = np.stack(batch)
    out = default_collate(batch)
    assert out.dtype == expected.dtype and out.shape == expected.shape
    np.testing.assert_array_equal(out, expected)


@given(
    first=numeric_dtypes,
    second=numeric_dtypes,
    data=st.data(),
)
def test_property_mixed_dtypes_promote_like_np_stack(first, second, data):
    batch = [data.draw(hnp.arrays(first, (2,))), data.draw(hnp.arrays(second, (2,)))]
    assert default_collate(batch).dtype == np.stack(batch).dtype


leaf = st.one_of(
    st.integers(-5, 5),
    st.floats(-1, 1),
    st.booleans(),
    st.text(max_size=3),
    hnp.arrays(np.float32, (2,)),
)
structure = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(st.sampled_from("abc"), inner, min_size=1, max_size=3),
    ),
    max_leaves=6,
)


def reference_collate(batch):
    """torch's rules spelled out slowly, leaf by leaf."""
    elem = batch[0]
    if isinstance(elem, np.ndarray):
        return np.stack(batch)
    if isinstance(elem, bool):
        return np.array(batch, dtype=np.bool_)
    if isinstance(elem, int):
        return np.array(batch, dtype=np.int64)
    if isinstance(elem, float):
        return np.array(batch, dtype=np.float64)
    if isinstance(elem, str):
        return batch
    if isinstance(elem, dict):
        return {key: reference_collate([d[key] for d in batch]) for key in elem}
    return [reference_collate(list(field)) for field in zip(*batch)]


def same_shape_variant(sample, draw):
    """Another sample with the structure and leaf types of ``sample``."""
    if isinstance(sample, np.ndarray):
        return draw(hnp.arrays(np.float32, sample.shape))
    if isinstance(sample, bool):
        return draw(st.booleans())
    if isinstance(sample, int):
        return draw(st.integers(-5, 5))
    if isinstance(sample, float):
        return draw(st.floats(-1, 1))
    if isinstance(sample, str):
        return draw(st.text(max_size=3))
    if isinstance(sample, dict):
        return {k: same_shape_variant(v, draw) for k, v in sample.items()}
    return type(sample)(same_shape_variant(v, draw) for v in sample)


@given(first=structure, count=st.integers(1, 4), data=st.data())
def test_property_nested_structures_collate_like_reference(first, count, data):
    batch = [first] + [same_shape_variant(first, data.draw) for _ in range(count - 1)]
    out, expected = default_collate(batch), reference_collate(batch)

    def check(a, b):
        if isinstance(b, np.ndarray):
            assert isinstance(a, np.ndarray) and a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
        elif isinstance(b, dict):
            assert type(a) is dict and list(a) == list(b)
            for key in b:
                check(a[key], b[key])
        elif isinstance(b, list) and not (b and isinstance(b[0], str)):
            assert type(a) is list and len(a) == len(b)
            for x, y in zip(a, b):
                check(x, y)
        else:
            assert list(a) == list(b)

    check(out, expected)


@given(
    rows=st.integers(1, 8),
    width=st.integers(0, 3),
    dtype=numeric_dtypes,
    data=st.data(),
)
def test_property_gathered_batch_equals_generic_collate(rows, width, dtype, data):
    columns = (data.draw(hnp.arrays(dtype, (rows, width))), np.arange(rows) * 3)
    gathered = GatheredBatch(columns)
    fast, slow = default_collate(gathered), default_collate(list(gathered))
    assert len(fast) == len(slow) == 2
    for a, b in zip(fast, slow):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


def test_types_made_on_the_fly_do_not_grow_the_dispatch_cache():
    from fastload import collate

    for i in range(700):
        Row = collections.namedtuple(f"Row{i}", "v")
        assert default_collate([Row(i), Row(i + 1)]).v.tolist() == [i, i + 1]
    assert len(collate._handlers) <= collate._BUILTIN_TYPES + collate._MAX_CACHED_TYPES


def test_struct_dtypes_equal_under_eq_keep_their_own_promotion():
    """An aligned struct and one with the same explicit offsets compare
    equal but promote apart; which was collated first changes nothing."""
    aligned = np.dtype([("a", "u1"), ("b", "<i4")], align=True)
    offsets = np.dtype({"names": ["a", "b"], "formats": ["u1", "<i4"], "offsets": [0, 4],
                        "itemsize": 8})
    assert aligned == offsets
    # (a dict keyed by them would hold one of the two)
    for order in ((aligned, offsets), (offsets, aligned)):
        for dtype in order:
            batch = default_collate([np.zeros(2, dtype)])
            assert batch.dtype.itemsize == np.result_type(dtype).itemsize
