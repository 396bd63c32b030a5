"""A keyed level's secrets: where they come from and how they are checked (spec F-KEYED).

A level's settings name where its secrets are, never the secrets themselves:

* ``key_file = "/etc/strata/level.key"``: an absolute path to a regular file of one secret a
  line (surrounding white space trimmed; empty lines and lines starting with ``#`` skipped).
  The first secret writes, every one is accepted for reading: rotation is a new first line,
  the old one kept below it until no sidecar of it is left (or nothing needs them).
* ``key_env = "STRATA_LEVEL_KEY"``: the names of environment variables (comma-separated, upper
  case), each holding one secret, the first the writer's.

One of the two, or neither (the level is unkeyed, as before F-KEYED). Each secret is at least
16 bytes (it is turned into the level key by BLAKE3's derive_key, so any longer one works). A
file that cannot be read, is empty, or that other users can read or write (mode ``o+rw``) is
a :class:`~stratastore.errors.ConfigError` naming the file; a variable that is unset or short
names the variable. No message shows a secret, and a setting that looks like one (a secret
given inline, ``key = "..."``; a ``key_file`` that is not an absolute path) is refused without
showing its value.
"""

from __future__ import annotations

import errno
import re
import stat
from collections.abc import Callable, Mapping
from typing import Any

from stratastore.errors import ConfigError
from stratastore.format import LevelKeys
from stratastore.format.level_key import MAX_KEYS, MIN_SECRET_BYTES
from stratastore.io import files, system
from stratastore.io.errors import StrataIOError
from stratastore.levels.settings import Setting

__all__ = [
    "INLINE_SECRET_KEYS",
    "KEY_SETTINGS",
    "MAX_KEY_FILE_BYTES",
    "check_key_settings",
    "level_keys",
    "read_key_file",
]

#: the settings that say where a level's secrets are (every built-in backend's table has them)
KEY_SETTINGS: Mapping[str, Setting] = {
    s.key: s
    for s in (
        Setting("key_file", "", "an absolute path to a file of secrets, one a line"),
        Setting("key_env", "", "names of environment variables, comma-separated"),
    )
}
#: setting names a secret given inline would be written under: refused, never shown
INLINE_SECRET_KEYS = frozenset({"key", "secret", "level_key", "key_secret", "secret_key"})
MAX_KEY_FILE_BYTES = 64 << 10  #: a key file is a few lines: anything longer is not one
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,127}")


def check_key_settings(table: Mapping[str, Any], label: Callable[[str], str]) -> None:
    """A level's key settings checked without reading anything: a secret given inline is
    refused (its value never shown), ``key_file`` must be an absolute path and ``key_env``
    names of variables, and not both. ``label(key)`` names a setting as the config wrote it."""
    for key in table:
        if key in INLINE_SECRET_KEYS:
            raise ConfigError(
                f"setting {label(key)}: a level's secret is never written in the config "
                "(the value is not shown); put it in a file only its users can read and set "
                'key_file = "/path/to/file", or in an environment variable and set '
                'key_env = "NAME" (docs/configuration.md, keyed levels)'
            )
    key_file, key_env = table.get("key_file", ""), table.get("key_env", "")
    if key_file and key_env:
        raise ConfigError(
            f"settings {label('key_file')} and {label('key_env')} are both set; a level's "
            "secrets come from one of them (a file of several secrets rotates keys)"
        )
    if key_file and not str(key_file).startswith("/"):
        raise ConfigError(
            f"setting {label('key_file')} must be an absolute path to a file of secrets (the "
            "value is not shown: it may be a secret given by mistake)"
        )
    if key_env:
        names = str(key_env).split(",")
        if not all(_ENV_NAME.fullmatch(n.strip()) for n in names) or len(names) > MAX_KEYS:
            raise ConfigError(
                f"setting {label('key_env')} must name 1..{MAX_KEYS} environment variables "
                "(upper case letters, digits and _, comma-separated; the value is not shown: "
                "it may be a secret given by mistake)"
            )


def read_key_file(path: str) -> list[bytes]:
    """The secrets of key file ``path`` (see the module), checked: a ConfigError naming the
    file (never its contents) when it cannot be read, others can read or write it, it holds
    no secret, or one is short."""
    try:
        real = files.realpath(path)  # resolved once: its mode and its bytes are one file's
        mode = files.permissions(real)
        raw = files.read_file(real, MAX_KEY_FILE_BYTES)
    except StrataIOError as e:
        raise ConfigError(
            f"key file {path} cannot be read ({errno.errorcode.get(e.errno, 'error')}); "
            "give the path of a regular file of secrets, one a line, readable by this user"
        ) from None
    if mode & (stat.S_IROTH | stat.S_IWOTH):
        raise ConfigError(
            f"key file {path} can be read or written by other users (mode {mode:04o}); "
            f"chmod o-rw {path} (0600, or 0640 for a group)"
        )
    lines = [ln.strip() for ln in raw.split(b"\n")]
    secrets = [ln for ln in lines if ln and not ln.startswith(b"#")]
    if not secrets:
        raise ConfigError(f"key file {path} holds no secret; write one secret a line")
    return _checked(secrets, lambda i: f"key file {path}: the secret on its line {i}")


def _checked(secrets: list[bytes], where: Callable[[int], str]) -> list[bytes]:
    if len(secrets) > MAX_KEYS:
        raise ConfigError(f"{where(MAX_KEYS + 1)} is one too many: a level takes {MAX_KEYS}")
    for i, s in enumerate(secrets, 1):
        if len(s) < MIN_SECRET_BYTES:
            raise ConfigError(
                f"{where(i)} is shorter than {MIN_SECRET_BYTES} bytes; use a random secret of "
                "32 bytes or more (`head -c 32 /dev/urandom | base64`)"
            )
    return secrets


def level_keys(
    table: Mapping[str, Any], env: Callable[[str], str | None] = system.env_var
) -> LevelKeys | None:
    """The keys of a level whose settings table is ``table`` (``key_file`` or ``key_env``;
    None when neither is set: an unkeyed level), read now; ``env(name)`` is a variable's
    value (None: unset), the process environment's by default. A
    :class:`~stratastore.errors.ConfigError` naming the file or the variable (never a secret)
    when one cannot be used."""
    check_key_settings(table, lambda k: k)
    key_file, key_env = table.get("key_file", ""), table.get("key_env", "")
    if key_file:
        return LevelKeys(read_key_file(str(key_file)))
    if not key_env:
        return None
    secrets = []
    for name in (n.strip() for n in str(key_env).split(",")):
        value = env(name)
        if not value:
            raise ConfigError(
                f"environment variable {name} (setting key_env) is not set or empty; set it "
                "to the level's secret"
            )
        secrets.append(value.strip().encode())
    return LevelKeys(_checked(secrets, lambda i: f"the secret of key_env's variable {i}"))
