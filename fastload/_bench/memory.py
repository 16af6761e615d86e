"""The memory of a process tree, two ways.

* ``pss``: the sum of each process's PSS (what psutil's
  ``memory_full_info().pss`` reads: ``/proc/PID/smaps_rollup``). Shared pages
  count once across the tree, split among the processes mapping them.
* ``charged``: PSS outside shared-memory mappings, plus every shared-memory
  object (memfd, /dev/shm file) the tree maps or holds open, at its
  allocated size, once. PSS alone misses shared memory no process has
  mapped: torch's batches in flight wait in unlinked /dev/shm files whose
  descriptors sit in its queues; fastload's slots are reserved
  (fallocate) before they are first touched, and its large slots are
  mapped only while a batch in them is held (NOTE [ Unmapped slots ] in
  fastload._memory).

Linux only; psutil lists the tree.
"""
from __future__ import annotations

import os

_SHARED_PREFIXES = ("/memfd:", "/dev/shm/")


def _rollup(pid: int) -> dict[str, int]:
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("Pss", "Pss_Shmem"):
                fields[name] = int(rest.split()[0]) * 1024
    return fields


def _shared_objects(pid: int, found: dict[tuple[int, int], int]) -> bool:
    """Add the shared-memory objects ``pid`` holds open or maps to ``found``
    ((device, inode) -> allocated bytes); False when a mapped one could not
    be looked at (map_files needs CAP_SYS_ADMIN)."""
    paths = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(_SHARED_PREFIXES):
                paths.append(f"/proc/{pid}/fd/{fd}")
        except OSError:
            pass  # closed meanwhile
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith(_SHARED_PREFIXES):
                paths.append(f"/proc/{pid}/map_files/{parts[0]}")
    complete = True
    for path in paths:
        try:
            st = os.stat(path)
        except PermissionError:
            complete = False
        except OSError:
            continue
        else:
            found[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    return complete


def tree_memory(pid: int) -> dict[str, int] | None:
    """``{"pss": ..., "charged": ...}`` in bytes for ``pid`` and its
    descendants (see the module docstring); None when ``pid`` is gone."""
    import psutil

    try:
        root = psutil.Process(pid)
        pids = [pid, *(p.pid for p in root.children(recursive=True))]
    except psutil.NoSuchProcess:
        return None
    pss = outside_shared = 0
    shared: dict[tuple[int, int], int] = {}
    for member in pids:
        try:
            fields = _rollup(member)
            complete = _shared_objects(member, shared)
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited meanwhile
        pss += fields["Pss"]
        # Without a look at its mapped objects, keep what PSS saw of them.
        outside_shared += fields["Pss"] - (fields.get("Pss_Shmem", 0) if complete else 0)
    return {"pss": pss, "charged": outside_shared + sum(shared.values())}
