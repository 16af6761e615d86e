# distutils: sources = fastload_c/src/fl_ring.c
# cython: freethreading_compatible=True
"""Lock-free shared-memory message rings and doorbells.

A Ring carries byte messages from one producer process to one consumer
process through a memfd segment; see NOTE [ Ring record layout ], NOTE [ Ring
memory ordering ] and NOTE [ Ring waiting ] in src/fl_ring.h. A Doorbell is a
shared event counter a process can sleep on (NOTE [ Doorbell protocol ] in
src/fl_doorbell.h); a Ring built with one rings it after every message, so a
process can wait on one doorbell for many rings.

Both pickle by carrying their Segment, so they reach processes started by
fork, spawn or forkserver as descriptors.
"""
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.exc cimport PyErr_CheckSignals
from libc.errno cimport EINTR, ETIMEDOUT

include "_status.pxi"

from operator import index

from fastload_c.errors import FastloadError, RingClosedError

include "_nogil.pxi"


cdef int _deadline(object timeout, timespec *ts) except -1:
    """Fill ts with the deadline `timeout` seconds from now; 0 (no deadline)
    when timeout is None, else 1."""
    if timeout is None:
        return 0
    cdef double seconds = timeout
    if not seconds >= 0:
        raise ValueError("timeout must be a non-negative number of seconds, got {!r}".format(timeout))
    fl_deadline_after(seconds, ts)
    return 1


cdef class Doorbell:
    """An event counter in shared memory that processes can sleep on.

    ``seq`` is the number of rings so far (modulo 2**32). To wait for an
    event without missing one, read ``seen = bell.seq`` first, then check for
    the event, then ``bell.wait(seen, timeout)``: it returns as soon as the
    doorbell has rung after ``seen`` was read (True), or at the timeout
    (False). ``ring()`` is cheap when nobody waits: no system call.
    """

    def __cinit__(self, *, Segment _segment=None):
        if _segment is None:
            _segment = Segment(64)
        elif _segment.size < sizeof(fl_doorbell):
            raise ValueError("{!r} is too small for a doorbell".format(_segment))
        self._segment = _segment
        self.db = <fl_doorbell *>_segment.addr

    @property
    def seq(self):
        return fl_doorbell_seq(self.db)

    def ring(self):
        fl_doorbell_ring(self.db)

    def wait(self, uint32_t seen_seq, timeout=None):
        """Sleep until the doorbell rings after ``seen_seq``; False on timeout."""
        cdef timespec ts
        cdef timespec *deadline = &ts if _deadline(timeout, &ts) else NULL
        cdef int rc = 0, err = 0
        while fl_doorbell_seq(self.db) == seen_seq:
            with nogil:
                rc = fl_doorbell_wait(self.db, seen_seq, deadline)
                err = errno
            if rc == 0:
                continue
            if err == ETIMEDOUT:
                return fl_doorbell_seq(self.db) != seen_seq
            if err != EINTR:
                raise_errno("waiting on a doorbell failed")
            PyErr_CheckSignals()
        return True

    def __reduce__(self):
        return (_rebuild_doorbell, (self._segment,))

    def __repr__(self):
        return "<fastload_c.ring.Doorbell seq={}>".format(self.seq)


def _rebuild_doorbell(Segment segment):
    return Doorbell(_segment=segment)


