# distutils: sources = fastload_c/src/fl_slab.c
"""The slab pool: equal-size slots in shared segments, one batch per slot.

The pool lives in the main process. It hands out slots as Leases; a worker
writes a batch into a slot of a segment it received (fastload_c.pack), and
the main process views the batch over the same slot (pack.unpack), with the
Lease as the arrays' base object.

NOTE [ Slot ownership and lifetime ]
A slot is owned by exactly one Lease, from acquire() until that Lease object
is deallocated; only then does the slot go back on its segment's free stack.
Nothing else frees a slot (there is no release() method), so no code path can
free a slot that something still references.

Who holds the Lease:
1. the main process, from acquire() while the task is in flight; the worker
   writes through its own mapping of the segment, named by (segment id,
   offset, capacity), and never holds a Lease;
2. after unpack, every array of the batch: each view's base object is the
   Lease (numpy collapses chains of views to it), so slices, reshapes,
   torch.from_numpy tensors and memoryviews keep it alive too; the arrays of
   a pickle-5 batch hold memoryview slices of the Lease, which hold it.
The slot is free when the last of these is gone: at once under CPython's
reference counting, or when the cycle collector frees a view caught in a
reference cycle.

So nothing a user holds is ever overwritten: a worker writes only into the
slot of its task, the main process names in a task only a slot it has just
taken from acquire(), i.e. one no Lease owned, and a slot a user still views
has a live Lease, so it is on no free stack. The main process's part is to
keep the task's Lease until the worker's result arrived, the worker said
the batch does not fit (a NEED: it writes nothing more into that slot), or
the worker is known dead: dropping it on a timeout while the worker still
runs would let a late write land in a slot that was handed out again, so a
timed-out worker is terminated before its Leases are dropped.

Growth: when every slot is taken the pool adds a segment, up to max_bytes;
beyond that acquire() returns None and the caller copies out (gives that
batch private memory) instead of waiting for a user who may never let go.
When a batch does not fit, acquire(nbytes) raises the slot size; segments of
the old size get no new leases and are dropped (on_retire tells the caller,
so workers can unmap them) once all their slots are free. The first raise
gives slots of exactly the batch's size (page-rounded): batches of a fixed
size, the usual case, then waste nothing. Only a batch larger than that
one shows that they vary; from then on each raise adds an eighth of
headroom, so a few large batches cannot make the slots grow again and again.
shrink_to() lowers the slot size again (the caller's policy decides when);
segments of any size but the current one are dropped likewise once free.
A Lease keeps its segment mapped on its own, so closing the pool while
batches are held is safe.

Threads: the pool and its Leases are used with the GIL held (a Lease is
deallocated with the GIL held too), so the free stacks need no lock. A
forked child inherits a copy of the pool and must not use it.
"""
cimport cython
from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_FillInfo, PyBuffer_Release, PyObject_GetBuffer

include "_status.pxi"

import mmap

from fastload_c.shm import Segment

cdef size_t _PAGE = mmap.PAGESIZE


# Both give slots back in __dealloc__: a garbage-cycle collection must not
# clear their references first.
@cython.no_gc_clear
cdef class _SlabSegment:
    def __cinit__(self, int id, Segment segment, size_t slot_size, uint32_t nslots):
        self.slots = fl_slots_new(nslots)
        if self.slots == NULL:
            raise_errno("cannot make the slot table of {} slots".format(nslots), MemoryError)
        # The export makes Segment.close() refuse while any Lease lives.
        PyObject_GetBuffer(segment, &self.view, PyBUF_WRITABLE)
        self.held = True
        self.id = id
        self.segment = segment
        self.slot_size = slot_size

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.view)
        fl_slots_free(self.slots)


