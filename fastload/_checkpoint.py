"""Checkpoints of a DataLoader: a state's capture (``DataLoader.state_dict``)
and its restore (``load_state_dict``, the next ``iter()``, and each worker),
in one place. The state itself, typed and versioned, is defined in
``_loader_state``; the position it is captured from, ``Progress``, in
``_progress``.

NOTE [ Resume contract ]

A state describes the position right after the last batch the user
received, never what workers prefetched. It is made of:

* the index sampler's own state, recorded when the last delivered batch's
  indices were drawn (every ``snapshot_every_n_steps`` batches), plus the
  number of batches delivered since that snapshot, to be skipped by counting
  on resume. Samplers with ``state_dict`` (fastload's random samplers,
  BatchSampler over them, DistributedSampler) resume in O(1): same
  permutation, same position, no index replayed and no sample fetched.
  Samplers without state are fast-forwarded by counting whole batches from
  the start of the epoch, as torchdata does. Any other sampler with a state
  is taken at torchdata's word: restored, its next iteration continues the
  saved epoch, which a resume past the epoch's last batch runs out, unless
  it turns out to start a new one (``_continues_an_epoch``,
  ``_run_out_or_restore``); torch's BatchSampler over one is fastload's
  BatchSampler (fastload._torch_draws.resumable). For fastload's random samplers
  a snapshot records a ``LazyState`` (fastload._epoch_pieces), the state's values
  without its dicts, made into the state_dict() only when a state is taken;
* for iterable datasets, the stream's state after each delivered batch, per
  worker (recorded in the worker right after it fetched that batch), plus
  the batches to skip since, which worker is next in the round robin, and
  which workers had run dry. As in torchdata, the stream's state is that of
  the iterator ``__iter__`` returned when it has ``state_dict`` and
  ``load_state_dict``, else the dataset's; it is restored after ``iter()``,
  so a dataset that sets its cursor up in ``__iter__`` keeps the restored
  one. In the main process a state is also taken when the loader starts an
  epoch (a state before the first batch holds where the stream starts; a
  worker tells where its replica starts with STARTED, after its set-up and
  after each persistent epoch's RESET, which iter() waits for) and
  after the stream ran out (the dataset has then seen StopIteration: an
  epoch counter moved on), which load_state_dict restores at once, as the
  sampler's; in a worker, a stream's end state is that of what holds it
  (the dataset, or its stateful iterator), and a persistent worker resumed
  between epochs loads it into a fresh iterator before the next epoch's,
  as torchdata does (``resume_ended_replica``). A stream's state taken
  before it yielded anything may still be the previous stream's end, and
  is restored as such; and as the dataset is asked for its state again
  after a restore, which such a dataset answers from before its stream
  applied it, a resumed stream records its state at its first delivered
  batch, whatever the snapshot steps (NOTE [ A stream restored at its end ] in
  fastload._fetch);
* for a map-style dataset with ``state_dict`` and ``load_state_dict``, its
  state as torchdata keeps it: loaded in the main process, the dataset's at
  each snapshot, restored once the sampler is positioned, then the batches
  delivered since that snapshot fetched again and dropped (their side
  effects on the dataset, a random draw per sample say, are then where the
  saved run had them). The epoch's own start is taken again right after
  its first draw, which may have moved the dataset's state (a sampler
  without a generator draws its seed from a global RNG that the state may
  be), as the resume replays it. After a restore the dataset is asked for
  its state again, as torchdata asks it. Loaded by worker processes,
  each replica's, recorded in its worker with every batch it loads (so
  nothing is fetched again: the state after a replica's last delivered
  batch is where it stands at any step, whatever snapshot_every_n_steps)
  and restored into the same worker id, which is why such a state only fits
  the same number of worker processes. Worker threads share the main process's
  dataset, whose fetches take turns in the sampler's order
  (fastload._worker_thread.FetchTurns): its state right after the fetch of
  the last delivered snapshot batch is the main process's, as it would be
  with ``num_workers=0``. A state taken before any worker loaded
  holds the main process's dataset, which every replica then starts from;
* with ``in_order=False`` (map-style), batches are delivered out of order:
  the delivered count is the contiguous prefix of the epoch, and the
  positions delivered past it are kept as [start, stop) runs
  (``delivered_beyond``). A resumed loader, with any number of workers,
  draws those positions from the sampler and loads none of them, so every
  batch of the epoch is delivered exactly once. An iterable dataset's
  worker still answers its tasks in order: its delivered batches are a
  prefix of its stream, as with ``in_order=True``;
* ``snapshot_every_n_steps=0`` takes no snapshot within an epoch: a state
  then counts the delivered batches from the epoch's start. An empty state
  (``{}``) loads as "start fresh", as in torchdata;
* a sampler's state describes where its next iteration starts: once an
  epoch has run out, a new epoch (the generator as it is then). A state
  whose every batch was delivered (the StopIteration not yet seen) resumes
  as an empty remainder of that epoch, by counting against len(sampler);
* the base seed and epoch, so worker seeds and ``sample_rng()`` streams are
  the same after a resume, and the loader generator's state, so the epochs
  after it shuffle as they would have (NOTE [ Determinism contract ]); for
  an ``IterDataPipe``, the seed its shufflers got this epoch (drawn as torch
  draws it, see fastload._datapipes).
"""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from fastload import _seed
from fastload._epoch_pieces import listed
from fastload._fetch import (
    DatasetFetcher,
    DatasetKind,
    IterableDatasetFetcher,
    is_stateful,
    skip_batches,
)
from fastload._loader_state import LoaderState, WorkerState
from fastload._progress import (
    NO_SNAPSHOT,
    Progress,
    recorded_state,
    resume_keeper,
    sampler_state,
)
from fastload._state_values import snapshot, unmoved
from fastload.errors import StateMismatchError
from fastload.sampler import index_batches


