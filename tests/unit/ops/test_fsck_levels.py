"""fsck, repair, conformance and monitor find a store's levels from what a user names (a store root,
its config file or one level) and say which they checked; one damaged segment is one finding;
INDEX_STALE compares every derived field; repair given some levels cuts no chain whose segments live
in another."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest

from stratastore import Checkpoint, Conversation, Store, StoreConfig, StrataError
from stratastore.chain import as_tokens
from stratastore.cli import main
from stratastore.format import IndexRecord, data_name
from stratastore.format.naming import INDEX_DIR, is_chain_name
from stratastore.levels.local import SegmentStore
from stratastore.ops.fsck import fsck
from stratastore.ops.repair import repair
from stratastore.testing import check_conformance
from tests.conftest import kv_bytes, tiny_fp

FP = tiny_fp()


@pytest.fixture(scope="module")
def demo_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What ``strata demo --dir X`` leaves: ``X/warm`` and ``X/cold``, one page byte of a cold
    segment (not a conversation's first) flipped by design."""
    from strata_harness.demo import run_demo

    root = tmp_path_factory.mktemp("demo") / "x"
    run_demo(str(root), 24)
    assert (root / "warm" / INDEX_DIR).is_dir() and (root / "cold" / INDEX_DIR).is_dir()
    return root


def _config(path: Path, warm: Path, cold: Path) -> Path:
    path.write_text(f'warm_dir = "{warm}"\nwarm_mib = 64\ncold_dir = "{cold}"\ncold_mib = 64\n')
    return path


