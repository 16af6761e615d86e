"""Turning one entry of the index sampler into one batch (or one sample).

Shared by the single-process iterator and, later, the worker processes: a
fetcher holds a dataset and its collate function and knows nothing about
where its indices come from or where its batches go.
"""
from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from fastload._sample_rng import context as sample_context
from fastload._state_values import Recorder, snapshot, unmoved
from fastload.errors import CollateError


class DatasetKind(enum.Enum):
    MAP = "map"
    ITERABLE = "iterable"


class DatasetFetcher:
    def __init__(
        self,
        dataset: Any,
        auto_collation: bool,
        collate_fn: Callable[[Any], Any],
        drop_last: bool,
    ) -> None:
        self.dataset = dataset
        self.auto_collation = auto_collation
        self.collate_fn = collate_fn
        self.drop_last = drop_last

    def fetch(self, possibly_batched_index: Any) -> Any:
        raise NotImplementedError

    def fetch_samples(self, index: Any) -> Any:
        """The samples of one batch, not yet collated."""
        raise NotImplementedError

    def ran_out(self, exc: BaseException) -> bool:
        """Whether ``exc``, raised by a fetch, says that the dataset ran out
        rather than that this batch failed. torch's rule: StopIteration
        ends an iterable dataset's stream; from a map-style dataset's
        ``__getitem__`` (or a collate_fn) it is that batch's exception,
        ending the user's loop there as any loop's StopIteration does, with
        the epoch going on after it."""
        return False

    # What keeps a state the checkpoint records (NOTE [ Resume contract ]):
    # a map-style dataset with state_dict and load_state_dict; for an
    # iterable dataset, see IterableDatasetFetcher.
    _stateful_source: Any = None
    stateful = False
    _recorder: Recorder | None = None

    def state(self) -> Any:
        """The dataset's position now (see ``restore``), recorded (NOTE [
        Recorded states ] in fastload._state_values); None when nothing
        keeps a state."""
        source = self._stateful_source
        if source is None:
            return None
        if self._recorder is None:
            self._recorder = Recorder(source.state_dict)
        return self._recorder()

    def live_state(self) -> Any:
        """``state_dict()`` as it returns it, for a caller that records it
        only while nothing can change it (NOTE [ Recorded states ])."""
        return self._stateful_source.state_dict()

    def restore(self, state: Any) -> None:
        """Put the dataset back where ``state()`` was taken (for an iterable
        dataset: called after iter(), as torchdata does, so a dataset that
        sets its cursor up in ``__iter__`` keeps the restored one). A copy
        of it: the source may keep what it is given and update it, and
        ``state`` is kept as recorded."""
        if state is not None and self._stateful_source is not None:
            self._stateful_source.load_state_dict(snapshot(state))

    def collate(self, samples: Any, index: Any) -> Any:
        """The batch of ``samples`` (fetched for ``index``): what ``fetch``
        returns, for a caller that fetched the samples itself."""
        return self.collate_fn(samples)


def name_dataset_indices(error: CollateError, index: Sequence[Any]) -> CollateError:
    """The collate error, with the dataset indices of the two samples it names."""
    if error.positions is None:
        return error
    later, first = error.positions
    return CollateError(f"{error} (dataset indices {index[later]} and {index[first]})",
                        error.positions)


class MapDatasetFetcher(DatasetFetcher):
    """Fetches by index: ``__getitems__(indices)`` when the dataset defines
    it, else ``dataset[i]`` for each index."""

    def __init__(
        self,
        dataset: Any,
        auto_collation: bool,
        collate_fn: Callable[[Any], Any],
        drop_last: bool,
    ) -> None:
        super().__init__(dataset, auto_collation, collate_fn, drop_last)
        getitems = getattr(dataset, "__getitems__", None)
        self._getitems = getitems if getitems else None
        if is_stateful(dataset):
            self._stateful_source, self.stateful = dataset, True

    def fetch_samples(self, index: Any) -> Any:
        """The samples of one batch, not yet collated. The index being
        fetched is kept in the sample context (NOTE [ Per-sample
        randomness ]); when a sample raises, it still names that index."""
        if self._getitems is not None:
            return self._getitems(index)
        dataset = self.dataset
        cursor = sample_context.cursor
        data = []
        for i in index:
            cursor.index = i
            data.append(dataset[i])
        cursor.index = None
        return data

    def fetch(self, possibly_batched_index: Any) -> Any:
        if not self.auto_collation:
            cursor = sample_context.cursor
            cursor.index = possibly_batched_index
            sample = self.dataset[possibly_batched_index]
            cursor.index = None
            return self.collate_fn(sample)
        return self.collate(self.fetch_samples(possibly_batched_index), possibly_batched_index)

    def collate(self, samples: Any, index: Any) -> Any:
        try:
            return self.collate_fn(samples)
        except CollateError as error:
            named = name_dataset_indices(error, index)
            if named is error:
                raise
            raise named.with_traceback(error.__traceback__) from None