@cython.no_gc_clear
cdef class Lease:
    """Ownership of one slot; the slot is free again when this object dies.

    A writable buffer of ``capacity`` bytes (the slot in this process).
    ``segment_id``, ``offset`` and ``capacity`` name the slot to a worker
    holding the same segment. See NOTE [ Slot ownership and lifetime ].
    """

    def __cinit__(self):
        self.addr = NULL

    def __init__(self):
        raise TypeError("Leases come from SlabPool.acquire()")

    def __dealloc__(self):
        cdef int rc = 0
        if self._owner is None:
            return
        # Unmapped before the slot is free: nobody can be using it.
        if self._owner.unmap_free:
            with nogil:
                rc = fl_slab_unmap_pages(self.addr, self.capacity)
        # Cannot fail: this Lease took the slot and is its only owner.
        fl_slots_give(self._owner.slots, self.slot)
        if rc != 0:  # reported as unraisable: a dealloc cannot raise
            raise_errno("cannot unmap the pages of a free slot")

    @property
    def segment_id(self):
        return self._owner.id

    @property
    def segment(self):
        return self._owner.segment

    def __getbuffer__(self, Py_buffer *buffer, int flags):
        PyBuffer_FillInfo(buffer, self, self.addr, self.capacity, 0, flags)

    def __reduce__(self):
        raise TypeError("a Lease cannot leave its process; send (segment_id, offset, capacity) "
                        "to the worker instead")

    def __repr__(self):
        return "<fastload_c.slab.Lease segment={} slot={} offset={} capacity={}>".format(
            self._owner.id, self.slot, self.offset, self.capacity)


