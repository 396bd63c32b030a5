"""Against real servers: Redis AUTH (a password, an ACL user) and TLS (``rediss://``, a client
certificate) work end to end through the Store; credentials, from the config, the environment or the
URL, never appear in a warning, an error, ``Store.stats()``, ``info_line()``, ``prometheus()``, the
published ``monitor.json`` or ``strata monitor``; every key is in the store's namespace (its name
and its model's fingerprint), so two stores or two models on one server never read or delete each
other's segments, and no park, eviction, delete or fsck repair touches a key outside it; the
settings' mistakes are typed ConfigErrors naming the setting."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from stratastore import ModelFingerprint, Store, StoreConfig
from stratastore.errors import ConfigError, StrataError
from stratastore.levels.redis.backend import RedisBackend, RemoteError
from stratastore.levels.redis.settings import RemoteSettings, namespace
from tests.conftest import conversation_kv, tiny_fp
from tests.redis_servers import RedisServer, TlsFiles, free_port
from tests.remote.conftest import ALICE_PASSWORD, AUTH_PASSWORD, import_or_skip

redis = import_or_skip("redis")

REPO = Path(__file__).resolve().parents[2]
ENV_USER, ENV_PASSWORD = "STRATA_REMOTE_USERNAME", "STRATA_REMOTE_PASSWORD"
#: any URL's ``user:password@`` (``redis://:pw@``, ``rediss://user:pw@``)
USERINFO = re.compile(r"[a-z+]+://[^\s/'\"]*@")

Warns = list[str]


@pytest.fixture(autouse=True)
def _no_env_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials in the environment are only those a test sets."""
    monkeypatch.delenv(ENV_USER, raising=False)
    monkeypatch.delenv(ENV_PASSWORD, raising=False)


def _cfg(tmp: Path, url: str, sub: str = "a", **kw: Any) -> StoreConfig:
    """A store with no RAM level (every park is written to disk, then pushed), its own cold
    level ``tmp/sub`` and the remote level at ``url``."""
    kw.setdefault("remote_mib", 16)
    kw.setdefault("remote_timeout_ms", 2000)
    return StoreConfig(ram_mib=0, cold_dir=str(tmp / sub), cold_mib=64, remote_url=url, **kw)


def _park(
    cfg: StoreConfig, fp: ModelFingerprint, base: int, warns: Warns, n: int = 64, step: int = 16
) -> tuple[npt.NDArray[np.uint8], dict[str, Any]]:
    """Park the conversation of tokens ``base..base+n`` (K/V seeded by ``base``) on a store of
    ``cfg``, acknowledged on its disk level and pushed; its K/V and the store's stats."""
    conv, kv = conversation_kv(f"c{base}", n, base, step=step, fp=fp)
    with Store.open(fp, cfg, warn=warns.append) as s:
        report = s.park(conv, kv.copy())
        assert report.where == "disk" and report.tokens == n, report
        s.flush()
        stats = s.stats()
    return kv, stats


def _restore(
    cfg: StoreConfig, fp: ModelFingerprint, base: int, warns: Warns, n: int = 64
) -> tuple[Any, npt.NDArray[np.uint8], dict[str, Any]]:
    """Restore the prompt ``base..base+n`` on a store of ``cfg``: (Restored, bytes, stats)."""
    out = np.zeros(n * fp.token_bytes, np.uint8)
    with Store.open(fp, cfg, warn=warns.append) as s:
        r = s.restore(np.arange(base, base + n), out)
        stats = s.stats()
    return r, out, stats


def _roundtrip(
    tmp: Path, fp: ModelFingerprint, base: int, cfg_of: Callable[[str], StoreConfig]
) -> Warns:
    """Park on one store (its own cold level), restore on another (a fresh one): the bytes
    come from the remote level, whole and equal. The warnings said meanwhile."""
    warns: Warns = []
    kv, stats = _park(cfg_of("node-a"), fp, base, warns)
    remote = stats["levels"]["remote"]
    assert remote["remote_puts"] >= 1 and remote["remote_errors"] == 0, remote
    assert remote["entries"] >= 4, remote  # 4 segments of 16 tokens
    r, out, stats = _restore(cfg_of("node-b"), fp, base, warns)
    assert (r.source, r.tokens) == ("remote", 64), r
    assert np.array_equal(out, kv)
    assert stats["hits_remote"] == 1 and stats["levels"]["remote"]["remote_errors"] == 0
    return warns


def _chain(e: BaseException) -> str:
    """The text of ``e`` and of every exception chained to it (a cause or a context, shown or
    suppressed: ``raise ... from None`` keeps the context on the exception)."""
    out, seen = [], set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        out += [str(cur), repr(cur), *traceback.format_exception_only(cur)]
        cur = cur.__cause__ or cur.__context__
    return "\n".join(out)


