"""fastload.torch: a torch.utils.data.DataLoader to frameworks, fastload's
engine underneath, torch's types out."""
import collections
import inspect
import json
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="fastload.torch needs torch installed")
from torch.utils import data as td  # noqa: E402

import fastload as fl  # noqa: E402
import fastload.torch as flt  # noqa: E402

from _launch import REPO, clean_env, finish, free_port  # noqa: E402


class Rows(td.Dataset):
    """numpy samples, as a torch user's dataset returns them."""

    def __len__(self):
        return 22

    def __getitem__(self, i):
        return {"x": np.full(3, i, np.float32), "label": i, "name": f"row{i}"}


def indices(batches):
    """Every batch's labels in order (without batching, each an int, as torch
    gives it)."""
    return [int(i) for batch in batches for i in torch.as_tensor(batch["label"]).reshape(-1)]


def test_it_is_torchs_dataloader_with_torchs_attributes():
    dataset = Rows()
    generator = torch.Generator().manual_seed(3)
    loader = flt.DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2,
                            drop_last=True, generator=generator, persistent_workers=True)
    reference = td.DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2,
                              drop_last=True, generator=generator, persistent_workers=True)
    assert isinstance(loader, td.DataLoader)
    for name in ("dataset", "batch_size", "num_workers", "drop_last", "pin_memory", "timeout",
                 "worker_init_fn", "generator", "prefetch_factor", "persistent_workers",
                 "in_order", "collate_fn", "multiprocessing_context"):
        assert getattr(loader, name) == getattr(reference, name), name
    assert type(loader.sampler) is td.RandomSampler and type(loader.batch_sampler) is td.BatchSampler
    assert loader.batch_sampler.sampler is loader.sampler
    assert len(loader) == len(reference) == 5


@pytest.mark.parametrize("workers", [{}, dict(num_workers=2),
                                     dict(num_workers=2, worker_method="thread")],
                         ids=["0 workers", "processes", "threads"])
def test_batches_are_torchs_batches(workers):
    torch.manual_seed(11)
    theirs = list(td.DataLoader(Rows(), batch_size=5, shuffle=True))
    torch.manual_seed(11)
    ours = list(flt.DataLoader(Rows(), batch_size=5, shuffle=True, **workers))
    assert len(ours) == len(theirs) == 5
    for a, b in zip(ours, theirs):
        for key in ("x", "label"):
            assert type(a[key]) is torch.Tensor and a[key].dtype == b[key].dtype
            assert torch.equal(a[key], b[key])
        assert a["name"] == b["name"]


