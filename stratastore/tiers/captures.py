"""What a park's ``kv`` becomes: the snapshot the park flow places (:mod:`.park`).

- device memory: hashed on the device and copied to the host once (:mod:`.device`);
- the engine's layout on the device, a :class:`~stratastore.restore.DevicePagedKV` (its paged
  pool, FlashAttention's or FlashInfer's layout, and the request's block table) or a
  :class:`~stratastore.restore.DeviceLayerKV`, anything on a device
  (:func:`~stratastore.restore.lives_on_device`) with ``gather_pages_device``: gathered into
  the stored layout on the device (one new device array: a copy of the capture, freed when the
  park returns), then as device memory above;
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
from typing import Any

import numpy as np

from stratastore.chain import Conversation
from stratastore.format import ModelFingerprint
from stratastore.restore import DestinationRefused, as_engine_capture, lives_on_device
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
    if lives_on_device(kv) and callable(getattr(kv, "gather_pages_device", None)):
        return _gathered_on_device(conv, kv, states or {}, fp)
    n = len(conv.tokens) if isinstance(conv, Conversation) else 0
    capture = as_engine_capture(fp, kv, n, "park", InvalidConversation)
    if capture is None:
        return Snapshot(conv, kv_bytes(kv, "park"), dict(states or {}))
    snap = Snapshot(conv, np.empty(0, np.uint8), dict(states or {}), capture=capture)
    check_snapshot(snap, fp)  # before anything is gathered
    if not streams:
        snap.kv, snap.capture = capture.pack(snap.conv.boundaries()), None
    return snap


def _gathered_on_device(
    conv: Conversation, kv: Any, states: Mapping[int, bytes], fp: ModelFingerprint
) -> Snapshot:
    """The snapshot of a park of ``conv`` from the engine's layout on a device: the
    conversation checked (:func:`check_snapshot`), then ``kv`` (made for ``fp``, holding all
    its tokens), before the device runs; then each segment of ``conv.boundaries()`` gathered
    into the stored layout on the device, pages counted from its start
    (``kv.gather_pages_device``), and that copy parked as device memory is
    (:func:`device_snapshot`: hashed there, copied to the host once). The device holds the
    gathered copy (``len(conv.tokens) * token_bytes`` bytes) until this returns."""
    n = len(conv.tokens) if isinstance(conv, Conversation) else 0
    # the conversation's checks, on a stand-in of the capture's size (no memory): its
    # segments must lie within its tokens before the device gathers them
    stand_in = np.broadcast_to(np.zeros(1, np.uint8), (n * fp.token_bytes,))
    check_snapshot(Snapshot(conv, stand_in, dict(states)), fp)
    made_for = getattr(kv, "fp", None)
    if isinstance(made_for, ModelFingerprint) and made_for != fp:
        raise InvalidConversation(
            f"park: the K/V was described for {made_for.describe()}; this store holds "
            f"{fp.describe()}: make the {type(kv).__name__} with the store's fingerprint"
        )
    held = int(kv.capacity())
    if held < n:
        raise InvalidConversation(
            f"park: the {type(kv).__name__} holds {held:,} tokens; the conversation has "
            f"{n:,}: pass the block table (or arrays) of all of them"
        )
    try:
        gathered = kv.gather_pages_device(conv.boundaries())
    except DestinationRefused as e:
        raise InvalidConversation(f"park: {e}") from None
    return device_snapshot(conv, gathered, states, fp, "park")
