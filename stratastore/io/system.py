"""System probes the policy layers need (kept here so policy code never calls ``os``)."""

from __future__ import annotations

import os

__all__ = ["mem_available", "process_alive", "process_start", "this_process"]


def mem_available(meminfo: str = "/proc/meminfo") -> int:
    """Bytes of RAM available to new allocations (``MemAvailable``), or free pages elsewhere."""
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def this_process() -> int:
    """This process's id (what the shared catalog tags in-flight work with)."""
    return os.getpid()


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this machine (signal 0: nothing is sent). A process
    of another user counts as alive (EPERM). Used to clear in-flight work a crashed process left
    in the shared catalog."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_start(pid: int) -> int:
    """When process ``pid`` started (clock ticks since boot, field 22 of ``/proc/PID/stat``),
    or 0 when that is not known: with its pid, it names one process even after the pid is
    reused (a container's pid 1, restarted)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return 0
