# distutils: sources = fastload_c/src/fl_proc.c
"""Worker lifecycle mechanism: SIGCHLD wakes the waiting main process, and
workers die with their parent. See NOTE [ Worker-death detection ] in
src/fl_proc.h."""
from fastload_c.ring cimport Doorbell

include "_status.pxi"

# Doorbells registered with the handler, kept alive while registered.
_registered = {}


def install_sigchld_handler():
    """Install the chaining SIGCHLD handler in this process (idempotent;
    installed again if another handler replaced it).

    Raises OSError(EBUSY) when SIGCHLD is set to SIG_IGN (children reaped by
    the kernel), which fastload leaves as the user asked.
    """
    if fl_proc_install_sigchld() != 0:
        raise_errno("cannot install the SIGCHLD handler")


def ring_on_sigchld(Doorbell doorbell not None):
    """Ring ``doorbell`` whenever any child of this process changes state."""
    if id(doorbell) in _registered:
        return
    if fl_proc_add_doorbell(doorbell.db) != 0:
        raise_errno("cannot watch for SIGCHLD with more than {} doorbells"
                    .format(FL_PROC_MAX_DOORBELLS))
    _registered[id(doorbell)] = doorbell


def stop_ringing(Doorbell doorbell not None):
    """Undo ring_on_sigchld; a no-op for a doorbell that is not registered."""
    if _registered.pop(id(doorbell), None) is not None:
        with nogil:
            fl_proc_remove_doorbell(doorbell.db)


def sigchld_count():
    """SIGCHLD signals this process has received since the handler was installed."""
    return fl_proc_sigchld_count()


def die_with_parent(int expected_parent, int sig=9):
    """In a worker: have the kernel send ``sig`` (SIGKILL by default) when the
    parent exits. Raises ProcessLookupError when the parent is already gone."""
    if fl_proc_die_with_parent(sig, expected_parent) != 0:
        raise_errno("parent process {} is gone".format(expected_parent))


def keep_freed_heap(size_t keep_bytes, size_t block_bytes):
    """Have malloc keep up to ``keep_bytes`` of freed memory for reuse instead
    of returning it to the kernel after each free, and serve blocks up to
    ``block_bytes`` from that heap (glibc's mallopt; a no-op elsewhere).
    Raises ValueError for values glibc refuses."""
    if fl_proc_keep_freed_heap(keep_bytes, block_bytes) != 0:
        raise ValueError("malloc refused to keep {} bytes with blocks up to {} bytes"
                         .format(keep_bytes, block_bytes))
