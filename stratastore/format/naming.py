"""Names of the files in a store directory (spec F-DIR).

Only names matching ``strata-conv-<64 hex>.(seg|side)`` are segments; chain manifests (format
1.1) are ``strata-chain-<64 hex of BLAKE3(conversation id)>.chain``; temp files start with
``strata-tmp-`` and are never adopted; the LMDB index lives in ``strata-index/``; repair moves
damaged files into ``strata-quarantine/``. Anything else in the directory is left alone.
"""

from __future__ import annotations

import re

import blake3

from stratastore.format.errors import FormatError
from stratastore.format.keys import KEY_BYTES

__all__ = [
    "CHAIN_PREFIX",
    "CHAIN_SUFFIX",
    "DATA_SUFFIX",
    "INDEX_DIR",
    "PREFIX",
    "QUARANTINE_DIR",
    "SIDECAR_SUFFIX",
    "TEMP_PREFIX",
    "chain_name",
    "data_name",
    "is_chain_name",
    "parse_name",
    "sidecar_name",
]

PREFIX = "strata-conv-"
DATA_SUFFIX = ".seg"
SIDECAR_SUFFIX = ".side"
TEMP_PREFIX = "strata-tmp-"
CHAIN_PREFIX = "strata-chain-"
CHAIN_SUFFIX = ".chain"
INDEX_DIR = "strata-index"
QUARANTINE_DIR = "strata-quarantine"
_NAME = re.compile(r"strata-conv-([0-9a-f]{64})\.(seg|side)")
_CHAIN = re.compile(r"strata-chain-[0-9a-f]{64}\.chain")


def _hex(key: bytes) -> str:
    if len(key) != KEY_BYTES:
        raise FormatError(f"a key is {KEY_BYTES} bytes, got {len(key)}")
    return key.hex()


def data_name(key: bytes) -> str:
    return f"{PREFIX}{_hex(key)}{DATA_SUFFIX}"


def sidecar_name(key: bytes) -> str:
    return f"{PREFIX}{_hex(key)}{SIDECAR_SUFFIX}"


def chain_name(conv_id: str) -> str:
    """The manifest file name of a conversation (spec F-CHAIN-4)."""
    return f"{CHAIN_PREFIX}{blake3.blake3(conv_id.encode()).hexdigest()}{CHAIN_SUFFIX}"


def is_chain_name(name: str) -> bool:
    return _CHAIN.fullmatch(name) is not None


def parse_name(name: str) -> tuple[bytes, str] | None:
    """``(key, "seg" | "side")`` for a segment file name, ``None`` for any other name."""
    m = _NAME.fullmatch(name)
    return (bytes.fromhex(m.group(1)), m.group(2)) if m else None
