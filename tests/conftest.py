"""Shared fixtures. Hypothesis runs derandomized in CI (HYPOTHESIS_PROFILE=ci)."""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager

# The CUDA kernels run in numba's simulator in every test run (there is no GPU here or in CI);
# tools/gpu_check.sh runs the same tests on a real device with the simulator off.
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, settings

from stratastore import Checkpoint, Conversation, ModelFingerprint, Store
from stratastore.chain import as_tokens
from stratastore.levels.local import SegmentStore

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def tiny_fp(name: str = "test/tiny") -> ModelFingerprint:
    """2 layers x 2 kv heads x 4 dims fp16: 64 bytes a token, 256-byte pages of 4 tokens."""
    return ModelFingerprint.create(name, n_layers=2, n_kv_heads=2, head_dim=4, page_tokens=4)


def kv_bytes(fp: ModelFingerprint, n_tokens: int, seed: int = 0) -> npt.NDArray[np.uint8]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, n_tokens * fp.token_bytes, dtype=np.uint8)


def conversation_kv(
    cid: str, n: int, base: int, *, step: int = 16, fp: ModelFingerprint | None = None
) -> tuple[Conversation, npt.NDArray[np.uint8]]:
    """A conversation of ``n`` tokens ``base, base + 1, ...`` with a checkpoint (and a segment
    cut) every ``step`` tokens and at its end (``step=0``: at its end only), and its random K/V
    (seeded by ``base``) for ``fp`` (default :func:`tiny_fp`)."""
    fp = fp or tiny_fp()
    lengths = [*range(step, n, step), n] if step else [n]
    conv = Conversation(
        cid,
        as_tokens(np.arange(base, base + n)),
        [Checkpoint(x) for x in lengths],
        cuts=[0, *lengths[:-1]],
    )
    kv = np.random.default_rng(base).integers(0, 256, n * fp.token_bytes, dtype=np.uint8)
    return conv, kv


def on_disk(tiers: Any, conv_id: str) -> Any:
    """The conversation ``conv_id`` as a store's flow sees it in the catalog now (a
    :class:`~stratastore.tiers.view.DiskConv`: its segments and state keys); fails if absent."""
    tiers.view.sync()
    dc = tiers.view.get(conv_id)
    assert dc is not None, f"{conv_id!r} is not on disk"
    return dc


@contextmanager
def writer_held(store: Store) -> Iterator[threading.Event]:
    """Hold the Store's spill writer inside its next disk write until the block ends (then the
    write goes on and the store is flushed); yields the event set once a write is held."""
    release, entered = threading.Event(), threading.Event()
    real = store._tiers.write_disk_now

    def slow(snap: Any, *lock: Any) -> None:
        entered.set()
        release.wait(60)
        real(snap, *lock)

    store._tiers.write_disk_now = slow  # type: ignore[method-assign]
    try:
        yield entered
    finally:
        release.set()
        store.flush()
        store._tiers.write_disk_now = real  # type: ignore[method-assign]


@pytest.fixture
def fp() -> ModelFingerprint:
    return tiny_fp()


@pytest.fixture
def store(tmp_path: Path, fp: ModelFingerprint) -> Iterator[SegmentStore]:
    with SegmentStore.open(tmp_path / "store", fp) as s:
        yield s


def run_on_private_tmpfs(tmp_path: Path, script: str, *args: str) -> str:
    """Run ``script`` (Python source) with a fresh tmpfs mounted at ``tmp_path/vol`` in a private
    mount namespace, so that it is a real second volume (rename gives EXDEV). Skips unless root
    with ``unshare``; returns the script's stdout; ``{vol}`` in ``args`` names the mount."""
    import shutil
    import subprocess
    import sys

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a private tmpfs; EXDEV is injected elsewhere")
    vol = tmp_path / "vol"
    vol.mkdir(exist_ok=True)
    path = tmp_path / "script.py"
    path.write_text(script)
    root = Path(__file__).resolve().parents[1]
    argv = " ".join(a.format(vol=vol) for a in args)
    cmd = (
        f"mount -t tmpfs -o size=32m tmpfs {vol} && cd {root} && PYTHONPATH={root} "
        f"{sys.executable} {path} {argv}"
    )
    r = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", cmd],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if r.returncode != 0 and "Operation not permitted" in r.stderr:
        pytest.skip(f"private mounts are not permitted here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    return r.stdout


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print what the reliability suite exercised (counts printed by CI)."""
    from tests.reliability.counts import COUNTS, report

    if not COUNTS:
        return
    lines, short = report()
    terminalreporter.section("reliability counts")
    for line in lines:
        terminalreporter.write_line(line)
    if short and os.environ.get("STRATA_RELIABILITY_ENFORCE") == "1":
        terminalreporter.write_line("BELOW THE FLOOR: " + "; ".join(short), red=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """With STRATA_RELIABILITY_ENFORCE=1, a run below a floor fails (nothing is skipped
    silently: a reliability test that did not run shows up as a missing count)."""
    from tests.reliability.counts import report

    if os.environ.get("STRATA_RELIABILITY_ENFORCE") != "1":
        return
    _, short = report()
    if short and exitstatus == 0:
        session.exitstatus = 1


def run_with_timeout(fn: Callable[[], Any], timeout: float = 10.0) -> Any:
    """Run ``fn`` in a thread: its result, its exception re-raised, or a test failure when it
    does not return in time (the old code hangs: a daemon thread is left behind)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:  # handed to the test thread
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        pytest.fail(f"did not return within {timeout} s (hangs)")
    if "error" in box:
        raise box["error"]
    return box.get("result")


class CudaInterface:
    """Device memory seen only through ``__cuda_array_interface__`` (what a torch CUDA tensor
    or a CuPy array shows): a device array's interface, simulated (under the simulator, device
    memory is host memory: its numpy array's) or real; ``override`` changes its fields (e.g.
    ``data=(ptr, True)``: read-only)."""

    def __init__(self, dev: Any, **override: Any) -> None:
        self.dev = dev  # keeps the memory alive
        iface = getattr(dev, "__cuda_array_interface__", None)
        self.__cuda_array_interface__ = {**dict(iface or dev.__array_interface__), **override}

    def host(self) -> npt.NDArray[Any]:
        """The memory's bytes now, on the host."""
        out: npt.NDArray[Any] = self.dev.copy_to_host()
        return out