def describe_loader(loader: Any) -> dict[str, Any]:
    """The settings a state only fits if they are the same on resume."""
    kind = loader._dataset_kind.value
    settings: dict[str, Any] = {
        "dataset_kind": kind,
        "batch_size": loader.batch_size,
        "drop_last": loader.drop_last,
    }
    if kind == "map":
        settings["dataset_length"] = len(loader.dataset)
    if tracks_replicas(loader):
        # Each worker's replica has its own state: it fits only the same
        # number of replicas (of a map-style dataset, in worker processes).
        settings["num_workers"] = loader.num_workers
        if kind == "map":
            settings["worker_method"] = loader.worker_method
    return settings


def tracks_replicas(loader: Any) -> bool:
    """Whether workers' dataset replicas are checkpointed one by one: an
    iterable dataset's streams always, a map-style dataset's states when it
    has them and worker processes load it (NOTE [ Resume contract ])."""
    if loader._dataset_kind is DatasetKind.ITERABLE:
        return True
    return replicas_in_workers(loader) and is_stateful(loader.dataset)


def replicas_in_workers(loader: Any) -> bool:
    """Whether worker processes load, each with its own copy of the
    dataset (worker threads share the main process's)."""
    return loader.num_workers > 0 and loader.worker_method != "thread"


def check_compatible(state: LoaderState, loader: Any) -> None:
    """Raise StateMismatchError naming every setting in which ``state`` and
    the loader differ; a state that does not fit must never yield wrong data."""
    expected = describe_loader(loader)
    saved = state.settings
    differences = []
    for key in sorted(expected.keys() | saved.keys()):
        # A setting only one side records is still the loader's setting.
        here = expected[key] if key in expected else getattr(loader, key, None)
        if key not in saved:
            differences.append(f"{key} is {here!r} here but not recorded in the state")
        elif saved[key] != here:
            differences.append(f"{key} is {here!r} here but {saved[key]!r} in the state")
    if differences:
        raise StateMismatchError("cannot resume from this DataLoader state: "
                                 + "; ".join(differences))


def _ranges(positions: Iterable[int]) -> list[list[int]]:
    """Sorted positions as [start, stop) runs: a checkpoint stays small."""
    runs: list[list[int]] = []
    for position in sorted(positions):
        if runs and runs[-1][1] == position:
            runs[-1][1] += 1
        else:
            runs.append([position, position + 1])
    return runs


# -- capture ---------------------------------------------------------------

