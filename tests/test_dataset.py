import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastload import (
    ArrayDataset,
    ChainDataset,
    ConcatDataset,
    DataLoader,
    Dataset,
    GatheredBatch,
    InvalidArgumentError,
    IterableDataset,
    StackDataset,
    Subset,
    TensorDataset,
    default_collate,
    random_split,
)


class Squares(Dataset):
    """A map-style dataset without __getitems__."""

    def __init__(self, n, offset=0):
        self.n, self.offset = n, offset

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return (np.array([i + self.offset], dtype=np.float32), (i + self.offset) ** 2)

    def __len__(self):
        return self.n


class Stream(IterableDataset):
    def __init__(self, values):
        self.values = values

    def __iter__(self):
        return iter(self.values)

    def __len__(self):
        return len(self.values)


def collated(samples):
    return default_collate(list(samples))


def assert_batches_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)


# --- ArrayDataset --------------------------------------------------------------


def test_array_dataset_rows(xy):
    ds = ArrayDataset(*xy)
    assert len(ds) == 10 and TensorDataset is ArrayDataset
    x, y = ds[2]
    assert x.tolist() == [6.0, 7.0, 8.0] and y == 20
    assert ds.arrays[0] is xy[0] and ds.tensors is ds.arrays


def test_array_dataset_size_mismatch_names_the_sizes():
    with pytest.raises(InvalidArgumentError, match="array 0 has 4, array 1 has 3") as info:
        ArrayDataset(np.zeros(4), np.zeros(3))
    assert isinstance(info.value, ValueError) and isinstance(info.value, AssertionError)


@pytest.mark.parametrize("arrays", [(), (np.float32(1),)])
def test_array_dataset_needs_arrays_with_a_first_dimension(arrays):
    with pytest.raises(InvalidArgumentError):
        ArrayDataset(*arrays)


def test_array_dataset_getitems_gathers_columns(xy):
    ds = ArrayDataset(*xy)
    batch = ds.__getitems__([3, 0, -1])
    assert isinstance(batch, GatheredBatch) and len(batch) == 3
    assert batch.columns[1].tolist() == [30, 0, 90]
    assert_batches_equal(default_collate(batch), collated(ds[i] for i in [3, 0, -1]))
    with pytest.raises(IndexError):
        ds.__getitems__([10])


@pytest.mark.parametrize("indices", [[3, 0, -1], [np.int64(3), 2], (1, 2), [],
                                     [2**70], [-11], np.array([4, 4])])
def test_array_dataset_getitems_reads_any_index_as_numpy_does(indices):
    # Plain int lists are read in C; every index means what numpy makes of it.
    ds, rows = ArrayDataset(np.arange(10) * 10), np.arange(10) * 10
    try:
        expected = rows.take(np.asarray(indices, dtype=np.intp), axis=0)
    except (IndexError, OverflowError) as error:
        with pytest.raises(type(error)):
            ds.__getitems__(indices)
    else:
        got = ds.__getitems__(indices).columns[0]
        assert got.dtype == expected.dtype and got.tolist() == expected.tolist()


@pytest.mark.parametrize("indices", [[1.7, 2.9], np.array([0.5]), [True, False], [1, 2.0]])
@pytest.mark.parametrize("make", [lambda: ArrayDataset(np.arange(10) * 10),
                                  lambda: ConcatDataset([ArrayDataset(np.arange(5)),
                                                         ArrayDataset(np.arange(5))])])
def test_indices_that_are_no_integers_are_refused_not_cast(make, indices):
    # A cast would truncate 1.7 to row 1 and read True as row 1: other rows,
    # silently. numpy's indexing and torch's TensorDataset refuse them.
    with pytest.raises(IndexError, match="indices must be integers"):
        make().__getitems__(indices)


@pytest.mark.parametrize("kwargs", [{}, {"num_workers": 2},
                                    {"num_workers": 2, "worker_method": "thread"}])
