"""Datasets built from small picklable descriptions, for the differential
tests of worker loading against num_workers=0 (tests/test_worker_differential.py).

A description is a nested tuple; ``build(description)`` makes the dataset.
Everything here lives at module level so that spawn workers can unpickle
what the tests build.
"""
from __future__ import annotations

import collections
import zlib

import numpy as np

import fastload as fl
from fastload._torchdata_layout import fastload_fields

try:
    import torch
except ImportError:  # the torch leaves are then never generated
    torch = None

Pair = collections.namedtuple("Pair", ["left", "right"])


def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


PADDED = np.dtype({"names": ["a", "b"], "formats": ["i1", "<f4"], "offsets": [0, 8],
                   "itemsize": 16})


def leaf(kind: str, seed: int, i: int, path: str):
    """The value of one leaf of sample ``i``; ``kind`` says what it is."""
    rng = _rng(kind, seed, i, path)
    if kind == "f32":
        return rng.standard_normal(3).astype(np.float32)
    if kind == "u8img":
        return rng.integers(0, 255, (2, 3, 3), dtype=np.uint8)
    if kind == "i64":
        return np.int64(rng.integers(-5, 5))
    if kind == "int":
        return int(rng.integers(0, 100))
    if kind == "float":
        return float(rng.standard_normal())
    if kind == "bool":
        return bool(rng.integers(0, 2))
    if kind == "mixnum":  # ints and floats at one position
        return int(i) if i % 2 else float(i) / 2
    if kind == "str":
        return "s" * int(rng.integers(0, 40)) + str(i)
    if kind == "longstr":  # past one ring record
        return chr(97 + i % 26) * 12_000
    if kind == "bytes":
        return bytes(rng.integers(0, 255, int(rng.integers(0, 9)), dtype=np.uint8))
    if kind == "ragged":
        return np.arange(int(rng.integers(1, 4)), dtype=np.int32)
    if kind == "obj":
        return np.array([{"i": i}, None], dtype=object)
    if kind == "tensor":
        return torch.from_numpy(rng.standard_normal(2).astype(np.float32))
    if kind == "empty_t":
        return torch.zeros(0, 2)
    if kind == "tensor_i":
        return torch.tensor(i)
    if kind == "f32be":  # another byte order, not contiguous
        return (rng.standard_normal(6) * 9).astype(">f4")[::2]
    if kind == "padded":  # a structured dtype with gaps between its fields
        row = np.zeros(2, dtype=PADDED)
        row["a"], row["b"] = i, rng.standard_normal(2)
        return row
    if kind == "wildnum":  # numbers of every kind at one position, ints past 64 bits too
        return WILD_NUMBERS[(i * 5 + seed) % len(WILD_NUMBERS)]
    if kind == "bigint":  # past int64: numpy makes them np.ulonglong
        return 2**63 + i
    if kind == "ulonglong":
        return np.arange(3, dtype=np.ulonglong) + i
    if kind == "empty":  # no bytes: only its strides can tell paths apart
        return np.zeros((0, 2), dtype=np.float32)
    if kind == "deep":  # 64 dimensions: a batch of them cannot exist
        return np.zeros((1,) * 64, dtype=np.uint8)
    if kind == "none":
        return None
    raise ValueError(kind)


WILD_NUMBERS = [True, 3, 2**63 + 1, -2, 2**70, 2.5, np.uint16(7), np.float32(1.5), False]


def sample(structure, seed: int, i: int, path: str = ""):
    what = structure[0]
    if what == "leaf":
        return leaf(structure[1], seed, i, path)
    if what == "tuple":
        return tuple(sample(s, seed, i, f"{path}.{k}") for k, s in enumerate(structure[1]))
    if what == "list":
        return [sample(s, seed, i, f"{path}.{k}") for k, s in enumerate(structure[1])]
    if what == "dict":
        return {key: sample(s, seed, i, f"{path}.{key}") for key, s in structure[1]}
    if what == "pair":
        return Pair(sample(structure[1], seed, i, path + ".l"),
                    sample(structure[2], seed, i, path + ".r"))
    raise ValueError(what)


class PythonDataset(fl.Dataset):
    """Samples of a given structure; the indices in ``failing`` raise."""

    def __init__(self, n, structure, failing, seed):
        self.n, self.structure, self.failing, self.seed = n, structure, failing, seed

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.failing:
            raise ValueError(f"sample {i} is broken")
        return sample(self.structure, self.seed, i)


class BatchedPythonDataset(PythonDataset):
    """The same, fetched a batch at a time through __getitems__."""

    def __getitems__(self, indices):
        return [self[i] for i in indices]


