"""redis_settings.py: a password in the URL's query (``?password=``, the form redis-py and most
Redis clients take) is never shown in an error, and is never silently dropped."""

from __future__ import annotations

import pytest

from stratastore import StoreConfig
from stratastore.errors import ConfigError
from stratastore.levels.redis.settings import RemoteSettings

SECRET = "Qu3ry-secret-pw"


@pytest.mark.parametrize(
    "url",
    [
        f"redis://127.0.0.1:6379/0?password={SECRET}",
        f"redis://127.0.0.1:6379/0?username=bob&password={SECRET}",
        f"rediss+cluster://h1:7000,h2:7001/0?password={SECRET}",
    ],
)
def test_a_bad_url_with_a_query_password_never_shows_it(url: str) -> None:
    with pytest.raises(ConfigError) as e:
        StoreConfig(remote_url=url, remote_mib=1)
    assert "remote_url" in str(e.value)
    assert SECRET not in str(e.value) and SECRET not in repr(e.value)


def test_a_query_password_is_not_silently_dropped() -> None:
    """``redis://host:port?password=...`` was accepted before the fix, and the password thrown
    away: the store then connected without it. Either honour it or refuse the URL (naming
    remote_url)."""
    url = f"redis://127.0.0.1:6379?password={SECRET}"
    try:
        cfg = StoreConfig(remote_url=url, remote_mib=1)
    except ConfigError as e:
        assert "remote_url" in str(e) and SECRET not in str(e)
        return
    assert RemoteSettings.from_config(cfg, env={}).password == SECRET
