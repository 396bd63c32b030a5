"""A store's settings (:class:`StoreConfig`), read from a mapping or a TOML file.

A configuration is top-level settings (the RAM level, parking, retention, restore, files) and
its levels, each a ``[[levels]]`` table (:class:`LevelSpec`) with its own settings table::

    ram_mib = 8192

    [[levels]]
    name = "warm"
    dir = "/nvme/strata"
    mib = 65536

    [[levels]]
    name = "cold"
    dir = "/hdd/strata"
    mib = 524288

    [[levels]]
    name = "remote"
    url = "rediss://redis.internal:6380/0"
    mib = 262144

    [levels.settings]
    name = "llama-8b-prod"
    tls_ca = "/etc/strata/ca.pem"

The levels with a directory (or a ``memory://`` URL) are the disk levels, in order (spec
F-DIR-2): the first is where parks are written, each degrades into the next, only the last
deletes. A level with a Redis URL is the remote level (at most one), shared by every node and
never a step of that order. The defaults are what a user with no configuration expects: a RAM
level only, every opt-in feature off.

The original flat settings stay accepted when parsed, as aliases of the levels
(:mod:`stratastore.config.aliases`): ``warm_dir``, ``warm_mib``, ``warm_max_age_s``,
``cold_dir``, ``cold_mib``, ``cold_max_age_s`` (``spill_dir`` and ``disk_mib`` are the cold
level's too), ``remote_url``, ``remote_mib`` and ``remote_<setting>``. Folded into the levels,
they are never held twice, and read back as properties (``cfg.cold_dir``). Two names of one
setting with different values, an unknown key, or a value of the wrong type or range is a
:class:`~stratastore.errors.ConfigError` naming the key as written and the fix.

A disk level is on only with a directory *and* a budget ("empty / 0 = the level is off"). The
cold level given a budget alone (``cold_mib = 16``, or a ``[[levels]]`` table named ``cold``
with ``mib`` and no ``dir``) is kept in the user's cache directory
(``$XDG_CACHE_HOME/stratastore``, else ``~/.cache/stratastore``), named once at open. A mapping
or TOML file that gives any other half of the flat pair (``cold_dir`` without ``cold_mib``,
``warm_mib`` without ``warm_dir``) is a ConfigError (a half-configured level, not a level
switched off); an explicit empty directory or ``0`` budget beside the other is allowed, and the
Store warns at start-up that the level is off. Checks that need the filesystem (two levels on
one directory; a level directory whose parent does not exist, unless ``create_dirs``) run when
the Store opens its levels.

The environment overrides three settings when a Store opens, never in the config itself
(:mod:`stratastore.config.environment`): ``STRATA_PARK_TRUNCATE`` (``park_truncate``),
``STRATA_RESTORE_LADDER`` (``ladder``) and ``STRATA_BATCH_AGENDA`` (``batch_agenda``).
"""

from stratastore.config.aliases import ALIASES
from stratastore.config.environment import ENV_SWITCHES
from stratastore.config.levels import (
    MAX_LEVELS,
    MAX_SETTING,
    LevelSettings,
    LevelSpec,
    level_byte,
)
from stratastore.config.store_config import (
    MAX_CONFIG_BYTES,
    ParkTarget,
    RamPrefault,
    StoreConfig,
)

__all__ = [
    "ALIASES",
    "ENV_SWITCHES",
    "MAX_CONFIG_BYTES",
    "MAX_LEVELS",
    "MAX_SETTING",
    "LevelSettings",
    "LevelSpec",
    "ParkTarget",
    "RamPrefault",
    "StoreConfig",
    "level_byte",
]
