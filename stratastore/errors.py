"""The root of every error stratastore raises on purpose.

Every deliberate failure is a :class:`StrataError` subclass whose message names the object
(a file, a key, a setting) and the fix. Subclasses live next to the code that raises them
(``format.errors``, ``io.errors``, ``store.errors``); this module holds only the root and the
errors that have no single home. The CLI prints one as a one-line message, never a traceback,
and exits with its class's code (one table: ``stratastore.cli.exit_codes``).
"""

from __future__ import annotations

__all__ = ["ConfigError", "StrataError"]


class StrataError(Exception):
    """Base class of all stratastore errors."""


class ConfigError(StrataError):
    """A setting or an argument is invalid; the message names it and the values allowed."""
