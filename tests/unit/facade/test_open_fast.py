"""Open fast, take RAM only when it is used.

The RAM arena is address space at open, populated chunk by chunk as captures use it (and, with
``ram_prefault = background``, a slot's share ahead of use by a thread); a disk park target, or
``auto`` resolving to disk, reserves nothing; a ``ram_mib`` over the machine's physical memory is
a typed start-up error naming it. Memory is asserted through VmRSS, never a wall-clock time.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore import Checkpoint, ConfigError, Conversation, ModelFingerprint, Store
from stratastore.chain import as_tokens
from stratastore.tiers.arena import DEFAULT_CHUNK, Arena

MIB = 1 << 20
#: 4 KiB a token: a conversation of 1,000 tokens spans one 4 MiB chunk, of 2,500 two
FP = ModelFingerprint.create(
    "test/open-fast", n_layers=4, n_kv_heads=4, head_dim=64, page_tokens=16
)
BIG = 1 << 40


def vm_rss() -> int:
    """This process's resident set (VmRSS), in bytes."""
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def mem_total() -> int:
    """The machine's physical memory (MemTotal), in bytes."""
    with open("/proc/meminfo", encoding="ascii") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))


def conversation(cid: str, n: int, base: int) -> tuple[Conversation, np.ndarray]:
    lengths = [*range(256, n, 256), n]
    conv = Conversation(
        cid,
        as_tokens(np.arange(base, base + n)),
        [Checkpoint(x) for x in lengths],
        cuts=[0, *lengths[:-1]],
    )
    kv = np.random.default_rng(base).integers(0, 256, n * FP.token_bytes, dtype=np.uint8)
    return conv, kv


def round_trip(store: Store, cid: str, n: int, base: int) -> None:
    """Park a conversation to RAM and restore it: bit-exact, from RAM."""
    conv, kv = conversation(cid, n, base)
    assert store.park(conv, kv.copy()).where == "ram"
    out = np.zeros(n * FP.token_bytes, np.uint8)
    r = store.restore(np.arange(base, base + n), out)
    assert (r.source, r.tokens) == ("ram", n)
    assert np.array_equal(out, kv)


def arena_of(store: Store) -> Arena | None:
    return store._tiers.ram.arena


def test_a_default_open_takes_address_space_not_ram() -> None:
    before = vm_rss()
    store = Store.open(FP, {"ram_mib": 1024})  # every other setting its default
    grown = vm_rss() - before
    arena = arena_of(store)
    assert arena is not None and arena.capacity == 1024 * MIB + 4 * DEFAULT_CHUNK
    # was the whole arena (prefaulted at open); now at most the background's window, a slot's
    # share (a quarter here), can be resident so soon
    assert grown < arena.capacity / 3, f"RSS grew {grown / MIB:.0f} MiB at open"
    assert arena.populated_bytes <= 1024 * MIB // 4
    store.close()


def test_a_lazy_arena_populates_what_a_park_takes_and_nothing_else() -> None:
    with Store.open(FP, {"ram_mib": 256, "ram_prefault": "lazy"}, probe=lambda: BIG) as store:
        arena = arena_of(store)
        assert arena is not None and arena.populated_bytes == 0  # nothing touched at open
        before = vm_rss()
        round_trip(store, "a", 2500, 0)  # 10 MB: three chunks
        assert arena.populated_bytes == 3 * DEFAULT_CHUNK
        round_trip(store, "b", 2500, 10_000)  # the same chunks again (a's were released)
        assert arena.populated_bytes == 3 * DEFAULT_CHUNK
        assert vm_rss() - before < 64 * MIB


@pytest.mark.parametrize("park", ["disk", "auto"])
def test_a_disk_park_target_reserves_no_arena(tmp_path: Path, park: str) -> None:
    said: list[str] = []
    cfg = {"ram_mib": 1024, "park": park, "cold_dir": str(tmp_path / "cold"), "cold_mib": 256}
    free = [100 * MIB]  # auto: this cannot hold 4 slots of 256 MiB above the floor: disk
    before = vm_rss()
    with Store.open(FP, cfg, probe=lambda: free[0], warn=said.append) as store:
        grown = vm_rss() - before
        free[0] = BIG  # the disk park below is admitted
        assert grown < 64 * MIB, f"RSS grew {grown / MIB:.0f} MiB at open"
        assert arena_of(store) is None and not store.describe().ram.on
        assert store.stats()["park_target"] == "disk"
        conv, kv = conversation("a", 1000, 0)
        assert store.park(conv, kv.copy()).where == "disk"
        store.flush()
        out = np.zeros(1000 * FP.token_bytes, np.uint8)
        r = store.restore(np.arange(1000), out)
        assert (r.source, r.tokens) == ("disk", 1000) and np.array_equal(out, kv)
    assert said == ([] if park == "disk" else ["park target auto -> disk"])


