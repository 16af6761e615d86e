"""How much of a shared segment a process maps now: the Rss of its
mappings in /proc/PID/smaps (NOTE [ Unmapped slots ] in fastload._memory)."""
from __future__ import annotations

import re

_HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ \S+\s*(.*)$")


def _mappings(pid: int | str):
    """(start, end, path, rss bytes) of each mapping of ``pid``."""
    found = []
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            header = _HEADER.match(line)
            if header:
                found.append([int(header[1], 16), int(header[2], 16), header[3], 0])
            elif line.startswith("Rss:"):
                found[-1][3] = int(line.split()[1]) * 1024
    return found


def mapped_bytes(address: int, size: int, pid: int | str = "self") -> int:
    """Bytes of [address, address + size) that ``pid`` maps now."""
    return sum(rss for start, end, _, rss in _mappings(pid)
               if start < address + size and address < end)


def mapped_shared_memory(pid: int | str) -> int:
    """Bytes of memfd segments that ``pid`` maps now."""
    return sum(rss for _, _, path, rss in _mappings(pid) if path.startswith("/memfd:"))
