"""The chains of a store checked (spec F-CHAIN): each manifest as a reader accepts it
(``CHAIN_INVALID``, ``MANIFEST_KEY_MISMATCH``), its segments looked up in every level of the
store (``CHAIN_BROKEN``: in none of them), and the committed segments no chain reaches
(``SEGMENT_UNREACHABLE``, F-CHAIN-3). A chain that stops at a damaged segment is a consequence
in that segment's finding (:mod:`stratastore.ops.fsck.damage`). :func:`committed_keys` is the
one definition of a present segment that fsck and repair share."""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterator, Sequence

from stratastore.errors import StrataError
from stratastore.format import parse_name
from stratastore.format.manifest import (
    MAX_MANIFEST_BYTES,
    ChainManifest,
    decode_manifest,
    manifest_key_mismatch,
)
from stratastore.format.naming import QUARANTINE_DIR, chain_name, data_name, is_chain_name
from stratastore.io import files, guard, pathnames
from stratastore.io.errors import StrataIOError
from stratastore.levels.findings import (
    CHAIN_BROKEN,
    CHAIN_INVALID,
    MANIFEST_KEY_MISMATCH,
    SEGMENT_UNREACHABLE,
    Finding,
)
from stratastore.ops.fsck.damage import Chains
from stratastore.ops.reachability import reachability

__all__ = [
    "check_manifest",
    "check_reachability",
    "committed_keys",
    "quarantined_keys",
    "read_manifest",
]


def committed_keys(dirs: Sequence[str]) -> set[bytes]:
    """The keys whose sidecar is a regular file in one of ``dirs`` (``lstat``, nothing is read
    or followed: a link or a FIFO named like a sidecar commits nothing, spec F-DIR-8). The one
    definition of a present segment that fsck's chain check and repair's chain cut share."""
    keys: set[bytes] = set()
    for d in dirs:
        with contextlib.suppress(StrataIOError):
            for name in files.listdir(d):
                parsed = parse_name(name)
                if parsed is not None and parsed[1] == "side" and _is_regular(d, name):
                    keys.add(parsed[0])
    return keys


def _is_regular(d: str, name: str) -> bool:
    try:
        return guard.require_regular(pathnames.join(d, name), missing_ok=True)
    except StrataIOError:  # a link, a FIFO, ... (reported where d is checked)
        return False


def quarantined_keys(dirs: Sequence[str]) -> dict[bytes, str]:
    """The keys of segment files repair moved into a ``strata-quarantine/`` of ``dirs``."""
    out: dict[bytes, str] = {}
    for d in dirs:
        qdir = pathnames.join(d, QUARANTINE_DIR)
        if not files.is_dir(qdir) or files.is_link(qdir):
            continue
        with contextlib.suppress(StrataIOError):
            for name in files.listdir(qdir):
                parsed = parse_name(name) or parse_name(name.rsplit(".", 1)[0])  # name.N
                if parsed is not None:
                    out.setdefault(parsed[0], qdir)
    return out


def read_manifest(path: str) -> ChainManifest | Finding:
    """The manifest at ``path`` as a reader accepts it, or the finding why a reader refuses
    it: it does not decode, its name is not its conversation's (F-CHAIN-4), or its keys are not
    its tokens' (F-CHAIN-2)."""
    try:
        m = decode_manifest(files.read_file(path, MAX_MANIFEST_BYTES), path)
    except (StrataError, StrataIOError) as e:
        return CHAIN_INVALID.found(path, str(e))
    if pathnames.basename(path) != chain_name(m.conv_id):  # F-CHAIN-4: a reader refuses it
        return CHAIN_INVALID.found(
            path,
            f"it holds conversation {m.conv_id!r}, whose manifest is named "
            f"{chain_name(m.conv_id)}: a copy under another conversation's "
            "name",
        )
    forged = manifest_key_mismatch(m, obj=path)  # keys not its tokens' (F-CHAIN-2)
    if forged is not None:
        return MANIFEST_KEY_MISMATCH.found(path, str(forged))
    return m