cdef class Ring:
    """A single-producer/single-consumer ring of byte messages in shared memory.

    ``Ring(capacity, doorbell=None, *, spin=None)``: ``capacity`` bytes of
    buffer, a power of two from 64 to 2**40; a message takes its length
    rounded up to 8 plus 8 bytes, and the largest is ``capacity - 8``
    (``max_message``). With a ``doorbell``, the producer rings it after each
    message (and close() rings it). ``spin`` is how long, in seconds, a
    blocked call retries before it sleeps (default 20 microseconds; 0 sleeps
    at once); it belongs to this handle and travels when pickled.

    One process puts and one gets at a time. Blocking calls take a
    ``timeout`` in seconds (None waits forever) and raise TimeoutError when
    it passes. They release the GIL while they wait, and while they copy
    messages of 128 KiB or more.

    ``close()`` is seen by both sides: puts raise RingClosedError, blocked
    calls return at once, and gets deliver what is left, then raise
    RingClosedError.
    """

    def __cinit__(self, capacity, Doorbell doorbell=None, *, spin=None, Segment _segment=None):
        cdef uint64_t cap
        if _segment is None:
            cap = _check_capacity(capacity)
            _segment = Segment(fl_ring_segment_size(cap))
            fl_ring_format(_segment.addr, cap)
        if fl_ring_attach(&self.r, _segment.addr, _segment.size) != 0:
            raise ValueError("{!r} holds no ring".format(_segment))
        self._segment = _segment
        self._doorbell = doorbell
        if doorbell is not None:
            self.r.extra = doorbell.db
        if spin is not None:
            self.spin = spin

    # -- producer ----------------------------------------------------------

    def put(self, data, timeout=None):
        """Copy ``data`` (bytes or any C-contiguous buffer) in as one message,
        waiting for room."""
        cdef Py_buffer buf
        if type(data) is bytes:
            self._put(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), timeout, True)
            return
        PyObject_GetBuffer(data, &buf, PyBUF_SIMPLE)
        try:
            self._put(<const char *>buf.buf, buf.len, timeout, True)
        finally:
            PyBuffer_Release(&buf)

    def try_put(self, data):
        """put() without waiting: False when there is no room now."""
        cdef Py_buffer buf
        if type(data) is bytes:
            return self._put(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), None, False) == 1
        PyObject_GetBuffer(data, &buf, PyBUF_SIMPLE)
        try:
            return self._put(<const char *>buf.buf, buf.len, None, False) == 1
        finally:
            PyBuffer_Release(&buf)

    cdef int _put(self, const char *data, Py_ssize_t size, object timeout, bint block) except -1:
        """1 when the message went in, 0 when full and not blocking."""
        cdef int rc
        if size >= NOGIL_MIN_BYTES:
            with nogil:
                rc = fl_ring_try_put(&self.r, data, size)
        else:
            rc = fl_ring_try_put(&self.r, data, size)
        if rc == FL_RING_AGAIN:
            if not block:
                return 0
            return self._block(data, size, NULL, timeout) + 1
        if rc != 0:
            _raise(rc, &self.r, size, None)
        return 1

    # -- consumer ----------------------------------------------------------

    def get(self, timeout=None):
        """The next message as bytes, waiting for one."""
        cdef fl_ring_msg m
        self._peek(&m, timeout, True)
        return self._take(&m)

    def try_get(self):
        """get() without waiting: None when the ring is empty."""
        cdef fl_ring_msg m
        if self._peek(&m, None, False) == 0:
            return None
        return self._take(&m)

    cdef int _peek(self, fl_ring_msg *m, object timeout, bint block) except -1:
        """1 with the next message lent in *m, 0 when empty and not blocking."""
        cdef int rc = fl_ring_try_peek(&self.r, m)
        if rc == FL_RING_AGAIN:
            if not block:
                return 0
            return self._block(NULL, 0, m, timeout) + 1
        if rc != 0:
            _raise(rc, &self.r, -1, None)
        return 1

    cdef bytes _take(self, fl_ring_msg *m):
        cdef bytes out
        cdef char *dst
        try:
            out = PyBytes_FromStringAndSize(NULL, m.len)
        except MemoryError:
            fl_ring_unpeek(&self.r)
            raise
        dst = PyBytes_AS_STRING(out)
        if m.len >= NOGIL_MIN_BYTES:
            with nogil:
                fl_ring_copy(m, dst)
        else:
            fl_ring_copy(m, dst)
        fl_ring_release(&self.r)
        return out

    # -- waiting -----------------------------------------------------------

    cdef int _block(self, const char *data, Py_ssize_t size, fl_ring_msg *m,
                    object timeout) except -1:
        """Blocking put (m is NULL) or peek; 0 when done, else raises."""
        cdef timespec ts
        cdef timespec *deadline = &ts if _deadline(timeout, &ts) else NULL
        cdef int rc
        while True:
            with nogil:
                if m == NULL:
                    rc = fl_ring_put(&self.r, data, size, deadline)
                else:
                    rc = fl_ring_peek(&self.r, m, deadline)
            if rc != FL_RING_INTR:
                break
            # A signal: run the Python handlers (KeyboardInterrupt surfaces
            # here), then wait on with the same deadline.
            PyErr_CheckSignals()
        if rc != 0:
            _raise(rc, &self.r, size if m == NULL else -1, timeout)
        return 0

    # -- either side -------------------------------------------------------

    def close(self):
        """Close the ring for both sides (see the class docstring)."""
        fl_ring_close(&self.r)

    @property
    def closed(self):
        return fl_ring_is_closed(&self.r) != 0

    @property
    def capacity(self):
        return self.r.capacity

    @property
    def max_message(self):
        """Size of the largest message the ring can hold (when empty)."""
        return fl_ring_max_message(&self.r)

    @property
    def space(self):
        """Size of the largest message a put could take now without waiting."""
        return fl_ring_space(&self.r)

    @property
    def count(self):
        """Messages in the ring now. (Not
        __len__, so that an empty ring is still true, as queues are.)"""
        return fl_ring_count(&self.r)

    @property
    def spin(self):
        return self.r.spin_ns / 1e9

    @spin.setter
    def spin(self, double seconds):
        if not 0 <= seconds <= 1:
            raise ValueError("spin must be from 0 to 1 second, got {!r}".format(seconds))
        fl_ring_set_spin(&self.r, <int64_t>(seconds * 1e9))

    @property
    def doorbell(self):
        return self._doorbell

    @property
    def segment(self):
        """The shared-memory Segment holding the ring."""
        return self._segment

    def __reduce__(self):
        return (_rebuild_ring, (self._segment, self._doorbell, self.spin))

    def __repr__(self):
        return "<fastload_c.ring.Ring capacity={} messages={}{}>".format(
            self.capacity, self.count, " closed" if self.closed else "")


