"""torch's DataPipes (``IterDataPipe``, ``MapDataPipe``) loaded as torch
loads them: the loader's ``shuffle`` switches their shufflers, every loader
process or thread shards the pipe with ``sharding_filter`` by its worker id
(and rank, under torch.distributed), and the shufflers of every worker get
the same seed, so that the shards split one shuffled order.

An ``IterDataPipe``'s seed is drawn as torch draws its shared seed: from
the loader's generator (torch's global RNG for ``fastload.torch`` without
one) when an iterator starts and at each later epoch of persistent workers,
so the shuffle orders are torch's, and a checkpoint keeps the epoch's seed.
A ``MapDataPipe``, which torch leaves unseeded, and a state saved before
fastload kept that seed, get one derived from the base seed and the epoch.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from fastload._torch import torch_if_imported


def is_iter_datapipe(dataset: Any) -> bool:
    """Whether ``dataset`` is an ``IterDataPipe``: the pipes torch seeds."""
    torch = torch_if_imported()
    return torch is not None and isinstance(dataset, torch.utils.data.IterDataPipe)


def epoch_seed(pipe_seed: int | None, base_seed: int, epoch: int) -> int:
    """The seed of an epoch's shufflers: the drawn ``pipe_seed``, or one
    derived from the base seed and the epoch when none was drawn."""
    if pipe_seed is not None:
        return pipe_seed
    return int(np.random.SeedSequence([base_seed, epoch]).generate_state(1, np.uint64)[0]) >> 1


def is_datapipe(dataset: Any) -> bool:
    """Whether ``dataset`` is one of torch's DataPipes (torch is then loaded)."""
    torch = torch_if_imported()
    if torch is None:
        return False
    data = torch.utils.data
    return isinstance(dataset, (data.IterDataPipe, data.MapDataPipe))


def apply_shuffle(dataset: Any, shuffle: bool | None) -> Any:
    """The pipe with its shufflers switched by the loader's ``shuffle`` (None:
    as the pipe says)."""
    if shuffle is None:
        return dataset
    from torch.utils.data import graph_settings
    return graph_settings.apply_shuffle_settings(dataset, shuffle=shuffle)


def prepare(dataset: Any, seed: int, num_workers: int, worker_id: int) -> None:
    """Before a loader process or thread iterates the pipe for an epoch:
    shard it for this worker and seed its shufflers with the epoch's
    ``seed`` (``epoch_seed``)."""
    import torch
    from torch.utils.data import graph_settings
    world_size, rank = 1, 0
    distributed = torch.distributed
    if distributed.is_available() and distributed.is_initialized():
        world_size, rank = distributed.get_world_size(), distributed.get_rank()
    # Across ranks first, then across each rank's workers, as torch shards.
    graph_settings.apply_sharding(dataset, max(num_workers, 1) * world_size,
                                  worker_id * world_size + rank)
    graph_settings.apply_random_seed(dataset, torch.Generator().manual_seed(seed))