def capture(loader: Any) -> dict[str, Any]:
    """``DataLoader.state_dict()``: the position after the last delivered
    batch, as plain values (NOTE [ Resume contract ])."""
    if loader._resume_state is not None:
        return copy.deepcopy(loader._resume_state.to_dict())
    progress = loader._progress
    # Seeded now if not yet, so that the resumed run draws what this one
    # will (NOTE [ Determinism contract ]).
    loader._rng = _seed.own_generator(loader._rng)
    # None: no iterator has drawn a base seed yet.
    base_seed = None if progress is None else progress.base_seed
    if progress is None:
        progress = Progress(loader._epoch - 1, 0, loader._dataset_kind is DatasetKind.MAP)
        progress.finished = True
        # The sampler's generator too, seeded now if it was not.
        progress.sampler = sampler_state(loader._index_sampler)
        if is_stateful(loader.dataset):
            progress.dataset = snapshot(loader.dataset.state_dict())
    return LoaderState(
        settings=describe_loader(loader),
        epoch=progress.epoch,
        base_seed=base_seed,
        yielded=progress.yielded,
        delivered_beyond=_ranges(progress.beyond),
        finished=progress.finished,
        sampler=recorded_state(progress.sampler),
        sampler_step=progress.sampler_step,
        generator=_seed.generator_state(loader._rng),
        # A copy (NOTE [ Recorded states ] in fastload._state_values).
        dataset=snapshot(progress.dataset),
        dataset_step=progress.dataset_step,
        dataset_ended=progress.dataset_ended,
        workers=progress.workers,  # to_dict turns each into a new dict
        next_worker=progress.next_worker,
        datapipe_seed=progress.datapipe_seed,
    ).to_dict()


# -- restore ---------------------------------------------------------------

def load(loader: Any, state: dict[str, Any]) -> tuple[LoaderState | None, bool]:
    """``DataLoader.load_state_dict()``: the state read (ValueError when it is
    none), for the next ``iter()`` to resume from (None for an empty state:
    start fresh), and whether what it restores between epochs was restored.
    A state taken after an epoch ran out restores the sampler and the
    dataset now, so that, as in the original run, a ``set_epoch`` before
    that ``iter()`` applies on top; a state whose settings do not fit the
    loader restores nothing: ``start`` refuses it, or restores it once the
    settings were changed to fit."""
    if not state:
        return None, True  # torchdata's "start fresh"
    typed = LoaderState.from_dict(copy.deepcopy(state))
    if loader._progress is not None:
        # What the state restores is the program's: an epoch left before
        # it is not put back (ThreadIter._restore_left_epoch).
        loader._progress.shared_fetches = None
    try:
        check_compatible(typed, loader)
    except StateMismatchError:
        return typed, False  # raised at iter(), where torchdata raises it
    _restore_between_epochs(loader, typed)
    return typed, True


def _restore_between_epochs(loader: Any, state: LoaderState) -> None:
    if state.finished and state.sampler is not None:
        # A sampler that ran out describes a new epoch next.
        loader._index_sampler.load_state_dict(snapshot(state.sampler))
    if state.finished and state.dataset is not None and is_stateful(loader.dataset):
        # Between epochs a dataset in this process is where its last epoch
        # left it (an iterable one where its stream ran out), and so are
        # the replicas workers copy from it; the next iter() starts there.
        loader.dataset.load_state_dict(snapshot(state.dataset))


class ResumeStart:
    """What ``DataLoader.__iter__`` needs of a pending state: the state the
    new iterator continues (None when the saved epoch ran out: a new epoch
    starts), and for persistent workers the base seed their saved run kept
    and where their replicas were."""

    __slots__ = ("state", "base_seed", "replica_states")

    def __init__(self, state: LoaderState | None, base_seed: int | None = None,
                 replica_states: list[Any] | None = None) -> None:
        self.state = state
        self.base_seed = base_seed
        self.replica_states = replica_states


