"""The shared remote level on Redis and Redis Cluster (spec F-REM): the backend, its settings and
its fsck. Needs the ``redis`` extra."""
