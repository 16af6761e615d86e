"""Pinned slabs: locked and prefaulted, RLIMIT_MEMLOCK respected (warn once
and fall back, or raise in strict mode), registered with CUDA where present."""
import gc
import json
import multiprocessing as mp
import os
import resource
import subprocess
import sys
import types

import numpy as np
import pytest

from fastload import _memory
from fastload_c.errors import ShmError
from fastload_c.pack import collate_into, unpack

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def vmlck():
    return _memory.locked_bytes()


def minflt():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def test_pinning_locks_the_whole_slab_and_its_growth():
    gc.collect()
    before = vmlck()
    pool = _memory.new_pool(256 << 10, pin_memory=True, slots_per_segment=2)
    assert vmlck() - before == pool.nbytes == 512 << 10
    leases = [pool.acquire() for _ in range(3)]   # the third needs a new segment
    assert all(seg.pinned for _, seg, _, _ in pool.segments)
    assert vmlck() - before == pool.nbytes == 1 << 20
    pool.close()
    del leases
    gc.collect()
    assert vmlck() == before


def run_pool(pool, batches, samples):
    for _ in range(batches):
        lease = pool.acquire()
        batch = unpack(lease, collate_into(samples, lease))
        del lease, batch


def test_steady_state_batches_take_no_page_faults():
    samples = [np.full(1024, i, np.float32) for i in range(64)]   # 256 KiB batches = 64 pages
    run_pool(_memory.new_pool(256 << 10), 20, samples)            # warm the interpreter's own heap
    unpinned = _memory.new_pool(256 << 10, slots_per_segment=2)
    before = minflt()
    run_pool(unpinned, 1, samples)
    first_touch = minflt() - before
    pinned = _memory.new_pool(256 << 10, pin_memory=True, slots_per_segment=2)
    before = minflt()
    run_pool(pinned, 1000, samples)
    faults = minflt() - before
    # The measurement sees page faults (an unpinned slot's first use)...
    assert first_touch >= 64
    # ...and a pinned slab takes none over 1000 batches, the first included.
    assert faults < 16, faults


OVER_THE_LIMIT = r"""
import errno, json, os, resource, warnings
import numpy as np
from fastload import _memory
from fastload_c.errors import ShmError
from fastload_c.pack import collate_into, unpack

# Everything is imported: the interpreter's files are unreadable once we are
# nobody. Root's CAP_IPC_LOCK lifts the limit, so drop it.
resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 << 10, 64 << 10))
os.setgid(65534)
os.setuid(65534)
out = {"limit": _memory.memlock_limit()}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    small = _memory.new_pool(4096, pin_memory=True, slots_per_segment=4)   # 16 KiB: fits
    pool = _memory.new_pool(1 << 20, pin_memory=True, slots_per_segment=2)
    leases = [pool.acquire() for _ in range(3)]                            # grows: refused again
    batch = unpack(leases[2], collate_into([np.arange(10.0)] * 3, leases[2]))
    _memory.new_pool(1 << 20, pin_memory=True)
out["small_pinned"] = [s.pinned for _, s, _, _ in small.segments]
out["pool_pinned"] = [s.pinned for _, s, _, _ in pool.segments]
out["sum"] = float(batch.sum())
out["warnings"] = [(w.category.__name__, str(w.message)) for w in caught]
try:
    _memory.new_pool(1 << 20, pin_memory=True, strict=True, slots_per_segment=4)
except ShmError as exc:
    out["strict"] = [exc.errno, str(exc)]
print(json.dumps(out))
"""


@pytest.mark.timeout(60)
def test_over_the_memlock_limit_warns_once_and_falls_back_or_raises_when_strict():
    if os.geteuid() != 0:
        pytest.skip("dropping to an unprivileged user needs root")
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", OVER_THE_LIMIT], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["limit"] == 64 << 10
    assert out["small_pinned"] == [True]
    assert out["pool_pinned"] == [False, False]
    assert out["sum"] == 3 * 45.0
    assert len(out["warnings"]) == 1
    category, message = out["warnings"][0]
    assert category == "PinningWarning"
    assert "RLIMIT_MEMLOCK is 65536 bytes" in message and "cannot pin 2097152 bytes" in message
    assert "unpinned" in message
    errno_, strict = out["strict"]
    assert errno_ == 12 and "RLIMIT_MEMLOCK is 65536 bytes" in strict and "4194304" in strict


