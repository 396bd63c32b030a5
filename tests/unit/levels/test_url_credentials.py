"""No byte of a credential is ever shown: whatever ``remote_url`` holds, parseable or not, no
part of its userinfo (nor a password or user name given in the config) reaches an error, a
warning, ``repr``, stats, the info line, Prometheus or the published monitor file.

The credentials are drawn from letters no message of the store uses (``ZQXJ``) among the URL's
own delimiters, so any leak of any fragment of them shows as one of those letters."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stratastore import StoreConfig
from stratastore.errors import ConfigError, StrataError
from stratastore.facade import Store
from stratastore.levels.redis.settings import RemoteSettings
from tests.conftest import conversation_kv, tiny_fp

MARK = set("ZQXJ")  #: the letters of every credential here, and of no message
SECRET_CHARS = "ZQXJ" + "#?@/:%&=+!;,[] .-_~"
secret = st.text(alphabet=SECRET_CHARS, min_size=1, max_size=24).filter(lambda s: MARK & set(s))
junk = st.text(alphabet="abc019/?#@:.,%[]", max_size=12)  #: after the host: no credential
scheme = st.sampled_from(["redis", "rediss", "redis+cluster", "rediss+cluster", "http", "red1s"])
host = st.sampled_from(["127.0.0.1:6379", "h:1", "host", "[::1]:7000", "a:1,b:2", ""])
db = st.sampled_from(["", "/0", "/3", "/x", "/"])


def _leaks(text: str) -> str:
    """What of ``text`` shows a credential letter (empty: nothing)."""
    at = next((i for i, ch in enumerate(text) if ch in MARK), -1)
    return "" if at < 0 else text[max(0, at - 200) : at + 200]


@st.composite
def hostile_urls(draw: st.DrawFn) -> str:
    user, password = draw(secret), draw(secret)
    userinfo = draw(st.sampled_from([f"{user}:{password}", f":{password}", user, password]))
    url = f"{draw(scheme)}://{userinfo}@{draw(host)}{draw(db)}{draw(junk)}"
    # sometimes no scheme at all, or the credential somewhere after the host
    return draw(
        st.sampled_from(
            [
                url,
                url.split("://", 1)[1],
                f"redis://{draw(host)}/0?{password}",
                f"redis://{draw(host)}#{userinfo}@x",
                f"{password}",
            ]
        )
    )


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_urls())
def test_no_url_shows_its_userinfo_in_an_error_or_a_repr(url: str) -> None:
    try:
        s = RemoteSettings(url)
    except ConfigError as e:
        assert not _leaks(str(e)), str(e)
        return
    shown = [repr(s), str(s), s.shown]
    for text in shown:
        assert not _leaks(text), text


@settings(max_examples=200)
@given(hostile_urls(), secret, secret)
def test_no_config_shows_a_credential(url: str, user: str, password: str) -> None:
    try:
        cfg = StoreConfig(
            remote_url=url, remote_username=user, remote_password=password, remote_mib=1
        )
    except ConfigError as e:
        assert not _leaks(str(e)), str(e)
        return
    assert not _leaks(repr(cfg)) and not _leaks(str(cfg))


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed: a connect is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("delim", ["#", "?", "/", "@", "%", ":"])
def test_a_store_whose_level_is_down_shows_no_credential(tmp_path: Path, delim: str) -> None:
    """A ``#`` or ``?`` in a password, and every other delimiter, through
    a Store whose remote level cannot be reached: its warnings, stats, info line, Prometheus
    page and published monitor file."""
    pytest.importorskip("redis")
    port = _closed_port()
    url = f"redis://ZQalice:Se{delim}XJ1@127.0.0.1:{port}/0"
    cfg = {
        "ram_mib": 0,
        "park": "disk",
        "cold_dir": str(tmp_path / "cold"),
        "cold_mib": 64,
        "remote_url": url,
        "remote_timeout_ms": 500,
    }
    seen: list[str] = []
    try:
        store = Store.open(tiny_fp(), cfg, warn=seen.append)
    except StrataError as e:  # refused as a URL: its message shows nothing of it
        assert not _leaks(str(e)), str(e)
        return
    with store:
        conv, kv = conversation_kv("c", 32, 100, fp=tiny_fp())
        store.park(conv, kv)
        store.flush()
        store.restore(np.arange(500, 532), np.zeros_like(kv))
        seen += [json.dumps(store.stats(), default=str), store.info_line(), store.prometheus()]
        assert store.publish()
    seen.append((tmp_path / "cold" / "strata-index" / "monitor.json").read_text())
    text = "\n".join(seen)
    assert f"127.0.0.1:{port}" in text  # the server is named, without its credentials
    assert not _leaks(text), _leaks(text)


@pytest.mark.parametrize("delim", ["#", "?"])
def test_strata_fsck_remote_shows_no_credential(tmp_path: Path, delim: str) -> None:
    """``strata --config F fsck --remote`` with a ``#`` or ``?`` in the password: one line on
    stderr, no traceback, nothing of the userinfo."""
    cfg = tmp_path / "strata.toml"
    url = f"redis://ZQalice:Secret{delim}XJ1@127.0.0.1:{_closed_port()}/0"
    cfg.write_text(
        f'cold_dir = "{tmp_path / "cold"}"\ncold_mib = 16\nremote_mib = 1\nremote_url = "{url}"\n'
    )
    got = subprocess.run(
        [sys.executable, "-m", "stratastore.cli", "--config", str(cfg), "fsck", "--remote"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert got.returncode != 0
    assert "Traceback" not in got.stderr, got.stderr
    assert not _leaks(got.stdout + got.stderr), got.stdout + got.stderr
