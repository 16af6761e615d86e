"""Memory policy for batches in shared memory.

fastload_c provides the mechanism (Segment.pin, SlabPool); this module
decides what to do with it: whether a segment may be pinned under
RLIMIT_MEMLOCK and what happens when it may not, when pinned segments are
registered with CUDA, how large the slab pool may grow, and how large its
first slots are.
"""
from __future__ import annotations

import errno
import resource
import sys
import warnings
from typing import Any, Callable, Optional

from fastload.dataset import gathered_columns
from fastload_c import shm
from fastload_c.errors import ShmError
from fastload_c.slab import SlabPool

__all__ = [
    "PinningWarning",
    "batch_slot_bytes",
    "default_max_bytes",
    "locked_bytes",
    "memlock_limit",
    "new_pool",
    "pin_segment",
    "register_cuda",
]

# CAP_IPC_LOCK lifts RLIMIT_MEMLOCK (capabilities(7)).
_CAP_IPC_LOCK = 14
# mlock's answers when the limit (or a missing capability) refuses it.
_LIMIT_ERRNOS = (errno.ENOMEM, errno.EPERM, errno.EAGAIN)

_warned = False


class PinningWarning(RuntimeWarning):
    """Batch memory could not be pinned and is used unpinned instead."""


def _status_field(name: str) -> Optional[str]:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split(":", 1)[1].strip()
    return None


def locked_bytes() -> int:
    """Bytes this process has locked in RAM now (VmLck)."""
    value = _status_field("VmLck")
    return int(value.split()[0]) * 1024 if value else 0


def memlock_limit() -> Optional[int]:
    """Bytes this process may lock, or None when nothing limits it
    (RLIMIT_MEMLOCK unlimited, or CAP_IPC_LOCK, as for root)."""
    caps = _status_field("CapEff")
    if caps is not None and int(caps, 16) >> _CAP_IPC_LOCK & 1:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else soft


def pin_segment(segment: shm.Segment, *, strict: bool = False) -> bool:
    """Pin ``segment`` (mlock + prefault); True when it is pinned.

    When RLIMIT_MEMLOCK does not allow it, decided before locking anything:
    in strict mode raise ShmError naming the limit and the size needed;
    otherwise warn once per process (PinningWarning) and leave it unpinned,
    which works, only without the guarantee against page faults and swap.
    """
    limit = memlock_limit()
    locked = locked_bytes()
    if limit is not None and locked + segment.size > limit:
        return _refuse(segment.size, limit, locked, strict, None)
    try:
        segment.pin()
    except ShmError as exc:
        # The kernel counts locked pages its own way (other mappings, other
        # threads): its refusal gets the same treatment as ours.
        if exc.errno not in _LIMIT_ERRNOS:
            raise
        return _refuse(segment.size, limit, locked, strict, exc)
    return True


def _refuse(size: int, limit: Optional[int], locked: int, strict: bool,
            cause: Optional[BaseException]) -> bool:
    message = (
        "cannot pin {} bytes of batch memory: RLIMIT_MEMLOCK is {} bytes and {} are locked "
        "already, so pinning needs a limit of at least {}. Raise it (ulimit -l; "
        "docker run --ulimit memlock=-1) or pass pin_memory=False".format(
            size, "unknown" if limit is None else limit, locked, locked + size))
    if strict:
        raise ShmError(errno.ENOMEM, message) from cause
    _warn_once(message + "; using unpinned memory.")
    return False


def _warn_once(message: str) -> None:
    # Once per process: a pool growing past the limit would say it per segment.
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(message, PinningWarning, stacklevel=4)


def register_cuda(segment: shm.Segment, *, cuda: Optional[bool] = None,
                  strict: bool = False) -> bool:
    """Register ``segment`` with the CUDA driver so copies from it to a GPU
    are DMA (``tensor.to("cuda", non_blocking=True)`` does not stage them);
    unregistered when the segment is released. True when registered.

    ``cuda`` None registers when torch is already imported and sees a GPU
    (fastload never imports torch for the user); True imports torch and
    raises ShmError when CUDA is missing; False never registers. When the
    driver refuses, ShmError if ``cuda`` or ``strict``, else warn once
    (PinningWarning) and go on unregistered.
    """
    if cuda is False:
        return False
    torch = sys.modules.get("torch")
    if torch is None and cuda:
        import torch
    if torch is None or not torch.cuda.is_available():
        if cuda:
            raise ShmError(errno.ENODEV, "cannot register batch memory with CUDA: "
                                         "torch sees no CUDA device")
        return False
    cudart = torch.cuda.cudart()
    address, size = segment.address, segment.size
    err = int(cudart.cudaHostRegister(address, size, 0))
    if err != 0:
        message = "cudaHostRegister of {} bytes of batch memory failed: CUDA error {}".format(
            size, err)
        if cuda or strict:
            raise ShmError(errno.EIO, message)
        _warn_once(message + "; copies to the GPU will be staged.")
        return False
    segment.on_release(_Unregister(cudart, address))
    return True


class _Unregister:
    """Release hook: cudaHostUnregister before the mapping goes away. Holds
    the address, not the segment, which it would keep alive."""

    def __init__(self, cudart, address: int):
        self.cudart = cudart
        self.address = address

    def __call__(self) -> None:
        err = int(self.cudart.cudaHostUnregister(self.address))
        if err != 0:
            raise ShmError(errno.EIO, "cudaHostUnregister failed: CUDA error {}".format(err))


