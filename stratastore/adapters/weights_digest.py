"""A model's weights identified by every byte of them: the BLAKE3 of a weight file, read once in
a process for each version of the file. The adapters' model identities (the string whose digest
is the fingerprint's ``model_digest``, spec F-FP-1) are built on it: a GGUF
(:func:`.llamacpp.identity.gguf_digest`) and vLLM's weight files
(:func:`.vllm.identity.weights_identity`).

Why every byte: two files equal in their metadata and in samples of every tensor, different
anywhere else, are two models whose K/V differ; an identity that reads samples would open one's
store for the other and restore K/V the model never computed. BLAKE3 reads at several GB/s a
core and runs on every core (``max_threads=AUTO``), so the read of the file is the cost.

The cache: a digest is kept in this process by the version of the file it was read from
(:func:`~stratastore.io.files.fd_version`: device, inode, size, mtime and ctime in ns, taken on
the descriptor that is read, before and after the read), so a second open of the same unchanged
file reads nothing. A version is trusted only when it cannot name other bytes later:

* every write moves a file's ctime to now, and nothing but a change of the clock sets it back
  (``utime`` sets the mtime only), so a file rewritten in place (same size, its mtime forced
  back) is another version;
* a filesystem stamps times at a granularity (a clock tick on ext4, xfs and btrfs; 1 s on ext3
  and HFS+; 2 s on FAT; a server's clock on a network filesystem): a write within that step of
  the last one may leave both timestamps as they were. A version whose mtime or ctime is less
  than :data:`SETTLE_NS` before the read began (or later than it: a clock set back, a server's
  clock ahead) is not kept; its digest is computed again at the next open;
* a version that differs after the read from before it (the file changed while it was read)
  is a :class:`~stratastore.ConfigError`: the digest would be of no one version of the file.

Nothing is kept on disk: each process reads each weight file once (the engine has just read it
too, so it is usually in the page cache).

Stores written before: an identity that read samples of the weights gave the same model another
fingerprint, so a directory level written then refuses to open for it (spec F-DIR-6,
:class:`~stratastore.format.IncompatibleFingerprint`); the adapters add
:data:`EARLIER_IDENTITY` to that refusal (:func:`explain_refusal`). A shared level's records
are keyed by the fingerprint (spec F-KEY-1): the earlier ones are never found, and age out."""

from __future__ import annotations

import threading
import time

import blake3

from stratastore.errors import ConfigError
from stratastore.format import IncompatibleFingerprint
from stratastore.io import StrataIOError, files

__all__ = ["CHUNK_BYTES", "EARLIER_IDENTITY", "SETTLE_NS", "explain_refusal", "file_digest"]

#: bytes read (and hashed on every core) at a time
CHUNK_BYTES = 32 << 20
#: a version whose timestamps are this close to the read's start is not kept (the coarsest
#: timestamp granularity of a local filesystem, FAT's 2 s)
SETTLE_NS = 2_000_000_000
#: versions kept at most (the oldest is dropped first): a process serves a few models
_KEPT = 64

#: what a refusal of a store written for another model adds (:func:`explain_refusal`)
EARLIER_IDENTITY = (
    "if it was written for this same model by a stratastore whose model identity read only "
    "the metadata and 4 KiB of each tensor, its K/V was never checked against every byte of "
    "these weights and is not reused: use another directory for this model, or remove that "
    "directory's files"
)

Version = tuple[int, int, int, int, int]  #: device, inode, size, mtime_ns, ctime_ns

_DIGESTS: dict[Version, bytes] = {}
_LOCK = threading.Lock()


def _now_ns() -> int:
    """The clock a version's timestamps are compared with (a seam for tests)."""
    return time.time_ns()


def explain_refusal(e: IncompatibleFingerprint) -> IncompatibleFingerprint:
    """``e`` (a store's refusal of this model's fingerprint) with :data:`EARLIER_IDENTITY`
    added: the same type, so callers catch it as before."""
    return IncompatibleFingerprint(f"{e}; {EARLIER_IDENTITY}")


def file_digest(path: str) -> bytes:
    """The 32-byte BLAKE3 of every byte of the file at ``path`` (a link is resolved: a hub's
    snapshot links to its blobs), from this process's cache when the same version was read
    before (see the module). :class:`~stratastore.ConfigError` naming the file when it cannot
    be read, or changes while it is read."""
    real = files.realpath(path)
    try:
        fd = files.open_read(real)
    except StrataIOError as e:
        raise ConfigError(f"the model's weights: {path} cannot be read ({e})") from None
    try:
        version = files.fd_version(fd, real)
        with _LOCK:
            got = _DIGESTS.get(version)
        if got is not None:
            return got
        began = _now_ns()
        got = _hash_file(fd, real, version[2])
        after = files.fd_version(fd, real)
    except StrataIOError as e:  # a failed read, a file cut short under the read
        raise ConfigError(f"the model's weights: {path} cannot be read ({e})") from None
    finally:
        files.close(fd)
    if after != version:
        raise ConfigError(
            f"the model's weights: {path} changed while its digest was read (size, mtime or "
            "ctime moved): open the model again once the file is written"
        )
    if max(version[3], version[4]) < began - SETTLE_NS:
        with _LOCK:
            _DIGESTS[version] = got
            while len(_DIGESTS) > _KEPT:
                del _DIGESTS[next(iter(_DIGESTS))]
    return got


def _hash_file(fd: int, path: str, size: int) -> bytes:
    """BLAKE3 of the ``size`` bytes of the open file ``fd``, read in :data:`CHUNK_BYTES`
    chunks into one buffer and hashed on every core; :class:`~stratastore.io.errors.ShortRead`
    when it ends first."""
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    buf = memoryview(bytearray(min(CHUNK_BYTES, max(size, 1))))
    offset = 0
    while offset < size:
        view = buf[: min(len(buf), size - offset)]
        files.pread_exact(fd, view, offset, path)
        hasher.update(view)
        offset += len(view)
    return hasher.digest()
