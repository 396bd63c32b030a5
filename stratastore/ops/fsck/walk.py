"""The walk of ``strata fsck``: each level directory given, then what spans the levels (the
chains, keys committed in two levels, the segments no chain reaches); see
:mod:`stratastore.ops.fsck` for the contract and :mod:`stratastore.levels.findings` for the
findings."""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import TypeVar

from stratastore.errors import StrataError
from stratastore.format import LevelKeys, parse_name
from stratastore.format.manifest import ChainManifest
from stratastore.format.naming import (
    INDEX_DIR,
    QUARANTINE_DIR,
    TEMP_PREFIX,
    data_name,
    is_chain_name,
    sidecar_name,
)
from stratastore.format.sidecar import Sidecar
from stratastore.io import files, pathnames
from stratastore.levels.findings import (
    DUPLICATE_ACROSS_LEVELS,
    FINGERPRINT_MISMATCH,
    KEYED_UNCHECKED,
    ORPHAN_FILE,
    ORPHAN_TEMP,
    UNKNOWN_FILE,
    Finding,
)
from stratastore.levels.inspect import inspect_segment
from stratastore.ops.fsck.chains import (
    check_manifest,
    check_reachability,
    committed_keys,
    quarantined_keys,
)
from stratastore.ops.fsck.damage import Chains, Damage
from stratastore.ops.fsck.entries import check_modes, special_entries
from stratastore.ops.fsck.index import check_index
from stratastore.ops.level_dirs import StoreLevels, levels_of

__all__ = ["fsck"]

_T = TypeVar("_T")


def fsck(
    dirs: Sequence[str],
    *,
    deep: bool = False,
    isolate_index: bool = True,
    levels: StoreLevels | None = None,
    keys: Mapping[str, LevelKeys] | None = None,
) -> Iterator[Finding]:
    """Check each directory (a store level), then what spans them (manifests, duplicates).

    A damaged segment is one finding, named by its cause (``PAGE_HASH_MISMATCH``, ...): the
    index record that still names it and the chains that stop at it are consequences, carried
    in its detail, never findings of their own. ``CHAIN_BROKEN`` is a segment absent from every
    level of ``levels.store`` (default :func:`~stratastore.ops.level_dirs.levels_of`: ``dirs`` and
    their sibling levels), since a chain in the last level names segments of every level
    (F-CHAIN-4); levels not in ``dirs`` are only looked in, not checked. ``SEGMENT_UNREACHABLE``
    (a committed segment of ``dirs`` no chain reaches, F-CHAIN-3) only when ``levels.complete``.
    ``isolate_index=False`` reads the LMDB index in this process (faster; only for an index
    known to be a real LMDB commit, as the power-loss tests have: a damaged one can SIGBUS).

    ``keys``: the keys of keyed levels (spec F-KEYED), by directory (its absolute path): a
    sidecar such a level does not accept is ``SIDECAR_UNAUTHENTICATED``. In a level given no
    keys, a keyed sidecar is parsed without checking its digests (its trailer, its pages) and
    the level gets one ``KEYED_UNCHECKED`` warning saying how many (F-KEYED-6)."""
    for d in dirs:
        if not files.is_dir(d):
            raise StrataError(f"{d} is not a directory; pass store level directories")
    levels = levels if levels is not None else levels_of(dirs)
    given = {pathnames.abspath(d) for d in dirs}
    others = [d for d in levels.store if pathnames.abspath(d) not in given]
    seen: dict[bytes, str] = {}
    manifests: list[tuple[str, str]] = []
    damaged: dict[bytes, list[Damage]] = {}
    for d in dirs:
        here: dict[bytes, Damage] = {}
        mine = (keys or {}).get(pathnames.abspath(d))
        keys_here = yield from _check_dir(d, deep, manifests, isolate_index, here, mine)
        for key, dmg in here.items():
            damaged.setdefault(key, []).append(dmg)
        for key in keys_here:
            if key in seen:
                yield DUPLICATE_ACROSS_LEVELS.found(
                    key.hex(), f"committed in {seen[key]} and in {d}"
                )
            else:
                seen[key] = d
    chains = Chains(
        seen, committed_keys(others), damaged, quarantined_keys([*dirs, *others]), (*dirs, *others)
    )
    accepted: list[tuple[str, ChainManifest]] = []
    for d, name in manifests:
        m = yield from check_manifest(d, name, chains)
        if m is not None:
            accepted.append((pathnames.join(d, name), m))
    if levels.complete:  # a guessed level set could hide a segment's predecessor
        yield from check_reachability(dirs, others, accepted, chains)
    for found in damaged.values():
        for dmg in found:
            yield dmg.report()


