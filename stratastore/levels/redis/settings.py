"""How the remote level reaches Redis: its URL, credentials, TLS and timeouts.

A remote level is named by one URL:

* ``redis://host:port/db`` (``rediss://`` for TLS): one ``redis-server``;
* ``redis+cluster://host:port,host:port,...`` (``rediss+cluster://``): a Redis Cluster, the
  seeds the client learns the slots from.

Credentials come from the config (``remote_username``, ``remote_password``), else from the
environment (``STRATA_REMOTE_USERNAME``, ``STRATA_REMOTE_PASSWORD``), else from the URL's
``user:password@``. They never appear in a message: :attr:`RemoteSettings.shown` (the URL
without them) is what every log line, error, ``strata monitor`` and Prometheus output names.

Every key a store writes carries its namespace, :func:`namespace`: the store's name
(``remote_name``) and its model's fingerprint, so two stores or two models on one Redis never
read or delete each other's segments.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Protocol
from urllib.parse import unquote, urlsplit

from stratastore.errors import ConfigError
from stratastore.format import LevelKeys, ModelFingerprint
from stratastore.format.remote_record import RemoteNames, check_remote_name
from stratastore.levels.level_keys import KEY_SETTINGS, check_key_settings, level_keys
from stratastore.levels.settings import LevelContext, Setting, shown_value


class _LevelSpec(Protocol):
    @property
    def url(self) -> str: ...


class RemoteConfig(Protocol):
    """What :meth:`RemoteSettings.from_config` reads of a store's configuration (a
    :class:`~stratastore.config.StoreConfig`): its remote level and that level's settings."""

    @property
    def remote(self) -> _LevelSpec | None: ...

    def level_settings(self, spec: Any) -> dict[str, Any]: ...


__all__ = [
    "LEVEL_SETTINGS",
    "RemoteSettings",
    "check_level",
    "check_name",
    "level_arguments",
    "namespace",
]

#: the schema of a Redis level's settings table, its registry row's (the flat ``remote_<key>``
#: settings alias them)
LEVEL_SETTINGS: Mapping[str, Setting] = {
    s.key: s
    for s in (
        Setting("name", "default", "a name"),  # every key's namespace (spec F-REM-1)
        Setting("username", "", "a user name", secret=True),
        Setting("password", "", "a password", secret=True),
        Setting("tls_ca", "", "a path"),  # the CA of the server's certificate (rediss)
        Setting("tls_cert", "", "a path"),  # a client certificate and its key
        Setting("tls_key", "", "a path"),
        Setting("timeout_ms", 5000, least=1),  # every call: connect, read, write
        Setting("part_mib", 16, least=1),  # a segment is stored in values of at most this
        Setting("eviction", "store", choices=("store", "redis")),
        Setting("keep_local", True),  # a restore from the level is kept locally too
        *KEY_SETTINGS.values(),  # a keyed level's secrets: where they are (spec F-KEYED)
    )
}

_SCHEMES = {
    "redis": (False, False),
    "rediss": (True, False),
    "redis+cluster": (False, True),
    "rediss+cluster": (True, True),
}
Eviction = Literal["store", "redis"]


def check_name(name: object) -> str:
    """A remote store name, checked (spec F-REM-1: 1..64 of a-z, 0-9, ``_``, ``-``, ``.``)."""
    try:
        return check_remote_name(name)  # type: ignore[arg-type]
    except ValueError:
        raise ConfigError(
            f"setting remote_name={name!r} must be 1..64 characters "
            "of a-z, 0-9, _, - and . (every key the store writes carries it)"
        ) from None


def namespace(name: str, fp: ModelFingerprint) -> str:
    """The prefix of every key of store ``name`` for model ``fp``: ``strata/<name>/<fp>/``
    (spec F-REM-1). No key of another store or model starts with it (names have no ``/``)."""
    return RemoteNames(check_name(name), fp.digest()).ns


