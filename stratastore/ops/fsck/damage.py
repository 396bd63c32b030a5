"""One problem, one finding (format-spec/FSCK.md): a damaged segment is reported once, by its
cause, and what follows from it (the index record that still names it, the chains that stop at
it, the segments only it hides) is context in that finding's detail, gathered while the rest of
the store is checked."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from stratastore.levels.findings import FINDINGS, Finding, Repair

__all__ = ["Chains", "Damage"]


@dataclass(slots=True)
class Damage:
    """A damaged segment: the finding that names its cause, and what follows from it (the
    index record that still names it, the chains that stop at it). They are one problem, so
    fsck reports one finding, the consequences in its detail (format-spec/FSCK.md)."""

    finding: Finding
    consequences: list[str] = field(default_factory=list)

    @property
    def left_alone(self) -> bool:
        """Whether repair leaves this segment in place (a link, a FIFO, a newer reader's)."""
        return FINDINGS[self.finding.id].repair is Repair.LEAVE

    def report(self) -> Finding:
        if not self.consequences:
            return self.finding
        return replace(self.finding, detail="; ".join([self.finding.detail, *self.consequences]))


@dataclass(frozen=True, slots=True)
class Chains:
    """What a chain check looks a manifest's segments up in (spec F-CHAIN-3/4)."""

    valid: dict[bytes, str]  #: key -> the checked level where it is committed and valid
    elsewhere: set[bytes]  #: keys committed in the store's levels not checked (not validated)
    damaged: dict[bytes, list[Damage]]  #: key -> its damage in the checked levels
    quarantined: dict[bytes, str]  #: key -> the strata-quarantine/ that holds it
    searched: tuple[str, ...]  #: every level looked in, for the message
