"""Every parser's fuzz target survives its committed corpus and a bounded atheris run."""

from __future__ import annotations

import importlib.util
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz.targets import TARGETS, run_one
from tests.reliability import counts
from tests.reliability.counts import FUZZ_FLOOR, FUZZ_PARSERS, SCALE

ROOT = Path(__file__).resolve().parents[3]
CORPUS = ROOT / "fuzz" / "corpus"
RUNS = FUZZ_FLOOR * SCALE  #: 10,000 executions per parser a CI run (make soak: 10x)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_corpus_replays_cleanly(target: str) -> None:
    files = sorted((CORPUS / target).iterdir())
    assert files, f"no corpus for {target}"
    for f in files:
        run_one(target, f.read_bytes())


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_bounded_atheris_run(target: str, tmp_path: Path) -> None:
    if importlib.util.find_spec("atheris") is None:
        pytest.skip("atheris is not installed (pip install -e '.[dev]')")
    corpus = tmp_path / target
    shutil.copytree(CORPUS / target, corpus)  # atheris adds to the corpus it is given
    # libFuzzer's RSS figure is the process's peak, which Linux carries over an exec from the
    # process that forked it (here the test run, whose peak is its largest test's): the 2 GiB
    # OOM limit is counted on top of that, so a fuzz input that grows memory still fails
    inherited = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "fuzz" / "run.py"),
            target,
            f"-runs={RUNS}",
            "-max_len=4096",
            "-seed=1",
            f"-rss_limit_mb={inherited + 2048}",
            f"-artifact_prefix={tmp_path}/",
            str(corpus),
        ],  # a crash's input: not in the tree
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"Done {RUNS} runs" in r.stderr
    counts.add(f"fuzz {target}", RUNS)


def test_every_parser_has_a_target() -> None:
    assert set(TARGETS) == set(FUZZ_PARSERS)
