"""Per-slot speeds: the engine names the slot on ``park``/``restore``/``restore_many``, and
``Store.stats()["speeds"]`` and ``strata monitor`` show, per slot, per park or restore and per
level, GB/s and tokens/s over the recent window and the rates (calls and bytes a second)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from stratastore import Store
from stratastore.chain import InvalidRequest
from stratastore.cli import main
from stratastore.metrics.speeds import InvalidSlot, Speeds
from tests.conftest import conversation_kv, tiny_fp

FP = tiny_fp()


def test_speeds_by_slot_call_and_level(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = {
        "ram_mib": 1,
        "slots": 2,
        "cold_dir": str(tmp_path / "cold"),
        "cold_mib": 16,
        "min_free_mib": 0,
        "park_min_free_mib": 0,
    }
    with Store.open(FP, cfg) as store:
        a, kva = conversation_kv("a", 400, 0)
        b, kvb = conversation_kv("b", 200, 10_000)
        store.park(a, kva.copy(), slot=0)
        store.park(b, kvb.copy(), slot="gpu1:3")
        store.restore(a.tokens, np.zeros_like(kva), slot=0)
        store.restore(conversation_kv("x", 8, 90_000)[0].tokens, np.zeros(8 * 64, np.uint8))
        store.restore_many(
            [(b.tokens, np.zeros_like(kvb)), (a.tokens, np.zeros_like(kva))], slots=["gpu1:3", 0]
        )
        speeds = store.stats()["speeds"]
    assert speeds["window_s"] == 60.0
    slots = speeds["slots"]
    assert list(slots) == ["0", "gpu1:3", "-"]
    park = slots["0"]["park"]["ram"]
    assert (park["count"], park["tokens"], park["bytes"]) == (1, 400, 400 * FP.token_bytes)
    # the first restore takes a out of RAM (the slot owns it now): the second reads it back
    restore = slots["0"]["restore"]["ram"]
    assert (restore["count"], restore["tokens"]) == (1, 400)
    assert restore["gb_s"] > 0 and restore["tokens_s"] > 0
    assert restore["per_s"] == round(1 / 60, 3)
    assert restore["bytes_per_s"] == round(400 * FP.token_bytes / 60, 1)
    again = [lv for name, lv in slots["0"]["restore"].items() if name != "ram"]
    assert [(lv["count"], lv["tokens"]) for lv in again] == [(1, 400)]
    assert slots["-"]["restore"]["none"]["tokens"] == 0  # a miss, of no slot
    assert sum(lv["tokens"] for lv in slots["gpu1:3"]["restore"].values()) == 200
    assert main(["monitor", str(tmp_path / "cold"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["speeds"]["slots"]["0"]["restore"]["ram"]["tokens"] == 400
    assert main(["monitor", str(tmp_path / "cold"), "--once"]) == 0
    table = capsys.readouterr().out
    assert "speeds over the last 60.0 s, per slot:" in table
    assert any(line.split()[:3] == ["gpu1:3", "park", "ram"] for line in table.splitlines())


def test_the_window_forgets_old_calls() -> None:
    now = [0.0]
    speeds = Speeds(window_s=10, clock=lambda: now[0])
    speeds.record("restore", "1", "disk", 100, 6400, 0.5)
    now[0] = 5.0
    speeds.record("restore", "1", "disk", 300, 19_200, 0.5)
    got = speeds.table()["slots"]["1"]["restore"]["disk"]
    assert (got["count"], got["tokens"], got["tokens_s"], got["per_s"]) == (2, 400, 400.0, 0.2)
    assert got["gb_s"] == round(25_600 / 1.0 / 1e9, 3)
    now[0] = 12.0  # the first is out of the window
    got = speeds.table()["slots"]["1"]["restore"]["disk"]
    assert (got["count"], got["tokens"], got["tokens_s"]) == (1, 300, 600.0)
    now[0] = 100.0
    assert speeds.table()["slots"] == {}


@pytest.mark.parametrize("slot", [-1, True, 1.5, "", "a b", "x" * 65, b"0"])
def test_a_bad_slot_is_refused_before_anything_is_done(slot: object) -> None:
    with Store.open(FP, {"ram_mib": 1, "slots": 2}) as store:
        conv, kv = conversation_kv("a", 40, 0)
        with pytest.raises(InvalidSlot, match="slot="):
            store.park(conv, kv, slot=slot)  # type: ignore[arg-type]
        assert store.stats()["parks_ram"] == 0
        with pytest.raises(InvalidSlot):
            store.restore(conv.tokens, np.zeros_like(kv), slot=slot)  # type: ignore[arg-type]
        assert store.stats()["speeds"]["slots"] == {}


def test_slots_of_numpy_and_odd_kinds(tmp_path: Path) -> None:
    with Store.open(FP, {"ram_mib": 1, "slots": 2}) as store:
        conv, kv = conversation_kv("a", 40, 0)
        store.park(conv, kv, slot=np.int64(3))
        assert list(store.stats()["speeds"]["slots"]) == ["3"]
        for bad in (10**100, 10**5000, "x" * 200):
            with pytest.raises(InvalidSlot, match="is not a slot"):
                store.park(conversation_kv("b", 8, 90)[0], np.zeros(8 * 64, np.uint8), slot=bad)
        prompt = np.zeros(8 * 64, np.uint8)
        for slots in (np.array([1]), b"\x00", {7: "a"}, iter([1]), 5):
            with pytest.raises(InvalidRequest, match="slots must be a list"):
                store.restore_many([(conv.tokens[:8], prompt)], slots=slots)  # type: ignore[arg-type]


def test_the_busiest_slots_are_named_and_the_others_added_up() -> None:
    speeds = Speeds()
    for i in range(200):  # an engine naming its requests: 200 slots
        speeds.record("restore", f"req-{i}", "disk", 10, 1000 * (i + 1), 0.001)
    slots = speeds.table()["slots"]
    assert len(slots) == 65 and "req-199" in slots and "req-0" not in slots
    others = slots["(others)"]["restore"]["disk"]
    assert (others["count"], others["tokens"]) == (136, 1360)


def test_the_monitor_never_fails_on_an_odd_snapshot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = {"ram_mib": 1, "cold_dir": str(tmp_path / "cold"), "cold_mib": 16, "min_free_mib": 0}
    with Store.open(FP, cfg) as store:
        conv, kv = conversation_kv("a", 40, 0)
        store.park(conv, kv, slot=0)
    snap = tmp_path / "cold" / "strata-index" / "monitor.json"
    doc = json.loads(snap.read_text())
    doc["speeds"]["slots"]["\x1b[2J"] = {"park": {"ram": {"bytes_per_s": 10**400, "gb_s": 1e308}}}
    doc["levels"]["cold"]["budget"] = 10**400
    doc["pid"] = 10**40
    snap.write_text(json.dumps(doc))
    for flags in ([], ["--json"], ["--prometheus"]):
        assert main(["monitor", str(tmp_path / "cold"), "--once", *flags]) == 0
    assert "\x1b[2J" not in capsys.readouterr().out.replace("\\u001b[2J", "")
