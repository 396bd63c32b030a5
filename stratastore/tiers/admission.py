"""Admission: the one function that decides where a capture or a disk read may go.

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

from stratastore.config import StoreConfig
from stratastore.io.system import mem_available
from stratastore.metrics.logs import Voice

__all__ = ["MIB", "Admission", "Admitted", "admit", "log_admission", "mib", "park_target"]

MIB = 1 << 20
Where = Literal["ram", "disk", "discard"]
Floor = Literal["parking", "transient", "none"]


def mib(n: int) -> str:
    """Bytes for a log line, in MiB as the floors are: one decimal below 10 MiB, and KiB below
    1 MiB (a small capture never reads "need 0 MiB")."""
    if n < MIB:
        return f"{n / 1024:.1f} KiB"
    return f"{n / MIB:.1f} MiB" if n < 10 * MIB else f"{n / MIB:.0f} MiB"  # a floor: "2560 MiB"


@dataclass(frozen=True, slots=True)
class Admitted:
    where: Where
    floor: Floor  #: the floor that admitted it ("none" for a discard)
    need: int
    available: int
    parking_floor: int = 0
    transient_floor: int = 0

    def describe(self) -> str:
        """What the rule decided, with the figures it compared (the log line's wording)."""
        if self.where == "discard":
            return (
                f"physical RAM admission: need {mib(self.need)} plus "
                f"{mib(self.transient_floor)}, {mib(self.available)} free"
            )
        floor = self.parking_floor if self.floor == "parking" else self.transient_floor
        return (
            f"{self.where} under the {self.floor} RAM floor (need {mib(self.need)} plus "
            f"{mib(floor)})"
        )

    def log_line(self, what: str) -> str | None:
        """The admission log line for ``what`` (``"park"``, ``"disk hit"``, ``"session
        save"``, ...): a refusal, or an admission under the transient floor; ``None`` for an
        admission under the parking floor (the normal case says nothing)."""
        if self.where == "discard":
            floors = (
                f"plus {mib(self.parking_floor)}, or {mib(self.transient_floor)} for a "
                "disk-bound copy"
            )
            why = f"(physical RAM admission: need {mib(self.need)} {floors}; " + (
                f"{mib(self.available)} free)"
            )
            return f"skip parking {why}" if what == "park" else f"{what} skipped {why}"
        if self.floor == "transient":
            return (
                f"{what} under the transient RAM floor (need {mib(self.need)} plus "
                f"{mib(self.transient_floor)}, not {mib(self.parking_floor)})"
            )
        return None


def log_admission(say: Voice, p: Admitted, what: str, outcome: str) -> None:
    """Say an admission that refused, or that admitted under the transient floor (the
    admission log lines, at INFO: ``skip parking (physical RAM admission ...)``, ``disk hit
    skipped``, ``... under the transient RAM floor (need ... plus 512 MiB, not 2560 MiB)``),
    with its ``outcome``."""
    line = p.log_line(what)
    if line is not None:
        say.info(f"{line}: {outcome}")


class Admission:
    """The two floors and the memory probe (injectable: tests pass a function).

    ``legacy=True`` is the engine's original rule, kept only to compare against: one
    floor for everything, and a capture or disk read that fails it is discarded."""

    def __init__(
        self, cfg: StoreConfig, probe: Callable[[], int] | None = None, *, legacy: bool = False
    ) -> None:
        self.parking_floor = cfg.min_free_mib * MIB
        self.transient_floor = cfg.park_min_free_mib * MIB
        self.probe = probe or mem_available
        self.legacy = legacy

    def admit(self, need: int, *, stays_in_ram: bool, disk: bool) -> Admitted:
        """Where ``need`` bytes may go. ``stays_in_ram``: a park that keeps its capture in RAM
        (else the bytes are disk-bound and only pass through RAM); ``disk``: whether a disk
        level can take them."""
        if self.legacy:
            return admit(
                need,
                self.probe(),
                self.parking_floor,
                self.parking_floor,
                stays_in_ram=stays_in_ram,
                disk=False,
            )
        return admit(
            need,
            self.probe(),
            self.parking_floor,
            self.transient_floor,
            stays_in_ram=stays_in_ram,
            disk=disk,
        )


def admit(
    need: int,
    available: int,
    parking_floor: int,
    transient_floor: int,
    *,
    stays_in_ram: bool,
    disk: bool,
) -> Admitted:
    """The rule itself, pure: RAM under the parking floor, else disk under either floor, else
    discard. A disk-bound request never lands in RAM."""
    floors = (parking_floor, transient_floor)
    if available >= need + parking_floor:
        return Admitted("ram" if stays_in_ram else "disk", "parking", need, available, *floors)
    if disk and available >= need + transient_floor:
        return Admitted("disk", "transient", need, available, *floors)
    return Admitted("discard", "none", need, available, *floors)


def park_target(
    cfg: StoreConfig,
    admission: Admission,
    disk: bool,
    token_bytes: int,
    say: Voice,
) -> tuple[Literal["ram", "disk"], str]:
    """Where parks go (``park = ram | disk | auto``) and why. ``auto`` sizes a
    snapshot per slot (a full context when ``context_tokens`` is given, else a slot's share of
    the RAM budget) and picks disk when free RAM cannot hold them above the parking floor.
    ``disk``: whether a disk level is on (from the config). Called before the RAM level is
    built, so the free RAM it probes is not yet lowered by the arena, and a disk target
    reserves no arena at all."""
    if cfg.park == "ram":
        return "ram", "configured"
    if not disk:
        say(f"park={cfg.park} needs a disk level (cold_dir and cold_mib); parking stays in RAM")
        return "ram", "no disk level"
    if cfg.park == "disk":
        return "disk", "configured"
    per_slot = (
        cfg.context_tokens * token_bytes if cfg.context_tokens else cfg.ram_mib * MIB // cfg.slots
    )
    need = cfg.slots * per_slot + admission.parking_floor
    target: Literal["ram", "disk"] = "disk" if admission.probe() < need else "ram"
    say.info(f"park target auto -> {target}")
    return target, "auto"
