"""``strata fsck --repair``: bring store directories back to a clean
:func:`~stratastore.ops.fsck.fsck` without destroying valid data (format-spec/FSCK.md); what it
does about each finding is the findings table's (:mod:`stratastore.levels.findings`).

:func:`repair` runs fsck and acts on its findings: damaged segments and manifests are moved into
``strata-quarantine/`` (never deleted), temp files removed, a chain broken by a missing segment
cut to its deepest checkpoint below the gap, and indexes rebuilt from the sidecars; it returns
the :class:`Action` records of what it did. Every removal and move goes through the io layer's
guard (:mod:`stratastore.io.guard`, spec F-DIR-8): what the guard refuses is left in place and
recorded as a ``refused`` action. A chain that names a segment in none of the levels known is
not cut unless the levels are the whole store (:class:`RepairRefused`). Segments no chain
reaches (``SEGMENT_UNREACHABLE``, reported only for the whole store) are quarantined, those the
chain cuts leave behind too: a park writes its segments before its manifest (F-CHAIN-3), so
repair, like fsck, is for a store no process has open.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from stratastore.errors import StrataError
from stratastore.format import LevelKeys, decode_sidecar, parse_name
from stratastore.format.manifest import MAX_MANIFEST_BYTES, decode_manifest, encode_manifest
from stratastore.format.naming import INDEX_DIR, data_name, sidecar_name
from stratastore.format.sidecar import MAX_SIDECAR_BYTES
from stratastore.io import durable_write, files, guard, modes, pathnames
from stratastore.io.errors import NotARegularFile, NotAStoreName, StrataIOError, SymlinkRefused
from stratastore.io.quarantine import quarantine
from stratastore.levels.findings import (
    CHAIN_BROKEN,
    FINDINGS,
    ORPHAN_FILE,
    SEGMENT_UNREACHABLE,
    Repair,
)
from stratastore.ops.fsck import Finding, committed_keys, fsck, quarantined_keys
from stratastore.ops.level_dirs import ROOT_CONFIG, StoreLevels, levels_of

__all__ = ["Action", "RepairRefused", "repair"]


def _does(f: Finding) -> Repair:
    """What repair does about ``f`` (the findings table's ``repair``)."""
    return FINDINGS[f.id].repair


@dataclass(frozen=True, slots=True)
class Action:
    kind: str  #: "quarantine", "remove_temp", "rebuild_index", "truncate_chain", "refused"
    object: str
    detail: str


#: what the io layer's guard raises instead of acting on something that is not the store's
#: (spec F-DIR-8): repair records a "refused" action and goes on with the rest
_REFUSALS = (SymlinkRefused, NotARegularFile, NotAStoreName)


class RepairRefused(StrataError):
    """Repair would cut a chain at a segment that may live in a store level it was not given;
    nothing was changed. The message names the chain, the levels known and the fix."""


def _refuse_unknown_cuts(findings: list[Finding], levels: StoreLevels) -> None:
    """Raise :class:`RepairRefused` when a ``CHAIN_BROKEN`` segment is absent from every level
    known for a reason repair cannot see (not quarantined as damaged, not an orphan data file in
    a checked level), unless ``levels`` is the whole store (``levels.complete``): a chain in the
    last level names segments of every level (spec F-CHAIN-4), so the segment may live in a
    level not given, and cutting the chain there would lose it."""
    if levels.complete:
        return
    known_bad = set(quarantined_keys(levels.store))
    for f in findings:
        parsed = parse_name(pathnames.basename(f.object)) if f.id == ORPHAN_FILE.id else None
        if parsed is not None:
            known_bad.add(parsed[0])
    present = committed_keys(levels.store)
    unknown = []
    for f in findings:
        if f.id != CHAIN_BROKEN.id:
            continue
        with contextlib.suppress(StrataError, StrataIOError):
            m = decode_manifest(files.read_file(f.object, MAX_MANIFEST_BYTES), f.object)
            gap = next(((s, k) for s, _, k in m.segments if k not in present), None)
            if gap is not None and gap[1] not in known_bad:
                unknown.append(f"conversation {m.conv_id!r} at token {gap[0]} ({f.object})")
    if unknown:
        raise RepairRefused(
            f"repair refused, nothing was changed: {len(unknown)} chain(s) name a segment that is "
            f"in none of the levels known ({', '.join(levels.store)}): {'; '.join(unknown[:3])}. "
            "The store may have a level that was not given, where these segments live, and "
            "cutting the chains would lose them: pass the store's config file (`strata fsck "
            "CONFIG.toml --repair`, or --config CONFIG.toml), or its root directory when that "
            f"holds both warm/ and cold/ or a {ROOT_CONFIG}"
        )


def repair(
    dirs: Sequence[str],
    *,
    deep: bool = True,
    levels: StoreLevels | None = None,
    keys: Mapping[str, LevelKeys] | None = None,
) -> list[Action]:
    """Bring the directories back to a clean fsck without destroying valid data: quarantine
    damaged segments and manifests (moved into ``strata-quarantine/``, never deleted), remove
    temp files, truncate a broken chain to its deepest checkpoint below the gap, and rebuild the
    indexes from the sidecars, then quarantine the segments no chain reaches any more
    (``SEGMENT_UNREACHABLE``: a GC hole's or a cut's leftovers; only when ``levels`` is the
    whole store). Offline only: no process may have the store open (a park in progress has
    written segments that no manifest names yet). A second run changes nothing.

    Repair acts only on store names directly inside ``dirs`` and never through a symbolic link
    or on a non-regular file (spec F-DIR-8): every removal and move goes through the io layer's
    guard, and what it refuses (a linked ``strata-index/``, a FIFO named like a sidecar) is left
    in place and recorded as a ``refused`` action. A file it rewrites keeps its mode; files it
    creates get the mode of their directory's files (spec F-DIR-9).

    Chains are checked across ``levels.store`` (default
    :func:`~stratastore.ops.level_dirs.levels_of`: ``dirs`` and the other levels of their store
    root): a segment (a regular sidecar, :func:`~stratastore.ops.fsck.committed_keys`) in
    any of them is not missing. A chain is cut at a segment that is damaged, or absent from every
    level when ``levels`` is the whole store; otherwise repair raises :class:`RepairRefused`
    before changing anything. ``keys``: the keyed levels' keys, by directory (as fsck takes
    them): a sidecar such a level does not accept is quarantined (``SIDECAR_UNAUTHENTICATED``),
    and one of a keyed level repair has no key for is left alone (spec F-KEYED-6)."""
    actions: list[Action] = []
    levels = levels if levels is not None else levels_of(dirs)
    findings = list(fsck(dirs, deep=deep, levels=levels, keys=keys))
    _refuse_unknown_cuts(findings, levels)
    rebuild = set()
    for f in findings:
        try:
            if _does(f) is Repair.REMOVE_TEMP:
                guard.remove_store_file(f.object, missing_ok=True)
                actions.append(
                    Action("remove_temp", f.object, "a temp file of an interrupted write")
                )
            elif _does(f) is Repair.QUARANTINE_SEGMENT:
                d = pathnames.dirname(f.object)
                rebuild.add(d)
                for path in _segment_files(f.object):
                    _quarantine(path)
                    actions.append(Action("quarantine", path, f.id))
            elif _does(f) is Repair.QUARANTINE_MANIFEST:
                _quarantine(f.object)
                actions.append(Action("quarantine", f.object, f.id))
        except _REFUSALS as e:
            actions.append(Action("refused", e.path, str(e)))
    index_findings = [f for f in findings if _does(f) is Repair.REBUILD_INDEX]
    rebuild |= {
        d for d in dirs if any(f.object.startswith(d + pathnames.SEP) for f in index_findings)
    }
    _rebuild_indexes(dirs, rebuild, actions, keys)
    cuts = 0
    broken = [
        f for f in fsck(dirs, deep=False, levels=levels, keys=keys) if _does(f) is Repair.CUT_CHAIN
    ]
    present = committed_keys(levels.store) if broken else set()  # fsck's definition, once
    for f in broken:  # chains broken by the quarantines above
        try:
            cut = _truncate_chain(f.object, present)
        except _REFUSALS as e:
            actions.append(Action("refused", e.path, str(e)))
            continue
        if cut is not None:
            actions.append(cut)
            cuts += 1
    if cuts and levels.complete:  # what a cut chain no longer reaches
        _quarantine_unreachable(dirs, levels, actions, keys)
    return actions


def _rebuild_indexes(
    dirs: Sequence[str],
    rebuild: set[str],
    actions: list[Action],
    keys: Mapping[str, LevelKeys] | None,
) -> None:
    """Rebuild the index of each of ``dirs`` in ``rebuild`` (it is derived: rebuilt where
    anything is off or any segment was quarantined)."""
    for d in dirs:
        if d in rebuild:
            index = pathnames.join(d, INDEX_DIR)
            try:
                _rebuild_index(d, (keys or {}).get(pathnames.abspath(d)))
            except _REFUSALS as e:
                actions.append(Action("refused", e.path, str(e)))
                continue
            actions.append(Action("rebuild_index", index, "from the sidecars"))


def _quarantine_unreachable(
    dirs: Sequence[str],
    levels: StoreLevels,
    actions: list[Action],
    keys: Mapping[str, LevelKeys] | None,
) -> None:
    """Quarantine the segments no chain reaches after the cuts (those between a chain's new
    end and the segment it was cut at, and those past it), and rebuild those indexes (fsck
    without ``deep``). Quarantining an unreachable segment never makes another one unreachable
    (every segment before a reachable one is reachable), so one pass is enough."""
    rebuild = set()
    for f in fsck(dirs, deep=False, levels=levels, keys=keys):
        if f.id != SEGMENT_UNREACHABLE.id:
            continue
        rebuild.add(pathnames.dirname(f.object))
        try:
            for path in _segment_files(f.object):
                _quarantine(path)
                actions.append(Action("quarantine", path, f.id))
        except _REFUSALS as e:
            actions.append(Action("refused", e.path, str(e)))
    _rebuild_indexes(dirs, rebuild, actions, keys)


def _segment_files(path: str) -> list[str]:
    """The sidecar and data file of the segment ``path`` names (either of them), those there."""
    parsed = parse_name(pathnames.basename(path))
    assert parsed is not None, path  # fsck names segment files only
    d = pathnames.dirname(path)
    names = (sidecar_name(parsed[0]), data_name(parsed[0]))
    return [p for p in (pathnames.join(d, n) for n in names) if files.lexists(p)]


def _quarantine(path: str) -> None:
    """Move the store file ``path`` into its directory's ``strata-quarantine/``
    (:func:`~stratastore.io.quarantine.quarantine`, the rule a directory level follows for a
    sidecar whose data file is gone, too)."""
    quarantine(path)


def _dir_mode(d: str) -> int:
    """The permission bits of level directory ``d`` itself, not of a link that names it (the
    level a user configured may be one, spec F-DIR-8: its own bits are 0o777)."""
    return files.permissions(pathnames.join(d, "."))


def _rebuild_index(d: str, keys: LevelKeys | None) -> None:
    """Drop ``d/strata-index/`` (only the index's own files, only in the real directory: a
    link is refused, spec F-DIR-8) and rebuild it from the sidecars, with the old index's mode
    (or the directory's files' mode when there was none)."""
    from stratastore.levels.local import SegmentStore

    index = pathnames.join(d, INDEX_DIR)
    mode = modes.inherited_mode(_dir_mode(d))
    if files.lexists(index):
        guard.store_subdir(d, INDEX_DIR, create=False)
        with contextlib.suppress(StrataIOError):
            mode = modes.inherited_mode(files.permissions(pathnames.join(index, "data.mdb")))
        # only the index's own files; anything else there is left alone
        owned = [
            pathnames.join(index, n)
            for n in files.listdir(index)
            if guard.is_store_name(n, in_index=True)
        ]
        for path in owned:  # a link or a FIFO refuses the rebuild before anything is removed
            guard.require_regular(path, "unlink", missing_ok=True)
        for path in owned:
            guard.remove_store_file(path, missing_ok=True)
    for name in sorted(files.listdir(d)):
        parsed = parse_name(name)
        if parsed is None or parsed[1] != "side":
            continue
        try:
            raw = files.read_file(pathnames.join(d, name), MAX_SIDECAR_BYTES)
            sc = decode_sidecar(raw, name, unchecked=True)  # its model, even keyed
        except StrataError:
            continue
        with SegmentStore.open(d, sc.fingerprint, create=False, file_mode=mode, keys=keys):
            return  # opening an empty index rebuilds it from every valid sidecar
    if files.lexists(index) and not files.listdir(index):
        guard.remove_index_dir(index)


def _truncate_chain(path: str, present: set[bytes]) -> Action | None:
    """Keep a manifest's segments up to its deepest checkpoint below the first missing one (not
    in ``present``: the keys of a regular sidecar in any level, as
    :func:`~stratastore.ops.fsck.committed_keys` finds them); a manifest that keeps nothing is
    quarantined. None when no segment is missing."""
    m = decode_manifest(files.read_file(path, MAX_MANIFEST_BYTES), path)
    gap = next((s for s, _, k in m.segments if k not in present), None)
    if gap is None:  # every segment is there again (changed since fsck looked): nothing to cut
        return None
    keep = max((c.length for c in m.checkpoints if c.length <= gap), default=0)
    if keep == 0:
        _quarantine(path)
        return Action("quarantine", path, f"{CHAIN_BROKEN.id} at its first segment")
    cut = dataclasses.replace(
        m,
        tokens=m.tokens[:keep],
        checkpoints=tuple(c for c in m.checkpoints if c.length <= keep),
        media=tuple((p, dg) for p, dg in m.media if p < keep),
        segments=tuple(s for s in m.segments if s[1] <= keep),
    )
    durable_write(path, encode_manifest(cut), mode=files.permissions(path))  # keeps its mode
    return Action("truncate_chain", path, f"{m.conv_id!r} cut to {keep} tokens (gap at {gap})")
