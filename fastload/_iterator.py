"""DataLoader iterators: what they share, and loading in the calling thread.

``BaseIter`` holds what every iterator needs: the index sampler and its
position, the seed, output conversion, statistics and the ``Progress`` that
``DataLoader.state_dict()`` reads (NOTE [ Resume contract ] in
fastload._checkpoint). ``SingleProcessIter`` fetches through a fetcher from
``_fetch``, which worker processes use unchanged; the worker iterator is in
``_multiprocess``.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from fastload import _checkpoint, _datapipes, _seed
from fastload._fast_path import reads_index_arrays
from fastload._fetch import DatasetKind, create_fetcher, is_stateful
from fastload._loader_state import LoaderState
from fastload._output import arrays_to_tensors, tensors_to_arrays
from fastload._pinning import PinnedLater, PinTimedOut, pin_batch, pin_target
from fastload._progress import NO_SNAPSHOT, Progress, sampler_snapshot_getter, sampler_state
from fastload._sample_rng import context as sample_context
from fastload._state_values import snapshot
from fastload._stats import LoaderStats
from fastload._warnings import warn_at_caller
from fastload._worker_error import WorkerError
from fastload.errors import InvalidArgumentError
from fastload.sampler import draws_arrays, index_batches


class EpochDraw:
    """The batches of one epoch in the index sampler's order, each drawn
    when its task is sent."""

    def __init__(self, sampler_iter: Iterator[Any], skip: frozenset[int], start: int,
                 snapshot_sampler: Any, snapshot_every: int, latest_only: bool = False) -> None:
        """``skip``: positions delivered before a checkpoint (see
        BaseIter._skip); ``start``: the position of the next batch;
        ``snapshot_sampler``: the sampler whose state a snapshot step
        records (None: no snapshots, as for an iterable dataset);
        ``latest_only``: BaseIter._records_latest_only."""
        self._sampler_iter = sampler_iter
        self._skip = skip
        self._start = self._drawn = start
        self._snapshots = snapshot_sampler is not None and snapshot_every > 0
        # What records its state, looked up once (None: a sampler that keeps
        # no state, whose snapshot steps are still recorded, as torchdata
        # records them).
        self._sampler_state = sampler_snapshot_getter(snapshot_sampler, latest_only)
        self._snapshot_every = snapshot_every
        # Whether the sampler ran out: it is not asked again.
        self.done = False
        # What the sampler raised, held while the batches drawn before it
        # are delivered, as without workers (raise_failure).
        self.failure: Exception | None = None

    def next(self) -> tuple[Any, int, Any] | None:
        """The next batch of the epoch: (index, position, the sampler's state
        when it is a snapshot step, else NO_SNAPSHOT); None once the sampler
        ran out or raised (``failure``)."""
        if self.done or self.failure is not None:
            return None
        try:
            index = next(self._sampler_iter)
            while self._skip and self._drawn in self._skip:
                self._drawn += 1
                index = next(self._sampler_iter)
        except StopIteration:
            self.done = True
            return None
        except Exception as exc:
            self.failure = exc
            return None
        position = self._drawn
        self._drawn = position + 1
        if self._snapshots and (position + 1) % self._snapshot_every == 0:
            getter = self._sampler_state
            return index, position, None if getter is None else getter()
        return index, position, NO_SNAPSHOT

    @property
    def failed_at_start(self) -> bool:
        """Whether the sampler raised at the epoch's first draw. Worker
        iterators raise that in iter(), as torch's does (its first prefetch
        draws there): no batch was drawn before it, so none is held back."""
        return self.failure is not None and self._drawn == self._start

    def raise_failure(self) -> None:
        """Raise what the sampler raised, if it did: every batch drawn before
        it was delivered. The epoch ends there, as a sampler's iterator
        ends once it raised."""
        failure, self.failure = self.failure, None
        if failure is not None:
            self.done = True
            try:
                raise failure
            finally:
                failure = None  # no cycle through this frame


class BaseIter:
    """What every DataLoader iterator shares; subclasses define ``_next_data``."""

    # Whether a persistent-workers loader may start its next epoch on this
    # iterator (False once its workers are gone).
    reusable = True
    # Whether the StopIteration being raised is a batch's own exception
    # (DatasetFetcher.ran_out): it ends the user's loop, not the epoch.
    _batch_stopped = False

    def __init__(self, loader: Any, resume: LoaderState | None,
                 base_seed: int | None = None, index_arrays: bool = False) -> None:
        """``base_seed``, when given, is used instead of drawing one (a
        resumed persistent-workers run whose saved run reused its iterator).
        ``index_arrays``: no user code sees the batches' indices (NOTE [
        Small gathers ] in fastload._fast_path), so fastload's own batch
        sampler may draw them as arrays (sampler.index_batches)."""
        self._dataset = loader.dataset
        self._dataset_kind = loader._dataset_kind
        self._IterableDataset_len_called = loader._IterableDataset_len_called
        self._auto_collation = loader._auto_collation
        self._drop_last = loader.drop_last
        self._index_sampler = loader._index_sampler
        self._num_workers = loader.num_workers
        self._timeout = loader.timeout
        self._collate_fn, self._output = loader._engine_collation()
        self._pin_torch = pin_target(loader)
        self._persistent_workers = loader.persistent_workers
        self._snapshot_every = loader.snapshot_every_n_steps
        self._map_style = self._dataset_kind is DatasetKind.MAP
        # Whether this iterator's batch indices are arrays it drew.
        self._index_arrays = index_arrays and draws_arrays(self._index_sampler)
        self._stats = LoaderStats()
        self._returned_at: float | None = None
        self._asked_at = 0.0  # when the current next() began
        # A batch (and its task) whose pinning outlasted ``timeout``: the
        # next call's (_deliver_ready).
        self._awaiting_pin: tuple[Any, PinnedLater] | None = None
        seeds_pipe = _datapipes.is_iter_datapipe(self._dataset)
        # A state restored between epochs that is where an iteration ended
        # (_checkpoint.start): this epoch's first iteration may be that one.
        self._restored_end, loader._restored_at_an_end = loader._restored_at_an_end, None
        if resume is None:
            # Same order as torch: an IterDataPipe's shared seed, the (lazy)
            # sampler iterator, then the base seed, and with workers one more
            # shared seed (their first _reset's, which they never use), so a
            # shared torch.Generator advances exactly as in torch.
            pipe_seed = None
            if base_seed is None:
                if seeds_pipe:
                    loader._rng = _seed.own_generator(loader._rng)
                    pipe_seed = _seed.draw_seed(loader._rng)
                self._sampler_iter = index_batches(self._index_sampler, self._index_arrays)
                loader._rng = _seed.own_generator(loader._rng)
                base_seed = _seed.draw_seed(loader._rng)
                if seeds_pipe and self._num_workers > 0:
                    _seed.draw_seed(loader._rng)
            else:
                # The next epoch of a saved run's persistent iterator, which
                # drew the pipe's seed at its _reset.
                self._sampler_iter = index_batches(self._index_sampler, self._index_arrays)
                if seeds_pipe:
                    pipe_seed = _seed.draw_seed(loader._rng)
            if self._restored_end is not None and self._map_style:
                self._sampler_iter = _checkpoint.draws_after_restored_end(
                    self._sampler_iter, self._index_sampler, self._index_arrays,
                    self._restored_end.sampler)
            self._progress = Progress(loader._epoch, base_seed, self._map_style)
            self._progress.sampler = sampler_state(self._index_sampler)
            self._progress.datapipe_seed = pipe_seed
        else:
            self._progress, self._sampler_iter = _checkpoint.resume_epoch(
                resume, self._index_sampler, self._dataset, self._map_style,
                self._fetch_again(loader), self._index_arrays)
        # Batches an in_order=False loader delivered past its first missing
        # one before the checkpoint: drawn from the sampler, never loaded.
        self._skip = frozenset(self._progress.beyond)
        self._base_seed = self._progress.base_seed
        loader._progress = self._progress

    def _fetch_again(self, loader: Any) -> Callable[[Any], Any] | None:
        """How a resume fetches a delivered batch again for the side effects
        on a map-style dataset in this process (see resume_epoch); None
        where workers hold the dataset's replicas, and for an iterable
        dataset, whose fetcher would call iter() on it once more."""
        if not self._map_style or _checkpoint.replicas_in_workers(loader):
            return None
        fetcher = create_fetcher(self._dataset_kind, self._dataset, self._auto_collation,
                                 self._collate_fn, self._drop_last)
        return fetcher.fetch_samples if self._auto_collation else fetcher.fetch

    def __iter__(self) -> BaseIter:
        return self

    def _reset(self, loader: Any) -> None:
        """Start a new epoch on this iterator (persistent workers)."""
        self._skip = frozenset()
        self._sampler_iter = index_batches(self._index_sampler, self._index_arrays)
        self._progress = Progress(loader._epoch, self._base_seed, self._map_style)
        self._progress.sampler = sampler_state(self._index_sampler)
        if _datapipes.is_iter_datapipe(self._dataset):
            self._progress.datapipe_seed = _seed.draw_seed(loader._rng)  # as torch's _reset
        loader._progress = self._progress
        self._returned_at = None
        self._forget_awaited_pin()
        self._IterableDataset_len_called = loader._IterableDataset_len_called

    def _shutdown(self) -> None:
        """Release what the iterator holds (worker processes, if any)."""

    def _epoch_draw(self) -> EpochDraw:
        """The draw of the epoch the progress describes, from where it stands."""
        return EpochDraw(self._sampler_iter, self._skip, self._progress.yielded,
                         self._index_sampler if self._map_style else None,
                         self._snapshot_every, self._records_latest_only)

    @property
    def _records_latest_only(self) -> bool:
        """Whether each state a snapshot step records of the sampler or a
        map-style dataset stays the latest until the next batch records
        again, nothing drawn or fetched in between (num_workers=0, a
        snapshot at every batch): recorded as returned (NOTE [ Recorded
        states ] in fastload._state_values)."""
        return False

    def _pipe_seed(self) -> int:
        """The seed of this epoch's DataPipe shufflers (_datapipes.epoch_seed)."""
        progress = self._progress
        return _datapipes.epoch_seed(progress.datapipe_seed, progress.base_seed, progress.epoch)

    def _snapshot_due(self) -> bool:
        """Whether the batch about to be delivered records a snapshot (never
        with snapshot_every_n_steps=0: states then count from the epoch's
        start)."""
        every = self._snapshot_every
        return every > 0 and (self._progress.yielded + 1) % every == 0

    def _next_data(self) -> Any:
        raise NotImplementedError

    def _end_epoch(self) -> None:
        """The sampler ran out: the state now says "epoch finished", and holds
        where a map-style dataset loaded in this process ended (0 workers,
        threads): a resume between epochs fetches nothing again."""
        progress = self._progress
        progress.finished = True
        progress.sampler = sampler_state(self._index_sampler)
        if self._map_style and progress.workers is None and is_stateful(self._dataset):
            progress.dataset = snapshot(self._dataset.state_dict())
            progress.dataset_step = progress.yielded

    def _raise_failed_batch(self, error: WorkerError, pid: int, thread: bool = False) -> NoReturn:
        """A worker's exception for a batch, raised in its place."""
        self._batch_stopped = issubclass(error.exc_type, StopIteration)
        error.reraise(pid, thread)

    def _delivered(self, data: Any) -> Any:
        """The batch as the user gets it, whatever loaded it: copied into
        torch's page-locked memory when pinning (NOTE [ Pinning by copy ] in
        fastload._pinning; a worker iterator's batch was given to its pinning
        thread as it became ready), then in the types ``output`` asks for:
        leaves as the samples had them (None), numpy arrays or tensors,
        sharing memory either way."""
        if self._pin_torch is not None:
            data = (self._pinned(data) if isinstance(data, PinnedLater)
                    else pin_batch(self._pin_torch, data))
        if self._output is None:
            return data
        if self._output == "torch":
            return arrays_to_tensors(data)
        return tensors_to_arrays(data)

    def _pinned(self, pinned: PinnedLater) -> Any:
        """The batch once pinned. As torch's loop, which waits for its
        pin-memory thread, this ``next()`` waits at most ``timeout`` in all,
        the wait for the worker included (PinTimedOut past it, see
        _deliver_ready)."""
        if not self._timeout:
            return pinned.within(None)
        waited = time.perf_counter() - self._asked_at
        return pinned.within(max(self._timeout - waited, 0.0))

    def _deliver_ready(self, task: Any, batch: Any) -> Any:
        """A batch a worker made, as the user gets it (``_delivered``), then
        counted as delivered. One whose pinning outlasts ``timeout`` raises
        the user's timeout error uncounted, and is the next call's: nothing
        is lost, and a state taken meanwhile resumes at it."""
        try:
            data = self._delivered(batch)
        except PinTimedOut:
            self._awaiting_pin = (task, batch)
            raise timed_out(self._timeout) from None
        except BaseException:
            self._progress.advance(task)  # it raised in its place
            raise
        self._progress.advance(task)
        return data

    def _forget_awaited_pin(self) -> None:
        if self._awaiting_pin is not None:
            self._awaiting_pin[1].discard()
            self._awaiting_pin = None

    def stats(self) -> LoaderStats:
        """What this iterator measured: see fastload._stats."""
        return self._stats

    def __next__(self) -> Any:
        asked_at = self._asked_at = time.perf_counter()
        stats = self._stats
        if self._returned_at is not None:
            stats.step_seconds += asked_at - self._returned_at
        try:
            if self._awaiting_pin is not None:
                (task, pinned), self._awaiting_pin = self._awaiting_pin, None
                data = self._deliver_ready(task, pinned)
            else:
                data = self._next_data()
        except StopIteration:
            if self._batch_stopped:
                self._batch_stopped = False
            else:
                self._end_epoch()
            raise
        self._returned_at = time.perf_counter()
        stats.wait_seconds += self._returned_at - asked_at
        stats.batches += 1
        if (
            not self._map_style
            and self._IterableDataset_len_called is not None
            and self._progress.yielded > self._IterableDataset_len_called
        ):
            warn_at_caller(
                f"Length of IterableDataset {self._dataset} was reported to be "
                f"{self._IterableDataset_len_called} (when accessing len(dataloader)), "
                f"but {self._progress.yielded} samples have been fetched. "
                "For multiprocessing data-loading, this could be caused by not properly "
                "configuring the IterableDataset replica at each worker. Please see "
                "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset "
                "for examples."
            )
        return data

    def __len__(self) -> int:
        return len(self._index_sampler)

    def __getstate__(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} cannot be pickled")


