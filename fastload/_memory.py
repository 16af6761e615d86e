"""Memory policy for batches in shared memory.

fastload_c provides the mechanism (SlabPool); this module decides how large
the slab pool may grow, how large its first slots are, and which slots stay
unmapped while free. Pinning is not done here: the slots are never pinned
(NOTE [ Pinning by copy ] in fastload._pinning).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from fastload.dataset import gathered_columns
from fastload_c import pack, shm
from fastload_c.slab import SlabPool

__all__ = [
    "SlotSizeWatch",
    "batch_slot_bytes",
    "default_max_bytes",
    "new_pool",
]


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
#   again (SlabPool's ``unmapped_slot_bytes``), only for loaders whose
#   workers collate that way
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


def new_pool(slot_size: int, *, max_bytes: Optional[int] = None,
             slots_per_segment: int = SLOTS_PER_SEGMENT,
             segment_bytes: int = SEGMENT_BYTES, unmapped_slot_bytes: int = 0,
             on_segment: Optional[Callable[..., None]] = None,
             on_retire: Optional[Callable[[int], None]] = None) -> SlabPool:
    """A SlabPool under this policy. ``on_segment`` and ``on_retire`` are
    the caller's, e.g. to send segments to workers.
    ``unmapped_slot_bytes``: SlabPool's (NOTE [ Unmapped slots ]).
    """
    return SlabPool(slot_size, slots_per_segment=slots_per_segment, segment_bytes=segment_bytes,
                    max_bytes=default_max_bytes() if max_bytes is None else max_bytes,
                    unmapped_slot_bytes=unmapped_slot_bytes, on_segment=on_segment,
                    on_retire=on_retire)


# NOTE [ Slots after a spike ]
# A pool's slots grow to hold the largest batch so far (fastload_c.slab),
# and the pages a batch wrote stay allocated while the pool reuses its
# slot. After one batch far larger than the others (a long document, a
# large image), every later slot would be that large: the pages the spike
# wrote would stay charged for the loader's life, and a pool whose slots
# of that size reach its cap would copy every later batch out of its slot.
# So where slots are WATCHED_SLOT_BYTES or more, the loader notes where each
# batch ends in its slot (pack.layout_end: a C lookup, a batch that large
# costs milliseconds to make); once SPIKE_WINDOW batches in a row each
# needed a quarter of the slot size or less, the slots shrink to the
# largest of them plus an eighth, and acquire() drops the segments of the
# old size once their slots are free, pages and all. A later batch that
# needs more raises the size again, as any batch does; where that happens
# after a shrink, the spikes recur, so the next shrink waits twice as many
# batches (each regrowth makes and zeroes a segment: ~15 ms for 70 MiB), up
# to MAX_SPIKE_WINDOW: past it a regrowth costs less than a batch in a
# thousand of those sizes, and a loader whose spikes stopped would
# otherwise keep their pages ever longer.
# Smaller slots are not watched: what they could keep is small, and every
# batch would pay.
WATCHED_SLOT_BYTES = 1 << 20
SPIKE_WINDOW = 64
MAX_SPIKE_WINDOW = 64 * SPIKE_WINDOW


class SlotSizeWatch:
    """NOTE [ Slots after a spike ], for one pool."""

    def __init__(self) -> None:
        self._window = SPIKE_WINDOW
        self._count = 0
        self._largest = 0
        self._shrunk_to = 0  # the slot size of the last shrink, until it grows

    def saw(self, pool: SlabPool, layout: bytes) -> bool:
        """Note a batch written with ``layout`` (pack's), in a slot of at
        least WATCHED_SLOT_BYTES; whether the pool's slots shrank after it."""
        end = pack.layout_end(layout)
        if self._shrunk_to and pool.slot_size > self._shrunk_to:
            # Grown back since the last shrink: spikes recur.
            self._window = min(2 * self._window, MAX_SPIKE_WINDOW)
            self._shrunk_to = 0
        self._count += 1
        if end > self._largest:
            self._largest = end
        if self._count < self._window:
            return False
        largest, self._count, self._largest = self._largest, 0, 0
        if largest * 4 > pool.slot_size:
            return False
        pool.shrink_to(largest + largest // 8)
        self._shrunk_to = pool.slot_size
        return True
