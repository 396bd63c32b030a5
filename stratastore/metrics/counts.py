"""The counts one owner keeps: a few rows of the counter table, made from it.

Each object that counts (the park flow, the restore flow and its sources, the write queue, the
Store) makes its own :class:`Counts`, naming the rows it keeps; a name that is not a counter
row of its keeper in :data:`~stratastore.metrics.counters.COUNTERS` fails there, when the
object is made (``ValueError``), never at the first increment. An increment of a row the owner
did not name is a ``KeyError`` (a bug, caught by the first test that takes that path). The
figures a keeper reports are the sum of its owners' counts (:func:`total`), in the table's
order. Counts are not locked: each owner increments its own under the lock that guards its
state (the flow's lock, or the write queue's).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from stratastore.metrics.counters import Keeper, counter_keys

__all__ = ["Counts", "total"]


class Counts(Mapping[str, int]):
    """The counters ``keeper`` keeps that this owner counts (``keys``; default: all of the
    keeper's), each starting at zero. Read as a mapping; ``counts[key] += n`` counts."""

    __slots__ = ("_values", "keeper")

    def __init__(self, keeper: Keeper, keys: Iterable[str] | None = None) -> None:
        table = counter_keys(keeper)
        named = table if keys is None else tuple(keys)
        unknown = [k for k in named if k not in table]
        if unknown:
            raise ValueError(
                f"counts of {keeper!r}: {unknown} are not counter rows it keeps in the counter "
                "table (stratastore.metrics.counters.COUNTERS): add the row, or fix the name"
            )
        self.keeper = keeper
        self._values = dict.fromkeys(named, 0)

    def __getitem__(self, key: str) -> int:
        return self._values[key]

    def __setitem__(self, key: str, value: int) -> None:
        if key not in self._values:
            raise KeyError(f"{key!r} is not one of the counts this owner of {self.keeper!r} keeps")
        self._values[key] = value

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Counts({self.keeper!r}, {self._values!r})"


def total(keeper: Keeper, owners: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """The figures of ``keeper``: each of its counter rows, in the table's order, summed over
    the ``owners`` that count it (0 where none does)."""
    out = dict.fromkeys(counter_keys(keeper), 0)
    for counts in owners:
        for key, n in counts.items():
            out[key] += n
    return out
