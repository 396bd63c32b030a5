"""The one seam where tests inject I/O faults and crash points (DESIGN: io layer).

Every primitive in :mod:`stratastore.io.files` and :mod:`stratastore.io.guard` makes its OS call
through :func:`call`, which calls :func:`hit` with the operation name and path before touching
the OS. With no injector installed that is one global read. An injector:

* counts operations (``count``) and can record them (``log``) for crash-state exploration;
* fails the Nth matching operation with an errno, once or persistently, or makes a write short;
* ends the process with ``os._exit(CRASH_EXIT)`` at operation k (``crash_at``), which the kill
  tests arm in a subprocess through the ``STRATA_TEST_CRASH_AT_IO_OP`` environment variable.

Operation names: open, write, read, fsync, fsync_dir, rename, link, unlink, mkdir, listdir, stat.
"""

from __future__ import annotations

import errno as _errno
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from stratastore.io.errors import StrataIOError

__all__ = [
    "CRASH_ENV",
    "CRASH_EXIT",
    "Fault",
    "FaultInjector",
    "call",
    "hit",
    "inject",
    "use",
]

CRASH_ENV = "STRATA_TEST_CRASH_AT_IO_OP"
CRASH_EXIT = 86

T = TypeVar("T")


@dataclass
class Fault:
    """Fail the ``nth`` (1-based) operation matching ``op`` (any op when ``None``) and
    ``path_contains``. ``persistent`` fails every later match too. ``short`` (writes only)
    writes half the bytes and reports that, instead of raising."""

    op: str | None = None
    nth: int = 1
    errno: int = _errno.EIO
    persistent: bool = False
    short: bool = False
    path_contains: str | None = None
    seen: int = field(default=0, init=False)
    fired: int = field(default=0, init=False)

    def matches(self, op: str, path: str) -> bool:
        if self.op is not None and self.op != op:
            return False
        return self.path_contains is None or self.path_contains in path


@dataclass
class FaultInjector:
    faults: list[Fault] = field(default_factory=list)
    crash_at: int | None = None
    record: bool = False
    count: int = 0
    log: list[tuple[str, str]] = field(default_factory=list)

    def check(self, op: str, path: str) -> Fault | None:
        """Count one operation; return the fault to apply to it, if any."""
        self.count += 1
        if self.record:
            self.log.append((op, path))
        if self.crash_at is not None and self.count >= self.crash_at:
            os._exit(CRASH_EXIT)
        chosen: Fault | None = None
        for f in self.faults:
            if not f.matches(op, path):
                continue
            f.seen += 1
            if chosen is None and (f.seen == f.nth or (f.persistent and f.seen > f.nth)):
                f.fired += 1
                chosen = f
        return chosen


_lock = threading.Lock()
_active: FaultInjector | None = None


def _from_env() -> FaultInjector | None:
    raw = os.environ.get(CRASH_ENV)
    if not raw:
        return None
    return FaultInjector(crash_at=int(raw))


_active = _from_env()


def hit(op: str, path: str) -> Fault | None:
    """Called by every io primitive; returns a fault to apply, or ``None``."""
    inj = _active
    if inj is None:
        return None
    with _lock:
        return inj.check(op, path)


def call(op: str, path: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` (a primitive's OS call) as operation ``op`` on ``path`` through the seam: an
    injected fault (other than a short write, which the write loop applies itself) or an
    ``OSError`` raises :class:`StrataIOError` naming the operation and the path."""
    fault = hit(op, path)
    if fault is not None and not fault.short:
        raise StrataIOError(op, path, fault.errno, f"injected {os.strerror(fault.errno)}")
    try:
        return fn()
    except OSError as e:
        raise StrataIOError(op, path, e.errno or _errno.EIO, e.strerror or str(e)) from e


@contextmanager
def use(injector: FaultInjector) -> Iterator[FaultInjector]:
    """Install ``injector`` (a subclass may override ``check``, as the power-loss recorder
    does) for the duration of the block (tests only; not re-entrant)."""
    global _active
    prev, _active = _active, injector
    try:
        yield injector
    finally:
        _active = prev


@contextmanager
def inject(
    *faults: Fault, crash_at: int | None = None, record: bool = False
) -> Iterator[FaultInjector]:
    """Install an injector for the duration of the block (tests only; not re-entrant)."""
    global _active
    inj = FaultInjector(list(faults), crash_at=crash_at, record=record)
    prev, _active = _active, inj
    try:
        yield inj
    finally:
        _active = prev
