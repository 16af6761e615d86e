"""Where an epoch stands after the last batch the user received:
``Progress``, which each delivered batch moves and ``DataLoader.state_dict()``
captures a state from, and what a snapshot step records of the index
sampler (NOTE [ Resume contract ] in fastload._checkpoint).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastload._epoch_pieces import LazyState
from fastload._loader_state import WorkerState
from fastload._state_values import Recorder, snapshot
from fastload.sampler import BatchSampler, lazy_state_getter

# What a batch that is no snapshot step carries in place of the sampler's
# state (which may itself be None: a sampler that keeps none).
NO_SNAPSHOT = object()


def sampler_state_getter(sampler: Any) -> Callable[[], Any] | None:
    """The sampler's state_dict method, or None for a sampler that keeps
    none (fastload's BatchSampler over one included: its state_dict()
    answers None, and a DataLoader would call it at every snapshot step)."""
    if type(sampler) is BatchSampler and sampler_state_getter(sampler.sampler) is None:
        return None
    getter = getattr(sampler, "state_dict", None)
    return getter if callable(getter) else None


def sampler_snapshot_getter(sampler: Any, latest_only: bool = False
                            ) -> Callable[[], Any] | None:
    """What a snapshot step records of the sampler: a LazyState of it for
    fastload's random samplers (``recorded_state`` makes it the
    state_dict() when a state is taken), else sampler_state_getter's,
    recorded for a sampler of unknown kind, whose state_dict() may return
    an object it keeps updating, unless each recorded state stays the
    latest until a checkpoint copies it (``latest_only``: NOTE [ Recorded
    states ] in fastload._state_values)."""
    lazy = lazy_state_getter(sampler)
    if lazy is not None:
        return lazy
    getter = sampler_state_getter(sampler)
    if getter is None or latest_only or resume_keeper(sampler) is not None:
        return getter
    return Recorder(getter)


def resume_keeper(sampler: Any) -> Any:
    """What keeps a restored state's resume pending in ``_resume`` (fastload's
    samplers and the wrapper of torch's random ones, under a BatchSampler
    too), or None for a sampler of unknown kind."""
    while not hasattr(sampler, "_resume") and hasattr(sampler, "sampler"):
        sampler = sampler.sampler
    return sampler if hasattr(sampler, "_resume") else None


def recorded_state(recorded: Any) -> Any:
    """The sampler's state a snapshot step recorded, as its state_dict(), for
    a checkpoint: a LazyState made into a new one, anything else copied (it
    may be the sampler's own, recorded as returned: NOTE [ Recorded states ]
    in fastload._state_values)."""
    return recorded() if type(recorded) is LazyState else snapshot(recorded)


def sampler_state(sampler: Any) -> Any:
    """The sampler's state_dict() (a snapshot of it for a sampler of unknown
    kind, as sampler_snapshot_getter's), or None for a sampler that keeps
    none."""
    getter = sampler_state_getter(sampler)
    if getter is None:
        return None
    return getter() if resume_keeper(sampler) is not None else snapshot(getter())


class Progress:
    """Where an epoch stands after the last batch the user received: what a
    state is captured from.

    ``sampler`` is the index sampler's state recorded when the indices of
    batch ``sampler_step`` were drawn; ``dataset`` likewise for a dataset
    loaded in this process; ``workers`` for replicas loaded by workers
    (None when none is tracked).
    """

    def __init__(self, epoch: int, base_seed: int, map_style: bool) -> None:
        self.epoch = epoch
        self.base_seed = base_seed
        self.map_style = map_style
        self.yielded = 0
        self.finished = False
        self.sampler: Any = None
        self.sampler_step = 0
        self.dataset: Any = None
        self.dataset_step = 0
        self.dataset_ended = False
        self.workers: list[WorkerState] | None = None
        self.next_worker = 0
        # The seed an IterDataPipe's shufflers got this epoch (None: derived).
        self.datapipe_seed: int | None = None
        # in_order=False: positions delivered past the first one missing,
        # each with the sampler's state recorded when it was drawn (or None).
        # ``yielded`` then counts the contiguous prefix only.
        self.beyond: dict[int, Any] = {}
        # Thread workers fetching a shared dataset with a state in turns:
        # their FetchTurns (fastload._worker_thread), for ThreadIter.
        self.shared_fetches: Any = None

    def deliver(self, position: int, sampler_state: Any) -> None:
        """Batch ``position`` of the epoch was delivered (map-style), with
        the sampler's state if it was a snapshot step (else NO_SNAPSHOT)."""
        if position != self.yielded:
            self.beyond[position] = sampler_state
            return
        while True:
            self.yielded += 1
            if sampler_state is not NO_SNAPSHOT:
                self.sampler, self.sampler_step = sampler_state, self.yielded
            if self.yielded not in self.beyond:
                return
            sampler_state = self.beyond.pop(self.yielded)

    def stream_ended(self, task: Any) -> None:
        """A worker's iterable stream ran out (its ENDED task): past its end
        a stream's state is where the next epoch starts (None: a new
        iterator then starts afresh)."""
        if self.workers is not None:
            worker = self.workers[task.worker_id]
            worker.ended = True
            worker.state, worker.state_step = task.dataset_state, worker.yielded

    @property
    def delivered(self) -> int:
        """Batches of the epoch delivered: ``yielded`` and those delivered
        out of order beyond them."""
        return self.yielded + len(self.beyond)

    def advance(self, task: Any) -> None:
        """Move past a batch a worker loaded, as it is delivered. ``task`` has
        ``worker_id``; ``position`` in the epoch (map-style: see ``deliver``);
        ``sampler_state`` (NO_SNAPSHOT but on a snapshot step);
        ``has_dataset_state`` and ``dataset_state`` (the worker's dataset
        replica after that batch); ``dataset_ended``."""
        if self.map_style and (task.position != self.yielded or self.beyond):
            self.deliver(task.position, task.sampler_state)
        else:  # the next position, as it is for nearly every batch
            self.yielded += 1
            if task.sampler_state is not NO_SNAPSHOT:
                self.sampler, self.sampler_step = task.sampler_state, self.yielded
        if self.workers is None:
            if task.has_dataset_state:
                # A map-style dataset worker threads share: the main
                # process's own (NOTE [ Resume contract ]).
                self.dataset, self.dataset_step = task.dataset_state, self.yielded
            return
        worker = self.workers[task.worker_id]
        worker.yielded += 1
        if task.has_dataset_state:
            worker.state, worker.state_step = task.dataset_state, worker.yielded
        # A short last batch ran the worker's iterator out: a resume must
        # not start that iterator again.
        worker.ended = worker.ended or task.dataset_ended
        self.next_worker = (task.worker_id + 1) % len(self.workers)
