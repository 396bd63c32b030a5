"""What identifies the model a vLLM engine serves, for its fingerprint (spec F-FP): what
determines the K/V, never where the files lie or what the model is called.

* :func:`config_digest`: the model's config (its Hugging Face ``config.json`` as a dict), as a
  canonical JSON, digested. Keys that say where the files lie or which tool wrote them (every
  key starting with ``_``: ``_name_or_path``, ``_commit_hash``; ``transformers_version``) are
  left out, so a model moved to another directory keeps its digest.
* :func:`weights_identity`: the weights themselves, as the files vLLM loads hold them: every
  byte of each weight file (:func:`~stratastore.adapters.weights_digest.file_digest`), a
  safetensors file's header checked first.

Why: the same model served from another path, or under another ``--served-model-name``, must
keep its store (every parked conversation resumes); other weights with the same config (a
fine-tune of the same architecture) must not, or a restore would hand the engine another
model's K/V; so must weights that differ anywhere, not only in samples of their tensors. Neither
imports vLLM or torch."""

from __future__ import annotations

import enum
import hashlib
import importlib
import json
import stat
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stratastore.adapters.weights_digest import file_digest
from stratastore.errors import ConfigError
from stratastore.io import StrataIOError, files

__all__ = ["MAX_CONFIG_DEPTH", "SAFETENSORS_HEADER_MAX", "config_digest", "weights_identity"]

#: keys of a config that say where its files lie or which tool wrote them, not what the model is
#: (besides every key starting with ``_``)
_TOOL_KEYS = frozenset({"transformers_version"})
#: weight files hashed whole when a directory has no safetensors file (vLLM's choice too)
_WHOLE_FILE_SUFFIXES = (".bin", ".pt", ".pth", ".gguf")
#: files vLLM never loads as weights though they end like them
_NOT_WEIGHTS = frozenset(
    {"training_args.bin", "optimizer.bin", "optimizer.pt", "scheduler.pt", "scaler.pt"}
)
#: a safetensors header is at most this long (the format's own limit is 100 MB; a larger
#: length is a damaged or foreign file, refused before reading it)
SAFETENSORS_HEADER_MAX = 100 * 2**20
_LENGTH = struct.Struct("<Q")  # the safetensors header's length, little-endian
assert _LENGTH.size == 8
#: the domain of the weights' digest: v1 read a sample of each safetensors tensor, v2 every byte
_DOMAIN = b"stratastore weights v2\n"


# -- the config --------------------------------------------------------------------------------
def config_digest(config: Mapping[str, Any]) -> bytes:
    """A 16-byte blake2b digest of ``config`` (the model's Hugging Face config as a dict) as a
    canonical JSON, the same in every process and on every machine for the same config: keys
    sorted; every key starting with ``_`` (``_name_or_path``, ``_commit_hash``) and
    ``transformers_version`` left out at any depth (where the files lie, which tool wrote
    them); tuples as lists; sets as lists sorted by their canonical encoding; enum members by
    their name; a torch dtype as its ``str`` (``torch.bfloat16``); ``int``, ``float``,
    ``str``, ``bool`` and ``None`` as they are; an integer key as its digits, as
    ``config.json`` holds it (``id2label``). Anything else (an object whose ``str`` would hold
    its address, bytes, a key neither a string nor an integer) raises :class:`ConfigError`
    naming the key path and the type: a digest of it would differ from one process to the
    next, and the store would never be reopened; so does a dict or list that contains itself
    (naming where), or nesting deeper than :data:`MAX_CONFIG_DEPTH`."""
    canon = _canonical(config, "config")
    text = json.dumps(canon, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


#: how deep a config's dicts and lists may nest (a model's config nests a few levels)
MAX_CONFIG_DEPTH = 100


def _canonical(value: object, path: str, within: tuple[int, ...] = ()) -> object:
    """``value`` as plain JSON values (see :func:`config_digest`); ``path`` names it, ``within``
    holds the ``id`` of each dict, list or set it is inside of: one that contains itself, or
    nesting past :data:`MAX_CONFIG_DEPTH`, is a :class:`ConfigError` (no JSON text exists for
    the one, and the other is no model's config), never a ``RecursionError``."""
    if isinstance(value, (Mapping, list, tuple, set, frozenset)):
        if id(value) in within:
            raise ConfigError(
                f"the model's config: {path} contains itself (a dict or list that holds itself "
                "has no JSON text, so no digest): break the cycle, or leave it out of the config"
            )
        if len(within) >= MAX_CONFIG_DEPTH:
            raise ConfigError(
                f"the model's config: {path} is nested over {MAX_CONFIG_DEPTH} levels deep, "
                "deeper than any model's config: leave it out of the config"
            )
        within = (*within, id(value))
    if value is None or isinstance(value, (bool, int, float, str)):
        if isinstance(value, enum.Enum):  # an IntEnum or StrEnum: by name, as any enum
            return value.name
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if type(value).__name__ == "dtype" and type(value).__module__ == "torch":
        return str(value)
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if isinstance(key, str) and (key.startswith("_") or key in _TOOL_KEYS):
                continue
            text = _key_text(key, path)
            if text in out:
                raise ConfigError(
                    f"the model's config: {path} has the keys {json.dumps(text)} and "
                    f"{key!r}, one key once its JSON is written: keep one of them"
                )
            out[text] = _canonical(item, f"{path}[{_key_repr(key)}]", within)
        return out
    if isinstance(value, (list, tuple)):
        return [_canonical(item, f"{path}[{i}]", within) for i, item in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        items = [_canonical(item, f"{path}{{...}}", within) for item in value]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True, ensure_ascii=True))
    raise ConfigError(
        f"the model's config: {path} is of type {type(value).__name__}, which has no stable "
        "text (its str may hold an address, or bytes no JSON): the store could not tell the "
        "model the same way in another process; make it a number, string, bool, None, list or "
        "dict of them (or leave it out of the config)"
    )


