"""Whether a process still runs, for tests that watch processes end."""
from __future__ import annotations

import psutil


def running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has). One
    that exits while it is looked at has: asking whether it exists and then
    for its status races with its end."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
