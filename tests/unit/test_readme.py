"""The README as a newcomer reads it: short, its engine example runs as printed and prints what
the text after it says, and every page it links to is there."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def test_the_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) <= 250


def test_the_quick_start_is_the_two_commands() -> None:
    first = _blocks(README.read_text(), "sh")[0]
    assert [line.split("#")[0].strip() for line in first.splitlines()] == ["make demo", "make test"]


def test_the_engine_example_runs_as_printed(tmp_path: Path) -> None:
    (code,) = _blocks(README.read_text(), "python")
    assert len(code.splitlines()) <= 25
    got = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert got.returncode == 0, got.stderr
    lines = got.stdout.splitlines()
    assert lines[0].startswith("ParkReport(where='ram'")
    assert lines[1] == "('disk', 64)"
    assert lines[2].startswith("Restored(source='disk', tokens=64, conv_id='chat-1'")


def test_every_linked_page_is_there() -> None:
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    missing = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            if not (page.parent / target).exists():
                missing.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not missing, missing


def test_docs_has_a_page_for_each_topic() -> None:
    for name in ("configuration", "operations", "engine", "performance", "remote", "design", "cli"):
        assert (ROOT / "docs" / f"{name}.md").is_file(), name


def test_every_config_example_in_the_docs_loads() -> None:
    import tomllib

    from stratastore.config import StoreConfig

    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    blocks = [(p.name, b) for p in pages for b in _blocks(p.read_text(), "toml")]
    assert len(blocks) >= 3
    for name, block in blocks:
        try:
            StoreConfig.from_mapping(tomllib.loads(block))
        except Exception as e:
            raise AssertionError(f"a TOML example of {name} does not load: {e}") from e
