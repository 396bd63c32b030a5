"""Keyed levels: the keys a level hashes its pages and sidecars with (spec F-KEYED).

A level may be *keyed*: given one or more secrets (from a file or the environment, never from
the config text: :mod:`stratastore.levels.level_keys`), it hashes every page digest and every
sidecar trailer it writes with BLAKE3's keyed mode, under the key its first secret derives, and
accepts for reading only sidecars keyed by one of its secrets' keys (rotation: the first
writes, every one reads). A writer without a key cannot make a sidecar such a level accepts,
so pages planted in a shared level (a directory, a Redis namespace) never validate.

Two values carry it, and only they hold key material:

* :class:`PageHasher`: how one sidecar's digests are made (plain BLAKE3, or keyed under one
  key); a decoded :class:`~stratastore.format.sidecar.Sidecar` carries the one it was checked
  with, so every page check hashes with the sidecar's own hasher (:attr:`PageHasher.key`, or
  None for plain BLAKE3), and nothing else is threaded through.
* :class:`LevelKeys`: a keyed level's accepted keys, the first of them the writer's.

Derivation (F-KEYED-1): ``key = BLAKE3.derive_key(KEY_CONTEXT, secret)`` (32 bytes, any secret
of at least :data:`MIN_SECRET_BYTES`), ``key_id = BLAKE3.derive_key(KEY_ID_CONTEXT, key)[:8]``:
the key id names a key in a sidecar and in messages and reveals nothing about it. Neither a
secret nor a key is ever shown: not in a ``repr``, not in an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import blake3

__all__ = [
    "KEY_CONTEXT",
    "KEY_ID_BYTES",
    "KEY_ID_CONTEXT",
    "MAX_KEYS",
    "MIN_SECRET_BYTES",
    "PLAIN",
    "LevelKeys",
    "PageHasher",
    "derive_key",
    "key_id_of",
]

#: BLAKE3 derive_key context of a level key (spec F-KEYED-1); never changes
KEY_CONTEXT = "stratastore 2025-06 keyed level v1 page and sidecar key"
#: BLAKE3 derive_key context of a key's id (spec F-KEYED-1); never changes
KEY_ID_CONTEXT = "stratastore 2025-06 keyed level v1 key id"
KEY_ID_BYTES = 8
MIN_SECRET_BYTES = 16
MAX_KEYS = 16  #: keys a level accepts at most (rotation keeps a few)


def derive_key(secret: bytes) -> bytes:
    """The 32-byte level key of ``secret`` (spec F-KEYED-1)."""
    return blake3.blake3(secret, derive_key_context=KEY_CONTEXT).digest()


def key_id_of(key: bytes) -> bytes:
    """The 8-byte id of level key ``key`` (spec F-KEYED-1): names it, reveals nothing of it."""
    return blake3.blake3(key, derive_key_context=KEY_ID_CONTEXT).digest()[:KEY_ID_BYTES]


@dataclass(frozen=True, slots=True)
class PageHasher:
    """How a sidecar's page digests and trailer are made: plain BLAKE3 (``key`` None, the
    unkeyed format every level wrote before F-KEYED) or BLAKE3 keyed by the 32-byte ``key``.
    Its ``repr`` shows the key id alone."""

    key: bytes | None = field(default=None, repr=False)
    key_id: bytes = field(default=b"", init=False)

    def __post_init__(self) -> None:
        if self.key is not None:
            if len(self.key) != 32:
                raise ValueError("a level key is 32 bytes (derive it with derive_key)")
            object.__setattr__(self, "key_id", key_id_of(self.key))

    @property
    def keyed(self) -> bool:
        return self.key is not None

    def new(self) -> Any:
        """A fresh incremental hasher (``update``/``digest``)."""
        return blake3.blake3() if self.key is None else blake3.blake3(key=self.key)

    def digest(self, data: Any) -> bytes:
        """The 32-byte digest of ``data`` (a page, or a sidecar's body)."""
        if self.key is None:
            return blake3.blake3(data).digest()
        return blake3.blake3(data, key=self.key).digest()

    def __repr__(self) -> str:
        return f"PageHasher(key id {self.key_id.hex()})" if self.keyed else "PageHasher(plain)"


#: plain BLAKE3: what an unkeyed level writes and reads
PLAIN = PageHasher()


class LevelKeys:
    """A keyed level's keys: the first writes, every one is accepted for reading (rotation,
    spec F-KEYED-4). Made from the secrets (bytes, each at least :data:`MIN_SECRET_BYTES`);
    a short secret, none, or more than :data:`MAX_KEYS` is a ``ValueError`` that names the
    secret by its position only. Its ``repr`` shows the key ids alone."""

    __slots__ = ("_by_id", "writer")

    def __init__(self, secrets: Sequence[bytes]) -> None:
        if not secrets:
            raise ValueError("a keyed level needs at least one secret")
        if len(secrets) > MAX_KEYS:
            raise ValueError(f"{len(secrets)} secrets; a level accepts at most {MAX_KEYS}")
        hashers: list[PageHasher] = []
        for i, s in enumerate(secrets):
            if not isinstance(s, bytes) or len(s) < MIN_SECRET_BYTES:
                raise ValueError(
                    f"secret {i + 1} is shorter than {MIN_SECRET_BYTES} bytes; use a random "
                    "secret of 32 bytes or more (e.g. `head -c 32 /dev/urandom | base64`)"
                )
            hashers.append(PageHasher(derive_key(s)))
        self.writer: PageHasher = hashers[0]  #: the key every sidecar this level writes uses
        self._by_id: dict[bytes, PageHasher] = {}
        for h in hashers:
            self._by_id.setdefault(h.key_id, h)

    def for_id(self, key_id: bytes) -> PageHasher | None:
        """The accepted key whose id is ``key_id``, or None."""
        return self._by_id.get(bytes(key_id))

    def accepts(self, hasher: PageHasher) -> bool:
        """Whether a sidecar checked with ``hasher`` is one this level accepts: keyed by one
        of its keys (an unkeyed one never is)."""
        return hasher.keyed and self._by_id.get(hasher.key_id) == hasher

    @property
    def key_ids(self) -> tuple[str, ...]:
        """The accepted keys' ids in hex, the writer's first."""
        return tuple(k.hex() for k in self._by_id)

    def __repr__(self) -> str:
        return f"LevelKeys(key ids {', '.join(self.key_ids)}; the first writes)"