# Each array of a gathered batch starts on this boundary in its slot (as
# fastload_c.pack lays them out).
_SLOT_ALIGN = 64


def batch_slot_bytes(dataset: Any, batch_size: Optional[int]) -> Optional[int]:
    """The bytes a full batch of ``dataset`` takes in a slot, where that is
    known before any batch is made: rows of ``gathered_columns`` (a
    numeric ``ArrayDataset``, say), which workers gather whole into their
    slot. A pool
    whose first slots are that size never grows them. None elsewhere: the
    first batch that needs more raises the size (to exactly its own; see
    fastload_c.slab for batches that vary)."""
    columns = gathered_columns(dataset)
    if columns is None or not batch_size:
        return None
    size = 0
    for column in columns:
        size = -(-size // _SLOT_ALIGN) * _SLOT_ALIGN + batch_size * column[:1].nbytes
    return size


# Slots per pool segment, and the most bytes a segment of more than one slot
# takes. A loader's slots are those of the batches being written, waiting
# and held by the loop, rarely a multiple of the segment's: every slot of a
# segment is reserved (and zeroed, by the main process, while the loop
# waits) when it is made. So a segment holds two small slots, which spares a
# mapping per slot, and one large slot: a spare slot of 19 MB is memory no
# batch uses, and zeroing it delayed the first batch by 12 ms.
SLOTS_PER_SEGMENT = 2
SEGMENT_BYTES = 8 << 20


# NOTE [ Unmapped slots ]
# A process's PSS counts a page of shared memory while the process maps it.
# The pool's slots are reused, so once every worker has written into every
# slot, all of the pool stays mapped in the workers (and, once read, in the
# main process) whether a batch is in a slot or not; torch's batches in
# flight sit in files that no process maps until the main process receives
# them. On torchvision's batches of 19 MiB that was 100 MiB more PSS than
# torch with 2 workers. So for slots of UNMAPPED_SLOT_BYTES or more:
# * a worker process writes the arrays of a batch it collates by default
#   with pwritev to the segment's memfd (pack.collate_into's ``fd``) rather
#   than through its mapping: the kernel copies into the segment's pages and
#   the worker maps none of them. It keeps the descriptors of segments that
#   large open for that, at most UNMAPPED_SEGMENT_FDS; past that, and for
#   other batches (gathered rows, whose copy is the worker's whole work,
#   pickled ones), it writes through its mapping as before;
# * the main process unmaps its own pages of a slot when the slot is free
#   again (SlabPool's ``unmapped_slot_bytes``), unless the segment is
#   pinned, and only for loaders whose workers collate that way
#   (_fast_path.BatchWriter.writes_through_files): where they gather rows,
#   their mappings hold the pages anyway, and a loop reading its batches
#   would only fault them in again (a worker thread gathering into a slot it
#   had to fault in ran 4x slower on 32 MiB batches);
# * worker threads write as worker processes do, into their pool's
#   segments in the main process, whose descriptors stay open.
# So a batch's pages are mapped where a program holds it, as torch's are.
# The pages stay allocated (the pool's charged memory does not change):
# keeping them is what spares page faults. Why not unmap them in the worker
# after a write: on a VM here, writing 19 MiB through a fresh mapping took
# 21 ms (page faults), against 2.0 ms into a mapped slot and 5.1 ms by
# pwritev; a batch that large takes a worker 100 ms or more to make. The
# price is the main process's: a loop that reads its batches maps their
# pages again, as torch's does. Reading batches of 19 MiB, its CPU per
# batch went from 1.2-1.5 ms to 5.8-6.4 ms (torch's: 9.7-10.1 ms).
UNMAPPED_SLOT_BYTES = 4 << 20
UNMAPPED_SEGMENT_FDS = 64


def default_max_bytes() -> int:
    """How large a slab pool may grow: half the memory a new segment could
    take now. Past it, batches a user holds on to are copied out of the
    pool rather than growing it into the OOM killer."""
    return shm.available() // 2


def new_pool(slot_size: int, *, pin_memory: bool = False, strict: bool = False,
             cuda: Optional[bool] = None, max_bytes: Optional[int] = None,
             slots_per_segment: int = SLOTS_PER_SEGMENT,
             segment_bytes: int = SEGMENT_BYTES, unmapped_slot_bytes: int = 0,
             on_segment: Optional[Callable[..., None]] = None,
             on_retire: Optional[Callable[[int], None]] = None) -> SlabPool:
    """A SlabPool under this policy.

    With ``pin_memory`` every segment is pinned (pin_segment) and, when
    pinned, registered with CUDA (register_cuda) before any slot of it is
    used; ``strict`` makes either refusal an error instead of a warning. ``on_segment`` (after that) and
    ``on_retire`` are the caller's, e.g. to send segments to workers.
    ``unmapped_slot_bytes``: SlabPool's (NOTE [ Unmapped slots ]).
    """
    def prepare(seg_id, segment, size, nslots):
        if pin_memory and pin_segment(segment, strict=strict):
            register_cuda(segment, cuda=cuda, strict=strict)
        if on_segment is not None:
            on_segment(seg_id, segment, size, nslots)

    return SlabPool(slot_size, slots_per_segment=slots_per_segment, segment_bytes=segment_bytes,
                    max_bytes=default_max_bytes() if max_bytes is None else max_bytes,
                    unmapped_slot_bytes=unmapped_slot_bytes, on_segment=prepare, on_retire=on_retire)
