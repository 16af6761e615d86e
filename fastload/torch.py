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

from fastload import _output
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
    "StatefulDataLoader",
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
    numeric leaf (promoted by torch's rules where samples differ in dtype),
    strings kept, containers as torch makes them."""
    return _output.arrays_to_tensors(_collate.default_collate_torch_rules(batch))


def default_convert(data: Any) -> Any:
    """torch's default_convert: numpy arrays and scalars become tensors."""
    return _output.arrays_to_tensors(_collate.default_convert_torch_rules(data))


def _as_torchs_own(collate_fn: Any) -> Any:
    """This module's and fastload's default collate and convert stand for
    torch's, which fastload.DataLoader runs as its own, by torch's rules,
    with its C paths in workers and tensors out (collate.engine_collation).
    Any other collate_fn's result is left as it made it, as torch leaves it."""
    if collate_fn in (default_collate, _collate.default_collate):
        return _torch_data.default_collate
    if collate_fn in (default_convert, _collate.default_convert):
        return _torch_data.default_convert
    return collate_fn


T_co = TypeVar("T_co", covariant=True)


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
        worker_method: str = "multiprocessing",
        snapshot_every_n_steps: int = 1,
        prefetch_next_epoch: bool = False,
    ) -> None:
        """torch's arguments, ``worker_method`` (torch's thread workers,
        experimental in torch and not in 2.13's signature: fastload's
        here), torchdata StatefulDataLoader's ``snapshot_every_n_steps``,
        and fastload's ``prefetch_next_epoch`` (see fastload.DataLoader)."""
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
            samplers = {"batch_sampler": self.batch_sampler}
        else:
            samplers = {"sampler": self.sampler, "batch_size": None}
        self._fastload = _loader.DataLoader(
            dataset, num_workers=num_workers, collate_fn=_as_torchs_own(self.collate_fn),
            pin_memory=pin_memory, timeout=timeout, worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            # Without a generator torch draws the base seed from its global
            # RNG, before its RandomSampler draws: so does fastload here.
            generator=torch.default_generator if generator is None else generator,
            prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device, in_order=in_order,
            worker_method=worker_method, snapshot_every_n_steps=snapshot_every_n_steps,
            prefetch_next_epoch=prefetch_next_epoch, **samplers)
        # Attributes as torch's arguments are, so that a framework that
        # rebuilds the loader from them (Lightning) keeps them.
        self.worker_method = worker_method
        self.snapshot_every_n_steps = snapshot_every_n_steps
        self.prefetch_next_epoch = prefetch_next_epoch

    def __iter__(self) -> Any:
        return iter(self._fastload)  # which warns when it is not sharded

    def __len__(self) -> int:
        return len(self._fastload)

    def enumerate(self, start: int = 0) -> Any:
        """torchdata StatefulDataLoader's: see fastload.DataLoader.enumerate."""
        return self._fastload.enumerate(start)

    def state_dict(self) -> dict[str, Any]:
        """fastload.DataLoader's state (NOTE [ Resume contract ]). Taken in
        any case, since frameworks take it whenever a loader has one
        (accelerate on every batch, Lightning in its checkpoints)."""
        return self._fastload.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._fastload.load_state_dict(state)

    def stats(self) -> LoaderStats | None:
        return self._fastload.stats()


# torchdata's name: this loader has its state_dict, load_state_dict,
# snapshot_every_n_steps and enumerate.
StatefulDataLoader = DataLoader


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
