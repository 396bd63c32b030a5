"""Hypothesis stateful test of the Store against a model, derandomized in CI: parks to RAM and disk
(RAM evictions spill), restores of whole conversations and of shared prefixes, batched restores,
sessions, corruption of a disk segment, and reopening. What it checks after every step: whatever a
restore returns is a prefix of that conversation's bytes, ending on a checkpoint; nothing past it is
written; a conversation the model knows is on disk restores whole unless it was damaged; sessions
survive reopening; fsck finds no error but the damage."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from stratastore import Checkpoint, Conversation, Store
from stratastore.chain import as_tokens
from stratastore.format import data_name
from stratastore.ops.fsck import fsck
from tests.conftest import tiny_fp

FP = tiny_fp()
TB = FP.token_bytes
MAX = 96
CONVS = 4


def tokens(i: int, n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64) + 10_000 * (i + 1)


def kv(i: int, n: int) -> np.ndarray:
    """Conversation ``i``'s K/V of its first ``n`` tokens in the page layout (spec F-SEG-4: in
    a page of ``p`` tokens, each layer's K then V block is ``[p, heads, dim]``), one value per
    token and place: the same K/V whatever ``n``, as an engine's would be. A short last page is
    not a byte prefix of the page it grows into, so ``kv(i, n)`` is not a prefix of
    ``kv(i, m)``."""
    rows = TB // (2 * FP.n_layers)  #: one token's K (or V) in one layer
    values = np.random.default_rng(i).integers(0, 256, (MAX, FP.n_layers, 2, rows), np.uint8)
    pages = [
        values[s : min(s + FP.page_tokens, n)].transpose(1, 2, 0, 3).reshape(-1)
        for s in range(0, n, FP.page_tokens)
    ]
    return np.concatenate(pages) if pages else np.zeros(0, np.uint8)


def conversation(i: int, n: int) -> Conversation:
    lengths = sorted({*range(16, n, 16), n})
    return Conversation(
        f"c{i}", as_tokens(tokens(i, n)), [Checkpoint(x) for x in lengths], cuts=[0, *lengths[:-1]]
    )


class StoreModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="strata-stateful-"))
        self.cfg = {
            "ram_mib": 1,
            "slots": 1,
            "min_free_mib": 1,
            "park_min_free_mib": 1,
            "cold_dir": str(self.dir / "cold"),
            "cold_mib": 64,
        }
        self.store = Store.open(FP, self.cfg, probe=lambda: 1 << 40, warn=lambda m: None)
        self.parked: dict[int, int] = {}  #: conversation -> tokens parked (RAM or disk)
        self.on_disk: dict[int, int] = {}  #: conversation -> tokens known durable on disk
        self.damaged: set[int] = set()
        self.sessions: dict[str, int] = {}
        #: every length conversation i was parked at (a RAM park may also be mirrored to disk,
        #: so after a reopen any of them may be what survived)
        self.lengths: dict[int, set[int]] = {}
        #: every K/V buffer conversation i was parked with, as the park left it: a park lays
        #: its pages out again, in place, at a checkpoint retention keeps from an earlier park
        #: (Store.park; spec F-SEG-7: a restore is byte-identical to that image)
        self.images: dict[int, list[np.ndarray]] = {}

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _restore_ok(self, i: int, n: int, got: int, out: np.ndarray) -> None:
        assert got <= n
        assert got == 0 or got % 16 == 0 or got in self.lengths.get(i, set()), got
        images = [kv(i, got), *self.images.get(i, [])]
        assert any(
            len(img) >= got * TB and np.array_equal(out[: got * TB], img[: got * TB])
            for img in images
        ), f"c{i}: {got} tokens restored are not a prefix of any image it was parked with"
        assert not out[got * TB :].any(), "bytes past the restored prefix were written"

    @rule(i=st.integers(0, CONVS - 1), n=st.integers(1, MAX), disk=st.booleans())  # disk: session
    def park(self, i: int, n: int, disk: bool) -> None:
        if disk:  # a session has its own tokens (conversation number i + CONVS)
            self.store.save_session(
                f"s{i}", tokens(i + CONVS, n), kv(i + CONVS, n).copy(), checkpoints=range(16, n, 16)
            )
            self.sessions[f"s{i}"] = n
            return
        self.lengths.setdefault(i, set()).add(n)
        image = kv(i, n).copy()
        r = self.store.park(conversation(i, n), image)
        self.images.setdefault(i, []).append(image)
        self.store.flush()
        assert r.where in ("ram", "disk", "discard")
        if r.where != "discard":
            self.parked[i] = n
            self.damaged.discard(i)
        if r.where == "disk":
            self.on_disk[i] = n

    @rule(i=st.integers(0, CONVS - 1), extra=st.integers(0, 8))
    def restore(self, i: int, extra: int) -> None:
        n = self.parked.get(i, MAX)
        prompt = np.concatenate([tokens(i, n), np.full(extra, 7)])
        out = np.zeros(len(prompt) * TB, np.uint8)
        r = self.store.restore(prompt, out)
        self._restore_ok(i, n, r.tokens, out)
        if i in self.on_disk and i not in self.damaged and self.on_disk[i] == n:
            assert r.tokens == n, f"c{i} is on disk whole, restored {r.tokens}"
        if r.source == "ram" and r.tokens == n:
            self.parked.pop(i, None)  # mounted live: the engine's slot owns it now

    @rule(a=st.integers(0, CONVS - 1), b=st.integers(0, CONVS - 1))
    def restore_batch(self, a: int, b: int) -> None:
        reqs = []
        for i in (a, b):
            n = self.parked.get(i, MAX)
            reqs.append((i, n, tokens(i, n), np.zeros(n * TB, np.uint8)))
        try:
            got = self.store.restore_many([(t, o) for _, _, t, o in reqs])
        except Exception as e:  # the ladder is on: nothing may fail
            raise AssertionError(f"restore_many raised {e!r}") from e
        for (i, n, _, out), r in zip(reqs, got, strict=True):
            self._restore_ok(i, n, r.tokens, out)
        for (i, n, _, _), r in zip(reqs, got, strict=True):
            if r.source == "ram" and r.tokens == n:
                self.parked.pop(i, None)

    @rule(i=st.integers(0, CONVS - 1))
    def session_roundtrip(self, i: int) -> None:
        name = f"s{i}"
        if name not in self.sessions:
            return
        n = self.sessions[name]
        out = np.zeros(n * TB, np.uint8)
        conv = self.store.load_session(name, out)
        assert len(conv.tokens) == n and np.array_equal(out, kv(i + CONVS, n))

    @rule(i=st.integers(0, CONVS - 1))
    def delete_session(self, i: int) -> None:
        assert self.store.delete_session(f"s{i}") == (f"s{i}" in self.sessions)
        self.sessions.pop(f"s{i}", None)

    @rule(i=st.integers(0, CONVS - 1), at=st.integers(0, 10_000))
    def corrupt(self, i: int, at: int) -> None:
        """Flip a payload byte of the first disk segment of conversation ``i``."""
        if i not in self.on_disk:
            return
        _, _, key = conversation(i, self.on_disk[i]).segments(FP.digest())[0]
        seg = self.dir / "cold" / data_name(key)
        if not seg.exists():
            return
        data = bytearray(seg.read_bytes())
        data[4096 + at % (len(data) - 4096)] ^= 0x40
        seg.write_bytes(bytes(data))
        self.damaged.add(i)

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = Store.open(FP, self.cfg, probe=lambda: 1 << 40, warn=lambda m: None)
        self.parked = {i: n for i, n in self.parked.items() if i in self.on_disk}
        for name, n in self.sessions.items():
            out = np.zeros(n * TB, np.uint8)
            self.store.load_session(name, out)
            assert np.array_equal(out, kv(int(name[1:]) + CONVS, n))
        errors = [f for f in fsck([self.cfg["cold_dir"]], deep=True) if f.severity == "error"]
        assert all(f.id == "PAGE_HASH_MISMATCH" for f in errors) and (
            errors == [] or self.damaged
        ), errors

    @invariant()
    def counters_are_sane(self) -> None:
        s = self.store.stats()
        assert all(v >= 0 for v in s.values() if isinstance(v, int))


StoreModel.TestCase.settings = settings(max_examples=25, stateful_step_count=25, deadline=None)
TestStoreModel = StoreModel.TestCase
