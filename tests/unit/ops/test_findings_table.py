"""The table of fsck findings (stratastore/levels/findings.py) is the one place a finding id is
written: format-spec/FSCK.md lists the same ids with the same severities and the same repairs,
every clause it cites is in the spec, fsck's sources name every id, and no other module of the
package spells an id as a string."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from stratastore.levels import findings
from stratastore.levels.findings import FINDINGS, FindingKind, Repair

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "stratastore"
FSCK_MD = (PACKAGE / "format_spec" / "FSCK.md").read_text()
SPEC_MD = (PACKAGE / "format_spec" / "SPEC.md").read_text()


def _table(header: str) -> list[list[str]]:
    """The rows (cells) of the markdown table of FSCK.md that starts with ``header``."""
    rows = []
    lines = FSCK_MD.splitlines()
    start = lines.index(header) + 2  # past the header and its |---| line
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
    return rows


def _ids(cell: str) -> set[str]:
    """The finding ids a cell names (``SEGMENT_*``: every id with that prefix)."""
    out: set[str] = set()
    for name in re.findall(r"`([A-Z_]+\*?)`", cell):
        out |= {i for i in FINDINGS if i.startswith(name[:-1])} if name.endswith("*") else {name}
    return out


def fsck_ids() -> set[str]:
    """The finding ids fsck's sources (its package and the segment check it shares with open)
    import from the table: the ids fsck can report."""
    sources = [*(PACKAGE / "ops" / "fsck").glob("*.py"), PACKAGE / "levels" / "inspect.py"]
    names: set[str] = set()
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == findings.__name__:
                kinds = [a.name for a in node.names]
                names |= {n for n in kinds if isinstance(getattr(findings, n), FindingKind)}
    return names


def test_fsck_md_lists_every_id_of_the_table_with_its_severity() -> None:
    documented = {
        row[0].strip("`"): row[1].split()[0] for row in _table("| id | severity | meaning |")
    }
    assert documented == {k.id: k.severity for k in FINDINGS.values()}


def test_fsck_md_says_what_repair_does_as_the_table_does() -> None:
    def repair_of(cell: str) -> Repair:
        for start, repair in (
            ("left alone", Repair.LEAVE),
            ("the index is rebuilt", Repair.REBUILD_INDEX),
            ("the manifest is cut", Repair.CUT_CHAIN),
            ("the manifest is quarantined", Repair.QUARANTINE_MANIFEST),
            ("the temp file is removed", Repair.REMOVE_TEMP),
        ):
            if cell.startswith(start):
                return repair
        assert "moved into `strata-quarantine/`" in cell, cell
        return Repair.QUARANTINE_SEGMENT

    said: dict[str, Repair] = {}
    for row in _table("| finding | repair |"):
        for i in _ids(row[0]):
            said.setdefault(i, repair_of(row[1]))
    assert said == {k.id: k.repair for k in FINDINGS.values()}


def test_every_clause_the_table_cites_is_in_the_spec() -> None:
    for k in FINDINGS.values():
        for clause in (k.spec, *k.violates):
            assert re.search(rf"\b{re.escape(clause)}\b", SPEC_MD), (k.id, clause)


def test_fsck_names_every_id_of_the_table() -> None:
    assert fsck_ids() == set(FINDINGS)


def test_no_module_spells_a_finding_id_outside_the_table() -> None:
    """A finding id written as a string anywhere in the package but the table (a name in an
    ``__all__`` is a name, not an id: ``format.INDEX_SCHEMA`` is the index's schema number)."""
    table = PACKAGE / "levels" / "findings.py"
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == table:
            continue
        tree = ast.parse(path.read_text())
        exported: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                    exported |= {id(c) for c in ast.walk(node)}
        for node in ast.walk(tree):
            spelled = isinstance(node, ast.Constant) and node.value in FINDINGS
            if spelled and id(node) not in exported:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not found, "finding ids spelled outside stratastore/levels/findings.py:\n" + "\n".join(
        found
    )
