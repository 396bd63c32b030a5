"""``strata demo``'s llama.cpp phase (with the ``llamacpp`` extra): the agent-edit, park-truncate
and low-RAM episodes of ``strata sim`` served by llama.cpp through
:class:`~stratastore.adapters.llamacpp.LlamaCppStore`, on a random Llama written as GGUF
(:func:`~strata_harness.gguf_model.make_gguf`: 4 layers, 2 KV heads of 32, f16 K/V, 1 KiB a
token; nothing is downloaded), each scaled down and set beside what the simulation says at the
same sizes. After each restore llama.cpp replies (greedy), and the reply must be the one it
gives after evaluating the whole prompt. The context holds one conversation at a time
(``Llama`` evaluates sequence 0): a request for another conversation parks the one it held, as
a slot reused.

* **the 200-turn edit**: a system prompt of 160 tokens and 200 turns of 16, parked after each
  turn (the system prompt pinned, the turn's end a checkpoint, every turn opener a cut), the
  store keeping 6 checkpoints (``retention = "spread"``); then the agent rewrites its history
  96 tokens back. The restore resumes where ``strata sim agent-edit`` does at these sizes, and
  llama.cpp re-reads as many tokens as it says.
* **park the prefix that fits**: a RAM level of 2 MiB for 2 slots and no disk level, with
  ``park_truncate``; A (1,136 tokens, a checkpoint every 64) parks, B (1,392) and C (368)
  take the context in turn, then A returns with the prefix ``strata sim park-truncate`` says
  was kept; without ``park_truncate`` it returns to nothing.
* **the low-RAM window**: free RAM (the store's probe) moves below each park's size plus the
  parking floor but above it plus the transient floor; parks spill to the disk level, none is
  discarded, and each conversation that comes back restores everything it had.

Each run keeps its stores in a new directory under the one it is given (``strata demo --dir``
run twice finds nothing of the first run's in them).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from strata_harness.gguf_model import make_gguf
from strata_harness.sim import AgentEdit, ParkTruncate, run_agent_edit, run_park_truncate

__all__ = ["run_llamacpp_phase"]

VOCAB = 512
REPLY = 8  #: greedy tokens each reply is compared on
#: the 200-turn edit, scaled down (``strata sim agent-edit``'s defaults: a 9,525-token system
#: prompt, 200 turns of 1,000 tokens, an edit 6,000 tokens back)
SYSTEM, TURNS, TURN, EDIT_BACK, KEEP = 160, 200, 16, 96, 6
#: park the prefix that fits, scaled down (``strata sim park-truncate``'s defaults: 3,500 MiB
#: for 62K, 76K and 20K tokens of 32 KiB)
BUDGET_MIB, FIRST, OTHERS, EVERY = 2, 1136, (1392, 368), 64
#: the low-RAM window: requests, conversations' first lengths and messages (tokens), free RAM
#: (MiB) and the floors: a park of at most 2 MiB passes the transient floor, none the parking one
REQUESTS, FIRST_TOKENS, MESSAGE_TOKENS = 12, (600, 900), (40, 80)
FREE_MIB, PARKING_MIB, TRANSIENT_MIB = (3.0, 4.5), 5, 1


def run_llamacpp_phase(path: str) -> bool:
    """Run the three episodes with their stores in a new directory under ``path``; print a
    line each; ``True`` when each holds. Says why and returns ``True`` when the ``llamacpp``
    extra is not installed, or its llama-cpp-python is not the version the adapter reads."""
    from stratastore.adapters.llamacpp.state import KNOWN_VERSION

    missing = [m for m in ("llama_cpp", "gguf") if importlib.util.find_spec(m) is None]
    if missing:
        print(
            f"  llama.cpp: the llamacpp extra is not installed ({', '.join(missing)} missing; "
            "pip install -e '.[llamacpp]' adds three episodes on a GGUF model through llama.cpp)"
        )
        return True
    import llama_cpp

    if llama_cpp.__version__ != KNOWN_VERSION:
        print(
            f"  llama.cpp: skipped: llama-cpp-python {llama_cpp.__version__} is installed, the "
            f"adapter reads {KNOWN_VERSION}'s state layout (pip install -e '.[llamacpp]')"
        )
        return True
    os.makedirs(path, exist_ok=True)
    path = tempfile.mkdtemp(prefix="run-", dir=path)
    model = make_gguf(Path(path) / "tiny-llama.gguf", layers=4, n_embd=128, n_head=4, vocab=VOCAB)
    llm = llama_cpp.Llama(model_path=str(model), n_ctx=4096, seed=0, verbose=False)
    print("  llama.cpp: a random 4-layer Llama as GGUF (1 KiB of K/V a token), llama-cpp-python")
    episodes = (_agent_edit, _park_truncate, _low_ram)
    return all([episode(llm, os.path.join(path, episode.__name__[1:])) for episode in episodes])


def _open(llm: Any, settings: dict[str, Any], probe: Callable[[], int] | None = None) -> Any:
    from stratastore.adapters.llamacpp import LlamaCppStore

    return LlamaCppStore.open(llm, {"create_dirs": True, **settings}, probe=probe)


def _reply(llm: Any, prompt: Sequence[int]) -> list[int]:
    """Greedy tokens after ``prompt``, going on from what the context holds of it."""
    out: list[int] = []
    for tok in llm.generate(list(prompt), temp=0.0, top_k=1, reset=True):
        out.append(int(tok))
        if len(out) == REPLY:
            break
    return out


def _resume(llm: Any, store: Any, prompt: Sequence[int]) -> tuple[int, bool]:
    """Restore ``prompt``'s deepest stored prefix into an emptied context and reply; then reply
    after evaluating the whole prompt: ``(tokens restored, replies equal)``."""
    llm.reset()
    n = int(store.restore(prompt))
    got = _reply(llm, prompt)
    llm.reset()
    return n, got == _reply(llm, prompt)


def _tokens(rng: np.random.Generator, n: int) -> list[int]:
    return [int(t) for t in rng.integers(3, VOCAB, n)]


def _verdict(ok: bool) -> str:
    return "same reply as a full evaluation" if ok else "REPLY DIFFERS from a full evaluation"


def _stored_lengths(store: Any, tokens: Sequence[int], lengths: Sequence[int]) -> list[int]:
    """Which of ``lengths`` the store can resume ``tokens`` at (a lookup each)."""
    return [x for x in lengths if (hit := store.store.lookup(tokens[:x])) and hit[1] == x]


def _agent_edit(llm: Any, path: str) -> bool:
    episode = AgentEdit(SYSTEM, TURNS, TURN, KEEP, EDIT_BACK, policy="spread")
    want = run_agent_edit(episode)
    rng = np.random.default_rng(1)
    held = _tokens(rng, SYSTEM)
    settings = {"retention": "spread", "checkpoints": KEEP, "cold_dir": path, "cold_mib": 64}
    with _open(llm, settings, probe=lambda: 1 << 40) as store:
        llm.reset()
        llm.eval(held)
        for _ in range(TURNS):
            opener = len(held)
            held += _tokens(rng, TURN)
            llm.eval(held[opener:])
            store.park(
                "agent",
                held,
                checkpoints=[len(held)],
                pinned=[SYSTEM],
                tail=False,
                cuts=range(SYSTEM, len(held), TURN),  # every turn opener
            )
        store.store.flush()
        ends = _stored_lengths(store, held, range(SYSTEM, len(held) + 1, TURN))
        kept = sorted(len(held) - x for x in ends)
        edit_at = len(held) - EDIT_BACK
        prompt = held[:edit_at] + _tokens(rng, EDIT_BACK)
        prompt[edit_at] = 3 + (held[edit_at] - 2) % (VOCAB - 3)  # the rewritten token differs
        n, same = _resume(llm, store, prompt)
    reread = len(prompt) - n
    newest = run_agent_edit(dataclasses.replace(episode, policy="lru"))
    ok = same and reread == want["reread_tokens"] and kept == want["kept"]
    print(
        f"    200-turn edit ({SYSTEM} system tokens, {TURNS} turns of {TURN}, spread "
        f"retention of {KEEP}): checkpoints kept {kept} tokens before the end (simulation: "
        f"{want['kept']}); an edit {EDIT_BACK} back re-reads {reread:,} of {len(prompt):,} "
        f"tokens (simulation: {want['reread_tokens']:,}; keeping the {KEEP} newest: "
        f"{newest['reread_tokens']:,})"
        f"; {_verdict(same)}"
    )
    return ok


def _park_truncate(llm: Any, path: str) -> bool:
    """A parks, B and C take the context, A returns: with and without ``park_truncate`` (a
    RAM-only store: ``path`` is not used)."""
    rng = np.random.default_rng(2)
    convs = {
        "A": _tokens(rng, FIRST),
        **{n: _tokens(rng, k) for n, k in zip("BC", OTHERS, strict=True)},
    }
    returning = convs["A"] + _tokens(rng, TURN)  # A comes back with a new message
    got: dict[bool, tuple[int, bool]] = {}
    for truncate in (True, False):
        settings = {
            "ram_mib": BUDGET_MIB,
            "slots": 2,
            "park_truncate": truncate,
            "min_tokens": EVERY,
            "checkpoints": 2 * FIRST // EVERY,  # all of A's kept, as the simulation keeps them
        }
        with _open(llm, settings, probe=lambda: 1 << 40) as store:
            for name in ("A", "B", "C"):
                llm.reset()
                llm.eval(convs[name])
                if name != "C":  # the next request takes the context: this one parks
                    ends = range(EVERY, len(convs[name]), EVERY)
                    store.park(name, convs[name], checkpoints=ends, tail=False)
            got[truncate] = _resume(llm, store, returning)
    sim = {
        t: run_park_truncate(
            ParkTruncate(
                budget_mib=BUDGET_MIB,
                slots=2,
                min_tokens=EVERY,
                every=EVERY,
                first=FIRST,
                others=OTHERS,
                token_kib=1,
                truncate=t,
            )
        )["restored_tokens"]
        for t in (True, False)
    }
    (n, same), (n_off, same_off) = got[True], got[False]
    ok = same and same_off and n == sim[True] and n_off == sim[False] and n > 0
    print(
        f"    park the prefix that fits (RAM {BUDGET_MIB} MiB, 2 slots; A {FIRST:,} tokens, "
        f"then B {OTHERS[0]:,} and C {OTHERS[1]:,}): A returns to {n:,} tokens restored "
        f"(simulation: {sim[True]:,}), to {n_off:,} without park_truncate (simulation: "
        f"{sim[False]:,}); {_verdict(same and same_off)}"
    )
    return ok


def _low_ram(llm: Any, path: str) -> bool:
    """Five conversations take the context in turn for :data:`REQUESTS` requests, a new message
    each; free RAM (the store's probe) stays between each park's size plus the transient floor
    and it plus the parking floor."""
    rng = np.random.default_rng(3)
    free = iter(rng.uniform(*FREE_MIB, 10_000))
    settings = {
        "ram_mib": 16,
        "slots": 2,
        "cold_dir": path,
        "cold_mib": 64,
        "min_free_mib": PARKING_MIB,
        "park_min_free_mib": TRANSIENT_MIB,
    }
    convs: dict[int, list[int]] = {}
    openers: dict[int, list[int]] = {}  #: each conversation's message starts: segment cuts
    held: int | None = None  #: the conversation the context holds
    parked: list[int] = []  #: each park's tokens
    restored = lost = 0
    same = True
    with _open(llm, settings, probe=lambda: int(next(free) * 2**20)) as store:
        for _ in range(REQUESTS):
            c = int(rng.integers(5))
            message = _tokens(rng, int(rng.integers(*MESSAGE_TOKENS)))
            if c == held:  # the conversation goes on in the context
                openers[c].append(len(convs[c]))
                llm.eval(message)
                convs[c] += message
                continue
            if held is not None:  # another takes the context: the one it held parks
                store.park(f"c{held}", convs[held], cuts=openers[held])
                parked.append(len(convs[held]))
            held = c
            if c not in convs:
                convs[c], openers[c] = _tokens(rng, int(rng.integers(*FIRST_TOKENS))), []
                llm.reset()
                llm.eval(convs[c])
                continue
            openers[c].append(len(convs[c]))
            n, ok = _resume(llm, store, convs[c] + message)
            restored, lost, same = restored + n, lost + len(convs[c]) - n, same and ok
            convs[c] = [int(t) for t in llm.input_ids[: llm.n_tokens]]  # with its reply
        stats = store.store.stats()
    ok = same and lost == 0 and stats["discards"] == 0 and stats["parks_disk"] > 0
    mib = [x * store.fp.token_bytes / 2**20 for x in (min(parked), max(parked))]
    print(
        f"    low-RAM window (free RAM {FREE_MIB[0]}-{FREE_MIB[1]} MiB, floors of {PARKING_MIB} "
        f"MiB (parking) and {TRANSIENT_MIB} MiB (transient), parks of {mib[0]:.1f}-{mib[1]:.1f} "
        f"MiB): {stats['parks_ram']} parks to RAM, {stats['parks_disk']} to disk, "
        f"{stats['discards']} discarded; {restored:,} tokens restored, {lost} lost; "
        + _verdict(same)
    )
    return ok
