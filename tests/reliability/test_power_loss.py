"""Power loss: every crash state of powerloss.crash_states for each canonical workload (park, spill,
degrade, GC, repair, index rebuild) satisfies the invariants: the store opens, fsck has no errors,
every park acknowledged before the cut restores byte-identical, the others are whole or
invisible."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from stratastore.io import faults, files
from tests.reliability import counts
from tests.reliability.harness import VARIANTS, WORKLOADS, check, workloads
from tests.reliability.powerloss import Recorder, crash_states, digest, materialize


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_every_crash_state(name: str, variant: int, tmp_path: Path) -> None:
    explore(name, tmp_path, variant=variant)


def test_the_explorer_catches_a_publish_without_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The suite can fail: with fsync a no-op (a durable write that renames unsynced bytes into
    place), some crash state loses an acknowledged park or leaves a damaged file."""
    monkeypatch.setattr(files, "fsync", lambda fd, path: None)
    with pytest.raises(AssertionError, match=r"dropped write|torn write|everything unsynced"):
        explore("park", tmp_path, count=False)


def explore(name: str, tmp_path: Path, count: bool = True, variant: int = 0) -> None:
    w = workloads(variant)[name]
    root = tmp_path / "rec"
    root.mkdir()
    if w.prepare is not None:
        w.prepare(root)
    rec = Recorder(root=root)
    with faults.use(rec):
        w.run(root, rec.ack)
    assert len(rec.acks) == (w.parks if w.durable and w.prepare is None else 0)
    seen: set[bytes] = set()
    kinds: dict[str, int] = {}
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
    generated: dict[str, int] = {}
    for kind, i, tree in crash_states(rec):
        generated[kind] = generated.get(kind, 0) + 1
        key = digest(tree)
        if key in seen:  # the same bytes as a state already checked
            continue
        seen.add(key)
        acked = {c for c, at in rec.acks if at <= i}
        with tempfile.TemporaryDirectory(dir=shm) as d:
            state = Path(d)
            for sub in ("warm", "cold"):
                (state / sub).mkdir()
            materialize(tree, state)
            try:
                check(w, state, acked, isolate_index=False)
            except AssertionError as e:
                raise AssertionError(
                    f"{name}: {kind} state before op {i} "
                    f"({rec.ops[i] if i < len(rec.ops) else 'end'}): {e}"
                ) from e
        kinds[kind] = kinds.get(kind, 0) + 1
        if count:
            counts.add("power-loss states")
    if w.prepare is None and w.durable:  # the parks write, sync, rename: every kind arises
        assert set(generated) == {
            "prefix",
            "dropped write",
            "torn write",
            "dropped dir update",
            "everything unsynced lost",
        }
        assert kinds.get("torn write") and kinds.get("dropped dir update"), kinds
    print(f"\n{name}: {len(rec.ops)} operations, unique crash states by kind {kinds}")
    shutil.rmtree(root)
