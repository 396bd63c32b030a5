"""``strata fsck --remote``: the remote level's namespaces of one store name, checked (and with
``repair`` fixed) by :meth:`~.redis_backend.RedisBackend.fsck`; nothing outside them is read,
changed or deleted (issue 17 item 5).

A store name holds one namespace per model (``strata/<name>/<fp>/``, :func:`.namespace`). The
models are found from the keys themselves: each namespace's first commit record that decodes
names its fingerprint, and a namespace whose records name another one is reported, never
repaired (a key placed by hand, or damage).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import StrataError
from ..format import ModelFingerprint
from ..format.remote_record import decode_commit_record
from .redis_backend import RedisBackend, RemoteError, RemoteReport
from .redis_settings import RemoteSettings, check_name, namespace

__all__ = ["NamespaceReport", "fsck_remote"]


@dataclass
class NamespaceReport:
    """One namespace: its prefix, its model (``None``: no commit record decodes), what fsck
    found there (``None`` with ``problem`` when it could not be checked)."""

    prefix: str
    model: str | None
    report: RemoteReport | None  #: what fsck found (before any repair)
    problem: str = ""
    after: RemoteReport | None = None  #: with ``repair``: the namespace checked again after it


def fsck_remote(settings: RemoteSettings, *, repair: bool = False) -> list[NamespaceReport]:
    """Check every namespace of ``settings.name`` on the server (see the module); raises
    :class:`~.redis_backend.RemoteError` when the server cannot be reached."""
    base = f"strata/{check_name(settings.name)}/"
    scout = RedisBackend(settings, ModelFingerprint.create("fsck/scout", n_layers=1,
                                                           n_kv_heads=1, head_dim=1,
                                                           page_tokens=1))  # fmt: skip
    try:
        names = scout._call("fsck", "", lambda: [k.decode(errors="replace") for k in
                                                 scout._r.scan_iter(match=f"{base}*",
                                                                    count=1000)])  # fmt: skip
        prefixes = sorted({base + n[len(base):].split("/", 1)[0] + "/" for n in names
                           if n.startswith(base) and "/" in n[len(base):]})  # fmt: skip
        out = []
        for prefix in prefixes:
            out.append(_one(scout, settings, prefix, repair))
        return out
    finally:
        scout.close()


def _one(scout: RedisBackend, settings: RemoteSettings, prefix: str,
         repair: bool) -> NamespaceReport:  # fmt: skip
    fp = _model(scout, prefix)
    if fp is None:
        return NamespaceReport(prefix, None, None, "no commit record here decodes: nothing "
                               "names its model (left as it is)")  # fmt: skip
    if namespace(settings.name, fp) != prefix:
        return NamespaceReport(prefix, fp.describe(), None, "its records name a model of "
                               "another namespace (left as it is)")  # fmt: skip
    b = RedisBackend(settings, fp)
    try:
        found = b.fsck(repair=repair)
        after = b.fsck() if found.repaired else None  # what the repair left, checked again
        return NamespaceReport(prefix, fp.describe(), found, after=after)
    finally:
        b.close()


def _model(scout: RedisBackend, prefix: str) -> ModelFingerprint | None:
    """The fingerprint the first decodable commit record under ``prefix`` names (each value
    read bounded; one of another type, too long or damaged is passed over)."""
    for name in scout._call("fsck", prefix, lambda: list(scout._r.scan_iter(
            match=f"{prefix}s/*", count=1000))):  # fmt: skip
        try:
            n, raw = scout.bounded_get("fsck", name.decode("utf-8", "replace"))
            if n and n <= len(raw):
                return decode_commit_record(raw).sidecar.fingerprint
        except RemoteError:
            raise
        except StrataError:
            continue
    return None
