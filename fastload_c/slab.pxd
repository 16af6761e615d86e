from libc.stdint cimport int64_t, uint32_t

from fastload_c.shm cimport Segment


cdef extern from "fl_slab.h" nogil:
    ctypedef struct fl_slots:
        pass
    fl_slots *fl_slots_new(uint32_t n)
    void fl_slots_free(fl_slots *slots)
    int64_t fl_slots_take(fl_slots *slots)
    int fl_slots_give(fl_slots *slots, uint32_t i)
    uint32_t fl_slots_free_count(const fl_slots *slots)
    uint32_t fl_slots_count(const fl_slots *slots)
    size_t fl_slab_round_slot(size_t size, size_t page)
    size_t fl_slab_grown_slot_size(size_t current, size_t need, size_t page, int headroom)
    int fl_slab_unmap_pages(void *addr, size_t size)


# One segment of the pool, cut into equal slots, and which of them are free.
cdef class _SlabSegment:
    cdef readonly int id
    cdef readonly Segment segment
    cdef readonly size_t slot_size
    cdef fl_slots *slots
    cdef Py_buffer view
    cdef bint held
    cdef bint unmap_free          # a free slot keeps no page mapped here


cdef class Lease:
    cdef _SlabSegment _owner
    cdef readonly uint32_t slot
    cdef readonly size_t offset
    cdef readonly size_t capacity
    cdef char *addr
    cdef object __weakref__


cdef class SlabPool:
    cdef list _segments           # of _SlabSegment, oldest first
    cdef readonly size_t slot_size
    cdef readonly size_t max_bytes
    cdef readonly uint32_t slots_per_segment
    cdef readonly size_t segment_bytes
    cdef readonly size_t unmapped_slot_bytes
    cdef int _next_id
    cdef bint _closed
    cdef bint _sized_by_batch     # the slot size came from a batch's need
    cdef object _on_segment
    cdef object _on_retire
    cdef Lease _take(self, _SlabSegment seg)
    cdef _SlabSegment _grow(self)
    cdef int _retire_idle(self) except -1
