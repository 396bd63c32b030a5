"""A child process's output read line by line on threads, so that a test waits for a line (a
ready line, a first acknowledgement) with a timeout that fails clearly, never a hang, and
never guesses how long the child takes to start: on a loaded machine its imports alone can
take seconds."""

from __future__ import annotations

import subprocess
import threading
import time
from typing import IO

#: how long a test waits for a line a started child is due to print (generous: the child may
#: share two busy cores with a whole test run); the test fails, naming the line, after it
LINE_TIMEOUT_S = 300.0


class Lines:
    """The stdout (and stderr) of ``proc``, started with ``stdout=PIPE, stderr=PIPE,
    text=True``, collected as the child writes them."""

    def __init__(self, proc: subprocess.Popen[str], name: str = "child") -> None:
        assert proc.stdout is not None and proc.stderr is not None
        self.proc = proc
        self.name = name
        self.lines: list[str] = []
        self._err: list[str] = []
        self._cond = threading.Condition()
        self._eof = False
        self._taken = 0  #: lines :meth:`next` has handed out
        self._threads = [
            threading.Thread(target=self._pump, args=(proc.stdout, True), daemon=True),
            threading.Thread(target=self._pump, args=(proc.stderr, False), daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _pump(self, stream: IO[str], out: bool) -> None:
        for line in stream:
            with self._cond:
                (self.lines if out else self._err).append(line)
                self._cond.notify_all()
        with self._cond:
            if out:
                self._eof = True
            self._cond.notify_all()

    def stderr(self) -> str:
        with self._cond:
            return "".join(self._err)

    def _fail(self, what: str, timeout: float) -> AssertionError:
        """Stop the child (it must not outlive the test) and say what never came."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for t in self._threads:
            t.join(10)
        how = (
            f"exited {self.proc.returncode} before it"
            if self._eof
            else f"did not print it within {timeout:.0f} s"
        )
        return AssertionError(
            f"{self.name} {how} ({what}); its stderr ends:\n{self.stderr()[-3000:]}"
        )

    def wait_for(self, prefix: str, timeout: float = LINE_TIMEOUT_S) -> str:
        """The first line starting with ``prefix``, waiting for it at most ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = next((ln for ln in self.lines if ln.startswith(prefix)), None)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if self._eof or left <= 0:
                    break
                self._cond.wait(left)
        raise self._fail(f"a line starting {prefix!r}", timeout)

    def next(self, timeout: float = LINE_TIMEOUT_S) -> str:
        """The next line not handed out yet, waiting for it at most ``timeout`` s; ``""`` once
        the child closed its output (as ``readline`` says end of file)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._taken >= len(self.lines):
                left = deadline - time.monotonic()
                if self._eof:
                    return ""
                if left <= 0:
                    break
                self._cond.wait(left)
            else:
                self._taken += 1
                return self.lines[self._taken - 1]
        raise self._fail("its next line", timeout)

    def finish(self, timeout: float = LINE_TIMEOUT_S) -> str:
        """Every line, once the child has exited (at most ``timeout`` s from now)."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise self._fail("its exit", timeout) from None
        for t in self._threads:
            t.join(timeout)
        with self._cond:
            return "".join(self.lines)
