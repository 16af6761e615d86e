"""DistributedSampler, and how a process finds its rank and the world size.

fastload runs no cluster of its own: every rank runs its own DataLoader over
its own share of the indices, and the rank and world size come from the
engine the program already runs (torch.distributed, a launcher's environment
variables, or jax.distributed).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sized
from typing import Any

import numpy as np

from fastload._warnings import warn_at_caller
from fastload.sampler import Sampler

__all__ = ["DistributedSampler", "batches_per_rank", "discover_rank_and_world_size",
           "warn_if_not_sharded"]

# Launchers and the variables they set, in order of preference. torchrun sets
# RANK/WORLD_SIZE; srun sets SLURM_*. RANK comes first because a torchrun
# started by srun (one per node) numbers the processes, while SLURM_PROCID
# then numbers only the nodes' torchruns.
_ENV_SOURCES = (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"))

# numpy seeds must be non-negative; seed + epoch is wrapped into 64 bits, the
# way torch's manual_seed accepts negative seeds, instead of failing.
_SEED_MODULUS = 2**64


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _torch_distributed() -> tuple[int, int] | None:
    # A process group can only be initialised if torch.distributed was
    # imported, so looking in sys.modules never imports torch here.
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


_warned_not_sharded = False


def _shards(sampler: Any) -> bool:
    """Whether ``sampler`` (or the sampler a batch sampler draws from) gives
    each rank its own share: fastload's or torch's DistributedSampler, or any
    sampler that says how many replicas share the data."""
    inner = getattr(sampler, "sampler", None)
    return (isinstance(sampler, DistributedSampler) or hasattr(sampler, "num_replicas")
            or (inner is not None and inner is not sampler and _shards(inner)))


def warn_if_not_sharded(index_sampler: Any, map_style: bool) -> None:
    """Warn, once per process, when torch.distributed runs more than one rank
    and a map-style loader's indices are not split between them: every rank
    would then train on the whole dataset. (An iterable dataset shards
    itself, which cannot be seen from here.)"""
    global _warned_not_sharded
    if _warned_not_sharded or not map_style or _shards(index_sampler):
        return
    group = _torch_distributed()
    if group is None or group[1] < 2:
        return
    _warned_not_sharded = True
    warn_at_caller(
        f"torch.distributed runs {group[1]} ranks but this DataLoader's sampler is not "
        "distributed, so every rank loads the whole dataset; pass "
        "sampler=fastload.DistributedSampler(dataset) (or torch's DistributedSampler)")


def _jax_distributed() -> tuple[int, int] | None:
    # Only a jax the user already imported and initialised: importing jax, or
    # asking an uninitialised one for its process count, would start its
    # backends and claim the accelerators behind the user's back.
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    is_initialized = getattr(getattr(jax, "distributed", None), "is_initialized", None)
    if callable(is_initialized):
        initialised = bool(is_initialized())
    else:
        # jax before jax.distributed.is_initialized(): the distributed client
        # exists exactly when jax.distributed.initialize() has run.
        state = getattr(sys.modules.get("jax._src.distributed"), "global_state", None)
        initialised = getattr(state, "client", None) is not None
    if initialised:
        return int(jax.process_index()), int(jax.process_count())
    return None


def _environment() -> tuple[int, int] | None:
    for rank_var, size_var in _ENV_SOURCES:
        rank_text, size_text = os.environ.get(rank_var), os.environ.get(size_var)
        if rank_text is None and size_text is None:
            continue
        if rank_text is None or size_text is None:
            present, missing = (size_var, rank_var) if rank_text is None else (rank_var, size_var)
            raise ValueError(
                f"{present} is set in the environment but {missing} is not; a launcher "
                f"sets both. Set {missing}, unset {present}, or pass num_replicas= and "
                "rank= to DistributedSampler explicitly."
            )
        return _parse_env_int(rank_var, rank_text), _parse_env_int(size_var, size_text)
    return None


def _parse_env_int(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(
            f"environment variable {name}={text!r} is not an integer"
        ) from None


def discover_rank_and_world_size() -> tuple[int, int]:
    """``(rank, world_size)`` of this process, from the first of these that
    knows them:

    1. torch.distributed, when its default process group is initialised;
    2. the environment variables ``RANK`` and ``WORLD_SIZE`` (torchrun and
       most launchers), then ``SLURM_PROCID`` and ``SLURM_NTASKS`` (srun);
    3. ``jax.process_index()`` and ``jax.process_count()``, when jax is
       imported and ``jax.distributed.initialize()`` has run.

    Raises ValueError when none of them does, when only one variable of a
    pair is set, or when a variable is not an integer.
    """
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


def _samples_per_rank(dataset_len: int, num_replicas: int, drop_last: bool) -> int:
    # Integer arithmetic (torch uses float division, which rounds wrongly
    # beyond 2**53): with drop_last the tail that does not divide evenly is
    # cut, otherwise the last rank's share is padded up.
    if drop_last:
        return dataset_len // num_replicas
    return -(-dataset_len // num_replicas)


def _check_count(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int; TypeError when it is not an integer, ValueError
    when it is below ``minimum``."""
    if not _is_int(value):
        raise TypeError(f"{name} should be an integer, but got {name}={value!r}")
    if value < minimum:
        kind = "a positive" if minimum == 1 else "a non-negative"
        raise ValueError(f"{name} should be {kind} integer value, but got {name}={value}")
    return int(value)


