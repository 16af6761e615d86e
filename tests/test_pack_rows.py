"""pack.int_rows: the batch index a gather reads without numpy's inference,
and None wherever numpy's reading (the general path) must decide."""
import numpy as np
import pytest

from fastload_c import pack


@pytest.mark.parametrize("index", [[0], [3, -1, 7], list(range(64)), [2**62, -(2**62)]])
def test_a_list_of_ints_reads_as_numpy_reads_it(index):
    rows = pack.int_rows(index)
    expected = np.asarray(index)
    assert rows.dtype == np.intp and rows.shape == expected.shape
    np.testing.assert_array_equal(rows, expected)


@pytest.mark.parametrize("index", [
    [],                      # numpy: float64
    [True, False],           # numpy: bool
    [1, True],               # a bool among ints
    [1, 2.0],                # numpy: float64
    [np.int64(1), 2],        # not plain ints
    [2**70],                 # numpy: object
    (1, 2),                  # not a list
    np.arange(3),
    None,
])
def test_anything_else_is_left_to_numpy(index):
    assert pack.int_rows(index) is None


def test_gather_into_reads_a_list_index_as_before():
    column = np.arange(40, dtype=np.int32).reshape(10, 4)
    out = bytearray(4096)
    for index in ([9, 0, -1], [np.int64(2), 3], [True, 1]):
        layout = pack.gather_into(column, index, out)
        np.testing.assert_array_equal(pack.unpack(out, layout), column[np.asarray(index, np.intp)])
    with pytest.raises(IndexError):
        pack.gather_into(column, [2**70], out)


def _columns():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((50, 3), dtype=np.float32),
            np.arange(50, dtype=np.int64),
            rng.integers(0, 255, (50, 2, 4), dtype=np.uint8)[:, :, ::2])  # rows not contiguous


@pytest.mark.parametrize("index", [
    [3, -1, 0], list(range(50)) * 7,                 # past the 256 indices kept on the stack
    np.arange(40, dtype=np.intp)[::-3],              # a strided index array
    np.array([4, 2, 49], dtype=np.dtype(np.intp).newbyteorder()),  # not native order
    np.array([4, 2], dtype=np.uint8), (1, 2), range(5),
])
def test_row_gather_gives_what_gather_into_and_numpy_give(index):
    columns = _columns()
    gather = pack.RowGather(columns)
    out, again = bytearray(1 << 16), bytearray(1 << 16)
    for _ in range(2):  # the second call uses the layout the first made
        got = pack.unpack(out, gather.into(index, out))
        reference = pack.unpack(again, pack.gather_into(columns, index, again))
        rows = np.asarray(list(index) if isinstance(index, range) else index, dtype=np.intp)
        for leaf, other, column in zip(got, reference, columns):
            np.testing.assert_array_equal(leaf, column[rows])
            np.testing.assert_array_equal(other, column[rows])
            assert leaf.dtype == column.dtype


def test_row_gather_follows_batch_lengths_and_columns_changed_in_place():
    column = np.arange(24, dtype=np.int32).reshape(6, 4)
    gather = pack.RowGather(column)
    out = bytearray(4096)
    for index in ([0, 5], [1, 2, 3], [0, 5]):
        np.testing.assert_array_equal(pack.unpack(out, gather.into(index, out)), column[index])
    column.shape = (12, 2)      # the same memory, other rows
    np.testing.assert_array_equal(pack.unpack(out, gather.into([11, 0], out)), column[[11, 0]])
    column.dtype = np.uint16    # and other items
    got = pack.unpack(out, gather.into([1, 10], out))
    assert got.dtype == np.uint16
    np.testing.assert_array_equal(got, column[[1, 10]])


def test_row_gather_raises_as_gather_into_does():
    out = bytearray(4096)
    with pytest.raises(IndexError, match="index 6 is out of bounds for axis 0 with size 6"):
        pack.RowGather(np.zeros((6, 2))).into([0, 6], out)
    with pytest.raises(TypeError, match="columns must be numpy arrays"):
        pack.RowGather([np.zeros(3), [1, 2, 3]]).into([0], out)
    with pytest.raises(TypeError, match="holds Python objects"):
        pack.RowGather(np.array([1, "a"], dtype=object)).into([0], out)
    with pytest.raises(pack.SlotTooSmallError):
        pack.RowGather(np.zeros((6, 100))).into([0, 1], out, 0, 64)
    gather = pack.RowGather(np.arange(6))   # usable after an error
    with pytest.raises(IndexError):
        gather.into([9], out)
    np.testing.assert_array_equal(pack.unpack(out, gather.into([5], out)), [5])
