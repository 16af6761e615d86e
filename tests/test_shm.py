import gc
import multiprocessing as mp
import os

import numpy as np
import pytest

from fastload_c.errors import ShmError
from fastload_c.shm import Segment


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
    before = set(os.listdir("/dev/shm"))
    segs = [Segment(4096) for _ in range(8)]
    assert set(os.listdir("/dev/shm")) == before
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