def _key_repr(key: object) -> str:
    """A key as a path names it: ``"rope_scaling"`` (JSON's quotes), ``0``."""
    return json.dumps(key) if isinstance(key, str) else repr(key)


def _key_text(key: object, path: str) -> str:
    """A config key as JSON writes it: a string, or an integer as its digits (transformers'
    ``to_dict()`` keeps ``id2label``'s keys as the integers ``config.json`` wrote as strings:
    the same config either way)."""
    if isinstance(key, str):
        return key
    if isinstance(key, int) and not isinstance(key, bool):
        return str(int(key))
    raise ConfigError(
        f"the model's config: {path} has the key {_key_repr(key)} of type {type(key).__name__}; a "
        "config's keys must be strings (or integers) to identify the model the same way in "
        "every process: make it a string"
    )


# -- the weights -------------------------------------------------------------------------------
def weights_identity(model: str, revision: str | None) -> str:
    """What identifies the weights of ``model`` (vLLM's ``model``: a directory or a hub id) at
    ``revision``, not where they lie: ``"weights:"`` and 32 hex digits of a digest over the
    weight files of the directory, in the order of their names, each by its name and the
    BLAKE3 of every byte of it (:func:`~stratastore.adapters.weights_digest.file_digest`:
    read once in this process for each version of the file, by its device, inode, size, mtime
    and ctime). The files are ``*.safetensors`` (vLLM loads only these when a directory has
    any; each file's header is checked first), otherwise ``*.bin``, ``*.pt``, ``*.pth`` and
    ``*.gguf`` (training state such as ``optimizer.pt`` left out, as vLLM does). A fine-tune
    (a merged LoRA included) has the same headers and sizes as its base model: its bytes tell
    it, wherever in a tensor they differ.

    The same files copied to another directory give the same identity; another file, another
    tensor's shape or offsets, or another byte anywhere give another. A hub id is
    looked up in the local hub cache (``huggingface_hub``, files already downloaded only,
    nothing fetched); a single weight file given as the model, by its name and content as in
    a directory; a hub id without local files is identified by its name:
    ``f"{model}@{revision or ''}"``. A damaged safetensors file (shorter than its header or
    its tensors, a header length over :data:`SAFETENSORS_HEADER_MAX`, a header that is not
    the format's JSON) raises :class:`ConfigError` naming the file."""
    where = Path(model)
    digest = _directory_digest(where) if where.is_dir() else None
    if where.is_file():  # one file given as the model (a GGUF): its bytes, never its path
        digest = _files_digest([where])
    if digest is None:
        snapshot = _local_snapshot(model, revision)
        digest = _directory_digest(Path(snapshot)) if snapshot else None
    if digest is None:
        return f"{model}@{revision or ''}"
    return "weights:" + digest.hex()


