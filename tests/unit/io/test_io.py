"""The io layer (F-DUR-1, F-DUR-4, F-DUR-6): the durable protocol under injected faults,
rename-or-copy relocation, and the primitives' typed errors."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from stratastore.io import (
    DurableFile,
    StrataIOError,
    durable_write,
    faults,
    files,
    relocate_file,
    system,
)
from stratastore.io.faults import Fault
from tests.conftest import run_on_private_tmpfs


def listing(d: Path) -> list[str]:
    return sorted(os.listdir(d))


def test_durable_write_order_of_operations(tmp_path: Path) -> None:
    with faults.inject(record=True) as inj:
        durable_write(str(tmp_path / "a"), b"hello")
    ops = [op for op, _ in inj.log]
    assert ops == ["open", "write", "fsync", "rename", "fsync_dir"]
    assert (tmp_path / "a").read_bytes() == b"hello"
    assert listing(tmp_path) == ["a"]


@pytest.mark.parametrize("op", ["open", "write", "fsync", "rename", "fsync_dir"])
@pytest.mark.parametrize("err", [errno.EIO, errno.ENOSPC, errno.EROFS])
def test_failure_at_each_step_leaves_old_content_and_no_temp(
    tmp_path: Path, op: str, err: int
) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"old")
    with faults.inject(Fault(op=op, errno=err)) as inj, pytest.raises(StrataIOError) as ei:
        durable_write(str(target), b"new content")
    assert ei.value.errno == err and os.strerror(err) in str(ei.value)
    assert inj.faults[0].fired == 1
    if op == "fsync_dir":
        # the rename happened; only its durability is unknown, and the error says so
        assert target.read_bytes() == b"new content"
    else:
        assert target.read_bytes() == b"old"
    assert listing(tmp_path) == ["f"], "the temp file must be removed"


def test_fsync_failure_is_never_retried(tmp_path: Path) -> None:
    with faults.inject(Fault(op="fsync"), record=True) as inj, pytest.raises(StrataIOError):
        durable_write(str(tmp_path / "f"), b"x" * 100)
    assert [op for op, _ in inj.log].count("fsync") == 1
    assert not (tmp_path / "f").exists()


def test_short_writes_are_completed(tmp_path: Path) -> None:
    data = os.urandom(10_000)
    with faults.inject(Fault(op="write", nth=1, short=True), Fault(op="write", nth=3, short=True)):
        durable_write(str(tmp_path / "f"), data)
    assert (tmp_path / "f").read_bytes() == data


def test_persistent_short_write_reports_enospc(tmp_path: Path) -> None:
    with (
        faults.inject(Fault(op="write", short=True, persistent=True)),
        pytest.raises(StrataIOError) as ei,
    ):
        durable_write(str(tmp_path / "f"), b"x" * 1000)
    assert ei.value.errno == errno.ENOSPC
    assert listing(tmp_path) == []


def test_persistent_fault_fails_every_later_op(tmp_path: Path) -> None:
    with faults.inject(Fault(op="open", nth=2, persistent=True)) as inj:
        durable_write(str(tmp_path / "a"), b"1")
        for name in "bc":
            with pytest.raises(StrataIOError):
                durable_write(str(tmp_path / name), b"2")
    assert inj.faults[0].fired == 2
    assert listing(tmp_path) == ["a"]


def test_exclusive_commit_refuses_existing_name(tmp_path: Path) -> None:
    durable_write(str(tmp_path / "a"), b"first", exclusive=True)
    with pytest.raises(StrataIOError) as ei:
        durable_write(str(tmp_path / "a"), b"second", exclusive=True)
    assert ei.value.errno == errno.EEXIST
    assert (tmp_path / "a").read_bytes() == b"first"
    assert listing(tmp_path) == ["a"]


def test_exception_in_block_aborts(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), DurableFile(str(tmp_path / "a")) as f:
        f.write(b"partial")
        raise RuntimeError("caller failed")
    assert listing(tmp_path) == []


def test_relocate_same_volume_renames(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "dst").mkdir()
    (tmp_path / "src" / "f").write_bytes(b"payload")
    with faults.inject(record=True) as inj:
        how = relocate_file(str(tmp_path / "src" / "f"), str(tmp_path / "dst" / "f"))
    assert how == "rename"
    assert [op for op, _ in inj.log] == ["rename", "fsync_dir", "fsync_dir"]
    assert (tmp_path / "dst" / "f").read_bytes() == b"payload"
    assert not (tmp_path / "src" / "f").exists()


def test_relocate_exdev_copies_then_unlinks(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "dst").mkdir()
    data = os.urandom(3 * 1024 * 1024 + 17)
    (tmp_path / "src" / "f").write_bytes(data)
    with faults.inject(Fault(op="rename", nth=1, errno=errno.EXDEV), record=True) as inj:
        how = relocate_file(str(tmp_path / "src" / "f"), str(tmp_path / "dst" / "f"))
    assert how == "copy"
    ops = [op for op, _ in inj.log]
    # copy into a temp file, fsync, rename, fsync the destination, then unlink the source
    tail = ops[ops.index("fsync") :]
    assert tail == ["fsync", "rename", "fsync_dir", "unlink", "fsync_dir"]
    assert (tmp_path / "dst" / "f").read_bytes() == data
    assert listing(tmp_path / "src") == [] and listing(tmp_path / "dst") == ["f"]


@pytest.mark.parametrize("op", ["read", "write", "fsync", "rename", "fsync_dir", "unlink"])
def test_relocate_copy_failure_keeps_the_source(tmp_path: Path, op: str) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "dst").mkdir()
    (tmp_path / "src" / "f").write_bytes(b"abc" * 1000)
    exdev = Fault(op="rename", nth=1, errno=errno.EXDEV)
    nth = 2 if op == "rename" else 1
    with faults.inject(exdev, Fault(op=op, nth=nth)), pytest.raises(StrataIOError):
        relocate_file(str(tmp_path / "src" / "f"), str(tmp_path / "dst" / "f"))
    # whatever step failed, the source is intact (it goes only after the copy is durable)
    assert (tmp_path / "src" / "f").read_bytes() == b"abc" * 1000
    leftovers = [n for n in listing(tmp_path / "dst") if n != "f"]
    assert leftovers == [], "no temp file may stay behind"


_CROSS_VOLUME = """
import os, sys
from stratastore.io import relocate_file
src_dir, dst_dir = sys.argv[1], sys.argv[2]
data = os.urandom(1 << 20)
with open(os.path.join(src_dir, "f"), "wb") as f:
    f.write(data)