def test_auto_decides_before_the_arena_is_reserved(tmp_path: Path) -> None:
    """``auto`` probes free RAM before the arena exists (so the arena never counts against
    itself), and resolving to RAM still reserves it."""
    cfg = {
        "ram_mib": 1024,
        "park": "auto",
        "cold_dir": str(tmp_path / "cold"),
        "cold_mib": 64,
        "min_free_mib": 1,
    }
    rss_at_probe: list[int] = []

    def probe() -> int:
        rss_at_probe.append(vm_rss())
        return BIG

    before = vm_rss()
    with Store.open(FP, cfg, probe=probe, warn=lambda m: None) as store:
        assert store.stats()["park_target"] == "ram" and arena_of(store) is not None
        assert rss_at_probe[0] - before < 64 * MIB  # nothing of the arena resident yet
        round_trip(store, "a", 1000, 0)


def test_ram_mib_over_physical_memory_is_a_config_error(tmp_path: Path) -> None:
    total = mem_total()
    ram_mib = total // MIB + 1024
    cfg = {"ram_mib": ram_mib, "cold_dir": str(tmp_path / "cold"), "cold_mib": 64}
    with pytest.raises(ConfigError) as e:
        Store.open(FP, cfg, probe=lambda: BIG)
    msg = str(e.value)
    assert f"ram_mib={ram_mib}" in msg  # the setting and the size asked
    assert f"{total / MIB:,.0f} MiB of physical memory" in msg  # what the machine has
    assert "lower ram_mib" in msg  # and the fix
    assert not (tmp_path / "cold").exists()  # before any level was opened
    # a disk park target keeps nothing in RAM: the same ram_mib asks for nothing
    with Store.open(FP, {**cfg, "park": "disk"}, probe=lambda: BIG) as store:
        assert arena_of(store) is None


@pytest.mark.parametrize("prefault", ["lazy", "background", "open"])
def test_captures_round_trip_bit_exact_across_a_reopen(tmp_path: Path, prefault: str) -> None:
    cfg = {
        "ram_mib": 64,
        "slots": 4,
        "ram_prefault": prefault,
        "min_free_mib": 1,
        "cold_dir": str(tmp_path / "cold"),
        "cold_mib": 256,
    }
    for generation in range(2):
        with Store.open(FP, cfg, probe=lambda: BIG) as store:
            arena = arena_of(store)
            assert arena is not None and arena.prefault == prefault
            for i, n in enumerate((500, 1000, 2500, 3000)):
                round_trip(store, f"g{generation}-{i}", n, 100_000 * (generation * 4 + i + 1))
            kept, kv = conversation(f"kept{generation}", 1500, 7_000_000 + generation)
            assert store.park(kept, kv.copy()).where == "ram"
        thread = arena._thread
        assert thread is None or not thread.is_alive()  # close() stopped and joined it
    with Store.open(FP, cfg, probe=lambda: BIG) as store:  # what the last RAM park mirrored
        for generation in range(2):
            n, base = 1500, 7_000_000 + generation
            out = np.zeros(n * FP.token_bytes, np.uint8)
            r = store.restore(np.arange(base, base + n), out)
            assert (r.source, r.tokens) == ("disk", n)
            assert np.array_equal(out, conversation("x", n, base)[1])


def test_background_populate_races_parks_bit_exact() -> None:
    cfg = {"ram_mib": 128, "slots": 2, "ram_prefault": "background", "min_free_mib": 1}
    with Store.open(FP, cfg, probe=lambda: BIG) as store:
        arena = arena_of(store)
        assert arena is not None and arena._thread is not None
        rng = np.random.default_rng(7)
        for i in range(24):  # parks take chunks while the thread populates the ones ahead
            round_trip(store, f"c{i}", int(rng.integers(200, 6000)), 50_000 * (i + 1))
        assert arena.populated_ahead_bytes > 0  # the thread did populate some of them
        assert arena.populated_bytes <= arena.capacity