class NumpyPairs(td.Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return np.array([i, i + 1], np.float32)


def stack_as_numpy(batch):
    return {"x": np.stack(batch), "n": len(batch)}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_custom_collate_fns_result_is_left_as_it_made_it(num_workers):
    """torch turns nothing of a custom collate_fn's result into tensors;
    nor does this loader. Its defaults still give tensors, and the default
    of the other kind (default_collate of single samples) runs as in torch."""
    ours = list(flt.DataLoader(NumpyPairs(), batch_size=3, collate_fn=stack_as_numpy,
                               num_workers=num_workers))
    theirs = list(td.DataLoader(NumpyPairs(), batch_size=3, collate_fn=stack_as_numpy))
    assert [type(b["x"]) for b in ours] == [np.ndarray, np.ndarray]
    assert [b["x"].tolist() for b in ours] == [b["x"].tolist() for b in theirs]
    single = list(flt.DataLoader(NumpyPairs(), batch_size=None, collate_fn=td.default_collate,
                                 num_workers=num_workers))
    expected = list(td.DataLoader(NumpyPairs(), batch_size=None, collate_fn=td.default_collate))
    assert all(torch.equal(a, b) for a, b in zip(single, expected)) and len(single) == 6


class TaggedPairs(list):
    """A list subclass: torch's default_collate keeps its type."""


class TaggedRows(td.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return TaggedPairs([np.float32(i), np.arange(2) + i])


def test_a_list_subclass_sample_collates_to_tensors_in_its_type():
    ours = list(flt.DataLoader(TaggedRows(), batch_size=2))
    theirs = list(td.DataLoader(TaggedRows(), batch_size=2))
    assert [type(b) for b in ours] == [type(b) for b in theirs] == [TaggedPairs] * 2
    assert all(isinstance(leaf, torch.Tensor) for b in ours for leaf in b)
    assert all(torch.equal(a, b) for x, y in zip(ours, theirs) for a, b in zip(x, y))


class Items(collections.abc.Sequence):
    """A sequence that is no list: torch rebuilds it in its type."""

    def __init__(self, items):
        self.items = list(items)

    def __getitem__(self, i):
        return self.items[i]

    def __len__(self):
        return len(self.items)


class SequenceSamples(td.Dataset):
    def __init__(self, make):
        self.make = make

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return self.make([np.arange(2) + i, np.float32(i)])


@pytest.mark.parametrize("make", [collections.deque, collections.UserList, Items])
@pytest.mark.parametrize("batch_size", [2, None])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_tensors_inside_any_sequence_a_sample_is(make, batch_size, num_workers):
    # Every leaf is a tensor, whatever sequence holds it, as in torch.
    ours = list(flt.DataLoader(SequenceSamples(make), batch_size=batch_size,
                               num_workers=num_workers))
    theirs = list(td.DataLoader(SequenceSamples(make), batch_size=batch_size))
    assert [type(b) for b in ours] == [type(b) for b in theirs]
    for mine, torchs in zip(ours, theirs):
        assert all(type(leaf) is torch.Tensor for leaf in mine)
        assert all(torch.equal(a, b) for a, b in zip(mine, torchs))


class SparseRows(td.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.eye(2).to_sparse()


@pytest.mark.parametrize("loader, kwargs", [
    (flt.DataLoader, {}), (flt.DataLoader, {"num_workers": 2}), (fl.DataLoader, {}),
    (fl.DataLoader, {"num_workers": 2}), (fl.DataLoader, {"num_workers": 2, "worker_method": "thread"})])
def test_sparse_tensor_samples_are_refused_as_torch_refuses_them(loader, kwargs):
    with pytest.raises(RuntimeError, match="Batches of sparse tensors are not currently"):
        next(iter(td.DataLoader(SparseRows(), batch_size=2)))
    with pytest.raises(RuntimeError, match="Batches of sparse tensors are not currently"):
        next(iter(loader(SparseRows(), batch_size=2, **kwargs)))


class Stream(td.IterableDataset):
    """torch's sharding recipe: each worker yields its own part."""

    def __iter__(self):
        info = td.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, 10, step))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_datasets_and_no_batching(num_workers):
    loader = flt.DataLoader(Stream(), batch_size=3, num_workers=num_workers)
    batches = list(loader)
    assert all(type(b) is torch.Tensor and b.dtype == torch.int64 for b in batches)
    assert sorted(int(i) for b in batches for i in b) == list(range(10))
    samples = list(flt.DataLoader(Rows(), batch_size=None, num_workers=num_workers))
    assert len(samples) == 22 and type(samples[5]["x"]) is torch.Tensor
    assert samples[5]["x"].tolist() == [5.0] * 3


class GlobalDraws(td.Dataset):
    """Each sample is a draw from each global generator of its worker."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        import random

        return torch.tensor([random.random(), float(np.random.rand()), float(torch.rand(()))],
                            dtype=torch.float64)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_draw_torchs_numbers_from_the_global_generators(context):
    """Worker processes seed random, numpy and torch as torch's do, so a
    dataset drawing from them (albumentations draws from numpy and random)
    makes torch's samples under the same seed."""
    def epoch(module):
        torch.manual_seed(7)
        loader = module.DataLoader(GlobalDraws(), batch_size=2, num_workers=2,
                                   multiprocessing_context=context)
        return torch.cat(list(loader))

    theirs = epoch(td)
    assert torch.equal(epoch(flt), theirs)
    assert len({tuple(row.tolist()) for row in theirs}) == 8


def test_resume_is_exact_or_refused():
    loader = flt.DataLoader(Rows(), batch_size=4, sampler=flt.SequentialSampler(Rows()))
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    rest = indices(it)
    resumed = flt.DataLoader(Rows(), batch_size=4, sampler=flt.SequentialSampler(Rows()))
    resumed.load_state_dict(state)
    assert indices(resumed) == rest == list(range(4, 22))

    class OwnOrder(td.RandomSampler):
        """A subclass may draw its order any way: it cannot be replayed."""

    custom = flt.DataLoader(Rows(), batch_size=4, sampler=OwnOrder(Rows()))
    next(iter(custom))
    state = custom.state_dict()  # frameworks take it whenever there is one
    with pytest.raises(ValueError, match="OwnOrder: it keeps no state"):
        flt.DataLoader(Rows(), batch_size=4, sampler=OwnOrder(Rows())).load_state_dict(state)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("arguments", [
    {"shuffle": True, "batch_size": 4},
    {"shuffle": True, "batch_size": None},
    {"shuffle": True, "batch_size": 4, "generator": 5},
    {"sampler": "subset", "batch_size": 3},
    {"sampler": "weighted", "batch_size": 4},
], ids=["shuffle", "no-batching", "generator", "subset", "weighted"])
def test_torchs_random_samplers_resume_exactly(arguments, num_workers):
    def make(module=flt, **extra):
        kwargs = {**arguments, **extra}
        if kwargs.get("generator") is not None:
            kwargs["generator"] = torch.Generator().manual_seed(kwargs["generator"])
        if kwargs.get("sampler") == "subset":
            kwargs["sampler"] = td.SubsetRandomSampler(list(range(0, 22, 2)))
        elif kwargs.get("sampler") == "weighted":
            kwargs["sampler"] = td.WeightedRandomSampler([1.0] * 22, 22)
        return module.DataLoader(Rows(), **kwargs)

    for stop in (0, 2):  # 0: right after iter(), workers already drawing
        torch.manual_seed(0)
        loader = make(num_workers=num_workers)
        it = iter(loader)
        head = [next(it) for _ in range(stop)]
        state = json.loads(json.dumps(loader.state_dict()))
        rest = indices(it)
        torch.manual_seed(1)  # another run: the global generator is elsewhere
        resumed = make(num_workers=num_workers)
        resumed.load_state_dict(state)
        assert indices(resumed) == rest and len(head) == stop and rest
    # The order is torch's own: the same draws as torch's loader makes.
    torch.manual_seed(3)
    ours = indices(make(num_workers=num_workers))
    torch.manual_seed(3)
    assert ours == indices(make(td))


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("case", ["shuffle", "replacement"])
def test_a_sampler_given_its_own_generator_resumes_this_epoch_and_the_next(case, num_workers):
    """Such a sampler draws from its generator all epoch long: with
    replacement 32 indices at a time; RandomSampler a last randperm for the
    remainder at its end, which prefetching workers reach before the state
    is taken. A resume replays those draws and leaves the generator there."""
    def make():
        generator = torch.Generator().manual_seed(7)
        if case == "shuffle":
            return flt.DataLoader(list(range(10)), batch_size=2, shuffle=True,
                                  generator=generator, num_workers=num_workers)
        sampler = td.RandomSampler(range(100), replacement=True, num_samples=80,
                                   generator=generator)
        return flt.DataLoader(list(range(100)), batch_size=4, sampler=sampler,
                              generator=generator, num_workers=num_workers)

    def epoch(loader):
        return [int(x) for batch in loader for x in batch]

    uninterrupted = make()
    expected = [epoch(uninterrupted), epoch(uninterrupted)]
    loader = make()
    it = iter(loader)
    head = [int(x) for _ in range(4 if case == "shuffle" else 10) for x in next(it)]
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    resumed = make()
    resumed.load_state_dict(state)
    assert [head + epoch(resumed), epoch(resumed)] == expected


@pytest.mark.parametrize("loader", [flt.DataLoader, fl.DataLoader], ids=["torch's", "fastload's"])
@pytest.mark.parametrize("batching", ["sampler", "batch_sampler"])
@pytest.mark.parametrize("epochs_before", [0, 1])
@pytest.mark.parametrize("shared", [False, True], ids=["its own", "the loader's"])
def test_a_samplers_generator_is_saved_between_epochs(loader, batching, epochs_before, shared):
    """A state taken before an epoch (before any, or after one ran out) holds
    where the sampler's own generator stands, which no loader state restores
    otherwise: the resumed epochs are the uninterrupted run's, not its first
    again. The loader's generator, which its state restores and which draws
    the base seed before the sampler draws, is left to the loader."""
    def make():
        generator = torch.Generator().manual_seed(5)
        sampler = td.RandomSampler(range(8), generator=generator)
        shared_generator = {"generator": generator} if shared else {}
        if batching == "sampler":
            return loader(list(range(8)), sampler=sampler, batch_size=3, **shared_generator)
        return loader(list(range(8)), batch_sampler=td.BatchSampler(sampler, 3, False),
                      **shared_generator)

    def epoch(made):
        return [int(x) for batch in made for x in batch]

    uninterrupted = make()
    expected = [epoch(uninterrupted) for _ in range(3)]
    saved = make()
    before = [epoch(saved) for _ in range(epochs_before)]
    state = json.loads(json.dumps(saved.state_dict()))
    resumed = make()
    resumed.load_state_dict(state)
    assert before + [epoch(resumed) for _ in range(3 - epochs_before)] == expected


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_state_taken_before_a_resumed_epochs_next_snapshot_resumes_it(num_workers):
    """Resumed from a state between epochs, the next epoch's state at iter()
    (snapshot_every_n_steps 4: the snapshot a later state holds) is that
    of the resumed epoch, not of a fresh draw from the sampler's generator
    as a new process has it: the rest of the epoch was another order."""
    def make():
        generator = torch.Generator().manual_seed(3)
        return fl.DataLoader(list(range(12)), batch_size=2, num_workers=num_workers,
                             snapshot_every_n_steps=4,
                             sampler=td.RandomSampler(range(12), generator=generator))

    def epoch(made):
        return [int(x) for batch in made for x in batch]

    uninterrupted = make()
    epoch(uninterrupted)
    between = json.loads(json.dumps(uninterrupted.state_dict()))
    expected = epoch(uninterrupted)
    second = make()
    second.load_state_dict(between)
    it = iter(second)
    head = [int(x) for x in next(it)]
    early = json.loads(json.dumps(second.state_dict()))
    del it
    third = make()
    third.load_state_dict(early)
    assert head + epoch(third) == expected


class RandomRows(td.Dataset):
    """Each sample drawn from torch's global generator, whose state is the
    dataset's state (torchdata's tests do this)."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        return int(torch.randint(1000, ()))

    def state_dict(self):
        return {"rng": torch.get_rng_state().tolist()}

    def load_state_dict(self, state):
        torch.set_rng_state(torch.tensor(state["rng"], dtype=torch.uint8))


@pytest.mark.parametrize("stop", [0, 4])
def test_a_shuffled_dataset_drawing_from_the_global_generator_resumes_exactly(stop):
    def make():
        return flt.DataLoader(RandomRows(), batch_size=2, shuffle=True)

    torch.manual_seed(0)
    loader = make()
    it = iter(loader)
    [next(it) for _ in range(stop)]
    state = loader.state_dict()
    rest = [batch.tolist() for batch in it]
    torch.manual_seed(1)
    resumed = make()
    resumed.load_state_dict(state)
    assert [batch.tolist() for batch in resumed] == rest


def test_default_collate_and_convert_are_torchs():
    samples = [Rows()[i] for i in range(3)]
    ours, theirs = flt.default_collate(samples), td.default_collate(samples)
    assert all(torch.equal(ours[k], theirs[k]) and ours[k].dtype == theirs[k].dtype
               for k in ("x", "label"))
    converted = flt.default_convert(samples[0])
    assert type(converted["x"]) is torch.Tensor and converted["label"] == 0


MIXED_LEAVES = {
    "int then float": lambda i: i if i % 2 == 0 else i + 0.5,
    "bool then int": lambda i: bool(i % 2) if i % 2 == 0 else i,
    "int then complex": lambda i: i if i % 2 == 0 else complex(i, 1),
    "np.int64 then np.float32": lambda i: np.int64(i) if i % 2 == 0 else np.float32(i),
    "np.uint8 then np.int8": lambda i: np.uint8(i) if i % 2 == 0 else np.int8(-i),
    "int64 then float32 arrays": lambda i: np.arange(2) + i if i % 2 == 0
    else np.ones(2, np.float32),
    "float16 then int32 arrays": lambda i: np.ones(2, np.float16) if i % 2 == 0
    else np.arange(2, dtype=np.int32),
    "uint16 then uint8 arrays": lambda i: np.ones(2, np.uint16) if i % 2 == 0
    else np.ones(2, np.uint8),
    "past int64": lambda i: 2**63 + i,
    "int32 then uint16 arrays": lambda i: np.ones(2, np.int32) if i % 2 == 0
    else np.ones(2, np.uint16),
    "array then float": lambda i: np.array(1.5) if i % 2 == 0 else 2.5,
    "array then list": lambda i: np.ones(2, np.int64) if i % 2 == 0 else [2.5, 3.5],
    # torch refuses these dtypes (TypeError) whatever the samples.
    "datetime64 arrays": lambda i: np.arange(2).astype("datetime64[s]") + i,
    "structured arrays": lambda i: np.zeros(2, dtype=[("a", "i1"), ("b", "f8")]),
    # torch makes no tensor of these scalars (TypeError), but of uint32 ones.
    "uint64 scalars": lambda i: np.uint64(i),
    "timedelta64 scalars": lambda i: np.timedelta64(i, "s"),
    "uint32 scalars": lambda i: np.uint32(i),
}


class Mixed(td.Dataset):
    """Samples whose leaf differs in type or dtype from one to the next, or
    has a dtype torch refuses."""

    def __init__(self, make):
        self.make = make

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return {"value": self.make(i), "same": np.float32(i)}


def _batches_or_error(loader):
    try:
        return [(str(b["value"].dtype), b["value"].tolist(), b["same"].dtype) for b in loader]
    except Exception as error:  # noqa: BLE001 - torch's error is the expected outcome
        return type(error).__name__


LOADERS = {
    "0 workers": lambda dataset: flt.DataLoader(dataset, batch_size=3),
    "processes": lambda dataset: flt.DataLoader(dataset, batch_size=3, num_workers=2),
    # fastload.torch's engine with thread workers (torch 2.13 has no worker_method).
    "threads": lambda dataset: fl.DataLoader(
        dataset, batch_size=3, num_workers=2, worker_method="thread", output="torch",
        collate_fn=fl.collate.default_collate_torch_rules),
}


@pytest.mark.parametrize("loader", LOADERS.values(), ids=LOADERS)
@pytest.mark.parametrize("make", MIXED_LEAVES.values(), ids=MIXED_LEAVES)
def test_samples_that_differ_in_dtype_are_promoted_as_torch_promotes(make, loader):
    """torch's promotion, or torch's error, whatever loads the batch: the
    C collation leaves such leaves to the general path's torch rules."""
    expected = _batches_or_error(td.DataLoader(Mixed(make), batch_size=3))
    assert _batches_or_error(loader(Mixed(make))) == expected
    samples = [Mixed(make)[i] for i in range(3)]
    try:
        assert flt.default_collate(samples)["value"].dtype == td.default_collate(
            samples)["value"].dtype
    except (RuntimeError, TypeError, ValueError) as error:
        with pytest.raises(type(error)):
            td.default_collate(samples)


UNBATCHED_LEAVES = {
    "uint64 scalar": np.uint64(3),
    "timedelta64 scalar": np.timedelta64(3, "s"),
    "datetime64 scalar": np.datetime64(3, "s"),
    "bytes scalar": np.bytes_(b"x"),
    "structured scalar": np.zeros(1, dtype=[("a", "i1"), ("b", "f8")])[0],
    "datetime64 array": np.arange(2).astype("datetime64[s]"),
    "structured array": np.zeros(2, dtype=[("a", "i1"), ("b", "f8")]),
    "uint32 scalar": np.uint32(3),
    "uint64 array": np.arange(2, dtype=np.uint64),
    "str scalar": np.str_("x"),
}


class Leaves(td.Dataset):
    def __init__(self, leaf):
        self.leaf = leaf

    def __len__(self):
        return 2

    def __getitem__(self, i):
        return self.leaf


def _converted_or_error(convert, leaf):
    try:
        converted = convert(leaf)
    except Exception as error:  # noqa: BLE001 - torch's error is the expected outcome
        return type(error).__name__
    return type(converted).__name__, str(getattr(converted, "dtype", ""))


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("leaf", UNBATCHED_LEAVES.values(), ids=UNBATCHED_LEAVES)
def test_without_batching_a_leaf_torch_cannot_convert_raises_as_torchs(leaf, num_workers):
    """torch's default_convert: a TypeError for a numpy leaf torch makes no
    tensor of, on every path, not the numpy leaf handed back."""
    expected = _converted_or_error(td.default_convert, leaf)
    assert _converted_or_error(flt.default_convert, leaf) == expected
    loader = flt.DataLoader(Leaves(leaf), batch_size=None, num_workers=num_workers)
    assert _converted_or_error(lambda _: next(iter(loader)), None) == expected


def recreate_with(loader, sampler):
    """What Lightning does to inject a sampler: every __init__ argument read
    back from the loader's attributes, then the sampler swapped in."""
    attributes = {k: v for k, v in vars(loader).items() if not k.startswith("_")}
    attributes["multiprocessing_context"] = loader.multiprocessing_context
    parameters = inspect.signature(type(loader).__init__).parameters
    kwargs = {name: attributes[name] for name in parameters if name in attributes}
    kwargs.update(sampler=sampler, shuffle=False, batch_sampler=None,
                  batch_size=loader.batch_size, drop_last=loader.drop_last)
    return type(loader)(**kwargs)


def test_recreated_with_a_distributed_sampler_each_rank_loads_its_share():
    dataset = Rows()
    loader = flt.DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2)
    shares = []
    for rank in range(2):
        sampler = td.DistributedSampler(dataset, num_replicas=2, rank=rank, seed=5)
        recreated = recreate_with(loader, sampler)
        assert type(recreated) is flt.DataLoader and recreated.sampler is sampler
        assert recreated.num_workers == 2 and len(recreated) == 3
        shares.append(indices(recreated))
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == list(range(len(dataset)))