def _json(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def test_fsck_of_a_demo_store_root_finds_the_flipped_byte(
    demo_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The store root a user gives is not a level: its warm/ and cold/ are checked, named, and
    the demo's flipped byte is one error (exit 1), not ``0 errors`` and two UNKNOWN_FILEs."""
    capsys.readouterr()
    assert main(["fsck", str(demo_root), "--deep", "--json"]) == 1
    doc = _json(capsys)
    assert doc["levels"] == [str(demo_root / "warm"), str(demo_root / "cold")]
    assert doc["levels_complete"] is True
    assert [(f["id"], Path(f["object"]).parent) for f in doc["findings"]] == [
        ("PAGE_HASH_MISMATCH", demo_root / "cold")
    ], doc["findings"]
    assert main(["fsck", str(demo_root)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"levels checked: {demo_root / 'warm'}, {demo_root / 'cold'}")
    assert "UNKNOWN_FILE" not in out and "1 errors" in out


def test_fsck_given_the_config_file_or_one_level(
    demo_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _config(tmp_path / "strata.toml", demo_root / "warm", demo_root / "cold")
    capsys.readouterr()
    for argv in (["fsck", str(cfg), "--json"], ["--config", str(cfg), "fsck", "--json"]):
        assert main(argv) == 1
        doc = _json(capsys)
        assert doc["levels"] == [str(demo_root / "warm"), str(demo_root / "cold")]
        assert [f["id"] for f in doc["findings"]] == ["PAGE_HASH_MISMATCH"]
    assert main(["fsck", str(demo_root / "cold"), "--json"]) == 1
    doc = _json(capsys)
    assert doc["levels"] == [str(demo_root / "cold")]  # checked: the level given
    assert str(demo_root / "warm") in doc["store_levels"]  # its sibling: chains look there too
    assert [f["id"] for f in doc["findings"]] == ["PAGE_HASH_MISMATCH"]
    assert main(["fsck", str(tmp_path / "missing")]) == 2  # a typed error, no traceback
    assert "does not exist" in capsys.readouterr().err


def test_conformance_and_monitor_accept_the_store_root_and_config(
    demo_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["conformance", str(demo_root), "--json"]) == 1
    doc = _json(capsys)
    assert doc["levels"] == [str(demo_root / "warm"), str(demo_root / "cold")]
    assert list(doc["violations"]) == ["F-SC-3"]
    assert main(["conformance", str(demo_root)]) == 1
    assert capsys.readouterr().out.startswith("levels checked: ")
    cfg = _config(tmp_path / "strata.toml", demo_root / "warm", demo_root / "cold")
    for target in (demo_root, cfg):
        assert main(["monitor", str(target), "--once", "--json"]) == 0
        doc = _json(capsys)
        assert {lv["dir"] for lv in doc["levels"].values() if lv["dir"]} == {
            str(demo_root / "warm"),
            str(demo_root / "cold"),
        }


def _park_chain(cfg: dict[str, Any]) -> tuple[Conversation, np.ndarray[Any, Any]]:
    conv = Conversation(
        "c",
        as_tokens(np.arange(48)),
        [Checkpoint(16), Checkpoint(32), Checkpoint(48)],
        cuts=[0, 16, 32],
    )
    kv = kv_bytes(FP, 48)
    with Store.open(FP, cfg) as store:
        store.park(conv, kv.copy())
        store.flush()
    return conv, kv


def test_one_flipped_page_byte_is_one_finding(tmp_path: Path) -> None:
    """The damaged segment is named once, by its cause; its index record and the chain that
    stops at it are in that finding's detail, not an INDEX_DANGLING and a CHAIN_BROKEN that
    says the segment (which is there) is in no level."""
    cold = tmp_path / "cold"
    cfg = {"ram_mib": 1, "park": "disk", "cold_dir": str(cold), "cold_mib": 64, "min_free_mib": 1}
    conv, _ = _park_chain(cfg)
    victim = conv.segment_keys(FP.digest())[1].key  # tokens 16..32
    raw = bytearray((cold / data_name(victim)).read_bytes())
    raw[4096 + 5] ^= 0x10
    (cold / data_name(victim)).write_bytes(bytes(raw))
    for deep in (False, True):
        found = [f for f in fsck([str(cold)], deep=deep) if f.severity != "info"]
        assert [(f.id, f.severity, f.object) for f in found] == [
            ("PAGE_HASH_MISMATCH", "error", str(cold / data_name(victim)))
        ], found
        assert "restores only up to token 16" in found[0].detail
        assert "'c'" in found[0].detail and INDEX_DIR in found[0].detail


#: every field of an index record fsck derives from the sidecar and the two files' sizes
#: (refcount is reserved and not relied on, spec F-IDX-2)
DERIVED = [f.name for f in dataclasses.fields(IndexRecord) if f.name != "refcount"]


def _other(value: Any) -> Any:
    if isinstance(value, bytes):
        return bytes([value[0] ^ 1]) + value[1:]
    if isinstance(value, bool) or not isinstance(value, int):
        raise AssertionError(value)
    members = list(type(value)) if hasattr(type(value), "__members__") else None
    if members:
        return next(m for m in members if m != value)
    return value + 1


@pytest.mark.parametrize("name", DERIVED)
def test_each_derived_index_field_changed_is_stale(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "s"
    with SegmentStore.open(d, FP) as s:
        key = s.put_kv(s.root_key, np.arange(12), kv_bytes(FP, 12), token_start=0).key
    env = lmdb.open(str(d / INDEX_DIR), subdir=True, max_dbs=4)
    with env.begin(write=True) as txn:
        db = env.open_db(b"segments", txn=txn, create=False)
        rec = IndexRecord.unpack(bytes(txn.get(key, db=db)))
        bad = dataclasses.replace(rec, **{name: _other(getattr(rec, name))})
        txn.put(key, bad.pack(), db=db)
    env.close()
    found = [f for f in fsck([str(d)], deep=True) if f.severity != "info"]
    assert [f.id for f in found] == ["INDEX_STALE"], found
    assert found[0].detail.startswith(f"{name} indexed "), found[0].detail
    report = check_conformance([str(d)])
    assert [f.id for f in report.violations.get("F-IDX-2", [])] == ["INDEX_STALE"]
    assert main(["conformance", str(d)]) == 1
    capsys.readouterr()
    repair([str(d)])
    assert [f for f in fsck([str(d)], deep=True) if f.severity != "info"] == []


def _snapshot(*dirs: Path) -> dict[str, bytes]:
    return {
        str(p): p.read_bytes()
        for d in dirs
        for p in sorted(d.rglob("*"))
        if p.is_file() and INDEX_DIR not in p.parts
    }


def _warm_cold_store(warm: Path, cold: Path) -> tuple[dict[str, Any], Conversation, Any]:
    """A chain whose manifest is in cold and whose segments are in warm (where parks go)."""
    # the store root (the levels' parent) is made with its levels
    cfg = {
        "ram_mib": 1,
        "park": "disk",
        "min_free_mib": 1,
        "warm_dir": str(warm),
        "warm_mib": 64,
        "cold_dir": str(cold),
        "cold_mib": 64,
        "create_dirs": True,
    }
    conv, kv = _park_chain(cfg)
    assert [p for p in cold.iterdir() if is_chain_name(p.name)]
    assert not list(cold.glob("strata-conv-*")) and list(warm.glob("strata-conv-*.side"))
    return cfg, conv, kv


def _restores(cfg: dict[str, Any], conv: Conversation, kv: Any) -> int:
    with Store.open(FP, cfg) as store:
        out = np.zeros_like(kv)
        n = int(store.restore(conv.tokens, out).tokens)
        assert np.array_equal(out[: n * FP.token_bytes], kv[: n * FP.token_bytes])
        return n


def test_repair_given_one_level_keeps_chains_whose_segments_are_in_another(
    tmp_path: Path,
) -> None:
    """Given only cold (the chains' level), repair finds warm beside it and cuts nothing; given
    only warm, it cuts nothing either. Nothing of either level changes."""
    warm, cold = tmp_path / "store" / "warm", tmp_path / "store" / "cold"
    cfg, conv, kv = _warm_cold_store(warm, cold)
    (cold / "strata-tmp-0011-x").write_bytes(b"half")  # something for repair to do
    before = _snapshot(warm, cold)
    for level in (cold, warm):
        actions = repair([str(level)])
        assert {a.kind for a in actions} <= {"remove_temp", "rebuild_index"}, actions
    assert _snapshot(warm, cold) == {k: v for k, v in before.items() if "strata-tmp-" not in k}
    assert _restores(cfg, conv, kv) == 48


def test_repair_refuses_when_a_chains_level_may_be_elsewhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Warm on another disk than cold, no sibling to find: repair given cold alone cannot know
    where the segments are and refuses (exit 2, nothing changed); given the config, it sees
    both levels and cuts nothing."""
    warm, cold = tmp_path / "ssd" / "warm", tmp_path / "hdd" / "cold"
    cfg, conv, kv = _warm_cold_store(warm, cold)
    before = _snapshot(warm, cold)
    with pytest.raises(StrataError, match="conversation 'c'") as refused:
        repair([str(cold)])
    assert type(refused.value).__name__ == "RepairRefused"
    assert _snapshot(warm, cold) == before
    capsys.readouterr()
    assert main(["fsck", str(cold), "--repair", "--yes"]) == 2
    err = capsys.readouterr().err
    assert "nothing was changed" in err and "config" in err and "Traceback" not in err
    assert _snapshot(warm, cold) == before
    toml = _config(tmp_path / "strata.toml", warm, cold)
    assert main(["fsck", str(toml), "--repair", "--yes"]) == 0
    assert "truncate_chain" not in capsys.readouterr().out
    assert _snapshot(warm, cold) == before
    assert _restores(cfg, conv, kv) == 48


def test_repair_cuts_at_a_damaged_segment_given_one_level(tmp_path: Path) -> None:
    """The chain cut that must still happen: its segment is damaged in the level given."""
    cold = tmp_path / "cold"
    cfg = {"ram_mib": 1, "park": "disk", "cold_dir": str(cold), "cold_mib": 64, "min_free_mib": 1}
    conv, kv = _park_chain(cfg)
    victim = conv.segment_keys(FP.digest())[2].key
    shutil.copy(cold / data_name(victim), tmp_path / "keep")
    raw = bytearray((cold / data_name(victim)).read_bytes())
    raw[4096 + 5] ^= 0x10
    (cold / data_name(victim)).write_bytes(bytes(raw))
    kinds = {a.kind for a in repair([str(cold)])}
    assert {"quarantine", "truncate_chain"} <= kinds
    assert _restores(cfg, conv, kv) == 32


def _levels_config(path: Path, levels: list[tuple[str, Path, int]]) -> Path:
    """A config of ``[[levels]]`` tables: (name, dir, mib) each."""
    path.write_text(
        "".join(f'[[levels]]\nname = "{n}"\ndir = "{d}"\nmib = {mib}\n\n' for n, d, mib in levels)
    )
    return path


def test_fsck_given_a_config_with_a_levels_list(
    demo_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``levels`` list naming the demo's warm and cold reads as the flat settings do."""
    cfg = _levels_config(
        tmp_path / "strata.toml",
        [("warm", demo_root / "warm", 64), ("cold", demo_root / "cold", 64)],
    )
    capsys.readouterr()
    assert main(["fsck", str(cfg), "--json"]) == 1
    doc = _json(capsys)
    assert doc["levels"] == [str(demo_root / "warm"), str(demo_root / "cold")]
    assert doc["levels_complete"] is True
    assert [f["id"] for f in doc["findings"]] == ["PAGE_HASH_MISMATCH"]


def test_a_third_level_of_a_config_is_found_in_its_order(tmp_path: Path) -> None:
    """Every level of the list that is on, in the config's order (a level with mib = 0 is
    off); a store root whose strata.toml names a level elsewhere is complete with it."""
    from stratastore.ops.level_dirs import ROOT_CONFIG, find_store_levels

    fast, mid, slow, off = (tmp_path / n for n in ("z-fast", "m-mid", "a-slow", "off"))
    for d in (fast, mid, slow):
        d.mkdir()
    cfg = _levels_config(
        tmp_path / "three.toml",
        [("nvme", fast, 8), ("ssd", mid, 16), ("off", off, 0), ("hdd", slow, 32)],
    )
    found = find_store_levels([str(cfg)])
    assert found.checked == (str(fast), str(mid), str(slow)) and found.complete
    assert find_store_levels([], StoreConfig.from_toml(str(cfg))).checked == found.checked
    root = tmp_path / "root"
    (root / "warm").mkdir(parents=True)
    (root / "warm" / INDEX_DIR).mkdir()
    _levels_config(root / ROOT_CONFIG, [("warm", root / "warm", 8), ("archive", slow, 8)])
    found = find_store_levels([str(root)])
    assert set(found.checked) == {str(root / "warm"), str(slow)} and found.complete
