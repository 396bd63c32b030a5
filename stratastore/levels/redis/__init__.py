"""The shared level on Redis and Redis Cluster (spec F-REM). Needs the ``redis`` extra (imported
at the first call, so that this package imports without it).

One concept a module:

* :mod:`~stratastore.levels.redis.settings`: the URL, credentials, TLS, timeouts, namespace;
* :mod:`~stratastore.levels.redis.client`: the calls (one deadline each, typed errors that name
  no credential);
* :mod:`~stratastore.levels.redis.records`: the names, the commit protocol, the derived listing;
* :mod:`~stratastore.levels.redis.wire`: range reads received into the caller's memory;
* :mod:`~stratastore.levels.redis.backend`: the level, :class:`RedisBackend`;
* :mod:`~stratastore.levels.redis.check` and :mod:`~stratastore.levels.redis.fsck`: fsck of a
  namespace, and of every namespace of a store name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stratastore.format import ModelFingerprint
    from stratastore.levels.backend import SharedBackend

__all__ = ["open_remote"]


def open_remote(settings: object, fingerprint: ModelFingerprint) -> SharedBackend:
    """The shared level ``settings`` names (a
    :class:`~stratastore.levels.redis.settings.RemoteSettings`) for ``fingerprint``'s model:
    made, not connected (its first call connects, within its timeout). How the flow reaches it
    without naming it: this module's implementation is imported here, when a level is opened."""
    from stratastore.levels.redis.backend import RedisBackend
    from stratastore.levels.redis.settings import RemoteSettings

    if not isinstance(settings, RemoteSettings):
        raise TypeError(f"a Redis level is opened from RemoteSettings, not {type(settings)!r}")
    return RedisBackend(settings, fingerprint)