@dataclass(frozen=True)
class RemoteSettings:
    """A remote level's connection: the remote level of a
    :class:`~stratastore.config.StoreConfig` and its settings table, by :meth:`from_config`,
    or built directly (tests, benchmarks)."""

    url: str = field(repr=False)  #: may carry user:password@ (repr: ``nodes`` and ``db``)
    name: str = "default"
    username: str = field(default="", repr=False)
    password: str = field(default="", repr=False)
    tls_ca: str = ""  #: CA file that signed the server's certificate (rediss)
    tls_cert: str = ""  #: client certificate, for a server that asks for one
    tls_key: str = ""
    timeout_s: float = 5.0  #: every call: connect, read and write
    part_bytes: int = 16 << 20  #: a segment is stored in values of at most this many bytes
    eviction: Eviction = "store"
    budget_bytes: int = 0  #: eviction="store": the bytes the level may hold (0: no limit)
    keep_local: bool = True  #: a restore from the remote level writes it to the local levels
    key_file: str = ""  #: a keyed level's file of secrets (spec F-KEYED), read at open
    key_env: str = ""  #: or the environment variables that hold them
    tls: bool = field(init=False)
    cluster: bool = field(init=False)
    nodes: tuple[tuple[str, int], ...] = field(init=False)
    db: int = field(init=False)

    def __post_init__(self) -> None:
        check_name(self.name)
        check_key_settings({"key_file": self.key_file, "key_env": self.key_env}, lambda k: k)
        try:
            scheme, rest = self.url.split("://", 1)
        except ValueError:
            scheme, rest = "", ""
        if scheme not in _SCHEMES or not rest:
            raise ConfigError(
                f"setting remote_url={_redact(self.url)!r} is not a Redis URL; "
                "use redis://host:port/0, rediss://host:port/0 (TLS) or "
                "redis+cluster://host:port,host:port (a cluster's seeds)"
            )
        tls, cluster = _SCHEMES[scheme]
        authority, tail = _split_authority(rest)
        if any(c in tail for c in "?#@"):  # a query may carry a password: never shown
            raise ConfigError(
                f"setting remote_url={_redact(self.url)!r} has a query, a fragment or an @ "
                "after the host, which this setting does not take; give credentials in "
                "remote_username and remote_password (or as user:password@ before the host, "
                "percent-encoded: @ as %40, / as %2F, ? as %3F, # as %23) and the database as /N"
            )
        userinfo, _, hostpart = authority.rpartition("@")
        dbpart = tail[1:]
        nodes: list[tuple[str, int]] = []
        for seed in hostpart.split(","):
            try:
                parsed = urlsplit(f"//{seed}")
                host, port = parsed.hostname, parsed.port or 6379
            except ValueError:
                host, port = None, 0
            if not host:
                what = repr(seed) if _SHOWN_HOSTS.fullmatch(seed) else "a server"
                raise ConfigError(
                    f"setting remote_url={_redact(self.url)!r}: {what} is not host:port"
                )
            nodes.append((host, port))
        if not cluster and len(nodes) != 1:
            raise ConfigError(
                f"setting remote_url={_redact(self.url)!r} names {len(nodes)} "
                "servers; a cluster's seeds go in redis+cluster://..."
            )
        db = dbpart or "0"
        if not db.isdigit() or (cluster and db != "0"):
            raise ConfigError(
                f"setting remote_url={_redact(self.url)!r}: the database must be a "
                "number (and 0 for a cluster)"
            )
        user, _, pw = userinfo.partition(":")
        object.__setattr__(self, "username", self.username or unquote(user))
        object.__setattr__(self, "password", self.password or unquote(pw))
        object.__setattr__(self, "tls", tls)
        object.__setattr__(self, "cluster", cluster)
        object.__setattr__(self, "nodes", tuple(nodes))
        object.__setattr__(self, "db", int(db))
        if self.eviction not in ("store", "redis"):
            raise ConfigError(
                f"setting remote_eviction={self.eviction!r} is not one of store, redis"
            )
        if not 0 < self.timeout_s <= 3600:
            raise ConfigError(f"setting remote_timeout_ms gives {self.timeout_s} s; use 1..3600000")
        if not 4096 <= self.part_bytes <= 512 << 20:
            raise ConfigError(
                f"setting remote_part_mib gives {self.part_bytes:,} bytes a part; "
                "use 1..512 (Redis holds values of at most 512 MiB)"
            )
        for what, path in (
            ("remote_tls_ca", self.tls_ca),
            ("remote_tls_cert", self.tls_cert),
            ("remote_tls_key", self.tls_key),
        ):
            if path and not tls:
                raise ConfigError(
                    f"setting {what} is set but remote_url is not rediss://; use "
                    "rediss:// for TLS, or remove it"
                )
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError(
                "settings remote_tls_cert and remote_tls_key go together (a client "
                "certificate and its key); set both or neither"
            )

    @classmethod
    def from_config(cls, cfg: RemoteConfig, env: Mapping[str, str] | None = None) -> RemoteSettings:
        """The remote level of ``cfg`` (:attr:`StoreConfig.remote
        <stratastore.config.StoreConfig.remote>`: ``remote_url``, or the ``[[levels]]`` entry
        with a Redis URL), opened with its settings table
        (:meth:`~stratastore.config.StoreConfig.level_settings`); credentials from the config,
        else ``STRATA_REMOTE_USERNAME``/``STRATA_REMOTE_PASSWORD`` in ``env`` (default: the
        process environment), else the URL."""
        spec = cfg.remote
        kw = cfg.level_settings(spec) if spec is not None else {}
        return cls.from_level(spec.url if spec is not None else "", kw, env)

    @classmethod
    def from_level(
        cls, url: str, settings: Mapping[str, Any], env: Mapping[str, str] | None = None
    ) -> RemoteSettings:
        """The level at ``url`` with its settings table (``StoreConfig.level_settings``);
        credentials from the table, else ``STRATA_REMOTE_USERNAME``/``STRATA_REMOTE_PASSWORD``
        in ``env`` (default: the process environment), else the URL."""
        env = os.environ if env is None else env
        kw = dict(settings)
        kw["username"] = kw.get("username") or env.get("STRATA_REMOTE_USERNAME", "")
        kw["password"] = kw.get("password") or env.get("STRATA_REMOTE_PASSWORD", "")
        return cls(url, **kw)

    def __repr__(self) -> str:
        """The fields a ``repr`` may show: no credential, the URL as :attr:`shown`, every other
        string by :func:`~stratastore.levels.settings.shown_value` (a URL by its scheme)."""
        hidden = ("url", "username", "password")
        shown = ", ".join(
            f"{f.name}={shown_value(getattr(self, f.name))}"
            for f in fields(self)
            if f.name not in hidden
        )
        return f"RemoteSettings(url={self.shown!r}, {shown})"

    def level_keys(self) -> LevelKeys | None:
        """The level's keys (spec F-KEYED), read now from ``key_file`` or ``key_env``; None
        for an unkeyed level. A ConfigError naming the file or variable, never a secret."""
        return level_keys({"key_file": self.key_file, "key_env": self.key_env})

    @property
    def shown(self) -> str:
        """The URL as every message shows it: no credentials."""
        scheme = self.url.split("://", 1)[0]
        hosts = ",".join(f"{h}:{p}" for h, p in self.nodes)
        return f"{scheme}://{hosts}" + ("" if self.cluster else f"/{self.db}")

    def client(self) -> Any:
        """A redis-py client (``redis.Redis`` or ``redis.cluster.RedisCluster``) with the
        timeouts, credentials and TLS of these settings; connects lazily. Raises
        :class:`~stratastore.errors.ConfigError` when the ``redis`` extra is not installed."""
        try:
            import redis
            import redis.cluster
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            raise ConfigError(
                "the remote level needs the redis extra: pip install 'stratastore[redis]'"
            ) from None
        kw: dict[str, Any] = {
            "socket_timeout": self.timeout_s,
            "socket_connect_timeout": self.timeout_s,
            "username": self.username or None,
            "password": self.password or None,
            # one quick retry (a pooled connection the server closed), never a backoff ladder:
            # a server that is down costs one timeout, and the level's breaker does the rest
            "retry": Retry(NoBackoff(), 1),
        }
        if self.tls:
            kw.update(
                ssl=True,
                ssl_cert_reqs="required",
                ssl_ca_certs=self.tls_ca or None,
                ssl_certfile=self.tls_cert or None,
                ssl_keyfile=self.tls_key or None,
            )
        if self.cluster:
            nodes = [redis.cluster.ClusterNode(h, p) for h, p in self.nodes]  # type: ignore[no-untyped-call]
            return redis.cluster.RedisCluster(startup_nodes=nodes, require_full_coverage=True, **kw)
        host, port = self.nodes[0]
        return redis.Redis(host=host, port=port, db=self.db, **kw)


