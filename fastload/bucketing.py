"""Batch samplers that group samples by length: less padding, or packing.

NOTE [ Length-aware epochs ]

An epoch of a length-aware batch sampler is computed whole when it starts,
from three things only:

1. the inner sampler's indices for the epoch (a RandomSampler's permutation,
   a DistributedSampler's share of this rank, ...), read in one pass;
2. ``lengths`` (an array, or a callable evaluated once and cached): the
   indices are cut into buckets of ``bucket_size`` consecutive ones, each
   bucket is grouped (sorted by length and cut into batches, or packed
   into bins of ``max_tokens``). This grouping is deterministic: no random
   draw, so any process can recompute it;
3. with ``shuffle``, one seed drawn from ``generator`` that orders the
   batches.

The state is therefore the inner sampler's state at the epoch's start, the
seed, and the number of batches handed out. Resuming loads the inner state,
recomputes the same epoch and skips into it: no sample is fetched again and
no batch is replayed.

Under a DistributedSampler, every rank groups its own share, and when the
number of batches depends on the lengths (``max_tokens``, packing) the
ranks would disagree, and a collective would wait forever on the rank with
fewer batches. Since step 2 is deterministic, each rank also groups the
other ranks' shares (the DistributedSampler computes any rank's share), and
the ranks below the largest count split their largest batches in two until
they reach it. A half of a batch holds no more tokens than the batch did,
so the budget still holds; every rank has as many indices as the others,
so the largest count never exceeds what splitting can reach.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Union

import numpy as np

from fastload import _seed
from fastload._lookahead import _global_rngs_kept
from fastload._progress import sampler_state
from fastload._seed import GeneratorArg
from fastload.distributed import DistributedSampler
from fastload.errors import InvalidArgumentError
from fastload.sampler import Sampler, SequentialSampler
from fastload_c import ragged

__all__ = ["BucketBatchSampler", "PackedBatchSampler"]

LengthsArg = Union[Sequence[int], np.ndarray, Callable[[], Any]]
# Samples grouped together when bucket_size is not given: enough that sorting
# them leaves little padding, few enough that a bucket's batches still mix
# samples from across the epoch once shuffled.
_DEFAULT_BUCKET_SIZE = 4096
_STRATEGIES = ("first_fit", "best_fit")
# Inner samplers whose iteration yields the same indices every time and moves
# nothing, so len() may iterate them without a state to put back.
_REITERABLE = (SequentialSampler, range, list, tuple, np.ndarray)


def _positive_int(name: str, value: Any, owner: str) -> int:
    if (not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_))
            or value < 1):
        raise InvalidArgumentError(
            f"{owner}: {name} should be a positive integer, got {name}={value!r}")
    return int(value)


class _LengthBatchSampler(Sampler[list[int]]):
    """What both samplers share: lengths, the epoch as NOTE [ Length-aware
    epochs ] computes it, its state, and the equal counts across ranks.
    Subclasses define ``_group(indices, lengths)``, the batches of one
    bucket, and ``_fixed_count``, True when the number of batches depends on
    the number of indices alone."""

    _fixed_count = False

    def __init__(self, sampler: Sampler[int] | Iterable[int], lengths: LengthsArg,
                 bucket_size: int | None, shuffle: bool, generator: GeneratorArg) -> None:
        owner = type(self).__name__
        if not isinstance(shuffle, bool):
            raise InvalidArgumentError(f"{owner}: shuffle should be a bool, got {shuffle!r}")
        self.sampler = sampler
        self.bucket_size = (_DEFAULT_BUCKET_SIZE if bucket_size is None
                            else _positive_int("bucket_size", bucket_size, owner))
        self.shuffle = shuffle
        self._rng = _seed.resolve_generator(generator)
        self._lengths_source = lengths
        self._lengths: np.ndarray | None = None
        if not callable(lengths):
            self._lengths = self._checked_lengths(lengths)
        # The epoch in progress: its batches, the iterator over them, the
        # inner sampler's state at its start and its shuffle seed; and a
        # loaded (inner state, seed, batches handed out) for the next iter().
        self._batches: list[list[int]] | None = None
        self._current: Iterator[list[int]] = iter(())
        self._epoch_sampler_state: Any = None
        self._token: int | None = None
        self._resume: tuple[Any, int | None, int] | None = None

    @property
    def lengths(self) -> np.ndarray:
        """Every dataset index's length, int64; a callable given as
        ``lengths`` is called the first time they are needed, once."""
        if self._lengths is None:
            self._lengths = self._checked_lengths(self._lengths_source())  # type: ignore[operator]
        return self._lengths

    def _checked_lengths(self, values: Any) -> np.ndarray:
        owner = type(self).__name__
        lengths = np.asarray(values)
        if lengths.ndim != 1 or (lengths.size and lengths.dtype.kind not in "iu"):
            raise InvalidArgumentError(
                f"{owner}: lengths should be a 1-d sequence of integers (one per dataset "
                f"index), got {lengths.dtype} of shape {lengths.shape}")
        lengths = lengths.astype(np.int64)
        if lengths.size and lengths.min() < 0:
            index = int(np.argmin(lengths))
            raise InvalidArgumentError(
                f"{owner}: lengths[{index}] is {lengths[index]}; lengths cannot be negative")
        self._check_lengths(lengths)
        return lengths

    def _check_lengths(self, lengths: np.ndarray) -> None:
        """What a subclass requires of every length (fitting a budget)."""

    def _group(self, indices: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
        raise NotImplementedError

    def _plan(self, indices: np.ndarray) -> list[np.ndarray]:
        """The epoch's batches before shuffling, bucket after bucket."""
        lengths = self.lengths
        bad = np.flatnonzero((indices < 0) | (indices >= len(lengths)))
        if bad.size:
            raise InvalidArgumentError(
                f"{type(self).__name__}: the sampler yielded index {indices[bad[0]]} but "
                f"lengths has {len(lengths)} entries")
        batches: list[np.ndarray] = []
        for start in range(0, len(indices), self.bucket_size):
            bucket = indices[start:start + self.bucket_size]
            batches.extend(self._group(bucket, lengths[bucket]))
        return batches

    def _epoch(self, indices: np.ndarray, token: int | None) -> list[list[int]]:
        batches = self._plan(indices)
        sampler = self.sampler
        if (not self._fixed_count and isinstance(sampler, DistributedSampler)
                and sampler.num_replicas > 1):
            batches = _split_to(batches, self._largest_count_of_ranks(sampler, len(batches)))
        if token is not None:
            order = np.random.default_rng(token).permutation(len(batches))
            batches = [batches[i] for i in order.tolist()]
        return [batch.tolist() for batch in batches]

    def _largest_count_of_ranks(self, sampler: DistributedSampler, own_count: int) -> int:
        """The most batches any rank's share groups into (NOTE [ Length-aware
        epochs ]); the shares come from copies, so the sampler's own
        position is not touched."""
        counts = [own_count]
        for rank in range(sampler.num_replicas):
            if rank == sampler.rank:
                continue
            other = copy.copy(sampler)
            other.rank = rank
            counts.append(len(self._plan(np.asarray(other._shard(), dtype=np.int64))))
        return max(counts)

    def _inner_indices(self) -> np.ndarray:
        return np.fromiter(iter(self.sampler), dtype=np.int64)

    def __iter__(self) -> Iterator[list[int]]:
        if self._resume is not None:
            inner_state, token, skip = self._resume
            self._resume = None
            if inner_state is not None:
                self.sampler.load_state_dict(inner_state)  # type: ignore[union-attr]
        else:
            inner_state, skip = sampler_state(self.sampler), 0
            token = _seed.draw_seed(self._own_rng()) if self.shuffle else None
        batches = self._epoch(self._inner_indices(), token)
        current = iter(batches)
        if skip:
            current.__setstate__(skip)  # type: ignore[attr-defined]
        self._batches, self._current = batches, current
        self._epoch_sampler_state, self._token = inner_state, token
        yield from current
        if self._current is current:
            # Ran out: a state taken now says that a new epoch comes next.
            self._batches = None

    def set_epoch(self, epoch: int) -> None:
        """Pass ``epoch`` on to the inner sampler (a DistributedSampler's
        ``set_epoch``), for training loops that call it on the batch sampler."""
        set_epoch = getattr(self.sampler, "set_epoch", None)
        if set_epoch is None:
            raise AttributeError(
                f"{type(self).__name__}.set_epoch: the inner {type(self.sampler).__name__} "
                "has no set_epoch")
        set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The inner sampler's state at the epoch's start, the epoch's shuffle
        seed and the batches handed out; outside an epoch, what the next one
        starts from."""
        if self._resume is not None:
            inner_state, token, yielded = self._resume
            in_epoch = True
        elif self._batches is not None:
            inner_state, token = self._epoch_sampler_state, self._token
            yielded = len(self._batches) - self._current.__length_hint__()  # type: ignore[attr-defined]
            in_epoch = True
        else:
            inner_state, token, yielded, in_epoch = sampler_state(self.sampler), None, 0, False
        # Seeded now if not yet: a state taken before the first epoch then
        # fixes the epochs after it too.
        generator = _seed.generator_state(self._own_rng()) if self.shuffle else None
        return {"generator": generator, "sampler": inner_state,
                "in_epoch": in_epoch, "epoch": token, "yielded": yielded}

    def _own_rng(self) -> Any:
        """The generator the epochs' seeds come from: without ``generator``,
        one of its own, seeded once from numpy's global RNG, whose state a
        checkpoint holds (NOTE [ Determinism contract ] in fastload._seed)."""
        self._rng = _seed.own_generator(self._rng)
        return self._rng

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict()``: the next ``iter()`` continues its epoch
        where it stopped (exactly so when the inner sampler keeps a state or
        is deterministic), and later epochs follow as they would have."""
        self._rng = _seed.restored_generator(self._rng, state["generator"])
        self._batches = None
        if state["in_epoch"]:
            self._resume = (state["sampler"], state["epoch"], int(state["yielded"]))
        else:
            self._resume = None
            if state["sampler"] is not None:
                self.sampler.load_state_dict(state["sampler"])  # type: ignore[union-attr]

    def __len__(self) -> int:
        if self._batches is not None:
            return len(self._batches)
        return self._next_epoch_size()

    def _next_epoch_size(self) -> int:
        """How many batches the next ``iter()`` yields in all, computed on
        the inner sampler, which is then put back as it was."""
        if self._resume is not None and self._resume[0] is not None:
            self.sampler.load_state_dict(self._resume[0])  # type: ignore[union-attr]
        saved = sampler_state(self.sampler)
        if saved is None and not isinstance(self.sampler, _REITERABLE):
            raise TypeError(
                f"len() of a {type(self).__name__} depends on the lengths of the next epoch's "
                f"samples, and the inner {type(self.sampler).__name__} has no state_dict() to "
                "compute that epoch without moving on")
        with _global_rngs_kept():
            indices = self._inner_indices()
        if saved is not None:
            self.sampler.load_state_dict(saved)  # type: ignore[union-attr]
        return len(self._epoch(indices, None))