def start(loader: Any, state: LoaderState, restored: bool) -> ResumeStart:
    """Apply a pending state at ``iter()``: the loader's generator and epoch
    now, and what ``load`` did not restore (``restored``); the rest by what
    the result says. StateMismatchError, before anything is applied, when
    the state does not fit the loader."""
    check_compatible(state, loader)
    if not restored:
        _restore_between_epochs(loader, state)
    loader._rng = _seed.restored_generator(loader._rng, state.generator)
    loader._epoch = state.epoch + 1 if state.finished else state.epoch
    # What _restore_between_epochs restored (the sampler of a map-style
    # epoch, an iterable dataset) is where an iteration ended: the next
    # epoch's first iteration may be that ended one (``after_restored_end``).
    restored = state.sampler if loader._dataset_kind is DatasetKind.MAP else state.dataset
    loader._restored_at_an_end = state if state.finished and restored is not None else None
    if not state.finished:
        return ResumeStart(state)
    if not loader.persistent_workers:
        return ResumeStart(None)
    # The saved run's next epoch reused its iterator and so its base seed
    # (None if it had no iterator yet), drawing none from the generator: so
    # must this one. And its workers' replicas were where they ended.
    replicas = None if state.workers is None else [worker.state for worker in state.workers]
    return ResumeStart(None, state.base_seed, replicas)


def resume_epoch(state: LoaderState, index_sampler: Any, dataset: Any, map_style: bool,
                 fetch_again: Callable[[Any], Any] | None,
                 index_arrays: bool) -> tuple[Progress, Iterator[Any]]:
    """Continue the epoch ``state`` describes (the loader's generator was
    restored already): the progress, and the sampler's iterator positioned
    after the delivered batches: the sampler from its snapshot, then the
    batches delivered after it skipped by counting, without fetching them.
    Then, as torchdata does, a map-style dataset's own state (main process)
    is restored, and the batches delivered after that state are fetched
    again through ``fetch_again`` and dropped, so that the dataset's side
    effects (a random draw per sample, say) are where they were. The order
    matters: a sampler without state (torch's RandomSampler) draws its
    epoch's seed from the global RNG at its first step, before a dataset's
    state may set that RNG. ``index_arrays``: the iterator draws with
    ``sampler.index_batches`` (see BaseIter)."""
    progress = Progress(state.epoch, state.base_seed, map_style)  # type: ignore[arg-type]
    progress.datapipe_seed = state.datapipe_seed
    progress.yielded = state.yielded
    progress.beyond = dict.fromkeys(
        (position for start_at, stop in state.delivered_beyond
         for position in range(start_at, stop)), NO_SNAPSHOT)
    progress.sampler, progress.sampler_step = state.sampler, state.sampler_step
    skip = progress.yielded
    continues: bool | None = False
    if progress.sampler is not None:
        index_sampler.load_state_dict(snapshot(progress.sampler))
        skip -= progress.sampler_step
        # Asked before iter(), which may take the restored position up at once.
        continues = _continues_an_epoch(index_sampler)
    sampler_iter: Iterator[Any] = index_batches(index_sampler, index_arrays)
    if map_style:
        if continues is None and progress.sampler_step == 0:
            # A state recorded before the epoch's first draw may be the
            # previous epoch's end.
            sampler_iter = _remainder_or_fresh(sampler_iter, index_sampler, index_arrays,
                                               progress.sampler)
        # Every batch was delivered, only the StopIteration was not: a
        # sampler still inside that epoch (restored from a snapshot before
        # its end, or at its end) runs out of its empty remainder now, so
        # that its next iteration is a new epoch.
        ended = progress.yielded >= _length_or_none(index_sampler)
        skipped = [next(sampler_iter, None) for _ in range(skip)]
        if ended:
            if skip > 0 or continues:
                for _ in sampler_iter:
                    pass
            elif continues is None:
                _run_out_or_restore(sampler_iter, index_sampler, progress.sampler)
            sampler_iter = iter(())
        if state.dataset is not None:
            dataset.load_state_dict(snapshot(state.dataset))
            # What the dataset says now, as torchdata asks it again.
            progress.dataset = snapshot(dataset.state_dict())
            progress.dataset_step = state.dataset_step
            first = progress.yielded - skip  # the position of skipped[0]
            for position, index in enumerate(skipped, first):
                if fetch_again is not None and position >= state.dataset_step:
                    try:
                        fetch_again(listed(index))
                    except Exception:
                        pass  # that batch was delivered as its exception
    return progress, sampler_iter


