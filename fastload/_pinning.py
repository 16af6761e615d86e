"""pin_memory=True: which torch pins, how a batch is pinned, and the thread
that pins worker iterators' batches ahead of their delivery.

NOTE [ Pinning by copy ]
pin_memory=True copies each batch into torch's page-locked memory, on
every path: in the main thread as it is delivered without workers (as
torch's single-process iterator does), and for worker processes and threads
on a pinning thread as soon as the batch is ready (``Pinner``, fed by
``TaskTable.finish``), as torch's pin-memory thread does, so the copy
overlaps with the training loop. Worker processes' slots in shared memory
could be pinned and registered with CUDA instead, sparing that copy, and
fastload once did so; it is unsafe. ``x.to("cuda", non_blocking=True)``
queues a copy that reads x when the GPU gets to it, which can be after the
loop has dropped x and a worker has written a later batch into its slot.
torch's host allocator guards its own memory: the copy records an event on
the block it came from (found by its start address, also through a numpy
view of it or torch.from_numpy of that view), and the block is reused only
once the event has passed. A slot has no such guard. On an H100, with each
copy queued behind 20 ms of GPU work, 19 of 24 batches from pinned slots
reached the GPU overwritten by later ones, and none copied into torch's
memory (tests/test_pinning.py's CUDA test does the same).
"""
from __future__ import annotations

import collections
import queue
import threading
import traceback
import weakref
from collections.abc import Mapping, Sequence
from concurrent import futures
from concurrent.futures import Future
from typing import Any

import numpy as np

from fastload._torch import torch_or_none
from fastload._warnings import warn_at_caller
from fastload.collate import rebuild_mapping, rebuild_sequence


def pin_target(loader: Any) -> Any:
    """torch when batches can and should be pinned, else None (with torch's
    warnings when pinning was asked for but cannot happen)."""
    if not loader.pin_memory:
        return None
    if loader.pin_memory_device:
        warn_at_caller(
            "pin_memory_device is deprecated, the current accelerator will be used "
            f"as the device, ignore pin_memory_device='{loader.pin_memory_device}'."
        )
    torch = torch_or_none()
    if torch is None or not _device_function(torch, "is_available")():
        warn_at_caller(
            "'pin_memory' argument is set as true but no accelerator is found, "
            "then device pinned memory won't be used."
        )
        return None
    return torch


def _device_function(torch: Any, name: str) -> Any:
    """torch's function ``name`` (``is_available``, ``current_device_index``,
    ``set_device_index``) for its current accelerator, by the API the
    installed torch has: ``torch.accelerator`` from torch 2.6 (whose device
    functions end in ``_idx`` in 2.6), ``torch.cuda`` before, which torch's
    own pin-memory thread used then."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None:
        return getattr(torch.cuda, _CUDA_NAMES[name])
    found = getattr(accelerator, name, None)
    return found if found is not None else getattr(accelerator, name.replace("_index", "_idx"))


_CUDA_NAMES = {"is_available": "is_available", "current_device_index": "current_device",
               "set_device_index": "set_device"}


def pin_batch(torch: Any, data: Any) -> Any:
    """``data`` with each numeric array and tensor copied into page-locked
    memory: torch's pin_memory rules (an object with a ``pin_memory()``
    method pins itself; mappings and sequences keep their type where it can
    be rebuilt, mutable ones through a shallow copy that keeps any other
    attribute), and numpy arrays stay numpy, viewing the pinned tensor."""
    if isinstance(data, np.ndarray):
        if data.dtype.kind not in "biufc":
            return data
        return torch.from_numpy(data).pin_memory().numpy()
    if isinstance(data, torch.Tensor) or hasattr(data, "pin_memory"):
        return data.pin_memory()
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, Mapping):
        return rebuild_mapping(data, {key: pin_batch(torch, value) for key, value in data.items()})
    if isinstance(data, tuple):
        if hasattr(data, "_fields"):  # a namedtuple
            return type(data)(*(pin_batch(torch, item) for item in data))
        return type(data)(pin_batch(torch, item) for item in data)
    if isinstance(data, Sequence):
        return rebuild_sequence(data, [pin_batch(torch, item) for item in data])
    return data


# How long a stopping loader waits for the copy its pinning thread is making
# (a GiB batch takes well under a second); past it, a stuck copy is left to
# the daemon thread rather than hanging the program.
JOIN_SECONDS = 10.0


class PinTimedOut(Exception):
    """A batch was not pinned within the loader's ``timeout``."""


class PinnedLater(Future):  # type: ignore[type-arg]
    """A ready batch being pinned by a Pinner: its ``result()`` is the pinned
    batch, or raises what pinning raised."""

    def __init__(self, batch: Any) -> None:
        super().__init__()
        self._batch = batch

    def within(self, timeout: float | None) -> Any:
        """``result()``, waiting at most ``timeout`` seconds for it (None: for
        ever); PinTimedOut when the batch is not pinned by then."""
        done, _ = futures.wait([self], timeout)
        if not done:
            raise PinTimedOut
        return self.result()

    def discard(self) -> None:
        """Give the batch up (an abandoned epoch's): not pinned if that has
        not begun, and its slot free at once. One being pinned finishes."""
        if self.cancel():  # the Future's lock: the pinning has not begun
            self._batch = None


