"""redis_settings.py refuses a URL with a query or fragment "without showing it" (README). The check
looks for ``?``/``#`` only after the URL's *last* ``@``, so a query whose value holds an ``@`` (a
password often does) slips past: the URL is accepted with a host taken from inside the password, or
refused with a piece of the password in the message."""

from __future__ import annotations

import pytest

from stratastore import StoreConfig
from stratastore.errors import ConfigError


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0?password=p@sswordhost",
        "redis://127.0.0.1:6379/0#frag@sswordhost",
    ],
)
def test_a_query_holding_an_at_sign_is_refused(url: str) -> None:
    with pytest.raises(ConfigError) as e:
        StoreConfig(remote_url=url, remote_mib=1)
    assert "sswordhost" not in str(e.value)


def test_a_refused_query_never_shows_a_piece_of_its_password() -> None:
    url = "redis://127.0.0.1:6379/0?password=p@ss:w0rdpart"
    with pytest.raises(ConfigError) as e:
        StoreConfig(remote_url=url, remote_mib=1)
    assert "w0rdpart" not in str(e.value), str(e.value)
