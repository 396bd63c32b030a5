"""System probes the policy layers need (kept here so policy code never calls ``os``)."""

from __future__ import annotations

import os

__all__ = ["mem_available"]


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
