"""pad_collate and pack_collate: exact, structured like default_collate, and
clear about samples that cannot share a leaf."""
import collections

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastload as fl
from fastload_c import ragged

DTYPES = (np.int32, np.uint8, np.float32, np.float64, np.int64)


@st.composite
def ragged_samples(draw):
    """One leaf's samples: random lengths (0 included), one dtype, one
    trailing shape, some of them non-contiguous views."""
    dtype = draw(st.sampled_from(DTYPES))
    rest = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    lengths = draw(st.lists(st.integers(0, 12), min_size=1, max_size=8))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    samples = []
    for length in lengths:
        full = (rng.integers(1, 100, size=(2 * length, *rest))).astype(dtype)
        samples.append(full[::2] if draw(st.booleans()) else full[:length].copy())
    return samples


@given(ragged_samples(), st.sampled_from([None, 1, 4, 8]), st.integers(-5, 5))
def test_unpadding_gives_the_samples_back(samples, multiple, padding_value):
    if np.dtype(samples[0].dtype).kind == "u":
        padding_value = abs(padding_value)
    padded = fl.pad_collate(padding_value, multiple)(samples)
    assert isinstance(padded, fl.Padded)
    longest = max(len(s) for s in samples)
    expected_length = longest if multiple is None else -(-longest // multiple) * multiple
    assert padded.values.shape == (len(samples), expected_length, *samples[0].shape[1:])
    assert padded.values.dtype == samples[0].dtype
    assert padded.lengths.dtype == np.int64
    assert padded.lengths.tolist() == [len(s) for s in samples]
    for row, sample, length in zip(padded.values, samples, padded.lengths):
        np.testing.assert_array_equal(row[:length], sample)
        assert (row[length:] == padding_value).all()


@given(ragged_samples())
def test_unpacking_gives_the_samples_back(samples):
    packed = fl.pack_collate()(samples)
    assert isinstance(packed, fl.Packed)
    assert packed.cu_seqlens.dtype == np.int32 and packed.position_ids.dtype == np.int64
    assert packed.cu_seqlens.tolist() == np.cumsum([0] + [len(s) for s in samples]).tolist()
    assert packed.values.shape == (packed.cu_seqlens[-1], *samples[0].shape[1:])
    for i, sample in enumerate(samples):
        start, stop = packed.cu_seqlens[i], packed.cu_seqlens[i + 1]
        np.testing.assert_array_equal(packed.values[start:stop], sample)
        assert packed.position_ids[start:stop].tolist() == list(range(len(sample)))


Pair = collections.namedtuple("Pair", "tokens label")


def test_other_leaves_collate_as_default_collate_does():
    samples = [{"tokens": np.arange(n, dtype=np.int32), "label": n, "name": f"s{n}",
                "mask": np.ones((n, 2), np.bool_)} for n in (3, 1)]
    batch = fl.pad_collate(fields=["tokens"])([{k: s[k] for k in ("tokens", "label", "name")}
                                               for s in samples])
    assert isinstance(batch["tokens"], fl.Padded)
    expected = fl.default_collate([{k: s[k] for k in ("label", "name")} for s in samples])
    np.testing.assert_array_equal(batch["label"], expected["label"])
    assert batch["name"] == expected["name"]
    # Without fields, every array leaf with a dimension is variable.
    everything = fl.pack_collate()(samples)
    assert isinstance(everything["tokens"], fl.Packed)
    assert isinstance(everything["mask"], fl.Packed)
    assert everything["mask"].values.shape == (4, 2)


def test_tuples_and_namedtuples_keep_default_collates_structure():
    pairs = [Pair(np.arange(n, dtype=np.float32), n) for n in (2, 5)]
    by_name = fl.pad_collate(fields="tokens")(pairs)
    by_position = fl.pad_collate(fields=[0])(pairs)
    for batch in (by_name, by_position):
        assert type(batch) is Pair and isinstance(batch.tokens, fl.Padded)
        assert batch.label.tolist() == [2, 5]
    as_tuples = fl.pack_collate()([tuple(p) for p in pairs])
    assert type(as_tuples) is list and isinstance(as_tuples[0], fl.Packed)


def test_a_leaf_is_padded_even_when_its_lengths_agree():
    samples = [np.ones(4, np.int32), np.zeros(4, np.int32)]
    batch = fl.pad_collate()(samples)
    assert isinstance(batch, fl.Padded) and batch.values.shape == (2, 4)
    # 0-d arrays have no length: stacked as default_collate stacks them.
    scalars = fl.pad_collate()([{"x": np.float32(1)}, {"x": np.float32(2)}])
    assert scalars["x"].tolist() == [1.0, 2.0]


def test_torch_tensor_leaves_are_padded_as_arrays():
    torch = pytest.importorskip("torch")
    batch = fl.pad_collate()([torch.arange(3), torch.arange(1)])
    assert batch.values.tolist() == [[0, 1, 2], [0, 0, 0]]


def test_disagreeing_samples_name_both_samples_and_shapes():
    samples = [np.zeros((2, 3), np.float32), np.zeros((4, 3), np.float32),
               np.zeros((2, 5), np.float32)]
    with pytest.raises(fl.CollateError, match=r"sample 2 has shape \(2, 5\).*sample 0 has "
                                              r"shape \(2, 3\)") as caught:
        fl.pad_collate()(samples)
    assert caught.value.positions == (2, 0)
    with pytest.raises(fl.CollateError, match=r"leaf batch\['x'\].*dtype int64.*dtype int32"):
        fl.pack_collate()([{"x": np.zeros(2, np.int32)}, {"x": np.zeros(2, np.int64)}])


def test_the_loader_names_the_dataset_indices_of_disagreeing_samples():
    shapes = {0: (3, 2), 1: (2, 2), 2: (2, 7)}
    dataset = [np.zeros(shapes[i], np.float32) for i in range(3)]
    loader = fl.DataLoader(dataset, batch_size=3, collate_fn=fl.pad_collate())
    with pytest.raises(fl.CollateError, match=r"dataset indices 2 and 0"):
        next(iter(loader))


def test_bad_arguments_and_samples_are_named():
    with pytest.raises(fl.InvalidArgumentError, match="padding_value"):
        fl.pad_collate(padding_value="x")
    with pytest.raises(fl.InvalidArgumentError, match="pad_to_multiple_of"):
        fl.pad_collate(pad_to_multiple_of=0)
    with pytest.raises(fl.InvalidArgumentError, match="cannot be stored.*uint8"):
        fl.pad_collate(padding_value=-1)([np.zeros(2, np.uint8)])
    with pytest.raises(fl.InvalidArgumentError, match=r"'labels'.*not in the samples"):
        fl.pad_collate(fields=["labels"])([{"tokens": np.zeros(2)}])
    with pytest.raises(TypeError, match="sample 1 of a variable-length leaf is a int"):
        fl.pack_collate(fields=[0])([(np.zeros(2),), (3,)])
    with pytest.raises(ValueError, match="empty batch"):
        fl.pack_collate()([])


def test_the_kernel_writes_into_a_buffer_at_an_offset_and_nowhere_else():
    samples = [np.arange(3, dtype=np.int16), np.arange(1, dtype=np.int16)]
    lengths, dtype, rest = ragged.leaf_lengths(samples, "test")
    assert lengths.tolist() == [3, 1] and dtype == np.int16 and rest == ()
    slot = bytearray(b"\xee" * 64)
    values = np.ndarray((2, 3), dtype=np.int16, buffer=slot, offset=16)
    ragged.pad_into(samples, values, 9)
    assert values.tolist() == [[0, 1, 2], [0, 9, 9]]
    assert slot[:16] == b"\xee" * 16 and slot[28:] == b"\xee" * 36
    with pytest.raises(ValueError, match="longer than the output"):
        ragged.pad_into(samples, np.empty((2, 2), np.int16), 0)


class Tokens(fl.Dataset):
    """Sample i: tokens of a length drawn from i, and a label."""

    def __init__(self, size):
        self.lengths = np.random.default_rng(0).integers(1, 40, size)

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, index):
        return {"tokens": np.arange(self.lengths[index], dtype=np.int32) + index,
                "label": index}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("collate", [fl.pad_collate(padding_value=-1), fl.pack_collate()])