def _local_snapshot(model: str, revision: str | None) -> str | None:
    """The local hub cache's directory of ``model`` at ``revision``, or None (no
    ``huggingface_hub``, not a hub id, not downloaded)."""
    try:  # by name: huggingface_hub is optional (vLLM brings it), and untyped where absent
        hub = importlib.import_module("huggingface_hub")
        path = hub.snapshot_download(repo_id=model, revision=revision, local_files_only=True)
    except Exception:  # absent, not a repo id, not in the cache: then the name identifies it
        return None
    return str(path) if path and Path(path).is_dir() else None


def _weight_files(directory: Path) -> list[Path]:
    """The weight files vLLM would load from ``directory`` (its top level, regular files, a
    link to one included: the hub cache's snapshots are links), sorted by name."""
    found = []
    for entry in directory.iterdir():
        name = entry.name
        if name in _NOT_WEIGHTS or not name.endswith((".safetensors", *_WHOLE_FILE_SUFFIXES)):
            continue
        try:
            regular = stat.S_ISREG(entry.stat().st_mode)
        except OSError:  # a dangling link
            continue
        if regular:
            found.append(entry)
    found.sort(key=lambda p: p.name)
    safetensors = [p for p in found if p.name.endswith(".safetensors")]
    return safetensors or found


def _directory_digest(directory: Path) -> bytes | None:
    """The digest of ``directory``'s weight files (see :func:`weights_identity`), or None
    when it holds none."""
    found = _weight_files(directory)
    return _files_digest(found) if found else None


def _files_digest(weight_files: list[Path]) -> bytes:
    """The digest of ``weight_files`` by name and content (see :func:`weights_identity`)."""
    h = hashlib.blake2b(_DOMAIN, digest_size=16)
    for path in weight_files:
        name = path.name.encode()
        if path.name.endswith(".safetensors"):
            _check_safetensors(path)
        part = b"blake3" + file_digest(str(path))
        h.update(_LENGTH.pack(len(name)) + name + _LENGTH.pack(len(part)) + part)
    return h.digest()


def _check_safetensors(path: Path) -> None:
    """Refuse a damaged safetensors file before its bytes are digested: its header (8-byte
    little-endian length, then that many bytes of JSON) must lie in the file and place every
    tensor within it (see :func:`weights_identity`)."""
    real = files.realpath(str(path))
    try:
        head, size = files.read_head(real, _LENGTH.size)
        if len(head) < _LENGTH.size:
            raise _damaged(path, f"is {len(head)} bytes, too short for a safetensors header")
        (n,) = _LENGTH.unpack(head)
        if n > SAFETENSORS_HEADER_MAX:
            raise _damaged(
                path,
                f"declares a {n}-byte safetensors header, over the "
                f"{SAFETENSORS_HEADER_MAX}-byte limit: it is not safetensors, or damaged",
            )
        whole, size = files.read_head(real, _LENGTH.size + n)
    except StrataIOError as e:
        raise ConfigError(f"the model's weights: {path} cannot be read ({e})") from None
    header = whole[_LENGTH.size :]
    if len(header) < n:
        raise _damaged(path, f"ends inside its {n}-byte header ({size} bytes in all)")
    _tensor_spans(path, header, _LENGTH.size + n, size)


def _tensor_spans(path: Path, header: bytes, data_start: int, size: int) -> list[tuple[int, int]]:
    """Where each tensor's bytes lie in the file, in file order, from the header's
    ``data_offsets`` (relative to the end of the header), each checked to lie in the file
    (:class:`ConfigError` naming the file otherwise)."""
    try:
        table = json.loads(header)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise _damaged(path, f"has a header that is not JSON ({type(e).__name__})") from None
    if not isinstance(table, dict):
        raise _damaged(path, "has a header that is not a JSON object")
    spans = []
    for name, entry in table.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= size - data_start
        ):
            raise _damaged(
                path,
                f"places tensor {name!r} at {offsets!r}, not within its "
                f"{size - data_start} bytes of data",
            )
        spans.append((data_start + offsets[0], data_start + offsets[1]))
    return sorted(spans)


def _damaged(path: Path, what: str) -> ConfigError:
    return ConfigError(
        f"the model's weights: {path} {what}; the file is damaged or truncated: re-download it"
    )
