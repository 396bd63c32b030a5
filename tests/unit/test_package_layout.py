"""The package's shape holds (docs/design.md, "Where things live"): modules stay small, the
package root holds the engine's API only, the level seam imports nothing above it, the flow
names no backend, only ``io/`` and the level implementations touch the filesystem through
``os``, and no text a user reads points at a tracker number instead of saying what a thing is."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "stratastore"
MAX_LINES = 500
MAX_ROOT_MODULES = 8


def _modules(under: Path) -> list[Path]:
    return sorted(p for p in under.rglob("*.py") if "format_spec" not in p.parts)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of its code (lazy imports included)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_no_package_module_is_over_500_lines() -> None:
    long = {
        _rel(p): n for p in _modules(PACKAGE) if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"split these modules by concept: {long}"


def test_the_package_root_holds_at_most_8_modules() -> None:
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, root


def test_the_level_seam_imports_only_format_io_and_the_kernels() -> None:
    allowed = ("stratastore.format", "stratastore.io", "stratastore.errors", "stratastore.levels")
    bad: dict[str, list[str]] = {}
    for p in _modules(PACKAGE / "levels"):
        for m in _imports(p):
            if m.startswith("stratastore") and not m.startswith(allowed):
                bad.setdefault(_rel(p), []).append(m)
    assert not bad, bad


def test_the_flow_names_no_backend() -> None:
    backends = ("stratastore.levels.local", "stratastore.levels.redis", "stratastore.levels.memory")
    bad = {
        _rel(p): sorted(m for m in _imports(p) if m.startswith(backends))
        for p in _modules(PACKAGE / "tiers")
    }
    assert not {k: v for k, v in bad.items() if v}, bad


def test_os_is_called_only_by_io_and_the_level_implementations() -> None:
    allowed = ("stratastore/io/", "stratastore/levels/local/", "stratastore/levels/redis/")
    uses = re.compile(r"\bos\.[a-z_]|^\s*import os\b|^\s*from os\b", re.M)
    bad = [
        _rel(p)
        for p in _modules(PACKAGE)
        if not _rel(p).startswith(allowed) and uses.search(p.read_text())
    ]
    assert not bad, bad


_TRACKER = re.compile(r"\b(issues?|seeds?|review)\s+#?\d+", re.I)


def _user_text() -> list[Path]:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    spec = [PACKAGE / "format_spec" / "SPEC.md", PACKAGE / "format_spec" / "FSCK.md"]
    return [*_modules(PACKAGE), *_modules(ROOT / "strata_harness"), *docs, *spec]


def test_no_text_a_user_reads_cites_a_tracker_number() -> None:
    hits = [
        f"{_rel(p)}:{i}: {line.strip()}"
        for p in _user_text()
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if _TRACKER.search(line)
    ]
    assert not hits, "\n".join(hits[:40])


def test_no_help_text_cites_a_tracker_number() -> None:
    from stratastore.cli import build_parser

    parser = build_parser()
    texts = [parser.format_help()]
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        for sub in getattr(action, "choices", {}).values():
            texts.append(sub.format_help())
            nested = sub._subparsers._group_actions if sub._subparsers else ()
            for inner in nested:
                texts.extend(s.format_help() for s in getattr(inner, "choices", {}).values())
    assert len(texts) > 5
    hits = [t for t in texts if _TRACKER.search(t)]
    assert not hits, hits[:3]


@pytest.mark.parametrize("word", ["review", "seed", "issue"])
def test_no_test_is_named_after_a_review_round(word: str) -> None:
    named = [
        _rel(p)
        for p in (ROOT / "tests").rglob("*")
        if word in p.name.lower() and "__pycache__" not in p.parts
    ]
    assert not named, named


def test_an_engine_importing_the_library_loads_no_operator_tool_or_harness() -> None:
    code = (
        "import sys, stratastore\n"
        "print(sorted(m for m in sys.modules if m.startswith(("
        "'strata_harness', 'stratastore.ops', 'stratastore.cli'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
