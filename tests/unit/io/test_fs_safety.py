"""Nothing outside the store, nothing that is not a store file.

Spec F-DIR-8: open, GC, fsck and repair never follow a symbolic link out of a store directory,
never remove or move anything that is not a store name inside the directories they were given,
and never read from (or act on) a non-regular file: a FIFO named like a sidecar or a manifest is
skipped and reported, promptly. The checks that could hang on the original code run in a child
process with a timeout, so a hang fails the test instead of hanging the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import stratastore
from stratastore.errors import StrataError
from stratastore.format import data_name, sidecar_name
from stratastore.format.naming import INDEX_DIR, chain_name
from stratastore.io import files, guard
from stratastore.levels.local import SegmentStore
from stratastore.ops.fsck import fsck
from stratastore.ops.repair import repair
from tests.conftest import kv_bytes, tiny_fp

FP = tiny_fp()
PKG_ROOT = Path(stratastore.__file__).resolve().parents[1]
HANG = 20  #: seconds a child may take before it counts as hung


def make(d: Path, n: int = 3) -> list[bytes]:
    with SegmentStore.open(d, FP) as s:
        return [
            s.put_kv(s.root_key, np.arange(12) + 100 * i, kv_bytes(FP, 12, i), token_start=0).key
            for i in range(n)
        ]


def outside_with_canary(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A directory outside the store holding a canary and files named like the index's own."""
    out = tmp_path / "outside"
    out.mkdir()
    content = {"canary.txt": b"do not touch", "data.mdb": b"not an index", "lock.mdb": b"mine"}
    for name, raw in content.items():
        (out / name).write_bytes(raw)
    return out, content


def untouched(out: Path, content: dict[str, bytes]) -> bool:
    return {p.name: p.read_bytes() for p in out.iterdir()} == content


def link_index(d: Path, out: Path) -> None:
    for p in (d / INDEX_DIR).iterdir():
        p.unlink()
    (d / INDEX_DIR).rmdir()
    (d / INDEX_DIR).symlink_to(out, target_is_directory=True)


