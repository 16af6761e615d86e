# distutils: sources = fastload_c/src/fl_shm.c
"""Anonymous shared-memory segments.

A Segment is a memfd mapped shared read-write. It has no name in /dev/shm, so
nothing outlives the last process holding it, whatever killed that process.
It reaches other processes as a file descriptor: pickling a Segment while a
process is being started (spawn, forkserver) passes its descriptor to the
child, and a forked child inherits it. A process that is already running
receives one over a Unix socket (send_segments / recv_segments).
"""
from cpython.buffer cimport PyBuffer_FillInfo
from posix.unistd cimport close

include "_status.pxi"

import socket
import struct

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

    @property
    def address(self):
        """Start of this process's mapping. Valid until the segment is closed."""
        self._check_open()
        return <size_t>self.addr

    cdef int _check_open(self) except -1:
        if self.addr == NULL:
            raise ValueError("Segment is closed")
        return 0

    def close_fd(self):
        """Close the descriptor and keep the mapping (which stays valid):
        once every process that needs the segment has it, so the segments a
        program keeps cost no descriptor (RLIMIT_NOFILE). It can then no
        longer be sent or pickled."""
        cdef int fd = self._fd
        self._fd = -1
        if fd >= 0 and close(fd) != 0:
            raise_errno("cannot close a shared segment's descriptor", ShmError)

    def close(self):
        """Unmap and close. Refused while a buffer view of it is alive."""
        if self._exports > 0:
            raise BufferError(
                "cannot close a Segment with {} live buffer view(s)".format(self._exports))
        self._release()

    cdef void _release(self) noexcept:
        cdef char *addr = self.addr
        cdef int fd = self._fd
        self.addr = NULL
        self._fd = -1
        # Unmapping a large segment takes a while: let threads run.
        with nogil:
            if addr != NULL:
                fl_shm_unmap(addr, self.size)
            if fd >= 0:
                close(fd)

    def __dealloc__(self):
        # Views hold a reference to the segment, so none is alive here.
        self._release()

    def __getbuffer__(self, Py_buffer *buffer, int flags):
        self._check_open()
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


# Wire format of send_segments: magic, segment count, meta length, then one
# little-endian u64 size per segment, then meta. The descriptors ride along
# as SCM_RIGHTS with the first bytes.
_HEADER = struct.Struct("<4sII")
_MAGIC = b"FLsg"
_MAX_FDS = 253  # SCM_MAX_FD: the kernel's limit of descriptors per message


def send_segments(sock, segments, bytes meta=b""):
    """Send Segments to the process at the other end of ``sock``.

    ``sock`` is a connected AF_UNIX stream socket (``socket.socketpair()``).
    Each segment's descriptor travels with its size; ``meta`` is opaque bytes
    for the caller (segment ids, slot sizes). The receiver maps its own view
    with recv_segments. Blocks like ``sock.sendall``.
    """
    segments = list(segments)
    _check_stream(sock)
    if len(segments) > _MAX_FDS:
        raise ValueError("cannot send more than {} segments in one message, got {}"
                         .format(_MAX_FDS, len(segments)))
    cdef Segment seg
    fds = []
    sizes = []
    for seg in segments:
        if seg._fd < 0:
            raise ValueError("cannot send a closed Segment")
        fds.append(seg._fd)
        sizes.append(seg.size)
    payload = (_HEADER.pack(_MAGIC, len(segments), len(meta))
               + struct.pack("<{}Q".format(len(sizes)), *sizes) + meta)
    sent = socket.send_fds(sock, [payload], fds)
    if sent < len(payload):
        sock.sendall(payload[sent:])


def recv_segments(sock):
    """Receive what send_segments sent: ``(list of Segment, meta bytes)``.

    The new Segments own the received descriptors (close-on-exec). Raises
    EOFError when the peer closed the socket, ShmError when the message is
    malformed or its descriptors were cut off; no descriptor leaks either way.
    """
    _check_stream(sock)
    msg, fds, flags, _ = socket.recv_fds(sock, _HEADER.size, _MAX_FDS, socket.MSG_CMSG_CLOEXEC)
    segments = []
    try:
        if not msg and not fds:
            raise EOFError("peer closed the socket")
        if flags & socket.MSG_CTRUNC:
            raise ShmError("segment descriptors were truncated (out of descriptors?)")
        head = msg + _recv_exact(sock, _HEADER.size - len(msg))
        magic, count, meta_len = _HEADER.unpack(head)
        if magic != _MAGIC or count != len(fds):
            raise ShmError("malformed segment message: {} descriptors, header {!r}"
                           .format(len(fds), head))
        sizes = struct.unpack("<{}Q".format(count), _recv_exact(sock, 8 * count))
        meta = _recv_exact(sock, meta_len)
        while fds:
            # Segment owns (and on failure closes) the descriptor from here.
            segments.append(Segment.attach(fds.pop(0), sizes[len(segments)]))
    except BaseException:
        for fd in fds:
            close(fd)
        for seg in segments:
            seg.close()
        raise
    return segments, meta


def _check_stream(sock):
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        raise ValueError("segments travel over an AF_UNIX SOCK_STREAM socket, got {!r}".format(sock))


def _recv_exact(sock, Py_ssize_t n):
    chunks = []
    while n > 0:
        chunk = sock.recv(n)
        if not chunk:
            raise EOFError("peer closed the socket in the middle of a segment message")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)