def timed_out(timeout: float) -> RuntimeError:
    """The error of a wait that outlasted the loader's ``timeout``."""
    return RuntimeError(f"DataLoader timed out after {timeout} seconds")


class SingleProcessIter(BaseIter):
    """Fetches and collates each batch in the calling thread."""

    # Whether the next delivered batch records the dataset's state whatever
    # the snapshot steps (a stream just resumed).
    _record_next_batch = False

    def __init__(self, loader: Any, resume: LoaderState | None) -> None:
        super().__init__(loader, resume, index_arrays=reads_index_arrays(loader))
        if self._timeout != 0:
            raise InvalidArgumentError(
                f"timeout={self._timeout} needs worker processes (num_workers > 0); "
                "loading in the main process cannot time out"
            )
        self._draw = self._epoch_draw()
        if _datapipes.is_datapipe(self._dataset):
            _datapipes.prepare(self._dataset, self._pipe_seed(), num_workers=0, worker_id=0)
        self._fetcher = create_fetcher(
            self._dataset_kind,
            self._dataset,
            self._auto_collation,
            self._collate_fn,
            self._drop_last,
        )
        if self._restored_end is not None:
            _checkpoint.after_restored_end(self._fetcher, self._restored_end.dataset)
        progress = self._progress
        if resume is None:
            # A state taken before the first batch then holds the dataset's
            # start, not whatever the dataset does later.
            progress.dataset = self._fetcher.state()
        elif not self._map_style:
            _checkpoint.resume_stream(self._fetcher, progress, resume,
                                      loader.batch_size if self._auto_collation else None)
            # Its state asked again may not be its own yet (NOTE [ Resume
            # contract ] in fastload._checkpoint): recorded at its next batch.
            self._record_next_batch = self._fetcher.stateful
        # The epoch's first draw may move what a map-style dataset's state
        # holds: a sampler without a generator draws its seed from a global
        # RNG, which a dataset's state may be. Its batches start from the
        # state after that draw, as a resume replays them (NOTE [ Resume
        # contract ] in fastload._checkpoint).
        self._state_after_first_draw = (self._map_style and self._fetcher.stateful
                                        and progress.yielded == 0)

    def _end_epoch(self) -> None:
        super()._end_epoch()
        if self._fetcher.stateful and not self._map_style:
            self._record_stream_end(self._progress.yielded)

    def _record_stream_end(self, step: int) -> None:
        """The dataset has seen the end of its stream (a counter of epochs
        moved on, say) by batch ``step``: that is what the next epoch starts
        from, and nothing after it is read again on resume."""
        progress = self._progress
        progress.dataset = self._fetcher.end_state()  # type: ignore[attr-defined]
        progress.dataset_step = step
        progress.dataset_ended = True

    @property
    def _records_latest_only(self) -> bool:
        return self._snapshot_every == 1

    def _record_dataset_snapshot(self) -> None:
        """The dataset's state after the fetch of the batch about to be
        delivered, on a snapshot step, as the sampler's is recorded."""
        fetcher = self._fetcher
        if fetcher.stateful and (self._snapshot_due() or self._record_next_batch):
            self._record_next_batch = False
            progress = self._progress
            # A stream's failed batch records nothing: a state recorded as
            # returned would have moved with it.
            progress.dataset = (fetcher.live_state() if self._map_style
                                and self._records_latest_only else fetcher.state())
            progress.dataset_step = progress.yielded + 1

    def _next_data(self) -> Any:
        progress = self._progress
        drawn = self._draw.next()  # the draw worker iterators make, the same batches
        if drawn is None:
            self._draw.raise_failure()
            raise StopIteration
        index, position, sampler_snapshot = drawn
        if self._state_after_first_draw:
            self._state_after_first_draw = False
            progress.dataset = self._fetcher.state()
        sample_context.base_seed = progress.base_seed
        sample_context.epoch = progress.epoch
        try:
            data = self._fetcher.fetch(index)
        except Exception as exc:
            if self._fetcher.ran_out(exc):
                raise
            # The batch is delivered as its exception; the epoch goes on
            # after it, whichever iterator loads (NOTE [ Fast paths ]). A
            # map-style dataset's fetch moved it as far as it got (a
            # stream's failed batch is read again on resume).
            if self._map_style:
                self._record_dataset_snapshot()
            progress.deliver(position, sampler_snapshot)
            self._batch_stopped = isinstance(exc, StopIteration)
            raise
        self._record_dataset_snapshot()
        if not self._map_style:
            ended = self._fetcher.ended  # type: ignore[attr-defined]
            if ended and self._fetcher.stateful and not progress.dataset_ended:
                self._record_stream_end(progress.yielded + 1)  # ran out inside this batch
            progress.dataset_ended = ended
        progress.deliver(position, sampler_snapshot)
        return self._delivered(data)
