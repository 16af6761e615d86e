"""``fastload.torch``: the names of ``torch.utils.data``, loading with
fastload's engine and returning torch's types.

Frameworks decide what to do with a loader by looking at it: Lightning and
accelerate shard only loaders that are ``torch.utils.data.DataLoader``
instances, and re-create them from their attributes with a distributed
sampler. So this ``DataLoader`` *is* one: torch's ``__init__`` checks the
arguments and sets torch's attributes (``dataset``, ``batch_size``,
``sampler``, ``batch_sampler``, ``collate_fn``, ``generator``...), and a
``fastload.DataLoader`` built over those same samplers loads the batches.
Iterating draws from ``loader.sampler`` / ``loader.batch_sampler`` exactly as
torch does, so the order is torch's and a framework that swaps the sampler
swaps what is loaded. Every numeric leaf comes out as a tensor, as torch's
``default_collate`` makes them.

Lightning re-creates a loader from its own class, so it keeps this engine.
accelerate's ``prepare`` wraps a new ``torch.utils.data.DataLoader`` it
builds itself (its class is written into accelerate), over its sharding
batch sampler: ``use_fastload_engine`` puts this ``DataLoader`` back under
that wrapper, over the same batch sampler and settings.

Importing this module imports torch; ``import fastload`` never does.
"""
from __future__ import annotations

import inspect
import itertools
from collections.abc import Iterator
from typing import Any, TypeVar

import torch
import torch.utils.data as _torch_data
from torch.utils.data import (
    BatchSampler,
    ChainDataset,
    ConcatDataset,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    StackDataset,
    Subset,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
    get_worker_info,
    random_split,
)

from fastload import collate as _collate
from fastload import loader as _loader
from fastload._stats import LoaderStats

__all__ = [
    "BatchSampler",
    "ChainDataset",
    "ConcatDataset",
    "DataLoader",
    "Dataset",
    "DistributedSampler",
    "IterableDataset",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "StackDataset",
    "Subset",
    "SubsetRandomSampler",
    "TensorDataset",
    "WeightedRandomSampler",
    "default_collate",
    "default_convert",
    "get_worker_info",
    "random_split",
    "use_fastload_engine",
]


def default_collate(batch: Any) -> Any:
    """torch's default_collate, computed by fastload's: tensors for every
    numeric leaf, strings kept, containers as torch makes them."""
    return _collate.arrays_to_tensors(_collate.default_collate(batch))


def default_convert(data: Any) -> Any:
    """torch's default_convert: numpy arrays and scalars become tensors."""
    return _collate.arrays_to_tensors(_collate.default_convert(data))


# Collate functions that mean "the default": fastload's own then runs, with
# its C paths in workers, and the batch's leaves become tensors.
_DEFAULTS = (default_collate, default_convert, _torch_data.default_collate,
             _torch_data.default_convert, _collate.default_collate, _collate.default_convert)


T_co = TypeVar("T_co", covariant=True)

_RANDOM_SAMPLERS = (RandomSampler, SubsetRandomSampler, WeightedRandomSampler)
# The key of a state taken with one of those that cannot be resumed, naming
# it (see state_dict).
_STATELESS_SAMPLER = "torch_stateless_sampler"


class _ResumableDraw:
    """What the engine draws from in place of one of torch's random samplers
    (exactly those types), or of torch's BatchSampler over one: the same
    draws, plus the ``state_dict`` those samplers lack. Their epoch's order
    is drawn from a generator (their own, else torch's global one) when
    their iterator starts; the state is that generator's state then, and the
    number of draws since; between ``iter()`` and the first draw, the
    generator's state now, which that draw will start from; before any
    iteration and once one ran out, no generator state: the loader's own
    state restores torch's global generator, and the next epoch draws from
    where it puts it. A resumed epoch sets the recorded state for its first
    draw, puts the caller's state back (unless it was that state already),
    and skips what was drawn: the same order, wherever it stopped."""

    def __init__(self, draws: Any, random_sampler: Any) -> None:
        self.draws = draws  # the sampler or batch sampler torch would iterate
        self._random_sampler = random_sampler
        self._start: Any = None  # the generator's state this epoch began from
        self._pending = False  # iter() was called, its first draw not made yet
        self._drawn = 0
        self._resume: tuple[Any, int] | None = None

    def _generator(self) -> torch.Generator:
        generator = self._random_sampler.generator
        return torch.default_generator if generator is None else generator

    def __iter__(self) -> Iterator[Any]:
        self._start, self._drawn, self._pending = None, 0, True
        resume, self._resume = self._resume, None
        return self._draw_epoch(resume)

    def _draw_epoch(self, resume: tuple[Any, int] | None) -> Iterator[Any]:
        generator = self._generator()
        caller = None
        if resume is not None and resume[0] is not None:
            start = torch.as_tensor(resume[0], dtype=torch.uint8)
            caller = generator.get_state()
            if torch.equal(caller, start):
                # Already there (the loader's state put torch's global
                # generator there): the draw moves it on, as it did.
                caller = None
            generator.set_state(start)
        self._start, self._drawn, self._pending = generator.get_state().tolist(), 0, False
        draws = iter(self.draws)
        try:
            head = [next(draws)]  # where torch's samplers draw their order
        except StopIteration:
            head = []
        finally:
            if caller is not None:
                generator.set_state(caller)
        for item in itertools.chain(head, draws):
            self._drawn += 1
            if resume is None or self._drawn > resume[1]:
                yield item
        self._start = None  # run out: the next iteration is a new epoch

    def __len__(self) -> int:
        return len(self.draws)

    def fresh_epoch_draws(self) -> Any:
        """What the next iteration draws when it starts a fresh epoch (the
        sampler it wraps); None while a resumed epoch is pending (for the
        epoch lookahead of fastload._lookahead)."""
        return self.draws if self._resume is None else None

    def state_dict(self) -> dict[str, Any]:
        if self._start is not None:
            return {"generator": self._start, "drawn": self._drawn}
        pending = self._generator().get_state().tolist() if self._pending else None
        return {"generator": pending, "drawn": 0}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume = (state["generator"], int(state["drawn"]))