def test_a_loader_of_float_indices_fails_those_batches(kwargs):
    loader = DataLoader(ArrayDataset(np.arange(10)), batch_sampler=[[1.7, 2.9], [3, 4]],
                        **kwargs)
    it = iter(loader)
    with pytest.raises(IndexError, match="indices must be integers"):
        next(it)
    assert next(it)[0].tolist() == [3, 4]


def test_array_dataset_shares_torch_tensors():
    torch = pytest.importorskip("torch", reason="torch tensors as input need torch")
    x = torch.arange(6, dtype=torch.float32).reshape(3, 2).requires_grad_()
    ds = ArrayDataset(x, torch.arange(3))
    assert isinstance(ds.arrays[0], np.ndarray)
    with torch.no_grad():
        x[0, 0] = 100.0
    assert ds[0][0][0] == 100.0  # zero-copy


# --- ConcatDataset -------------------------------------------------------------


def test_concat_dataset_indexing_and_sizes():
    ds = ConcatDataset([Squares(3), Squares(2, offset=10)])
    assert len(ds) == 5 and ds.cumulative_sizes == [3, 5]
    assert [ds[i][1] for i in range(5)] == [0, 1, 4, 100, 121]
    assert ds[-1][1] == 121 and ds[-5][1] == 0


def test_concat_dataset_index_errors():
    ds = ConcatDataset([Squares(3), Squares(2)])
    with pytest.raises(ValueError):
        ds[-6]
    with pytest.raises(IndexError):
        ds[5]
    with pytest.raises(ValueError):
        ds.__getitems__([0, -6])
    with pytest.raises(IndexError):
        ds.__getitems__([5])


def test_concat_dataset_rejects_iterable_and_empty():
    with pytest.raises(AssertionError, match="does not support IterableDataset"):
        ConcatDataset([Squares(2), Stream([1])])
    with pytest.raises(AssertionError, match="empty"):
        ConcatDataset([])


def test_dataset_add_makes_concat_and_iterable_add_makes_chain():
    joined = Squares(2) + Squares(3)
    assert isinstance(joined, ConcatDataset) and len(joined) == 5
    chained = Stream([1, 2]) + Stream([3])
    assert isinstance(chained, ChainDataset) and list(chained) == [1, 2, 3]


def test_concat_of_array_datasets_gathers_in_request_order(xy):
    a = ArrayDataset(*xy)
    b = ArrayDataset(xy[0][:4] + 100, xy[1][:4] + 1000)
    ds = ConcatDataset([a, b])
    order = [12, 0, 13, -1, 9, 10]
    batch = ds.__getitems__(order)
    assert isinstance(batch, GatheredBatch)
    assert_batches_equal(default_collate(batch), collated(ds[i] for i in order))
    single = ds.__getitems__([11, 10])
    assert isinstance(single, GatheredBatch) and single.columns[1].tolist() == [1010, 1000]


def test_concat_of_mixed_datasets_returns_samples_in_order():
    arrays = ArrayDataset(np.arange(10, dtype=np.float32)[:, None], np.arange(10) * 10)
    ds = ConcatDataset([arrays, Squares(3)])
    order = [11, 1, 10]
    items = ds.__getitems__(order)
    assert [s[1] for s in items] == [1, 10, 0]
    assert_batches_equal(default_collate(items), collated(ds[i] for i in order))


@given(sizes=st.lists(st.integers(0, 6), min_size=1, max_size=4), data=st.data())
def test_property_concat_getitems_matches_getitem(sizes, data):
    parts = [ArrayDataset(np.arange(n) + 100 * k, np.full(n, k)) for k, n in enumerate(sizes)]
    ds = ConcatDataset(parts)
    if len(ds) == 0:
        return
    order = data.draw(st.lists(st.integers(-len(ds), len(ds) - 1), min_size=1, max_size=12))
    assert_batches_equal(default_collate(ds.__getitems__(order)),
                         collated(ds[i] for i in order))


# --- ChainDataset, Subset, StackDataset ----------------------------------------


def test_chain_dataset_length_and_type_check():
    chain = ChainDataset([Stream([1, 2]), Stream([3, 4, 5])])
    assert list(chain) == [1, 2, 3, 4, 5] and len(chain) == 5
    bad = ChainDataset([Stream([1]), Squares(2)])
    with pytest.raises(AssertionError, match="only supports IterableDataset"):
        list(bad)
    with pytest.raises(AssertionError):
        len(bad)