def _drain(gen: Generator[Finding, None, _T]) -> tuple[list[Finding], _T]:
    """Run a findings generator to its end: (its findings, its return value)."""
    found: list[Finding] = []
    while True:
        try:
            found.append(next(gen))
        except StopIteration as stop:
            return found, stop.value


def _check_dir(
    d: str,
    deep: bool,
    manifests: list[tuple[str, str]],
    isolate_index: bool,
    damaged: dict[bytes, Damage],
    keys: LevelKeys | None = None,
) -> Generator[Finding, None, list[bytes]]:
    """Findings of one directory; returns the keys of its valid committed segments. A damaged
    segment's finding goes into ``damaged`` instead (fsck reports it once its consequences, the
    chains that stop at it, are known)."""
    names = files.listdir(d)
    sidecars: set[bytes] = set()
    datas: set[bytes] = set()
    special, names = _drain(special_entries(d, names))
    for f in special:  # a segment file that is a link or a FIFO: the segment is left alone, and
        parsed = parse_name(pathnames.basename(f.object))  # what stops at it is a consequence
        if parsed is not None and parsed[0] not in damaged:
            damaged[parsed[0]] = Damage(f)
        else:  # not a segment file, or the segment's second special file
            yield f
    left_alone = set(damaged)  # neither an orphan data file nor a sidecar to check
    yield from check_modes(d, names)
    for name in names:
        parsed = parse_name(name)
        if parsed is not None:
            (sidecars if parsed[1] == "side" else datas).add(parsed[0])
        elif name.startswith(TEMP_PREFIX):
            yield ORPHAN_TEMP.found(
                pathnames.join(d, name), "a temp file of an interrupted write; repair removes it"
            )
        elif is_chain_name(name):
            manifests.append((d, name))
        elif name not in (INDEX_DIR, QUARANTINE_DIR):
            yield UNKNOWN_FILE.found(pathnames.join(d, name), "not a store file; ignored")
    sidecars -= left_alone
    datas -= left_alone
    for key in sorted(datas - sidecars):
        yield ORPHAN_FILE.found(
            pathnames.join(d, data_name(key)),
            "a data file without a sidecar (invisible); repair quarantines it",
        )
    valid: dict[bytes, Sidecar] = {}
    fingerprints: dict[bytes, int] = {}
    unchecked = 0  #: keyed sidecars parsed without a key
    for key in sorted(sidecars):
        got = inspect_segment(
            key,
            pathnames.join(d, sidecar_name(key)),
            pathnames.join(d, data_name(key)),
            depth="pages" if deep else "sample",
            data_listed=key in datas,
            by_path=True,
            keys=keys,
            unchecked=keys is None,
        )
        if got.damage is not None:
            if key in damaged:
                yield got.damage.finding()
            else:  # the cause: one finding per damaged segment
                damaged[key] = Damage(got.damage.finding())
            continue
        assert got.sidecar is not None
        unchecked += not got.sidecar.authenticated
        valid[key] = got.sidecar
        fp = got.sidecar.fingerprint.pack()
        fingerprints[fp] = fingerprints.get(fp, 0) + 1
    if unchecked:
        yield KEYED_UNCHECKED.found(
            d,
            f"{unchecked} keyed segment(s) (spec F-KEYED): fsck was given no key for this "
            "level, so their authentication (sidecar trailers, page digests) is not checked; "
            "pass the store's config (its key_file or key_env) or --key-file",
        )
    if len(fingerprints) > 1:
        yield FINGERPRINT_MISMATCH.found(
            d, f"sidecars of {len(fingerprints)} different models in one directory (spec F-DIR-6)"
        )
    yield from check_index(d, valid, isolate_index, damaged)
    return list(valid)
