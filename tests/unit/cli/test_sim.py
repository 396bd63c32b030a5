"""``strata sim`` reproduces the reference tables with the real policy code."""

from __future__ import annotations

import json

import pytest

from stratastore.cli import main

AGENT = [
    "sim",
    "agent-edit",
    "--system-tokens",
    "9525",
    "--turns",
    "200",
    "--turn-tokens",
    "1000",
    "--checkpoints",
    "6",
    "--json",
]


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> object:
    assert main(list(args)) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("policy", "edit_back", "kept", "reread"),
    [
        ("lru", 6000, [0, 1000, 2000, 3000, 4000, 200000], 200000),
        ("lru", 42000, [0, 1000, 2000, 3000, 4000, 200000], 200000),
        ("spread", 6000, [0, 1000, 3000, 8000, 43000, 200000], 8000),
        ("spread", 42000, [0, 1000, 3000, 8000, 43000, 200000], 43000),
    ],
)
def test_edit_table(
    capsys: pytest.CaptureFixture[str], policy: str, edit_back: int, kept: list[int], reread: int
) -> None:
    doc = run_json(capsys, *AGENT, "--edit-back", str(edit_back), "--policy", policy)
    assert isinstance(doc, dict)
    assert doc["kept"] == kept and doc["reread_tokens"] == reread
    assert doc["resumed_at"] == doc["prompt_tokens"] - reread


def test_attention_layout_resumes_on_pages(capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(
        capsys, *AGENT, "--edit-back", "6000", "--policy", "lru", "--layout", "attention"
    )
    assert isinstance(doc, dict)
    assert doc["resumed_via"] == "page" and doc["reread_tokens"] == 6000


def test_truncate_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    on, off = run_json(capsys, "sim", "park-truncate", "--json")  # type: ignore[misc]
    assert on["truncate"] and on["steps"][1]["shrunk"] == [["A", 32768]]
    assert on["restored_tokens"] == 32768 and on["counters"]["evictions"] == 0
    assert not off["truncate"] and off["steps"][1]["evicted"] == ["A"]
    assert off["restored_tokens"] == 0 and off["reread_tokens"] == 62000


def test_edit_sweep_orders(capsys: pytest.CaptureFixture[str]) -> None:
    rows = run_json(capsys, "sim", "edit-sweep", "--json")
    assert isinstance(rows, list) and len(rows) == 11
    for r in rows:
        assert r["page"] <= r["spread"] and r["page"] <= r["lru"]


@pytest.mark.parametrize(
    "args",
    [
        ["sim", "agent-edit", "--edit-back", "999999"],
        ["sim", "agent-edit", "--turns", "0"],
        ["sim", "park-truncate", "--others", "x"],
        ["sim"],
    ],
)
def test_bad_sim_arguments(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ei:
        if main(args) == 2:
            raise SystemExit(2)
    assert ei.value.code == 2
    assert "Traceback" not in capsys.readouterr().err
