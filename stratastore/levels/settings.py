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

from dataclasses import dataclass

from stratastore.errors import ConfigError

__all__ = ["MAX_SETTING", "LevelContext", "Setting", "check_value"]

MAX_SETTING = 1 << 40  #: no number setting is near this (MiB: a zettabyte; seconds: 35k years)


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
    if s.choices:
        if value not in s.choices:
            raise ConfigError(f"setting {label}={value!r} is not one of {', '.join(s.choices)}")
    elif isinstance(s.default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"setting {label}={value!r} must be true or false")
    elif isinstance(s.default, int):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SETTING:
            raise ConfigError(f"setting {label}={value!r} must be an integer in 0..{MAX_SETTING}")
        if value < s.least:
            raise ConfigError(f"setting {label} must be at least {s.least}")
    elif not isinstance(value, str):
        shown = "<hidden>" if s.secret else repr(value)
        raise ConfigError(f"setting {label}={shown} must be a string ({s.what or 'a path'})")
