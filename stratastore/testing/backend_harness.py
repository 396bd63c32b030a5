"""The hooks and helpers of the shipped backend suite (:class:`~stratastore.testing.BackendTests`):
what a backend's test class implements (:meth:`BackendHarness.make_backend`,
:meth:`BackendHarness.corrupt`) and what the tests build on."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import numpy as np
import numpy.typing as npt

from stratastore.format import (
    Codec,
    Kind,
    Level,
    ModelFingerprint,
)
from stratastore.levels.backend import SegmentBackend

__all__ = ["BackendHarness", "U8", "raises"]

U8 = npt.NDArray[np.uint8]


@contextmanager
def raises(kind: type[BaseException] | tuple[type[BaseException], ...]) -> Iterator[None]:
    try:
        yield
    except kind:
        return
    raise AssertionError(f"did not raise {kind}")


class BackendHarness:
    """The hooks a backend implements and the helpers the tests use."""

    #: whether what a backend stored is there again after :meth:`reopen`
    supports_persistence: bool = True

    # -- hooks --------------------------------------------------------------------------------
    def make_backend(
        self, path: Path, fingerprint: ModelFingerprint, level: Level
    ) -> SegmentBackend:
        """A backend of ``fingerprint`` at ``level``; ``path`` is an empty directory of its own
        (or, from :meth:`reopen`, the one it used before)."""
        raise NotImplementedError("return your backend for this fingerprint and level")

    def reopen(
        self, backend: SegmentBackend, path: Path, fingerprint: ModelFingerprint, level: Level
    ) -> SegmentBackend:
        """Close ``backend`` and open it again on what it stored (persistence)."""
        backend.close()
        return self.make_backend(path, fingerprint, level)

    def corrupt(self, backend: SegmentBackend, key: bytes, offset: int) -> None:
        """Flip one bit of byte ``offset`` of ``key``'s *stored* payload, behind the backend's
        back (a raw write: no API of the backend may notice)."""
        raise NotImplementedError("flip a stored byte of the segment in your backend's storage")

    # -- helpers ------------------------------------------------------------------------------
    def fingerprint(self) -> ModelFingerprint:
        """2 layers x 2 kv heads x 4 dims fp16: 64 bytes a token, 256-byte pages of 4 tokens."""
        return ModelFingerprint.create(
            "backend/tiny", n_layers=2, n_kv_heads=2, head_dim=4, page_tokens=4
        )

    def other_fingerprint(self) -> ModelFingerprint:
        return ModelFingerprint.create(
            "backend/other", n_layers=2, n_kv_heads=2, head_dim=4, page_tokens=4
        )

    def kv(self, n: int, seed: int = 0) -> U8:
        fp = self.fingerprint()
        return np.random.default_rng(seed).integers(0, 256, n * fp.token_bytes, dtype=np.uint8)

    def opened(
        self, path: Path, level: Level = Level.WARM, fingerprint: ModelFingerprint | None = None
    ) -> AbstractContextManager[SegmentBackend]:
        """A backend from :meth:`make_backend` on ``path``, closed on exit."""
        fp = fingerprint or self.fingerprint()

        @contextmanager
        def run() -> Iterator[SegmentBackend]:
            path.mkdir(parents=True, exist_ok=True)
            b = self.make_backend(path, fp, level)
            try:
                yield b
            finally:
                b.close()

        return run()

    def put(
        self, b: SegmentBackend, n: int, seed: int = 0, codec: Codec = Codec.RAW
    ) -> tuple[bytes, U8]:
        data = self.kv(n, seed)
        toks = np.arange(n) + 1000 * seed
        r = b.put_kv(b.fingerprint.digest(), toks, data, token_start=0, codec=codec)
        assert r.created and len(r.key) == 32
        return r.key, data

    def _round_trip(self, tmp_path: Path, n: int, codec: Codec = Codec.RAW) -> None:
        with self.opened(tmp_path / "a") as b:
            key, data = self.put(b, n, codec=codec)
            out = np.zeros_like(data)
            sc = b.get_into(key, out)
            assert np.array_equal(out, data)
            assert (sc.kind, sc.codec, sc.key, sc.n_tokens) == (Kind.KV, codec, key, n)
            assert sc.page_count == -(-n // b.fingerprint.page_tokens)
            assert b.get_bytes(key, max_bytes=data.size) == data.tobytes()
