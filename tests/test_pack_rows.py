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
