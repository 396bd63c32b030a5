"""The catalog keeps every manifest's bytes in the last level's LMDB environment, which each process
maps at 64 MiB and grows by doubling on MapFullError. Once one process grows it (64 MiB of
manifests: 16M token ids in all, e.g. 17 conversations of 1M tokens), LMDB answers every later
transaction of every *other* process that opened it before with MDB_MAP_RESIZED, and
``SegmentIndex._write``/``_reading`` turn that into a StoreError ("index ... is damaged ... delete
that directory"): every lookup, restore and park of that process fails until it is restarted. The
fix is to adopt the new size (``env.set_mapsize(0)``) and retry."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from stratastore import Checkpoint, Conversation, Store
from stratastore.format import ModelFingerprint

REPO = Path(__file__).resolve().parents[3]
FP_ARGS = dict(n_layers=1, n_kv_heads=1, head_dim=1, page_tokens=256, dtype="int8")

BIG_WRITER = """
import sys
import numpy as np
from stratastore import Checkpoint, Conversation, Store
from stratastore.format import ModelFingerprint
fp = ModelFingerprint.create("catalog-map/tiny", **{fp_args!r})
cfg = {{"ram_mib": 0, "park": "disk", "cold_dir": {cold!r}, "cold_mib": 64}}
n = 1 << 20
toks = np.arange(n, dtype=np.uint32)
kv = (np.arange(n * fp.token_bytes) & 0xFF).astype(np.uint8)
with Store.open(fp, cfg, probe=lambda: 1 << 40, warn=lambda _m: None) as s:
    for i in range(18):  # one shared segment, 18 manifests of 4 MiB each
        s.park(Conversation(f"big{{i}}", toks.copy(), [Checkpoint(n)]), kv)
        s.flush()
"""


def _fp() -> ModelFingerprint:
    return ModelFingerprint.create("catalog-map/tiny", **FP_ARGS)  # type: ignore[arg-type]


def test_a_process_keeps_working_after_another_grew_the_shared_environment(tmp_path: Path) -> None:
    fp = _fp()
    cold = str(tmp_path / "cold")
    cfg = {"ram_mib": 0, "park": "disk", "cold_dir": cold, "cold_mib": 64}
    toks = np.arange(7_000_000, 7_000_000 + 512, dtype=np.uint32)
    kv = (np.arange(512 * fp.token_bytes) * 3 & 0xFF).astype(np.uint8)
    with Store.open(fp, cfg, probe=lambda: 1 << 40, warn=lambda _m: None) as s:
        s.park(Conversation("small", toks.copy(), [Checkpoint(512)]), kv)
        s.flush()
        code = BIG_WRITER.format(fp_args=FP_ARGS, cold=cold)
        subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=300)
        out = np.zeros((512 + 1) * fp.token_bytes, dtype=np.uint8)
        prompt = np.concatenate([toks, np.array([4_000_000_000], dtype=np.uint32)])
        r = s.restore(prompt, out)  # StoreError: MDB_MAP_RESIZED
        assert r.tokens == 512
        s.park(
            Conversation("small2", toks[:256].copy() + 1, [Checkpoint(256)]),
            kv[: 256 * fp.token_bytes],
        )
        s.flush()
