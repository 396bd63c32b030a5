"""System probes the policy layers need (kept here so policy code never calls ``os``)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
from collections.abc import Callable

__all__ = [
    "after_fork_in_child",
    "cache_home",
    "cpu_count",
    "env_default",
    "env_var",
    "filesystem_type",
    "mem_available",
    "mem_total",
    "populate_write",
    "process_alive",
    "process_cpus",
    "process_start",
    "random_bytes",
    "run_on_cpus",
    "silence_stdout",
    "this_process",
    "volume_bytes",
]

#: ``madvise`` advice: fault a range in, writable, without changing its contents (Linux 5.14)
MADV_POPULATE_WRITE = 23


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


def mem_total(
    meminfo: str = "/proc/meminfo", cgroup: str = "/sys/fs/cgroup/memory.max"
) -> int | None:
    """Bytes of RAM this process can have: the machine's physical memory (``MemTotal``;
    elsewhere the physical pages), or its container's limit when that is lower (cgroup v2
    ``memory.max``); ``None`` when neither can be read."""
    total: int | None = None
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    total = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if total is None:
        try:
            total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            return None
    try:
        with open(cgroup, encoding="ascii") as f:
            limit = f.read().strip()
        if limit.isdigit():  # "max": no limit
            total = min(total, int(limit))
    except OSError:
        pass
    return total


@functools.cache
def _libc_madvise() -> Callable[[int, int, int], int] | None:
    """libc's ``madvise``, looked up once (``None``: not Linux, or no libc to call)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def populate_write(address: int, length: int) -> bool:
    """Fault in ``length`` bytes of a private writable mapping at ``address`` (page-aligned)
    for writing, without changing what they hold (``MADV_POPULATE_WRITE``): safe while another
    thread writes the same pages. Runs with the GIL released (libc through ctypes; Python's
    ``mmap.madvise`` holds it for the whole populate, stalling every other thread). Returns
    False when it was not done: a kernel before 5.14 (``EINVAL``), another OS, or any other
    failure; the caller then touches the pages itself or leaves them to fault on first use."""
    fn = _libc_madvise()
    return fn is not None and fn(address, length, MADV_POPULATE_WRITE) == 0


def volume_bytes(path: str) -> int | None:
    """The size in bytes of the filesystem ``path`` is on (``statvfs``: ``f_blocks`` fragments
    of ``f_frsize`` bytes, used and free), or ``None`` when it cannot be asked."""
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):  # gone meanwhile; no statvfs on this OS
        return None
    return st.f_blocks * st.f_frsize


def this_process() -> int:
    """This process's id (what the shared catalog tags in-flight work with, and what names a
    probe file of this process)."""
    return os.getpid()


def cpu_count() -> int:
    """The CPUs of this machine (``os.cpu_count``, not this process's affinity), 1 when that is
    not known."""
    return os.cpu_count() or 1


def process_cpus(tasks: str = "/proc/self/task", parent: int | None = None) -> set[int]:
    """The CPUs this process may run a thread on: the union of its threads' affinities and of
    its parent's (``parent``: its id, this process's parent by default). An engine that pins
    the threads of the process it computes in does not narrow it: vLLM's CPU worker pins every
    thread it has to the core its forward computes on (OMP's binding, set for the worker
    alone), while the engine process that started it keeps the machine's. A process started
    on a subset (``taskset`` on the engine, a cgroup's cpuset) keeps that subset, its parent
    being started on it too. The calling thread's own affinity when none can be read."""
    cpus: set[int] = set()
    try:
        for tid in os.listdir(tasks):
            try:
                cpus |= os.sched_getaffinity(int(tid))
            except (OSError, ValueError):  # the thread ended meanwhile
                continue
    except OSError:
        pass
    with contextlib.suppress(OSError):  # the parent is gone (or not ours to ask)
        cpus |= os.sched_getaffinity(os.getppid() if parent is None else parent)
    return cpus or set(os.sched_getaffinity(0))


def run_on_cpus(cpus: set[int]) -> bool:
    """Let the calling thread run on ``cpus`` (its affinity; the threads it starts inherit
    it). False, and nothing changed, when the system refuses (a CPU not this process's)."""
    try:
        os.sched_setaffinity(0, cpus)
    except (OSError, ValueError):
        return False
    return True


def random_bytes(n: int) -> bytes:
    """``n`` bytes from the operating system's random source (``os.urandom``)."""
    return os.urandom(n)


def env_var(name: str) -> str | None:
    """The value of the environment variable ``name`` in this process, or None when unset."""
    return os.environ.get(name)


def cache_home() -> str:
    """The user's cache directory (the XDG Base Directory spec): ``$XDG_CACHE_HOME`` when it
    is an absolute path (unset, empty or relative, it is ignored, as the spec says), else
    ``~/.cache``; ``""`` when this process has no home directory to put it in."""
    xdg = env_var("XDG_CACHE_HOME") or ""
    if os.path.isabs(xdg):
        return xdg
    home = os.path.expanduser("~")
    return os.path.join(home, ".cache") if os.path.isabs(home) else ""


def env_default(name: str, value: str) -> str:
    """Set the environment variable ``name`` to ``value`` unless it is set already (what child
    processes started later inherit); returns its value now."""
    return os.environ.setdefault(name, value)


def after_fork_in_child(fn: Callable[[], None]) -> None:
    """Run ``fn`` in the child after every ``fork`` of this process (``os.register_at_fork``):
    a forked child has none of its parent's threads, so state that names them is reset there."""
    os.register_at_fork(after_in_child=fn)


def silence_stdout() -> None:
    """Point this process's standard output at ``os.devnull`` (after the reader of a pipe
    left: Python's flush at exit then raises no second error)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


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


def filesystem_type(path: str, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The type of the filesystem holding ``path`` (longest mount point that prefixes it), or
    ``None`` when the mount table cannot be read (not Linux)."""
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    real = os.path.realpath(path)
    best, best_type = "", None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or not tail:
            continue
        mount = fields[4].replace("\\040", " ")
        inside = real == mount or real.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, best_type = mount, tail[0]
    return best_type
