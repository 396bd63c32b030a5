"""fsck never dies of a signal: a data file truncated, or failing with EIO, while fsck reads its
pages is a finding (spec F-SC-3: pages are read with ``pread`` into memory the process owns,
never through a mapping, so a truncation is a short read, not a SIGBUS)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from stratastore.format import DATA_OFFSET, data_name
from stratastore.io import faults
from stratastore.levels.local import SegmentStore
from stratastore.ops.fsck import fsck
from tests.conftest import kv_bytes, tiny_fp

FP = tiny_fp()
ROOT = Path(__file__).resolve().parents[3]

#: run fsck --deep in a child, truncating the data file to its header once fsck has checked the
#: file's size and is about to read its pages: at the first ``preadv`` of page bytes (a reader
#: that ``pread``s) or at the hashing of the pages (a reader that maps the file, whose pages
#: vanish under it). Prints the findings as JSON.
_CHILD = r"""
import json, os, sys
import numba_kernels
from stratastore.ops.fsck import fsck

store, data, header = sys.argv[1], os.path.realpath(sys.argv[2]), int(sys.argv[3])
done = []


def truncate_once():
    if not done:
        done.append(True)
        os.truncate(data, header)


real_preadv = os.preadv


def preadv(fd, buffers, offset, *rest):
    if offset >= header and os.path.realpath(f"/proc/self/fd/{fd}") == data:
        truncate_once()
    return real_preadv(fd, buffers, offset, *rest)


real_page_hashes = numba_kernels.page_hashes


def page_hashes(*args, **kwargs):
    truncate_once()
    return real_page_hashes(*args, **kwargs)


os.preadv = preadv
numba_kernels.page_hashes = page_hashes
print(json.dumps([f.as_dict() for f in fsck([store], deep=True)]))
"""


def _one_segment(d: Path) -> Path:
    with SegmentStore.open(d, FP) as s:
        key = s.put_kv(s.root_key, np.arange(12), kv_bytes(FP, 12), token_start=0).key
    return d / data_name(key)


def test_data_file_truncated_while_fsck_reads_it_is_a_finding(tmp_path: Path) -> None:
    d = tmp_path / "s"
    data = _one_segment(d)
    r = subprocess.run(
        [sys.executable, "-c", _CHILD, str(d), str(data), str(DATA_OFFSET)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert data.stat().st_size == DATA_OFFSET, "the truncation never happened"
    assert r.returncode != -signal.SIGBUS, "fsck was killed by SIGBUS reading a truncated file"
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    found = {(f["id"], f["object"]) for f in json.loads(r.stdout)}
    assert ("SEGMENT_SIZE_MISMATCH", str(data)) in found, found


def test_eio_reading_pages_is_a_finding(tmp_path: Path) -> None:
    d = tmp_path / "s"
    data = _one_segment(d)
    # the first read of the data file (its header) succeeds, every later one fails
    with faults.inject(faults.Fault(op="read", nth=2, persistent=True, path_contains=data.name)):
        found = list(fsck([str(d)], deep=True))
    assert [(f.id, f.object) for f in found] == [("PAGE_HASH_MISMATCH", str(data))], found
    assert "could not be read" in found[0].detail
