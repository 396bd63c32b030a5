"""llama-cpp-python's OpenAI-compatible server with its cache on stratastore
(``python -m stratastore.adapters.llamacpp.server``), driven by the ``openai`` client as its
users drive it: four conversations of two turns, the server stopped with SIGTERM and started
again between the turns. The replies are those of the same server without a cache; the second
turns are restored from the store (its log says so, and its counters when it stops); the store
is one ``strata fsck --deep`` finds clean after the stop and after a kill -9, and a server
started after the kill -9 is served from it. A recurrent model's second turn is served from a
checkpoint of its first."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.fsck_cli import fsck_deep

ROOT = Path(__file__).resolve().parents[2]
STARTUP_S = 180.0  #: how long a server may take to listen before the test calls it hung
N_CTX = 2048

TOPICS = ["rivers", "bridges", "gardens", "harbours"]
#: a server stopped by SIGTERM: uvicorn shuts down, then re-raises the signal (0.29 and later)
STOPPED = (0, -signal.SIGTERM)
CLOSED = "stratastore: strata: park="  #: the store's INFO line, logged as it closes


@pytest.fixture(scope="module", autouse=True)
def _server_extra() -> None:
    missing = [m for m in ("uvicorn", "fastapi", "sse_starlette", "openai") if _absent(m)]
    if missing:
        msg = f"{', '.join(missing)} not installed here: `make test-llamacpp` installs them"
        if os.environ.get("STRATA_REQUIRE_LLAMACPP") == "1":
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)


def _absent(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A server process, its port and its log."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.port = _free_port()
        self.log = log
        self._out = open(log, "ab")  # noqa: SIM115  (closed in stop)
        self.proc = subprocess.Popen(
            [*argv, "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", str(N_CTX)],
            cwd=ROOT,
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )
        self._wait_listening()

    def _wait_listening(self) -> None:
        import urllib.request

        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited at start:\n{self.text()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/models", timeout=5):
                    return
            except OSError:
                time.sleep(0.5)
        self.kill()
        raise AssertionError(f"the server did not listen within {STARTUP_S} s:\n{self.text()}")

    def client(self) -> Any:
        from openai import OpenAI

        return OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="unused", timeout=120)

    def text(self) -> str:
        if not self._out.closed:
            self._out.flush()
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=120)
        finally:
            self._out.close()
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=60)
        self._out.close()


@contextmanager
def serving(argv: list[str], log: Path) -> Iterator[Server]:
    server = Server(argv, log)
    try:
        yield server
    finally:
        if server.proc.poll() is None:
            server.kill()


def strata_server(model: Path, store: Path) -> list[str]:
    return [
        sys.executable, "-m", "stratastore.adapters.llamacpp.server",
        "--model", str(model), "--strata_store", str(store), "--strata_store_mib", "256",
    ]  # fmt: skip


def plain_server(model: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(model),
        "--logits_all",
        "false",
    ]


def first_turn(i: int) -> list[dict[str, str]]:
    topic = TOPICS[i]
    facts = " ".join(f"Note {k} about {topic}: item {k * 7 + i} is kept." for k in range(40))
    return [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": f"Here are my notes on {topic}. {facts} Summarise them."},
    ]


def second_turn(i: int, reply: str) -> list[dict[str, str]]:
    return [
        *first_turn(i),
        {"role": "assistant", "content": reply},
        {"role": "user", "content": f"Now say which note on {TOPICS[i]} matters most."},
    ]


def ask(server: Server, messages: list[dict[str, str]]) -> str:
    out = server.client().chat.completions.create(
        model="local", messages=messages, max_tokens=12, temperature=0.0, seed=7
    )
    return str(out.choices[0].message.content)


def fsck_clean(store: Path) -> None:
    got = fsck_deep(store)
    assert got.returncode == 0, got.stdout + got.stderr


def test_two_turns_across_a_sigterm_restart_are_served_from_the_store(
    tiny: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    with serving(plain_server(tiny), tmp_path / "plain.log") as plain:
        want1 = [ask(plain, first_turn(i)) for i in range(4)]
        want2 = [ask(plain, second_turn(i, want1[i])) for i in range(4)]

    with serving(strata_server(tiny, store), tmp_path / "first.log") as first:
        got1 = [ask(first, first_turn(i)) for i in range(4)]
        assert first.stop(signal.SIGTERM) in STOPPED
    assert got1 == want1
    assert CLOSED in first.text()  # the store closed, its counters logged
    fsck_clean(store)

    with serving(strata_server(tiny, store), tmp_path / "second.log") as second:
        got2 = [ask(second, second_turn(i, got1[i])) for i in range(4)]
        log = second.text()
        assert got2 == want2
        restored = [line for line in log.splitlines() if "stratastore: restored" in line]
        assert len(restored) >= 4, log  # each second turn started from its first turn's state
        second.proc.send_signal(signal.SIGKILL)
        second.proc.wait(timeout=60)
        second.kill()
    fsck_clean(store)  # nothing acknowledged is half-written after a kill -9

    with serving(strata_server(tiny, store), tmp_path / "third.log") as third:
        assert ask(third, second_turn(0, got1[0])) == want2[0]
        assert "stratastore: restored" in third.text()
        assert third.stop(signal.SIGTERM) in STOPPED
    assert CLOSED in third.text()
    fsck_clean(store)


def test_a_recurrent_model_is_served_from_its_checkpoints_across_a_restart(
    mamba: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    with serving(plain_server(mamba), tmp_path / "plain.log") as plain:
        want1 = ask(plain, first_turn(1))
        want2 = ask(plain, second_turn(1, want1))
    with serving(strata_server(mamba, store), tmp_path / "first.log") as first:
        assert ask(first, first_turn(1)) == want1
        assert first.stop(signal.SIGTERM) in STOPPED
    fsck_clean(store)
    with serving(strata_server(mamba, store), tmp_path / "second.log") as second:
        assert ask(second, second_turn(1, want1)) == want2
        assert "stratastore: restored" in second.text()  # from a checkpoint of the first turn
        assert second.stop(signal.SIGTERM) in STOPPED
    fsck_clean(store)


def refused(argv: list[str], env: dict[str, str] | None = None) -> str:
    """Run the launcher with ``argv``, which it must refuse before it listens: its stderr."""
    got = subprocess.run(
        [*argv, "--port", str(_free_port())],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    assert got.returncode == 2, got.stderr
    assert "Traceback" not in got.stderr
    return got.stderr


@pytest.mark.parametrize(
    ("store", "said"),
    [
        ("a-file", "a file, not a directory"),
        ("", "--strata_store is empty"),
        ("missing.toml", "no such TOML file"),
        ("bad.toml", "no_such_setting"),
    ],
)
def test_a_bad_store_setting_is_an_error_line_and_status_2(
    tiny: Path, tmp_path: Path, store: str, said: str
) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    (tmp_path / "bad.toml").write_text("no_such_setting = 1\n")
    spec = str(tmp_path / store) if store else ""
    launcher = [sys.executable, "-m", "stratastore.adapters.llamacpp.server"]
    err = refused([*launcher, "--model", str(tiny), "--strata_store", spec])
    assert said in err and err.count("error:") == 1


def test_a_model_the_adapter_cannot_serve_is_an_error_line_and_status_2(
    tiny: Path, tmp_path: Path
) -> None:
    err = refused([*strata_server(tiny, tmp_path / "store"), "--logits_all", "true"])
    assert "logits_all" in err


def test_a_config_file_of_several_models_is_refused(tiny: Path, tmp_path: Path) -> None:
    config = tmp_path / "models.json"
    config.write_text(json.dumps({"models": [{"model": str(tiny)}]}))
    err = refused(strata_server(tiny, tmp_path / "store"), {"CONFIG_FILE": str(config)})
    assert "one launcher a model" in err
