"""A keyed directory level (spec F-KEYED): pages a writer without the key plants in a shared
directory are never delivered (a miss, counted as ``unauthenticated``, found by fsck), a
keyed reader and writer work, keys rotate, an unkeyed store is unchanged, and the secret is
shown nowhere."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import pytest

from stratastore import Store
from stratastore.errors import ConfigError
from stratastore.format import (
    ChecksumMismatch,
    KeyRequired,
    LevelKeys,
    NotAuthenticated,
    decode_sidecar,
    sidecar_name,
)
from stratastore.format.level_key import derive_key, key_id_of
from stratastore.levels.errors import SegmentNotFound
from stratastore.levels.level_keys import level_keys
from stratastore.levels.local import SegmentStore
from stratastore.ops.fsck import fsck
from tests.conftest import conversation_kv, kv_bytes, tiny_fp

FP = tiny_fp()
SECRET1 = b"first-test-secret-of-the-shared-level"
SECRET2 = b"second-test-secret-after-the-rotation"
TB = FP.token_bytes


def key_file(tmp_path: Path, *secrets: bytes, name: str = "level.key") -> Path:
    path = tmp_path / name
    path.write_bytes(b"# the level's secrets, the writer's first\n" + b"\n".join(secrets) + b"\n")
    path.chmod(0o600)
    return path


def config(tmp_path: Path, keyfile: Path | None) -> dict[str, Any]:
    settings = {"settings": {"key_file": str(keyfile)}} if keyfile is not None else {}
    return {
        "ram_mib": 0,
        "park": "disk",
        "levels": [{"name": "cold", "dir": str(tmp_path / "shared"), "mib": 64, **settings}],
    }


def open_store(tmp_path: Path, keyfile: Path | None) -> Store:
    return Store.open(FP, config(tmp_path, keyfile), probe=lambda: 1 << 40)


def park_and_flush(store: Store, cid: str, n: int, base: int) -> Any:
    conv, kv = conversation_kv(cid, n, base)
    store.park(conv, kv.copy())
    store.flush()
    return conv, kv


def plant_unkeyed(level: Path, conv: Any, kv: Any, segment: int) -> bytes:
    """A writer without the key replaces segment ``segment`` of ``conv`` in the shared
    directory by its own (same tokens, so same key; pages valid under plain BLAKE3, bytes of
    its choosing)."""
    start, end, key = conv.segments(FP.digest())[segment]
    with SegmentStore.open(level, FP) as w:
        w.delete(key)
        bad = np.full((end - start) * TB, 0x5A, np.uint8)  # what the planter wants served
        parent = FP.digest() if segment == 0 else conv.segments(FP.digest())[segment - 1][2]
        tokens = np.asarray(conv.tokens[start:end])
        got = w.put_kv(parent, tokens, bad, token_start=start).key
        assert got == key and decode_sidecar((level / sidecar_name(key)).read_bytes()).key_id == b""
    return key


def forge_keyed(level: Path, key: bytes, key_id: bytes) -> None:
    """A writer without the key rewrites a sidecar as keyed: the KEYED bit, ``key_id`` (made up,
    or copied from a genuine sidecar: ids are public) and a trailer keyed by a key of its own."""
    path = level / sidecar_name(key)
    sc = decode_sidecar(path.read_bytes())
    raw = bytearray(path.read_bytes()[:-32])
    head, rest = bytes(raw[:224]), bytes(raw[224:])
    head = head[:10] + struct.pack("<HH", 1, 232) + head[14:16] + struct.pack("<I", 2) + head[20:]
    body = head + key_id + rest
    own = derive_key(b"the planter's own made-up secret")
    path.write_bytes(body + blake3.blake3(body, key=own).digest())
    assert sc.key == key


def test_an_unkeyed_writer_plants_pages_a_keyed_reader_never_delivers(tmp_path: Path) -> None:
    kf = key_file(tmp_path, SECRET1)
    with open_store(tmp_path, kf) as store:
        conv, kv = park_and_flush(store, "c", 48, 100)
    planted = plant_unkeyed(tmp_path / "shared", conv, kv, 1)
    with open_store(tmp_path, kf) as store:
        out = np.zeros(48 * TB, np.uint8)
        r = store.restore(conv.tokens, out)
        assert r.tokens == 16  # the ladder: the valid prefix, the planted segment a miss
        assert np.array_equal(out[: 16 * TB], kv[: 16 * TB]) and not out[16 * TB :].any()
        assert store.stats()["levels"]["cold"]["unauthenticated"] >= 1
    found = list(fsck([str(tmp_path / "shared")], deep=True, keys=_keys(tmp_path, kf)))
    assert [f.id for f in found if f.severity == "error"] == ["SIDECAR_UNAUTHENTICATED"]
    assert planted.hex() in found[-1].object or planted.hex() in str(found)
    unkeyed = list(fsck([str(tmp_path / "shared")], deep=True))
    assert [f.id for f in unkeyed] == ["KEYED_UNCHECKED"]  # no key: said, never judged


def _keys(tmp_path: Path, kf: Path) -> dict[str, LevelKeys]:
    keys = level_keys({"key_file": str(kf)})
    assert keys is not None
    return {os.path.abspath(tmp_path / "shared"): keys}


@pytest.mark.parametrize("key_id", ["made_up", "the_level_s_own"])
def test_a_forged_keyed_sidecar_is_never_delivered(tmp_path: Path, key_id: str) -> None:
    """Planted pages whose sidecar claims a key: a made-up key id is not one of the level's
    (not authenticated); the level's own id with a trailer the planter could not key is a
    checksum mismatch. Either way a miss, and fsck finds it."""
    keys = LevelKeys([SECRET1])
    level = tmp_path / "shared"
    with SegmentStore.open(level, FP, keys=keys) as s:
        s.put_kv(FP.digest(), np.arange(16), kv_bytes(FP, 16), token_start=0)
    with SegmentStore.open(level, FP) as w:
        key = w.put_kv(FP.digest(), np.arange(50, 66), kv_bytes(FP, 16, 3), token_start=0).key
    kid = b"\x11" * 8 if key_id == "made_up" else keys.writer.key_id
    forge_keyed(level, key, kid)
    with SegmentStore.open(level, FP, keys=keys) as s:
        want = NotAuthenticated if key_id == "made_up" else ChecksumMismatch
        with pytest.raises(want):
            s.get_into(key, bytearray(16 * TB))
    found = list(fsck([str(level)], keys={os.path.abspath(level): keys}))
    ids = {f.id for f in found}
    assert ids == ({"SIDECAR_UNAUTHENTICATED"} if key_id == "made_up" else {"SIDECAR_CHECKSUM"})


def test_a_keyed_level_is_not_read_without_its_key(tmp_path: Path) -> None:
    level = tmp_path / "shared"
    with SegmentStore.open(level, FP, keys=LevelKeys([SECRET1])) as s:
        key = s.put_kv(FP.digest(), np.arange(16), kv_bytes(FP, 16), token_start=0).key
    with SegmentStore.open(level, FP) as s, pytest.raises((KeyRequired, SegmentNotFound)):
        s.get_into(key, bytearray(16 * TB))
    other = LevelKeys([SECRET2])
    with SegmentStore.open(level, FP, keys=other) as s, pytest.raises(NotAuthenticated):
        s.get_into(key, bytearray(16 * TB))


def test_keyed_reader_and_writer_and_a_rotation(tmp_path: Path) -> None:
    """Written with key 1; read with [key 2, key 1]: restores whole, and what it writes is
    keyed by key 2, which a reader of key 1 alone refuses."""
    with open_store(tmp_path, key_file(tmp_path, SECRET1)) as store:
        conv, kv = park_and_flush(store, "c", 48, 100)
        out = np.zeros(48 * TB, np.uint8)
        assert store.restore(conv.tokens, out).tokens == 48 and np.array_equal(out, kv)
    rotated = key_file(tmp_path, SECRET2, SECRET1, name="rotated.key")
    with open_store(tmp_path, rotated) as store:
        out = np.zeros(48 * TB, np.uint8)
        assert store.restore(conv.tokens, out).tokens == 48 and np.array_equal(out, kv)
        conv2, _ = park_and_flush(store, "d", 32, 900)
    key2 = conv2.segments(FP.digest())[0][2]
    sc = decode_sidecar((tmp_path / "shared" / sidecar_name(key2)).read_bytes(), unchecked=True)
    assert sc.key_id == key_id_of(derive_key(SECRET2))
    first = LevelKeys([SECRET1])
    old = SegmentStore.open(tmp_path / "shared", FP, keys=first)
    with old, pytest.raises(NotAuthenticated):
        old.get_into(key2, bytearray(32 * TB))


def test_an_unkeyed_store_writes_what_it_wrote_before(tmp_path: Path) -> None:
    with open_store(tmp_path, None) as store:
        conv, kv = park_and_flush(store, "c", 32, 7)
    for start, _, key in conv.segments(FP.digest()):
        raw = (tmp_path / "shared" / sidecar_name(key)).read_bytes()
        sc = decode_sidecar(raw)
        assert sc.key_id == b"" and sc.minor == 0 and struct.unpack_from("<I", raw, 16) == (0,)
        assert len(raw) == 224 + 32 * sc.page_count + 32  # the v1.0 head, nothing added
        assert raw[-32:] == blake3.blake3(raw[:-32]).digest()
        page = kv[start * TB : start * TB + sc.page_len(0)]
        assert sc.page_hash(0) == blake3.blake3(page).digest()


def test_the_secret_is_shown_nowhere(tmp_path: Path) -> None:
    kf = key_file(tmp_path, SECRET1)
    with open_store(tmp_path, kf) as store:
        park_and_flush(store, "c", 32, 7)
        shown = [repr(store.stats()), repr(store.describe()), store.info_line()]
        shown.append(repr(store._tiers.levels[0].store.level_keys))
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    got = subprocess.run(
        [sys.executable, "-m", "stratastore.cli", "inspect", str(tmp_path / "shared")],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    shown += [got.stdout, got.stderr]
    for bad in (b"short", SECRET1 + b"\n" + b"tiny"):  # refused: named by file, never shown
        (tmp_path / "bad.key").write_bytes(bad)
        (tmp_path / "bad.key").chmod(0o600)
        with pytest.raises(ConfigError) as e:
            open_store(tmp_path, tmp_path / "bad.key")
        assert "bad.key" in str(e.value)
        shown.append(str(e.value))
    kf.chmod(0o644)
    with pytest.raises(ConfigError, match="other users") as e:
        open_store(tmp_path, kf)
    shown.append(str(e.value))
    for inline in ({"key": SECRET1.decode()}, {"key_file": SECRET1.decode()}):
        cfg = config(tmp_path, None)
        cfg["levels"][0]["settings"] = inline
        with pytest.raises(ConfigError) as e:
            Store.open(FP, cfg, probe=lambda: 1 << 40)
        shown.append(str(e.value))
    for text in shown:
        assert SECRET1.decode() not in text and derive_key(SECRET1).hex() not in text, text


def test_secrets_from_the_environment_rotate_first_writes() -> None:
    env = {"STRATA_KEY_NEW": SECRET2.decode(), "STRATA_KEY_OLD": SECRET1.decode()}
    keys = level_keys({"key_env": "STRATA_KEY_NEW,STRATA_KEY_OLD"}, env.get)
    assert keys is not None and keys.key_ids == LevelKeys([SECRET2, SECRET1]).key_ids
    with pytest.raises(ConfigError, match=r"STRATA_KEY_GONE \(setting key_env\) is not set") as e:
        level_keys({"key_env": "STRATA_KEY_GONE"}, env.get)
    with pytest.raises(ConfigError, match="environment variables") as inline:
        level_keys({"key_env": SECRET1.decode()}, env.get)  # a secret given by mistake
    for text in (str(e.value), str(inline.value), repr(keys)):
        assert SECRET1.decode() not in text and SECRET2.decode() not in text
