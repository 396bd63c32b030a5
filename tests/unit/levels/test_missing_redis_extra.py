"""Without the ``redis`` extra, a remote level is one clear line: ``Store.open`` raises a
:class:`~stratastore.ConfigError` naming ``pip install 'stratastore[redis]'``, and ``strata
fsck --remote`` prints it and exits 2, no traceback. Each runs in a process where ``import
redis`` fails, as it does where the extra is not installed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
NO_REDIS = "import sys; sys.modules['redis'] = None  # as without the extra\n"
FIX = "pip install 'stratastore[redis]'"


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", NO_REDIS + textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_store_open_with_a_remote_level_names_the_extra(tmp_path: Path) -> None:
    got = _run(f"""
        from stratastore import ConfigError, Store
        from tests.conftest import tiny_fp
        cfg = {{"ram_mib": 0, "park": "disk", "cold_dir": {str(tmp_path / "cold")!r},
               "cold_mib": 16, "remote_url": "redis://127.0.0.1:1/0", "remote_mib": 1}}
        try:
            Store.open(tiny_fp(), cfg)
        except ConfigError as e:
            print("ConfigError:", e)
        """)
    assert got.returncode == 0, got.stderr
    assert "ConfigError:" in got.stdout and FIX in got.stdout, got.stdout


def test_strata_fsck_remote_names_the_extra(tmp_path: Path) -> None:
    cfg = tmp_path / "strata.toml"
    cfg.write_text(
        f'cold_dir = "{tmp_path / "cold"}"\ncold_mib = 16\nremote_mib = 1\n'
        'remote_url = "redis://127.0.0.1:1/0"\n'
    )
    got = _run(f"""
        from stratastore.cli import main
        sys.exit(main(["--config", {str(cfg)!r}, "fsck", "--remote"]))
        """)
    assert got.returncode == 2, (got.stdout, got.stderr)
    assert "Traceback" not in got.stderr, got.stderr
    assert FIX in got.stderr and len(got.stderr.strip().splitlines()) == 1, got.stderr