cdef class SlabPool:
    """Slots of ``slot_size`` bytes (rounded up to pages) in shared segments.

    ``slots_per_segment`` slots make one segment, fewer where they would
    pass ``segment_bytes`` (0: no limit), never fewer than one; the first
    segment is made here.
    ``max_bytes`` caps the bytes of all segments (0: no cap but memory).
    Slots of ``unmapped_slot_bytes`` or more (0: none) keep no page mapped
    in this process while free; their contents stay in the segment (NOTE
    [ Unmapped slots ] in fastload/_memory.py says why).
    ``on_segment(id, segment, slot_size, nslots)`` is called for every new
    segment before any of its slots is used (send it to workers, say); if
    it raises, the segment is discarded and the exception propagates.
    ``on_retire(id)`` is called when a segment of an outgrown slot size is
    dropped. See NOTE [ Slot ownership and lifetime ].
    """

    def __init__(self, size_t slot_size, *, uint32_t slots_per_segment=4,
                 size_t segment_bytes=0, size_t max_bytes=0, size_t unmapped_slot_bytes=0,
                 on_segment=None, on_retire=None):
        if slot_size == 0 or slots_per_segment == 0:
            raise ValueError("slot_size and slots_per_segment must be positive")
        self.slot_size = fl_slab_round_slot(slot_size, _PAGE)
        if self.slot_size == 0:
            raise OverflowError("cannot make slots of {} bytes".format(slot_size))
        self.slots_per_segment = slots_per_segment
        self.segment_bytes = segment_bytes
        self.max_bytes = max_bytes
        self.unmapped_slot_bytes = unmapped_slot_bytes
        self._on_segment = on_segment
        self._on_retire = on_retire
        self._segments = []
        self._next_id = 0
        self._closed = False
        if self._grow() is None:
            raise ValueError("max_bytes={} cannot hold one slot of {} bytes"
                             .format(max_bytes, self.slot_size))

    def acquire(self, size_t nbytes=0):
        """A Lease on a free slot of at least ``nbytes``, or None at the cap.

        ``nbytes`` larger than the slot size (a SlotTooSmallError's
        ``needed``) raises the slot size for this and every later lease.
        None means every slot is taken and max_bytes allows no new segment:
        the caller copies that batch out of the pool instead.
        """
        if self._closed:
            raise ValueError("SlabPool is closed")
        cdef size_t grown
        if nbytes > self.slot_size:
            grown = fl_slab_grown_slot_size(self.slot_size, nbytes, _PAGE, self._sized_by_batch)
            if grown == 0:
                raise OverflowError("cannot make slots of {} bytes".format(nbytes))
            if self.max_bytes and grown > self.max_bytes:
                # The growth margin must not make a slot the cap cannot hold
                # (every later acquire would then return None).
                if not self.can_hold(nbytes):
                    return None  # no slot under the cap holds it; sizes stay
                grown = fl_slab_round_slot(nbytes, _PAGE)
            self.slot_size = grown
            self._sized_by_batch = True
        self._retire_idle()
        cdef _SlabSegment seg
        for seg in reversed(self._segments):
            if seg.slot_size == self.slot_size and fl_slots_free_count(seg.slots) > 0:
                return self._take(seg)
        seg = self._grow()
        return None if seg is None else self._take(seg)

    def can_hold(self, size_t nbytes):
        """Whether a slot of ``nbytes`` fits under ``max_bytes`` (always
        without a cap): slots are whole pages, so a request just under the
        cap may not."""
        cdef size_t size = fl_slab_round_slot(nbytes, _PAGE)
        return not self.max_bytes or (size != 0 and size <= self.max_bytes)

    def shrink_to(self, size_t nbytes):
        """Lower the slot size to ``nbytes`` (page-rounded) for every later
        lease; no change when that is not smaller. Segments of the old size
        get no new leases, and acquire() drops each once its slots are free."""
        if self._closed:
            raise ValueError("SlabPool is closed")
        cdef size_t size = fl_slab_round_slot(nbytes if nbytes else 1, _PAGE)
        if size != 0 and size < self.slot_size:
            self.slot_size = size

    cdef Lease _take(self, _SlabSegment seg):
        cdef int64_t i = fl_slots_take(seg.slots)
        cdef Lease lease = Lease.__new__(Lease)
        lease._owner = seg
        lease.slot = <uint32_t>i
        lease.offset = <size_t>i * seg.slot_size
        lease.capacity = seg.slot_size
        lease.addr = seg.segment.addr + lease.offset
        return lease

    cdef _SlabSegment _grow(self):
        cdef size_t used = self.nbytes
        cdef size_t n = self.slots_per_segment
        if self.segment_bytes:
            n = max(<size_t>1, min(n, self.segment_bytes // self.slot_size))
        if self.max_bytes:
            if used >= self.max_bytes or (self.max_bytes - used) // self.slot_size == 0:
                return None
            n = min(n, (self.max_bytes - used) // self.slot_size)
        cdef int seg_id = self._next_id
        if self.slot_size > <size_t>-1 // n:
            raise OverflowError("cannot make a segment of {} slots of {} bytes"
                                .format(n, self.slot_size))
        segment = Segment(n * self.slot_size)
        if self._on_segment is not None:
            try:
                self._on_segment(seg_id, segment, self.slot_size, n)
            except BaseException:
                segment.close()
                raise
        seg = _SlabSegment(seg_id, segment, self.slot_size, <uint32_t>n)
        seg.unmap_free = (self.unmapped_slot_bytes != 0
                          and self.slot_size >= self.unmapped_slot_bytes)
        self._next_id += 1
        self._segments.append(seg)
        return seg

    cdef int _retire_idle(self) except -1:
        cdef _SlabSegment seg
        for seg in list(self._segments):
            if (seg.slot_size != self.slot_size
                    and fl_slots_free_count(seg.slots) == fl_slots_count(seg.slots)):
                self._segments.remove(seg)
                if self._on_retire is not None:
                    self._on_retire(seg.id)
        return 0

    @property
    def segments(self):
        """``[(id, segment, slot_size, nslots), ...]`` of the live segments."""
        cdef _SlabSegment seg
        return [(seg.id, seg.segment, seg.slot_size, fl_slots_count(seg.slots))
                for seg in self._segments]

    @property
    def nbytes(self):
        """Bytes of shared memory in the pool's segments."""
        cdef _SlabSegment seg
        cdef size_t total = 0
        for seg in self._segments:
            total += seg.segment.size
        return total

    @property
    def free_slots(self):
        """Slots acquire() can hand out without growing."""
        cdef _SlabSegment seg
        cdef size_t n = 0
        for seg in self._segments:
            if seg.slot_size == self.slot_size:
                n += fl_slots_free_count(seg.slots)
        return n

    @property
    def idle_bytes(self):
        """Bytes of the segments none of whose slots is leased: what
        acquire() can reuse or give back whole, whatever the slot size."""
        cdef _SlabSegment seg
        cdef size_t total = 0
        for seg in self._segments:
            if fl_slots_free_count(seg.slots) == fl_slots_count(seg.slots):
                total += seg.segment.size
        return total

    @property
    def leased(self):
        """Slots owned by a live Lease."""
        cdef _SlabSegment seg
        cdef size_t n = 0
        for seg in self._segments:
            n += fl_slots_count(seg.slots) - fl_slots_free_count(seg.slots)
        return n

    @property
    def closed(self):
        return self._closed

    def close(self):
        """Stop handing out slots and drop the pool's hold on its segments;
        each is unmapped when the last Lease on it is gone."""
        self._closed = True
        self._segments = []

    def __repr__(self):
        return "<fastload_c.slab.SlabPool slot_size={} segments={} leased={} nbytes={}>".format(
            self.slot_size, len(self._segments), self.leased, self.nbytes)