def test_the_arena_under_a_populate_thread_keeps_every_byte() -> None:
    """Allocation, writes and releases on one thread while the populate thread works the
    free chunks ahead: every capture reads back exact, the bookkeeping adds up."""
    chunk = 64 << 10
    arena = Arena(256 * chunk, chunk_bytes=chunk, prefault="background", ahead_bytes=32 * chunk)
    rng = np.random.default_rng(1)
    held: list[tuple[Any, np.ndarray]] = []
    for _ in range(400):
        if held and (rng.random() < 0.4 or arena.free_bytes < 40 * chunk):
            a, data = held.pop(int(rng.integers(len(held))))
            out = np.empty_like(data)
            arena.read_into(a, out)
            assert np.array_equal(out, data)
            arena.release(a)
            continue
        data = rng.integers(0, 256, int(rng.integers(1, 12 * chunk)), dtype=np.uint8)
        a = arena.alloc(data.nbytes)
        assert a is not None
        arena.write(a, data)
        held.append((a, data))
    for a, data in held:
        out = np.empty_like(data)
        arena.read_into(a, out)
        assert np.array_equal(out, data)
    with arena._cv:
        in_use = {c for a, _ in held for c in a.chunks}
        assert sorted(arena._free + sorted(in_use)) == list(range(256))
        ready = sum(1 for c in arena._free if arena._populated[c])
        assert arena._ready == ready
    arena.close()
    assert arena._thread is not None and not arena._thread.is_alive()


def test_close_stops_the_populate_thread_at_once() -> None:
    for _ in range(5):
        arena = Arena(512 * MIB, prefault="background", ahead_bytes=512 * MIB)
        thread = arena._thread
        assert thread is not None
        arena.close()  # mid-populate: joined before the mapping goes
        assert not thread.is_alive() and arena.populated_bytes < arena.capacity
        arena.close()  # a second close does nothing


def test_without_madvise_populate_the_arena_touches_pages_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import stratastore.tiers.arena as arena_mod

    monkeypatch.setattr(arena_mod, "populate_write", lambda address, length: False)
    started = threading.active_count()
    with Store.open(FP, {"ram_mib": 64, "min_free_mib": 1}, probe=lambda: BIG) as store:
        arena = arena_of(store)
        assert arena is not None
        round_trip(store, "a", 2500, 0)
        assert arena.populated_bytes >= 3 * DEFAULT_CHUNK
        assert arena.populated_ahead_bytes == 0  # the thread gave up at its first chunk
    assert threading.active_count() <= started


def test_the_populate_thread_waits_while_there_is_no_room() -> None:
    """Below the parking floor (``room`` says no) nothing is populated ahead; the next
    allocation wakes the thread to ask again."""
    chunk = 64 << 10
    asked = threading.Event()
    room = [False]

    def has_room(n: int) -> bool:
        asked.set()
        return room[0]

    arena = Arena(
        64 * chunk, chunk_bytes=chunk, prefault="background", ahead_bytes=8 * chunk, room=has_room
    )
    assert not asked.wait(0.2)  # an arena never used populates nothing ahead, asks nothing
    assert arena.populated_bytes == 0
    assert arena.alloc(chunk) is not None  # the first use: the thread starts, finds no room
    assert asked.wait(10)
    assert arena.populated_ahead_bytes == 0
    room[0] = True
    a = arena.alloc(chunk)  # populated by the allocation itself; wakes the thread
    assert a is not None
    for _ in range(1000):
        if arena.populated_ahead_bytes >= 8 * chunk:
            break
        threading.Event().wait(0.01)
    assert arena.populated_ahead_bytes == 8 * chunk  # exactly the window ahead, no more
    arena.close()


def test_the_physical_memory_check_counts_the_slots_slack() -> None:
    from stratastore.config import StoreConfig
    from stratastore.tiers.ram import reserve_arena

    cfg = StoreConfig(ram_mib=64, slots=4)  # 64 MiB and 4 x 4 MiB of chunk slack: 80 MiB
    with pytest.raises(ConfigError, match=r"ram_mib=64 \(with slots=4\) asks for 80 MiB"):
        reserve_arena(cfg, physical=79 * MIB)
    reserve_arena(cfg, physical=80 * MIB).close()


def test_the_memory_a_process_can_have_is_its_containers_limit_when_lower(tmp_path: Path) -> None:
    from stratastore.io.system import mem_total

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       8000000 kB\nMemFree: 1 kB\n")
    limit = tmp_path / "memory.max"
    limit.write_text("max\n")
    assert mem_total(str(meminfo), str(limit)) == 8_000_000 * 1024
    limit.write_text(f"{2 << 30}\n")
    assert mem_total(str(meminfo), str(limit)) == 2 << 30
    assert mem_total(str(meminfo), str(tmp_path / "absent")) == 8_000_000 * 1024
