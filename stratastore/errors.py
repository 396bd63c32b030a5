"""The root of every error stratastore raises on purpose.

Every deliberate failure is a :class:`StrataError` subclass whose message names the object
(a file, a key, a setting) and the fix. Subclasses live next to the code that raises them
(``format.errors``, ``io.errors``, ``store.errors``); this module holds only the root and the
errors that have no single home. The CLI prints one as a one-line message, never a traceback,
and exits with its class's code (one table: ``stratastore.cli.exit_codes``).
"""

from __future__ import annotations

__all__ = ["ConfigError", "LevelUnavailable", "StrataError"]


class StrataError(Exception):
    """Base class of all stratastore errors."""


class ConfigError(StrataError):
    """A setting or an argument is invalid; the message names it and the values allowed."""


class LevelUnavailable(StrataError):
    """A level could not be reached: its server refused, dropped or timed out a call, a
    cluster is down, its credentials were refused. Every backend's "cannot reach the level"
    error derives from it (the Redis level's ``RemoteError``), so callers and the CLI (its own
    exit code) tell an unreachable level from damage or a bad setting without naming a
    backend. The message names the level as it may be shown (no credential) and the fix."""
