"""A hostile review of the library API: bad input (misuse of the API, hostile sizes) is refused by
the call that caused it, with a typed :class:`StrataError` naming the object and the fix, never a
plain Python error; a restore writes the caller's memory correctly or refuses before anything is
touched.

Each test failed on the earlier code (a hang there fails by timeout)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore import (
    Checkpoint,
    ConfigError,
    Conversation,
    InvalidConversation,
    InvalidRequest,
    StoreConfig,
)
from stratastore.chain import as_tokens
from stratastore.cli import main
from stratastore.facade import Store, StoreClosed
from stratastore.format.naming import INDEX_DIR
from stratastore.metrics.monitor import MONITOR_FILE, read_monitor
from stratastore.restore import DestinationRefused, LayerKV, PagedKV
from tests.conftest import run_with_timeout, tiny_fp

FP = tiny_fp()  # 2 layers x 2 kv heads x 4 dims fp16: 64 bytes a token, pages of 4 tokens
TB = FP.token_bytes
N = 32
TOKS = list(range(100, 100 + N))
DIGEST = b"\x11" * 32


def kv_of(n: int = N, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n * TB, dtype=np.uint8)


def parked(tmp_path: Path, park: str = "ram") -> tuple[Store, np.ndarray]:
    """A store holding ``TOKS`` (whole history, so a restore from RAM moves it), and its K/V."""
    store = Store.open(
        FP,
        {
            "ram_mib": 16,
            "park": park,
            "cold_dir": str(tmp_path / "cold"),
            "cold_mib": 16,
            "min_free_mib": 0,
            "park_min_free_mib": 0,
        },
    )
    kv = kv_of()
    conv = Conversation(
        "c",
        as_tokens(TOKS),
        [Checkpoint(8, pinned=True), Checkpoint(N)],
        cuts=[0, 8],
        media={10: DIGEST},
    )
    store.park(conv, kv.copy())
    store.flush()
    return store, kv


def pools(num_blocks: int = 8, block_size: int = 4) -> list[np.ndarray]:
    return [np.zeros((2, num_blocks, block_size, 2, 4), np.float16) for _ in range(2)]


# -- 1: a destination that would receive wrong bytes is refused -------------------------------
def test_a_block_table_with_a_duplicate_block_is_refused_before_anything(tmp_path: Path) -> None:
    store, kv = parked(tmp_path)
    with store:
        with pytest.raises(DestinationRefused, match=r"block 0 .*twice.*each token"):
            PagedKV(FP, pools(), [0, 0, 1, 2, 3, 4, 5, 6])
        assert store.lookup(TOKS, {10: DIGEST}) == ("ram", N)  # nothing was taken from RAM
        ref = pools()
        r = store.restore(TOKS, PagedKV(FP, ref, list(range(8))), {10: DIGEST})
        assert (r.source, r.tokens) == ("ram", N)
        for block in (0, 1):  # layer 0's K of the page's 4 tokens opens each stored page
            page = kv[block * 4 * TB : block * 4 * TB + 64].tobytes()
            assert ref[0][0, block].reshape(-1).view(np.uint8).tobytes() == page


@pytest.mark.parametrize(
    "table, why",
    [
        ([-1, 0], "0..7"),
        ([0, 8], "0..7"),
        (["a"], "integer"),
        ([0.5, 1.5], "integer"),
        ([[0, 1]], "one-dimensional"),
        ([[0], [1, 2]], "block table"),
        ([True], "integer"),
        (np.array([2**63], np.uint64), "0..7"),
        (None, "block table"),
    ],
)
def test_a_bad_block_table_is_a_destination_refused(table: Any, why: str) -> None:
    with pytest.raises(DestinationRefused, match=why):
        PagedKV(FP, pools(), table)


def test_destination_arrays_sharing_memory_are_refused() -> None:
    a = np.zeros((N, 2, 4), np.float16)
    others = [np.zeros((N, 2, 4), np.float16) for _ in range(2)]
    with pytest.raises(DestinationRefused, match=r"LayerKV V\[0\] overlaps LayerKV K\[0\]"):
        LayerKV(FP, [a, others[0]], [a, others[1]])
    shared = pools(1)[0]
    with pytest.raises(DestinationRefused, match="overlaps"):
        PagedKV(FP, [shared, shared], [0])
    whole = np.zeros((4, N, 2, 4), np.float16)  # disjoint views of one buffer are fine
    assert LayerKV(FP, [whole[0], whole[1]], [whole[2], whole[3]]).capacity() == N


# -- 2: calls after close ----------------------------------------------------------------------
def test_every_call_on_a_closed_store_is_store_closed(tmp_path: Path) -> None:
    store, _ = parked(tmp_path, "disk")
    store.close()
    index = tmp_path / "cold" / INDEX_DIR / MONITOR_FILE
    assert json.loads(index.read_text())["parks_disk"] == 1  # close() still published
    for name in ("stats", "info_line", "prometheus", "publish"):
        with pytest.raises(StoreClosed, match=f"store is closed: {name}\\(\\)"):
            getattr(store, name)()
    with pytest.raises(StoreClosed, match="__enter__"), store:
        pass


# -- 3: a destination too small ----------------------------------------------------------------
def test_a_destination_too_small_is_refused_naming_the_size_before_a_take(tmp_path: Path) -> None:
    store, _ = parked(tmp_path)
    with store:
        with pytest.raises(DestinationRefused, match=r"32 tokens .*2,048 bytes"):
            store.restore(TOKS, np.zeros((N - 1) * TB, np.uint8), {10: DIGEST})
        small = LayerKV(
            FP,
            [np.zeros((8, 2, 4), np.float16) for _ in range(2)],
            [np.zeros((8, 2, 4), np.float16) for _ in range(2)],
        )
        good = np.zeros(N * TB, np.uint8)
        with pytest.raises(DestinationRefused, match=r"holds 8 tokens \(out #1\)"):
            store.restore_many([(TOKS, good), (TOKS, small)], [{10: DIGEST}, {10: DIGEST}])
        assert store.lookup(TOKS, {10: DIGEST}) == ("ram", N)  # nothing was taken
        store.save_session("s", TOKS, kv_of(seed=2))
        with pytest.raises(DestinationRefused, match=r"session 's' needs 2,048 bytes"):
            store.load_session("s", np.zeros(3, np.uint8))


# -- 4: typed errors at the facade -------------------------------------------------------------
BAD_MEDIA = [
    ({"a": DIGEST}, "position"),
    ([1, 2], "mapping"),
    ({10: b"x"}, "32-byte"),
    ({N: DIGEST}, "within"),
    ({-1: DIGEST}, "within"),
    ({10: "s" * 32}, "32-byte"),
    ({10.0: DIGEST}, "position"),
    ({True: DIGEST}, "position"),
]


@pytest.mark.parametrize("media, why", BAD_MEDIA)
def test_bad_media_of_a_lookup_or_restore_is_an_invalid_request(
    tmp_path: Path, media: Any, why: str
) -> None:
    store, _ = parked(tmp_path)
    with store:
        with pytest.raises(InvalidRequest, match=why):
            store.lookup(TOKS, media)
        with pytest.raises(InvalidRequest, match=why):
            store.restore(TOKS, np.zeros(N * TB, np.uint8), media)
        with pytest.raises(InvalidRequest, match=why):
            store.restore_many([(TOKS, np.zeros(N * TB, np.uint8))], [media])
        assert store.lookup(TOKS, {10: DIGEST}) == ("ram", N)


@pytest.mark.parametrize(
    "prompt", [[-1] * 4, [2**32], [2**70], [1.5], "abc", None, [[1], [2, 3]], [True]]
)
def test_a_bad_prompt_is_an_invalid_request(tmp_path: Path, prompt: Any) -> None:
    store, _ = parked(tmp_path)
    with store:
        with pytest.raises(InvalidRequest, match="token ids"):
            store.lookup(prompt)
        with pytest.raises(InvalidRequest, match="token ids"):
            store.restore(prompt, np.zeros(N * TB, np.uint8))


def test_bad_restore_many_requests_are_invalid_requests(tmp_path: Path) -> None:
    store, _ = parked(tmp_path)
    out = np.zeros(N * TB, np.uint8)
    with store:
        with pytest.raises(InvalidRequest, match=r"request #0 .*\(prompt, out\)"):
            store.restore_many([(1, 2, 3)])  # type: ignore[list-item]
        with pytest.raises(InvalidRequest, match="a list of"):
            store.restore_many(5)  # type: ignore[arg-type]
        with pytest.raises(InvalidRequest, match="2 media for 1 request"):
            store.restore_many([(TOKS, out)], [None, None])
        with pytest.raises(InvalidRequest, match="media"):
            store.restore_many([(TOKS, out)], 5)  # type: ignore[arg-type]
        assert store.lookup(TOKS, {10: DIGEST}) == ("ram", N)


def test_bad_park_and_session_inputs_are_invalid_conversations(tmp_path: Path) -> None:
    store, _ = parked(tmp_path)

    def conv(cid: str, toks: Any = TOKS) -> Conversation:
        return Conversation(cid, toks, [Checkpoint(N)])

    with store:
        with pytest.raises(InvalidConversation, match="object"):
            store.park(conv("o"), np.array([None] * (N * TB), dtype=object))
        with pytest.raises(InvalidConversation, match="token ids"):
            store.park(conv("neg", [-1] * N), kv_of())
        with pytest.raises(InvalidConversation, match="numpy array"):
            store.save_session("x", TOKS, list(range(N * TB)))  # type: ignore[arg-type]
        with pytest.raises(InvalidConversation, match="object"):
            store.save_session("x", TOKS, np.array([None] * (N * TB), dtype=object))
        with pytest.raises(InvalidConversation, match="token ids"):
            store.save_session("x", [-1] * N, kv_of())
        with pytest.raises(InvalidConversation, match="checkpoints"):
            store.save_session("x", TOKS, kv_of(), checkpoints=["a"])  # type: ignore[list-item]
        with pytest.raises(InvalidConversation, match="checkpoints"):
            store.save_session("x", TOKS, kv_of(), checkpoints=[N + 1])
        for call in (
            lambda: store.load_session(5, np.zeros(N * TB, np.uint8)),  # type: ignore[arg-type]
            lambda: store.delete_session(None),
        ):  # type: ignore[arg-type]
            with pytest.raises(InvalidConversation, match="session name"):
                call()
        assert store.stats()["discards"] == 0 and store.lookup(TOKS) is not None


# -- 5: a config that is not a regular file ----------------------------------------------------
def test_a_fifo_config_is_a_config_error_not_a_hang(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "f.toml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=f"config file {fifo} cannot be read.*FIFO"):
        run_with_timeout(lambda: StoreConfig.from_toml(str(fifo)))
    with pytest.raises(ConfigError, match="FIFO"):
        run_with_timeout(lambda: Store.open(FP, str(fifo)))
    assert run_with_timeout(lambda: main(["--config", str(fifo), "fsck"])) == 2
    assert f"config file {fifo} cannot be read" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="directory"):
        StoreConfig.from_toml(str(tmp_path))
    with pytest.raises(ConfigError, match="does not exist; create it with strata init"):
        StoreConfig.from_toml(str(tmp_path / "missing.toml"))
    real = tmp_path / "real.toml"
    real.write_text("ram_mib = 3\n")
    os.symlink(real, tmp_path / "link.toml")  # a linked config (dotfiles) is still read
    assert StoreConfig.from_toml(str(tmp_path / "link.toml")).ram_mib == 3


# -- 6: monitor names every snapshot it ignores -------------------------------------------------
@pytest.mark.parametrize(
    "kind, why",
    [
        ("[]", "a JSON list"),
        ("null", "a JSON null"),
        ('{"written_at": "y", "levels": {}}', "written_at"),
        ("{not json", "not JSON"),
        ("fifo", "FIFO"),
        ("link", "symbolic link"),
    ],
)
def test_monitor_names_a_snapshot_it_ignores(tmp_path: Path, kind: str, why: str) -> None:
    store, _ = parked(tmp_path, "disk")
    store.close()
    path = tmp_path / "cold" / INDEX_DIR / MONITOR_FILE
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link":
        (tmp_path / "elsewhere.json").write_text(json.dumps({"written_at": 1.0}))
        os.symlink(tmp_path / "elsewhere.json", path)
    else:
        path.write_text(kind)
    doc = run_with_timeout(lambda: read_monitor(levels=[str(tmp_path / "cold")]))
    assert doc["snapshot"] is None
    assert doc["snapshot_problem"] is not None, "an ignored snapshot must be named"
    assert str(path) in doc["snapshot_problem"] and why in doc["snapshot_problem"]
