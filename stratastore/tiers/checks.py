"""The checks a call passes before anything runs: a park or a session save before anything is
acknowledged or stored (spec F-CHAIN-1, F-CHAIN-2, F-SC-6: what could not be written as a
manifest and its segments is refused, with
:class:`~stratastore.tiers.records.InvalidConversation`), and the arguments of the engine's
calls (a session's name, a restore's cap and batch)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from stratastore.chain import Conversation, InvalidRequest, as_media, as_tokens
from stratastore.format import ModelFingerprint
from stratastore.format.manifest import MAX_CONV_ID, MAX_ITEMS, MAX_TOKENS
from stratastore.format.sidecar import MAX_PAGES
from stratastore.metrics.speeds import slot_name
from stratastore.restore import Destination, flat_bytes
from stratastore.tiers.records import MAX_STATE_BYTES, InvalidConversation, Snapshot

__all__ = [
    "batch_caps",
    "batch_requests",
    "batch_slots",
    "check_snapshot",
    "restore_cap",
    "session_name",
]

#: a restore batch, checked: each request's tokens and where they land, and its pictures
Batch = tuple[
    list[tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint8] | Destination]], list[dict[int, bytes]]
]


def check_snapshot(snap: Snapshot, fp: ModelFingerprint, call: str = "park") -> None:
    """Refuse, before anything is acknowledged or stored, what could not be written as a
    chain manifest and its segments (spec F-CHAIN-1, F-CHAIN-2): the id (a non-empty string,
    UTF-8 encodable, at most MAX_CONV_ID bytes: the manifest name derives from it, F-CHAIN-4),
    the tokens (at most MAX_TOKENS), checkpoints and cuts ascending within the tokens, at
    most MAX_ITEMS of each, the K/V's size, and the running states. The checkpoints and cuts
    are checked again here because the engine may have changed them after construction."""
    conv = snap.conv
    if not isinstance(conv, Conversation):
        raise InvalidConversation(f"{call}: expected a Conversation, got {type(conv).__name__}")
    cid = conv.conv_id
    if not isinstance(cid, str) or not cid:
        raise InvalidConversation(
            f"{call}: conversation id {cid!r} must be a non-empty string (it names the "
            "conversation's manifest, spec F-CHAIN-4); pass str(id)"
        )
    try:
        size = len(cid.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise InvalidConversation(
            f"{call}: conversation id {cid!r} cannot be encoded as UTF-8 ({e.reason}); use "
            "an id of valid text"
        ) from None
    if size > MAX_CONV_ID:
        raise InvalidConversation(
            f"{call}: conversation id {cid[:32]!r}... is {size:,} bytes in UTF-8, over the "
            f"{MAX_CONV_ID:,}-byte limit of a manifest (spec F-CHAIN-1); use a shorter id "
            "(a hash of it)"
        )
    conv.tokens = as_tokens(conv.tokens, f"{call}: conversation {cid!r}", InvalidConversation)
    n = len(conv.tokens)
    what = f"{call}: conversation {cid!r}"
    if n > MAX_TOKENS:
        raise InvalidConversation(
            f"{what}: {n:,} tokens is over the {MAX_TOKENS:,} a manifest holds (spec F-CHAIN-1)"
        )
    lengths = [c.length for c in conv.checkpoints]
    if not lengths or lengths != sorted(set(lengths)) or lengths[0] < 0 or lengths[-1] > n:
        raise InvalidConversation(
            f"{what}: checkpoints {lengths[:8]} must ascend, root first, within its {n:,} tokens"
        )
    cuts = conv.cuts or [0]
    if cuts[0] != 0 or cuts != sorted(set(cuts)) or cuts[-1] > n:
        raise InvalidConversation(
            f"{what}: segment cuts {cuts[:8]} must ascend from 0 and stay within its {n:,} "
            "tokens (a cut is where a segment starts)"
        )
    conv.cuts = list(cuts)
    conv.media = as_media(conv.media, n, f"{what}: media", InvalidConversation)
    bounds = conv.boundaries()
    if max(len(lengths), len(conv.media), len(bounds)) > MAX_ITEMS:
        raise InvalidConversation(
            f"{what}: over {MAX_ITEMS:,} checkpoints, media or "
            "segments (spec F-CHAIN-1); cut it coarser"
        )
    longest = max((e - s for s, e in bounds), default=0)
    if -(-longest // fp.page_tokens) > MAX_PAGES:
        raise InvalidConversation(
            f"{what}: a segment of {longest:,} tokens is over the {MAX_PAGES:,} pages of "
            f"{fp.page_tokens} tokens a sidecar holds (spec F-SC-6); add cuts"
        )
    if snap.nbytes != n * fp.token_bytes:
        raise InvalidConversation(
            f"{what}: K/V is {snap.nbytes} bytes, its {n} tokens need {n * fp.token_bytes} "
            f"({fp.token_bytes} a token for {fp.describe()})"
        )
    for length, blob in snap.states.items():
        if (
            not isinstance(length, int)
            or not isinstance(blob, (bytes, bytearray, memoryview))
            or len(blob) > MAX_STATE_BYTES
        ):
            raise InvalidConversation(
                f"{what}: a running state must map a checkpoint length (int) to at most "
                f"{MAX_STATE_BYTES:,} bytes; got {type(length).__name__} -> "
                f"{type(blob).__name__}"
            )


def restore_cap(cap: object, call: str) -> int | None:
    """A restore's ``max_tokens``, checked: ``None`` or a count of tokens >= 0."""
    if cap is None:
        return None
    if isinstance(cap, bool) or not isinstance(cap, (int, np.integer)) or cap < 0:
        raise InvalidRequest(
            f"{call}: max_tokens must be a token count >= 0 or None, not "
            f"{cap!r}; pass len(prompt) - 1 to always leave a token to "
            "compute"
        )
    return int(cap)