how = relocate_file(os.path.join(src_dir, "f"), os.path.join(dst_dir, "f"))
assert how == "copy", how
assert open(os.path.join(dst_dir, "f"), "rb").read() == data
assert not os.path.exists(os.path.join(src_dir, "f"))
print("OK", how)
"""


@pytest.mark.root
def test_relocate_across_a_real_second_volume(tmp_path: Path) -> None:
    """A private tmpfs (unshare -m) is another volume: rename gives a real EXDEV."""
    (tmp_path / "src").mkdir()
    out = run_on_private_tmpfs(tmp_path, _CROSS_VOLUME, str(tmp_path / "src"), "{vol}")
    assert "OK copy" in out


def test_read_file_refuses_oversized(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"x" * 100)
    assert files.read_file(str(tmp_path / "big"), 100) == b"x" * 100
    with pytest.raises(StrataIOError, match="limit"):
        files.read_file(str(tmp_path / "big"), 99)
    with pytest.raises(StrataIOError) as ei:
        files.read_file(str(tmp_path / "missing"), 10)
    assert ei.value.errno == errno.ENOENT and "missing" in str(ei.value)


def test_filesystem_type_from_mountinfo(tmp_path: Path) -> None:
    mi = tmp_path / "mountinfo"
    mi.write_text(
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
        "40 22 0:40 / /mnt/nfs rw,relatime shared:2 - nfs4 server:/x rw\n"
        "41 22 0:41 / /mnt/nfs/local\\040dir rw - tmpfs tmpfs rw\n"
    )
    assert system.filesystem_type("/mnt/nfs/a/b", str(mi)) == "nfs4"
    assert system.filesystem_type("/mnt/nfsx", str(mi)) == "ext4"
    assert system.filesystem_type("/mnt/nfs/local dir/z", str(mi)) == "tmpfs"
    assert system.filesystem_type("/x", str(tmp_path / "nope")) is None
    assert system.filesystem_type(str(tmp_path)) is not None  # the real table, on Linux
