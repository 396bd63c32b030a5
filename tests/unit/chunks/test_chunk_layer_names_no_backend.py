"""The chunk layer reaches its levels through the registry and the level protocol only, as the
flow does: no module of ``stratastore/chunks/`` or of the LMCache plugin imports a backend
(``levels.local``, ``levels.redis``, ``levels.memory``) or calls ``os``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
MODULES = sorted(
    [
        *(ROOT / "stratastore" / "chunks").glob("*.py"),
        *(ROOT / "stratastore").glob("adapters/lmcache*.py"),
    ]
)
BACKENDS = ("stratastore.levels.local", "stratastore.levels.redis", "stratastore.levels.memory")


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_the_chunk_layer_and_the_lmcache_plugin_import_no_backend() -> None:
    assert len(MODULES) >= 8
    bad = {p.name: sorted(m for m in _imports(p) if m.startswith(BACKENDS)) for p in MODULES}
    assert not {k: v for k, v in bad.items() if v}, bad


def test_the_chunk_layer_never_calls_os() -> None:
    uses = re.compile(r"\bos\.[a-z_]|^\s*import os\b|^\s*from os\b", re.M)
    assert not [p.name for p in MODULES if uses.search(p.read_text())]