def test_lightnings_own_reinstantiation():
    data = pytest.importorskip("lightning.fabric.utilities.data",
                               reason="Lightning is not installed (an optional integration test)")
    dataset = Rows()
    loader = flt.DataLoader(dataset, batch_size=4, shuffle=True)
    shares = []
    for rank in range(2):
        sampler = td.DistributedSampler(dataset, num_replicas=2, rank=rank)
        recreated = data._update_dataloader(loader, sampler)
        assert isinstance(recreated, flt.DataLoader)
        shares.append(indices(recreated))
    assert sorted(shares[0] + shares[1]) == list(range(len(dataset)))


def test_accelerates_batch_sampler_sharding_with_fastloads_engine_put_back():
    data_loader = pytest.importorskip(
        "accelerate.data_loader", reason="accelerate is not installed (an optional integration test)")
    dataset = Rows()
    shares = []
    for rank in range(2):
        # even_batches=False: 22 samples are not padded to whole batches per rank.
        prepared = data_loader.prepare_data_loader(
            flt.DataLoader(dataset, batch_size=2, num_workers=2), num_processes=2,
            process_index=rank, put_on_device=False, even_batches=False)
        assert type(prepared.base_dataloader) is td.DataLoader  # accelerate's own
        assert flt.use_fastload_engine(prepared) is prepared
        assert type(prepared.base_dataloader) is flt.DataLoader
        assert prepared.base_dataloader.num_workers == 2
        shares.append(indices(prepared))
        assert prepared.base_dataloader.stats().batches == len(prepared)
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == list(range(len(dataset)))