def check_manifest(
    d: str, name: str, chains: Chains
) -> Generator[Finding, None, ChainManifest | None]:
    """One chain manifest (spec F-CHAIN); returns it when a reader accepts it. Its first
    segment that no level holds valid stops the chain: when that segment is damaged in a checked
    level, the stop is a consequence added to the damage's finding; when it is in no level
    searched, ``CHAIN_BROKEN``."""
    path = pathnames.join(d, name)
    m = read_manifest(path)
    if isinstance(m, Finding):
        yield m
        return None
    for start, _, key in m.segments:
        if key in chains.valid or key in chains.elsewhere:
            continue
        what = "saved session" if m.session else "conversation"
        for dmg in chains.damaged.get(key, []):
            dmg.consequences.append(
                f"the chain of {what} {m.conv_id!r} ({path}) stops here: it "
                f"restores only up to token {start}"
            )
        if key not in chains.damaged:
            qdir = chains.quarantined.get(key)
            yield CHAIN_BROKEN.found(
                path,
                f"{what} {m.conv_id!r}: its segment {key.hex()} at token {start} is in "
                f"none of the levels searched ({', '.join(chains.searched)})"
                + (f"; it was moved into {qdir} as damaged" if qdir else "")
                + "; it restores only up to there",
                severity="error" if m.session else None,
            )
        break
    return m


def check_reachability(
    dirs: Sequence[str],
    others: Sequence[str],
    accepted: list[tuple[str, ChainManifest]],
    chains: Chains,
) -> Iterator[Finding]:
    """``SEGMENT_UNREACHABLE`` for each committed segment of ``dirs`` that no chain reaches
    (spec F-CHAIN-3, :mod:`stratastore.ops.reachability`), only for a complete level set: the
    manifests of ``others`` count too (read, not checked), a segment of any level is present,
    and a damaged one stops its chains. A damaged segment is reported by its damage, and one
    reached only past damaged segments is a consequence in that damage's detail (one problem,
    one finding); names and manifests only, nothing is hashed."""
    for d in others:
        with contextlib.suppress(StrataIOError):
            for name in sorted(files.listdir(d)):
                m = read_manifest(pathnames.join(d, name)) if is_chain_name(name) else None
                if isinstance(m, ChainManifest):
                    accepted.append((pathnames.join(d, name), m))
    here = {d: committed_keys([d]) for d in dirs}
    mine: set[bytes] = set().union(*here.values())
    store = mine | set(chains.valid) | chains.elsewhere | set(chains.damaged)
    reach = reachability(
        accepted, mine - set(chains.damaged), store.__contains__, chains.damaged.__contains__
    )
    behind: dict[bytes, list[str]] = {}  # a damaged key -> the segments only it hides
    for d in dirs:
        for key in sorted(here[d] & set(reach.unreachable)):
            gone, path = reach.unreachable[key], pathnames.join(d, data_name(key))
            if gone.only_damage:
                behind.setdefault(gone.stops[0].key, []).append(path)
                continue
            stop = next((s for s in gone.stops if s.missing), None)
            qdir = chains.quarantined.get(stop.key) if stop is not None else None
            yield SEGMENT_UNREACHABLE.found(
                path,
                f"segment {key.hex()} in level {d}: {gone.reason()}"
                + (f" (moved into {qdir} as damaged)" if qdir else "")
                + "; no restore reads it, yet it occupies the level's budget "
                "(F-CHAIN-3); repair quarantines it",
            )
    for key, paths in behind.items():
        for dmg in chains.damaged[key][:1]:
            fix = (
                "repair leaves them, as it leaves this segment"
                if dmg.left_alone
                else "once repair cuts the chains here, it quarantines them"
            )
            dmg.consequences.append(
                f"{len(paths)} segment(s) after it are reached by no chain "
                f"(F-CHAIN-3), e.g. {', '.join(paths[:3])}: {fix}"
            )
