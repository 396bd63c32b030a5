"""stratastore under llama.cpp (``stratastore.adapters.llamacpp``) on a real GGUF model made at
test time: conversations parked in one process resume in another with the tokens llama.cpp
gives keeping them in its own context; an edit a few turns back resumes at the deepest stored
point; a flipped byte restores fewer tokens and the same reply; another model's store and a
state of another layout are refused; flush() raises a park's failed background write and makes
the others durable; a kill -9 mid-park leaves a store fsck finds clean."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore.errors import StrataError
from tests.fresh_process import run_step
from tests.fsck_cli import fsck_deep

from .engine import ROOT, get_seq, load

MESSAGES = [
    [int(x) for x in np.random.default_rng(seed).integers(3, 500, n)]
    for seed, n in [(11, 40), (12, 9), (13, 23), (14, 6)]
]


def phase(**args: Any) -> dict[str, Any]:
    """One phase of :mod:`tests.llamacpp.phases` in a fresh process."""
    return run_step("tests.llamacpp.phases", args)


def _store(llm: Any, path: Path) -> Any:
    from stratastore.adapters.llamacpp import LlamaCppStore

    cfg = {"park": "disk", "ram_mib": 0, "cold_dir": str(path), "cold_mib": 256}
    return LlamaCppStore.open(llm, {**cfg, "page_resume": True})


@pytest.mark.parametrize("flash_attn", [False, True])
def test_conversations_resume_across_processes_with_llamas_own_tokens(
    tiny: Path, tmp_path: Path, flash_attn: bool
) -> None:
    """Three conversations, two turns each, every phase in a fresh process: the second turn
    restores the whole first (prompt and reply) and replies with the tokens llama.cpp gives
    keeping the conversation in its own context."""
    store = tmp_path / "store"
    for c in range(3):
        first, second = MESSAGES[c], MESSAGES[c + 1]
        own = phase(op="own", model=tiny, flash_attn=flash_attn, messages=[first, second])
        parked = phase(
            op="park", model=tiny, flash_attn=flash_attn, store=store, conv=f"c{c}", prompt=first
        )
        assert parked["reply"] == own["replies"][0]
        prompt = parked["held"] + second
        resumed = phase(op="resume", model=tiny, flash_attn=flash_attn, store=store, prompt=prompt)
        assert resumed["restored"] == len(parked["held"])
        assert resumed["reply"] == own["replies"][1], f"conversation {c}"


def test_an_edit_back_in_history_resumes_at_the_deepest_stored_turn(
    tiny: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    turns = MESSAGES[:3]
    prompt = turns[0] + turns[1] + turns[2]
    cuts = [len(turns[0]), len(turns[0]) + len(turns[1])]
    phase(op="park", model=tiny, store=store, conv="agent", prompt=prompt, cuts=cuts)
    edited = turns[0] + turns[1][:4] + [7, 8, 9] + turns[1][7:] + turns[2]
    resumed = phase(op="resume", model=tiny, store=store, prompt=edited)
    assert 0 < resumed["restored"] <= len(turns[0]) + 4
    assert resumed["restored"] >= len(turns[0])  # the turn before the edit, at least
    assert resumed["reply"] == phase(op="fresh", model=tiny, prompt=edited)["reply"]


def test_a_flipped_byte_restores_fewer_tokens_and_the_same_reply(
    tiny: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    parked = phase(op="park", model=tiny, store=store, conv="c", prompt=MESSAGES[0])
    prompt = parked["held"] + MESSAGES[1]
    whole = phase(op="resume", model=tiny, store=store, prompt=prompt)
    data = [p for p in store.rglob("strata-conv-*") if p.suffix != ".sidecar"]
    data = [p for p in data if p.stat().st_size > 8192]
    assert data, sorted(p.name for p in store.rglob("*"))
    target = max(data, key=lambda p: p.stat().st_size)
    raw = bytearray(target.read_bytes())
    page = 16 * 2 * (64 + 64)  # 16 tokens of 2 layers' K and V rows
    raw[4096 + page + 10] ^= 0x01  # in the segment's second page (after the 4 KiB header)
    target.write_bytes(bytes(raw))
    damaged = phase(op="resume", model=tiny, store=store, prompt=prompt)
    assert damaged["restored"] == 16 < whole["restored"]  # the page before the damaged one
    assert damaged["reply"] == whole["reply"]


def test_another_models_store_is_refused(tiny: Path, tiny_other: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    llm = load(tiny)
    llm.eval(MESSAGES[0])
    with _store(llm, store) as s:
        s.park("c")
    other = load(tiny_other)
    with pytest.raises(StrataError, match=r"(?i)fingerprint|model"):
        _store(other, store).close()


def test_flush_makes_a_ram_park_durable_and_raises_its_failed_write(
    tiny: Path, tmp_path: Path
) -> None:
    """Under ``park = "ram"`` (the default) the disk copy is written in the background:
    ``flush()`` raises the write that failed (once), and after it another process restores
    what was parked."""
    from stratastore import SpillError
    from stratastore.adapters.llamacpp import LlamaCppStore
    from stratastore.io import faults
    from stratastore.io.faults import Fault

    store = tmp_path / "store"
    cfg = {"park": "ram", "ram_mib": 16, "slots": 2, "cold_dir": str(store), "cold_mib": 256}
    llm = load(tiny)
    llm.eval(MESSAGES[0])
    with LlamaCppStore.open(llm, cfg) as s:
        with faults.inject(Fault(op="write", path_contains="strata-conv-", persistent=True)):
            assert s.park("lost").where == "ram"
            with pytest.raises(SpillError, match="'lost'"):
                s.flush()
        s.flush()  # reported once
        assert s.park("kept").where == "ram"
        s.flush()
        resumed = phase(op="resume", model=tiny, store=store, prompt=MESSAGES[0] + MESSAGES[1])
        assert resumed["restored"] == len(MESSAGES[0])


def _reshaped(state: bytes, what: str) -> bytes:
    """``state`` as another llama.cpp version might write it."""
    raw = bytearray(state)
    if what == "two streams":
        raw[8:12] = (2).to_bytes(4, "little")
    elif what == "a field more per cell":  # e.g. M-RoPE's 12 bytes of cell extension
        n = int.from_bytes(raw[12:16], "little")
        cells = b"".join(raw[16 + 12 * i : 28 + 12 * i] + bytes(12) for i in range(n))
        raw = raw[:16] + cells + raw[16 + 12 * n :]
    elif what == "trailing bytes":
        raw += bytes(8)
    elif what == "another magic":
        raw[0:4] = (0xAF143CD9).to_bytes(4, "little")
    elif what == "another K type":
        off = 16 + 12 * int.from_bytes(raw[12:16], "little") + 8
        raw[off : off + 4] = (8).to_bytes(4, "little")
    return bytes(raw)


@pytest.mark.parametrize(
    "what",
    ["two streams", "a field more per cell", "trailing bytes", "another magic", "another K type"],
)
def test_a_state_of_another_layout_is_refused_by_name(tiny: Path, what: str) -> None:
    from stratastore.adapters.llamacpp import StateLayoutError, context_layout, read_state

    llm = load(tiny)
    llm.eval(MESSAGES[0])
    layout = context_layout(llm)
    state = get_seq(llm)
    assert read_state(state, layout).shape == (2, len(MESSAGES[0]), layout.k_row + layout.v_row)
    with pytest.raises(StateLayoutError, match=r"0\.3\.36") as e:
        read_state(_reshaped(state, what), layout)
    assert "llama-cpp-python" in str(e.value)


def test_a_park_of_a_state_llama_writes_otherwise_is_refused(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the store: the state's bytes come from llama.cpp; one in another layout is
    refused before anything is stored."""
    from stratastore.adapters.llamacpp import StateLayoutError

    llm = load(tiny)
    llm.eval(MESSAGES[0])
    with _store(llm, tmp_path / "store") as s:
        real = s._get
        monkeypatch.setattr(s, "_get", lambda seq: _reshaped(real(seq), "a field more per cell"))
        with pytest.raises(StateLayoutError):
            s.park("c")
        assert s.lookup(MESSAGES[0] + [5]) == 0


