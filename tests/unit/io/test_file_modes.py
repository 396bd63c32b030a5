"""Conversations are private by default (spec F-DIR-9).

Every file the store, the index, fsck/repair create is ``0600`` and every directory ``0700``
unless ``file_mode`` says otherwise (``0640`` -> directories ``0750``); repair keeps the mode of
what it rewrites; fsck warns about a store other users can read.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from stratastore.config import StoreConfig
from stratastore.errors import ConfigError, StrataError
from stratastore.format import data_name, sidecar_name
from stratastore.format.naming import INDEX_DIR
from stratastore.levels.local import SegmentStore
from stratastore.ops.fsck import fsck
from stratastore.ops.repair import repair
from tests.conftest import kv_bytes, tiny_fp

FP = tiny_fp()


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    """The common umask (022): it removes group/other write bits, never read bits."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def make(d: Path, n: int = 3, **kw: int) -> list[bytes]:
    with SegmentStore.open(d, FP, **kw) as s:
        return [
            s.put_kv(s.root_key, np.arange(12) + 100 * i, kv_bytes(FP, 12, i), token_start=0).key
            for i in range(n)
        ]


def modes(d: Path) -> dict[str, int]:
    """The mode of the directory and of everything in it (recursively), by relative name."""
    out = {".": mode(d)}
    for p in sorted(d.rglob("*")):
        out[str(p.relative_to(d))] = mode(p)
    return out


def test_default_is_private(tmp_path: Path) -> None:
    d = tmp_path / "s"
    keys = make(d)
    got = modes(d)
    assert got["."] == 0o700 and got[INDEX_DIR] == 0o700
    for name in (
        data_name(keys[0]),
        sidecar_name(keys[0]),
        f"{INDEX_DIR}/data.mdb",
        f"{INDEX_DIR}/lock.mdb",
        f"{INDEX_DIR}/write.lock",
    ):
        assert got[name] == 0o600, (name, oct(got[name]))
    assert all(m & 0o077 == 0 for m in got.values()), {k: oct(v) for k, v in got.items()}
    assert StoreConfig().file_mode == 0o600


def test_group_file_mode(tmp_path: Path) -> None:
    d = tmp_path / "s"
    make(d, file_mode=0o640)
    for name, m in modes(d).items():
        is_dir = name in (".", INDEX_DIR)
        assert m == (0o750 if is_dir else 0o640), (name, oct(m))
    assert not any(f.id == "STORE_READABLE_BY_OTHERS" for f in fsck([str(d)]))


@pytest.mark.parametrize("bad", [0o400, 0o644 | 0o4000, 0o700, 0o777, 0o1600])
def test_file_mode_is_validated(bad: int) -> None:
    with pytest.raises(ConfigError, match="file_mode"):
        StoreConfig(file_mode=bad)
    with pytest.raises(StrataError, match="file_mode"):
        SegmentStore.open("/nonexistent/never-made", FP, file_mode=bad)
    assert StoreConfig.from_toml_bytes(b"file_mode = 0o640").file_mode == 0o640


def test_store_manifests_and_monitor_follow_the_config(tmp_path: Path) -> None:
    from stratastore import Checkpoint, Conversation, Store
    from stratastore.chain import as_tokens

    for file_mode in (0o600, 0o640):
        cold = tmp_path / f"cold{file_mode:o}"
        cfg = {
            "ram_mib": 1,
            "park": "disk",
            "cold_dir": str(cold),
            "cold_mib": 64,
            "min_free_mib": 1,
            "file_mode": file_mode,
        }
        conv = Conversation("c", as_tokens(np.arange(16)), [Checkpoint(16)], cuts=[0])
        with Store.open(FP, cfg) as store:
            store.park(conv, kv_bytes(FP, 16).copy())
            store.flush()
        got = modes(cold)
        chains = [n for n in got if n.startswith("strata-chain-")]
        assert chains, got
        want_dir = 0o700 if file_mode == 0o600 else 0o750
        for name, m in got.items():
            assert m == (want_dir if name in (".", INDEX_DIR) else file_mode), (name, oct(m))


def test_fsck_warns_about_a_store_others_can_read(tmp_path: Path) -> None:
    d = tmp_path / "s"
    keys = make(d)
    assert not any(f.id == "STORE_READABLE_BY_OTHERS" for f in fsck([str(d)]))
    os.chmod(d / sidecar_name(keys[1]), 0o644)
    found = [f for f in fsck([str(d)]) if f.id == "STORE_READABLE_BY_OTHERS"]
    assert len(found) == 1 and found[0].severity == "warning" and found[0].object == str(d)
    assert sidecar_name(keys[1]) in found[0].detail
    os.chmod(d / sidecar_name(keys[1]), 0o600)
    os.chmod(d, 0o755)  # the directory alone is enough (its names are listed to others)
    assert any(f.id == "STORE_READABLE_BY_OTHERS" for f in fsck([str(d)]))


def test_repair_creates_private_files(tmp_path: Path) -> None:
    d = tmp_path / "s"
    keys = make(d)
    (d / sidecar_name(keys[0])).write_bytes(b"garbage")
    os.chmod(d / sidecar_name(keys[0]), 0o600)
    repair([str(d)])
    got = modes(d)
    assert got["strata-quarantine"] == 0o700
    assert got[INDEX_DIR] == 0o700 and got[f"{INDEX_DIR}/data.mdb"] == 0o600
    assert got[f"strata-quarantine/{data_name(keys[0])}"] == 0o600  # moved, mode kept


def test_repair_keeps_the_mode_of_a_manifest_it_rewrites(tmp_path: Path) -> None:
    from stratastore import Checkpoint, Conversation, Store
    from stratastore.chain import as_tokens

    cold = tmp_path / "cold"
    cfg = {"ram_mib": 1, "park": "disk", "cold_dir": str(cold), "cold_mib": 64, "min_free_mib": 1}
    ckpts = [Checkpoint(16), Checkpoint(32), Checkpoint(48)]
    conv = Conversation("c", as_tokens(np.arange(48)), ckpts, cuts=[0, 16, 32])
    with Store.open(FP, cfg) as store:
        store.park(conv, kv_bytes(FP, 48).copy())
        store.flush()
    (chain,) = cold.glob("strata-chain-*")
    os.chmod(chain, 0o640)
    last = conv.segment_keys(FP.digest())[2].key
    (cold / sidecar_name(last)).unlink()  # the chain breaks at its last segment
    actions = repair([str(cold)])
    assert any(a.kind == "truncate_chain" for a in actions), actions
    assert mode(chain) == 0o640
