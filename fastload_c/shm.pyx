# distutils: sources = fastload_c/src/fl_shm.c
"""Anonymous shared-memory segments.

A Segment is a memfd mapped shared read-write. It has no name in /dev/shm, so
nothing outlives the last process holding it, whatever killed that process.
It reaches other processes as a file descriptor: pickling a Segment while a
process is being started (spawn, forkserver) passes its descriptor to the
child, and a forked child inherits it.
"""
from cpython.buffer cimport PyBuffer_FillInfo
from posix.unistd cimport close

include "_status.pxi"

from fastload_c.errors import ShmError


cdef class Segment:
    """Shared memory of ``size`` bytes, every page reserved at creation.

    A shortage of memory raises ShmError here, naming the size, instead of a
    SIGBUS when a page is first touched. The segment exposes the buffer
    protocol (writable), so ``numpy.frombuffer(seg, ...)`` views it directly.
    """

    def __cinit__(self, size_t size=0, *, int _fd=-1):
        cdef int fd = -1
        cdef void *addr = NULL
        cdef int rc
        self._fd = -1
        self.addr = NULL
        self.size = 0
        if _fd >= 0:
            # Attach: the descriptor is ours from here on, success or not.
            with nogil:
                rc = fl_shm_attach(_fd, size, &addr)
            if rc != 0:
                close(_fd)
                raise_errno("cannot map shared segment of {} bytes".format(size), ShmError)
            fd = _fd
        else:
            if size == 0:
                raise ValueError("Segment size must be positive, got 0")
            with nogil:
                rc = fl_shm_create(b"fastload", size, &fd, &addr)
            if rc != 0:
                raise_errno("cannot create shared segment of {} bytes ({} bytes available)"
                            .format(size, fl_shm_available()), ShmError)
        self._fd = fd
        self.addr = <char *>addr
        self.size = size

    @staticmethod
    def attach(int fd, size_t size):
        """Map the segment behind ``fd`` (which the new Segment then owns)."""
        return Segment(size, _fd=fd)

    @property
    def fd(self):
        """The memfd descriptor; -1 once closed."""
        return self._fd

    @property
    def closed(self):
        return self.addr == NULL

    def close(self):
        """Unmap and close. Refused while a buffer view of it is alive."""
        if self._exports > 0:
            raise BufferError(
                "cannot close a Segment with {} live buffer view(s)".format(self._exports))
        self._release()

    cdef void _release(self) noexcept:
        if self.addr != NULL:
            fl_shm_unmap(self.addr, self.size)
            self.addr = NULL
        if self._fd >= 0:
            close(self._fd)
            self._fd = -1

    def __dealloc__(self):
        # Views hold a reference to the segment, so none is alive here.
        self._release()

    def __getbuffer__(self, Py_buffer *buffer, int flags):
        if self.addr == NULL:
            raise ValueError("Segment is closed")
        PyBuffer_FillInfo(buffer, self, self.addr, self.size, 0, flags)
        self._exports += 1

    def __releasebuffer__(self, Py_buffer *buffer):
        self._exports -= 1

    def __reduce__(self):
        if self._fd < 0:
            raise ValueError("cannot pickle a closed Segment")
        from multiprocessing.reduction import DupFd
        return (_attach_dupfd, (DupFd(self._fd), self.size))

    def __repr__(self):
        state = "closed" if self.addr == NULL else "fd={}".format(self._fd)
        return "<fastload_c.shm.Segment size={} {}>".format(self.size, state)


def available():
    """Bytes a new segment can take now (MemAvailable, capped by the cgroup limit)."""
    return fl_shm_available()


def _attach_dupfd(dupfd, size_t size):
    return Segment(size, _fd=dupfd.detach())
