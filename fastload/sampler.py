"""Samplers: which indices a DataLoader fetches, and in which order."""
from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from typing import Any, Generic, TypeGuard, TypeVar

import numpy as np

from fastload import _seed
from fastload._epoch_pieces import (
    Chunk,
    DrawnAhead,
    LazyState,
    batch_state,
    batched_epoch_state,
    epoch_state,
    joined,
    pieces,
    recorded,
)
from fastload._seed import GeneratorArg
from fastload._torch import is_torch_generator

__all__ = [
    "BatchSampler",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "SubsetRandomSampler",
    "WeightedRandomSampler",
]

T_co = TypeVar("T_co", covariant=True)


def _is_positive_int(value: Any) -> bool:
    return bool(
        isinstance(value, (int, np.integer))
        and not isinstance(value, (bool, np.bool_))
        and value > 0
    )


class Sampler(Generic[T_co]):
    """Base class of samplers.

    A subclass provides ``__iter__`` over dataset indices (or over lists of
    indices, for a batch sampler) and usually ``__len__``. There is no default
    ``__len__`` on purpose: ``list(sampler)`` must fall back to iteration for
    a subclass that has none, which a raising default would prevent.
    """

    def __iter__(self) -> Iterator[T_co]:
        raise NotImplementedError


class SequentialSampler(Sampler[int]):
    """Indices ``0 .. len(data_source) - 1``, in order, every epoch."""

    data_source: Sized

    def __init__(self, data_source: Sized) -> None:
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class _InfiniteConstantSampler(Sampler[None]):
    """The sampler of an iterable dataset: the dataset decides what comes
    next, so the sampler only says "one more", forever."""

    def __iter__(self) -> Iterator[None]:
        while True:
            yield None


def lazy_state_getter(sampler: Any) -> Callable[[], LazyState] | None:
    """For fastload's random samplers (and its BatchSampler over one) whose
    state_dict is theirs: what gives the sampler's state as a LazyState;
    None for any other sampler."""
    batched = type(sampler) is BatchSampler
    inner = sampler.sampler if batched else sampler
    if not isinstance(inner, _EpochSampler) or type(inner).state_dict is not _EpochSampler.state_dict:
        return None
    return functools.partial(inner._lazy_state, batched_epoch_state if batched else epoch_state)