def resume_stream(fetcher: DatasetFetcher, progress: Progress, state: LoaderState,
                  batch_size: int | None) -> None:
    """Put an iterable dataset loaded in this process where ``state`` left
    it: its stream's state (after iter()), then what it yielded after that
    state read again and dropped."""
    progress.dataset_ended = state.dataset_ended
    if fetcher.stateful:
        restore_at_step(fetcher, state.dataset, state.dataset_step, state.dataset_ended)
        # What the dataset says now, as torchdata asks it again (one that
        # applies a loaded position at its next __iter__ still says where
        # it was: SingleProcessIter records the stream's next batch).
        progress.dataset, progress.dataset_step = fetcher.state(), state.dataset_step
    if state.dataset_ended:
        fetcher.ended = True  # type: ignore[attr-defined]
    else:
        skip_batches(fetcher, progress.yielded - progress.dataset_step, batch_size)


def worker_states(state: LoaderState | None, num_workers: int, tracked: bool,
                  start_states: list[Any] | None = None
                  ) -> tuple[list[WorkerState] | None, int]:
    """Each worker's replica to start from, and the next worker of the
    round robin: a resumed state's, else fresh ones when replicas are
    tracked (``tracks_replicas``), else None. ``start_states``: the
    replicas of a run resumed between epochs, where its workers start (an
    iterable stream's start is recorded from its STARTED instead)."""
    if state is not None and state.workers is not None:
        return [dataclasses.replace(worker) for worker in state.workers], state.next_worker
    if not tracked:
        return None, 0
    if start_states is None:
        return [WorkerState() for _ in range(num_workers)], 0
    return [WorkerState(state=start) for start in start_states], 0


def replicas_carried(workers: list[WorkerState] | None) -> list[WorkerState] | None:
    """Persistent workers' map-style replicas at a new epoch: each where its
    last delivered batch left it (``replica_snapshot``), nothing delivered
    yet, until its STARTED says where it stands, the fetches of an epoch
    left early included (``record_replica_start``)."""
    if workers is None:
        return None
    return [WorkerState(state=worker.state) for worker in workers]


def replica_start(fetcher: DatasetFetcher) -> Any:
    """What a worker says with STARTED (NOTE [ Worker protocol ]): its
    replica's state as an epoch starts, after its set-up or a new epoch's
    RESET (an iterable stream's, or a map-style replica's after whatever an
    abandoned epoch's tasks fetched); None without a state."""
    return fetcher.state() if fetcher.stateful else None


def record_replica_start(workers: list[WorkerState] | None, worker_id: int,
                         state: Any) -> None:
    """A worker's STARTED in the main process: until that worker delivers,
    a state holds where its replica started (a persistent worker's later
    epochs start from what the earlier ones left, not from a fresh copy)."""
    if state is None or workers is None:
        return
    worker = workers[worker_id]
    if worker.yielded == 0 and not worker.ended:
        worker.state, worker.state_step = state, 0


def replica_snapshot(fetcher: DatasetFetcher, batches_done: int,
                     every: int) -> tuple[bool, Any]:
    """What a worker sends with its batch ``batches_done``: (whether it
    records the replica's state, that state, else None). An iterable
    stream's on its snapshot steps (never with ``snapshot_every_n_steps=0``)
    and when it ran out inside this batch (as its ENDED would, so a state
    taken before that ENDED is delivered still holds where it ended); a
    map-style replica's with every batch, whatever the setting: its
    delivered batches are not fetched again on resume, so the state of any
    step must be where that replica stands (NOTE [ Resume contract ])."""
    if not fetcher.stateful:
        return False, None
    if not isinstance(fetcher, IterableDatasetFetcher) or fetcher.ended or (
            every > 0 and batches_done % every == 0):
        return True, fetcher.state()
    return False, None


def resume_replica(fetcher: DatasetFetcher, worker: WorkerState,
                   batch_size: int | None) -> None:
    """Put one worker's replica where a checkpoint left it: its state (after
    iter(), as torchdata does), then, for an iterable stream, the batches it
    delivered after that state read and dropped."""
    restore_at_step(fetcher, worker.state, worker.state_step, worker.ended)
    if isinstance(fetcher, IterableDatasetFetcher):
        skip_batches(fetcher, worker.yielded - worker.state_step, batch_size)


def restore_at_step(fetcher: DatasetFetcher, state: Any, step: int, ended: bool) -> None:
    """Restore a dataset's ``state``, recorded after its batch ``step``: an
    iterable stream's recorded before the first (step 0, the state of the
    epoch's start) may be the previous stream's end, and one recorded once
    the stream ran out (``ended``) is that stream's end (NOTE [ A stream
    restored at its end ] in fastload._fetch)."""
    if not isinstance(fetcher, IterableDatasetFetcher):
        fetcher.restore(state)
    elif ended:
        fetcher.restore_ended(state)
    elif step == 0:
        fetcher.restore_before_first_sample(state)
    else:
        fetcher.restore(state)