def run_child(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter on this checkout; a hang fails the test."""
    env = {**os.environ, "PYTHONPATH": str(PKG_ROOT)}
    try:
        return subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=HANG,
            env=env,
            cwd=PKG_ROOT,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung for {HANG} s on a FIFO: {code.splitlines()[0]} {args}")


# -- item 1: a symlinked strata-index/ -------------------------------------------------------------
def test_repair_never_unlinks_through_a_symlinked_index(tmp_path: Path) -> None:
    d = tmp_path / "s"
    keys = make(d)
    out, content = outside_with_canary(tmp_path)
    link_index(d, out)
    (d / sidecar_name(keys[0])).write_bytes(b"garbage")  # something to repair: quarantine
    (d / "strata-tmp-0011-x").write_bytes(b"t")
    actions = repair([str(d)])
    assert untouched(out, content)  # the canary and the look-alike index files are all there
    found = {(f.id, f.object) for f in fsck([str(d)])}
    assert ("SYMLINK", str(d / INDEX_DIR)) in found
    assert (d / INDEX_DIR).is_symlink()  # left in place, reported
    assert any(a.kind == "refused" and a.object == str(d / INDEX_DIR) for a in actions), actions
    assert not (d / "strata-tmp-0011-x").exists()  # the rest of the repair still happened


def test_cli_repair_with_symlinked_index_leaves_the_target(tmp_path: Path) -> None:
    d = tmp_path / "s"
    make(d)
    out, content = outside_with_canary(tmp_path)
    link_index(d, out)
    r = run_child(
        "import sys; from stratastore.cli import main; "
        "sys.exit(main(['fsck', '--repair', '--yes', '--json', sys.argv[1]]))",
        str(d),
    )
    assert untouched(out, content)
    assert r.returncode == 1, r.stderr  # the link stays an error finding
    ids = {f["id"] for f in json.loads(r.stdout[r.stdout.index("{") :])["findings"]}
    assert "SYMLINK" in ids


def test_open_refuses_a_symlinked_index(tmp_path: Path) -> None:
    d = tmp_path / "s"
    make(d)
    out = tmp_path / "outside"
    out.mkdir()
    (out / "canary.txt").write_bytes(b"do not touch")
    link_index(d, out)
    with pytest.raises(StrataError, match="symbolic link"):  # SymlinkRefused, typed
        SegmentStore.open(d, FP)
    from stratastore import Store

    cfg = {"ram_mib": 1, "park": "disk", "cold_dir": str(d), "cold_mib": 64, "min_free_mib": 1}
    with pytest.raises(StrataError, match="symbolic link"):  # so no GC can run through it
        Store.open(FP, cfg)
    assert untouched(out, {"canary.txt": b"do not touch"})  # LMDB created nothing there


def test_open_refuses_symlinked_lmdb_files(tmp_path: Path) -> None:
    d = tmp_path / "s"
    make(d)
    out, content = outside_with_canary(tmp_path)
    (d / INDEX_DIR / "data.mdb").unlink()
    (d / INDEX_DIR / "data.mdb").symlink_to(out / "data.mdb")
    with pytest.raises(StrataError, match="symbolic link"):
        SegmentStore.open(d, FP)
    assert untouched(out, content)


def test_repair_never_quarantines_into_a_symlinked_quarantine(tmp_path: Path) -> None:
    d = tmp_path / "s"
    keys = make(d)
    out, content = outside_with_canary(tmp_path)
    (d / "strata-quarantine").symlink_to(out, target_is_directory=True)
    (d / sidecar_name(keys[1])).write_bytes(b"garbage")
    repair([str(d)])
    assert untouched(out, content)  # no store file was moved out of the store
    assert (d / sidecar_name(keys[1])).exists() and (d / data_name(keys[1])).exists()


# -- item 1: symlinks named like store files -------------------------------------------------------
def test_symlinked_segment_file_is_never_followed_or_removed(tmp_path: Path) -> None:
    d = tmp_path / "s"
    keys = make(d)
    out, _ = outside_with_canary(tmp_path)
    target = out / "seg"
    target.write_bytes((d / data_name(keys[1])).read_bytes())  # a valid copy, outside
    before = target.read_bytes()
    (d / data_name(keys[1])).unlink()
    (d / data_name(keys[1])).symlink_to(target)
    for p in (d / INDEX_DIR).iterdir():  # open must inspect every sidecar again
        p.unlink()
    with SegmentStore.open(d, FP) as s:
        assert keys[1] not in s  # not adopted through the link
        assert [k.name for k in s.skipped] == [sidecar_name(keys[1])]
        assert "SymlinkRefused" in s.skipped[0].error
        assert keys[0] in s and keys[2] in s
    found = {(f.id, f.object) for f in fsck([str(d)])}
    assert ("SYMLINK", str(d / data_name(keys[1]))) in found
    repair([str(d)])
    assert (d / data_name(keys[1])).is_symlink()  # never unlinked
    assert target.read_bytes() == before  # and its target untouched


def test_delete_leaves_a_symlink_named_like_a_data_file(tmp_path: Path) -> None:
    d = tmp_path / "s"
    keys = make(d)
    out, content = outside_with_canary(tmp_path)
    with SegmentStore.open(d, FP) as s:
        (d / data_name(keys[0])).unlink()
        (d / data_name(keys[0])).symlink_to(out / "canary.txt")
        assert s.delete(keys[0])  # unindexed and its sidecar gone (GC goes through here) ...
        assert keys[0] not in s
    assert (d / data_name(keys[0])).is_symlink()  # ... the link is left, reported
    assert untouched(out, content)
    assert ("SYMLINK", str(d / data_name(keys[0]))) in {(f.id, f.object) for f in fsck([str(d)])}


def test_symlinked_manifest_is_reported_and_left(tmp_path: Path) -> None:
    d = tmp_path / "s"
    make(d)
    out, content = outside_with_canary(tmp_path)
    name = chain_name("conv")
    (d / name).symlink_to(out / "canary.txt")
    found = {(f.id, f.object) for f in fsck([str(d)])}
    assert ("SYMLINK", str(d / name)) in found
    repair([str(d)])
    assert (d / name).is_symlink() and untouched(out, content)


def test_directory_named_like_a_sidecar(tmp_path: Path) -> None:
    d = tmp_path / "s"
    keys = make(d)
    odd = d / sidecar_name(bytes(range(32)))
    odd.mkdir()
    (odd / "inside").write_bytes(b"x")
    with SegmentStore.open(d, FP) as s:
        assert set(s.keys()) == set(keys)
    found = {(f.id, f.object) for f in fsck([str(d)])}
    assert ("NOT_REGULAR_FILE", str(odd)) in found
    repair([str(d)])
    assert (odd / "inside").read_bytes() == b"x"  # never moved into quarantine, never emptied


# -- the io layer's guard --------------------------------------------------------------------------
def test_guard_refuses_non_store_names_and_non_regular_files(tmp_path: Path) -> None:
    from stratastore.io.errors import NotARegularFile, NotAStoreName

    (tmp_path / "notes.txt").write_bytes(b"x")
    with pytest.raises(NotAStoreName):
        guard.remove_store_file(str(tmp_path / "notes.txt"))
    with pytest.raises(NotAStoreName):  # data.mdb is a store name only inside strata-index/
        guard.remove_store_file(str(tmp_path / "data.mdb"))
    fifo = tmp_path / sidecar_name(bytes(32))
    os.mkfifo(fifo)
    with pytest.raises(NotARegularFile, match="FIFO"):
        guard.remove_store_file(str(fifo))
    with pytest.raises(NotARegularFile, match="FIFO"):
        files.read_file(str(fifo), 100)  # at once, not waiting for a writer
    assert (tmp_path / "notes.txt").exists() and fifo.exists()
    out, content = outside_with_canary(tmp_path)
    (tmp_path / INDEX_DIR).symlink_to(out, target_is_directory=True)
    with pytest.raises(StrataError, match="symbolic link"):  # never unlinked through the link
        guard.remove_store_file(str(tmp_path / INDEX_DIR / "data.mdb"))
    with pytest.raises(StrataError, match="symbolic link"):
        guard.remove_index_dir(str(tmp_path / INDEX_DIR))
    assert untouched(out, content)


# -- item 8: FIFOs named like a sidecar or a manifest ----------------------------------------------
def fifo_store(tmp_path: Path) -> tuple[Path, Path, Path]:
    d = tmp_path / "s"
    make(d)
    side = d / sidecar_name(bytes(range(32)))
    chain = d / chain_name("conv")
    os.mkfifo(side)
    os.mkfifo(chain)
    for p in (d / INDEX_DIR).iterdir():  # open must look at every sidecar
        p.unlink()
    return d, side, chain


def test_fifo_does_not_hang_segment_store_open(tmp_path: Path) -> None:
    d, side, _ = fifo_store(tmp_path)
    r = run_child(
        "import sys; from stratastore.levels.local import SegmentStore\n"
        "from tests.conftest import tiny_fp\n"
        "with SegmentStore.open(sys.argv[1], tiny_fp()) as s:\n"
        "    print(len(s), [(k.name, k.error) for k in s.skipped])",
        str(d),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("3 ") and side.name in r.stdout and "NotARegularFile" in r.stdout


def test_fifo_manifest_does_not_hang_store_open(tmp_path: Path) -> None:
    d, _, chain = fifo_store(tmp_path)
    r = run_child(
        "import sys; from stratastore import Store; from tests.conftest import tiny_fp\n"
        "cfg = {'ram_mib': 1, 'park': 'disk', 'cold_dir': sys.argv[1], 'cold_mib': 64,\n"
        "       'min_free_mib': 1}\n"
        "with Store.open(tiny_fp(), cfg) as s:\n"
        "    print(list(s.describe().unreadable_manifests))",
        str(d),
    )
    assert r.returncode == 0, r.stderr
    assert chain.name in r.stdout


def test_fifo_does_not_hang_fsck(tmp_path: Path) -> None:
    d, side, chain = fifo_store(tmp_path)
    r = run_child(
        "import sys; from stratastore.cli import main; "
        "sys.exit(main(['fsck', '--json', sys.argv[1]]))",
        str(d),
    )
    assert r.returncode == 1, r.stderr
    found = {(f["id"], f["object"]) for f in json.loads(r.stdout)["findings"]}
    assert {("NOT_REGULAR_FILE", str(side)), ("NOT_REGULAR_FILE", str(chain))} <= found
    r = run_child(
        "import sys; from stratastore.cli import main; "
        "sys.exit(main(['fsck', '--repair', '--yes', sys.argv[1]]))",
        str(d),
    )
    assert side.exists() and chain.exists()  # left alone, still reported
    assert "NOT_REGULAR_FILE" in r.stdout


def test_fifo_does_not_hang_monitor(tmp_path: Path) -> None:
    d, _, _ = fifo_store(tmp_path)
    os.mkfifo(d / INDEX_DIR / "monitor.json")
    r = run_child(
        "import sys; from stratastore.cli import main; sys.exit(main("
        "['monitor', '--once', '--json', sys.argv[1]]))",
        str(d),
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    (level,) = doc["levels"].values()
    assert level["entries"] == 3  # the FIFO is not counted as an entry
    r = run_child(
        "import sys; from stratastore.metrics.monitor import read_monitor; "
        "doc = read_monitor(sys.argv[1]); print(doc['snapshot']); "
        "print(doc['snapshot_problem'])",
        str(d),
    )
    assert r.returncode == 0, r.stderr
    snapshot, problem = r.stdout.strip().split("\n")
    assert snapshot == "None" and "FIFO" in problem, r.stdout  # refused and said, not hung
