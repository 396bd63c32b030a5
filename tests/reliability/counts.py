"""What the reliability suite exercised in this run, printed at its end (tests/conftest.py).

A floor is set for one CI run; ``make soak`` multiplies the work by ``STRATA_SOAK``
(10) and the floor with it. With ``STRATA_RELIABILITY_ENFORCE=1`` (set by ``.ci/run`` and
``make soak``) a full run that falls below a floor fails.
"""

from __future__ import annotations

import os
from collections import Counter

SCALE = max(1, int(os.environ.get("STRATA_SOAK", "1")))

#: kind -> the least one CI run (SCALE 1) must reach
FLOORS = {
    "kill points": 300,
    "power-loss states": 2000,
    "injected errors": 1000,
    "corruptions": 1000,
}
FUZZ_FLOOR = 10_000  #: executions per parser
FUZZ_PARSERS = (
    "sidecar",
    "segment_header",
    "index_record",
    "fingerprint",
    "chain_manifest",
    "config",
)

COUNTS: Counter[str] = Counter()


def add(kind: str, n: int = 1) -> None:
    COUNTS[kind] += n


def report() -> tuple[list[str], list[str]]:
    """Lines to print, and the floors not reached (empty when none ran: a partial run)."""
    lines, short = [], []
    for kind, floor in FLOORS.items():
        got = COUNTS.get(kind, 0)
        lines.append(f"{kind:>24}: {got:>7,}  (floor {floor * SCALE:,})")
        if got < floor * SCALE:
            short.append(f"{kind} {got} < {floor * SCALE}")
    for p in FUZZ_PARSERS:
        got = COUNTS.get(f"fuzz {p}", 0)
        lines.append(f"{'fuzz ' + p:>24}: {got:>7,}  (floor {FUZZ_FLOOR * SCALE:,})")
        if got < FUZZ_FLOOR * SCALE:
            short.append(f"fuzz {p} {got} < {FUZZ_FLOOR * SCALE}")
    return lines, short
