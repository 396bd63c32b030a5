"""Hypothesis: the segment store behaves like a dict of key -> bytes, across puts, deletes,
reopens and index rebuilds (derandomized in CI through the ``ci`` profile)."""

from __future__ import annotations

import shutil
import tempfile

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from stratastore import SegmentNotFound
from stratastore.format import Codec
from stratastore.format.naming import INDEX_DIR
from stratastore.levels.local import SegmentStore
from tests.conftest import kv_bytes, tiny_fp

FP = tiny_fp()


class StoreMachine(RuleBasedStateMachine):
    keys = Bundle("keys")

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="strata-prop-")
        self.store = SegmentStore.open(self.dir, FP)
        self.model: dict[bytes, bytes] = {}

    @rule(
        target=keys,
        tokens=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=40),
        seed=st.integers(0, 3),
        zstd=st.booleans(),
    )
    def put(self, tokens: list[int], seed: int, zstd: bool) -> bytes:
        payload = kv_bytes(FP, len(tokens), seed)
        codec = Codec.ZSTD if zstd else Codec.RAW
        r = self.store.put_kv(self.store.root_key, tokens, payload, token_start=0, codec=codec)
        assert r.created == (r.key not in self.model)
        self.model.setdefault(r.key, payload.tobytes())
        return r.key

    @rule(key=keys)
    def get(self, key: bytes) -> None:
        if key not in self.model:
            try:
                self.store.get_into(key, bytearray(1))
            except SegmentNotFound:
                return
            raise AssertionError("a deleted key was readable")
        out = np.zeros(len(self.model[key]), dtype=np.uint8)
        self.store.get_into(key, out)
        assert out.tobytes() == self.model[key]

    @rule(key=keys)
    def delete(self, key: bytes) -> None:
        assert self.store.delete(key) == (key in self.model)
        self.model.pop(key, None)

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = SegmentStore.open(self.dir, FP)

    @rule()
    def rebuild_index(self) -> None:
        self.store.close()
        shutil.rmtree(f"{self.dir}/{INDEX_DIR}")
        self.store = SegmentStore.open(self.dir, FP)

    @invariant()
    def same_keys(self) -> None:
        assert set(self.store.keys()) == set(self.model)
        assert self.store.stats().entries == len(self.model)

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


StoreMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=25, deadline=None)
TestStoreMachine = StoreMachine.TestCase
