"""The park-truncate episode: park the prefix that fits, truncate before evicting, and every
exception."""

from __future__ import annotations

import numpy as np
import pytest

from stratastore import ConfigError
from stratastore.chain import Checkpoint, Conversation, as_tokens
from stratastore.chain.parking import ConversationCache, SizeModel

MODEL = b"\x07" * 32
TB = 100  # bytes per token


def conv(cid: str, n: int, every: int = 10, base: int = 0) -> Conversation:
    lengths = [*range(every, n, every), n]
    return Conversation(
        cid,
        as_tokens(np.arange(base, base + n)),
        [Checkpoint(x, last_used=i) for i, x in enumerate(lengths)],
    )


def cache(
    budget_tokens: int,
    slots: int = 4,
    *,
    truncate: bool = True,
    min_tokens: int = 0,
    available: int = 1 << 40,
    min_free: int = 0,
    **kw: object,
) -> ConversationCache:
    return ConversationCache(
        MODEL,
        SizeModel(TB),
        budget_bytes=budget_tokens * TB,
        slots=slots,
        truncate=truncate,
        min_tokens=min_tokens,
        available=lambda: available,
        min_free_bytes=min_free,
        **kw,
    )  # type: ignore[arg-type]


def test_whole_park_when_it_fits() -> None:
    c = cache(100)
    out = c.park(conv("a", 95))
    assert out.parked_tokens == 95 and not out.truncated and c.used == 95 * TB


def test_prefix_that_fits_the_budget() -> None:
    c = cache(64)
    out = c.park(conv("a", 95))
    assert out.parked_tokens == 60 and out.truncated
    m = c.lookup(np.arange(95))
    assert m is not None and m.length == 60
    assert c.counters["truncated_parks"] == 1


def test_prefix_that_fits_the_ram_gate() -> None:
    # available must cover snapshot + floor: 5,000 - 2,000 leaves room for 30 tokens
    c = cache(1000, available=5000, min_free=2000)
    out = c.park(conv("a", 95))
    assert out.parked_tokens == 30 and out.truncated


def test_truncated_prefix_is_parked_even_below_min_tokens() -> None:
    c = cache(25, min_tokens=50)
    assert c.park(conv("a", 95)).parked_tokens == 20


def test_whole_chain_below_min_tokens_is_not_parked() -> None:
    c = cache(1000, min_tokens=50)
    assert c.park(conv("a", 40)).parked_tokens is None
    assert c.counters["discards"] == 1


def test_without_truncate_a_chain_that_fails_is_discarded() -> None:
    c = cache(64, truncate=False)
    assert c.park(conv("a", 95)).parked_tokens is None and c.counters["discards"] == 1
    c = cache(1000, truncate=False, available=5000, min_free=2000)
    assert c.park(conv("a", 95)).parked_tokens is None


def test_nothing_fits_is_a_counted_discard() -> None:
    c = cache(5)
    assert c.park(conv("a", 95)).parked_tokens is None and c.counters["discards"] == 1


def test_truncate_before_evict() -> None:
    c = cache(150)
    c.park(conv("a", 95))
    out = c.park(conv("b", 80, base=1000))
    assert out.shrunk == [("a", 70)] and out.evicted == []  # 70 + 80 <= 150
    assert len(c.entries) == 2 and c.used == 150 * TB
    m = c.lookup(np.arange(95))
    assert m is not None and m.conv_id == "a" and m.length == 70


def test_without_truncate_the_oldest_goes_whole() -> None:
    c = cache(150, truncate=False)
    c.park(conv("a", 95))
    out = c.park(conv("b", 80, base=1000))
    assert out.evicted == ["a"] and out.shrunk == []
    assert c.counters["evictions"] == 1 and c.lookup(np.arange(95)) is None


def test_landing_below_min_tokens_drops_the_entry_whole() -> None:
    c = cache(150, min_tokens=75)
    c.park(conv("a", 95))
    out = c.park(conv("b", 80, base=1000))  # the landing would be 70 < 75
    assert out.evicted == ["a"] and out.shrunk == []


def test_pinned_entries_are_never_truncated() -> None:
    c = cache(150)
    c.park(conv("a", 95), pinned=True)
    out = c.park(conv("b", 80, base=1000))
    assert out.parked_tokens is None and out.shrunk == [] and "a" in c.entries
    assert c.entries["a"].conv.tokens.size == 95


def test_no_eviction_when_pinned_entries_leave_no_room() -> None:
    c = cache(150)
    c.park(conv("a", 95), pinned=True)
    c.park(conv("z", 40, base=5000))
    out = c.park(conv("b", 80, base=1000))  # 95 pinned + 80 > 150 whatever goes
    assert out.parked_tokens is None and out.evicted == [] and "z" in c.entries


def test_slot_pressure_still_evicts_whole() -> None:
    c = cache(10_000, slots=2)
    c.park(conv("a", 95))
    c.park(conv("b", 95, base=1000))
    out = c.park(conv("c", 95, base=2000))
    assert out.evicted == ["a"] and out.shrunk == [] and list(c.entries) == ["b", "c"]


def test_multi_stage_layouts_park_all_or_nothing() -> None:
    c = cache(64, multi_stage=True)
    assert not c.truncate and c.park(conv("a", 95)).parked_tokens is None


def test_take_mounts_and_removes() -> None:
    c = cache(1000)
    c.park(conv("a", 95))
    taken = c.take("a")
    assert taken.conv_id == "a" and not c.entries and c.lookup(np.arange(95)) is None


def test_bad_settings_are_typed() -> None:
    with pytest.raises(ConfigError):
        cache(10, slots=0)
    with pytest.raises(ConfigError):
        cache(-1)
