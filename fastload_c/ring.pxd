from libc.stdint cimport int64_t, uint32_t, uint64_t
from posix.time cimport timespec

from fastload_c.shm cimport Segment


cdef extern from "fl_futex.h" nogil:
    int fl_futex_wait(uint32_t *word, uint32_t expected, const timespec *deadline)
    int fl_futex_wake(uint32_t *word, int n)
    void fl_deadline_after(double seconds, timespec *out)
    int fl_deadline_passed(const timespec *deadline)


cdef extern from "fl_doorbell.h" nogil:
    ctypedef struct fl_doorbell:
        pass
    uint32_t fl_doorbell_seq(fl_doorbell *db)
    void fl_doorbell_ring(fl_doorbell *db)
    int fl_doorbell_wait(fl_doorbell *db, uint32_t seen_seq, const timespec *deadline)


cdef extern from "fl_ring.h" nogil:
    const uint64_t FL_RING_MIN_CAPACITY
    const uint64_t FL_RING_MAX_CAPACITY
    enum:
        FL_RING_ERRNO
        FL_RING_AGAIN
        FL_RING_CLOSED
        FL_RING_TIMEOUT
        FL_RING_INTR
        FL_RING_TOOBIG
        FL_RING_CORRUPT

    ctypedef struct fl_ring:
        uint64_t capacity
        fl_doorbell *extra
        int64_t spin_ns

    ctypedef struct fl_ring_msg:
        const unsigned char *part[2]
        uint64_t size[2]
        uint64_t len

    int fl_ring_capacity_ok(uint64_t capacity)
    size_t fl_ring_segment_size(uint64_t capacity)
    void fl_ring_format(void *mem, uint64_t capacity)
    int fl_ring_attach(fl_ring *r, void *mem, size_t size)
    void fl_ring_set_spin(fl_ring *r, int64_t ns)
    uint64_t fl_ring_max_message(const fl_ring *r)
    int fl_ring_try_put(fl_ring *r, const void *src, uint64_t len)
    int fl_ring_put(fl_ring *r, const void *src, uint64_t len, const timespec *deadline)
    int fl_ring_try_peek(fl_ring *r, fl_ring_msg *m)
    int fl_ring_peek(fl_ring *r, fl_ring_msg *m, const timespec *deadline)
    void fl_ring_release(fl_ring *r)
    void fl_ring_unpeek(fl_ring *r)
    void fl_ring_copy(const fl_ring_msg *m, void *dst)
    void fl_ring_close(fl_ring *r)
    int fl_ring_is_closed(const fl_ring *r)
    uint64_t fl_ring_count(const fl_ring *r)
    uint64_t fl_ring_space(const fl_ring *r)


cdef class Doorbell:
    cdef Segment _segment
    # Ring it from C (a signal handler too) with fl_doorbell_ring(bell.db);
    # keep a reference to the Doorbell so that the mapping outlives its use.
    cdef fl_doorbell *db


cdef class Ring:
    cdef fl_ring r
    cdef Segment _segment
    cdef Doorbell _doorbell

    cdef int _put(self, const char *data, Py_ssize_t size, object timeout, bint block) except -1
    cdef int _peek(self, fl_ring_msg *m, object timeout, bint block) except -1
    cdef int _block(self, const char *data, Py_ssize_t size, fl_ring_msg *m,
                    object timeout) except -1
    cdef bytes _take(self, fl_ring_msg *m)
