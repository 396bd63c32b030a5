"""Golden vectors (format-spec/vectors/): every MUST clause has a valid and an invalid vector,
each vector's outcome is the manifest's (as corrected by a later folder's ``supersedes``,
F-COMPAT-5), and no committed vector ever changes (F-COMPAT-4)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import pytest

from stratastore import ModelFingerprint
from stratastore.format import data_name, decode_sidecar, segment_key, sidecar_name, state_key
from stratastore.format.manifest import decode_manifest, manifest_key_mismatch
from stratastore.levels.local import SegmentStore
from stratastore.testing import load_manifest, load_vectors, vector_outcome

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "format-spec" / "vectors"
V1 = VECTORS / "v1"
SPEC = ROOT / "format-spec" / "SPEC.md"
#: each released version's manifest; changing a vector (or a manifest) must fail these tests
RELEASED = {
    "v1": "aa53e71c988e220fc6c80abcb85a9449349959ee162688d38faa48bb67681fe7",
    "v1.1": "4e19a01bf4ee2436525c50c5795d21e4796f01473a4cfcaac23c5a8939a5b226",
    "v1.1-errata1": "04526bd9c6c3896c47f397389a361c83c729415be1b98c550535d4196d550ec3",
    "v1.2": "773f49df768785896471762aa0eb16fefb6a444cf36087379479b157a08f8711",
    "v1.2-errata1": "f9d8954f66d764f07766399111458d8325773df80e0526fb0e5c3f173ed4c0fe",
    "v1.2-errata2": "8e5fa53a8e729f43223639678ba498644992f357dacc556cae74e56fb89130dd",
    "v1.3": "f29c2d83082ba14772dd35f6fc137e824da596f4e6767e490b93da499f5d5929",
}

#: every vector, its ``expect`` corrected where a later folder supersedes it (F-COMPAT-5)
ENTRIES: list[tuple[str, dict[str, Any]]] = load_vectors(str(VECTORS), RELEASED)
IDS = [f"{v}/{e['file']}" for v, e in ENTRIES]


@pytest.mark.parametrize("version", RELEASED)
def test_manifest_is_the_released_one(version: str) -> None:
    got = blake3.blake3((VECTORS / version / "MANIFEST.json").read_bytes()).hexdigest()
    assert got == RELEASED[version]


@pytest.mark.parametrize(("version", "entry"), ENTRIES, ids=IDS)
def test_vector_bytes_unchanged(version: str, entry: dict[str, Any]) -> None:
    data = (VECTORS / version / entry["file"]).read_bytes()
    assert blake3.blake3(data).hexdigest() == entry["blake3"]


@pytest.mark.parametrize(("version", "entry"), ENTRIES, ids=IDS)
def test_vector_outcome(version: str, entry: dict[str, Any]) -> None:
    assert vector_outcome(str(VECTORS / version), entry) == entry["expect"]


@pytest.mark.parametrize("version", RELEASED)
def test_every_vector_file_is_in_the_manifest(version: str) -> None:
    listed = {e["file"] for v, e in ENTRIES if v == version} | {"MANIFEST.json"}
    assert {p.name for p in (VECTORS / version).iterdir()} == listed


def test_vectors_were_never_modified_in_history() -> None:
    """No commit changed a released vector's bytes. The folder moved once, whole, into the
    package (format-spec/ is now a link to it): a rename with identical content (R100) is no
    change; a modification, a deletion or a rename that edits is."""
    homes = ["format-spec/vectors", VECTORS.resolve().relative_to(ROOT.resolve()).as_posix()]
    try:
        out = subprocess.run(
            [
                "git",
                "-C",
                str(ROOT),
                "log",
                "-M",
                "--format=commit %h %s",
                "--name-status",
                "--diff-filter=MDR",
                "--",
                *(f"{h}/{v}" for h in homes for v in RELEASED),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"not a git checkout with history ({e}); the digests above still hold")
    changed, commit = [], ""
    for line in out.splitlines():
        if line.startswith("commit "):
            commit = line
        elif line[:1] in ("M", "D") or (line[:1] == "R" and not line.startswith("R100")):
            changed.append(f"{commit}: {line}")
    assert changed == [], "commits modified released vectors:\n" + "\n".join(changed)


def must_clauses() -> set[str]:
    text = SPEC.read_text()
    return set(re.findall(r"\*\*(F-[A-Z]+-\d+)\*\* \(MUST\)", text))


# Clauses about behaviour rather than bytes are covered by named tests instead of vectors.
STORE_TESTS = "tests/unit/levels/test_segment_store.py"
CASCADE_TESTS = "tests/unit/tiers/test_cascade.py"
CATALOG_TESTS = "tests/unit/catalog/test_catalog.py"
BEHAVIOUR_TESTS = {
    "F-DIR-5": f"{STORE_TESTS}::test_reopen_reconciles_and_rebuilds",
    "F-IDX-2": f"{STORE_TESTS}::test_reopen_reconciles_and_rebuilds",
    "F-IDX-4": "tests/crash/test_kill.py::test_killed_writer_loses_nothing_acknowledged",
    "F-DUR-8": f"{CASCADE_TESTS}::test_failure_at_every_step_leaves_the_entry_whole_in_one_level",
    "F-CHAIN-3": "tests/unit/tiers/test_tiers.py::test_manifest_is_the_commit_record",
    "F-CHAIN-4": "tests/unit/tiers/test_tiers.py::test_manifest_is_the_commit_record",
    "F-CHAIN-5": "tests/unit/tiers/test_tiers.py::test_sessions_survive_capacity_gc",
    "F-CAT-1": f"{CATALOG_TESTS}::test_the_catalog_tables_are_laid_out_as_the_spec_says",
    "F-CAT-2": f"{CATALOG_TESTS}::test_a_store_without_a_catalog_has_it_built_and_a_changed_"
    "file_is_read_again",
    "F-CAT-3": f"{CATALOG_TESTS}::test_a_shared_segment_goes_with_the_last_conversation_that_"
    "names_it",
    "F-CAT-4": "tests/unit/catalog/test_gc_chains.py::test_gc_leaves_no_unreachable_segments",
    "F-CAT-5": "tests/unit/catalog/test_gc_chains.py::"
    "test_a_park_is_never_acknowledged_then_silently_gone",
    "F-CAT-6": "tests/crash/test_shared_catalog.py::"
    "test_a_park_again_is_seen_with_coarse_timestamps",
    "F-CAT-7": f"{CATALOG_TESTS}::test_a_killed_park_is_finished_by_the_next_open",
    "F-DUR-1": "tests/unit/io/test_io.py::test_durable_write_order_of_operations",
    "F-DUR-2": f"{STORE_TESTS}::test_put_order_of_operations",
    "F-DUR-3": "tests/crash/test_kill.py::test_crash_at_every_io_step_of_a_put",
    "F-DUR-4": "tests/unit/io/test_io.py::test_relocate_exdev_copies_then_unlinks",
    "F-DUR-5": f"{STORE_TESTS}::test_delete_order_and_result",
    "F-DUR-6": "tests/unit/io/test_io.py::test_fsync_failure_is_never_retried",
    "F-DUR-7": f"{STORE_TESTS}::test_concurrent_writers_across_processes",
    "F-COMPAT-4": "tests/conformance/test_vectors.py::test_vector_bytes_unchanged",
    "F-COMPAT-5": "tests/conformance/test_vectors.py::test_superseded_vectors_name_their_fix",
    "F-IDX-5": "tests/conformance/test_reader_clauses.py::test_lmdb_key_encoding",
    "F-DIR-8": "tests/unit/io/test_fs_safety.py::"
    "test_repair_never_unlinks_through_a_symlinked_index",
    "F-REM-3": "tests/remote/test_faults.py::test_killed_between_the_parts_and_the_commit",
    "F-REM-4": "tests/remote/test_redis_backend.py::"
    "test_a_deleted_and_reput_segment_is_never_a_mix",
    "F-SEG-7": "tests/unit/format/test_media_and_manifest_keys.py::"
    "test_multimodal_conversation_parked_to_disk_restores_whole",
}


def test_every_must_clause_has_a_valid_and_an_invalid_vector_or_a_named_test() -> None:
    valid: set[str] = set()
    invalid: set[str] = set()
    for _, e in ENTRIES:
        if "superseded_by" in e:
            continue  # a vector found wrong is evidence of nothing (F-COMPAT-5)
        # "ok:N" (a store layout adopting N segments) is valid when something was adopted
        ok = e["expect"] == "ok" or (e["expect"].startswith("ok:") and e["expect"] != "ok:0")
        (valid if ok else invalid).update(e["clauses"])
    missing = []
    for clause in sorted(must_clauses()):
        if clause in BEHAVIOUR_TESTS:
            path, _, name = BEHAVIOUR_TESTS[clause].partition("::")
            assert f"def {name}(" in (ROOT / path).read_text(), BEHAVIOUR_TESTS[clause]
            continue
        if clause not in invalid:
            missing.append(f"{clause}: no invalid vector")
        if clause not in valid:
            missing.append(f"{clause}: no valid vector")
    assert not missing, "\n".join(missing)


def test_key_vectors_recompute() -> None:
    doc = json.loads((V1 / "keys.json").read_text())
    fp = ModelFingerprint.unpack((V1 / doc["fingerprint_file"]).read_bytes())
    known = {"root": fp.digest()}
    assert known["root"].hex() == doc["root"]["key"]
    for case in doc["cases"]:
        media = [(off, bytes.fromhex(h)) for off, h in case["media"]]
        key = segment_key(known[case["parent"]], case["tokens"], media)
        assert key.hex() == case["key"], case["name"]
        known[case["name"]] = key
    for st in doc["states"]:
        assert state_key(known[st["checkpoint"]]).hex() == st["key"]


def test_store_reads_the_valid_vectors(tmp_path: Path) -> None:
    """A directory laid out from the vectors by hand is adopted and reads back the pattern."""
    pairs = [
        ("sidecar_kv_raw.side", "segment_kv_raw.seg", 0),
        ("sidecar_kv_zstd.side", "segment_kv_zstd.seg", 7),
    ]
    fp = None
    for side_name, seg_name, _ in pairs:
        sc = decode_sidecar((V1 / side_name).read_bytes())
        fp = sc.fingerprint
        (tmp_path / sidecar_name(sc.key)).write_bytes((V1 / side_name).read_bytes())
        (tmp_path / data_name(sc.key)).write_bytes((V1 / seg_name).read_bytes())
    assert fp is not None
    with SegmentStore.open(tmp_path, fp, create=False) as store:
        assert len(store) == 2 and store.skipped == []
        for side_name, _, start in pairs:
            sc = decode_sidecar((V1 / side_name).read_bytes())
            out = bytearray(sc.payload_bytes)
            store.get_into(sc.key, out)
            want = (np.arange(start, start + sc.payload_bytes) % 251).astype(np.uint8)
            assert bytes(out) == want.tobytes()


ERRATA = "v1.1-errata1"


def test_superseded_vectors_name_their_fix() -> None:
    """Each ``supersedes`` record names a committed vector by its digest, the MUST clauses it
    violates, the outcome a conforming reader gives it, and its replacement (F-COMPAT-5)."""
    musts = must_clauses()
    records = [r for v in RELEASED for r in load_manifest(str(VECTORS / v)).get("supersedes", [])]
    assert {r["file"] for r in records} >= {"v1.1/manifest_ok.chain", "v1.1/manifest_session.chain"}
    for rec in records:
        version, _, name = rec["file"].rpartition("/")
        assert blake3.blake3((VECTORS / version / name).read_bytes()).hexdigest() == rec["blake3"]
        assert rec["violates"] and set(rec["violates"]) <= musts, rec
        assert (VECTORS / ERRATA / rec["replaced_by"]).is_file()
        got = vector_outcome(str(VECTORS / version), {"file": name, "kind": "manifest"})
        assert got == rec["expect"], rec["file"]


def test_each_correction_lies_in_the_folder_that_supersedes() -> None:
    """A ``supersedes`` record's ``replaced_by`` is a vector of its own folder's manifest, of
    the superseded vector's kind (F-COMPAT-5)."""
    kinds = {f"{v}/{e['file']}": e["kind"] for v, e in ENTRIES}
    found = 0
    for version in RELEASED:
        listed = {e["file"]: e for v, e in ENTRIES if v == version}
        for rec in load_manifest(str(VECTORS / version)).get("supersedes", []):
            assert rec["replaced_by"] in listed, (version, rec["file"])
            assert listed[rec["replaced_by"]]["kind"] == kinds[rec["file"]], rec["file"]
            found += 1
    assert found >= 9