class ReversedSubset(fl.Subset):
    """A Subset subclass that reads its indices backwards: the loader must
    call its own methods, with or without workers."""

    def __getitem__(self, idx):
        return self.dataset[self.indices[len(self.indices) - 1 - idx]]

    def __getitems__(self, indices):
        return [self[i] for i in indices]


def build(description):
    what = description[0]
    if what == "array":
        _, n, dtypes, seed = description
        rng = _rng("array", seed)
        arrays = [(rng.standard_normal((n, 2, 3)) * 50).astype(d) for d in dtypes]
        return fl.ArrayDataset(*arrays)
    if what == "strings":  # an ArrayDataset whose column is not numeric
        _, n, seed = description
        return fl.ArrayDataset(np.array([f"w{seed}-{i}" for i in range(n)]), np.arange(n))
    if what == "python":
        _, n, structure, failing, batched, seed = description
        cls = BatchedPythonDataset if batched else PythonDataset
        return cls(n, structure, frozenset(failing), seed)
    if what in ("subset", "subset_array", "reversed_subset"):
        _, inner, seed = description
        dataset = build(inner)
        order = _rng("subset", seed).permutation(len(dataset))
        keep = order[: max(1, len(order) * 2 // 3)]
        if what == "subset":
            return fl.Subset(dataset, keep.tolist())
        if what == "subset_array":
            return fl.Subset(dataset, keep)
        return ReversedSubset(dataset, keep.tolist())
    if what == "split":
        _, inner, seed = description
        return fl.random_split(build(inner), [0.6, 0.4], generator=seed)[0]
    if what == "concat":
        return fl.ConcatDataset([build(part) for part in description[1]])
    if what == "stack_tuple":
        return fl.StackDataset(*[build(part) for part in description[1]])
    if what == "stack_dict":
        return fl.StackDataset(**{f"k{j}": build(part) for j, part in enumerate(description[1])})
    raise ValueError(what)


def keep_samples(batch):
    """A collate_fn that returns the samples as a list (pickled through the slot)."""
    return list(batch)


def pad_first_leaf(batch):
    """A padding collate_fn for samples whose first item is a 1-d array."""
    first = [np.atleast_1d(np.asarray(s[0] if isinstance(s, (tuple, list)) else s))
             for s in batch]
    width = max(len(a) for a in first)
    values = np.zeros((len(first), width), dtype=first[0].dtype)
    for row, a in enumerate(first):
        values[row, : len(a)] = a
    return {"values": values, "lengths": np.array([len(a) for a in first])}


COLLATE_FNS = {"default": None, "keep": keep_samples, "pad": pad_first_leaf}


def canonical(x):
    """A comparable form of a batch: types, dtypes, shapes and bytes."""
    if isinstance(x, np.ndarray):
        if x.dtype.hasobject:
            return ("ndarray", x.dtype.str, x.shape, repr(x.tolist()))
        # The char tells np.ulonglong from np.uint64, the descr padded fields.
        # An empty array's strides are numpy's (all zero) on every path; a
        # sample kept as it is may lose its own strides through a pickle.
        return ("ndarray", x.dtype.str, x.dtype.char, x.dtype.descr, x.shape, x.tobytes(),
                x.strides if x.size == 0 else None)
    if torch is not None and isinstance(x, torch.Tensor):
        return ("tensor", str(x.dtype), tuple(x.shape), x.numpy().tobytes(),
                x.stride() if x.numel() == 0 else None)
    if isinstance(x, np.generic):
        return ("scalar", type(x).__name__, np.asarray(x).tobytes())
    if isinstance(x, (str, bytes, int, float, bool)) or x is None:
        return (type(x).__name__, repr(x))
    if isinstance(x, dict):
        return (type(x).__name__, [(k, canonical(v)) for k, v in x.items()])
    if isinstance(x, (tuple, list)):
        return (type(x).__name__, [canonical(v) for v in x])
    return (type(x).__name__, repr(x))


def epoch_outcome(loader, states=True):
    """Every batch of one epoch in its canonical form, or the type of the
    exception raised in its place, in order; with ``states``, each followed
    by the loader's state_dict() and the last by the state at the end
    (fastload's fields: torchdata's keys, derived from them, are laid out
    by the number of workers, as torchdata lays them out)."""
    outcome = []
    it = iter(loader)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            break
        except Exception as exc:
            outcome.append(("raised", type(exc).__name__))
        else:
            outcome.append(canonical(batch))
        if states:
            outcome.append(("state", canonical(fastload_fields(loader.state_dict()))))
        if len(outcome) > 400:
            raise AssertionError("the epoch does not end")
    if states:
        outcome.append(("state", canonical(fastload_fields(loader.state_dict()))))
    return outcome
