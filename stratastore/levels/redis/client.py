"""How a Redis level talks to Redis: one redis-py client (a server or a cluster), every call
within one deadline, every failure a typed error that names no credential.

* **The client** is made at first use from :meth:`RemoteSettings.client
  <stratastore.levels.redis.settings.RemoteSettings.client>` (a cluster client connects as it
  is made, so a cluster that is down is the call's :class:`RemoteError`, not the open's).
* **One deadline a call**: each call runs on a thread of its own while the caller waits at most
  the settings' timeout (or what is left of the thread's :meth:`RedisCalls.deadline`), whatever
  the client does underneath (its retry, a cluster's redirects and slot-map refreshes). A call
  that writes the caller's memory runs on the caller's thread instead and bounds itself
  (:mod:`stratastore.levels.redis.wire`).
* **Errors**: a refused, dropped or timed-out connection, a cluster down or moving, a refused
  password or TLS file is a :class:`RemoteError` (a
  :class:`~stratastore.io.errors.StrataIOError`: the restore's read pass stops its ladder
  there), counted in :attr:`RedisCalls.counters`; a value of another type where the level keeps
  its own is a :class:`~stratastore.format.FormatError` (damage, spec F-REM-2). Messages name
  the server as ``RemoteSettings.shown`` does (no credentials), and drop a driver's text that
  carries an ``@`` (a URL with its userinfo).
"""

from __future__ import annotations

import contextlib
import errno
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any, TypeVar

from stratastore.errors import ConfigError, LevelUnavailable
from stratastore.format import FormatError
from stratastore.format.remote_record import MAX_COMMIT_RECORD_BYTES
from stratastore.io.errors import StrataIOError
from stratastore.levels.redis.settings import RemoteSettings
from stratastore.levels.redis.wire import pipelined_into, pool_of, pooled_connection

__all__ = ["COUNTERS", "RedisCalls", "RemoteError"]

T = TypeVar("T")
#: what :attr:`RedisCalls.counters` counts (``Store.stats()``: ``backend_<name>``)
COUNTERS = (
    "errors",
    "timeouts",
    "missing_parts",
    "raced_puts",
    "stale_index",
    "unauthenticated",
)
_RAISE = object()  #: :meth:`RedisCalls._pipeline`: a reply of another type raises


class RemoteError(LevelUnavailable, StrataIOError):
    """The remote level did not answer as it should: a connection refused, dropped or timed
    out, a cluster down or reconfiguring, authentication refused. Never carries credentials.
    A :class:`~stratastore.errors.LevelUnavailable` (the level cannot be reached) and a
    :class:`~stratastore.io.errors.StrataIOError` (the restore's read pass stops its ladder
    there)."""

    def __init__(self, op: str, where: str, why: str, err: int = errno.EIO) -> None:
        super().__init__(
            op,
            where,
            err,
            why,
            "check that the Redis server (or cluster) is up and reachable, and the "
            "remote_* settings; the local levels keep serving meanwhile",
        )