RANK_SCRIPT = """
import json, sys, warnings
import numpy as np, torch.distributed as dist
import fastload as fl, fastload.torch as flt
rank, port = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
dataset = fl.ArrayDataset(np.arange(8))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    list(flt.DataLoader(dataset, batch_size=2, sampler=flt.DistributedSampler(dataset)))
    sharded = len(caught)
    for _ in range(2):
        list(flt.DataLoader(dataset, batch_size=2, shuffle=True))
print(json.dumps({"sharded": sharded, "messages": [str(w.message) for w in caught]}))
dist.destroy_process_group()
"""


@pytest.mark.timeout(120)
def test_an_unsharded_loader_under_torch_distributed_warns_once(tmp_path):
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("this torch build has no torch.distributed with the gloo backend")
    port = str(free_port())
    ranks = [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, str(rank), port],
                              env=clean_env(GLOO_SOCKET_IFNAME="lo"), cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(2)]
    outputs = finish(ranks, timeout=90)
    for process, output in zip(ranks, outputs):
        assert process.returncode == 0, output
        report = json.loads(output.strip().splitlines()[-1])
        assert report["sharded"] == 0
        assert len(report["messages"]) == 1, report
        assert "2 ranks" in report["messages"][0] and "DistributedSampler" in report["messages"][0]


