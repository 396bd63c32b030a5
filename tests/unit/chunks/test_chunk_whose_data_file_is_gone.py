"""A page whose data file is gone (its sidecar and index record left: fsck's ``DATA_MISSING``)
is not stuck: a get that meets it is a miss counted in ``damaged`` that sets it aside, so
``exists()`` is false and the next put writes it again; a put never calls it present (a stat of
the data file, nothing read). Set aside means what ``strata fsck --repair`` does for that
finding: the sidecar is moved into ``strata-quarantine/``, never unlinked. A writer in another
process that puts the page again at the same time keeps its acknowledged write."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from stratastore import ChunkLevel, ChunkStore
from stratastore.chunks import chunk_key, stored_bytes, stored_key
from stratastore.format import data_name, sidecar_name
from stratastore.format.naming import QUARANTINE_DIR
from stratastore.ops.fsck import fsck
from tests.conftest import tiny_fp

ROOT = Path(__file__).resolve().parents[3]
PAGE = 20_000


def key(i: int) -> bytes:
    return chunk_key(f"page-{i}")


def page(i: int) -> npt.NDArray[np.uint8]:
    return np.random.default_rng(i).integers(0, 256, PAGE, np.uint8)


def lose_data(d: Path, i: int) -> None:
    (d / data_name(stored_key(key(i)))).unlink()


def set_aside(d: Path, i: int) -> bool:
    """Page ``i``'s sidecar was moved into the quarantine, as repair does, and is not left."""
    name = sidecar_name(stored_key(key(i)))
    return not (d / name).exists() and (d / QUARANTINE_DIR / name).is_file()


def clean(d: Path) -> bool:
    return not [f for f in fsck([str(d)]) if f.severity == "error"]


def test_a_get_is_a_counted_miss_that_sets_the_page_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "d"
    with ChunkStore.open([ChunkLevel(str(d), 1 << 20)], tiny_fp()) as s:
        s.put(key(0), page(0))
        s.put(key(1), page(1))
        lose_data(d, 0)
        assert s.exists(key(0))  # listed: only a look that meets it can tell
        with caplog.at_level("WARNING", logger="stratastore.chunks"):
            assert s.get(key(0)) is None
        assert "is damaged (DataMissing" in caplog.text and "DATA_MISSING" in caplog.text
        assert s.stats()["damaged"] == 1 and s.stats()["read_errors"] == 0
        assert not s.exists(key(0)) and set_aside(d, 0) and clean(d)
        assert s.get(key(0)) is None and s.stats()["damaged"] == 1  # a plain miss now
        assert s.put(key(0), page(0)) == "stored"
        assert s.get(key(0)) == page(0).tobytes() and s.get(key(1)) == page(1).tobytes()


def test_a_put_never_calls_it_present(tmp_path: Path) -> None:
    d = tmp_path / "d"
    with ChunkStore.open([ChunkLevel(str(d), 1 << 20)], tiny_fp()) as s:
        s.put(key(0), page(0))
        lose_data(d, 0)
        assert s.put(key(0), page(0)) == "stored"
        assert s.stats()["damaged"] == 1 and s.stats()["puts_deduped"] == 0
        assert set_aside(d, 0) is False  # the new copy's sidecar is back in its place
        assert (d / QUARANTINE_DIR / sidecar_name(stored_key(key(0)))).is_file()
        assert s.get(key(0)) == page(0).tobytes() and clean(d)
        assert s.put(key(0), page(0)) == "present"


def test_the_level_under_a_put_writes_it_again_too(tmp_path: Path) -> None:
    """The put's level dedupes only against a whole copy: a sidecar without its data, met
    under the commit lock, is set aside and the put commits (spec F-DUR-7)."""
    d = tmp_path / "d"
    with ChunkStore.open([ChunkLevel(str(d), 1 << 20)], tiny_fp()) as s:
        s.put(key(0), page(0))
        lose_data(d, 0)
        res = s.backends[0].put_state(key(0), page(0), token_pos=0)
        assert res.created and set_aside(d, 0) is False
        assert s.get(key(0)) == page(0).tobytes() and clean(d)


