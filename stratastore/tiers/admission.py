"""Admission: the one function that decides where a capture or a disk read may go (seed 000).

Two RAM floors: the *parking floor* (``min_free_mib``, 2560 by default) that a capture which
stays in RAM must leave free, and the *transient floor* (``park_min_free_mib``, 512) for bytes
that pass through RAM on their way to or from disk and are freed right after. The rule (the
"transistor"): when the parking floor does not hold, a capture is not discarded: it spills to
disk under the transient floor. The order is RAM -> disk -> discard, and a discard is counted by
the caller. Every disk read and save (disk hit, segment hit, system-prompt-cache hit, session
restore, session save) is this rule with the destination fixed to disk: admitted under the
parking floor or, failing that, the transient one; refused only when neither holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ..config import StoreConfig
from ..io.system import mem_available

__all__ = ["MIB", "Admission", "Placement", "admit", "park_target"]

MIB = 1 << 20
Where = Literal["ram", "disk", "discard"]
Floor = Literal["parking", "transient", "none"]


@dataclass(frozen=True, slots=True)
class Placement:
    where: Where
    floor: Floor  #: the floor that admitted it ("none" for a discard)
    need: int
    available: int

    def describe(self) -> str:
        mib = self.need / MIB
        if self.where == "discard":
            return f"refused: need {mib:,.0f} MiB plus a floor, {self.available / MIB:,.0f} free"
        return f"{self.where} under the {self.floor} RAM floor (need {mib:,.0f} MiB)"


class Admission:
    """The two floors and the memory probe (injectable: tests pass a function).

    ``legacy=True`` is the engine's rule before seed 000, kept only to compare against: one
    floor for everything, and a capture or disk read that fails it is discarded."""

    def __init__(self, cfg: StoreConfig, probe: Callable[[], int] | None = None, *,
                 legacy: bool = False) -> None:  # fmt: skip
        self.parking_floor = cfg.min_free_mib * MIB
        self.transient_floor = cfg.park_min_free_mib * MIB
        self.probe = probe or mem_available
        self.legacy = legacy

    def admit(self, need: int, *, stays_in_ram: bool, disk: bool) -> Placement:
        """Where ``need`` bytes may go. ``stays_in_ram``: a park that keeps its capture in RAM
        (else the bytes are disk-bound and only pass through RAM); ``disk``: whether a disk
        level can take them."""
        if self.legacy:
            return admit(need, self.probe(), self.parking_floor, self.parking_floor,
                         stays_in_ram=stays_in_ram, disk=False)  # fmt: skip
        return admit(need, self.probe(), self.parking_floor, self.transient_floor,
                     stays_in_ram=stays_in_ram, disk=disk)  # fmt: skip


def admit(need: int, available: int, parking_floor: int, transient_floor: int, *,
          stays_in_ram: bool, disk: bool) -> Placement:  # fmt: skip
    """The rule itself, pure: RAM under the parking floor, else disk under either floor, else
    discard. A disk-bound request never lands in RAM."""
    if available >= need + parking_floor:
        return Placement("ram" if stays_in_ram else "disk", "parking", need, available)
    if disk and available >= need + transient_floor:
        return Placement("disk", "transient", need, available)
    return Placement("discard", "none", need, available)


def park_target(cfg: StoreConfig, admission: Admission, disk: bool, token_bytes: int,
                warn: Callable[[str], None]) -> tuple[Literal["ram", "disk"], str]:  # fmt: skip
    """Where parks go (``park = ram | disk | auto``, seed 000) and why. ``auto`` sizes a
    snapshot per slot (a full context when ``context_tokens`` is given, else a slot's share of
    the RAM budget) and picks disk when free RAM cannot hold them above the parking floor."""
    if cfg.park == "ram":
        return "ram", "configured"
    if not disk:
        warn(f"park={cfg.park} needs a disk level (cold_dir and cold_mib); parking stays in RAM")
        return "ram", "no disk level"
    if cfg.park == "disk":
        return "disk", "configured"
    per_slot = (cfg.context_tokens * token_bytes if cfg.context_tokens
                else cfg.ram_mib * MIB // cfg.slots)  # fmt: skip
    need = cfg.slots * per_slot + admission.parking_floor
    target: Literal["ram", "disk"] = "disk" if admission.probe() < need else "ram"
    warn(f"park target auto -> {target}")
    return target, "auto"