def session_name(name: object, call: str) -> str:
    """A session's name, checked: a non-empty string, UTF-8 encodable (it names a manifest)."""
    if not isinstance(name, str) or not name:
        raise InvalidConversation(
            f"{call}: the session name {name!r} must be a non-empty "
            "string (what save_session() was given)"
        )
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidConversation(
            f"{call}: the session name {name!r} cannot be encoded "
            f"as UTF-8 ({e.reason}); no session has it"
        ) from None
    return name


def batch_requests(requests: object, media: object) -> Batch:
    """The requests and media of ``Store.restore_many``, checked before anything runs."""
    if not isinstance(requests, Sequence) or isinstance(requests, (str, bytes)):
        raise InvalidRequest(
            f"restore_many: requests must be a list of (prompt, out) pairs, "
            f"not {type(requests).__name__}"
        )
    if not isinstance(media, Sequence) or isinstance(media, (str, bytes)):
        raise InvalidRequest(
            f"restore_many: media must be a list (one mapping or None per "
            f"request), not {type(media).__name__}"
        )
    if len(media) > len(requests):
        raise InvalidRequest(
            f"restore_many: {len(media)} media for {len(requests)} "
            "request(s); give at most one per request"
        )
    reqs, pictures = [], []
    for i, req in enumerate(requests):
        if not isinstance(req, (tuple, list)) or len(req) != 2:
            raise InvalidRequest(
                f"restore_many: request #{i} is {type(req).__name__} "
                f"{str(req)[:40]}, not a (prompt, out) pair"
            )
        tokens = as_tokens(req[0], f"restore_many: request #{i}'s prompt")
        out: Any = req[1]
        reqs.append(
            (
                tokens,
                flat_bytes(out, f"Store.restore_many out #{i}")
                if isinstance(out, np.ndarray)
                else out,
            )
        )
        pictures.append(
            as_media(
                media[i] if i < len(media) else None,
                len(tokens),
                f"restore_many: request #{i}'s media",
            )
        )
    return reqs, pictures


def batch_caps(max_tokens: object, n: int) -> list[int | None]:
    """``restore_many``'s ``max_tokens`` as one cap per request (:func:`restore_cap` each):
    one int or ``None`` for every request, or a list of ``n``; else :class:`InvalidRequest`."""
    if max_tokens is None or isinstance(max_tokens, (int, np.integer)):
        return [restore_cap(max_tokens, "restore_many")] * n
    if (
        isinstance(max_tokens, Sequence)
        and not isinstance(max_tokens, str)
        and len(max_tokens) == n
    ):
        return [restore_cap(c, f"restore_many (request #{i})") for i, c in enumerate(max_tokens)]
    raise InvalidRequest(
        f"restore_many: max_tokens must be an int, None, or a list of {n} (one per request), "
        f"not {max_tokens!r}"
    )


def batch_slots(slots: object, n: int) -> list[str]:
    """``restore_many``'s ``slots`` as one slot name per request
    (:func:`~stratastore.metrics.speeds.slot_name` each), ``[]`` for none: a list or tuple of
    ``n``; else :class:`InvalidRequest`."""
    if slots is None:
        return []
    if not isinstance(slots, (list, tuple)) or len(slots) != n:
        raise InvalidRequest(
            f"restore_many: slots must be a list of {n} slots (one per request, or None), not "
            f"{type(slots).__name__}"
        )
    return [slot_name(x, f"restore_many (request #{i})") for i, x in enumerate(slots)]