def test_a_kill_mid_park_leaves_a_store_fsck_finds_clean(tiny: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    script = (
        "import sys\n"
        "from tests.llamacpp.engine import load\n"
        "from tests.llamacpp.phases import _store\n"
        "import numpy as np\n"
        f"llm = load({str(tiny)!r}, n_ctx=1024)\n"
        "rng = np.random.default_rng(0)\n"
        "llm.eval([int(x) for x in rng.integers(3, 500, 600)])\n"
        f"with _store(llm, {str(store)!r}) as s:\n"
        "    for i in range(10_000):  # other tokens each time: every park writes segments\n"
        "        s.park(f'c{i}', [int(x) for x in rng.integers(3, 500, 600)])\n"
        "        print('parked', i, flush=True)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        for i in range(3):  # three parks acknowledged, the fourth in flight when it is killed
            assert proc.stdout.readline().split() == ["parked", str(i)]
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    fsck = fsck_deep(store)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr


@pytest.mark.parametrize(
    ("flash_attn", "kv", "v"), [(False, "q8_0", "f16"), (True, "q8_0", "q8_0")]
)
def test_quantized_caches_restore_bit_for_bit(
    wide: Path, tmp_path: Path, flash_attn: bool, kv: str, v: str
) -> None:
    """K and V rows of other sizes (q8_0 K, f16 V) and a quantized V: the restored context
    continues as the one that evaluated the prefix itself."""
    from .engine import logits

    kw: dict[str, Any] = {"flash_attn": flash_attn, "kv": kv, "v": v}
    prompt, more = MESSAGES[0], MESSAGES[1]
    a = load(wide, **kw)
    a.eval(prompt)
    with _store(a, tmp_path / "store") as s:
        s.park("c", tail=False)
    b = load(wide, **kw)
    with _store(b, tmp_path / "store") as s:
        assert s.restore(prompt + more) == len(prompt)
    b.eval(more)
    a.eval(more)
    assert np.array_equal(logits(b).view(np.uint32), logits(a).view(np.uint32))
    assert get_seq(b) == get_seq(a)


def test_a_sequence_the_context_does_not_have_is_refused(tiny: Path, tmp_path: Path) -> None:
    llm = load(tiny)
    llm.eval(MESSAGES[0])
    with _store(llm, tmp_path / "store") as s:
        s.park("c")
        for seq in (1, 256, -1):
            with pytest.raises(StrataError, match="n_seq_max"):
                s.restore(MESSAGES[0] + [5], seq=seq)
            with pytest.raises(StrataError, match="n_seq_max"):
                s.park("d", MESSAGES[0], seq=seq)


def test_a_context_holding_the_prompt_already_is_left_as_it_is(tiny: Path, tmp_path: Path) -> None:
    """A conversation still in the Llama's context: restore reads nothing and the Llama goes on
    from what it holds (no context thrown away to be read back from disk)."""
    llm = load(tiny)
    llm.eval(MESSAGES[0])
    with _store(llm, tmp_path / "store") as s:
        s.park("c")
        llm.eval(MESSAGES[1])  # the context now holds more than the store
        held = llm.n_tokens
        assert s.restore(MESSAGES[0] + MESSAGES[1] + [7]) == 0
        assert llm.n_tokens == held
        assert s.store.stats()["tokens_restored"] == 0


def test_token_ids_that_are_not_integers_are_refused(tiny: Path, tmp_path: Path) -> None:
    llm = load(tiny)
    llm.eval(MESSAGES[0])
    with _store(llm, tmp_path / "store") as s:
        for bad in ([1.5, 2.0], ["a", "b"], [[1, 2]]):
            with pytest.raises(StrataError):
                s.restore(bad)
        with pytest.raises(StrataError):
            s.park("c", [float(t) for t in MESSAGES[0]])
        for cuts in ([1.5], [-1], [len(MESSAGES[0]) + 1], [True], ["8"]):
            with pytest.raises(StrataError, match="cuts"):
                s.park("c", MESSAGES[0], cuts=cuts)
        assert s.lookup(MESSAGES[0] + [3]) == 0  # nothing of the refused parks was stored


def test_a_lora_adapter_is_part_of_the_fingerprint(tiny: Path, tiny_other: Path) -> None:
    from stratastore.adapters.llamacpp import context_layout, fingerprint

    llm = load(tiny)
    base = fingerprint(llm, context_layout(llm))
    llm.lora_path, llm.lora_scale = str(tiny_other), 1.0  # a GGUF file stands in for one
    with_lora = fingerprint(llm, context_layout(llm))
    llm.lora_scale = 0.5
    assert len({base, with_lora, fingerprint(llm, context_layout(llm))}) == 3


def test_a_llama_that_keeps_every_tokens_logits_is_refused(tiny: Path, tmp_path: Path) -> None:
    import llama_cpp

    from stratastore.errors import ConfigError

    llm = llama_cpp.Llama(model_path=str(tiny), n_ctx=256, logits_all=True, verbose=False)
    with pytest.raises(ConfigError, match="logits_all"):
        _store(llm, tmp_path / "store")


def test_a_model_path_that_is_not_a_gguf_file_is_refused(tiny: Path, tmp_path: Path) -> None:
    """A link to the model (a hub cache keeps its files so) is the model; a file that is not a
    GGUF, or a FIFO, is a ConfigError naming it, and no store is opened."""
    from stratastore.adapters.llamacpp import context_layout, fingerprint
    from stratastore.errors import ConfigError

    llm = load(tiny)
    layout = context_layout(llm)
    link = tmp_path / "linked.gguf"
    link.symlink_to(tiny)
    want = fingerprint(llm, layout)
    llm.model_path = str(link)
    assert fingerprint(llm, layout) == want
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"GGUF" + bytes(64))
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    for bad in (garbage, fifo, tmp_path / "missing.gguf"):
        llm.model_path = str(bad)
        with pytest.raises(ConfigError, match=bad.name):
            fingerprint(llm, layout)
    assert not (tmp_path / "store").exists()


def _written() -> int:
    """Bytes this process has passed to write calls (``/proc/self/io``)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))


def _park_turns(tiny: Path, path: Path, *, with_cuts: bool) -> tuple[list[int], int]:
    """Twelve turns of 64 tokens after a 64-token system prompt, parked one by one (the turn's
    end the new checkpoint, the store keeping 3 by LRU): the bytes each park wrote, and a
    turn's K/V bytes."""
    from stratastore.adapters.llamacpp import LlamaCppStore

    llm = load(tiny, n_ctx=1024)
    rng = np.random.default_rng(5)
    held = [int(x) for x in rng.integers(3, 500, 64)]
    llm.eval(held)
    cfg = {"park": "disk", "ram_mib": 0, "cold_dir": str(path), "cold_mib": 64}
    written = []
    with LlamaCppStore.open(llm, {**cfg, "checkpoints": 3, "retention": "lru"}) as s:
        for _ in range(12):
            new = [int(x) for x in rng.integers(3, 500, 64)]
            llm.eval(new)
            held += new
            cuts = range(64, len(held), 64) if with_cuts else ()
            s.store.flush()
            before = _written()
            s.park("agent", held, checkpoints=[len(held)], pinned=[64], tail=False, cuts=cuts)
            s.store.flush()
            written.append(_written() - before)
        return written, 64 * s.fp.token_bytes


def test_turn_openers_as_cuts_keep_each_park_of_a_long_conversation_to_its_new_turn(
    tiny: Path, tmp_path: Path
) -> None:
    """With every turn opener a cut, each park writes its new turn and the store's records, as
    much at the twelfth turn as at the third, whichever checkpoints retention dropped; without,
    a park rewrites the span back to the last checkpoint kept, more turns each time (measured:
    about 105 KiB a park with cuts, 215 KiB growing to 368 KiB without, 16 KiB turns)."""
    cut, turn = _park_turns(tiny, tmp_path / "cuts", with_cuts=True)
    uncut, _ = _park_turns(tiny, tmp_path / "none", with_cuts=False)
    assert cut[-1] - cut[2] < 2 * turn, cut
    assert uncut[-1] - uncut[2] > 5 * turn, uncut
    assert uncut[-1] - cut[-1] > 10 * turn, (cut, uncut)
