"""fastload_c.proc: SIGCHLD wakes a doorbell sleeper; workers die with their parent."""
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from _processes import running

from fastload_c import proc
from fastload_c.ring import Doorbell


def _rung_after_kill(bell):
    """Seconds from killing a child to the SIGCHLD handler's ring of `bell`."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    before = proc.sigchld_count()
    seen = bell.seq
    killed_at = []

    def kill():
        killed_at.append(time.perf_counter())
        child.kill()

    threading.Timer(0.2, kill).start()
    assert bell.wait(seen, 10.0)
    woke = time.perf_counter()
    assert proc.sigchld_count() > before
    # The handler reaped nothing: the child is still its owner's to wait for.
    assert child.wait(5) == -signal.SIGKILL
    return woke - killed_at[0]


@pytest.mark.timing
def test_sigchld_rings_a_registered_doorbell_at_once():
    proc.install_sigchld_handler()
    bell = Doorbell()
    proc.ring_on_sigchld(bell)
    try:
        lags = [_rung_after_kill(bell)]
        while len(lags) < 3 and min(lags) >= 0.05:
            lags.append(_rung_after_kill(bell))
        assert min(lags) < 0.05, lags  # best of up to three
    finally:
        proc.stop_ringing(bell)


def test_unregistered_doorbell_is_not_rung():
    proc.install_sigchld_handler()
    bell = Doorbell()
    seen = bell.seq
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert bell.seq == seen


def test_handler_chains_to_a_previous_python_handler():
    script = textwrap.dedent("""
        import signal, subprocess, sys
        calls = []
        signal.signal(signal.SIGCHLD, lambda s, f: calls.append(s))
        from fastload_c import proc
        proc.install_sigchld_handler()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        print(len(calls) >= 1, proc.sigchld_count() >= 1)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "True"], out.stderr


def test_sig_ign_is_respected():
    script = textwrap.dedent("""
        import signal
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        from fastload_c import proc
        try:
            proc.install_sigchld_handler()
        except OSError as exc:
            print("refused", exc.errno)
        print(signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    import errno
    assert out.stdout.split() == ["refused", str(errno.EBUSY), "True"], out.stderr


def test_die_with_parent_kills_the_orphan():
    # parent (python) starts a child that arms the death signal, then the parent is SIGKILLed.
    script = textwrap.dedent("""
        import os, sys, time
        pid = os.fork()
        if pid == 0:
            from fastload_c import proc
            proc.die_with_parent(os.getppid())
            time.sleep(60)
            os._exit(0)
        print(pid, flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        time.sleep(0.3)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 2
        while running(child) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not running(child)
    finally:
        parent.kill()


def test_die_with_parent_refuses_a_parent_that_is_already_gone():
    # Run in a child: arming the death signal in the test process itself
    # would tie pytest's life to its parent's.
    script = textwrap.dedent("""
        import os
        from fastload_c import proc
        try:
            proc.die_with_parent(os.getpid())  # never our own parent
        except ProcessLookupError as exc:
            print("gone", exc)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("gone"), out.stderr


def test_keep_freed_heap_stops_returning_freed_memory():
    # In a child: the setting is process-wide.
    script = textwrap.dedent("""
        import resource
        import numpy as np
        from fastload_c import proc

        def faults_for_rounds():
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for _ in range(20):
                blocks = [np.ones(48 * 1024, dtype=np.uint8) for _ in range(64)]
                del blocks
            return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

        faults_for_rounds()
        default = faults_for_rounds()
        proc.keep_freed_heap(64 << 20, 32 << 20)
        faults_for_rounds()
        kept = faults_for_rounds()
        print(default, kept)
        try:
            proc.keep_freed_heap(1 << 40, 1)
        except ValueError:
            print("refused")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    default, kept = map(int, out.stdout.split()[:2])
    assert kept * 10 < default, out.stdout
    assert "refused" in out.stdout