class Pinner:
    """A worker iterator's pinning thread (NOTE [ Pinning by copy ]),
    started at the first batch, once worker processes are forked: no thread
    runs then, and asking for the current device, which starts CUDA, comes
    after the fork, as in torch. It pins for the accelerator that is current
    in the thread that gives it batches (a new thread's would be the first
    one: with one process per GPU, each would make a context on that GPU),
    with one intra-op thread, as torch's pin-memory thread does. It holds
    only its queue. Once the Pinner is gone or ``stop()`` is called (the
    iterator's epochs are over), the batches not being pinned yet are given
    up and the thread is waited for, at most JOIN_SECONDS, as torch joins
    its pin-memory thread: no copy is left running once the loader stopped.
    A batch given to it after, or when no thread could be started, is
    pinned in the calling thread. ``submit`` never raises: a batch it
    cannot pin raises in its place."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self._jobs: queue.SimpleQueue[PinnedLater | None] = queue.SimpleQueue()
        # What was given to the thread and is not pinned yet, oldest first;
        # each holds its batch's slot until then.
        self._pending: collections.deque[PinnedLater] = collections.deque()
        # The thread, once started; the finalizer (_stop) joins it.
        self._started: list[threading.Thread] = []
        self.stop = weakref.finalize(self, _stop, self._jobs, self._pending, self._started)

    def submit(self, batch: Any) -> PinnedLater:
        """The batch, pinned on the thread."""
        pinned = PinnedLater(batch)
        del batch
        if not self._started and self.stop.alive:
            self._start()
        if not self.stop.alive:
            _pin(self._torch, pinned)
            return pinned
        pending = self._pending
        while pending and pending[0].done():
            pending.popleft()
        pending.append(pinned)
        self._jobs.put(pinned)
        return pinned

    def wait_for_one(self, timeout: float | None = None) -> bool:
        """Wait until the oldest batch not pinned yet is (its slot is then
        free), at most ``timeout`` seconds (None: for ever; PinTimedOut past
        it, the batch still pending); whether there was one."""
        pending = self._pending
        while pending and pending[0].done():
            pending.popleft()
        if not pending:
            return False
        pending[0].within(timeout)
        pending.popleft()
        return True

    def _start(self) -> None:
        try:
            device: int | BaseException = _device_function(self._torch, "current_device_index")()
        except Exception as exc:  # each batch raises it, in its place
            device = exc
        thread = threading.Thread(target=_pin_jobs, args=(self._torch, device, self._jobs),
                                  name="fastload-pin-memory", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # no thread to be had: pin in the calling thread
            self.stop()
            return
        self._started.append(thread)


def _stop(jobs: queue.SimpleQueue[PinnedLater | None], pending: collections.deque[PinnedLater],
          started: list[threading.Thread]) -> None:
    """Pinner.stop (see its docstring)."""
    for pinned in pending:
        pinned.discard()
    pending.clear()
    jobs.put(None)
    for thread in started:
        if thread is not threading.current_thread():
            thread.join(JOIN_SECONDS)


def _pin_jobs(torch: Any, device: int | BaseException,
              jobs: queue.SimpleQueue[PinnedLater | None]) -> None:
    failure = device if isinstance(device, BaseException) else None
    if failure is None:
        try:
            torch.set_num_threads(1)  # this thread's: its copies take one core
            _device_function(torch, "set_device_index")(device)
        except Exception as exc:
            failure = exc
    while True:
        pinned = jobs.get()
        if pinned is None:
            return
        _pin(torch, pinned, failure)
        del pinned


def _pin(torch: Any, pinned: PinnedLater, failure: BaseException | None = None) -> None:
    """Pin ``pinned``'s batch into it, unless it was discarded; with
    ``failure`` (the thread could not be set up), fail it with that. The
    batch is dropped before ``pinned`` is done, so that its slot is free by
    then (a loader at its pool's cap waits for that, _process_slots)."""
    if not pinned.set_running_or_notify_cancel():
        return  # discarded: its batch is gone already
    batch, pinned._batch = pinned._batch, None
    try:
        if failure is not None:
            raise RuntimeError(f"cannot pin batches for the accelerator: {failure!r}") from failure
        result = pin_batch(torch, batch)
    except BaseException as exc:  # the loop gets it at that batch, as without the thread
        del batch
        # The frames keep their lines for the traceback, not the batch.
        traceback.clear_frames(exc.__traceback__)
        pinned.set_exception(exc)
    else:
        del batch
        pinned.set_result(result)