def _monitor(level_dir: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """``strata monitor LEVEL_DIR FLAGS`` in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "stratastore.cli", "monitor", str(level_dir), *flags],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def _keys(server: RedisServer, pattern: str = "*") -> set[bytes]:
    r = redis.Redis(**server.client_kwargs(), socket_timeout=5)
    try:
        return set(r.scan_iter(match=pattern, count=1000))
    finally:
        r.close()


# -- AUTH -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cfg_pw", "env_pw", "url_pw", "ok"),
    [
        (AUTH_PASSWORD, "", "", True),
        ("", AUTH_PASSWORD, "", True),
        ("", "", AUTH_PASSWORD, True),
        (AUTH_PASSWORD, "wrong-env-pw", "", True),  # the config comes first
        ("", AUTH_PASSWORD, "wrong-url-pw", True),  # then the environment
        ("wrong-cfg-pw", AUTH_PASSWORD, "", False),  # the config's, though wrong, is used
    ],
    ids=["config", "env", "url", "config-over-env", "env-over-url", "config-wrong-env-right"],
)
def test_auth_password_from_config_env_or_url(
    redis_auth_server: RedisServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cfg_pw: str,
    env_pw: str,
    url_pw: str,
    ok: bool,
) -> None:
    """A store with the server's password (from the config, else the environment, else the
    URL) parks, and another restores from the remote level what it parked."""
    s = redis_auth_server
    url = f"redis://:{url_pw}@127.0.0.1:{s.port}/0" if url_pw else s.url
    if env_pw:
        monkeypatch.setenv(ENV_PASSWORD, env_pw)
    name = f"auth-{cfg_pw[:5]}-{env_pw[:5]}-{url_pw[:5]}".lower()

    def cfg(sub: str) -> StoreConfig:
        return _cfg(tmp_path, url, sub, remote_password=cfg_pw, remote_name=name)

    if not ok:
        with pytest.raises(ConfigError, match="authentication refused") as e:
            Store.open(tiny_fp(), cfg("node-a"), warn=[].append)
        assert "wrong-cfg-pw" not in str(e.value) and AUTH_PASSWORD not in str(e.value)
        return
    warns = _roundtrip(tmp_path, tiny_fp(), 1000, cfg)
    assert warns == []
    keys = _keys(s, f"strata/{name}/*")
    assert keys and all(k.startswith(f"strata/{name}/".encode()) for k in keys)


@pytest.mark.parametrize("via", ["config", "env", "url"])
def test_acl_user_alice_in_her_namespace(
    redis_auth_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, via: str
) -> None:
    """The ACL user alice (keys ``strata/alice/*`` only) works with remote_name="alice": every
    key the store writes is ``strata/alice/<fp>/...``."""
    s = redis_auth_server
    fp = tiny_fp(f"test/alice-{via}")  # a model of its own: a namespace of its own
    url, creds = s.url, {"remote_username": "alice", "remote_password": ALICE_PASSWORD}
    if via == "env":
        monkeypatch.setenv(ENV_USER, "alice")
        monkeypatch.setenv(ENV_PASSWORD, ALICE_PASSWORD)
        creds = {}
    elif via == "url":
        url, creds = f"redis://alice:{ALICE_PASSWORD}@127.0.0.1:{s.port}/0", {}
    before = _keys(s)

    def cfg(sub: str) -> StoreConfig:
        return _cfg(tmp_path, url, sub, remote_name="alice", **creds)

    assert _roundtrip(tmp_path, fp, 2000, cfg) == []
    new = _keys(s) - before
    ns = namespace("alice", fp).encode()
    assert new and all(k.startswith(ns) for k in new), sorted(new)[:5]


def test_wrong_password_is_a_config_error_without_it(
    redis_auth_server: RedisServer, tmp_path: Path
) -> None:
    """A wrong password: Store.open raises ConfigError naming the settings to fix and not the
    password; nothing stays open (the same directories open again with the right one)."""
    wrong = "Wr0ng-Pa55-xyz"
    cfg = _cfg(tmp_path, redis_auth_server.url, remote_password=wrong, remote_name="wrongpw")
    warns: Warns = []
    with pytest.raises(ConfigError) as e:
        Store.open(tiny_fp(), cfg, warn=warns.append)
    msg = _chain(e.value)
    assert isinstance(e.value, StrataError)
    assert "authentication refused" in msg and "remote_password" in msg
    assert redis_auth_server.url.replace("redis://", "") in msg  # which server
    assert wrong not in msg and wrong not in repr(e.value) and warns == []
    good = _cfg(
        tmp_path, redis_auth_server.url, remote_password=AUTH_PASSWORD, remote_name="wrongpw"
    )
    _, stats = _park(good, tiny_fp(), 3000, warns)
    assert stats["levels"]["remote"]["remote_puts"] >= 1 and warns == []


def test_no_password_says_what_to_set(redis_auth_server: RedisServer, tmp_path: Path) -> None:
    """No credentials at all against a server that wants them: ConfigError at open, naming
    the config settings and the environment variables that give them."""
    cfg = _cfg(tmp_path, redis_auth_server.url, remote_name="nopw")
    with pytest.raises(ConfigError, match="authentication refused") as e:
        Store.open(tiny_fp(), cfg, warn=[].append)
    for name in ("remote_password", "remote_username", ENV_PASSWORD):
        assert name in str(e.value), str(e.value)


def test_alice_outside_her_keys_is_refused_and_the_park_stands(
    redis_auth_server: RedisServer, tmp_path: Path
) -> None:
    """alice with remote_name="bob" (keys strata/bob/..., not hers): the server refuses every
    key (NOPERM). The park is acknowledged on the local level and restores from it; the
    refusal is typed (RemoteError), counted and said, without alice's password."""
    s = redis_auth_server
    cfg = _cfg(
        tmp_path, s.url, remote_name="bob", remote_username="alice", remote_password=ALICE_PASSWORD
    )
    fp = tiny_fp()
    warns: Warns = []
    conv, kv = conversation_kv("c4000", 64, 4000, fp=fp)
    with Store.open(fp, cfg, warn=warns.append) as st:
        assert st.park(conv, kv.copy()).where == "disk"
        st.flush()  # nothing to report: the park landed locally
        remote = st.stats()["levels"]["remote"]
        assert remote["remote_put_errors"] == 1 and remote["remote_errors"] >= 1, remote
        assert remote["backend_errors"] >= 1 and remote["remote_puts"] == 0, remote
        out = np.zeros_like(kv)
        r = st.restore(np.arange(4000, 4064), out)
        assert (r.source, r.tokens) == ("disk", 64) and np.array_equal(out, kv)
        backend = st._tiers.remote.store  # type: ignore[union-attr]
        with pytest.raises(RemoteError, match="NoPermission") as e:
            backend.keys()
        assert isinstance(e.value, StrataError) and ALICE_PASSWORD not in str(e.value)
    assert len(warns) == 1 and "no permissions" in warns[0], warns
    assert ALICE_PASSWORD not in warns[0] and s.url.replace("redis://", "") in warns[0]
    assert _keys(s, "strata/bob/*") == set()


# -- TLS ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mtls_server(
    redis_bin: tuple[str, str], tls_files: TlsFiles, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisServer]:
    """A TLS-only server that requires a client certificate."""
    d = tmp_path_factory.mktemp("redis-mtls")
    with RedisServer(d, tls=tls_files, tls_auth_clients=True, binaries=redis_bin) as server:
        yield server


def test_tls_end_to_end(redis_tls_server: RedisServer, tls_files: TlsFiles, tmp_path: Path) -> None:
    """rediss:// with the CA of the server's certificate: one store parks, another restores."""
    assert redis_tls_server.url.startswith("rediss://")

    def cfg(sub: str) -> StoreConfig:
        return _cfg(
            tmp_path, redis_tls_server.url, sub, remote_tls_ca=str(tls_files.ca), remote_name="tls"
        )

    assert _roundtrip(tmp_path, tiny_fp("test/tls"), 5000, cfg) == []


def test_tls_client_certificate(
    mtls_server: RedisServer, tls_files: TlsFiles, tmp_path: Path
) -> None:
    """A server that asks for a client certificate: remote_tls_cert and remote_tls_key are
    used (end to end); without them the level fails typed, the park stands locally."""
    t = tls_files

    def cfg(sub: str, **kw: Any) -> StoreConfig:
        return _cfg(
            tmp_path,
            mtls_server.url,
            sub,
            remote_tls_ca=str(t.ca),
            remote_name="mtls",
            remote_timeout_ms=1000,
            **kw,
        )

    certs = {"remote_tls_cert": str(t.client_cert), "remote_tls_key": str(t.client_key)}
    assert _roundtrip(tmp_path, tiny_fp("test/mtls"), 6000, lambda sub: cfg(sub, **certs)) == []
    warns: Warns = []
    started = time.monotonic()
    _, stats = _park(cfg("no-cert"), tiny_fp("test/mtls-none"), 6100, warns)
    assert time.monotonic() - started < 10
    remote = stats["levels"]["remote"]
    assert remote["remote_errors"] >= 1 and remote["remote_puts"] == 0, remote
    assert warns and "failed" in warns[0], warns


def test_tls_client_certificate_with_the_wrong_key_is_a_config_error(
    mtls_server: RedisServer, tls_files: TlsFiles, tmp_path: Path
) -> None:
    t = tls_files
    cfg = _cfg(
        tmp_path,
        mtls_server.url,
        remote_tls_ca=str(t.ca),
        remote_tls_cert=str(t.client_cert),
        remote_tls_key=str(t.key),
    )
    with pytest.raises(ConfigError, match="remote_tls_cert") as e:
        Store.open(tiny_fp(), cfg, warn=[].append)
    assert "TLS" in str(e.value)


def test_tls_without_the_ca_is_a_config_error(
    redis_tls_server: RedisServer, tmp_path: Path
) -> None:
    """rediss:// without remote_tls_ca: the test CA is not trusted, so the server's
    certificate is refused: ConfigError at open naming remote_tls_ca, at once."""
    started = time.monotonic()
    with pytest.raises(ConfigError, match="certificate") as e:
        Store.open(tiny_fp(), _cfg(tmp_path, redis_tls_server.url), warn=[].append)
    assert time.monotonic() - started < 5
    assert "remote_tls_ca" in str(e.value) and "rediss://127.0.0.1" in str(e.value)


def test_tls_ca_file_missing_is_a_config_error(
    redis_tls_server: RedisServer, tmp_path: Path
) -> None:
    cfg = _cfg(tmp_path, redis_tls_server.url, remote_tls_ca=str(tmp_path / "no-such-ca.pem"))
    with pytest.raises(ConfigError, match="remote_tls_ca"):
        Store.open(tiny_fp(), cfg, warn=[].append)


def test_plain_redis_to_the_tls_port_fails_typed_without_hanging(
    redis_tls_server: RedisServer, tmp_path: Path
) -> None:
    """redis:// to a TLS-only port: no hang (a short timeout bounds it), the level is said
    failed and skipped, its calls raise RemoteError, and a park stands on the local level."""
    url = redis_tls_server.url.replace("rediss://", "redis://")
    cfg = _cfg(tmp_path, url, remote_timeout_ms=500, remote_name="plain-to-tls")
    fp = tiny_fp()
    warns: Warns = []
    started = time.monotonic()
    conv, kv = conversation_kv("c7000", 64, 7000, fp=fp)
    with Store.open(fp, cfg, warn=warns.append) as st:
        assert st.park(conv, kv.copy()).where == "disk"
        st.flush()
        remote = st.stats()["levels"]["remote"]
        assert remote["remote_errors"] >= 1 and remote["remote_puts"] == 0, remote
        assert remote["entries"] is None, remote
        with pytest.raises(RemoteError):
            st._tiers.remote.store.keys()  # type: ignore[union-attr]
        out = np.zeros_like(kv)
        r = st.restore(np.arange(7000, 7064), out)
        assert (r.source, r.tokens) == ("disk", 64) and np.array_equal(out, kv)
    assert time.monotonic() - started < 10
    assert warns and "failed" in warns[0] and url.split("://")[1] in warns[0], warns


def test_tls_settings_checked_in_the_config(tls_files: TlsFiles) -> None:
    """Half a client certificate, or TLS files for a plain URL: ConfigError naming them,
    before anything connects (nothing listens at port 1)."""
    t, url = tls_files, "rediss://127.0.0.1:1/0"
    ok = StoreConfig(
        remote_url=url,
        remote_mib=1,
        remote_tls_ca=str(t.ca),
        remote_tls_cert=str(t.client_cert),
        remote_tls_key=str(t.client_key),
    )
    assert ok.remote_tls_key == str(t.client_key)
    for kw in ({"remote_tls_cert": str(t.client_cert)}, {"remote_tls_key": str(t.client_key)}):
        with pytest.raises(ConfigError, match="remote_tls_cert and remote_tls_key"):
            StoreConfig(remote_url=url, remote_mib=1, **kw)
    with pytest.raises(ConfigError, match=r"remote_tls_ca .*rediss://"):
        StoreConfig(remote_url="redis://127.0.0.1:1/0", remote_mib=1, remote_tls_ca=str(t.ca))


# -- credentials never shown ------------------------------------------------------------------

SECRET = "Zq7-leak-canary-pw"  #: the default user's password of this part's servers
CAROL_PASSWORD = "Cp9-carol-canary-pw"  #: the ACL user carol's (keys strata/carol/* only)
#: what ``strata monitor`` (the table) said with a remote level before its fix
MONITOR_TABLE_BUG = "KeyError: 'oldest_age_s'"


@pytest.mark.parametrize("via", ["config", "env", "url", "url-user", "env-user"])
def test_credentials_are_never_shown(
    redis_bin: tuple[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    via: str,
) -> None:
    """Every warning, error, stats document, info line, Prometheus page, published
    monitor.json and ``strata monitor`` output (table, JSON, Prometheus) of stores with
    credentials, working and failing, names the server without them."""
    server = RedisServer(
        tmp_path / "redis",
        password=SECRET,
        binaries=redis_bin,
        acl_users=[f"user carol on >{CAROL_PASSWORD} ~strata/carol/* +@all"],
    )
    shown = f"redis://127.0.0.1:{server.port}/0"
    host = f"127.0.0.1:{server.port}/0"
    name = "carol" if via.endswith("user") else "leak"
    seen: list[str] = []  # everything shown, to search at the end

    def settings(pw: str) -> tuple[str, dict[str, str]]:
        """(url, config credentials) giving ``pw`` the way ``via`` says (env: set now)."""
        user = "carol" if via.endswith("user") else ""
        if via.startswith("url"):
            return f"redis://{user}:{pw}@{host}", {}
        if via.startswith("env"):
            monkeypatch.setenv(ENV_PASSWORD, pw)
            if user:
                monkeypatch.setenv(ENV_USER, user)
            return shown, {}
        return shown, {"remote_password": pw}

    def cfg(sub: str, pw: str) -> StoreConfig:
        url, creds = settings(pw)
        return _cfg(tmp_path, url, sub, remote_name=name, **creds)

    def error(fn: Callable[[], object]) -> StrataError:
        with pytest.raises(StrataError) as e:
            fn()
        seen.append(_chain(e.value))
        return e.value

    password = CAROL_PASSWORD if name == "carol" else SECRET
    wrong = "Wrong-canary-pw-123"
    try:
        # errors: a wrong password, a bad URL carrying one, a URL that is not a string
        e = error(lambda: Store.open(tiny_fp(), cfg("wrong", wrong), warn=seen.append))
        assert isinstance(e, ConfigError) and shown in str(e)
        e = error(
            lambda: StoreConfig(remote_url=f"redis://:{SECRET}@127.0.0.1:port/0", remote_mib=1)
        )
        assert isinstance(e, ConfigError) and "remote_url" in str(e)
        e = error(lambda: StoreConfig(remote_url=f"redis:/:{SECRET}@x", remote_mib=1))
        assert isinstance(e, ConfigError) and "remote_url" in str(e)
        e = error(
            lambda: StoreConfig(
                remote_url=f"redis://:{SECRET}@h:1/0".encode(),  # type: ignore[arg-type]
                remote_mib=1,
            )
        )
        assert isinstance(e, ConfigError) and "remote_url" in str(e)
        e = error(lambda: StoreConfig(remote_password=SECRET.encode()))  # type: ignore[arg-type]
        assert isinstance(e, ConfigError) and "remote_password" in str(e)

        # working: park on A, restore on B, every view of both
        fp = tiny_fp()
        good_a = cfg("node-a", password)
        seen += [repr(good_a), str(good_a), repr(RemoteSettings.from_config(good_a))]
        conv, kv = conversation_kv("c8000", 64, 8000, fp=fp)
        with Store.open(fp, good_a, warn=seen.append) as a:
            a.park(conv, kv.copy())
            a.flush()
            stats = a.stats()
            assert stats["levels"]["remote"]["remote_puts"] >= 1, stats
            assert stats["levels"]["remote"]["dir"] == shown
            seen += [json.dumps(stats, default=str), a.info_line(), a.prometheus()]
            assert shown in seen[-2] and "strata_remote_puts_total" in seen[-1]
            assert a.publish()
        b = Store.open(fp, cfg("node-b", password), warn=seen.append)
        try:
            out = np.zeros_like(kv)
            assert b.restore(np.arange(8000, 8064), out).source == "remote"
            server.kill()  # now the level fails: warnings, errors, stats of a dead server
            conv2, kv2 = conversation_kv("c8100", 64, 8100, fp=fp)
            b.park(conv2, kv2)
            b.flush()
            stats = b.stats()
            remote = stats["levels"]["remote"]
            assert remote["remote_errors"] >= 1 and remote["entries"] is None, remote
            seen += [json.dumps(stats, default=str), b.prometheus()]
            seen.append(b._tiers.remote.last_error)  # type: ignore[union-attr]
            seen.append(b.info_line())
            error(lambda: b._tiers.remote.store.keys())  # type: ignore[union-attr]
        finally:
            b.close()
        assert any(shown in w and "failed" in w for w in seen), "no warning of the failure"

        # what strata monitor and a scraper see
        for sub in ("node-a", "node-b"):
            published = (tmp_path / sub / "strata-index" / "monitor.json").read_text()
            assert shown in published
            seen.append(published)
        for sub in ("node-b",):  # its snapshot: a remote hit, then the level down
            for flags in (["--once"], ["--json"], ["--prometheus"]):
                got = _monitor(tmp_path / sub, *flags)
                assert got.returncode == 0, (flags, got.stderr[-2000:])
                seen += [got.stdout, got.stderr]
                if flags != ["--prometheus"]:
                    assert shown in got.stdout, (flags, got.stdout)
                else:
                    assert "strata_remote_puts_total" in got.stdout
    finally:
        server.stop()
    captured = capsys.readouterr()
    seen += [captured.out, captured.err]
    everything = "\n".join(seen)
    for secret in (SECRET, CAROL_PASSWORD, wrong):
        assert secret not in everything, everything[max(0, everything.find(secret) - 300) :][:600]
    found = USERINFO.search(everything)
    assert found is None, everything[max(0, found.start() - 300) :][:600]


# -- namespaces -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ns_server(
    redis_bin: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisServer]:
    """A plain server of this module's namespace tests."""
    with RedisServer(tmp_path_factory.mktemp("redis-ns"), binaries=redis_bin) as server:
        yield server


@pytest.fixture
def raw(ns_server: RedisServer) -> Iterator[Any]:
    r = redis.Redis(**ns_server.client_kwargs(), socket_timeout=5)
    yield r
    r.close()


def _dump(r: Any, outside: str) -> dict[bytes, tuple[bytes, int]]:
    """Every key not starting with ``outside``: its DUMP (type and value) and its TTL."""
    return {
        k: (r.dump(k), r.pttl(k))
        for k in r.scan_iter(count=1000)
        if not k.startswith(outside.encode())
    }


def _plant_foreign(r: Any, ns: str, copy_of: bytes | None = None) -> list[bytes]:
    """Keys of other stores, other models, and other users of the server, several shaped like
    ours (an orphan part, a commit record) and several sharing a prefix with ``ns``."""
    _, name, fp32, _ = ns.split("/")
    k, n = "ab" * 32, "0" * 32
    keys: dict[bytes, Any] = {
        b"user:1": b"alice",
        b"{braces}user:2": b"x" * 100,
        b"\xff\x00strata-binary": b"\x00\x01",
        b"strata/*": b"glob",
        b"strata/[a]": b"glob",
        b"strata": b"bare",
        f"strata/other/{fp32}/p/{{{k}}}/{n}/0".encode(): b"part of another store",
        f"strata/{name}x/{fp32}/p/{{{k}}}/{n}/0".encode(): b"a name that extends ours",
        f"strata/{name}/{'f' * 32}/p/{{{k}}}/{n}/0".encode(): b"our name, another model",
        f"strata/{name}/{fp32}".encode(): b"our namespace without its slash",
        f"strata/{name}/{fp32}0/p/{{{k}}}/{n}/0".encode(): b"our fingerprint, one more digit",
        f"strata/{name}/{fp32}0/used".encode(): b"999999",
        f"strata/alicex/{fp32}/s/{{{k}}}".encode(): b"SRC1:not ours",
    }
    for key, value in keys.items():
        r.set(key, value)
    r.hset(f"strata/other/{fp32}/recs", k, b"record")
    r.zadd(f"strata/other/{fp32}/ages", {f"{0:020d}:{k}": 0})
    r.rpush("queue:{x}", b"a", b"b")
    r.sadd("set:1", b"m")
    extra = [
        f"strata/other/{fp32}/recs".encode(),
        f"strata/other/{fp32}/ages".encode(),
        b"queue:{x}",
        b"set:1",
    ]
    if copy_of is not None:  # a copy of one of our commit records, in another store's space
        for where in (f"strata/other/{fp32}/s/", f"strata/{name}/{'f' * 32}/s/"):
            key = where + copy_of.decode().split("/s/", 1)[1]
            r.set(key, r.get(copy_of))
            extra.append(key.encode())
    return [*keys, *extra]


def test_two_stores_one_server_each_reads_only_its_own(
    ns_server: RedisServer, raw: Any, tmp_path: Path
) -> None:
    """Stores "ns-a" and "ns-b" park the same tokens with different K/V (equal segment keys,
    different namespaces): each restores its own bytes, a third store name finds nothing,
    and the fsck repair of one leaves every key of the other as it was."""
    fp = tiny_fp()
    url = ns_server.url
    warns: Warns = []
    kv_a, stats_a = _park(_cfg(tmp_path, url, "a1", remote_name="ns-a"), fp, 100, warns)
    conv_b, kv_b = conversation_kv("c100", 64, 100, fp=fp)
    kv_b = kv_b[::-1].copy()  # the same tokens, other bytes
    with Store.open(fp, _cfg(tmp_path, url, "b1", remote_name="ns-b"), warn=warns.append) as s:
        s.park(conv_b, kv_b.copy())
        s.flush()
        stats_b = s.stats()
    ns_a = stats_a["levels"]["remote"]["namespace"]
    ns_b = stats_b["levels"]["remote"]["namespace"]
    assert ns_a == namespace("ns-a", fp) and ns_b == namespace("ns-b", fp) and ns_a != ns_b
    assert stats_b["levels"]["remote"]["remote_puts"] >= 4  # stored again: not ns-a's copy
    for name, want in (("ns-a", kv_a), ("ns-b", kv_b)):
        r, out, _ = _restore(_cfg(tmp_path, url, f"{name}-r", remote_name=name), fp, 100, warns)
        assert (r.source, r.tokens) == ("remote", 64) and np.array_equal(out, want), name
    r, _, stats = _restore(_cfg(tmp_path, url, "c-r", remote_name="ns-c"), fp, 100, warns)
    assert r.tokens == 0 and stats["levels"]["remote"]["remote_misses"] == 1
    assert warns == []

    # damage in ns-a only; its repair fixes that, and ns-b is byte-identical
    orphan = f"{ns_a}p/{{{'ab' * 32}}}/{'0' * 32}/0"
    raw.set(orphan, b"orphan")
    raw.set(f"{ns_a}s/{{{'cd' * 32}}}", b"not a commit record")
    raw.incrby(f"{ns_a}used", 12345)
    before = _dump(raw, ns_a)
    assert any(k.startswith(ns_b.encode()) for k in before)
    backend = RedisBackend.open(RemoteSettings(url, name="ns-a"), fp)
    try:
        report = backend.fsck(repair=True)
        assert report.repaired and report.orphan_parts == [orphan], report
        assert len(report.bad_records) == 1 and report.used_recorded != report.used_actual
        assert backend.fsck().clean and raw.get(orphan) is None
    finally:
        backend.close()
    assert _dump(raw, ns_a) == before
    r, out, _ = _restore(_cfg(tmp_path, url, "b-r2", remote_name="ns-b"), fp, 100, warns)
    assert (r.source, r.tokens) == ("remote", 64) and np.array_equal(out, kv_b)


def test_two_models_one_name_each_reads_only_its_own(
    ns_server: RedisServer, raw: Any, tmp_path: Path
) -> None:
    """Two models under one store name: two namespaces; a store of one model never finds the
    other's segments, and its fsck repair leaves the other's keys as they were."""
    fp1, fp2 = tiny_fp("test/model-one"), tiny_fp("test/model-two")
    url, warns = ns_server.url, []
    kv1, st1 = _park(_cfg(tmp_path, url, "m1", remote_name="models"), fp1, 200, warns)
    ns1, ns2 = namespace("models", fp1), namespace("models", fp2)
    assert st1["levels"]["remote"]["namespace"] == ns1 != ns2
    r, _, st = _restore(_cfg(tmp_path, url, "m2", remote_name="models"), fp2, 200, warns)
    assert r.tokens == 0 and st["levels"]["remote"]["namespace"] == ns2
    kv2, _ = _park(_cfg(tmp_path, url, "m2b", remote_name="models"), fp2, 200, warns)
    raw.set(f"{ns2}p/{{{'ef' * 32}}}/{'1' * 32}/0", b"orphan of model two")
    before = _dump(raw, ns2)
    assert sum(k.startswith(ns1.encode()) for k in before) >= 8  # 4 records, 4 parts, ...
    backend = RedisBackend.open(RemoteSettings(url, name="models"), fp2)
    try:
        rep = backend.fsck(repair=True)
        assert rep.repaired and len(rep.orphan_parts) == 1 and rep.segments == 4, rep
    finally:
        backend.close()
    assert _dump(raw, ns2) == before
    for fp, want, sub in ((fp1, kv1, "m1-r"), (fp2, kv2, "m2-r")):
        r, out, _ = _restore(_cfg(tmp_path, url, sub, remote_name="models"), fp, 200, warns)
        assert (r.source, r.tokens) == ("remote", 64) and np.array_equal(out, want), sub
    assert warns == []


def test_parks_evictions_deletes_and_fsck_never_touch_foreign_keys(
    ns_server: RedisServer, raw: Any, tmp_path: Path
) -> None:
    """With keys of other stores, models and users on the server (some shaped like ours,
    some sharing our prefix), a store parks past its budget (remote_eviction=store: it
    evicts its oldest), its segments are deleted one by one (and a key only another store
    holds), and its namespace is damaged and repaired: every key outside the namespace is
    byte-identical at the end, and another store's chain, parked first, still restores."""
    fp, url, warns = tiny_fp("test/evict"), ns_server.url, []
    kv_other, _ = _park(_cfg(tmp_path, url, "o", remote_name="ev-other"), fp, 300, warns)
    ns = namespace("ev-small", fp)
    cfg = _cfg(tmp_path, url, "s", remote_name="ev-small", remote_mib=1)
    n, bases = 4096, (10_000, 20_000, 30_000, 40_000, 50_000, 60_000)  # 256 KiB each
    kv0, _ = _park(cfg, fp, bases[0], warns, n=n, step=512)
    first = sorted(raw.scan_iter(match=f"{ns}s/*"))[0]
    planted = _plant_foreign(raw, ns, copy_of=first)
    before = _dump(raw, ns)
    assert set(planted) <= set(before) and len(before) > len(planted)

    kvs = {}
    with Store.open(fp, cfg, warn=warns.append) as s:
        for base in bases[1:]:
            conv, kv = conversation_kv(f"c{base}", n, base, step=512, fp=fp)
            kvs[base] = kv
            s.park(conv, kv.copy())
            s.flush()
        remote = s.stats()["levels"]["remote"]
    assert remote["remote_evictions"] > 0 and 0 < remote["bytes"] <= 1 << 20, remote
    assert warns == []
    assert _dump(raw, ns) == before
    r, out, _ = _restore(
        _cfg(tmp_path, url, "s-r", remote_name="ev-small"), fp, bases[-1], warns, n=n
    )
    assert (r.source, r.tokens) == ("remote", n) and np.array_equal(out, kvs[bases[-1]])

    backend = RedisBackend.open(RemoteSettings(url, name="ev-small"), fp)
    try:
        ours = backend.keys()
        assert ours
        only_other = bytes.fromhex(first.decode().split("{", 1)[1].rstrip("}"))
        if only_other in ours:  # the copied record's segment may still be ours: delete it
            assert backend.delete(only_other)
        assert backend.delete(only_other) is False  # now only other namespaces hold it
        for key in backend.keys():
            assert backend.delete(key)
        assert backend.keys() == [] and backend.used() == 0
        raw.set(f"{ns}p/{{{'ab' * 32}}}/{'0' * 32}/0", b"orphan")
        raw.set(f"{ns}s/{{{'cd' * 32}}}", b"damaged")
        raw.hset(f"{ns}recs", mapping={"ef" * 32: b"stale", "not-hex": b"x"})
        raw.set(f"{ns}used", b"garbage")
        odd = [f"{ns}s/{{zz}}", f"{ns}s/{{{'ab' * 32}", f"{ns}p/{{zz}}/{'0' * 32}/0"]
        for name in odd:  # in the namespace, but not shaped as the backend's keys
            raw.set(name, b"odd")
        rep = backend.fsck(repair=True)
        assert rep.repaired and len(rep.orphan_parts) == 1 and len(rep.bad_records) == 1, rep
        assert sorted(rep.stale_index) == [b"not-hex", bytes.fromhex("ef" * 32)], rep
        assert rep.used_recorded == -1 and rep.used_actual == 0, rep
        assert backend.fsck().clean and backend.used() == 0 and backend.keys() == []
    finally:
        backend.close()
    assert sorted(raw.scan_iter(match=f"{ns}[sp]/*")) == sorted(n.encode() for n in odd)
    assert _dump(raw, ns) == before
    r, out, _ = _restore(_cfg(tmp_path, url, "o-r", remote_name="ev-other"), fp, 300, warns)
    assert (r.source, r.tokens) == ("remote", 64) and np.array_equal(out, kv_other)
    del kv0


# -- configuration mistakes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:6379/0",
        "127.0.0.1:6379",
        "redis://",
        "redis://:Pw-in-url-canary@127.0.0.1:notaport/0",
        "redis://:Pw-in-url-canary@",
        "redis:/:Pw-in-url-canary@127.0.0.1:6379",
        "redis://127.0.0.1:6379,127.0.0.1:6380/0",
        "redis://127.0.0.1:6379/db",
        "redis+cluster://127.0.0.1:7000/2",
        "redis://127.0.0.1:99999/0",
    ],
)
def test_bad_urls_are_config_errors_without_credentials(url: str) -> None:
    with pytest.raises(ConfigError, match="remote_url") as e:
        StoreConfig(remote_url=url, remote_mib=1)
    assert "Pw-in-url-canary" not in str(e.value)
    assert USERINFO.search(str(e.value)) is None, str(e.value)


@pytest.mark.parametrize(
    "name", ["", "Alice", "a/b", "a*", "{tag}", "a b", "x" * 65, "ünï", "a:b", "a[0]"]
)
def test_bad_remote_names_are_config_errors(name: str) -> None:
    with pytest.raises(ConfigError, match="remote_name"):
        StoreConfig(remote_url="redis://127.0.0.1:1/0", remote_mib=1, remote_name=name)
    with pytest.raises(ConfigError, match="remote_name"):  # checked with the remote level off
        StoreConfig(remote_name=name)


def test_good_settings_are_accepted() -> None:
    """The counterparts of the mistakes below: each of these constructs."""
    for kw in (
        {"remote_mib": 1},
        {"remote_eviction": "redis"},
        {"remote_mib": 1, "remote_name": "a-b_c.9", "remote_part_mib": 512, "remote_timeout_ms": 1},
    ):
        StoreConfig(remote_url="redis+cluster://127.0.0.1:1,127.0.0.1:2", **kw)


@pytest.mark.parametrize(
    ("kw", "names"),
    [
        ({"remote_mib": 0}, ("remote_mib", "remote_eviction")),
        ({"remote_eviction": "redis", "remote_mib": 4}, ("remote_mib=4", "remote_eviction")),
        ({"remote_eviction": "lru", "remote_mib": 4}, ("remote_eviction",)),
        ({"remote_mib": 4, "remote_timeout_ms": 0}, ("remote_timeout_ms",)),
        ({"remote_mib": 4, "remote_part_mib": 0}, ("remote_part_mib",)),
        ({"remote_mib": 4, "remote_part_mib": 513}, ("remote_part_mib",)),
        ({"remote_mib": -1}, ("remote_mib",)),
        ({"remote_mib": 4, "remote_keep_local": "yes"}, ("remote_keep_local",)),
    ],
)
def test_eviction_and_budget_mistakes_name_the_setting(
    kw: dict[str, Any], names: tuple[str, ...]
) -> None:
    with pytest.raises(ConfigError) as e:
        StoreConfig(remote_url="redis://127.0.0.1:1/0", **kw)
    for name in names:
        assert name in str(e.value), str(e.value)


def test_remote_url_needs_a_disk_level(tmp_path: Path) -> None:
    """No disk level (none, or the cold level switched off): Store.open raises ConfigError
    naming remote_url and what to set, before connecting (nothing listens at port 1)."""
    for cfg in (
        StoreConfig(ram_mib=1, remote_url="redis://127.0.0.1:1/0", remote_mib=1),
        StoreConfig(
            ram_mib=1,
            cold_dir=str(tmp_path / "off"),
            cold_mib=0,
            remote_url="redis://127.0.0.1:1/0",
            remote_mib=1,
        ),
    ):
        with pytest.raises(ConfigError, match="remote_url needs a local disk level") as e:
            Store.open(tiny_fp(), cfg, warn=[].append)
        assert "cold_dir" in str(e.value)


def test_mapping_and_toml_mistakes_name_the_setting(tmp_path: Path) -> None:
    toml = tmp_path / "strata.toml"
    toml.write_text('remote_url = "redis://127.0.0.1:1/0"\nremote_password = "Toml-canary"\n')
    with pytest.raises(ConfigError, match="remote_mib") as e:
        StoreConfig.from_toml(str(toml))
    assert "Toml-canary" not in str(e.value)
    with pytest.raises(ConfigError, match="remote_name"):
        StoreConfig.from_mapping(
            {"remote_url": "redis://127.0.0.1:1/0", "remote_mib": 1, "remote_name": "Bad/Name"}
        )
    cfg = StoreConfig.from_mapping(
        {"remote_url": "redis://127.0.0.1:1/0", "remote_mib": 1, "remote_password": "Map-canary"}
    )
    assert "Map-canary" not in repr(cfg) and "Map-canary" not in str(cfg)


# -- bugs this file found: the info line and the monitor table with a remote level ------------


def test_info_line_while_the_remote_level_is_down(tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens: the level is down
    warns: Warns = []
    with Store.open(tiny_fp(), _cfg(tmp_path, url, remote_timeout_ms=500), warn=warns.append) as s:
        assert warns and s.stats()["levels"]["remote"]["bytes"] is None
        line = s.info_line()
    assert "remote=-" in line or "remote=None" in line, line


def test_strata_monitor_table_shows_the_remote_level(
    ns_server: RedisServer, tmp_path: Path
) -> None:
    _park(_cfg(tmp_path, ns_server.url, remote_name="monitor"), tiny_fp(), 900, [])
    got = _monitor(tmp_path / "a", "--once")
    assert MONITOR_TABLE_BUG not in got.stderr
    assert got.returncode == 0 and f"redis://127.0.0.1:{ns_server.port}/0" in got.stdout