def batches_per_rank(
    dataset_len: int,
    num_replicas: int,
    batch_size: int,
    drop_last: bool = False,
    sampler_drop_last: bool = False,
) -> int:
    """How many batches one epoch yields on each rank of a
    ``DataLoader(dataset, batch_size=batch_size, drop_last=drop_last,
    sampler=DistributedSampler(dataset, num_replicas, rank,
    drop_last=sampler_drop_last))``; it is ``len()`` of that loader.

    Every rank gets the same number of indices, so every rank yields the
    same number of batches, and collective operations stay in step:

    * indices per rank: ``ceil(dataset_len / num_replicas)`` (the last
      ranks' shares padded with indices repeated from the start of the
      epoch's order), or ``floor(dataset_len / num_replicas)`` with
      ``sampler_drop_last`` (the tail that does not divide evenly cut off);
    * batches per rank: ``ceil(indices / batch_size)`` (the last batch
      possibly short), or ``floor(indices / batch_size)`` with ``drop_last``.

    Raises TypeError for a non-integer argument, ValueError for a negative
    ``dataset_len`` or a ``num_replicas`` or ``batch_size`` below 1.
    """
    dataset_len = _check_count("dataset_len", dataset_len, 0)
    num_replicas = _check_count("num_replicas", num_replicas, 1)
    batch_size = _check_count("batch_size", batch_size, 1)
    samples = _samples_per_rank(dataset_len, num_replicas, bool(sampler_drop_last))
    if drop_last:
        return samples // batch_size
    return -(-samples // batch_size)


class DistributedSampler(Sampler[int]):
    """The share of a dataset's indices that belongs to one of
    ``num_replicas`` processes, with the arguments and partition of
    ``torch.utils.data.DistributedSampler``.

    Each epoch orders the indices (a permutation seeded by ``seed + epoch``
    with ``shuffle``, else ``0 .. N-1``), pads the order by repeating it from
    its start until it divides evenly (or, with ``drop_last``, cuts the tail
    instead), and gives rank ``r`` every ``num_replicas``-th index starting at
    ``r``. The permutation is numpy's, so it is the same on every rank with or
    without torch installed (it is not torch.randperm's). Call
    ``set_epoch(epoch)`` before each epoch, or every epoch has epoch 0's order.

    ``num_replicas`` and ``rank`` default to what
    ``discover_rank_and_world_size()`` finds. The dataset's length is assumed
    not to change, as in torch.

    ``state_dict()`` is the epoch and this rank's position in it;
    ``load_state_dict()`` resumes there in O(1) (see ``state_dict``).
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
        num_replicas = _check_count("num_replicas", num_replicas, 1)
        if not _is_int(rank):
            raise TypeError(f"rank should be an integer, but got rank={rank!r}")
        if rank >= num_replicas or rank < 0:
            raise ValueError(
                f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]"
            )
        if not _is_int(seed):
            raise TypeError(f"seed should be an integer, but got seed={seed!r}")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = int(rank)
        self.epoch = 0
        self.drop_last = drop_last
        self.shuffle = shuffle
        self.seed = int(seed)
        self._dataset_len = len(dataset)
        self.num_samples = _samples_per_rank(self._dataset_len, num_replicas, bool(drop_last))
        self.total_size = self.num_samples * num_replicas
        # The position: the list iterator of the latest iteration, its length
        # and its epoch (None once it ran out); and a loaded (epoch, position)
        # waiting for the next iter().
        self._current: Iterator[int] = iter(())
        self._current_len = 0
        self._current_epoch: int | None = None
        self._resume: tuple[int, int] | None = None

    def _shard(self) -> list[int]:
        """This rank's indices for the current epoch."""
        size = len(self.dataset)
        # Like torch: a dataset that shrank is padded, and one that grew is
        # cut with drop_last; one that emptied, or grew without drop_last
        # (going on would drop samples silently), fails, here with a message.
        if size != self._dataset_len and (size == 0 or (size > self._dataset_len
                                                        and not self.drop_last)):
            raise RuntimeError(
                f"the dataset has {size} samples but had {self._dataset_len} when this "
                "DistributedSampler was built; build a new sampler for the new dataset"
            )
        if self.shuffle:
            rng = np.random.default_rng((self.seed + self.epoch) % _SEED_MODULUS)
            order = rng.permutation(size)
        else:
            order = np.arange(size)
        # np.resize repeats the order from its start as often as needed (also
        # when the padding is longer than the dataset) or cuts its tail:
        # torch's padding and drop_last in one step.
        order = np.resize(order, self.total_size)
        shard: list[int] = order[self.rank : self.total_size : self.num_replicas].tolist()
        return shard

    def __iter__(self) -> Iterator[int]:
        # The shard is computed now, as torch does, so a set_epoch after
        # iter() does not change an iteration already started.
        shard = self._shard()
        current = iter(shard)
        resume, self._resume = self._resume, None
        if resume is not None and resume[0] == self.epoch:
            current.__setstate__(resume[1])  # type: ignore[attr-defined]
        self._current, self._current_len, self._current_epoch = current, len(shard), self.epoch
        return self._run(current)

    # What BatchSampler looks for: this class's __iter__ sets its iteration
    # up at once (a subclass that replaces __iter__ is not known to).
    _iteration_starts_at_iter = __iter__

    def _run(self, current: Iterator[int]) -> Iterator[int]:
        yield from current
        # Ran out: the next iter() starts an epoch from the beginning, and the
        # state must say so (a DataLoader may take it before that iter()).
        if self._current is current:
            self._current_epoch = None

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration use the order of ``epoch`` (with shuffle,
        each epoch has its own permutation, the same on every rank). A
        position loaded with ``load_state_dict`` for another epoch is not
        applied to this one."""
        if not _is_int(epoch):
            raise TypeError(f"epoch should be an integer, but got epoch={epoch!r}")
        self.epoch = int(epoch)

    def _layout(self) -> dict[str, Any]:
        """What a position is only valid under."""
        return {"num_replicas": self.num_replicas, "dataset_length": self._dataset_len,
                "shuffle": bool(self.shuffle), "seed": self.seed,
                "drop_last": bool(self.drop_last)}

    def state_dict(self) -> dict[str, Any]:
        """What the next index from this sampler will be: the epoch and how
        many of this rank's indices of it were handed out. After an epoch
        ran out, or after ``set_epoch`` chose another one, that is 0.

        The position does not depend on the rank (every rank hands out the
        same number of indices), so a state also fits the other ranks."""
        resume = self._resume
        if resume is not None and resume[0] == self.epoch:
            yielded = resume[1]
        elif self._current_epoch == self.epoch:
            yielded = self._current_len - self._current.__length_hint__()  # type: ignore[attr-defined]
        else:
            yielded = 0
        return {"epoch": self.epoch, "yielded": yielded, **self._layout()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the epoch of a ``state_dict()``; the next ``iter()``
        continues that epoch where it stopped, without replaying it, unless
        ``set_epoch`` picks another epoch first. Raises ValueError for a state
        of a sampler with another world size, dataset length, shuffle, seed
        or drop_last, whose position would select other indices."""
        layout = self._layout()
        differences = [f"{key} is {value!r} here but {state.get(key)!r} in the state"
                       for key, value in layout.items() if state.get(key) != value]
        if differences:
            raise ValueError("cannot load this DistributedSampler state: "
                             + "; ".join(differences))
        self.epoch = int(state["epoch"])
        self._resume = (self.epoch, int(state["yielded"]))