class FakeCudart:
    """Stands in for torch.cuda.cudart(): records calls, answers `result`."""

    def __init__(self, result=0):
        self.calls = []
        self.result = result

    def cudaHostRegister(self, address, size, flags):
        self.calls.append(("register", address, size, flags))
        return self.result

    def cudaHostUnregister(self, address):
        self.calls.append(("unregister", address))
        return 0


def fake_torch(cudart):
    cuda = types.SimpleNamespace(is_available=lambda: True, cudart=lambda: cudart)
    return types.SimpleNamespace(cuda=cuda)


def test_cuda_registration_policy_with_a_stand_in_driver(monkeypatch):
    cudart = FakeCudart()
    monkeypatch.setitem(sys.modules, "torch", fake_torch(cudart))
    pool = _memory.new_pool(4096, pin_memory=True, slots_per_segment=2)
    segment = pool.segments[0][1]
    address = segment.address
    assert cudart.calls == [("register", address, 8192, 0)]
    unpinned = _memory.new_pool(4096)                       # not pinned: not registered
    assert len(cudart.calls) == 1
    _memory.new_pool(4096, pin_memory=True, cuda=False)     # told not to
    assert len(cudart.calls) == 1
    # Unregistered when the segment goes, while its memory is still mapped.
    seen = []
    segment.on_release(lambda: seen.append(cudart.calls[-1][0]))
    pool.close()
    del pool, segment, unpinned
    gc.collect()
    assert cudart.calls[-1] == ("unregister", address) and seen == ["register"]
    refused = FakeCudart(result=2)
    monkeypatch.setitem(sys.modules, "torch", fake_torch(refused))
    monkeypatch.setattr(_memory, "_warned", False)
    with pytest.warns(_memory.PinningWarning, match="CUDA error 2"):
        pool = _memory.new_pool(4096, pin_memory=True)
    assert pool.segments[0][1].pinned                      # pinned, only not registered
    with pytest.raises(ShmError, match="CUDA error 2"):
        _memory.new_pool(4096, pin_memory=True, strict=True)


def test_cuda_auto_mode_never_imports_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)   # "import torch" would now fail
    pool = _memory.new_pool(4096, pin_memory=True)
    assert pool.segments[0][1].pinned
    with pytest.raises(ImportError):
        _memory.new_pool(4096, pin_memory=True, cuda=True)


def cuda_available():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _write_through_inherited_mapping(segment):
    np.frombuffer(segment, dtype=np.uint8)[:16] = 5


@pytest.mark.skipif(not cuda_available(),
                    reason="needs torch with CUDA and an NVIDIA GPU; this machine has neither")
@pytest.mark.timeout(120)
def test_pinned_slots_are_registered_with_cuda_and_copy_to_the_device():
    import torch

    cudart = torch.cuda.cudart()
    pool = _memory.new_pool(1 << 20, pin_memory=True, cuda=True, slots_per_segment=2)
    segment = pool.segments[0][1]
    address, size = segment.address, segment.size
    lease = pool.acquire()
    samples = [np.arange(4096, dtype=np.float32) + i for i in range(32)]
    batch = unpack(lease, collate_into(samples, lease))
    tensor = torch.from_numpy(batch)
    # The driver knows the memory (torch asks cudaPointerGetAttributes)...
    assert tensor.is_pinned()
    on_device = tensor.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(on_device.cpu(), torch.from_numpy(np.stack(samples)))
    # ...and refuses to register the range again (last: the refusal stays
    # in CUDA's last-error state, which later torch checks could trip on).
    assert int(cudart.cudaHostRegister(address, size, 0)) == 712  # HostMemoryAlreadyRegistered
    # Forked workers write through the mapping they inherit: registration
    # must not have made it vanish from children (MADV_DONTFORK).
    proc = mp.get_context("fork").Process(target=_write_through_inherited_mapping, args=(segment,))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0, "a forked child could not write a registered segment"
    # Released with the segment: unregistering again finds nothing there.
    del batch, tensor, lease, segment
    pool.close()
    del pool
    gc.collect()
    assert int(cudart.cudaHostUnregister(address)) != 0
