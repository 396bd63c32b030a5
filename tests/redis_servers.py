"""Real ``redis-server`` processes for the tests of the Redis-backed storage level.

Nothing here mocks Redis: :class:`RedisServer` starts one real ``redis-server`` (standalone, with
a password and ACL users, TLS only, with a memory cap, or as a cluster node) and
:class:`RedisCluster` a real three-master cluster. ``tests/remote/conftest.py`` wraps them in
fixtures; ``tools/ensure_redis.sh`` (run by ``make test``) installs the binaries.

Contracts, for every helper here:

* every subprocess call has a timeout and every socket a deadline: nothing here can hang a run;
* a server listens on 127.0.0.1 only, on a free port, in its own directory (its ``redis.log``
  holds its stdout and stderr), with persistence off (``--save "" --appendonly no``), and is
  started with :class:`subprocess.Popen` in its own session (process group);
* every server started here is stopped: by :meth:`RedisServer.stop` (or the context manager),
  else by an ``atexit`` hook that SIGKILLs whatever is still running, else (when the Python
  process is itself killed) by the kernel: on Linux a server gets SIGKILL when the thread that
  started it exits (``setpriv --pdeathsig``, where util-linux has it). Start servers from a
  thread that lives as long as they should (pytest's main thread does).

Only the standard library is used; the ``redis`` client is not needed here (a minimal RESP2
client, :meth:`RedisServer.execute`, does the probing and the cluster administration).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self, TypeAlias

# A RESP2 reply as :meth:`RedisServer.execute` returns it (error replies raise instead).
Reply: TypeAlias = bytes | int | list["Reply"] | None
Arg: TypeAlias = str | bytes | int | float

HOST = "127.0.0.1"
CLI_TIMEOUT = 20.0  # seconds, any one redis-cli or openssl run
STOP_TIMEOUT = 5.0  # seconds between SIGTERM and SIGKILL
_SEARCH_DIRS = ("/usr/bin", "/usr/local/bin")
_CLUSTER_BUS_OFFSET = 10000  # a cluster node also listens on port + 10000

# Every server process started by this module and not yet reaped: the atexit safety net.
_LIVE: dict[int, subprocess.Popen[bytes]] = {}


class RedisServerError(RuntimeError):
    """A server that did not start, died, or a redis-cli / openssl run that failed."""


class RedisReplyError(Exception):
    """An error reply (``-ERR ...``) to :meth:`RedisServer.execute`; ``str()`` is its text."""


def find_redis() -> tuple[str, str] | None:
    """The paths of ``redis-server`` and ``redis-cli``: from PATH, else from /usr/bin or
    /usr/local/bin (both must be found in one of these ways), or None when either is absent."""
    found: list[str] = []
    for name in ("redis-server", "redis-cli"):
        path = shutil.which(name)
        if path is None:
            for d in _SEARCH_DIRS:
                candidate = os.path.join(d, name)
                if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                    path = candidate
                    break
        if path is None:
            return None
        found.append(path)
    return found[0], found[1]


def _port_bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port(*, cluster_bus: bool = False) -> int:
    """A TCP port on 127.0.0.1 that is free now (the kernel's pick; another process may take it
    before it is used: :class:`RedisServer` retries on a new port when that happens). With
    ``cluster_bus``, ``port + 10000`` is free too (a cluster node's bus port)."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((HOST, 0))
            port: int = s.getsockname()[1]
        if not cluster_bus:
            return port
        if port + _CLUSTER_BUS_OFFSET <= 65535 and _port_bindable(port + _CLUSTER_BUS_OFFSET):
            return port
    raise RedisServerError("no free port found")


def _run(args: Sequence[str], *, timeout: float = CLI_TIMEOUT, what: str = "") -> str:
    """Run ``args`` (no shell, no stdin) with a timeout; its stdout, or RedisServerError naming
    ``what``, the exit status and the output on a non-zero exit or a timeout."""
    try:
        done = subprocess.run(
            list(args),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise RedisServerError(f"{what or args[0]}: timed out after {timeout} s") from e
    out = done.stdout.decode(errors="replace")
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace")
        raise RedisServerError(
            f"{what or args[0]} exited with {done.returncode}:\n{out}{err}".rstrip()
        )
    return out


@dataclass(frozen=True)
class TlsFiles:
    """PEM files made by :func:`make_tls_files`: a CA, a server certificate (for 127.0.0.1 and
    localhost) with its key, and a client certificate with its key, all signed by the CA."""

    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path


_OPENSSL_CNF = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca_ext]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyAgreement
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
[client_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyAgreement
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
"""


def make_tls_files(dir: Path | str) -> TlsFiles:
    """Make a self-signed CA, a server certificate (SAN IP:127.0.0.1, DNS:localhost) and a
    client certificate in ``dir`` (created if missing) with the ``openssl`` CLI: P-256 keys,
    valid for ten years. Raises RedisServerError if openssl is missing or fails."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RedisServerError("openssl not found (apt-get install openssl)")
    d = Path(dir)
    d.mkdir(parents=True, exist_ok=True)
    cnf = d / "openssl.cnf"
    cnf.write_text(_OPENSSL_CNF)
    newkey = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    files = TlsFiles(
        ca=d / "ca.crt",
        cert=d / "server.crt",
        key=d / "server.key",
        client_cert=d / "client.crt",
        client_key=d / "client.key",
    )
    ca_key = d / "ca.key"
    _run(
        [
            openssl,
            "req",
            "-x509",
            "-new",
            *newkey,
            "-config",
            str(cnf),
            "-extensions",
            "ca_ext",
            "-subj",
            "/CN=stratastore test CA",
            "-days",
            "3650",
            "-keyout",
            str(ca_key),
            "-out",
            str(files.ca),
        ],
        what="openssl (CA)",
    )
    for cn, ext, crt, key in (
        ("localhost", "server_ext", files.cert, files.key),
        ("stratastore-test-client", "client_ext", files.client_cert, files.client_key),
    ):
        csr = crt.with_suffix(".csr")
        _run(
            [
                openssl,
                "req",
                "-new",
                *newkey,
                "-config",
                str(cnf),
                "-subj",
                f"/CN={cn}",
                "-keyout",
                str(key),
                "-out",
                str(csr),
            ],
            what=f"openssl ({cn} key)",
        )
        _run(
            [
                openssl,
                "x509",
                "-req",
                "-in",
                str(csr),
                "-CA",
                str(files.ca),
                "-CAkey",
                str(ca_key),
                "-set_serial",
                str(random.getrandbits(63)),
                "-days",
                "3650",
                "-extfile",
                str(cnf),
                "-extensions",
                ext,
                "-out",
                str(crt),
            ],
            what=f"openssl ({cn} certificate)",
        )
        csr.unlink()
    return files


def _encode(args: Sequence[Arg]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(parts)


def _read_reply(f: io.BufferedRWPair) -> Reply:
    """One RESP2 reply read from ``f``; an error reply raises RedisReplyError (once the whole
    reply is read)."""
    line = f.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError("connection closed by the server")
    kind, body = line[:1], line[1:-2]
    if kind == b"+":
        return body
    if kind == b"-":
        raise RedisReplyError(body.decode(errors="replace"))
    if kind == b":":
        return int(body)
    if kind == b"$":
        n = int(body)
        if n < 0:
            return None
        data = f.read(n + 2)
        if len(data) != n + 2:
            raise ConnectionError("connection closed by the server")
        return data[:-2]
    if kind == b"*":
        n = int(body)
        if n < 0:
            return None
        items: list[Reply] = []
        error: RedisReplyError | None = None
        for _ in range(n):
            try:
                items.append(_read_reply(f))
            except RedisReplyError as e:  # e.g. EXEC: keep reading, raise the first
                error = error or e
        if error is not None:
            raise error
        return items
    raise ConnectionError(f"not a RESP2 reply: {line[:60]!r}")


def _pdeathsig_prefix() -> list[str]:
    """``setpriv --pdeathsig KILL --`` where util-linux's setpriv exists (Linux), else []."""
    setpriv = shutil.which("setpriv", path=f"{os.environ.get('PATH', '')}:/usr/bin")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []


class RedisServer:
    """One real ``redis-server`` on 127.0.0.1, started (and ready) when constructed unless
    ``start=False``.

    ``dir``: its working directory (created if missing): ``redis.log`` (its stdout and stderr),
    and ``nodes.conf`` for a cluster node. ``password``: ``requirepass`` (the default user's
    password). ``acl_users``: ACL rule lines such as ``"user alice on >pw ~strata/alice/* +@all"``
    (the leading ``user`` is optional; rules are split on whitespace, so a password cannot hold a
    space). ``tls``: serve TLS only (``--port 0 --tls-port P``), requiring a client certificate
    when ``tls_auth_clients``. ``maxmemory``/``maxmemory_policy``: e.g. ``"2mb"``,
    ``"noeviction"``. ``cluster``: a cluster node (``cluster-enabled yes``, node timeout 2 s).
    ``extra_args``: more ``--option value`` arguments, last. ``port``: a fixed port (default: a
    free one, and a new one if another process takes it first).

    ``.host``, ``.port``, ``.url`` (``redis://`` or ``rediss://``, no credentials), ``.dir`` and,
    once started, ``.pid`` are attributes. :meth:`stop` and :meth:`kill` may be called any number
    of times; :meth:`start` restarts a stopped server on the same port and directory (its data is
    gone: persistence is off).
    """

    def __init__(
        self,
        dir: Path | str,
        *,
        password: str | None = None,
        acl_users: Sequence[str] = (),
        tls: TlsFiles | None = None,
        tls_auth_clients: bool = False,
        maxmemory: str | None = None,
        maxmemory_policy: str | None = None,
        cluster: bool = False,
        extra_args: Sequence[str] = (),
        port: int | None = None,
        binaries: tuple[str, str] | None = None,
        start: bool = True,
    ) -> None:
        found = binaries or find_redis()
        if found is None:
            raise RedisServerError(
                "redis-server not found: run `make test` (tools/ensure_redis.sh) or "
                "`apt-get install redis-server`"
            )
        self.server_bin, self.cli_bin = found
        self.dir = Path(dir).resolve()
        self.host = HOST
        self.password = password
        self.acl_users = list(acl_users)
        self.tls = tls
        self.tls_auth_clients = tls_auth_clients
        self.maxmemory = maxmemory
        self.maxmemory_policy = maxmemory_policy
        self.cluster = cluster
        self.extra_args = list(extra_args)
        self._fixed_port = port is not None
        self.port = port if port is not None else free_port(cluster_bus=cluster)
        self.log_path = self.dir / "redis.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_start = 0  # where the log of the latest start begins
        if start:
            self.start()

    # -- identity ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT`` (``rediss://`` with TLS), without credentials."""
        return f"{'rediss' if self.tls else 'redis'}://{self.host}:{self.port}"

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT``."""
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The process id of the latest start (kept once it has stopped), None before one."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """Whether the process is alive (it may not answer yet, or any more)."""
        return self._proc is not None and self._proc.poll() is None

    def __repr__(self) -> str:
        return f"RedisServer({self.url}, pid={self.pid}, dir={str(self.dir)!r})"

    # -- lifecycle --------------------------------------------------------------------------

    def command_line(self) -> list[str]:
        """The ``redis-server`` arguments this server is started with."""
        args = [
            self.server_bin,
            "--bind",
            self.host,
            "--dir",
            str(self.dir),
            "--daemonize",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
            "--logfile",
            "",
            "--enable-debug-command",
            "local",
        ]
        if self.tls:
            args += [
                "--port",
                "0",
                "--tls-port",
                str(self.port),
                "--tls-cert-file",
                str(self.tls.cert),
                "--tls-key-file",
                str(self.tls.key),
                "--tls-ca-cert-file",
                str(self.tls.ca),
                "--tls-auth-clients",
                "yes" if self.tls_auth_clients else "no",
            ]
        else:
            args += ["--port", str(self.port)]
        if self.password is not None:
            args += ["--requirepass", self.password]
        for line in self.acl_users:
            words = line.split()
            if words and words[0] == "user":
                words = words[1:]
            if not words:
                raise ValueError(f"empty ACL user line: {line!r}")
            args += ["--user", *words]
        if self.maxmemory is not None:
            args += ["--maxmemory", self.maxmemory]
        if self.maxmemory_policy is not None:
            args += ["--maxmemory-policy", self.maxmemory_policy]
        if self.cluster:
            args += [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(self.dir / "nodes.conf"),
                "--cluster-node-timeout",
                "2000",
            ]
        return args + self.extra_args

    def start(self, timeout: float = 10.0) -> Self:
        """Start the server (a no-op while it runs) and wait until it answers (:meth:`wait_ready`).
        On a port taken meanwhile by another process, retries on a free port (unless the port was
        given). Raises RedisServerError, with the log's tail, if it cannot start."""
        if self.running:
            return self
        self.dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(5):
            self._spawn()
            try:
                self.wait_ready(timeout)
                return self
            except RedisServerError:
                in_use = "Address already in use" in self.log_tail(since_start=True)
                self.kill()
                if not in_use or self._fixed_port or attempt == 4:
                    raise
                self.port = free_port(cluster_bus=self.cluster)
        raise AssertionError("unreachable")

    def _spawn(self) -> None:
        with open(self.log_path, "ab") as log:
            self._log_start = log.tell()
            log.write(f"---- {time.strftime('%H:%M:%S')} starting on port {self.port}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                [*_pdeathsig_prefix(), *self.command_line()],
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _LIVE[self._proc.pid] = self._proc

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Poll until this process answers ``INFO server`` with its own pid (so a foreign
        process on the port is never taken for it). Raises RedisServerError, with the tail of its
        log, when it exits or ``timeout`` seconds pass first."""
        proc = self._proc
        if proc is None:
            raise RedisServerError(f"{self!r} was never started")
        deadline = time.monotonic() + timeout
        delay = 0.005
        last: BaseException | None = None
        while True:
            rc = proc.poll()
            if rc is not None:
                _LIVE.pop(proc.pid, None)
                raise RedisServerError(
                    f"redis-server exited with {rc} while starting on port {self.port}; "
                    f"log {self.log_path}:\n{self.log_tail(since_start=True)}"
                )
            try:
                info = self.execute("INFO", "server", timeout=0.05 + delay * 10)
                if isinstance(info, bytes) and f"process_id:{proc.pid}\r".encode() in info:
                    return
                last = RedisServerError("another process answers on this port")
            except (OSError, RedisReplyError, ssl.SSLError) as e:  # refused, LOADING, ...
                last = e
            if time.monotonic() > deadline:
                raise RedisServerError(
                    f"redis-server on port {self.port} not ready after {timeout} s ({last!r}); "
                    f"log {self.log_path}:\n{self.log_tail(since_start=True)}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def stop(self) -> None:
        """SIGTERM, wait up to 5 s for the exit, then SIGKILL (its process group). Idempotent."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.kill()
                return
        _LIVE.pop(proc.pid, None)

    def kill(self) -> None:
        """SIGKILL its process group now and reap it (a crash, for fault tests): once this
        returns, connections to the port are refused. Idempotent."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(STOP_TIMEOUT)
        _LIVE.pop(proc.pid, None)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def log_tail(self, lines: int = 40, *, since_start: bool = False) -> str:
        """The last ``lines`` lines of ``redis.log`` ('' when there is none); with
        ``since_start``, of what the latest start wrote only."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_start if since_start else 0)
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # -- talking to it ----------------------------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext:
        """A client context trusting the test CA, presenting the client certificate (TLS only)."""
        if self.tls is None:
            raise RedisServerError(f"{self!r} does not serve TLS")
        ctx = ssl.create_default_context(cafile=str(self.tls.ca))
        ctx.load_cert_chain(str(self.tls.client_cert), str(self.tls.client_key))
        return ctx

    @contextlib.contextmanager
    def connection(
        self, *, user: str | None = None, password: str | None = None, timeout: float = 5.0
    ) -> Iterator[io.BufferedRWPair]:
        """A raw (TLS where served) connection, authenticated as ``user``/``password`` (default:
        the server's password, if any), as a buffered file for RESP2 exchanges (write, flush,
        then read the reply). Every read and write has the ``timeout``."""
        sock = socket.create_connection((self.host, self.port), timeout=timeout)
        try:
            if self.tls is not None:
                sock = self.ssl_context().wrap_socket(sock, server_hostname=self.host)
            with sock.makefile("rwb") as f:
                password = password if password is not None else self.password
                if password is not None:
                    auth: list[Arg] = ["AUTH", password]
                    if user is not None:
                        auth.insert(1, user)
                    f.write(_encode(auth))
                    f.flush()
                    _read_reply(f)
                yield f
        finally:
            sock.close()

    def execute(
        self,
        *args: Arg,
        user: str | None = None,
        password: str | None = None,
        timeout: float = 5.0,
    ) -> Reply:
        """Send one command on a new connection (authenticated as in :meth:`connection`) and
        return its RESP2 reply: bytes, int, None or a list. An error reply raises
        RedisReplyError; a refused, reset or timed-out connection raises OSError."""
        with self.connection(user=user, password=password, timeout=timeout) as f:
            f.write(_encode(args))
            f.flush()
            return _read_reply(f)

    def cli_args(self, *, user: str | None = None, password: str | None = None) -> list[str]:
        """``redis-cli`` with ``-e`` (an error reply exits non-zero) and this server's host,
        port, TLS flags and credentials (default: its password, if any)."""
        args = [self.cli_bin, "-e", "-h", self.host, "-p", str(self.port)]
        if self.tls is not None:
            args += [
                "--tls",
                "--cacert",
                str(self.tls.ca),
                "--cert",
                str(self.tls.client_cert),
                "--key",
                str(self.tls.client_key),
            ]
        password = password if password is not None else self.password
        if user is not None:
            args += ["--user", user]
        if password is not None:
            args += ["-a", password, "--no-auth-warning"]
        return args

    def cli(
        self,
        *args: str,
        user: str | None = None,
        password: str | None = None,
        timeout: float = CLI_TIMEOUT,
    ) -> str:
        """Run ``redis-cli ARGS`` against this server (see :meth:`cli_args`) and return its stdout
        (redis-cli's raw format: one line per value). Raises RedisServerError on a non-zero exit
        (an error reply included) or after ``timeout`` seconds."""
        return _run(
            [*self.cli_args(user=user, password=password), *args],
            timeout=timeout,
            what=f"redis-cli {' '.join(args[:2])}",
        )

    def client_kwargs(self) -> dict[str, object]:
        """Keyword arguments for ``redis.Redis(**kwargs)`` (host, port, password, and the TLS
        files where served)."""
        kw: dict[str, object] = {"host": self.host, "port": self.port}
        if self.password is not None:
            kw["password"] = self.password
        if self.tls is not None:
            kw.update(
                ssl=True,
                ssl_ca_certs=str(self.tls.ca),
                ssl_certfile=str(self.tls.client_cert),
                ssl_keyfile=str(self.tls.client_key),
            )
        return kw


class RedisCluster:
    """A real Redis cluster of ``masters`` (default 3) master nodes and no replicas, each a
    :class:`RedisServer` with ``cluster=True`` in ``dir/nodeN``, joined with ``redis-cli
    --cluster create`` and ready (``cluster_state:ok`` on every node) when constructed.

    ``.nodes`` (the servers), ``.seeds`` (``["127.0.0.1:PORT", ...]``) and ``.url``
    (``redis+cluster://127.0.0.1:P1,127.0.0.1:P2,...``) are attributes. ``password`` is every
    node's ``requirepass``; ``extra_args`` go to every node.
    """

    def __init__(
        self,
        dir: Path | str,
        *,
        masters: int = 3,
        password: str | None = None,
        extra_args: Sequence[str] = (),
        binaries: tuple[str, str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        if masters < 3:
            raise ValueError("redis-cli --cluster create needs at least 3 masters")
        self.dir = Path(dir).resolve()
        self.nodes: list[RedisServer] = []
        try:
            for i in range(masters):
                self.nodes.append(
                    RedisServer(
                        self.dir / f"node{i}",
                        cluster=True,
                        password=password,
                        extra_args=extra_args,
                        binaries=binaries,
                    )
                )
            self.nodes[0].cli(
                "--cluster",
                "create",
                *self.seeds,
                "--cluster-replicas",
                "0",
                "--cluster-yes",
                timeout=timeout,
            )
            self.wait_ok(timeout)
        except BaseException:
            self.stop()
            raise
        self.ids = {self.node_id(n): n for n in self.nodes}

    @property
    def seeds(self) -> list[str]:
        """``["127.0.0.1:PORT", ...]``, one per node."""
        return [n.address for n in self.nodes]

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:P1,127.0.0.1:P2,...`` (no credentials)."""
        return "redis+cluster://" + ",".join(self.seeds)

    def __repr__(self) -> str:
        return f"RedisCluster({self.url})"

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop every node (:meth:`RedisServer.stop`). Idempotent."""
        for n in self.nodes:
            n.stop()

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Poll until every running node reports ``cluster_state:ok`` with all 16384 slots
        assigned and knows all the nodes; RedisServerError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        want = [
            b"cluster_state:ok",
            b"cluster_slots_assigned:16384",
            b"cluster_known_nodes:%d" % len(self.nodes),
        ]
        delay = 0.01
        while True:
            infos: list[Reply] = []
            with contextlib.suppress(OSError, RedisReplyError):
                infos = [n.execute("CLUSTER", "INFO") for n in self.nodes if n.running]
            if infos and all(isinstance(i, bytes) and all(w in i for w in want) for i in infos):
                return
            if time.monotonic() > deadline:
                raise RedisServerError(f"{self!r}: not ok after {timeout} s: {infos!r}")
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    @staticmethod
    def node_id(node: RedisServer) -> str:
        """The node's cluster id (``CLUSTER MYID``)."""
        reply = node.execute("CLUSTER", "MYID")
        assert isinstance(reply, bytes)
        return reply.decode()

    def keyslot(self, key: str | bytes) -> int:
        """The hash slot of ``key`` (``CLUSTER KEYSLOT``)."""
        reply = self.nodes[0].execute("CLUSTER", "KEYSLOT", key)
        assert isinstance(reply, int)
        return reply

    def slot_owner(self, slot: int, *, view: RedisServer | None = None) -> RedisServer:
        """The master serving ``slot``, as ``CLUSTER NODES`` on ``view`` (default: the first
        running node) tells."""
        view = view or next(n for n in self.nodes if n.running)
        reply = view.execute("CLUSTER", "NODES")
        assert isinstance(reply, bytes)
        for line in reply.decode().splitlines():
            fields = line.split()
            if len(fields) < 8 or "master" not in fields[2].split(","):
                continue
            for r in fields[8:]:
                if r.startswith("["):  # [slot->-id] migrating, [slot-<-id] importing
                    continue
                lo, _, hi = r.partition("-")
                if int(lo) <= slot <= int(hi or lo):
                    return self.ids[fields[0]]
        raise RedisServerError(f"slot {slot} has no owner in {view!r}'s view:\n{reply.decode()}")

    def move_slot_of(
        self, key: str | bytes, target: RedisServer | None = None, *, timeout: float = 30.0
    ) -> None:
        """Migrate the hash slot of ``key``, with all its keys, to ``target`` (default: the next
        master after its owner), the standard manual way: SETSLOT IMPORTING on the target,
        MIGRATING on the source, ``MIGRATE ... KEYS`` in batches of 100 until the slot is empty,
        then ``SETSLOT slot NODE target`` on the target, the source and the others, and a wait
        until every node sees the target as the owner. Clients holding the old slot map get
        MOVED (or ASK while it runs)."""
        slot = self.keyslot(key)
        source = self.slot_owner(slot)
        if target is None:
            target = self.nodes[(self.nodes.index(source) + 1) % len(self.nodes)]
        if target is source:
            return
        src_id, dst_id = self.node_id(source), self.node_id(target)
        target.execute("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        source.execute("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        auth: list[Arg] = ["AUTH", target.password] if target.password is not None else []
        deadline = time.monotonic() + timeout
        while True:
            keys = source.execute("CLUSTER", "GETKEYSINSLOT", slot, 100)
            assert isinstance(keys, list)
            if not keys:
                break
            if time.monotonic() > deadline:
                raise RedisServerError(f"slot {slot}: keys still on the source after {timeout} s")
            batch: list[Arg] = [k for k in keys if isinstance(k, bytes)]
            source.execute(
                "MIGRATE",
                target.host,
                target.port,
                "",
                0,
                5000,
                *auth,
                "KEYS",
                *batch,
                timeout=10.0,
            )
        for n in [target, source, *(n for n in self.nodes if n not in (target, source))]:
            if n.running:
                n.execute("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        while any(self.slot_owner(slot, view=n) is not target for n in self.nodes if n.running):
            if time.monotonic() > deadline:
                raise RedisServerError(f"slot {slot}: not every node sees {target!r} as owner")
            time.sleep(0.01)


@atexit.register
def _kill_leftovers() -> None:
    """SIGKILL (process group) every server this module started that is still running."""
    for pid, proc in list(_LIVE.items()):
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(2)
        _LIVE.pop(pid, None)
