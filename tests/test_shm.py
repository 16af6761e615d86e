import gc
import multiprocessing as mp
import os
import socket

import numpy as np
import pytest

from fastload_c.errors import ShmError
from fastload_c.shm import Segment, recv_segments, send_segments

from _dev_shm import dev_shm_names

pytestmark = pytest.mark.usefixtures("earlier_garbage_collected")


def test_segment_is_writable_shared_memory():
    seg = Segment(1 << 16)
    view = np.frombuffer(seg, dtype=np.uint8)
    view[:] = 5
    assert seg.size == 1 << 16
    assert np.frombuffer(seg, dtype=np.uint8).sum() == 5 * (1 << 16)


def test_zero_size_is_rejected():
    with pytest.raises(ValueError, match="positive"):
        Segment(0)


def test_oversized_segment_raises_naming_the_size():
    huge = 1 << 50
    with pytest.raises(ShmError, match=str(huge)):
        Segment(huge)


def test_segment_size_is_sealed_and_descriptor_close_on_exec():
    seg = Segment(1 << 16)
    assert not os.get_inheritable(seg.fd)
    for size in (0, 4096, 1 << 17):  # shrinking would make touching the end SIGBUS
        with pytest.raises(PermissionError):
            os.ftruncate(seg.fd, size)
    assert os.fstat(seg.fd).st_size == 1 << 16
    np.frombuffer(seg, dtype=np.uint8)[-1] = 1


def test_attach_makes_a_received_descriptor_close_on_exec():
    seg = Segment(4096)
    fd = os.dup(seg.fd)
    os.set_inheritable(fd, True)  # as received over a socket without MSG_CMSG_CLOEXEC
    assert not os.get_inheritable(Segment.attach(fd, 4096).fd)


def test_close_refused_while_viewed_and_releases_fd():
    seg = Segment(4096)
    fd = seg.fd
    view = np.frombuffer(seg, dtype=np.uint8)
    with pytest.raises(BufferError):
        seg.close()
    del view
    seg.close()
    assert seg.closed and seg.fd == -1
    with pytest.raises(OSError):
        os.fstat(fd)


def test_no_file_in_dev_shm():
    before = dev_shm_names()
    segs = [Segment(4096) for _ in range(8)]
    assert dev_shm_names() == before
    assert all(os.readlink("/proc/self/fd/%d" % s.fd).startswith("/memfd:fastload") for s in segs)


def test_no_descriptor_leak_over_many_cycles():
    gc.collect()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(1000):
        seg = Segment(8192)
        np.frombuffer(seg, dtype=np.uint8)[0] = 1
        del seg
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == before


def _child_writes(seg, value):
    np.frombuffer(seg, dtype=np.uint8)[:] = value


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
@pytest.mark.timeout(60)
def test_child_writes_are_seen_by_parent(method):
    seg = Segment(1 << 16)
    proc = mp.get_context(method).Process(target=_child_writes, args=(seg, 9))
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0
    assert (np.frombuffer(seg, dtype=np.uint8) == 9).all()


def _receive_and_write(sock, result):
    segments, meta = recv_segments(sock)
    for seg, value in zip(segments, meta):
        np.frombuffer(seg, dtype=np.uint8)[:] = value
    result.put([s.size for s in segments])
    sock.close()


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.timeout(60)
def test_segments_reach_an_already_running_process_over_a_socket(method):
    ctx = mp.get_context(method)
    parent, child = socket.socketpair()
    result = ctx.Queue()
    proc = ctx.Process(target=_receive_and_write, args=(child, result))
    proc.start()
    child.close()
    # Made after the child started: only the socket can bring them there.
    segments = [Segment(4096), Segment(3 * 4096)]
    send_segments(parent, segments, meta=bytes([7, 9]))
    assert result.get(timeout=30) == [4096, 3 * 4096]
    proc.join(30)
    assert proc.exitcode == 0
    assert (np.frombuffer(segments[0], dtype=np.uint8) == 7).all()
    assert (np.frombuffer(segments[1], dtype=np.uint8) == 9).all()
    parent.close()


def _open_fds():
    return len(os.listdir("/proc/self/fd"))


def test_send_recv_in_process_and_no_descriptor_leak():
    a, b = socket.socketpair()
    before = _open_fds()
    for _ in range(50):
        seg = Segment(8192)
        np.frombuffer(seg, dtype=np.uint8)[:3] = [1, 2, 3]
        send_segments(a, [seg], meta=b"x" * 100_000)  # meta larger than one send
        got, meta = recv_segments(b)
        assert meta == b"x" * 100_000
        assert got[0].size == 8192 and bytes(np.frombuffer(got[0], np.uint8)[:3]) == b"\1\2\3"
        del seg, got
    gc.collect()
    assert _open_fds() == before
    a.close()
    with pytest.raises(EOFError):
        recv_segments(b)
    b.close()


def test_malformed_message_closes_the_descriptors_it_carried():
    a, b = socket.socketpair()
    seg = Segment(4096)
    before = _open_fds()
    socket.send_fds(a, [b"nope" + bytes(8)], [seg.fd, seg.fd])
    with pytest.raises(ShmError, match="malformed"):
        recv_segments(b)
    assert _open_fds() == before
    a.close()
    b.close()


def test_sockets_other_than_unix_streams_are_refused():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with pytest.raises(ValueError, match="SOCK_STREAM"):
        send_segments(a, [Segment(4096)])
    a.close()
    b.close()


def test_close_fd_keeps_the_mapping_and_frees_the_descriptor():
    segment = Segment(4096)
    fd = segment.fd
    memoryview(segment)[:4] = b"abcd"
    segment.close_fd()
    assert segment.fd == -1 and not os.path.exists(f"/proc/self/fd/{fd}")
    assert bytes(memoryview(segment)[:4]) == b"abcd"
    segment.close()
