"""``strata fsck --remote``: the remote level's namespaces of one store name, checked (and with
``repair`` fixed) by :meth:`~stratastore.levels.redis.backend.RedisBackend.fsck`; nothing
outside them is read, changed or deleted. :func:`fsck_level` is the registry row's ``fsck``
hook (:func:`~stratastore.levels.registry.fsck_shared`): the CLI reaches it by the level's
scheme, never by name.

A store name holds one namespace per model (``strata/<name>/<fp>/``, :func:`.namespace`): the
namespace's own name carries its model's fingerprint digest, and every commit record under it
is judged against that. The model itself (its geometry, for the checks of each sidecar) is
read from the first commit record that decodes and names it; a record of another model under
the namespace is a bad record (damage, or a key copied by hand), which repair removes. A
namespace none of whose records names its model still has each record judged (all bad).
A name under the store name that is not a namespace of spec F-REM-1 is left as it is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stratastore.errors import StrataError
from stratastore.format import ModelFingerprint
from stratastore.format.remote_record import NS_FP_DIGITS, RemoteNames, decode_commit_record
from stratastore.levels.findings import PAGE_HASH_MISMATCH
from stratastore.levels.redis.backend import RedisBackend, RemoteReport
from stratastore.levels.redis.client import RemoteError
from stratastore.levels.redis.settings import RemoteSettings, check_name
from stratastore.levels.shared_check import NamespaceCheck, SharedLevelCheck

__all__ = ["PAGE_HASH_MISMATCH", "NamespaceReport", "fsck_level", "fsck_remote"]

# PAGE_HASH_MISMATCH (from the findings table): the finding a committed segment whose parts are
# all there but a page fails its digest (F-SC-3) is reported as, one per ``RemoteReport.damaged``


@dataclass
class NamespaceReport:
    """One namespace: its prefix, its model (``None``: no commit record names it), what fsck
    found there (``None`` with ``problem`` when it could not be checked)."""

    prefix: str
    model: str | None
    report: RemoteReport | None  #: what fsck found (before any repair)
    problem: str = ""
    after: RemoteReport | None = None  #: with ``repair``: the namespace checked again after it


def fsck_remote(
    settings: RemoteSettings, *, repair: bool = False, deep: bool = False
) -> list[NamespaceReport]:
    """Check every namespace of ``settings.name`` on the server (see the module; ``deep``:
    every page of every segment hashed,
    :meth:`~stratastore.levels.redis.backend.RedisBackend.fsck`); raises
    :class:`~stratastore.levels.redis.client.RemoteError` when the server cannot be reached."""
    base = f"strata/{check_name(settings.name)}/"
    scout = RedisBackend(settings, _SCOUT)
    scout.path = settings.shown  # (its own namespace is no store's: never named)
    try:
        names = scout.scan_names("fsck", f"{base}*")
        prefixes = sorted(
            {
                base + n[len(base) :].split("/", 1)[0] + "/"
                for n in names
                if n.startswith(base) and "/" in n[len(base) :]
            }
        )
        out = []
        for prefix in prefixes:
            out.append(_one(scout, settings, prefix, repair, deep))
        return out
    finally:
        scout.close()


#: the model of a backend that only lists names (no namespace of its own is read or written)
_SCOUT = ModelFingerprint.create("fsck/scout", n_layers=1, n_kv_heads=1, head_dim=1, page_tokens=1)


def _one(
    scout: RedisBackend, settings: RemoteSettings, prefix: str, repair: bool, deep: bool
) -> NamespaceReport:
    digits = prefix.rstrip("/").rsplit("/", 1)[-1]
    if not re.fullmatch(f"[0-9a-f]{{{NS_FP_DIGITS}}}", digits):
        return NamespaceReport(
            prefix,
            None,
            None,
            "not a namespace name (spec F-REM-1: a fingerprint digest in hex): left as it is",
        )
    fp = _model(scout, prefix, digits)
    b = RedisBackend(
        settings,
        fp if fp is not None else _SCOUT,
        names=RemoteNames(settings.name, bytes.fromhex(digits.ljust(64, "0"))),
    )
    try:
        found = b.fsck(repair=repair, deep=deep)
        after = b.fsck(deep=deep) if found.repaired else None  # what the repair left, again
        return NamespaceReport(
            prefix, fp.describe() if fp is not None else None, found, after=after
        )
    finally:
        b.close()


def _model(scout: RedisBackend, prefix: str, digits: str) -> ModelFingerprint | None:
    """The fingerprint of the first commit record under ``prefix`` that decodes and names
    this namespace's model (its digest begins with ``digits``); each value read bounded; one
    of another type, too long, damaged or of another model is passed over (fsck judges it)."""
    for name in scout.scan_names("fsck", f"{prefix}s/*", prefix):
        try:
            n, raw = scout.bounded_get("fsck", name)
            if n and n <= len(raw):
                # a keyed record's model reads without its key (spec F-KEYED-6)
                fp = decode_commit_record(raw, unchecked=True).sidecar.fingerprint
                if fp.digest().hex().startswith(digits):
                    return fp
        except RemoteError:
            raise
        except StrataError:
            continue
    return None


def fsck_level(
    url: str, arguments: Mapping[str, Any], repair: bool, deep: bool
) -> SharedLevelCheck:
    """The registry row's ``fsck`` hook: :func:`fsck_remote` of the Redis level at ``url``
    opened with ``arguments`` (``StoreConfig.level_settings``; credentials not there come from
    the environment, then the URL), as the backend-neutral
    :class:`~stratastore.levels.shared_check.SharedLevelCheck` the CLI prints."""
    settings = RemoteSettings.from_level(url, arguments)
    found = fsck_remote(settings, repair=repair, deep=deep)
    return SharedLevelCheck(settings.shown, settings.name, tuple(map(_neutral, found)))


def _neutral(ns: NamespaceReport) -> NamespaceCheck:
    """One namespace as the CLI prints it: clean as checked, or as checked again after the
    repair (what the repair left)."""
    rep = ns.report
    if rep is None:
        return NamespaceCheck(ns.prefix, ns.model, False, ns.problem)
    clean = ns.after.clean if ns.after is not None else rep.clean
    return NamespaceCheck(
        ns.prefix,
        ns.model,
        clean,
        ns.problem,
        rep.counts(),
        tuple(rep.damaged),
        rep.repaired,
        tuple(rep.unauthenticated),
    )