def level_arguments(table: Mapping[str, Any], context: LevelContext) -> dict[str, Any]:
    """The :class:`RemoteSettings` arguments of a Redis level whose settings table is
    ``table`` (every key of :data:`LEVEL_SETTINGS`) and whose budget is ``context.mib``: the
    registry row's ``arguments`` hook. Holds credentials: never shown."""
    return {
        "name": table["name"],
        "username": table["username"],
        "password": table["password"],
        "tls_ca": table["tls_ca"],
        "tls_cert": table["tls_cert"],
        "tls_key": table["tls_key"],
        "timeout_s": table["timeout_ms"] / 1000,
        "part_bytes": table["part_mib"] << 20,
        "eviction": table["eviction"],
        "budget_bytes": context.mib << 20,
        "keep_local": table["keep_local"],
        "key_file": table["key_file"],
        "key_env": table["key_env"],
    }


def check_level(
    url: str, table: Mapping[str, Any], context: LevelContext, label: Callable[[str], str]
) -> None:
    """A Redis level checked without connecting (spec F-REM-1), the registry row's ``check``
    hook: its store name is one a key can carry, its URL parses (with the table's TLS files
    and sizes), its budget goes with ``eviction = "store"``. ``label`` names a field or a
    setting as the configuration wrote it (``remote_mib``, or ``mib``); a level without a URL
    (the flat ``remote_*`` settings, off) has its name checked alone."""
    check_name(table["name"])
    if not url:
        return
    RemoteSettings(url, **level_arguments(table, context))
    url_s, mib, ev = label("url"), label("mib"), label("eviction")
    word = ev.rpartition(".")[2]  # the setting's own key, as a table or flat name spells it
    if table["eviction"] == "store" and context.mib == 0:
        raise ConfigError(
            f"setting {url_s} is set with {ev}=store but {mib}=0: give "
            "the remote level a budget (MiB), or let Redis evict ("
            f'{word} = "redis", with maxmemory and an LRU policy on the server)'
        )
    if table["eviction"] == "redis" and context.mib:
        raise ConfigError(
            f"setting {mib}={context.mib} is not used with {ev}=redis "
            f'(the server\'s maxmemory is the budget); set {mib} = 0, or {word} = "store"'
        )