class RedisCalls:
    """The calls of one Redis level (see the module): ``path`` names it in every message.
    Every method from any thread."""

    def __init__(self, settings: RemoteSettings, path: str, client: Any = None) -> None:
        self.settings = settings
        self.path = path
        self._client = client
        self._lock = threading.Lock()
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self._closed = False
        self._until = threading.local()  #: this thread's :meth:`deadline`, if any

    @property
    def _r(self) -> Any:
        """The redis-py client, made at first use (a cluster client connects as it is made: a
        cluster that is down is then a :class:`RemoteError` of the call, not of the open)."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self.settings.client()
        return self._client

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counters[name] = self.counters.get(name, 0) + n

    def connect(self) -> None:
        """Reach the server once (``PING``): a :class:`RemoteError` now for a server that is
        down, a wrong password or TLS that fails (``errno`` EACCES: the user's to fix)."""
        self._call("connect", "", lambda: self._r.ping())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._client is not None:
            with contextlib.suppress(Exception):  # a client that never connected
                self._client.close()

    # -- deadlines ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def deadline(self, seconds: float) -> Iterator[None]:
        """Every call this thread makes inside the block ends by ``seconds`` from now, all of
        them together (the chain walk of one lookup: one deadline for its round trips)."""
        outer = getattr(self._until, "t", None)
        self._until.t = min(time.monotonic() + seconds, outer if outer is not None else 1e300)
        try:
            yield
        finally:
            self._until.t = outer

    def _left(self, op: str, where: str) -> float:
        """Seconds this call may take: the settings' timeout, or what is left of this
        thread's :meth:`deadline` when less (none left: :class:`RemoteError`, timed out)."""
        left = self.settings.timeout_s
        until = getattr(self._until, "t", None)
        if until is not None:
            left = min(left, until - time.monotonic())
        if left <= 0:
            raise RemoteError(op, where, "timed out", errno.ETIMEDOUT)
        return left

    def _bounded(
        self, op: str, where: str, fn: Callable[[], T], late: Callable[[T], object] | None = None
    ) -> T:
        """``fn()`` run on a thread of its own while the caller waits at most :meth:`_left`:
        one deadline for the whole call, whatever the client does underneath (its retry, a
        cluster's redirects and slot-map refreshes). A call past it is left to end by its own
        socket timeouts, its result handed to ``late`` (a connection back to its pool) or
        dropped; the caller gets :class:`RemoteError` (timed out) now. ``fn`` must write no
        memory the caller keeps: what it returns is the caller's only once it is handed over."""
        left = self._left(op, where)
        gate = threading.Lock()
        done = threading.Event()
        box: list[tuple[bool, Any]] = []
        left_behind = False

        def run() -> None:
            try:
                got: tuple[bool, Any] = (True, fn())
            except BaseException as e:  # handed to the caller (or dropped, if it left)
                got = (False, e)
            with gate:
                if not left_behind:
                    box.append(got)
                    done.set()
                    return
            if got[0] and late is not None:
                late(got[1])

        threading.Thread(target=run, name="strata-remote-call", daemon=True).start()
        if not done.wait(left):
            with gate:
                if not box:
                    left_behind = True
            if left_behind:
                raise RemoteError(op, where, "timed out", errno.ETIMEDOUT)
        ok, got = box[0]
        if not ok:
            raise got
        return got  # type: ignore[no-any-return]

    # -- calls ----------------------------------------------------------------------------------
    def _call(
        self,
        op: str,
        key: bytes | str,
        fn: Callable[[], T],
        *,
        late: Callable[[T], object] | None = None,
        inline: bool = False,
    ) -> T:
        """Run one Redis call within one deadline (:meth:`_bounded`; ``inline``: on this
        thread, ``fn`` bounding itself by :meth:`_left`, for a call that writes the caller's
        memory); its failures as :class:`RemoteError` (counted). Without the ``redis``
        extra, a :class:`~stratastore.errors.ConfigError` naming it."""
        try:
            import redis.exceptions as rx
        except ImportError:
            raise ConfigError(
                "the remote level needs the redis extra: pip install 'stratastore[redis]'"
            ) from None

        what = key.hex()[:16] if isinstance(key, bytes) else key
        where = f"{self.path} {what}".rstrip()
        try:
            return fn() if inline else self._bounded(op, where, fn, late)
        except RemoteError as e:
            self._count("errors")
            if e.errno == errno.ETIMEDOUT:
                self._count("timeouts")
            raise
        except rx.TimeoutError:
            self._count("timeouts")
            self._count("errors")
            raise RemoteError(op, where, "timed out", errno.ETIMEDOUT) from None
        except rx.AuthenticationError:
            self._count("errors")
            raise RemoteError(
                op,
                where,
                "authentication refused (check remote_username and remote_password, or "
                "STRATA_REMOTE_USERNAME and STRATA_REMOTE_PASSWORD)",
                errno.EACCES,
            ) from None
        except rx.ResponseError as e:
            # (a pipeline words it "Command # 1 (...) of pipeline caused error: WRONGTYPE ...")
            if "WRONGTYPE" not in str(e):  # (never a URL: "@" would say so)
                self._count("errors")
                raise RemoteError(op, where, _shown(e)) from None
            raise FormatError(
                f"{where}: a value of another type where this backend keeps its own (damage, "
                "or a key written by hand): strata fsck --remote reports it"
            ) from None
        except (
            rx.ConnectionError,
            rx.ClusterError,
            rx.ClusterDownError,
            rx.TryAgainError,
            rx.RedisError,
            rx.RedisClusterException,
        ) as e:
            self._count("errors")
            raise self._refused(op, where, e, isinstance(e, rx.ConnectionError)) from None
        except OSError as e:  # a TLS handshake, a socket the client did not wrap
            self._count("errors")
            why = f"{type(e).__name__}: {e.strerror or e}"
            raise RemoteError(op, where, why, e.errno or errno.EIO) from None

    def _refused(self, op: str, where: str, e: Exception, dropped: bool) -> RemoteError:
        """The :class:`RemoteError` of a driver error ``e`` (``dropped``: a connection error,
        whose cause says why: refused, unreachable, reset, or a TLS setting)."""
        import ssl

        why = _shown(e)
        err = errno.ECONNRESET if dropped else errno.EIO
        cause = e.__context__ if dropped else None
        if isinstance(cause, OSError) and cause.errno:  # refused, unreachable, reset
            err = cause.errno
        # a TLS setting is the user's to fix (EACCES, as a refused password: the level's open
        # says so at once), not a server that is down: the server's certificate not trusted,
        # or the client's TLS files missing or not matching
        if isinstance(cause, ssl.SSLCertVerificationError):
            err = errno.EACCES
            why = (
                f"TLS: the server's certificate was refused ({cause.verify_message}); set "
                "remote_tls_ca to the CA file that signed it, and name the server in "
                "remote_url as its certificate does"
            )
        elif self.settings.tls and (
            (isinstance(cause, ssl.SSLError) and cause.library in ("PEM", "X509"))
            or type(cause) in (FileNotFoundError, PermissionError, IsADirectoryError)
        ):
            err = errno.EACCES
            why = (
                f"TLS: the files of remote_tls_ca, remote_tls_cert and remote_tls_key cannot "
                f"be used ({cause}); name readable PEM files, the certificate with its own key"
            )
        return RemoteError(op, where, why, err)

    def _pipeline(
        self,
        op: str,
        key: bytes | str,
        cmds: Sequence[tuple[Any, ...]],
        *,
        wrong_type: Any = _RAISE,
    ) -> list[Any]:
        """Run ``cmds`` (``(method, *args)``) in one pipelined round trip (no transaction).
        A reply that is a value of another type raises :class:`FormatError`, or with
        ``wrong_type`` given is that instead (one damaged key does not fail the others)."""

        def run() -> list[Any]:
            import redis.exceptions as rx

            p = self._r.pipeline(transaction=False)
            for name, *args in cmds:
                getattr(p, name)(*args)
            out: list[Any] = p.execute(raise_on_error=wrong_type is _RAISE)
            for i, got in enumerate(out):
                if isinstance(got, rx.ResponseError) and "WRONGTYPE" in str(got):
                    out[i] = wrong_type
                elif isinstance(got, Exception):
                    raise got
            return out

        return self._call(op, key, run)

    def scan_names(self, op: str, match: str, where: str = "") -> list[str]:
        """Every key name on the server that matches the glob ``match`` (``SCAN``, within one
        deadline), decoded (a byte that is not UTF-8 replaced); ``where`` names what is
        scanned in a message."""
        got = self._call(op, where, lambda: list(self._r.scan_iter(match=match, count=1000)))
        return [k.decode("utf-8", "replace") for k in got]

    def _read_direct(
        self, key: bytes, cmds: list[tuple[str, str, int, int]], into: list[memoryview]
    ) -> bool:
        """Send ``cmds`` (reads of one segment: one hash slot) pipelined on a connection of
        this level's pool and receive each reply straight into its buffer in ``into``, which
        must be exactly that long (:func:`~stratastore.levels.redis.wire.recv_bulks`). False,
        having read nothing that counts, where this does not apply (a client that is not a
        plain redis-py one, a buffer that is not contiguous bytes) or a reply is anything
        else: the caller then reads through the client's parser. A timeout is a
        :class:`RemoteError` as for every call."""
        if not all(v.format == "B" and v.ndim == 1 and v.contiguous for v in into):
            return False
        pool = pool_of(self._r, cmds[0][1])
        if pool is None:
            return False
        # the connection within one deadline (a connect may retry); the replies received into
        # ``into`` on this thread, each receive bounded by what is left of it, so nothing
        # writes the caller's memory once this call has returned
        conn = self._call(
            "read",
            key,
            partial(pooled_connection, pool),
            late=lambda c: c is not None and pool.release(c),
        )
        if conn is None:
            return False
        deadline = time.monotonic() + self._left("read", f"{self.path} {key.hex()[:16]}")
        return self._call(
            "read", key, partial(pipelined_into, pool, conn, cmds, into, deadline), inline=True
        )

    def bounded_get(self, op: str, name: str, key: bytes | str = "") -> tuple[int, bytes]:
        """``(length, bytes)`` of the string at ``name``, of which at most
        :data:`MAX_COMMIT_RECORD_BYTES` are read (one round trip): a hostile value is never
        read whole. ``(0, b"")`` when there is none; a value of another type is a
        :class:`FormatError`."""
        n, raw = self._pipeline(
            op,
            key or name,
            [("strlen", name), ("getrange", name, 0, MAX_COMMIT_RECORD_BYTES - 1)],
        )
        return int(n), bytes(raw or b"")

    def eviction_settings(self) -> dict[str, tuple[int, str]] | None:
        """Each server's ``maxmemory`` and ``maxmemory-policy`` (a cluster: every primary's),
        by ``host:port``; None where the server does not say (``CONFIG`` refused, as managed
        services and restricted ACL users do)."""
        import redis.cluster

        r: Any = self._r
        per: dict[str, Any]
        try:
            if isinstance(self._r, redis.cluster.RedisCluster):
                got: dict[str, Any] = self._call(
                    "connect",
                    "",
                    lambda: r.config_get(
                        "maxmemory*", target_nodes=redis.cluster.RedisCluster.PRIMARIES
                    ),
                )
                per = got if all(isinstance(v, dict) for v in got.values()) else {"?": got}
            else:
                per = {
                    self.settings.shown: self._call(
                        "connect", "", lambda: r.config_get("maxmemory*")
                    )
                }
            out: dict[str, tuple[int, str]] = {}
            for node, cfg in per.items():
                out[node] = (int(cfg.get("maxmemory") or 0), str(cfg.get("maxmemory-policy", "")))
            return out
        except (RemoteError, ValueError, AttributeError, TypeError):
            return None


def _shown(e: Exception) -> str:
    """A driver error as a message may carry it: its type, and its text unless that has an
    ``@`` (a URL with its userinfo: never shown)."""
    return type(e).__name__ if "@" in str(e) else f"{type(e).__name__}: {e}"