def _resumable(draws: Any) -> Any:
    """``draws`` (a sampler or batch sampler), drawn through _ResumableDraw
    where it is one of torch's random samplers or its BatchSampler over one."""
    inner = draws.sampler if type(draws) is BatchSampler else draws
    return _ResumableDraw(draws, inner) if type(inner) in _RANDOM_SAMPLERS else draws


class DataLoader(_torch_data.DataLoader[T_co]):
    """``torch.utils.data.DataLoader`` in arguments, defaults, errors,
    attributes and ``isinstance``; fastload's engine underneath (see the
    module docstring). Also ``state_dict()``, ``load_state_dict()`` and
    ``stats()`` of ``fastload.DataLoader``."""

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Any = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Any = None,
        multiprocessing_context: Any = None,
        generator: Any = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        snapshot_every_n_steps: int = 1,
    ) -> None:
        """torch's arguments, and torchdata StatefulDataLoader's
        ``snapshot_every_n_steps`` (see fastload.DataLoader)."""
        super().__init__(
            dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn,
            pin_memory, drop_last, timeout, worker_init_fn, multiprocessing_context, generator,
            prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device, in_order=in_order)
        # torch resolved the samplers; fastload draws from those very objects.
        # An iterable dataset has none to share: fastload batches its stream.
        iterable = self._dataset_kind == _torch_data.dataloader._DatasetKind.Iterable
        if iterable:
            samplers: dict[str, Any] = {"batch_size": self.batch_size,
                                        "drop_last": self.drop_last}
        elif self.batch_sampler is not None:
            samplers = {"batch_sampler": _resumable(self.batch_sampler)}
        else:
            samplers = {"sampler": _resumable(self.sampler), "batch_size": None}
        self._fastload = _loader.DataLoader(
            dataset, num_workers=num_workers,
            collate_fn=None if self.collate_fn in _DEFAULTS else self.collate_fn,
            pin_memory=pin_memory, timeout=timeout, worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            # Without a generator torch draws the base seed from its global
            # RNG, before its RandomSampler draws: so does fastload here.
            generator=torch.default_generator if generator is None else generator,
            prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device, in_order=in_order, output="torch",
            snapshot_every_n_steps=snapshot_every_n_steps, **samplers)
        # An attribute as torch's arguments are, so that a framework that
        # rebuilds the loader from them (Lightning) keeps it.
        self.snapshot_every_n_steps = snapshot_every_n_steps

    def __iter__(self) -> Any:
        return iter(self._fastload)  # which warns when it is not sharded

    def __len__(self) -> int:
        return len(self._fastload)

    def state_dict(self) -> dict[str, Any]:
        """fastload.DataLoader's state (NOTE [ Resume contract ]). Taken in
        any case, since frameworks take it whenever a loader has one
        (accelerate on every batch, Lightning in its checkpoints). torch's
        random samplers keep no state: drawn as they are (_ResumableDraw)
        they resume exactly; a subclass of one, or a batch sampler of
        another kind over one, has the state marked so that
        ``load_state_dict`` refuses it: drawing its order again on resume
        would give other batches."""
        state = self._fastload.state_dict()
        sampler = getattr(self.batch_sampler, "sampler", self.sampler)
        if (isinstance(sampler, _RANDOM_SAMPLERS) and not hasattr(sampler, "state_dict")
                and not isinstance(self._fastload._index_sampler, _ResumableDraw)):
            state[_STATELESS_SAMPLER] = type(sampler).__name__
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if _STATELESS_SAMPLER in state:
            raise ValueError(
                f"load_state_dict() cannot resume torch's {state[_STATELESS_SAMPLER]}: it keeps "
                "no state, so a resumed run would shuffle differently; use fastload.DataLoader "
                "with shuffle=True (its samplers resume exactly) or a sampler with state_dict()")
        self._fastload.load_state_dict(state)

    def stats(self) -> LoaderStats | None:
        return self._fastload.stats()


def use_fastload_engine(prepared: Any) -> Any:
    """``prepared``, a loader from accelerate's ``prepare`` (or any wrapper
    holding a torch loader as ``base_dataloader``), loading through this
    module's ``DataLoader`` from now on: the same dataset, the same sampler or
    batch sampler (accelerate's shard of the rank), the same settings."""
    base = prepared.base_dataloader
    arguments = {name: getattr(base, name)
                 for name in inspect.signature(DataLoader.__init__).parameters
                 if name not in ("self", "shuffle") and hasattr(base, name)}
    if base.batch_sampler is not None:
        # torch refuses these beside a batch sampler; it made them from it.
        arguments.update(batch_size=1, sampler=None, drop_last=False)
    prepared.base_dataloader = DataLoader(**arguments)
    return prepared