class IterableDatasetFetcher(DatasetFetcher):
    """Takes the next sample (or the next ``len(index)`` samples) from one
    iterator over the dataset; the batch sampler only says how many."""

    def __init__(
        self,
        dataset: Any,
        auto_collation: bool,
        collate_fn: Callable[[Any], Any],
        drop_last: bool,
    ) -> None:
        super().__init__(dataset, auto_collation, collate_fn, drop_last)
        self.dataset_iter: Iterator[Any] = iter(dataset)
        self.ended = False
        # torchdata's rule: an iterator with a state of its own is what is
        # checkpointed; else the dataset, when it has one.
        self._stateful_source = next(
            (source for source in (self.dataset_iter, dataset) if is_stateful(source)), None)
        self.stateful = self._stateful_source is not None

    def ran_out(self, exc: BaseException) -> bool:
        return isinstance(exc, StopIteration)

    def restore_before_first_sample(self, state: Any) -> None:
        """``restore`` a state taken before a stream yielded anything: at an
        epoch's start, or once the last epoch's stream ran out. A stream
        the dataset holds that runs out before its first sample was the
        one that state ended; the epoch is then read from a fresh
        ``iter(dataset)`` (NOTE [ A stream restored at its end ])."""
        self.restore(state)
        if state is not None and self.dataset_keeps_state:
            self.read_past_an_ended_stream(state)

    def restore_ended(self, state: Any) -> None:
        """``restore`` a state taken once the stream had run out (inside a
        batch the saved run delivered; this epoch reads no more of it), then
        read the restored stream out, as the saved run read it to its end,
        so that the next epoch's stream does not continue it. A stream
        that yields, or that runs out moving its state on, was already the
        next one: the state is restored again for it (NOTE [ A stream
        restored at its end ])."""
        self.restore(state)
        if state is None or not self.dataset_keeps_state:
            return
        before = self.state()
        try:
            next(self.dataset_iter)
        except StopIteration:
            if unmoved(state, before, self.state()):
                return
        except Exception:
            pass  # the next epoch's stream, failing: it starts from the state
        self.restore(state)

    @property
    def dataset_keeps_state(self) -> bool:
        """Whether the stream's state is the dataset's, not its iterator's."""
        return self._stateful_source is self.dataset

    def read_past_an_ended_stream(self, loaded: Any) -> None:
        """Read the epoch from a fresh ``iter(dataset)`` if the current
        stream, restored from ``loaded``, runs out before its first sample
        (NOTE [ A stream restored at its end ])."""
        self.dataset_iter = _EndedOrNot(self, self.dataset_iter, loaded)

    def end_state(self) -> Any:
        """The dataset's own state once its stream ran out (it has seen
        StopIteration), where the next epoch starts from; None when the
        stream's state is its iterator's, which the next epoch replaces."""
        return self.state() if self._stateful_source is self.dataset else None

    def fetch_samples(self, index: Any) -> list[Any]:
        """The next ``len(index)`` samples, not yet collated; StopIteration
        when none are left (or, with drop_last, too few for a whole batch)."""
        if self.ended:
            raise StopIteration
        data = []
        for _ in index:
            try:
                data.append(next(self.dataset_iter))
            except StopIteration:
                self.ended = True
                break
        if not data or (self.drop_last and len(data) < len(index)):
            raise StopIteration
        return data

    def fetch(self, possibly_batched_index: Any) -> Any:
        if self.ended:
            raise StopIteration
        if not self.auto_collation:
            return self.collate_fn(next(self.dataset_iter))
        return self.collate(self.fetch_samples(possibly_batched_index), possibly_batched_index)


