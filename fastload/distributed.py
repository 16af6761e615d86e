"""DistributedSampler, and how a process finds its rank and the world size."""
from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator, Sized
from typing import Any

import numpy as np

from fastload._torch import torch_if_imported
from fastload.sampler import Sampler

__all__ = ["DistributedSampler"]

# Launchers and the variables they set, in order of preference; torchrun and
# most others set RANK/WORLD_SIZE, srun sets SLURM_*.
_ENV_SOURCES = (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"))


def _torch_distributed() -> tuple[int, int] | None:
    torch = torch_if_imported()
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def _jax_distributed() -> tuple[int, int] | None:
    # Only a jax the user already imported and set up: importing or
    # initialising jax here would claim accelerators behind their back.
    jax = sys.modules.get("jax")
    is_initialized = getattr(getattr(jax, "distributed", None), "is_initialized", None)
    if callable(is_initialized) and is_initialized():
        return jax.process_index(), jax.process_count()  # type: ignore[union-attr]
    return None


def _environment() -> tuple[int, int] | None:
    for rank_var, size_var in _ENV_SOURCES:
        if rank_var in os.environ and size_var in os.environ:
            return int(os.environ[rank_var]), int(os.environ[size_var])
    return None


def discover_rank_and_world_size() -> tuple[int, int]:
    """(rank, world size) of this process: from torch.distributed if it is
    initialised, else RANK/WORLD_SIZE, else SLURM_PROCID/SLURM_NTASKS, else an
    initialised jax.distributed. ValueError when none of them says."""
    for source in (_torch_distributed, _environment, _jax_distributed):
        found = source()
        if found is not None:
            return found
    raise ValueError(
        "DistributedSampler could not find this process's rank and the world "
        "size: torch.distributed is not initialised, neither RANK/WORLD_SIZE nor "
        "SLURM_PROCID/SLURM_NTASKS is set, and jax.distributed is not "
        "initialised. Pass num_replicas= and rank= explicitly."
    )


class DistributedSampler(Sampler[int]):
    """The share of a dataset's indices that belongs to one of ``num_replicas``
    processes: every ``num_replicas``-th index starting at ``rank``.

    Without ``drop_last`` the index list is padded by repeating it from the
    start until it divides evenly, so every rank gets ``ceil(N / replicas)``;
    with ``drop_last`` the tail is cut instead. With ``shuffle`` the order is
    a permutation seeded by ``seed + epoch`` (numpy's, identical on every rank
    whether or not torch is installed); call ``set_epoch`` before each epoch.
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if num_replicas is None or rank is None:
            found_rank, found_size = discover_rank_and_world_size()
            num_replicas = found_size if num_replicas is None else num_replicas
            rank = found_rank if rank is None else rank
        if rank >= num_replicas or rank < 0:
            raise ValueError(
                f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]"
            )
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.drop_last = drop_last
        size = len(dataset)
        if drop_last and size % num_replicas != 0:
            self.num_samples = math.ceil((size - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(size / num_replicas)
        self.total_size = self.num_samples * num_replicas
        self.shuffle = shuffle
        self.seed = seed
        self._resume_at = 0
        self._current: Iterator[int] = iter(())
        self._current_len = 0

    def _indices(self) -> np.ndarray:
        size = len(self.dataset)
        if self.shuffle:
            indices = np.random.default_rng(self.seed + self.epoch).permutation(size)
        else:
            indices = np.arange(size)
        # np.resize repeats the array cyclically: torch's padding by repetition.
        indices = np.resize(indices, self.total_size) if size else indices[:0]
        return indices[self.rank : self.total_size : self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        items = self._indices().tolist()
        self._current, self._current_len = iter(items), len(items)
        if self._resume_at:
            self._current.__setstate__(self._resume_at)  # type: ignore[attr-defined]
            self._resume_at = 0
        return self._current

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration use the order of ``epoch`` (with shuffle,
        each epoch has its own permutation, the same on every rank)."""
        self.epoch = epoch

    def state_dict(self) -> dict[str, Any]:
        """The epoch and how many indices of it this rank has handed out."""
        yielded = self._current_len - self._current.__length_hint__()  # type: ignore[attr-defined]
        return {"epoch": self.epoch, "yielded": yielded}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next ``iter()`` resumes the saved epoch where it stopped."""
        self.epoch = int(state["epoch"])
        self._resume_at = int(state["yielded"])
