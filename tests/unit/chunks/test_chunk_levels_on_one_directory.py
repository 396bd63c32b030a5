"""A chunk store given one directory as two levels is refused at open with a ConfigError that
names both specs and the fix, however the two name it (a trailing slash, ``.``/``..``
segments, ``file://``, a symbolic link, a bind mount), before any level is opened: the levels
would share the directory's commit lock, and the first page moved down from one into the other
would wait on itself forever (or the second open fails on the index, with advice to delete
it). It is the check a Store's levels get."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from stratastore import ChunkLevel, ChunkStore, ConfigError
from tests.conftest import tiny_fp

ROOT = Path(__file__).resolve().parents[3]
ROOM = 1 << 20


def _slash(d: Path) -> str:
    return f"{d}/"


def _dots(d: Path) -> str:
    (d.parent / "other").mkdir(exist_ok=True)
    return f"{d.parent}/./other/../{d.name}"


def _file_url(d: Path) -> str:
    return f"file://{d}"


def _link(d: Path) -> str:
    (d.parent / "link").symlink_to(d, target_is_directory=True)
    return str(d.parent / "link")


def _link_not_made_yet(d: Path) -> str:
    """A link to a directory that does not exist yet: the open would make it."""
    shutil.rmtree(d)
    (d.parent / "link").symlink_to(d, target_is_directory=True)
    return str(d.parent / "link")


@pytest.mark.parametrize("other", [_slash, _dots, _file_url, _link, _link_not_made_yet])
def test_one_directory_named_twice_is_refused(tmp_path: Path, other: Callable[[Path], str]) -> None:
    d = tmp_path / "l"
    d.mkdir()
    second = other(d)
    with pytest.raises(ConfigError) as e:
        ChunkStore.open([ChunkLevel(str(d), ROOM), ChunkLevel(second, ROOM)], tiny_fp())
    msg = str(e.value)
    assert repr(str(d)) in msg and repr(second) in msg, msg
    assert "are the same directory" in msg and "a directory of its own" in msg
    assert not (d / "strata-index").exists()  # refused before any level was opened


def test_two_directories_of_their_own_open(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    levels = [ChunkLevel(str(tmp_path / "a"), ROOM), ChunkLevel(f"{tmp_path}/a/../b/", ROOM)]
    with ChunkStore.open(levels, tiny_fp()) as s:
        assert len(s.levels) == 2


_BIND = """
import sys
from stratastore import ChunkLevel, ChunkStore, ConfigError
from tests.conftest import tiny_fp
try:
    ChunkStore.open([ChunkLevel(sys.argv[1], 1 << 20), ChunkLevel(sys.argv[2], 1 << 20)],
                    tiny_fp()).close()
    print("opened")
except ConfigError as e:
    print("refused:", e)
"""


def test_a_bind_mount_of_the_directory_is_refused(tmp_path: Path) -> None:
    """Two names of one inode that no path resolves to the other: a bind mount, made in a
    mount namespace of the child's own (nothing is mounted outside it)."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to make a private mount namespace")
    tried = subprocess.run(
        ["unshare", "-rm", "sh", "-c", f"mount --bind {a} {b}"], capture_output=True, text=True
    )
    if tried.returncode != 0:
        pytest.skip(f"a bind mount cannot be made here: {tried.stderr.strip()}")
    script = f"mount --bind {a} {b} && exec {sys.executable} -c {_quote(_BIND)} {a} {b}"
    p = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert p.stdout.startswith("refused:"), p.stdout + p.stderr
    assert repr(str(a)) in p.stdout and repr(str(b)) in p.stdout


def _quote(code: str) -> str:
    return "'" + textwrap.dedent(code).replace("'", "'\"'\"'") + "'"
