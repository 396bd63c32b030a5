"""The park-truncate workload of ``strata replay`` (:mod:`.replay`; the simulator's
``park-truncate``, ``STRATA_PARK_TRUNCATE``) run through the Store as an engine drives it.

The reference's 4-request scenario with its token counts (a 62,000-token chain A, then requests
B of 76,000 and C of 20,000 tokens, then A returns with its 62,000-token prompt; a checkpoint
every 4,096 tokens; 2 slots; ``min_tokens`` 4,096), scaled down in bytes: 56 bytes a token
against the simulator's 32 KiB (the reference does not give its K/V size), and a 6 MiB RAM
level against the reference's 3,500 MiB cache, i.e. 112,347 tokens of budget against 112,000:
A (62,000) and B (76,000) do not fit together, B and A's checkpoint at 32,768 do (108,768), B
and the next one at 36,864 do not (112,864). The pressure is the byte budget, as in the
reference ("two interleaved requests push the byte budget over") and the simulator; the
free-RAM probe is injected (1 TiB free) so that the machine's own free RAM never decides a
park. The Store has a RAM level only (``park = "ram"``, no disk level): the reference's
conversation cache lives in RAM, and a disk level would hold A whole and serve the return from
disk, which is not the reference's scenario. ``checkpoints = 32`` keeps every checkpoint of
these chains (the reference's ``prompt-cache-every 4096`` chain is whole; with the default 6
and ``lru``, retention would keep 4,096 and the newest few of A, and the truncation could only
land at 4,096). A request restores its prompt before the conversation leaving the slot is
parked (the simulator likewise looks A up while C still holds the slot; parked first, C would
be a third entry and the 2-slot limit would evict A whole, truncation or not). Measured with
``park_truncate`` on and off: after the 3rd request (B parked) the RAM level's entries, bytes
(shown at 32 KiB a token, the simulator's size) and evictions, and how many tokens of A
``Store.lookup`` finds; then the tokens the return of A restores. The reference table
(:data:`PARK_TRUNCATE`): parked=2, evictions=0, A truncated to its 32,768 landing, "restored 32768
tokens (live)" with the patch; evictions=1 (A dropped whole) and a full re-prefill without.
The simulator's figures: :func:`strata_harness.sim.run_park_truncate`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from strata_harness.replay_engine import Bytes, Engine, plenty, replay_fingerprint
from stratastore.chain import Checkpoint, Conversation
from stratastore.facade import Store
from stratastore.format import ModelFingerprint
from stratastore.tiers.records import Restored

__all__ = [
    "BUDGET_MIB",
    "EVERY",
    "FIRST",
    "MIN_TOKENS",
    "OTHERS",
    "PARK_RAM_MIB",
    "PARK_TRUNCATE",
    "PARK_TRUNCATE_TEXT",
    "SIM_TOKEN_KIB",
    "SLOTS",
    "ParkRun",
    "run_park",
]

BUDGET_MIB, SLOTS, MIN_TOKENS, EVERY = 3500, 2, 4096, 4096  #: the reference's test config
FIRST, OTHERS = 62_000, (76_000, 20_000)  #: the reference's scenario (and the simulator's)
SIM_TOKEN_KIB = 32  #: the simulator's K/V a token (the reference gives none)
PARK_RAM_MIB = 6  #: 112,347 tokens of 56 bytes, against the reference's 112,000 of 32 KiB
PARK_CHECKPOINTS = 32  #: every checkpoint of a 76,000-token chain (19) is kept
#: the reference table: truncation on/off -> {figure: value}; text: the reference's own words
PARK_TRUNCATE: dict[str, dict[str, int]] = {
    "on": {"entries": 2, "evictions": 0, "first_held": 32768, "restored": 32768},
    "off": {"evictions": 1, "first_held": 0, "restored": 0},
}
PARK_TRUNCATE_TEXT: dict[str, dict[str, str]] = {
    "on": {
        "entries": "parked=2",
        "bytes": "bytes=3.43G",
        "evictions": "evictions=0",
        "first_held": "truncated to its 32768 landing",
        "restored": "restored 32768 tokens (live)",
    },
    "off": {
        "evictions": "evictions=1",
        "first_held": "dropped whole",
        "restored": "full re-prefill",
    },
}


@dataclass
class ParkRun:
    """The park-truncate workload through the Store, truncation on or off."""

    truncate: bool
    entries: int  #: RAM entries after the 3rd request (B parked)
    ram_bytes: int  #: RAM bytes then (56 bytes a token)
    evictions: int  #: RAM evictions then
    truncations: int  #: parked entries shrunk to one of their checkpoints then
    first_held: int  #: tokens of A that Store.lookup finds then (0: none)
    restored: int  #: tokens the return of A restored
    source: str  #: where they came from
    checked: int
    mismatches: int


def _chain(conv_id: str, tokens: npt.NDArray[np.uint32]) -> Conversation:
    """A request's chain as the engine parks it: a checkpoint every ``EVERY`` tokens and at the
    end, a segment cut at each (the simulator's chain)."""
    lengths = [*range(EVERY, len(tokens), EVERY), len(tokens)]
    return Conversation(
        conv_id,
        tokens.copy(),
        [Checkpoint(n, last_used=i) for i, n in enumerate(lengths)],
        cuts=[0, *lengths[:-1]],
    )


def run_park(truncate: bool, fp: ModelFingerprint | None = None) -> ParkRun:
    """The workload through a Store with a RAM level only (see the module's docstring)."""
    fp = fp or replay_fingerprint()
    rng = np.random.default_rng(1)
    prompts = {
        name: rng.integers(0, 150_000, n, dtype=np.uint32)
        for name, n in zip("ABC", (FIRST, *OTHERS), strict=True)
    }
    cfg = {
        "ram_mib": PARK_RAM_MIB,
        "slots": SLOTS,
        "min_tokens": MIN_TOKENS,
        "park": "ram",
        "park_truncate": truncate,
        "checkpoints": PARK_CHECKPOINTS,
    }
    with Store.open(fp, cfg, probe=plenty) as store:
        engine = Engine(store, fp)
        live: tuple[str, Bytes] | None = None
        after_third: dict[str, int] = {}
        r: Restored | None = None
        for i, name in enumerate(["A", "B", "C", "A"]):
            r, kv = engine.serve(prompts[name])  # the arriving prompt first
            if live is not None:  # then the conversation leaving the slot is parked
                conv = _chain(live[0], prompts[live[0]])
                store.park(conv, engine.capture(live[1], conv))
            live = (name, kv)
            if i == 2:  # after the 3rd request
                ram = store.stats()["levels"]["ram"]
                hit = store.lookup(prompts["A"])
                after_third = {
                    "entries": ram["entries"],
                    "ram_bytes": ram["bytes"],
                    "evictions": ram["evictions"],
                    "truncations": ram["truncations"],
                    "first_held": hit[1] if hit else 0,
                }
        assert r is not None
    return ParkRun(
        truncate,
        restored=r.tokens,
        source=r.source,
        checked=engine.checked,
        mismatches=engine.mismatches,
        **after_third,
    )
