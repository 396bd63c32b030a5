"""Opening the catalog: build it from the manifests, reconcile it with them, finish what a
crashed process left in flight (spec F-CAT-2, F-CAT-7).

The manifests are the truth (F-CHAIN-3); the catalog is derived from them. A store without a
catalog (written before it: formats 1.0 and 1.1, or an index deleted) has it built in one
transaction from every manifest that reads back valid; one with a catalog is reconciled: a
manifest file the catalog lacks, or whose stamp changed, is (re)entered (a crash between a
file's write and its commit; a file replaced behind the store's back), an entry whose file is
gone or refused is removed, deleting nothing (the file, and the segments only it named, are left
for fsck and repair). A park or a removal whose process
is gone is finished from the files: the park's manifest, if written, is committed, else the
segments only it named go; the removal's manifest file is made to match the catalog and its
doomed keys are deleted. A segment nothing names that no ticket covers (written through
:class:`SegmentStore` directly, or left by a writer before the catalog) is never deleted here:
fsck reports it (``SEGMENT_UNREACHABLE``) and repair quarantines it. Build and reconcile run at
open only (they list the manifest directory once and stat each manifest, as the segment index's
reconcile lists its directory); :func:`finish_ticket` also runs when a park or a removal waits
on a dead process's ticket.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from stratastore.catalog.gc import Collector
from stratastore.catalog.tables import Catalog, Removal
from stratastore.format import ChecksumMismatch, FormatError, KeyMismatch
from stratastore.format.manifest import (
    MAX_MANIFEST_BYTES,
    ChainManifest,
    decode_manifest,
    verify_manifest_keys,
)
from stratastore.format.naming import CHAIN_PREFIX, CHAIN_SUFFIX, chain_name, is_chain_name
from stratastore.io import durable_write, files, guard, pathnames
from stratastore.io.errors import StrataIOError

__all__ = ["Recovered", "finish_ticket", "load_manifest", "recover"]


@dataclass
class Recovered:
    skipped: list[tuple[str, str]] = field(default_factory=list)  #: (file name, why)
    built: bool = False  #: the catalog was built from the manifests by this open
    adopted: int = 0  #: manifest files entered that the catalog lacked
    dropped: int = 0  #: entries whose file was gone
    finished: int = 0  #: in-flight work of dead processes finished


def load_manifest(path: str, name: str, root: bytes) -> tuple[ChainManifest, bytes, bytes] | str:
    """A manifest file read and checked as a reader must (F-CHAIN-1, F-CHAIN-2, F-CHAIN-4,
    F-FP-5) with its stamp, or why it is refused (it is then never served)."""
    try:
        stamp = files.stamp(path)
        raw = files.read_file(path, MAX_MANIFEST_BYTES)
        m = decode_manifest(raw, name)
    except (FormatError, ChecksumMismatch, StrataIOError) as e:
        return str(e)
    if m.model != root:
        return "written for another model"
    if name != chain_name(m.conv_id):
        return (
            f"holds conversation {m.conv_id!r}, whose file is {chain_name(m.conv_id)} (F-CHAIN-4)"
        )
    try:
        verify_manifest_keys(m, root, name)
    except KeyMismatch as e:
        return str(e)
    return m, raw, stamp


def _digest_of(name: str) -> bytes:
    return bytes.fromhex(name[len(CHAIN_PREFIX) : -len(CHAIN_SUFFIX)])


def _file_of(digest: bytes) -> str:
    return f"{CHAIN_PREFIX}{digest.hex()}{CHAIN_SUFFIX}"


def recover(
    catalog: Catalog, gc: Collector, root: bytes, manifest_dir: str, warn: Callable[[str], None]
) -> Recovered:
    """Bring the catalog in line with the files (see the module's docstring). A catalog entry
    that does not decode (the index's LMDB file damaged) has the catalog rebuilt."""
    try:
        return _recover(catalog, gc, root, manifest_dir, warn)
    except (FormatError, ChecksumMismatch) as e:
        warn(f"the catalog in {manifest_dir} is damaged ({e}); rebuilding it from the manifests")
        catalog.reset()
        return _recover(catalog, gc, root, manifest_dir, warn)


def _recover(
    catalog: Catalog, gc: Collector, root: bytes, manifest_dir: str, warn: Callable[[str], None]
) -> Recovered:
    out = Recovered()
    names = {n for n in files.listdir(manifest_dir) if is_chain_name(n)}

    def load(name: str) -> tuple[ChainManifest, bytes, bytes] | None:
        got = load_manifest(pathnames.join(manifest_dir, name), name, root)
        if isinstance(got, str):
            out.skipped.append((name, got))
            warn(f"manifest {name} is not served: {got}")
        return None if isinstance(got, str) else got

    if not catalog.built():
        found = [m for name in sorted(names) if (m := load(name)) is not None]
        out.built = catalog.replace_all(found)
    out.finished = _finish_dead(catalog, gc, root, manifest_dir)
    if not out.built:
        _reconcile(catalog, gc, names, manifest_dir, load, out)
    return out


def _reconcile(
    catalog: Catalog,
    gc: Collector,
    names: set[str],
    manifest_dir: str,
    load: Callable[[str], tuple[ChainManifest, bytes, bytes] | None],
    out: Recovered,
) -> None:
    """Files the catalog lacks or holds another version of are (re)entered; entries whose file
    is refused or gone are removed (their file left for fsck). One stat per manifest; only a
    file whose stamp changed is read."""
    stamps = catalog.stamps()
    for name in sorted(names):
        digest = _digest_of(name)
        path = pathnames.join(manifest_dir, name)
        try:
            if stamps.get(digest) == files.stamp(path):
                continue
        except StrataIOError:
            continue  # removed meanwhile (a removal in flight elsewhere)
        got = load(name)
        if got is not None:
            if got[1] == catalog.raw_by_digest(digest):
                catalog.restamp(digest, got[1], got[2])  # rewritten alike (a GC cut)
            elif (r := catalog.put_file(*got)) is not None:
                gc.carry_out(r)
                out.adopted += 1
        elif (entry := catalog.by_digest(digest)) is not None:
            _drop(catalog, entry.conv_id, out)
    for digest in set(stamps) - {_digest_of(n) for n in names}:
        if files.exists(pathnames.join(manifest_dir, _file_of(digest))):
            continue  # written after the listing
        if (gone := catalog.by_digest(digest)) is not None:
            _drop(catalog, gone.conv_id, out)


def _drop(catalog: Catalog, conv_id: str, out: Recovered) -> None:
    """Stop serving ``conv_id`` (its manifest is gone or refused), deleting nothing: its file is
    left for fsck, and the segments only it named stay too, for fsck to report
    (``SEGMENT_UNREACHABLE``) and repair to quarantine. An open never deletes data on its own
    judgment of a file someone else changed."""
    r = catalog.shorten(conv_id, lambda m: 0, sessions=True, touch_file=False)
    if r is not None:
        catalog.finish(r)  # the dooms released, the keys left in place
        out.dropped += 1


def _finish_dead(catalog: Catalog, gc: Collector, root: bytes, manifest_dir: str) -> int:
    """Finish the parks and removals of processes that are gone."""
    done: set[bytes] = set()
    for ticket, _ in catalog.in_flight():
        if ticket in done or catalog.alive(ticket):
            continue
        done.add(ticket)
        finish_ticket(catalog, gc, root, manifest_dir, ticket)
    return len(done)


def finish_ticket(
    catalog: Catalog, gc: Collector, root: bytes, manifest_dir: str, ticket: bytes
) -> None:
    """Finish the work ``ticket`` left in flight (its process is gone, F-CAT-7): a park whose
    manifest file was written is committed from that file, else withdrawn; a removal's manifest
    file is made to match the catalog and its doomed keys are deleted."""
    conv = catalog.parking_conv(ticket)
    if conv is not None:
        name = _file_of(conv)
        got = load_manifest(pathnames.join(manifest_dir, name), name, root)
        if not isinstance(got, str) and got[1] != catalog.raw_by_digest(conv):
            gc.carry_out(catalog.commit(ticket, *got))
        else:
            gc.carry_out(catalog.abort(ticket))
        return
    doomed, convs = catalog.doomed_by(ticket)
    # a key some manifest or park names again is kept (the doom still keeps new parks off it)
    dead = tuple(k for k in doomed if not catalog.owners(k))
    for digest in convs:
        raw = catalog.raw_by_digest(digest)
        path = pathnames.join(manifest_dir, _file_of(digest))
        if raw is None:
            guard.remove_store_file(path, missing_ok=True)
        else:
            durable_write(path, raw, mode=gc.file_mode)
    gc.carry_out(Removal("", None, dead, ticket, 0))