def _split_to(batches: list[np.ndarray], count: int) -> list[np.ndarray]:
    """``batches`` with the largest (first of the largest) repeatedly split in
    halves, kept in place, until there are ``count``."""
    batches = list(batches)
    while len(batches) < count:
        sizes = [len(batch) for batch in batches]
        largest = int(np.argmax(sizes))
        batch = batches[largest]
        half = (len(batch) + 1) // 2
        batches[largest:largest + 1] = [batch[:half], batch[half:]]
    return batches


class BucketBatchSampler(_LengthBatchSampler):
    """Batches of indices of similar length: each bucket of ``bucket_size``
    consecutive indices of ``sampler`` is sorted by length (stable) and cut
    into batches, either of ``batch_size`` indices or, with ``max_tokens``, as
    many as fit ``len(batch) * longest length <= max_tokens`` (the padded
    size). With ``shuffle`` the epoch's batches come in a random order drawn
    from ``generator``; the randomness of which indices share a bucket is the
    inner sampler's (a RandomSampler or a shuffling DistributedSampler).

    ``lengths[i]`` is the length of dataset index ``i`` (an array, or a
    callable returning one, called once). By count, ``bucket_size`` must be
    a multiple of ``batch_size`` (its default, 4096, is rounded up to one),
    so the epoch has as many batches as ``BatchSampler`` would make, the last
    one short unless ``drop_last``. Under a DistributedSampler every rank
    yields as many batches (NOTE [ Length-aware epochs ]).
    """

    def __init__(self, sampler: Sampler[int] | Iterable[int], lengths: LengthsArg,
                 batch_size: int | None = None, max_tokens: int | None = None,
                 bucket_size: int | None = None, shuffle: bool = True,
                 drop_last: bool = False, generator: GeneratorArg = None) -> None:
        owner = "BucketBatchSampler"
        if (batch_size is None) == (max_tokens is None):
            raise InvalidArgumentError(
                f"{owner}: give exactly one of batch_size and max_tokens")
        if not isinstance(drop_last, bool):
            raise InvalidArgumentError(f"{owner}: drop_last should be a bool, got {drop_last!r}")
        if drop_last and max_tokens is not None:
            raise InvalidArgumentError(
                f"{owner}: drop_last applies to batches of batch_size; batches of max_tokens "
                "have no fixed size to fall short of")
        self.batch_size = None if batch_size is None else _positive_int(
            "batch_size", batch_size, owner)
        self.max_tokens = None if max_tokens is None else _positive_int(
            "max_tokens", max_tokens, owner)
        self.drop_last = drop_last
        self._fixed_count = self.batch_size is not None
        if self.batch_size is not None:
            if bucket_size is None:
                bucket_size = -(-_DEFAULT_BUCKET_SIZE // self.batch_size) * self.batch_size
            elif _positive_int("bucket_size", bucket_size, owner) % self.batch_size:
                raise InvalidArgumentError(
                    f"{owner}: bucket_size={bucket_size} should be a multiple of "
                    f"batch_size={self.batch_size}, so that only the epoch's last batch is short")
        super().__init__(sampler, lengths, bucket_size, shuffle, generator)

    def _check_lengths(self, lengths: np.ndarray) -> None:
        _check_budget(lengths, self.max_tokens, "BucketBatchSampler")

    def _group(self, indices: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
        order = np.argsort(lengths, kind="stable")
        indices, lengths = indices[order], lengths[order]
        if self.batch_size is not None:
            size = self.batch_size
            return [indices[start:start + size] for start in range(0, len(indices), size)]
        assert self.max_tokens is not None
        # Ascending lengths: a batch from `start` costs (count) * (its last
        # length), which only grows with the count, so its end is one
        # searchsorted over the few candidates the budget allows.
        cost_lengths = np.maximum(lengths, 1)
        batches, start = [], 0
        while start < len(indices):
            window = cost_lengths[start:start + self.max_tokens // int(cost_lengths[start])]
            costs = np.arange(1, len(window) + 1) * window
            stop = start + int(np.searchsorted(costs, self.max_tokens, side="right"))
            batches.append(indices[start:stop])
            start = stop
        return batches

    def _epoch(self, indices: np.ndarray, token: int | None) -> list[list[int]]:
        batches = super()._epoch(indices, token)
        if self.drop_last and self.batch_size is not None:
            batches = [batch for batch in batches if len(batch) == self.batch_size]
        return batches

    def __len__(self) -> int:
        if self.batch_size is None:
            return super().__len__()
        size = len(self.sampler)  # type: ignore[arg-type]
        if self.drop_last:
            return size // self.batch_size
        return -(-size // self.batch_size)


def _check_budget(lengths: np.ndarray, max_tokens: int | None, owner: str) -> None:
    if max_tokens is None or not lengths.size:
        return
    longest = int(np.argmax(lengths))
    if lengths[longest] > max_tokens:
        raise InvalidArgumentError(
            f"{owner}: index {longest} has length {lengths[longest]}, more than "
            f"max_tokens={max_tokens}; no batch could hold it")


class PackedBatchSampler(_LengthBatchSampler):
    """Groups of indices whose lengths add up to at most ``max_tokens``, for
    ``pack_collate``: each bucket of ``bucket_size`` consecutive indices of
    ``sampler`` is packed into bins, in the sampler's order, each index into
    the first bin it fits (``strategy="first_fit"``) or the fullest bin it
    fits (``"best_fit"``, less room left over), a new bin when none has room.
    With ``shuffle`` the bins come in a random order drawn from
    ``generator``. ``lengths`` as for BucketBatchSampler; a sample longer
    than ``max_tokens`` is an error. Under a DistributedSampler every rank
    yields as many batches (NOTE [ Length-aware epochs ]).
    """

    def __init__(self, sampler: Sampler[int] | Iterable[int], lengths: LengthsArg,
                 max_tokens: int, strategy: str = "best_fit", bucket_size: int | None = None,
                 shuffle: bool = True, generator: GeneratorArg = None) -> None:
        owner = "PackedBatchSampler"
        self.max_tokens = _positive_int("max_tokens", max_tokens, owner)
        if strategy not in _STRATEGIES:
            raise InvalidArgumentError(
                f"{owner}: strategy should be one of {_STRATEGIES}, got {strategy!r}")
        self.strategy = strategy
        super().__init__(sampler, lengths, bucket_size, shuffle, generator)

    def _check_lengths(self, lengths: np.ndarray) -> None:
        _check_budget(lengths, self.max_tokens, "PackedBatchSampler")

    def _group(self, indices: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
        bin_of, count = ragged.pack_bins(lengths, self.max_tokens, self.strategy == "best_fit")
        # Each bin's indices in the order they were packed, bins in the order
        # they opened.
        members = indices[np.argsort(bin_of, kind="stable")]
        return np.split(members, np.cumsum(np.bincount(bin_of, minlength=count))[:-1])

