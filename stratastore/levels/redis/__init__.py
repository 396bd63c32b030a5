"""The shared level on Redis and Redis Cluster (spec F-REM). Needs the ``redis`` extra (imported
at the first call, so that this package imports without it). It is reached through its registry
row (``redis://``, ``rediss://``, ``redis+cluster://``, ``rediss+cluster://`` in
:mod:`stratastore.levels.registry`): nothing above the seam imports it.

One concept a module:

* :mod:`~stratastore.levels.redis.settings`: the URL, credentials, TLS, timeouts, namespace, and
  the level's settings schema with its registry hooks (``level_arguments``, ``check_level``);
* :mod:`~stratastore.levels.redis.client`: the calls (one deadline each, typed errors that name
  no credential, reads received into the caller's memory);
* :mod:`~stratastore.levels.redis.records`: the names, the commit protocol, the derived listing,
  the reads of a write's parts;
* :mod:`~stratastore.levels.redis.wire`: the RESP replies received into the caller's memory;
* :mod:`~stratastore.levels.redis.backend`: the level, :class:`RedisBackend`, and fsck of its
  namespace;
* :mod:`~stratastore.levels.redis.fsck`: fsck of every namespace of a store name (the registry
  row's ``fsck`` hook).
"""

from __future__ import annotations

__all__: list[str] = []