def test_workers_give_the_batches_of_the_main_process(collate):
    dataset = Tokens(96)

    def batches(num_workers):
        sampler = fl.BucketBatchSampler(fl.RandomSampler(dataset, generator=1),
                                        dataset.lengths, batch_size=8, generator=2)
        loader = fl.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate,
                               num_workers=num_workers)
        return list(loader)

    alone, with_workers = batches(0), batches(2)
    assert len(alone) == 12 and len(alone) == len(with_workers)
    for one, other in zip(alone, with_workers):
        assert type(one["tokens"]) is type(other["tokens"]) is type(collate([dataset[0]])["tokens"])
        for field_one, field_other in zip(one["tokens"], other["tokens"]):
            np.testing.assert_array_equal(field_one, field_other)
        np.testing.assert_array_equal(one["label"], other["label"])


@pytest.mark.parametrize("make", [fl.pad_collate, fl.pack_collate])
def test_in_a_worker_the_blocks_are_made_in_the_slot_and_not_copied(make):
    # NOTE [ Fast paths ]: a worker makes the ragged blocks in its slot and
    # pickle_into names them where they lie.
    import pickle

    from fastload._fast_path import _collated_in_place
    from fastload_c.pack import SlotTooSmallError, unpack

    collate = make()
    samples = [{"tokens": np.arange(n, dtype=np.int32), "label": n} for n in (3, 700, 5, 64)]
    with pytest.raises(SlotTooSmallError):
        _collated_in_place(lambda: collate(samples), bytearray(1024), 0, 1024)
    slot = bytearray(1 << 16)
    layout = _collated_in_place(lambda: collate(samples), slot, 256, len(slot) - 256)
    kind, stream_at, _, places = pickle.loads(layout)
    values_bytes = collate(samples)["tokens"][0].nbytes
    assert kind == "pickle" and (0, values_bytes) in places  # the first block, in place
    assert all(at + n <= stream_at for at, n in places)
    got = unpack(memoryview(slot)[256:], layout)
    expected = collate(samples)
    for part_got, part_expected in zip(got["tokens"], expected["tokens"]):
        assert part_got.dtype == part_expected.dtype
        assert np.array_equal(part_got, part_expected)
    assert np.array_equal(got["label"], expected["label"])