def _rebuild_ring(Segment segment, Doorbell doorbell, spin):
    return Ring(None, doorbell, spin=spin, _segment=segment)


cdef uint64_t _check_capacity(object capacity) except 0:
    cap = index(capacity)
    if not (FL_RING_MIN_CAPACITY <= cap <= FL_RING_MAX_CAPACITY) or cap & (cap - 1):
        raise ValueError("Ring capacity must be a power of two from {} to 2**{} bytes, got {!r}"
                         .format(FL_RING_MIN_CAPACITY, FL_RING_MAX_CAPACITY.bit_length() - 1,
                                 capacity))
    return cap


cdef int _raise(int rc, fl_ring *r, Py_ssize_t size, object timeout) except -1:
    """The one place a ring status becomes an exception. size: the message
    put, or -1 for a get."""
    what = "put" if size >= 0 else "get"
    if rc == FL_RING_TOOBIG:
        raise ValueError(
            "message of {} bytes can never fit in a ring of capacity {} bytes "
            "(largest message: {} bytes)".format(size, r.capacity, fl_ring_max_message(r)))
    if rc == FL_RING_CLOSED:
        raise RingClosedError("ring is closed" if what == "put" else "ring is closed and drained")
    if rc == FL_RING_TIMEOUT:
        raise TimeoutError("ring {} timed out after {} s".format(what, timeout))
    if rc == FL_RING_CORRUPT:
        raise FastloadError("ring is corrupt: a message length contradicts the ring's positions")
    raise_errno("ring {} failed while waiting".format(what))