MISMATCH_NAMED = [(v, e) for v, e in ENTRIES if "first_mismatch" in e]


@pytest.mark.parametrize(
    ("version", "entry"), MISMATCH_NAMED, ids=[f"{v}/{e['file']}" for v, e in MISMATCH_NAMED]
)
def test_a_key_mismatch_names_the_first_wrong_item(version: str, entry: dict[str, Any]) -> None:
    """Keys are derived from the root along the manifest's own content, never from a recorded
    key, and the first that differs is the one reported (F-CHAIN-2): a wrong first segment
    does not make the correct ones after it wrong."""
    m = decode_manifest((VECTORS / version / entry["file"]).read_bytes())
    err = manifest_key_mismatch(m)
    assert err is not None and err.what.startswith(entry["first_mismatch"]), err


def test_the_largest_sidecar_is_the_number_the_spec_gives() -> None:
    """F-SC-7 gives the largest sidecar a reader accepts as a number; the reader's bound and
    the ``sized`` vectors at it and one byte past it agree with it."""
    from stratastore.format.sidecar import MAX_SIDECAR_BYTES

    assert "40,112,384" in SPEC.read_text() and MAX_SIDECAR_BYTES == 40_112_384
    sizes = {
        json.loads((VECTORS / v / e["file"]).read_text())["bytes"]: e["expect"]
        for v, e in ENTRIES
        if e["kind"] == "sized"
    }
    assert sizes == {MAX_SIDECAR_BYTES: "UnsupportedVersion", MAX_SIDECAR_BYTES + 1: "FormatError"}


@pytest.mark.parametrize("folder", [ERRATA, "v1.2", "v1.2-errata1", "v1.2-errata2", "v1.3"])
def test_the_generator_reproduces_the_committed_vectors(tmp_path: Path, folder: str) -> None:
    """tools/make_vectors.py writes the errata and v1.2 folders byte for byte (deterministic)."""
    out = tmp_path / folder
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "make_vectors.py"),
            f"--{folder}",
            str(out),
            str(VECTORS),
        ],
        check=True,
        capture_output=True,
        timeout=120,
        cwd=ROOT,
    )
    committed = {p.name: p.read_bytes() for p in (VECTORS / folder).iterdir()}
    assert {p.name: p.read_bytes() for p in out.iterdir()} == committed
