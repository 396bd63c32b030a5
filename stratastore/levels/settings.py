"""A level's settings table as its backend declares it: one :class:`Setting` a key.

A backend's registry row (:class:`~stratastore.levels.registry.BackendEntry`) carries the
schema of its level's ``[levels.settings]`` table, a mapping of key to :class:`Setting`; the
configuration (``stratastore.config``) checks a table against it by :func:`check_value`, fills in
the defaults, and hands the table to the row's ``arguments`` hook with the store's
:class:`LevelContext` to make what the opener takes. The store's own top-level settings are
checked by the same rule. A credential (``secret``) is never shown: not in an error, not in a
``repr``.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import PurePath

from stratastore.errors import ConfigError

__all__ = [
    "MAX_SETTING",
    "LevelContext",
    "Setting",
    "check_value",
    "padding_problem",
    "scheme_of",
    "shown_value",
]

MAX_SETTING = 1 << 40  #: no number setting is near this (MiB: a zettabyte; seconds: 35k years)
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")  # RFC 3986 section 3.1


def scheme_of(spec: str | PurePath) -> str:
    """The scheme of a level spec: ``""`` for a path, else the part before ``://``."""
    m = _SCHEME.match(str(spec))
    return m.group(1).lower() if m else ""


def _invisible(c: str) -> bool:
    """Whether ``c`` is whitespace (any Unicode space, tab, line break) or a control or format
    character (NUL, ESC, a zero-width space, a byte-order mark)."""
    return c.isspace() or unicodedata.category(c) in ("Cc", "Cf")


def padding_problem(key: str, spec: str) -> str | None:
    """What is wrong with the level spec ``spec`` (a directory or a URL) given as ``key`` when
    it begins or ends with whitespace or a control character, or None. Such a spec is never
    meant, and is dangerous: ``" redis://user:pw@host/0"`` has no scheme, so it would be taken
    as a relative path (and, with ``create_dirs``, a directory made by that name, credential and
    all). Named as :func:`shown_value` names it once trimmed: a URL by its scheme alone."""
    if not spec or not (_invisible(spec[0]) or _invisible(spec[-1])):
        return None
    a, b = 0, len(spec)
    while a < b and _invisible(spec[a]):
        a += 1
    while b > a and _invisible(spec[b - 1]):
        b -= 1
    shown = shown_value(spec[a:b]) if "://" in spec else repr(spec)
    return (
        f"{key}={shown} begins or ends with whitespace or a control character (a space, tab or "
        "line break pasted with it?); remove it: a level is named by exactly its path or URL"
    )


def shown_value(value: object, secret: bool = False) -> str:
    """``value`` as a message or a ``repr`` may show it: ``<hidden>`` for a credential, a URL
    by its scheme alone (``'redis://...'``: it may carry ``user:password@``), a local
    ``file:///PATH`` and everything else as its ``repr``."""
    if secret:
        return "<hidden>"
    if isinstance(value, str) and "://" in value:
        scheme = scheme_of(value)
        if scheme == "file" and value[len("file://") :].startswith("/") and "@" not in value:
            return repr(value)
        return repr(f"{scheme}://...") if scheme else "<not shown>"
    return repr(value)


@dataclass(frozen=True)
class Setting:
    """One setting of a table: its default, what a value must be, and whether it is a
    credential (never shown). The type is the default's: a bool, an integer in
    ``least..MAX_SETTING``, one of ``choices``, or a string (``what`` says what it is: "a
    path"). What a value means beyond its type (a name a key can carry, a URL that parses) is
    the row's ``check`` hook's to say."""

    key: str
    default: object
    what: str = ""  #: a string setting's type error says what it is ("a path")
    choices: tuple[str, ...] = ()  #: the values a choice allows
    least: int = 0  #: an integer's smallest value
    secret: bool = False


@dataclass(frozen=True)
class LevelContext:
    """What the store gives every level besides its own table: its budget (``mib``, 0: none
    or off) and the permission bits of the files the store creates (spec F-DIR-9)."""

    mib: int = 0
    file_mode: int = 0o600


def check_value(label: str, value: object, s: Setting) -> None:
    """``value`` of the setting ``label`` against its row: a choice, a bool, an integer in
    ``least..MAX_SETTING`` or a string; a :class:`ConfigError`
    naming ``label`` otherwise (a credential's value is never shown)."""
    shown = shown_value(value, s.secret)
    if s.choices:
        if value not in s.choices:
            raise ConfigError(f"setting {label}={shown} is not one of {', '.join(s.choices)}")
    elif isinstance(s.default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"setting {label}={shown} must be true or false")
    elif isinstance(s.default, int):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SETTING:
            raise ConfigError(f"setting {label}={shown} must be an integer in 0..{MAX_SETTING}")
        if value < s.least:
            raise ConfigError(f"setting {label} must be at least {s.least}")
    elif not isinstance(value, str):
        raise ConfigError(f"setting {label}={shown} must be a string ({s.what or 'a path'})")
