"""What a park's ``kv`` becomes: the snapshot the park flow places (:mod:`.park`).

- device memory: hashed on the device and copied to the host once (:mod:`.device`);
- the engine's own layout, a :class:`~stratastore.restore.LayerKV` or
  :class:`~stratastore.restore.PagedKV` (its contiguous cache, or its paged pool and the
  request's block table): left there when the park will be written to disk within the call,
  streamed from the engine's memory (:meth:`.park.Parking.streams`: gathered, hashed and
  written chunk by chunk, never copied whole); gathered into the store's own memory otherwise;
- anything else: the bytes in the stored layout (spec F-SEG-4), kept as they are.

Each is checked before anything is copied or gathered
(:func:`~stratastore.tiers.checks.check_snapshot`)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from stratastore.chain import Conversation
from stratastore.format import ModelFingerprint
from stratastore.restore import as_engine_capture
from stratastore.restore.device_arrays import is_device_array
from stratastore.tiers.checks import check_snapshot
from stratastore.tiers.device import device_snapshot, kv_bytes
from stratastore.tiers.records import InvalidConversation, Snapshot

__all__ = ["park_snapshot"]


def park_snapshot(
    conv: Conversation,
    kv: object,
    states: Mapping[int, bytes] | None,
    fp: ModelFingerprint,
    streams: bool,
) -> Snapshot:
    """The snapshot of a park of ``conv`` with ``kv`` (see the module); ``streams``: whether
    a capture in the engine's layout may stay there (the park is written within the call)."""
    if is_device_array(kv):
        return device_snapshot(conv, kv, states or {}, fp, "park")
    n = len(conv.tokens) if isinstance(conv, Conversation) else 0
    capture = as_engine_capture(fp, kv, n, "park", InvalidConversation)
    if capture is None:
        return Snapshot(conv, kv_bytes(kv, "park"), dict(states or {}))
    snap = Snapshot(conv, np.empty(0, np.uint8), dict(states or {}), capture=capture)
    check_snapshot(snap, fp)  # before anything is gathered
    if not streams:
        snap.kv, snap.capture = capture.pack(snap.conv.boundaries()), None
    return snap
