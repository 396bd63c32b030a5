"""Retention (the 200-turn edit table): lru and spread victims, and every exception of the rule."""

from __future__ import annotations

import pytest

from stratastore import ConfigError
from stratastore.chain import Checkpoint, enforce_count, lru_victim, spread_victim, victim


def chain(
    *lengths: int,
    pinned: tuple[int, ...] = (),
    tail: int | None = None,
    used: dict[int, int] | None = None,
) -> list[Checkpoint]:
    used = used or {}
    return [
        Checkpoint(n, pinned=(i == 0 or n in pinned), tail=(n == tail), last_used=used.get(n, i))
        for i, n in enumerate(lengths)
    ]


def test_spread_formula_picks_the_smallest_relative_gap() -> None:
    for lengths in [(0, 100, 110, 900, 1000), (0, 100, 900, 950, 1000), (0, 10, 20, 30, 40, 50)]:
        c = chain(*lengths)
        n = lengths[-1]
        scores = {
            i: (lengths[i + 1] - lengths[i - 1]) / (n - lengths[i - 1])
            for i in range(1, len(lengths) - 1)
        }
        assert spread_victim(c) == min(scores, key=lambda i: (scores[i], i))
    assert spread_victim(chain(0, 100, 110, 900, 1000)) == 1  # the dense pair far back


def test_spread_never_takes_root_newest_or_pinned() -> None:
    c = chain(0, 10, 20, 30, pinned=(10, 20))
    assert spread_victim(c) == lru_victim(c) == 3  # only the newest is left: LRU's fallback
    c = chain(0, 10, 20, 30, 40, pinned=(20,))
    for _ in range(10):
        i = spread_victim(c)
        assert i not in (0, len(c) - 1) and not c[i].pinned
        assert c[i].length in (10, 30)
        break


def test_tail_goes_first_in_both_policies() -> None:
    c = chain(0, 10, 500, 900, 1000, tail=10, used={10: 99})
    assert spread_victim(c) == 1 and lru_victim(c) == 1
    pinned_tail = chain(0, 10, 500, 1000, tail=10, pinned=(10,))
    assert spread_victim(pinned_tail) == 2  # a pinned tail stays


def test_lru_takes_the_least_recently_used() -> None:
    c = chain(0, 10, 20, 30, 40, used={10: 5, 20: 1, 30: 7, 40: 9})
    assert lru_victim(c) == 2


def test_no_candidate_at_all() -> None:
    assert lru_victim(chain(0)) is None and spread_victim(chain(0)) is None
    assert lru_victim(chain(0, 5, pinned=(5,))) is None


def test_one_slot_falls_back_to_lru() -> None:
    c = chain(0, 10)
    assert spread_victim(c) == 1
    dropped = enforce_count(c, 1, "spread")
    assert [d.length for d in dropped] == [10] and [x.length for x in c] == [0]


def test_enforce_count_keeps_the_count_and_stops_when_nothing_can_go() -> None:
    c = chain(*range(0, 100, 10))
    enforce_count(c, 4, "spread")
    assert len(c) == 4 and c[0].length == 0 and c[-1].length == 90
    locked = chain(0, 1, 2, 3, pinned=(1, 2, 3))
    assert enforce_count(locked, 2, "lru") == [] and len(locked) == 4


def test_bad_policy_and_count_are_typed() -> None:
    with pytest.raises(ConfigError, match="spread"):
        victim(chain(0, 1, 2), "fifo")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="at least 1"):
        enforce_count(chain(0, 1), 0, "lru")
