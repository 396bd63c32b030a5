"""How much of a conversation survives a stop of vLLM's OpenAI server, measured.

    .venv-vllm/bin/python tools/vllm_stop_probe.py [--rounds 3] [--dir DIR]

Each round, on a fresh store: a server with ``StrataConnector`` (started as docs/engine.md
says, vLLM's default ``--shutdown-timeout 0``) serves turn 1 of eight conversations (a shared
256-token system prompt, 600-token prompts, 16-token replies, all eight at once through the
``openai`` client) and gets SIGTERM one second after the last reply reached its client; a new
server serves turn 2 (48 new tokens). Printed per round: the conversations whose whole turn-1
prompt, and whose whole turn 1 (prompt and reply), came back (``cached_tokens``, in 16-token
pages), the share of the turn-2 prompt tokens vLLM's own prefix cache did not hold that the
store served (vLLM's ``prompt_tokens_by_source``), and what ``strata fsck --deep`` found. Then
the seconds a SIGTERM takes with ``--shutdown-timeout 30``, with the connector and without.
Nothing is downloaded (the model is a random Llama made under DIR)."""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fsck_cli import fsck_deep  # noqa: E402
from tests.vllm.models import make_llama  # noqa: E402
from tests.vllm.server import Server, complete_all  # noqa: E402
from tests.vllm.test_server import (  # noqa: E402
    PAGE,
    REPLY,
    conversations,
    parse_metrics,
    sample,
    turn_two,
)

SETTLED_S = 1.0


def one_round(model: Path, dir: Path) -> str:
    store = dir / "store"
    shutil.rmtree(store, ignore_errors=True)  # each round on a fresh store
    first = Server(model, dir / "turn1.log", store)
    first.start()
    try:
        replies = complete_all(first.base_url, [one for one, _ in conversations()], REPLY)
        last = max(r.finished for r in replies)
        while time.monotonic() - last < SETTLED_S:
            time.sleep(SETTLED_S - (time.monotonic() - last))
        first.stop(signal.SIGTERM)
    finally:
        first.kill()
    found = fsck_deep(store)
    second = Server(model, dir / "turn2.log", store)
    second.start()
    try:
        again = complete_all(second.base_url, turn_two(replies), REPLY)
        m = parse_metrics(second.metrics())
        second.stop(signal.SIGTERM)
    finally:
        second.kill()
    prompts = [len(one) // PAGE * PAGE for one, _ in conversations()]
    wholes = [(len(one) + REPLY - 1) // PAGE * PAGE for one, _ in conversations()]
    cached = [r.cached_tokens or 0 for r in again]
    by = {
        s: sample(m, "vllm:prompt_tokens_by_source_total", source=s)
        for s in ("local_compute", "external_kv_transfer")
    }
    share = by["external_kv_transfer"] / max(1.0, sum(by.values()))
    findings = [
        ln.split(":")[1].strip()
        for ln in found.stdout.splitlines()
        if ln.startswith(("error:", "warning:", "info:"))
    ]
    return (
        f"whole turn-1 prompt {sum(c >= p for c, p in zip(cached, prompts, strict=True))}/8, "
        f"whole turn 1 {sum(c >= w for c, w in zip(cached, wholes, strict=True))}/8, "
        f"store's share {share:.1%}, fsck exit {found.returncode} {findings or 'clean'}"
    )


def stop_seconds(model: Path, dir: Path, store: Path | None) -> float:
    server = Server(model, dir / "stop.log", store, ("--shutdown-timeout", "30"))
    server.start()
    try:
        complete_all(server.base_url, [one for one, _ in conversations()], REPLY)
        return server.stop(signal.SIGTERM)
    finally:
        server.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="strata-stop-probe-"))
    model = make_llama(base / "model")
    for i in range(args.rounds):
        (base / f"round{i}").mkdir(parents=True, exist_ok=True)
        print(
            f"round {i + 1}: SIGTERM {SETTLED_S:.0f} s after the last reply: "
            + one_round(model, base / f"round{i}"),
            flush=True,
        )
    shutil.rmtree(base / "stop-store", ignore_errors=True)
    with_ = stop_seconds(model, base, base / "stop-store")
    without = stop_seconds(model, base, None)
    print(
        f"SIGTERM with --shutdown-timeout 30: {with_:.2f} s with the connector, "
        f"{without:.2f} s without"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