def resume_ended_replica(new_fetcher: Callable[[], DatasetFetcher], state: Any) -> None:
    """A persistent worker resumed between epochs: its replica put where the
    saved run's was when its stream ran out, as torchdata restores an
    end-of-epoch state: the state loaded into what keeps it (the dataset, or
    an iterator taken from it for this, whose side effects, a global RNG
    say, then stand), then the next epoch's fetcher made (``new_fetcher``
    makes the worker's fetcher and returns it), whose stream may be the
    ended one (NOTE [ A stream restored at its end ] in fastload._fetch)."""
    new_fetcher().restore(state)
    fetcher = new_fetcher()
    if state is not None:
        after_restored_end(fetcher, state)


def after_restored_end(fetcher: DatasetFetcher, loaded: Any) -> None:
    """The first epoch after an iterable dataset was restored from
    ``loaded``, where its stream ran out: its first stream may be that
    ended one (NOTE [ A stream restored at its end ] in fastload._fetch)."""
    if isinstance(fetcher, IterableDatasetFetcher) and fetcher.dataset_keeps_state:
        fetcher.read_past_an_ended_stream(loaded)


def draws_after_restored_end(sampler_iter: Iterator[Any], index_sampler: Any,
                             index_arrays: bool, loaded: Any) -> Iterator[Any]:
    """The first epoch's draws after the index sampler was restored from
    ``loaded``, where an epoch ran out: a sampler of unknown kind's first
    iteration may be that ended one (NOTE [ A stream restored at its end ]
    in fastload._fetch)."""
    if _continues_an_epoch(index_sampler) is None:
        return _remainder_or_fresh(sampler_iter, index_sampler, index_arrays, loaded)
    return sampler_iter


def _length_or_none(sampler: Any) -> float:
    """len(sampler), or infinity for a sampler without one."""
    try:
        return len(sampler)
    except TypeError:
        return float("inf")


def _continues_an_epoch(sampler: Any) -> bool | None:
    """Whether a sampler restored from a state continues that state's epoch
    at its next iteration rather than starting a new one: fastload's
    samplers and the wrapper of torch's random ones (under a BatchSampler
    too) keep that pending in ``_resume``. None for any other sampler with
    a state: its next iteration may continue the saved epoch (torchdata's
    word) or, where its state was taken once that epoch had run out (a
    short last batch drew past the end), start a new one."""
    keeper = resume_keeper(sampler)
    if keeper is None:
        return None
    return keeper._resume is not None


def _remainder_or_fresh(restored: Iterator[Any], sampler: Any, index_arrays: bool,
                        loaded: Any) -> Iterator[Any]:
    """The batches of a sampler of unknown kind restored from a state
    recorded before its epoch's first draw: ``restored``, unless it runs out
    before its first batch, having continued the previous epoch's end
    without moving the sampler's state; the epoch is then a fresh
    iteration (NOTE [ A stream restored at its end ] in fastload._fetch,
    the same for an index sampler)."""
    before = sampler_state(sampler)
    first = next(restored, _NO_BATCH)
    if first is _NO_BATCH:
        # Unless it moved the sampler on: then that epoch was empty.
        if unmoved(loaded, before, sampler_state(sampler)):
            yield from index_batches(sampler, index_arrays)
        return
    yield first
    yield from restored


def _run_out_or_restore(restored: Iterator[Any], sampler: Any, state: Any) -> None:
    """A sampler of unknown kind restored from a state recorded at the last
    batch of its epoch, before its StopIteration: run out of what is left
    of that epoch, as the saved run's next draw did, so that its next
    iteration is a new epoch. A sampler whose iteration yields, its state
    having been taken once the epoch ran out (a short last batch drew past
    its end) and so describing the new epoch already, is put back in that
    state for it (NOTE [ A stream restored at its end ] in fastload._fetch)."""
    if next(restored, _NO_BATCH) is not _NO_BATCH:
        sampler.load_state_dict(snapshot(state))


_NO_BATCH = object()