class _EndedOrNot:
    """The first iterator of a stream restored before its first sample:
    its first ``next`` tells whether it is a whole epoch (the fetcher then
    reads it directly) or the end of an earlier one, given way to a fresh
    ``iter(dataset)``.

    NOTE [ A stream restored at its end ]

    An iterable dataset's state says where its stream stands. Taken before
    a new stream yielded anything (the state of an epoch's start, or that
    of a stream that ran out), it may still describe the previous stream's
    end: a dataset that records its position as it yields and applies a
    loaded position at its next ``__iter__`` (torchdata's usual pattern)
    reports where its last stream ended until the next one yields.
    Restored, that state makes the next stream continue the ended one,
    which yields nothing, where the saved run went on to a whole epoch. So
    a stream restored from such a state that runs out before its first
    sample, leaving the state as it was, is taken for that ended one, and
    the epoch is read from a fresh ``iter(dataset)``, as the saved run read
    it. A dataset whose state already describes the new stream (one that
    resets its position as its stream ends) yields from the restored
    stream, which is kept; so is one that runs out at once but moves its
    state on (an epoch counter): that epoch is empty. Only a state the
    dataset holds can be stale so: an iterator's own state is always that
    of its own stream, which the next epoch replaces.

    The same goes for an index sampler of a kind fastload does not know,
    whose state is restored with a map-style epoch (fastload._checkpoint:
    ``_remainder_or_fresh``, ``_run_out_or_restore``). What remains
    ambiguous: an empty epoch whose iteration moves no state is read
    twice (one more ``iter()``).
    """

    __slots__ = ("fetcher", "restored", "loaded")

    def __init__(self, fetcher: IterableDatasetFetcher, restored: Iterator[Any],
                 loaded: Any) -> None:
        self.fetcher, self.restored, self.loaded = fetcher, restored, loaded

    def __iter__(self) -> _EndedOrNot:
        return self

    def __next__(self) -> Any:
        fetcher = self.fetcher
        fetcher.dataset_iter = self.restored
        before = fetcher.state()
        try:
            return next(self.restored)
        except StopIteration:
            if not unmoved(self.loaded, before, fetcher.state()):
                raise  # a whole epoch, empty: it moved the state on
            fetcher.dataset_iter = iter(fetcher.dataset)
            return next(fetcher.dataset_iter)


def is_stateful(source: Any) -> bool:
    """Whether ``source`` keeps a state: ``state_dict`` and ``load_state_dict``."""
    return callable(getattr(source, "state_dict", None)) and callable(
        getattr(source, "load_state_dict", None))


def create_fetcher(
    kind: DatasetKind,
    dataset: Any,
    auto_collation: bool,
    collate_fn: Callable[[Any], Any],
    drop_last: bool,
) -> DatasetFetcher:
    fetcher = MapDatasetFetcher if kind is DatasetKind.MAP else IterableDatasetFetcher
    return fetcher(dataset, auto_collation, collate_fn, drop_last)


def describe_failure(index: Any) -> str:
    """Where a worker's fetch of ``index`` failed, for its error message:
    the sample being fetched when it raised (kept in the sample context,
    NOTE [ Per-sample randomness ]), else the batch's indices."""
    cursor = sample_context.cursor
    failed_at, cursor.index = cursor.index, None
    if failed_at is not None:
        return f"while loading index {failed_at}"
    if index is None:
        return "while loading from its iterable dataset"
    return f"while loading indices {describe_indices(index)}"


# Indices named in full in an error message; a longer batch is abridged.
NAMED_INDICES = 16


def describe_indices(index: Any) -> str:
    """A batch's indices for a message: in full up to NAMED_INDICES, else
    the first and last few and how many (the exception's attributes keep
    them all)."""
    if not isinstance(index, (list, tuple)) or len(index) <= NAMED_INDICES:
        return str(index)
    head = ", ".join(map(str, index[:NAMED_INDICES // 2]))
    tail = ", ".join(map(str, index[-2:]))
    return f"[{head}, ..., {tail}] ({len(index)} indices)"


def skip_batches(fetcher: DatasetFetcher, count: int, batch_size: int | None) -> None:
    """Read and drop the next ``count`` batches of an iterable dataset's
    fetcher: those a worker delivered after the dataset state a resume
    starts from (NOTE [ Resume contract ] in fastload._checkpoint). A batch
    that failed was delivered as its exception, so it counts as read."""
    index = None if batch_size is None else [None] * batch_size
    for _ in range(count):
        try:
            fetcher.fetch(index)
        except StopIteration:
            return
        except Exception:
            pass
