"""``StrataConnector`` in vLLM's OpenAI-compatible server, started as the docs say
(``tests/vllm/server.py``), talked to by the ``openai`` client, stopped as docker and systemd
stop it (SIGTERM to the server's pid, vLLM's default shutdown), on a random Llama made at test
time, greedy decoding, token ids as prompts.

Eight conversations share a 256-token system prompt; turn 1 is 600 tokens, each reply 16, turn
2 the turn-1 prompt, its reply and 48 new tokens; each turn's eight requests are in flight at
once. The reference is one server without the connector serving both turns. Against it:

* server A with the connector serves turn 1, the same tokens; once the last reply is a second
  old and ``/metrics`` counts every park durable (how many were at one second is printed) it
  gets SIGTERM (vLLM's default stop, which kills its worker at once), and exits; the store it
  left checks clean (``strata fsck --deep``: no error, no temp file);
* server B, a fresh process on the same store, serves turn 2: the same tokens, every
  conversation's whole turn 1 back without computing it (in 16-token store pages), and
  vLLM's own ``/metrics`` and the connector's series say where the tokens came from; started
  with the docs' ``--shutdown-timeout 30`` and stopped as soon as its replies are in, it exits
  after every park is durable and leaves a store that checks as A's did;
* a server killed (SIGKILL, its whole group) after turn 1: the store checks without an error and
  the next server serves turn 2 with the same tokens.

Counts and seconds are printed (``-s``) for docs/engine.md. The clock only makes the spec'd
one-second wait and bounds the waits for signals (``/health``, ``/metrics``' park count); no
assertion is on a time.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.fsck_cli import fsck_deep
from tests.vllm.models import make_llama
from tests.vllm.server import Reply, Server, complete_all

SYSTEM = 256  #: tokens of the system prompt every conversation opens with
OWN = 344  #: a conversation's own turn-1 tokens (turn 1: 600 tokens)
NEW = 48  #: turn 2's new tokens
REPLY = 16
N_CONVS = 8
PAGE = 16  #: tokens of a store page
SETTLED_S = 1.0  #: a reply at least this old when SIGTERM comes is one the store must keep
PARKS_S = 120.0  #: the longest a server is given to report its parks durable
STRATA_COUNTERS = (
    "loads",
    "tokens_loaded",
    "load_shortfalls",
    "parks",
    "parks_dropped",
    "tokens_parked",
    "bytes",
)
STRATA_HISTOGRAMS = ("load_seconds", "park_seconds")


def conversations() -> list[tuple[list[int], list[int]]]:
    """Eight conversations: (turn 1 = system prompt + own tokens, turn 2's new tokens)."""
    rng = np.random.default_rng(11)
    system = rng.integers(3, 1000, SYSTEM).tolist()
    return [
        (system + rng.integers(3, 1000, OWN).tolist(), rng.integers(3, 1000, NEW).tolist())
        for _ in range(N_CONVS)
    ]


def turn_two(replies: list[Reply]) -> list[list[int]]:
    """Each turn-2 prompt: the turn-1 prompt, its reply and the new tokens."""
    return [
        one + reply.tokens + two for (one, two), reply in zip(conversations(), replies, strict=True)
    ]


Metrics = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def metric_families(text: str) -> set[str]:
    """The families ``/metrics`` declares (a counter's without ``_total``), samples or none:
    a labelled counter nothing has counted yet has no sample."""
    from prometheus_client.parser import text_string_to_metric_families

    return {family.name for family in text_string_to_metric_families(text)}


def parse_metrics(text: str) -> Metrics:
    """Every sample of ``/metrics`` by (sample name, labels other than vLLM's own
    ``model_name`` and ``engine``), summed over those."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Metrics = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(
                sorted((k, v) for k, v in s.labels.items() if k not in ("model_name", "engine"))
            )
            out[(s.name, labels)] = out.get((s.name, labels), 0.0) + s.value
    return out


def sample(m: Metrics, name: str, **labels: str) -> float:
    """A sample's value summed over the labels not named; 0 where there is none."""
    return sum(
        v for (n, ls), v in m.items() if n == name and all((k, labels[k]) in ls for k in labels)
    )


def strata_excerpt(text: str) -> str:
    """The connector's series, without histogram buckets and creation times."""
    return "\n".join(
        line
        for line in text.splitlines()
        if line.startswith("vllm:strata_")
        and not any(s in line.split("{")[0] for s in ("_bucket", "_created"))
    )


def diverged(got: list[Reply], want: list[Reply]) -> list[tuple[int, int | None, int]]:
    """(conversation, cached tokens, first token that differs) for each reply not the
    reference's."""
    return [
        (c, g.cached_tokens, first_difference(g.tokens, w.tokens))
        for c, (g, w) in enumerate(zip(got, want, strict=True))
        if g.tokens != w.tokens
    ]


def first_difference(a: list[int], b: list[int]) -> int:
    """The index of the first token where ``a`` and ``b`` differ."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


@dataclass
class Served:
    replies: list[Reply]
    server: Server


def serve(
    model: Path,
    tmp: Path,
    name: str,
    store: Path | None,
    prompts: list[list[int]],
    extra: tuple[str, ...] = (),
) -> Served:
    """Start a server, send ``prompts`` all at once, keep it running (the caller stops it)."""
    server = Server(model, tmp / f"{name}.log", store, extra)
    server.start()
    sent = time.monotonic()
    try:
        replies = complete_all(server.base_url, prompts, REPLY)
    except BaseException:
        server.kill()
        raise
    took = time.monotonic() - sent
    cached = [r.cached_tokens for r in replies]
    print(
        f"{name}: started in {server.start_seconds:.1f} s; {len(prompts)} requests in "
        f"{took:.2f} s; prompt tokens {[r.prompt_tokens for r in replies]}; cached {cached}"
    )
    return Served(replies, server)


def sigterm(server: Server, name: str) -> None:
    server.stop(signal.SIGTERM)
    print(
        f"{name}: SIGTERM -> exit {server.proc.returncode if server.proc else None} in "
        f"{server.stop_seconds:.2f} s (by itself: {server.exited_by_itself}; "
        f"left of its group: {server.left_after_exit})"
    )


def parks_durable(text: str) -> int:
    """``vllm:strata_parks_total`` of a ``/metrics`` text, over its engines."""
    return int(sample(parse_metrics(text), "vllm:strata_parks_total"))


def settle_then_sigterm(served: Served, name: str, parks: int) -> tuple[str, float, int]:
    """SIGTERM once the last reply reached its client ``SETTLED_S`` ago and ``/metrics`` counts
    ``parks`` durable (it waits for that signal, ``PARKS_S`` at most): nothing is in flight
    when vLLM's default stop kills its worker. Returns ``/metrics`` just before, the seconds
    from that reply to SIGTERM, and the parks durable ``SETTLED_S`` after it (printed: the
    docs' figure)."""
    last = max(r.finished for r in served.replies)
    while time.monotonic() - last < SETTLED_S:
        time.sleep(SETTLED_S - (time.monotonic() - last))
    at_settled = parks_durable(served.server.metrics())
    text = served.server.metrics()
    while parks_durable(text) < parks and time.monotonic() - last < PARKS_S:
        time.sleep(0.1)  # the next poll of the signal, not a wait for it
        text = served.server.metrics()
    waited = time.monotonic() - last
    print(
        f"{name}: {at_settled} of {parks} parks durable {SETTLED_S:.0f} s after the last reply, "
        f"{parks_durable(text)} at SIGTERM ({waited:.2f} s after it)"
    )
    sigterm(served.server, name)
    return text, waited, at_settled


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_llama(tmp_path_factory.mktemp("model") / "llama")


@pytest.fixture(scope="module")
def reference(model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Reply]]:
    """Both turns in one server without the connector: vLLM's own prefix cache."""
    tmp = tmp_path_factory.mktemp("ref")
    first = serve(model, tmp, "reference turn 1", None, [one for one, _ in conversations()])
    try:
        second = complete_all(first.server.base_url, turn_two(first.replies), REPLY)
        print(f"reference turn 2: cached {[r.cached_tokens for r in second]}")
        sigterm(first.server, "reference")
    finally:
        first.server.kill()
    return {"turn1": first.replies, "turn2": second}


@dataclass
class Stopped:
    store: Path
    replies: list[Reply]
    server: Server
    waited: float  #: seconds from the last reply's arrival to SIGTERM
    at_settled: int  #: parks durable SETTLED_S after the last reply
    fsck: subprocess.CompletedProcess[str]  #: ``strata fsck --deep`` right after the stop

    @property
    def orphans(self) -> set[str]:
        """The temp files of writes the stop interrupted (fsck's ``ORPHAN_TEMP``)."""
        return orphans(self.fsck.stdout + self.fsck.stderr)


@pytest.fixture(scope="module")
def server_a(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stopped]:
    """Turn 1 on server A with the connector on a fresh store; SIGTERM (vLLM's default stop)
    once the last reply is a second old and every request's two parks (its computed prompt,
    then its reply) are durable."""
    tmp = tmp_path_factory.mktemp("a")
    store = tmp / "store"
    a = serve(model, tmp, "A turn 1", store, [one for one, _ in conversations()])
    try:
        text, waited, at_settled = settle_then_sigterm(a, "A", 2 * N_CONVS)
        print("A's strata series at SIGTERM:\n" + strata_excerpt(text))
        yield Stopped(store, a.replies, a.server, waited, at_settled, fsck_deep(store))
    finally:
        a.server.kill()


@dataclass
class Restarted:
    replies: list[Reply]
    prompts: list[list[int]]
    metrics_text: str
    metrics: Metrics
    server: Server


@pytest.fixture(scope="module")
def server_b(
    model: Path, server_a: Stopped, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Restarted]:
    """Turn 2 on server B, a fresh process on A's store, with the docs' ``--shutdown-timeout
    30``; SIGTERM as soon as the replies are in (its ``/metrics`` just before): the worker's
    shutdown waits for the parks handed over."""
    tmp = tmp_path_factory.mktemp("b")
    prompts = turn_two(server_a.replies)
    b = serve(model, tmp, "B turn 2", server_a.store, prompts, ("--shutdown-timeout", "30"))
    try:
        text = b.server.metrics()
        sigterm(b.server, "B (--shutdown-timeout 30)")
        yield Restarted(b.replies, prompts, text, parse_metrics(text), b.server)
    finally:
        b.server.kill()


def test_turn_one_on_a_server_with_the_connector_is_vllms_own(
    reference: dict[str, list[Reply]], server_a: Stopped
) -> None:
    assert all(len(r.tokens) == REPLY for r in server_a.replies)
    off = diverged(server_a.replies, reference["turn1"])
    assert off == [], f"(conversation, cached tokens, first token off): {off}"
    # the replies differ: "the same tokens" says something
    for turn in ("turn1", "turn2"):
        assert len({tuple(r.tokens) for r in reference[turn]}) == N_CONVS, turn


def test_sigterm_stops_the_server(server_a: Stopped) -> None:
    assert server_a.waited >= SETTLED_S
    assert server_a.server.exited_by_itself, server_a.server.log()[-4000:]


def orphans(fsck_out: str) -> set[str]:
    """The temp files of interrupted writes ``strata fsck`` names."""
    return {
        line.split("ORPHAN_TEMP: ", 1)[1].split(":")[0]
        for line in fsck_out.splitlines()
        if "ORPHAN_TEMP: " in line
    }


def test_the_store_a_sigterm_left_checks_clean(server_a: Stopped) -> None:
    got = server_a.fsck
    assert got.returncode == 0, got.stdout + got.stderr
    assert server_a.orphans == set(), got.stdout  # nothing was in flight: no temp file


def test_turn_two_on_a_fresh_server_is_vllms_own(
    reference: dict[str, list[Reply]], server_b: Restarted
) -> None:
    off = diverged(server_b.replies, reference["turn2"])
    assert off == [], f"(conversation, cached tokens, first token off): {off}"


def test_turn_two_gets_every_whole_turn_one_back(server_b: Restarted) -> None:
    # the turn-1 prompt and the reply's K/V (all but its last token's), in whole store pages
    whole = [(len(one) + REPLY - 1) // PAGE * PAGE for one, _ in conversations()]
    short = [
        (c, r.cached_tokens, n)
        for c, (n, r) in enumerate(zip(whole, server_b.replies, strict=True))
        if (r.cached_tokens or 0) < n
    ]
    assert short == [], f"(conversation, cached tokens, turn 1 in pages): {short}"


def test_vllms_metrics_say_the_store_served_turn_two(server_b: Restarted) -> None:
    m = server_b.metrics
    by_source = {
        s: sample(m, "vllm:prompt_tokens_by_source_total", source=s)
        for s in ("local_compute", "local_cache_hit", "external_kv_transfer")
    }
    not_vllms = by_source["local_compute"] + by_source["external_kv_transfer"]
    share = by_source["external_kv_transfer"] / not_vllms if not_vllms else 0.0
    print(
        f"B prompt tokens by source {by_source}: the store served {share:.1%} of the turn-2 "
        f"prompt tokens vLLM's own prefix cache did not hold"
    )
    print("B's strata series:\n" + strata_excerpt(server_b.metrics_text))
    assert by_source["external_kv_transfer"] > 0, by_source
    assert share >= 0.80, by_source


def test_the_connectors_metrics_count_its_loads(server_b: Restarted) -> None:
    m = server_b.metrics
    got = {
        "loads": sample(m, "vllm:strata_loads_total"),
        "tokens_loaded": sample(m, "vllm:strata_tokens_loaded_total"),
        "load_shortfalls": sample(m, "vllm:strata_load_shortfalls_total"),
        "load_seconds_count": sample(m, "vllm:strata_load_seconds_count"),
        "bytes_loaded": sample(m, "vllm:strata_bytes_total", direction="load"),
    }
    print(f"B strata: {got}")
    declared = metric_families(server_b.metrics_text)
    missing = [
        f"vllm:strata_{name}"
        for name in (*STRATA_COUNTERS, *STRATA_HISTOGRAMS)
        if f"vllm:strata_{name}" not in declared
    ]
    assert missing == [], f"series missing from /metrics: {missing}"
    assert got["loads"] == N_CONVS, got
    assert got["tokens_loaded"] > 0, got
    assert got["load_shortfalls"] == 0, got
    assert got["load_seconds_count"] == N_CONVS, got


def test_a_stop_with_a_shutdown_timeout_waits_for_every_park(
    server_a: Stopped, server_b: Restarted
) -> None:
    assert server_b.server.exited_by_itself, server_b.server.log()[-4000:]
    got = fsck_deep(server_a.store)
    assert got.returncode == 0, got.stdout + got.stderr
    assert orphans(got.stdout + got.stderr) <= server_a.orphans  # none of B's writes cut
    # each request parked its reply at finish (its prompt, mostly restored, was not copied in
    # the step): all durable before the exit
    line = re.search(
        r"StrataConnector worker: .*; (\d+) parks durable, \d+ tokens, (\d+) not kept",
        server_b.server.log(),
    )
    assert line is not None, server_b.server.log()[-4000:]
    assert (int(line[1]), int(line[2])) == (N_CONVS, 0), line[0]


def test_a_killed_server_leaves_a_store_the_next_one_serves(
    model: Path, reference: dict[str, list[Reply]], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    killed = serve(model, tmp_path, "killed turn 1", store, [one for one, _ in conversations()])
    killed.server.kill()  # the whole group, its parks in flight
    print(f"killed: exit {killed.server.proc.returncode if killed.server.proc else None}")
    got = fsck_deep(store)
    assert got.returncode == 0, got.stdout + got.stderr  # warnings allowed: a temp file
    off = diverged(killed.replies, reference["turn1"])
    assert off == [], f"(conversation, cached tokens, first token off): {off}"
    after = serve(model, tmp_path, "after the kill, turn 2", store, turn_two(killed.replies))
    try:
        sigterm(after.server, "after the kill")
    finally:
        after.server.kill()
    off = diverged(after.replies, reference["turn2"])
    assert off == [], f"(conversation, cached tokens, first token off): {off}"
