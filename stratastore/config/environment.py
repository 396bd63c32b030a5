"""What a store's settings take from the process's environment, and what is said of it at open.

**The cold level's default directory.** A cold level given a budget and no directory
(``cold_mib = 16`` alone, or a ``[[levels]]`` table named ``cold`` with ``mib`` and neither
``dir`` nor ``url``) is kept in :func:`default_cold_dir`: ``$XDG_CACHE_HOME/stratastore``, or
``~/.cache/stratastore`` when ``XDG_CACHE_HOME`` is unset, empty or not absolute. It is made with
its parents (the user's cache directory may not exist yet; ``create_dirs`` is for directories a
config names), and the Store names it once at open (:func:`at_open`). An explicit empty directory
(``cold_dir = ""``) still turns the level off. The warm level has no default: a second disk
level is a choice of disk, which no default can make.

**The switches** (:data:`ENV_SWITCHES`): ``STRATA_PARK_TRUNCATE`` overrides ``park_truncate``,
``STRATA_RESTORE_LADDER`` overrides ``ladder`` and ``STRATA_BATCH_AGENDA`` overrides
``batch_agenda``, each ``1``/``0``, ``true``/``false``, ``yes``/``no`` or ``on``/``off``
(any case); any other value is a :class:`~stratastore.errors.ConfigError` naming the variable
and the values it takes. They are applied when the Store opens, never by
:class:`~stratastore.config.StoreConfig` itself (so ``strata init --yes`` writes exactly the
defaults whatever the environment holds), and one that changes a setting is said at open. The
config stays the primary way to set each.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from stratastore.errors import ConfigError
from stratastore.io import pathnames
from stratastore.io.system import cache_home, env_var

if TYPE_CHECKING:
    from stratastore.config.store_config import StoreConfig

__all__ = ["DEFAULT_DIR_LEVEL", "ENV_SWITCHES", "at_open", "default_cold_dir", "env_switches"]

DEFAULT_DIR_LEVEL = "cold"  #: the one level a budget alone places in the default directory
#: environment variable -> the setting it overrides
ENV_SWITCHES: Mapping[str, str] = {
    "STRATA_PARK_TRUNCATE": "park_truncate",
    "STRATA_RESTORE_LADDER": "ladder",
    "STRATA_BATCH_AGENDA": "batch_agenda",
}
_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")


def default_cold_dir(setting: str) -> str:
    """The cold level's directory when ``setting`` (its budget, as written: ``cold_mib``,
    ``levels[1] (cold) mib``) is given without one: ``stratastore`` in the user's cache
    directory (:func:`~stratastore.io.system.cache_home`). A ConfigError when there is none."""
    base = cache_home()
    if not base:
        raise ConfigError(
            f"setting {setting} gives the cold level a budget but no directory, and this "
            "process has neither XDG_CACHE_HOME nor a home directory to default to; set the "
            "cold level's directory (cold_dir, or dir in its [[levels]] table)"
        )
    return pathnames.join(base, "stratastore")


def _switch(variable: str, raw: str) -> bool:
    """The value of a switch variable, or a ConfigError naming it and the values it takes."""
    word = raw.strip().lower()
    if word in _ON:
        return True
    if word in _OFF:
        return False
    raise ConfigError(
        f"environment variable {variable}={raw!r} is not a switch: it takes 1/0, true/false, "
        f"yes/no or on/off (any case) and overrides the setting {ENV_SWITCHES[variable]}; "
        "correct it, or unset it to keep the config's setting"
    )


def env_switches(
    cfg: StoreConfig,
    warn: Callable[[str], None],
    env: Callable[[str], str | None] = env_var,
) -> StoreConfig:
    """``cfg`` with each switch of :data:`ENV_SWITCHES` that ``env`` sets applied to its
    setting; each that changes one is said through ``warn`` (``STRATA_PARK_TRUNCATE=1 turns
    park_truncate on (the config says off)``). All are checked before any is applied."""
    changes: dict[str, Any] = {}
    for variable, setting in ENV_SWITCHES.items():
        raw = env(variable)
        if raw is None:
            continue
        value = _switch(variable, raw)
        if value != getattr(cfg, setting):
            changes[setting] = value
            warn(
                f"{variable}={raw} turns {setting} {'on' if value else 'off'} "
                f"(the config says {'off' if value else 'on'})"
            )
    return dataclasses.replace(cfg, **changes) if changes else cfg


def at_open(cfg: StoreConfig, warn: Callable[[str], None]) -> StoreConfig:
    """The settings a Store opens with: ``cfg`` with the environment's switches applied
    (:func:`env_switches`); a level in the default directory is named, once, with the setting
    that chooses another."""
    for spec in cfg.disk_levels():
        if spec.default_dir:
            warn(
                f"the {spec.name} level ({cfg.setting_name(spec, 'mib')}={spec.mib}) has no "
                f"directory: it is kept in {spec.dir}, in the user's cache directory; set "
                f"{cfg.setting_name(spec, 'dir')} to keep it elsewhere"
            )
    return env_switches(cfg, warn)
