"""The tiers together: where a park goes, restores from RAM and disk, park targets, the cascade
under real writes, and the low-RAM episode."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from strata_harness.sim import LowRam, run_low_ram
from stratastore import StrataError
from stratastore.chain import Checkpoint, Conversation, as_tokens
from stratastore.config import StoreConfig
from stratastore.tiers.records import Snapshot
from stratastore.tiers.tiered import Tiers
from tests.conftest import on_disk, tiny_fp

FP = tiny_fp()  # 64 bytes a token
MIB = 1 << 20
BIG = 1 << 40


def snap(cid: str, n: int, base: int = 0, system: int = 0) -> Snapshot:
    toks = np.concatenate([np.arange(system), np.arange(base, base + n - system) + 10_000])
    lengths = sorted({*range(max(system, 16), n, 16), n} - {0})
    conv = Conversation(
        cid,
        as_tokens(toks),
        [Checkpoint(x) for x in lengths],
        cuts=[0, *(x for x in lengths if x < n)],
    )
    # equal tokens have equal K/V (a deterministic model): the shared system prompt's K/V is one
    shared = np.random.default_rng(99).integers(0, 256, system * FP.token_bytes, dtype=np.uint8)
    own = np.random.default_rng(base).integers(0, 256, (n - system) * FP.token_bytes, np.uint8)
    return Snapshot(conv, np.concatenate([shared, own]))


def tiers(tmp_path: Path, free: list[int] | None = None, **kw: object) -> Tiers:
    values: dict[str, object] = {
        "ram_mib": 1,
        "slots": 4,
        "min_free_mib": 100,
        "park_min_free_mib": 10,
    }
    values.update(kw)
    probe = (lambda: free[0]) if free is not None else (lambda: BIG)
    return Tiers(StoreConfig.from_mapping(values), FP, probe=probe, warn=lambda m: None)


def restore(t: Tiers, s: Snapshot) -> tuple[str, int, np.ndarray]:
    out = np.zeros_like(s.kv)
    r = t.restore(s.conv.tokens, out)
    return r.source, r.tokens, out


def test_ram_park_and_restore(tmp_path: Path) -> None:
    t = tiers(tmp_path)
    s = snap("a", 100)
    assert t.park(s).where == "ram"
    source, n, out = restore(t, s)
    assert (source, n) == ("ram", 100) and np.array_equal(out, s.kv)
    assert t.stats()["hits_ram"] == 1 and not t.ram.entries  # mounted: the slot owns it now
    t.close()


def test_low_ram_spills_to_disk_and_restores_validated(tmp_path: Path) -> None:
    free = [50 * MIB]  # below snapshot + 100 MiB, above snapshot + 10 MiB
    t = tiers(tmp_path, free, cold_dir=str(tmp_path / "cold"), cold_mib=64)
    s = snap("a", 100)
    rep = t.park(s)
    assert (rep.where, rep.floor) == ("disk", "transient")
    source, n, out = restore(t, s)
    assert (source, n) == ("disk", 100) and np.array_equal(out, s.kv)
    free[0] = 5 * MIB  # not even the transient floor: the disk hit is refused, counted
    assert restore(t, s)[:2] == ("none", 0) and t.stats()["disk_hits_refused"] == 1
    t.close()


def test_no_disk_level_means_discard_when_ram_is_low(tmp_path: Path) -> None:
    t = tiers(tmp_path, [50 * MIB])
    assert t.park(snap("a", 100)).where == "discard" and t.stats()["discards"] == 1
    t.close()


def test_park_targets(tmp_path: Path) -> None:
    warned: list[str] = []
    cfg = StoreConfig(ram_mib=1, park="disk", min_free_mib=1)
    t = Tiers(cfg, FP, probe=lambda: BIG, warn=warned.append)
    assert t.target == "ram" and "needs a disk level" in warned[0]  # stays in RAM, warned
    t.close()
    t = tiers(tmp_path, park="disk", cold_dir=str(tmp_path / "c"), cold_mib=64)
    s = snap("a", 100)
    assert t.park(s).where == "disk" and not t.ram.entries  # the RAM copy is not kept
    assert restore(t, s)[:2] == ("disk", 100)
    t.close()
    warned.clear()
    cfg = StoreConfig(
        ram_mib=64,
        slots=4,
        park="auto",
        cold_dir=str(tmp_path / "c2"),
        cold_mib=64,
        min_free_mib=100,
    )
    low = Tiers(cfg, FP, probe=lambda: 150 * MIB, warn=warned.append)  # < 4 x 16 + 100 MiB
    high = Tiers(cfg, FP, probe=lambda: BIG, warn=warned.append)
    assert (low.target, high.target) == ("disk", "ram")
    assert warned == ["park target auto -> disk", "park target auto -> ram"]
    low.close()
    high.close()


def test_mirror_on_park_and_ram_eviction_leaves_the_disk_copy(tmp_path: Path) -> None:
    t = tiers(tmp_path, slots=1, cold_dir=str(tmp_path / "c"), cold_mib=64, spill_on="park")
    a, b = snap("a", 100), snap("b", 100, base=500)
    t.park(a)
    t.park(b)  # one slot: a leaves RAM, its mirror stays on disk
    assert list(t.ram.entries) == ["b"] and t.stats()["mirrors"] == 2
    assert restore(t, a)[:2] == ("disk", 100)
    t.close()


def test_spill_on_evict_writes_what_ram_evicts(tmp_path: Path) -> None:
    t = tiers(tmp_path, slots=1, cold_dir=str(tmp_path / "c"), cold_mib=64, spill_on="evict")
    a, b = snap("a", 100), snap("b", 100, base=500)
    t.park(a)
    assert len(t.cold.store) == 0 if t.cold else False  # nothing on disk yet
    t.park(b)
    assert t.stats()["evict_spills"] == 1
    source, n, out = restore(t, a)
    assert (source, n) == ("disk", 100) and np.array_equal(out, a.kv)
    t.close()


def test_cascade_through_tiers_degrades_and_shares_the_system_prompt(tmp_path: Path) -> None:
    seg = 4096 + 40 * 64 + 4096
    t = tiers(
        tmp_path,
        [50 * MIB],
        warm_dir=str(tmp_path / "w"),
        warm_mib=1,
        cold_dir=str(tmp_path / "c"),
        cold_mib=64,
    )
    t.warm.budget = 6 * seg  # type: ignore[union-attr]
    snaps = [snap(f"c{i}", 120, base=1000 * i, system=40) for i in range(4)]
    for s in snaps:
        assert t.park(s).where == "disk"
    st = t.stats()["levels"]
    assert st["warm"]["degradations"] > 0 and st["warm"]["disk_evictions"] == 0
    assert st["cold"]["adopted"] == st["warm"]["degradations"]
    for s in snaps:  # every conversation still restores, from whichever level holds it
        source, n, out = restore(t, s)
        assert (source, n) == ("disk", 120) and np.array_equal(out, s.kv)
    t.close()


def test_low_ram_episode(tmp_path: Path) -> None:
    doc = run_low_ram(LowRam(requests=30), str(tmp_path))
    old, new = doc["old"], doc["new"]
    assert old["discards"] > 0 and old["tokens_reread"] > 0 and old["parks_disk"] == 0
    assert new["discards"] == 0 and new["parks_disk"] > 0 and new["tokens_reread"] == 0
    assert new["disk_hits"] > 0


def test_manifest_is_the_commit_record(tmp_path: Path) -> None:
    from stratastore.format.naming import chain_name

    cold = tmp_path / "cold"
    t = tiers(tmp_path, [50 * MIB], cold_dir=str(cold), cold_mib=64)
    a, b = snap("a", 100, system=32), snap("b", 100, base=500, system=32)
    t.park(a)
    t.park(b)
    assert (cold / chain_name("a")).exists() and (cold / chain_name("b")).exists()
    # another process (a new instance on the same directories) finds and restores both
    other = tiers(tmp_path, [50 * MIB], cold_dir=str(cold), cold_mib=64)
    for s in (a, b):
        source, n, out = restore(other, s)
        assert (source, n) == ("disk", 100) and np.array_equal(out, s.kv)
    c = snap("c", 100, base=900)
    t.park(c)  # parked after `other` opened: picked up on its next lookup
    assert restore(other, c)[:2] == ("disk", 100)
    other.close()
    # segments without their manifest (a crash before the commit record) are invisible
    (cold / chain_name("a")).unlink()
    fresh = tiers(tmp_path, [50 * MIB], cold_dir=str(cold), cold_mib=64)
    assert restore(fresh, a)[1] <= 32  # at most the shared system prompt, through b
    # a manifest naming a missing segment restores up to that segment, validated
    seg = on_disk(fresh, "b").segments
    fresh.cold.store.delete(seg[2][2])  # type: ignore[union-attr]
    source, n, out = restore(fresh, b)
    assert (source, n) == ("disk", seg[2][0])
    assert np.array_equal(out[: n * 64], b.kv[: n * 64])
    st = fresh.stats()
    assert st["ladder_restores"] == 1 and st["damaged_segments"] == [seg[2][2].hex()]
    fresh.close()
    t.close()


def test_sessions_survive_capacity_gc(tmp_path: Path) -> None:
    t = tiers(tmp_path, [50 * MIB], cold_dir=str(tmp_path / "c"), cold_mib=1)
    t.cold.budget = 6 * (4096 * 2 + 16 * 64)  # type: ignore[union-attr]
    sess = snap("my-session", 64, base=7000)
    t.save_session(sess)
    for i in range(10):  # overflow the cold level many times over
        t.park(snap(f"c{i}", 64, base=100 * i))
    out = np.zeros_like(sess.kv)
    conv = t.load_session("my-session", out)
    assert np.array_equal(out, sess.kv) and len(conv.tokens) == 64
    assert t.stats()["levels"]["cold"]["disk_evictions"] > 0
    assert t.delete_session("my-session") and not t.delete_session("my-session")
    with pytest.raises(StrataError, match="no saved session"):
        t.load_session("my-session", out)
    t.close()
    no_disk = tiers(tmp_path)
    with pytest.raises(StrataError, match="no disk level"):
        no_disk.save_session(sess)
    no_disk.close()


def test_a_shared_prefix_hit_leaves_the_other_conversation_parked(tmp_path: Path) -> None:
    t = tiers(tmp_path)
    a = snap("a", 100, system=48)
    b = snap("b", 100, base=500, system=48)
    t.park(a)
    source, n, _ = restore(t, b)  # b shares a's system prompt only
    assert (source, n) == ("ram", 48) and "a" in t.ram.entries
    source, n, out = restore(t, a)  # a itself is still there, whole
    assert (source, n) == ("ram", 100) and np.array_equal(out, a.kv) and not t.ram.entries
    t.close()


def test_running_states_of_hybrid_models(tmp_path: Path) -> None:
    from stratastore.format import data_name

    free = [1 << 40]
    t = tiers(tmp_path, free, cold_dir=str(tmp_path / "c"), cold_mib=64, spill_on="evict")
    s = snap("h", 96)  # checkpoints every 16 tokens
    s.states = {n: bytes([n % 251]) * (1000 + n) for n in (32, 64, 96)}
    t.park(s)
    res = t.restore(s.conv.tokens, np.zeros_like(s.kv))
    assert (res.source, res.tokens, res.state) == ("ram", 96, s.states[96])
    # on disk: the state at the resume point comes back validated
    free[0] = 50 * MIB
    s2 = snap("h2", 96, base=300)
    s2.states = {n: bytes([n % 7]) * (500 + n) for n in (48, 96)}
    t.park(s2)  # the parking floor fails: to disk, states with it
    res = t.restore(s2.conv.tokens, np.zeros_like(s2.kv))
    assert (res.source, res.tokens, res.state) == ("disk", 96, s2.states[96])
    # the deepest state damaged: the resume falls back to the checkpoint below that has one
    key = on_disk(t, "h2").state_keys[96]
    path = tmp_path / "c" / data_name(key)
    raw = bytearray(path.read_bytes())
    raw[4096 + 3] ^= 1
    path.write_bytes(bytes(raw))
    res = t.restore(s2.conv.tokens, np.zeros_like(s2.kv))
    assert (res.source, res.tokens, res.state) == ("disk", 48, s2.states[48])
    t.close()


def test_retention_holds_each_parked_chain_to_the_configured_count(tmp_path: Path) -> None:
    t = tiers(tmp_path, checkpoints=3, retention="spread")
    s = snap("a", 160)  # checkpoints every 16 tokens: 10 of them
    s.conv.checkpoints[0].pinned = True
    t.park(s)
    kept = [c.length for c in t.ram.entries["a"].conv.checkpoints]
    assert len(kept) == 3 and kept[0] == 16 and kept[-1] == 160
    t.close()


def test_another_process_sees_a_conversation_parked_again_and_removed(tmp_path: Path) -> None:
    from stratastore.format.naming import chain_name

    cold = tmp_path / "cold"
    free = [50 * MIB]  # every park goes to disk
    a = tiers(tmp_path, free, cold_dir=str(cold), cold_mib=64)
    b = tiers(tmp_path, free, cold_dir=str(cold), cold_mib=64)
    short, long = snap("x", 48), snap("x", 96)  # the same conversation, two turns later
    a.park(short)
    assert restore(b, long)[:2] == ("disk", 48)
    a.park(snap("x", 96))
    source, n, out = restore(b, long)
    assert (source, n) == ("disk", 96) and np.array_equal(out, long.kv)
    assert a.catalog is not None and a.gc is not None
    gone = a.catalog.shorten("x", lambda m: 0)  # GC removes it, in a's process
    assert gone is not None
    a.gc.carry_out(gone)
    assert not (cold / chain_name("x")).exists()
    assert restore(b, long)[:2] == ("none", 0)  # b sees it at once (the shared catalog)
    a.close()
    b.close()
