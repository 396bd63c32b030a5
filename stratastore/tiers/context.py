"""What the parts of one store's flow share: one context object, made once by
:class:`~.tiered.Tiers` and handed to each part (the park flow, the restore flow and its
sources, sessions), instead of each taking the same five collaborators one by one."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from stratastore.config import StoreConfig
from stratastore.format import ModelFingerprint
from stratastore.metrics.logs import Voice
from stratastore.tiers.admission import Admission

__all__ = ["FlowContext"]


@dataclass(frozen=True, slots=True)
class FlowContext:
    """The store's settings and model, the flow's lock (taken where plans and accounts are
    made, never over I/O), the RAM admission rule and the store's voice."""

    cfg: StoreConfig
    fp: ModelFingerprint
    lock: threading.RLock
    admission: Admission
    warn: Voice

    @property
    def token_bytes(self) -> int:
        return self.fp.token_bytes