def test_snapshot_every_n_steps_is_taken_as_torchdata_takes_it_and_survives_recreation():
    def make(every):
        rows = Rows()
        return flt.DataLoader(rows, batch_size=4, snapshot_every_n_steps=every,
                              sampler=fl.RandomSampler(rows, generator=3))

    full = indices(make(3))
    loader = make(3)
    it = iter(loader)
    head = indices(next(it) for _ in range(4))
    state = loader.state_dict()
    assert state["sampler_step"] == 3  # the snapshot of batch 3, not of batch 4
    resumed = make(3)
    resumed.load_state_dict(state)
    assert head + indices(resumed) == full
    assert recreate_with(loader, None).snapshot_every_n_steps == 3


def test_thread_workers_are_chosen_as_in_fastloads_loader_and_survive_recreation():
    loader = flt.DataLoader(Rows(), batch_size=4, num_workers=2, worker_method="thread")
    assert loader.worker_method == "thread"
    recreated = recreate_with(loader, td.SequentialSampler(Rows()))
    assert recreated.worker_method == "thread"
    it = iter(recreated)
    first = indices([next(it)])
    assert len(it.worker_threads) == 2  # threads of this process, not processes
    assert first + indices(it) == list(range(len(Rows())))
    with pytest.raises(ValueError, match="worker_method"):
        flt.DataLoader(Rows(), num_workers=2, worker_method="threads")