def test_a_copy_gone_on_a_lower_level_is_set_aside_there(tmp_path: Path) -> None:
    fast, low = tmp_path / "fast", tmp_path / "low"
    room = stored_bytes(PAGE)
    with ChunkStore.open(
        [ChunkLevel(str(fast), room), ChunkLevel(str(low), 4 * room)], tiny_fp()
    ) as s:
        s.put(key(0), page(0))
        s.put(key(1), page(1))  # 0 goes down
        lose_data(low, 0)
        assert s.put(key(0), page(0)) == "stored" and set_aside(low, 0)
        s.put(key(2), page(2))  # 0 goes down again: onto nothing stale
        assert s.get(key(0)) == page(0).tobytes() and clean(low) and clean(fast)


def test_a_move_down_onto_a_copy_gone_keeps_the_page(tmp_path: Path) -> None:
    """A move into a level whose copy of the key lost its data file moves the page (the stale
    sidecar set aside), never drops it as present there."""
    fast, low = tmp_path / "fast", tmp_path / "low"
    room = stored_bytes(PAGE)
    with ChunkStore.open(
        [ChunkLevel(str(fast), room), ChunkLevel(str(low), 4 * room)], tiny_fp()
    ) as s:
        s.put(key(0), page(0))
        s.backends[1].put_state(key(0), page(0), token_pos=0)  # a copy below too
        lose_data(low, 0)
        s.put(key(1), page(1))  # 0 goes down onto the stale copy
        assert stored_key(key(0)) not in s.backends[0] and set_aside(low, 0) is False
        assert s.get(key(0)) == page(0).tobytes() and clean(low)


def test_a_lost_oldest_page_does_not_wedge_the_cascade(tmp_path: Path) -> None:
    """The oldest page of a level, its data file gone, is set aside when it would move down
    (an image that cannot be read is discarded), instead of failing every put that needs room."""
    fast, low = tmp_path / "fast", tmp_path / "low"
    room = stored_bytes(PAGE)
    with ChunkStore.open(
        [ChunkLevel(str(fast), room), ChunkLevel(str(low), 4 * room)], tiny_fp()
    ) as s:
        s.put(key(0), page(0))
        lose_data(fast, 0)
        assert s.put(key(1), page(1)) == "stored"
        assert set_aside(fast, 0) and not s.exists(key(0))
        assert s.get(key(1)) == page(1).tobytes() and clean(fast) and clean(low)


_REPUT = """
import sys
import numpy as np
from stratastore import ChunkLevel, ChunkStore
from stratastore.chunks import chunk_key
from tests.conftest import tiny_fp
data = np.random.default_rng(0).integers(0, 256, 20_000, np.uint8)
with ChunkStore.open([ChunkLevel(sys.argv[1], 1 << 20)], tiny_fp()) as s:
    print(s.put(chunk_key("page-0"), data))
"""


def test_a_writer_in_another_process_keeps_its_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the read that finds the data gone and its setting aside, another process puts
    the page again (its put sets the stale sidecar aside itself, under the commit lock, and is
    acknowledged): the reader's setting aside finds the copy changed and leaves the new one."""
    d = tmp_path / "d"
    with ChunkStore.open([ChunkLevel(str(d), 1 << 20)], tiny_fp()) as s:
        s.put(key(0), page(0))
        lose_data(d, 0)
        damaged = s.failures.damaged
        outcomes: list[str] = []

        def other_process_first(*args: Any) -> None:
            p = subprocess.run(
                [sys.executable, "-c", textwrap.dedent(_REPUT), str(d)],
                capture_output=True,
                text=True,
                timeout=120,
                cwd=ROOT,
            )
            assert p.returncode == 0, p.stderr
            outcomes.append(p.stdout.strip())
            damaged(*args)

        monkeypatch.setattr(s.failures, "damaged", other_process_first)
        assert s.get(key(0)) is None  # this read met the lost copy
        assert outcomes == ["stored"]  # the other process wrote it again, acknowledged
        assert s.exists(key(0)) and s.get(key(0)) == page(0).tobytes()
        assert (d / data_name(stored_key(key(0)))).is_file() and clean(d)