class _EpochSampler(Sampler[int]):
    """Base of the random samplers (see NOTE [ Determinism contract ] in _seed).

    An epoch is a token taken when iteration starts (a seed drawn from the
    generator, or a torch.Generator's state) and index chunks computed from
    that token alone. The sampler tracks how many indices it handed out, so
    ``state_dict()`` is a few numbers and ``load_state_dict()`` resumes
    mid-epoch by recomputing the epoch's chunks and skipping into them.
    Subclasses define ``_epoch_chunks(rng)``.

    The position describes the most recently started iterator over this
    sampler, which is the DataLoader's; once that iterator has run out, the
    state says that the next iteration starts a new epoch.
    """

    _generator: GeneratorArg = None
    _rng: _seed.Rng = None
    _token: Any = None
    _resume: tuple[Any, int] | None = None
    _done = 0
    _chunk_len = 0
    _current: Iterator[Any] = iter(())
    _items: Any = ()  # what _current walks
    # The generator's state while this epoch draws no more from it: read
    # once, not at every state_dict() (a DataLoader takes one per batch,
    # and a torch.Generator's state is 5 KB to copy out). None: read anew.
    _generator_state: Any = None
    # The next epoch's chunks as a lookahead's copy drew them, and whether
    # this sampler is such a copy (NOTE [ Epoch lookahead ]): the sampler
    # then takes them instead of drawing them again.
    _drawn_ahead: DrawnAhead | None = None
    _draws_ahead = False

    @property
    def generator(self) -> GeneratorArg:
        return self._generator

    @generator.setter
    def generator(self, value: GeneratorArg) -> None:
        # An int seed becomes one numpy Generator here, so that successive
        # epochs continue its stream instead of restarting it.
        self._rng = _seed.resolve_generator(value)
        self._generator = self._rng if isinstance(value, (int, np.integer)) else value
        self._drawn_ahead = DrawnAhead()

    def _epoch_chunks(self, rng: Any) -> Iterator[Chunk]:
        raise NotImplementedError

    def _chunk_key(self) -> Any:
        """What an epoch's chunks depend on besides its token, or None where
        chunks a lookahead drew are not kept (they are drawn again)."""
        return None

    def _chunks(self, token: Any) -> Iterator[Chunk]:
        rng: Any = self._rng
        if is_torch_generator(rng):
            _seed.set_generator_state(rng, token)
            return self._epoch_chunks(rng)
        drawn, depends = self._drawn_ahead, self._chunk_key()
        if drawn is None or depends is None:
            return self._epoch_chunks(np.random.default_rng(token))
        # An epoch's numpy generator is its own, made from the token: chunks
        # a lookahead's copy drew from the same token are the chunks.
        key = (token, depends)
        if self._draws_ahead:
            drawn.clear()
            drawn.key, drawn.rest = key, self._epoch_chunks(np.random.default_rng(token))
            return recorded(drawn, key)
        if drawn.key == key:
            chunks, rest = drawn.chunks, drawn.rest
            drawn.clear()
            return itertools.chain(chunks, rest)
        drawn.clear()  # a guess this epoch did not take
        return self._epoch_chunks(np.random.default_rng(token))

    def _item_iterators(self, as_arrays: bool = False) -> Iterator[Any]:
        """The epoch's indices as list iterators, in order, positioned after a
        resume and registered so that ``state_dict`` can read the position.
        ``as_arrays``: a piece of a chunk that is an array stays one (in
        ``_items``), and what is yielded is an iterator over its positions
        (a range's), which marks how far it was taken the same way."""
        if self._resume is not None:
            token, skip = self._resume
            self._resume = None
        elif is_torch_generator(self._rng):
            token, skip = _seed.generator_state(self._rng), 0
        else:
            self._rng = _seed.own_generator(self._rng)
            token, skip = _seed.draw_seed(self._rng), 0
        self._token, self._done, self._chunk_len, self._current = token, 0, 0, iter(())
        done = 0
        for chunk in self._chunks(token):
            self._generator_state = None  # drawing the chunk may have moved it
            for piece in pieces(chunk):
                if skip >= len(piece):  # resumed past it: never converted
                    skip -= len(piece)
                    done += len(piece)
                    continue
                items: Chunk
                current: Any
                if not isinstance(piece, np.ndarray):
                    items, current = piece, iter(piece)
                elif as_arrays:
                    items, current = piece, iter(range(len(piece)))
                else:
                    items = piece.tolist()
                    current = iter(items)
                if skip:
                    current.__setstate__(skip)
                    skip = 0
                # Counting via the iterator's remaining length costs nothing
                # per index, unlike a counter bumped on every yield.
                self._done, self._chunk_len, self._current = done, len(items), current
                self._items = items
                yield current
                done += len(items)
        # Run out: a state taken now says that the next iteration starts a
        # new epoch (NOTE [ Resume contract ] in fastload._checkpoint).
        self._token, self._generator_state = None, None

    def _start_iteration(self) -> None:
        """A new iteration, at iter() rather than at its first draw: a state
        taken in between says that the next draw starts a new epoch, not
        where an epoch left before its end stopped."""
        self._token, self._generator_state = None, None
        self._done, self._chunk_len, self._current = 0, 0, iter(())

    def __iter__(self) -> Iterator[int]:
        self._start_iteration()
        return itertools.chain.from_iterable(self._item_iterators())

    def _batches(self, batch_size: int, drop_last: bool,
                 as_arrays: bool = False) -> Iterator[Any]:
        """What ``BatchSampler(self, batch_size, drop_last)`` yields, sliced
        from the epoch's lists instead of one Python step per index;
        ``as_arrays``: each batch an integer array instead where the epoch's
        indices are (BatchSampler._index_arrays)."""
        self._start_iteration()
        return self._batch_slices(batch_size, drop_last, as_arrays)

    def _batch_slices(self, batch_size: int, drop_last: bool,
                      as_arrays: bool) -> Iterator[Any]:
        # A batch's slices of pieces before the one it ends in, and how many
        # indices it still misses.
        parts: list[Any] = []
        missing = batch_size
        for current in self._item_iterators(as_arrays):
            items = self._items
            start, size = len(items) - current.__length_hint__(), len(items)
            while size - start >= missing:
                end = start + missing
                # The iterator moves past a batch before it is yielded
                # (state_dict reads the iterator).
                current.__setstate__(end)
                if parts:
                    parts.append(items[start:end])
                    yield joined(parts)
                    parts = []
                else:
                    yield items[start:end]
                start, missing = end, batch_size
            if start < size:
                parts.append(items[start:size])
                current.__setstate__(size)
                missing -= size - start
        if parts and not drop_last:
            yield joined(parts)

    def state_dict(self) -> dict[str, Any]:
        """Generator state, the current epoch's token and its position."""
        state: dict[str, Any] = self._lazy_state(epoch_state)()
        return state

    def _lazy_state(self, make: Callable[[Any, Any, int], Any]) -> LazyState:
        """This sampler's state as of now, as ``make(generator, epoch,
        yielded)`` makes it once called (see LazyState)."""
        in_epoch = self._token is not None
        generator = self._generator_state
        if generator is None:
            # Seeded now if not yet: a state taken before the first epoch
            # then fixes that epoch too. (A state read is one of a seeded
            # generator.)
            self._rng = _seed.own_generator(self._rng)
            generator = _seed.generator_state(self._rng)
            if in_epoch:
                # Nothing of this epoch draws from it until its next chunk
                # (a draw by other code sharing it mid-epoch is not seen).
                self._generator_state = generator
        if not in_epoch:
            return LazyState(make, generator, None, 0)
        yielded = self._done + self._chunk_len - self._current.__length_hint__()  # type: ignore[attr-defined]
        return LazyState(make, generator, self._token, yielded)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict()``: the next ``iter()`` continues the saved
        epoch where it stopped, and later epochs follow as they would have."""
        self._rng = _seed.restored_generator(self._rng, state["generator"])
        self._generator_state = None
        self._resume = None if state["epoch"] is None else (state["epoch"], int(state["yielded"]))


class RandomSampler(_EpochSampler):
    """A new random order of the dataset's indices every epoch.

    Without replacement, each epoch is a permutation (several, then part of
    one, when ``num_samples`` exceeds the dataset). With replacement,
    ``num_samples`` indices are drawn uniformly, 32 at a time as torch does.
    """

    data_source: Sized
    replacement: bool

    def __init__(
        self,
        data_source: Sized,
        replacement: bool = False,
        num_samples: int | None = None,
        generator: GeneratorArg = None,
    ) -> None:
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = generator
        if not isinstance(replacement, bool):
            raise TypeError(
                f"replacement should be a boolean value, but got replacement={replacement}"
            )
        if not _is_positive_int(self.num_samples):
            raise ValueError(
                "num_samples should be a positive integer value, "
                f"but got num_samples={self.num_samples}"
            )

    @property
    def num_samples(self) -> int:
        # Read live: the dataset may grow or shrink between epochs.
        if self._num_samples is None:
            return len(self.data_source)
        return self._num_samples

    def _chunk_key(self) -> Any:
        return len(self.data_source), int(self.num_samples), self.replacement

    def _epoch_chunks(self, rng: Any) -> Iterator[Chunk]:
        n, count = len(self.data_source), int(self.num_samples)
        if n == 0:
            raise ValueError(f"RandomSampler cannot draw num_samples={count} indices from "
                             "an empty data_source")
        # Same draws in the same order as torch, including the final draw of
        # a possibly empty remainder, so a torch.Generator ends in torch's
        # state. A numpy generator is the epoch's own (_chunks): an empty
        # remainder's permutation, a whole one drawn for nothing, is skipped.
        if self.replacement:
            for _ in range(count // 32):
                yield _seed.randint(rng, n, 32)
            yield _seed.randint(rng, n, count % 32)
        else:
            for _ in range(count // n):
                yield _seed.permutation(rng, n)
            if count % n or not isinstance(rng, np.random.Generator):
                yield _seed.permutation(rng, n)[: count % n]

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(_EpochSampler):
    """The given indices, in a new random order every epoch."""

    indices: Sequence[int]

    def __init__(self, indices: Sequence[int], generator: GeneratorArg = None) -> None:
        self.indices = indices
        self.generator = generator

    def _epoch_chunks(self, rng: Any) -> Iterator[Chunk]:
        order = _seed.permutation(rng, len(self.indices))
        if isinstance(self.indices, np.ndarray):
            yield self.indices[order]
        else:
            indices = self.indices
            yield [indices[i] for i in order.tolist()]

    def __len__(self) -> int:
        return len(self.indices)


class WeightedRandomSampler(_EpochSampler):
    """``num_samples`` indices into ``weights``, each drawn with probability
    proportional to its weight; without replacement an index is drawn at most
    once per epoch."""

    weights: np.ndarray
    num_samples: int
    replacement: bool

    def __init__(
        self,
        weights: Sequence[float],
        num_samples: int,
        replacement: bool = True,
        generator: GeneratorArg = None,
    ) -> None:
        if not _is_positive_int(num_samples):
            raise ValueError(
                "num_samples should be a positive integer value, "
                f"but got num_samples={num_samples}"
            )
        if not isinstance(replacement, bool):
            raise ValueError(
                f"replacement should be a boolean value, but got replacement={replacement}"
            )
        weights_array = np.asarray(weights, dtype=np.float64)
        if weights_array.ndim != 1:
            raise ValueError(
                "weights should be a 1d sequence but given weights have "
                f"shape {tuple(weights_array.shape)}"
            )
        self.weights = weights_array
        self.num_samples = int(num_samples)
        self.replacement = replacement
        self.generator = generator

    def _epoch_chunks(self, rng: Any) -> Iterator[Chunk]:
        yield _seed.multinomial(rng, self.weights, self.num_samples, self.replacement)

    def __len__(self) -> int:
        return self.num_samples


class BatchSampler(Sampler[list[int]]):
    """Groups the indices of ``sampler`` into lists of ``batch_size``; the
    last, shorter list is kept unless ``drop_last``."""

    def __init__(
        self,
        sampler: Sampler[int] | Iterable[int],
        batch_size: int,
        drop_last: bool,
    ) -> None:
        if not _is_positive_int(batch_size):
            raise ValueError(
                f"batch_size should be a positive integer value, but got batch_size={batch_size}"
            )
        if not isinstance(drop_last, bool):
            raise ValueError(
                f"drop_last should be a boolean value, but got drop_last={drop_last}"
            )
        self.sampler = sampler
        self.batch_size = int(batch_size)
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[list[int]]:
        sampler = self.sampler
        # Fast paths for fastload's own samplers (not for subclasses that
        # change their iteration): the same batches, without a Python-level
        # step per index. A random sampler's iteration starts at iter()
        # (_EpochSampler._start_iteration), and so does one that sets its
        # iteration up in __iter__ (fastload's DistributedSampler, not a
        # subclass with its own __iter__), so that a state taken before the
        # first batch is the new iteration's; any other's at the first
        # batch, as in torch.
        if type(sampler) is SequentialSampler:
            return self._sequential_batches(sampler)
        if _iterates_as_epoch_sampler(sampler):
            return sampler._batches(self.batch_size, self.drop_last)
        if getattr(type(sampler), "_iteration_starts_at_iter", None) is type(sampler).__iter__:
            return self._grouped(iter(sampler))
        return self._grouped_from_first_batch(sampler)

    def _grouped_from_first_batch(self, sampler: Sampler[int] | Iterable[int]
                                  ) -> Iterator[list[int]]:
        yield from self._grouped(iter(sampler))

    def _index_arrays(self) -> Iterator[Any] | None:
        """The batches iter() yields, each an integer array where the
        sampler's indices are (no Python int made per index), for a loader
        that shows no index to user code (NOTE [ Small gathers ] in
        fastload._fast_path); None where the sampler is not fastload's own
        (``draws_arrays``). Called in place of iter(): its state_dict()
        follows it the same."""
        sampler = self.sampler
        if _iterates_as_epoch_sampler(sampler):
            return sampler._batches(self.batch_size, self.drop_last, as_arrays=True)
        return None

    def _sequential_batches(self, sampler: SequentialSampler) -> Iterator[list[int]]:
        # The dataset's length is read at the first batch, as torch's
        # BatchSampler over a SequentialSampler reads it.
        size = len(sampler.data_source)
        batch_size = self.batch_size
        full = size - size % batch_size
        for start in range(0, full, batch_size):
            yield list(range(start, start + batch_size))
        if full < size and not self.drop_last:
            yield list(range(full, size))

    def _grouped(self, indices: Iterator[int]) -> Iterator[list[int]]:
        if self.drop_last:
            # zip over one iterator repeated stops at the first short group.
            for group in zip(*[indices] * self.batch_size):
                yield list(group)
        else:
            batch = list(itertools.islice(indices, self.batch_size))
            while batch:
                yield batch
                batch = list(itertools.islice(indices, self.batch_size))

    def state_dict(self) -> dict[str, Any] | None:
        """The inner sampler's state (the position of the last batch cut is
        the position of its last index), or None when it keeps none; a
        DataLoader then resumes by counting batches."""
        inner = getattr(self.sampler, "state_dict", None)
        state = None if inner is None else inner()
        return None if state is None else batch_state(state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])  # type: ignore[union-attr]

    def __len__(self) -> int:
        size = len(self.sampler)  # type: ignore[arg-type]
        if self.drop_last:
            return size // self.batch_size
        return (size + self.batch_size - 1) // self.batch_size


def _iterates_as_epoch_sampler(sampler: Any) -> TypeGuard[_EpochSampler]:
    """Whether ``sampler``'s iteration is _EpochSampler's own (a subclass
    may change it), which BatchSampler then cuts batches from directly."""
    return isinstance(sampler, _EpochSampler) and type(sampler).__iter__ is _EpochSampler.__iter__


def draws_arrays(index_sampler: Any) -> bool:
    """Whether ``index_sampler`` has ``_index_arrays()``: fastload's
    BatchSampler (not a subclass) over its own random samplers. (A
    sequential batch is cheaper as a list: np.arange costs more than
    list(range()) for a few indices, and nothing is converted.)"""
    return type(index_sampler) is BatchSampler and _iterates_as_epoch_sampler(index_sampler.sampler)


def index_batches(index_sampler: Any, as_arrays: bool) -> Iterator[Any]:
    """``iter(index_sampler)``, or with ``as_arrays`` its ``_index_arrays()``
    where it has them (``draws_arrays``): an epoch's draws, which a sampler
    whose iterator keeps the state (fastload._torch_draws.IterationState,
    alone or under a BatchSampler) is told of first."""
    for draws in (index_sampler, getattr(index_sampler, "sampler", None)):
        begin = getattr(draws, "_begin_epoch_draws", None)
        if begin is not None:
            begin()
    if as_arrays and draws_arrays(index_sampler):
        batches: Iterator[Any] | None = index_sampler._index_arrays()
        assert batches is not None  # draws_arrays said so
        return batches
    return iter(index_sampler)