def _split_authority(rest: str) -> tuple[str, str]:
    """``rest`` (a URL after ``scheme://``) as its authority (``user:password@hosts``) and
    what follows it: the authority ends at the first ``/``, ``?`` or ``#`` (RFC 3986)."""
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    return rest[:cut], rest[cut:]


_SHOWN_SCHEME = re.compile(r"[a-z][a-z0-9+]{0,19}")
_SHOWN_HOSTS = re.compile(r"[A-Za-z0-9.\-_:,\[\]]{1,512}(/[0-9]{0,9})?")


def _redact(url: str) -> str:
    """``url`` as a message about it may show it: its scheme and its hosts (with ``/db``) only,
    and only where they are plainly that. The hosts are shown where the URL read by RFC 3986
    (the authority ends at the first ``/``, ``?`` or ``#``; userinfo is what precedes its
    last ``@``) and read leniently (everything up to the URL's last ``@`` is userinfo) name
    the same hosts, with nothing but ``/db`` after them; else (a ``#``, ``?`` or ``/`` in a
    password, a query, a fragment) the scheme alone, and for a text that is not
    ``scheme://...`` nothing of it."""
    scheme, sep, rest = url.partition("://")
    if not sep or not _SHOWN_SCHEME.fullmatch(scheme):
        return "(not shown: not a URL)"
    authority, tail = _split_authority(rest)
    hosts = authority.rpartition("@")[2] + tail
    if hosts != rest.rpartition("@")[2] or not _SHOWN_HOSTS.fullmatch(hosts):
        return f"{scheme}://(not shown)"
    return f"{scheme}://{hosts}"
