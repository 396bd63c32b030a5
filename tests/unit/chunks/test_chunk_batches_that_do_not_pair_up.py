"""A batch call given as many keys as pages (or buffers) it is not raises ``BatchMismatch`` (a
``StrataError``, and a ``ValueError`` as before) naming both counts, before any page is put or
read: nothing is stored, nothing counted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stratastore import ChunkLevel, ChunkStore
from stratastore.chunks import BatchMismatch, chunk_key
from stratastore.errors import StrataError
from tests.conftest import tiny_fp


@pytest.mark.parametrize("call", ["put_many", "batch_put", "batch_get_into"])
def test_keys_and_pages_that_do_not_pair_up_are_refused_before_anything(
    tmp_path: Path, call: str
) -> None:
    keys = [chunk_key("a"), chunk_key("b")]
    with ChunkStore.open([ChunkLevel(str(tmp_path / "d"), 1 << 20)], tiny_fp()) as s:
        with pytest.raises(BatchMismatch, match="2 keys for 1 ") as e:
            getattr(s, call)(keys, [np.zeros(100, np.uint8)])
        assert isinstance(e.value, StrataError) and isinstance(e.value, ValueError)
        assert s.entries() == 0 and s.counters.puts == 0 and s.counters.misses == 0
