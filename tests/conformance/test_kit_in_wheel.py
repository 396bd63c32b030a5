"""The conformance kit ships in the wheel: a wheel built from this checkout, installed into a
fresh virtual environment and run from a folder with no repository in it, holds every file of
format-spec/ (SPEC.md, FSCK.md, every golden vector) byte for byte; ``load_vectors()`` with no
argument returns every vector the repository has; ``strata conformance`` of a conforming store
exits 0 and cites a SPEC.md (and FSCK.md) that exist in the installed package."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from dataclasses import dataclass
from pathlib import Path

import pytest

from stratastore.testing import load_vectors
from stratastore.testing.vectors import kit_path

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "format-spec"
VECTORS = KIT / "vectors"
#: what setuptools reads to build the wheel (``project.readme`` included)
SOURCES = ("pyproject.toml", "README.md", "stratastore", "numba_kernels")


@dataclass(frozen=True)
class Installed:
    env: Path  # the fresh virtual environment holding only the wheel
    python: Path
    strata: Path
    away: Path  # a working directory with no repository in it or above it


def _builds_wheels_offline() -> bool:
    """setuptools builds wheels by itself from 70.1, before that with the ``wheel`` package."""
    major, minor = (int(x) for x in importlib.metadata.version("setuptools").split(".")[:2])
    return (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None


def _run(argv: list[str | Path], cwd: Path, timeout: float = 300) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**env, "PYTHONNOUSERSITE": "1"},
    )
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """Build the wheel from a copy of the sources (no build/ or egg-info of the checkout leaks
    in), install it alone into a plain venv, and make its dependencies importable from this
    interpreter's site-packages by a .pth path line: such a line adds the folder to sys.path
    without running the .pth files in it, so the checkout's editable install stays out."""
    base = tmp_path_factory.mktemp("kit-in-wheel")
    src, dist, env, away = base / "src", base / "dist", base / "env", base / "away"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, src / name)
    isolation = ["--no-build-isolation"] if _builds_wheels_offline() else []  # else: from PyPI
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", dist, src],
        cwd=base,
    )
    (wheel,) = dist.glob("stratastore-*.whl")
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            python,
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            wheel,
        ],
        cwd=base,
    )
    site = _run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=base
    ).strip()
    ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (Path(site) / "dependencies-of-the-test-run.pth").write_text("".join(f"{p}\n" for p in ours))
    away.mkdir()
    return Installed(env, python, env / "bin" / "strata", away)


def _digests(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _installed_kit(installed: Installed) -> Path:
    out = _run(
        [
            installed.python,
            "-c",
            "from stratastore.testing.vectors import kit_path; print(kit_path())",
        ],
        cwd=installed.away,
    )
    kit = Path(out.strip())
    assert kit.is_relative_to(installed.env), f"{kit} is not the installed package's"
    return kit


def test_load_vectors_defaults_to_the_kit_in_version_order() -> None:
    """In this checkout too: no argument means every folder of the shipped kit, which is the
    repository's format-spec/vectors, numbers compared as numbers; given explicitly, exactly the
    folders given, in their order."""
    assert Path(kit_path()).resolve() == KIT.resolve()
    folders = list(dict.fromkeys(v for v, _ in load_vectors()))
    assert folders == ["v1", "v1.1", "v1.1-errata1", "v1.2", *folders[4:]]
    assert load_vectors() == load_vectors(str(VECTORS), folders)
    assert list(dict.fromkeys(v for v, _ in load_vectors(VECTORS, ["v1.2", "v1"]))) == [
        "v1.2",
        "v1",
    ]
    with pytest.raises(FileNotFoundError):
        load_vectors(str(VECTORS), ["v0"])


@pytest.mark.slow
def test_the_wheel_holds_every_file_of_the_kit(installed: Installed) -> None:
    assert _digests(_installed_kit(installed)) == _digests(KIT.resolve())


@pytest.mark.slow
def test_load_vectors_without_arguments_returns_every_vector(installed: Installed) -> None:
    folders = [p.name for p in VECTORS.iterdir() if (p / "MANIFEST.json").is_file()]
    expected = [[v, e] for v, e in load_vectors(str(VECTORS), folders)]
    script = (
        "import json, stratastore; from stratastore.testing import load_vectors; "
        "print(json.dumps({'package': stratastore.__file__, 'vectors': load_vectors()}))"
    )
    doc = json.loads(_run([installed.python, "-c", script], cwd=installed.away))
    assert Path(doc["package"]).is_relative_to(installed.env), doc["package"]

    def key(x: object) -> str:
        return json.dumps(x, sort_keys=True)

    assert sorted(doc["vectors"], key=key) == sorted(expected, key=key)
    assert len({v for v, _ in doc["vectors"]}) == len(folders) >= 4


@pytest.mark.slow
def test_conformance_cites_the_installed_spec(installed: Installed) -> None:
    store = installed.away / "store"
    _run(
        [
            installed.python,
            "-c",
            """if True:
        import sys
        import numpy as np
        from stratastore import ModelFingerprint
        from stratastore.levels.local import SegmentStore
        fp = ModelFingerprint.create("kit/tiny", n_layers=2, n_kv_heads=2, head_dim=4,
                                     page_tokens=4)
        kv = np.random.default_rng(0).integers(0, 256, 8 * fp.token_bytes, dtype=np.uint8)
        with SegmentStore.open(sys.argv[1], fp) as s:
            s.put_kv(s.root_key, np.arange(8), kv, token_start=0)
        """,
            store,
        ],
        cwd=installed.away,
    )
    out = _run([installed.strata, "conformance", store], cwd=installed.away)
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith("conforms to "), out
    spec = Path(verdict.removeprefix("conforms to "))
    assert spec.is_relative_to(installed.env) and spec.name == "SPEC.md", spec
    assert spec.read_bytes() == (KIT / "SPEC.md").read_bytes()
    doc = json.loads(_run([installed.strata, "conformance", store, "--json"], cwd=installed.away))
    assert doc["conforms"] is True and doc["spec"] == str(spec)
    assert Path(doc["finding_ids"]).read_bytes() == (KIT / "FSCK.md").read_bytes()