def test_subset_maps_indices(xy):
    ds = Subset(ArrayDataset(*xy), [7, 2, 5])
    assert len(ds) == 3 and ds[0][1] == 70
    batch = ds.__getitems__([2, 0])
    assert isinstance(batch, GatheredBatch) and batch.columns[1].tolist() == [50, 70]


def test_subset_with_array_indices_and_plain_dataset():
    ds = Subset(Squares(10), np.array([9, 4]))
    assert [s[1] for s in ds.__getitems__([1, 0])] == [16, 81]


def test_subset_of_keyed_dataset_passes_keys_through():
    ds = Subset({"a": 1, "b": 2}, ["b", "a"])
    assert ds.__getitems__([0, 1]) == [2, 1]


def test_subset_list_index():
    assert Subset(list(range(10)), [5, 6, 7])[0] == 5


def test_subset_subclass_overriding_getitem_only_is_refused():
    class Doubled(Subset):
        def __getitem__(self, idx):
            return 2 * super().__getitem__(idx)

    with pytest.raises(NotImplementedError, match="__getitems__"):
        Doubled(list(range(3)), [0])


def test_stack_dataset_tuple_and_dict(xy):
    arrays = ArrayDataset(*xy)
    stacked = StackDataset(arrays, Squares(10))
    assert len(stacked) == 10 and stacked[1][1][1] == 1
    assert [s[1][1] for s in stacked.__getitems__([2, 3])] == [4, 9]
    keyed = StackDataset(a=arrays, s=Squares(10))
    sample = keyed.__getitems__([4])[0]
    assert list(sample) == ["a", "s"] and sample["a"][1] == 40 and sample["s"][1] == 16


@pytest.mark.parametrize(
    "args, kwargs",
    [((), {}), ((Squares(2), Squares(3)), {}), ((Squares(2),), {"b": Squares(2)}),
     ((), {"a": Squares(1), "b": Squares(2)})],
)
def test_stack_dataset_argument_errors(args, kwargs):
    with pytest.raises(ValueError):
        StackDataset(*args, **kwargs)


def test_stack_dataset_checks_nested_getitems_length():
    class Short(Dataset):
        def __getitem__(self, i):
            return i

        def __getitems__(self, indices):
            return indices[:-1]

        def __len__(self):
            return 3

    with pytest.raises(ValueError, match="Expected 2, got 1"):
        StackDataset(Short(), Squares(3)).__getitems__([0, 1])


# --- random_split --------------------------------------------------------------


def test_random_split_lengths_are_disjoint_and_cover():
    parts = random_split(range(10), [3, 7], generator=0)
    assert [len(p) for p in parts] == [3, 7]
    assert sorted(parts[0].indices + parts[1].indices) == list(range(10))


def test_random_split_fractions_distribute_remainder_round_robin():
    assert [len(p) for p in random_split(range(11), [0.3, 0.3, 0.4], generator=0)] == [4, 3, 4]
    assert [len(p) for p in random_split(range(10), [0.25, 0.25, 0.5], generator=0)] == [3, 2, 5]


def test_random_split_warns_on_empty_split():
    with pytest.warns(UserWarning, match="index 0 is 0"):
        random_split(range(3), [0.0, 1.0], generator=0)


@pytest.mark.parametrize("lengths", [[3, 3], [0.5, 0.6], [-0.5, 1.5]])
def test_random_split_errors(lengths):
    with pytest.raises(ValueError):
        random_split(range(10), lengths, generator=0)


def test_random_split_is_reproducible_by_seed_and_numpy_global():
    assert random_split(range(20), [5, 15], generator=3)[0].indices == \
        random_split(range(20), [5, 15], generator=np.random.default_rng(3))[0].indices
    np.random.seed(9)
    first = random_split(range(20), [5, 15])[0].indices
    np.random.seed(9)
    assert random_split(range(20), [5, 15])[0].indices == first