def test_a_resumed_shuffled_loader_with_persistent_workers_goes_on_for_epochs():
    # Later epochs draw from torch's global generator where the loader's
    # state put it; persistent workers guess each next epoch's first batches.
    def make():
        return flt.DataLoader(Rows(), batch_size=4, shuffle=True, num_workers=2,
                              persistent_workers=True, prefetch_next_epoch=True)

    torch.manual_seed(0)
    loader = make()
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    expected = [indices(it), indices(loader), indices(loader)]
    torch.manual_seed(1)
    resumed = make()
    resumed.load_state_dict(state)
    assert [indices(resumed) for _ in range(3)] == expected
    assert expected[1] != expected[2]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_fastload_loaders_resume_torchs_random_samplers_too(num_workers):
    # Code that keeps torch's samplers when it moves to fastload.DataLoader:
    # a resume once replayed another order, silently.
    data = np.arange(40)

    def make(sampler_type=td.RandomSampler):
        return fl.DataLoader(data, batch_size=4, sampler=sampler_type(data),
                             num_workers=num_workers)

    torch.manual_seed(0)
    loader = make()
    it = iter(loader)
    next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    rest = [batch.tolist() for batch in it]
    torch.manual_seed(1)
    resumed = make()
    resumed.load_state_dict(state)
    assert [batch.tolist() for batch in resumed] == rest

    class OwnOrder(td.RandomSampler):
        pass

    custom = make(OwnOrder)
    next(iter(custom))
    with pytest.raises(ValueError, match="OwnOrder: it keeps no state"):
        make(OwnOrder).load_state_dict(custom.state_dict())


def test_enumerate_counts_on_from_a_loaded_state_with_torchs_types():
    """torchdata's StatefulDataLoader.enumerate, as its tests use it, under
    torchdata's name."""
    assert flt.StatefulDataLoader is flt.DataLoader
    dataset = td.TensorDataset(torch.arange(20))
    loader = flt.StatefulDataLoader(dataset, batch_size=2)
    it = iter(loader)
    for _ in range(2):
        next(it)
    resumed = flt.DataLoader(dataset, batch_size=2)
    resumed.load_state_dict(loader.state_dict())
    numbered = list(resumed.enumerate(start=10))
    assert [i for i, _ in numbered] == list(range(12, 20))
    assert torch.equal(numbered[0][1][0], torch.tensor([4, 5]))
