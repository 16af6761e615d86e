"""The same datasets and options through torch.utils.data and fastload.

Batches are compared after turning tensors into numpy arrays: same structure,
same container types, same dtypes, same values. With a torch.Generator the
index order must be identical (see NOTE [ Determinism contract ])."""
import collections

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="differential tests compare against torch")
from torch.utils import data as td  # noqa: E402

import fastload as fl  # noqa: E402

Pair = collections.namedtuple("Pair", "features label")


def to_numpy(value):
    if isinstance(value, torch.Tensor):
        return value.numpy()
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(to_numpy(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(to_numpy(v) for v in value)
    if isinstance(value, dict):
        return {k: to_numpy(v) for k, v in value.items()}
    return value


def assert_same(ours, theirs):
    assert type(ours) is type(theirs), (type(ours), type(theirs))
    if isinstance(theirs, np.ndarray):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        np.testing.assert_array_equal(ours, theirs)
    elif isinstance(theirs, dict):
        assert list(ours) == list(theirs)
        for key in theirs:
            assert_same(ours[key], theirs[key])
    elif isinstance(theirs, (list, tuple)):
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            assert_same(a, b)
    else:
        assert ours == theirs


def assert_loaders_agree(ours, theirs, epochs=1):
    assert len(ours) == len(theirs)
    for _ in range(epochs):
        ours_batches = list(ours)
        theirs_batches = [to_numpy(b) for b in theirs]
        assert len(ours_batches) == len(theirs_batches)
        for a, b in zip(ours_batches, theirs_batches):
            assert_same(a, b)


FEATURES = np.random.default_rng(0).standard_normal((23, 4)).astype(np.float32)
LABELS = np.arange(23, dtype=np.int64) * 3


def array_datasets():
    return (
        fl.ArrayDataset(FEATURES, LABELS),
        td.TensorDataset(torch.from_numpy(FEATURES), torch.from_numpy(LABELS)),
    )


def both(**kwargs):
    ours, theirs = array_datasets()
    return fl.DataLoader(ours, **kwargs), td.DataLoader(theirs, **kwargs)


def seeded_pair(seed=7):
    return torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("batch_size", [1, 4, 5, 23, 30])
@pytest.mark.parametrize("drop_last", [False, True])
def test_sequential(batch_size, drop_last):
    assert_loaders_agree(*both(batch_size=batch_size, drop_last=drop_last))


def test_batch_size_none():
    assert_loaders_agree(*both(batch_size=None))


@pytest.mark.parametrize("batch_size", [1, 6])
def test_shuffle_with_torch_generator_is_identical_over_epochs(batch_size):
    g_ours, g_theirs = seeded_pair()
    ours, theirs = array_datasets()
    assert_loaders_agree(
        fl.DataLoader(ours, batch_size=batch_size, shuffle=True, generator=g_ours),
        td.DataLoader(theirs, batch_size=batch_size, shuffle=True, generator=g_theirs),
        epochs=3,
    )
    assert torch.equal(g_ours.get_state(), g_theirs.get_state())


@pytest.mark.parametrize(
    "replacement, num_samples", [(True, None), (True, 70), (True, 64), (False, 50), (False, 46)]
)
def test_random_sampler_with_torch_generator(replacement, num_samples):
    g_ours, g_theirs = seeded_pair(3)
    ours, theirs = array_datasets()
    assert_loaders_agree(
        fl.DataLoader(ours, batch_size=8, sampler=fl.RandomSampler(
            ours, replacement, num_samples, generator=g_ours)),
        td.DataLoader(theirs, batch_size=8, sampler=td.RandomSampler(
            theirs, replacement, num_samples, generator=g_theirs)),
        epochs=2,
    )
    assert torch.equal(g_ours.get_state(), g_theirs.get_state())


@pytest.mark.parametrize("replacement, count", [(True, 40), (False, 10), (False, 23)])
def test_weighted_random_sampler(replacement, count):
    weights = np.random.default_rng(1).random(23).tolist()
    g_ours, g_theirs = seeded_pair(11)
    ours = fl.WeightedRandomSampler(weights, count, replacement, generator=g_ours)
    theirs = td.WeightedRandomSampler(weights, count, replacement, generator=g_theirs)
    assert [list(ours) for _ in range(2)] == [list(theirs) for _ in range(2)]


def test_subset_random_sampler():
    g_ours, g_theirs = seeded_pair(2)
    indices = [3, 1, 4, 15, 9, 2, 6]
    ours, theirs = array_datasets()
    assert_loaders_agree(
        fl.DataLoader(ours, batch_size=3,
                      sampler=fl.SubsetRandomSampler(indices, generator=g_ours)),
        td.DataLoader(theirs, batch_size=3,
                      sampler=td.SubsetRandomSampler(indices, generator=g_theirs)),
        epochs=2,
    )


@pytest.mark.parametrize("lengths", [[5, 18], [0.3, 0.3, 0.4], [0.5, 0.5]])
def test_random_split_with_torch_generator(lengths):
    g_ours, g_theirs = seeded_pair(5)
    ours_ds, theirs_ds = array_datasets()
    ours = fl.random_split(ours_ds, lengths, generator=g_ours)
    theirs = td.random_split(theirs_ds, lengths, generator=g_theirs)
    assert [s.indices for s in ours] == [s.indices for s in theirs]
    for a, b in zip(ours, theirs):
        assert_loaders_agree(fl.DataLoader(a, batch_size=4), td.DataLoader(b, batch_size=4))


@pytest.mark.parametrize("size, replicas", [(23, 4), (5, 3), (2, 5), (24, 4)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_distributed_sampler_without_shuffle_is_identical(size, replicas, drop_last):
    for rank in range(replicas):
        ours = fl.DistributedSampler(range(size), replicas, rank, False, drop_last=drop_last)
        theirs = td.DistributedSampler(range(size), replicas, rank, False, drop_last=drop_last)
        assert list(ours) == list(theirs) and len(ours) == len(theirs)
        assert (ours.num_samples, ours.total_size) == (theirs.num_samples, theirs.total_size)


@pytest.mark.parametrize("drop_last", [False, True])
def test_distributed_sampler_with_shuffle_has_torchs_shape(drop_last):
    # The permutation is numpy's (the same with or without torch), so only the
    # partition is compared: lengths, padding, and coverage of every rank.
    for rank in range(4):
        ours = fl.DistributedSampler(range(23), 4, rank, True, seed=1, drop_last=drop_last)
        theirs = td.DistributedSampler(range(23), 4, rank, True, seed=1, drop_last=drop_last)
        assert len(list(ours)) == len(list(theirs)) == len(ours) == len(theirs)
    union = [i for r in range(4) for i in fl.DistributedSampler(range(23), 4, r, seed=1)]
    assert set(union) == set(range(23)) and len(union) == 24


class Structured(td.Dataset):
    """Nested samples of every kind default_collate handles."""

    def __getitem__(self, i):
        return {
            "pair": Pair(np.full(3, i, dtype=np.float32), i),
            "tuple": (float(i) / 2, bool(i % 2), "s%d" % i),
            "list": [np.int16(i), np.array(i * 1.5)],
            "bytes": b"b",
        }

    def __len__(self):
        return 9


@pytest.mark.parametrize("batch_size", [None, 1, 4])
def test_structured_samples(batch_size):
    ds = Structured()
    assert_loaders_agree(fl.DataLoader(ds, batch_size=batch_size),
                         td.DataLoader(ds, batch_size=batch_size))


class TorchStream(td.IterableDataset):
    def __init__(self, n, reported):
        self.n, self.reported = n, reported

    def __iter__(self):
        return iter({"v": i, "a": np.arange(2) + i} for i in range(self.n))

    def __len__(self):
        return self.reported


@pytest.mark.parametrize("batch_size", [None, 1, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_iterable_dataset(batch_size, drop_last):
    if batch_size is None and drop_last:
        return
    ds = TorchStream(8, 8)
    assert_loaders_agree(fl.DataLoader(ds, batch_size=batch_size, drop_last=drop_last),
                         td.DataLoader(ds, batch_size=batch_size, drop_last=drop_last))


def test_iterable_dataset_len_warning_is_shared():
    ds = TorchStream(5, 2)
    for loader_class in (fl.DataLoader, td.DataLoader):
        loader = loader_class(ds, batch_size=1)
        assert len(loader) == 2
        with pytest.warns(UserWarning, match="was reported to be 2"):
            list(loader)


@pytest.mark.parametrize(
    "kwargs",
    [{"batch_size": 4}, {"batch_size": 4, "drop_last": True}, {"batch_size": None},
     {"batch_sampler": [[0, 1], [2]]}, {"sampler": [5, 4, 3], "batch_size": 2}],
)
def test_len(kwargs):
    ours, theirs = both(**kwargs)
    assert len(ours) == len(theirs)


def test_concat_and_subset_of_array_datasets():
    ours_ds, theirs_ds = array_datasets()
    ours = fl.ConcatDataset([fl.Subset(ours_ds, [5, 1, 7]), ours_ds])
    theirs = td.ConcatDataset([td.Subset(theirs_ds, [5, 1, 7]), theirs_ds])
    order = [25, 0, 3, -1, 2, 10]
    assert_loaders_agree(fl.DataLoader(ours, batch_size=4, sampler=order),
                         td.DataLoader(theirs, batch_size=4, sampler=order))


def test_default_collate_on_the_same_inputs():
    cases = [
        [1, 2],
        [1.5, 2.5],
        [True, False],
        [np.float32(1), np.float32(2)],
        [np.zeros((2, 2), np.uint8), np.ones((2, 2), np.uint8)],
        [{"a": (1, 2.0)}, {"a": (3, 4.0)}],
        [Pair(1, "x"), Pair(2, "y")],
    ]
    for batch in cases:
        assert_same(fl.default_collate(batch), to_numpy(td.default_collate(batch)))


def test_default_collate_and_convert_keep_tensors_as_torch_does():
    samples = [{"x": torch.ones(2, dtype=torch.float16), "n": torch.tensor(i)} for i in range(3)]
    ours, theirs = fl.default_collate(samples), td.default_collate(samples)
    for key in ("x", "n"):
        assert type(ours[key]) is torch.Tensor and ours[key].dtype == theirs[key].dtype
        assert torch.equal(ours[key], theirs[key])
    sample = (torch.arange(3), [np.arange(2)])
    converted = fl.default_convert(sample)
    assert converted[0] is sample[0] and isinstance(converted[1][0], np.ndarray)


@pytest.mark.parametrize(
    "batch",
    [[None, None], [[1, 2], [1]], [np.array(["a"]), np.array(["b"])], [np.zeros(2), np.zeros(3)],
     [torch.zeros(2), torch.zeros(3)], [object()]],
)
def test_default_collate_raises_the_same_types(batch):
    with pytest.raises(Exception) as theirs:
        td.default_collate(batch)
    with pytest.raises(type(theirs.value)):
        fl.default_collate(batch)


def test_tensors_torch_cannot_stack_raise_torchs_reason():
    # Equal shapes, dtypes torch.stack will not promote: the reason is
    # torch's, not a shape error's.
    batch = [torch.ones(2, dtype=torch.int16), torch.ones(2, dtype=torch.uint16)]
    with pytest.raises(RuntimeError) as theirs:
        td.default_collate(batch)
    with pytest.raises(RuntimeError) as ours:
        fl.default_collate(batch)
    assert str(ours.value) == str(theirs.value)


def test_default_convert_on_the_same_input():
    sample = (np.float64(2.0), [np.arange(3)], {"k": Pair(np.int8(1), "s")}, 5)
    assert_same(fl.default_convert(sample), to_numpy(td.default_convert(sample)))


def test_torch_samplers_and_tensor_samples_work_in_fastload():
    ds = td.TensorDataset(torch.arange(10.0).reshape(5, 2), torch.arange(5))
    sampler = td.BatchSampler(td.SequentialSampler(ds), 2, False)
    batches = list(fl.DataLoader(ds, batch_sampler=sampler))
    assert isinstance(batches[0][0], torch.Tensor) and batches[0][0].shape == (2, 2)
    assert [b[1].tolist() for b in batches] == [[0, 1], [2, 3], [4]]


def test_output_torch_matches_torch_exactly():
    g_ours, g_theirs = seeded_pair()
    ours_ds, theirs_ds = array_datasets()
    ours = fl.DataLoader(ours_ds, batch_size=5, shuffle=True, generator=g_ours, output="torch")
    theirs = td.DataLoader(theirs_ds, batch_size=5, shuffle=True, generator=g_theirs)
    for a, b in zip(ours, theirs):
        assert type(a) is type(b) and all(torch.equal(x, y) for x, y in zip(a, b))


LOADER_ARGUMENTS = [
    {"num_workers": -1},
    {"timeout": -1},
    {"prefetch_factor": 2},
    {"num_workers": 1, "prefetch_factor": -1},
    {"persistent_workers": True},
    {"multiprocessing_context": "fork"},
    {"num_workers": 1, "multiprocessing_context": "nonsense"},
    {"num_workers": 1, "multiprocessing_context": 3},
    {"shuffle": True, "sampler": [0, 1]},
    {"batch_sampler": [[0]], "batch_size": 2},
    {"batch_sampler": [[0]], "shuffle": True},
    {"batch_sampler": [[0]], "sampler": [0]},
    {"batch_sampler": [[0]], "drop_last": True},
    {"batch_size": None, "drop_last": True},
    {"batch_size": 0},
    {"batch_size": -2},
    {"batch_size": 2.5},
    {"drop_last": "yes"},
]


@pytest.mark.parametrize("kwargs", LOADER_ARGUMENTS)
def test_bad_loader_arguments_raise_the_same_type(kwargs):
    ours_ds, theirs_ds = array_datasets()
    with pytest.raises(Exception) as theirs:
        td.DataLoader(theirs_ds, **kwargs)
    with pytest.raises(type(theirs.value)):
        fl.DataLoader(ours_ds, **kwargs)


@pytest.mark.parametrize("kwargs", [{"shuffle": True}, {"sampler": [0]},
                                    {"batch_sampler": [[0]]}])
def test_bad_iterable_loader_arguments_raise_the_same_type(kwargs):
    ds = TorchStream(3, 3)
    with pytest.raises(Exception) as theirs:
        td.DataLoader(ds, **kwargs)
    with pytest.raises(type(theirs.value)):
        fl.DataLoader(ds, **kwargs)


CONSTRUCTOR_CASES = [
    ("RandomSampler", (range(3),), {"replacement": 1}),
    ("RandomSampler", (range(3),), {"num_samples": 0}),
    ("WeightedRandomSampler", ([1.0, 2.0], 0), {}),
    ("WeightedRandomSampler", ([1.0, 2.0], 2, "no"), {}),
    ("WeightedRandomSampler", ([[1.0, 2.0]], 2), {}),
    ("BatchSampler", (range(3), 0, False), {}),
    ("BatchSampler", (range(3), 2, None), {}),
    ("DistributedSampler", (range(3), 2, 2), {}),
    ("DistributedSampler", (range(3), 2, -1), {}),
    ("ConcatDataset", ([],), {}),
    ("StackDataset", (), {}),
    ("StackDataset", ([1], [1, 2]), {}),
    ("random_split", (range(10), [3, 3]), {}),
    ("random_split", (range(10), [-0.5, 1.5]), {}),
]


@pytest.mark.parametrize("name, args, kwargs", CONSTRUCTOR_CASES)
def test_bad_constructor_arguments_raise_the_same_type(name, args, kwargs):
    with pytest.raises(Exception) as theirs:
        getattr(td, name)(*args, **kwargs)
    with pytest.raises(type(theirs.value)):
        getattr(fl, name)(*args, **kwargs)


def test_dataset_assertions_match_torch():
    with pytest.raises(AssertionError):
        td.TensorDataset(torch.zeros(3), torch.zeros(2))
    with pytest.raises(AssertionError):
        fl.ArrayDataset(np.zeros(3), np.zeros(2))
    for module in (td, fl):
        with pytest.raises(AssertionError):
            module.ConcatDataset([TorchStream(2, 2)])


@pytest.mark.parametrize("weights, count, replacement",
                         [([-1.0, 2.0], 2, True), ([0.0, 0.0], 1, True), ([1.0, 2.0], 3, False)])
def test_invalid_weighted_distribution_same_type(weights, count, replacement):
    with pytest.raises(RuntimeError):
        list(td.WeightedRandomSampler(weights, count, replacement))
    for generator in (None, torch.Generator().manual_seed(0)):
        with pytest.raises(RuntimeError):
            list(fl.WeightedRandomSampler(weights, count, replacement, generator=generator))


def test_resume_of_a_torch_generator_sampler_matches_torch():
    g_ours, g_theirs = seeded_pair(4)
    ours = fl.RandomSampler(range(50), replacement=True, num_samples=90, generator=g_ours)
    expected = list(td.RandomSampler(range(50), replacement=True, num_samples=90,
                                     generator=g_theirs))
    it = iter(ours)
    head = [next(it) for _ in range(40)]
    state = ours.state_dict()
    resumed = fl.RandomSampler(range(50), replacement=True, num_samples=90,
                               generator=torch.Generator().manual_seed(99))
    resumed.load_state_dict(state)
    assert head + list(resumed) == expected
    assert len(expected) == 90
