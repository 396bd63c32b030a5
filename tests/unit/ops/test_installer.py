"""``strata init`` (the installer): 5 simulated machines x 5 model sizes x (``--yes``, or Enter at
every prompt) = 50 cases, each writing exactly the defaults (and ``--yes`` asking nothing; Enter
at the context size question, asked after the slots and the disk, keeps the model's); answers
change exactly what they answer; the file reads back."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stratastore import Store, StoreConfig
from stratastore.cli import main
from stratastore.errors import ConfigError
from stratastore.ops.installer import MODEL_SIZES, Machine, run_init, to_toml, write_config
from tests.conftest import tiny_fp

GIB = 1 << 30
MACHINES = [
    Machine(2 * GIB, 2),
    Machine(8 * GIB, 4),
    Machine(24 * GIB, 2),
    Machine(128 * GIB, 32),
    Machine(1024 * GIB, 192),
]


def no_disk_bench(path: str) -> tuple[float, float]:
    raise AssertionError("Enter at every prompt must not reach the disk bench")


@pytest.mark.parametrize("mode", ["yes", "enter"])
@pytest.mark.parametrize("size", sorted(MODEL_SIZES))
@pytest.mark.parametrize("machine", MACHINES, ids=[f"{m.free_ram // GIB}G" for m in MACHINES])
def test_yes_or_enter_writes_exactly_the_defaults(
    machine: Machine, size: str, mode: str, tmp_path: Path
) -> None:
    asked: list[str] = []

    def ask(question: str) -> str:
        asked.append(question)
        return ""  # Enter

    said: list[str] = []
    cfg = run_init(
        yes=mode == "yes",
        ask=ask,
        say=said.append,
        machine=machine,
        model_size=size if mode == "yes" else None,
        measure=no_disk_bench,
    )
    assert cfg == StoreConfig()
    if mode == "yes":
        assert asked == [] and said == []
    else:
        assert len(asked) == 6  # model, one-or-several, slots, RAM, disk, context size
        assert any(f"{machine.free_ram / GIB:.1f} GiB" in s for s in said)
        _, several, _, _, disk, context = asked
        assert "several" in several and "on disk" in disk  # the two questions, then the context
        model = MODEL_SIZES["8b"]  # Enter at the model question
        assert "context size" in context and f"the model's, {model.context:,}" in context
    out = tmp_path / "strata.toml"
    write_config(cfg, str(out))
    assert StoreConfig.from_toml(str(out)) == StoreConfig()
    assert out.read_text() == to_toml(StoreConfig())  # the same bytes in all 50 cases


def test_answers_change_what_they_answer(tmp_path: Path) -> None:
    answers = iter(
        [
            "70b",
            "one",
            "4096",
            "yes",
            str(tmp_path / "cold"),
            "2048",
            "yes",
            str(tmp_path / "warm"),
            "512",
            "32768",
        ]
    )
    measured: list[str] = []

    def measure(path: str) -> tuple[float, float]:
        measured.append(path)
        return 600.0, 2000.0

    cfg = run_init(
        yes=False,
        ask=lambda q: next(answers),
        say=lambda s: None,
        machine=MACHINES[2],
        measure=measure,
    )
    want = StoreConfig(
        slots=1,
        ram_mib=4096,
        cold_dir=str(tmp_path / "cold"),
        cold_mib=2048,
        warm_dir=str(tmp_path / "warm"),
        warm_mib=512,
        context_tokens=32768,
    )
    assert cfg == want
    assert measured == [str(tmp_path / "cold"), str(tmp_path / "warm")]
    path = tmp_path / "strata.toml"
    write_config(cfg, str(path))
    with Store.open(tiny_fp(), str(path)) as store:  # the Store reads what init wrote
        assert store.stats()["levels"]["cold"]["budget"] == 2048 << 20
    assert main(["--config", str(path), "fsck"]) == 0  # and so does every CLI command


def test_bad_answers_are_asked_again_and_nothing_is_overwritten(tmp_path: Path) -> None:
    answers = iter(["", "several", "lots", "-3", "3", "", "maybe", "no", "128k", ""])
    said: list[str] = []
    cfg = run_init(
        yes=False,
        ask=lambda q: next(answers),
        say=said.append,
        machine=MACHINES[0],
        measure=no_disk_bench,
    )
    assert cfg == StoreConfig(slots=3)
    assert any("not a whole number" in s for s in said) and any("at least 1" in s for s in said)
    assert any("'128k' is not a whole number" in s for s in said)  # the context, asked again
    path = tmp_path / "strata.toml"
    path.write_text("ram_mib = 1\n")
    with pytest.raises(ConfigError, match="--force"):
        write_config(cfg, str(path))
    assert path.read_text() == "ram_mib = 1\n"


def test_cli_init_yes_and_enter_at_every_prompt(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "stratastore.cli", "init"]
    a = subprocess.run(
        [*cmd, "--yes", "--output", str(tmp_path / "a.toml")],
        text=True,
        capture_output=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    b = subprocess.run(
        [*cmd, "--output", str(tmp_path / "b.toml")],
        input="\n" * 10,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert "the defaults" in a.stdout and "this machine" not in a.stdout
    assert (tmp_path / "a.toml").read_bytes() == (tmp_path / "b.toml").read_bytes()


@pytest.mark.parametrize("size", sorted(MODEL_SIZES))
def test_the_context_size_defaults_to_the_models_and_is_written(size: str, tmp_path: Path) -> None:
    asked: list[str] = []
    said: list[str] = []
    answers = iter(["", "", "", "", "16384"])  # Enter at the others: the defaults

    def ask(question: str) -> str:
        asked.append(question)
        return next(answers)

    cfg = run_init(
        yes=False,
        ask=ask,
        say=said.append,
        machine=MACHINES[3],
        model_size=size,
        measure=no_disk_bench,
    )
    assert cfg == StoreConfig(context_tokens=16384)
    assert f"the model's, {MODEL_SIZES[size].context:,}" in asked[-1]
    assert any(f"context is {MODEL_SIZES[size].context:,} tokens" in s for s in said)
    path = tmp_path / "strata.toml"
    write_config(cfg, str(path))
    assert "context_tokens = 16384" in path.read_text()
    assert StoreConfig.from_toml(str(path)).context_tokens == 16384


def test_cli_init_asks_the_context_size_after_the_two_questions(tmp_path: Path) -> None:
    out = tmp_path / "strata.toml"
    r = subprocess.run(
        [sys.executable, "-m", "stratastore.cli", "init", "--model-size", "70b"],
        input="\n\n\nno\n65536\n",  # several, slots, RAM, no disk, then the context size
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.index("on disk") < r.stdout.index("context size in tokens")
    assert "context_tokens=65536" in r.stdout
    assert StoreConfig.from_toml(str(out)) == StoreConfig(context_tokens=65536)
