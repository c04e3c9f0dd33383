"""Run a local standalone Apache ZooKeeper from Debian's ``zookeeper`` package.

Sluice's brokers keep their cluster metadata in ZooKeeper. Tests and the local cluster launcher
start a private standalone server per cluster with :class:`LocalZooKeeper`; everything the
server writes stays under one directory::

    data_dir/
      zoo.cfg             the server configuration (written by start())
      log4j.properties    logging configuration: everything goes to zookeeper.log
      zookeeper.log       the server log
      zookeeper.out       the JVM's stdout and stderr (normally empty)
      zookeeper.pid       the server's process id, for stop_from_pidfile()
      data/version-2/     snapshots and transaction logs

The server runs in its own session (process group), so it survives the Python process that
started it: stop it with :meth:`LocalZooKeeper.stop` or, from another process, with
:meth:`LocalZooKeeper.stop_from_pidfile`.

Debian packaging notes (bookworm, ZooKeeper 3.8.0):

* ``/usr/share/java/zookeeper.jar`` names its dependencies (jute, netty, slf4j-api, jetty,
  jackson, ...) in its manifest's ``Class-Path``; the package's own launcher puts only that jar
  on the class path. The manifest names no SLF4J binding, so without one the server logs
  nothing. :func:`find_classpath` adds ``slf4j-log4j12.jar`` and ``log4j-1.2.jar`` (the binding
  the package's own ``log4j.properties`` is written for).
* ZooKeeper accepts connections, and answers ``ruok`` with ``imok``, a little *before* it
  serves requests (``srvr`` then says "This ZooKeeper instance is not currently serving
  requests"); :meth:`LocalZooKeeper.start` waits for both.
* The server clamps each client's requested session timeout to
  ``[minSessionTimeout, maxSessionTimeout]``, which default to ``[2, 20] * tickTime``. Both are
  written explicitly (defaults 1 s and 60 s) so that session timeouts from 2 s to 30 s are
  granted as asked whatever the tick.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import socket
import subprocess
import time
import zipfile
from pathlib import Path
from types import TracebackType

__all__ = [
    "JAVA_DIR",
    "MAIN_CLASS",
    "LocalZooKeeper",
    "ZooKeeperNotInstalledError",
    "find_classpath",
    "find_java",
    "four_letter_word",
]

#: Where Debian installs Java libraries (``libzookeeper-java`` and its dependencies).
JAVA_DIR = Path("/usr/share/java")

#: The standalone server's entry point (the package's scripts use QuorumPeerMain, which falls
#: back to this class when the configuration names no quorum).
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"

_INSTALL_HINT = "run scripts/bootstrap.sh (apt-get install zookeeper)"

# Jars the server cannot start (or cannot log) without. Everything else zookeeper.jar's manifest
# names is added to the class path when present (the JVM would read the manifest anyway).
_REQUIRED_JARS = (
    "zookeeper.jar",
    "zookeeper-jute.jar",
    "slf4j-api.jar",
    "slf4j-log4j12.jar",
    "log4j-1.2.jar",
)
# The SLF4J binding and the logging backend, which zookeeper.jar's manifest does not name.
_LOGGING_JARS = ("slf4j-log4j12.jar", "log4j-1.2.jar")

# Four-letter-word commands the server answers. ``conf`` (read-only) lets start() check that the
# server answering on the port is the one it launched.
_FOUR_LETTER_WORDS = "ruok,srvr,mntr,stat,conf"

_POLL_INTERVAL_S = 0.05
_LOG_TAIL_LINES = 40


class ZooKeeperNotInstalledError(RuntimeError):
    """ZooKeeper's jars or a Java runtime are missing from this machine."""


def find_classpath(java_dir: Path = JAVA_DIR) -> str:
    """Return the Java class path that runs the Debian-packaged ZooKeeper server.

    The class path is ``zookeeper.jar``, every jar its manifest's ``Class-Path`` names that
    exists, then the SLF4J-to-log4j binding and log4j 1.2.

    Args:
        java_dir: the directory holding the jars (Debian's ``/usr/share/java``).

    Raises:
        ZooKeeperNotInstalledError: when a jar the server needs is missing.
    """
    missing = [name for name in _REQUIRED_JARS if not (java_dir / name).is_file()]
    if missing:
        raise ZooKeeperNotInstalledError(
            f"ZooKeeper is not installed: {_INSTALL_HINT}; missing {', '.join(missing)} in {java_dir}"
        )
    main_jar = java_dir / "zookeeper.jar"
    entries = [str(main_jar)]
    for dependency in _manifest_class_path(main_jar):
        path = Path(dependency) if Path(dependency).is_absolute() else java_dir / dependency
        if path.is_file() and str(path) not in entries:
            entries.append(str(path))
    for name in _LOGGING_JARS:
        path_str = str(java_dir / name)
        if path_str not in entries:
            entries.append(path_str)
    return os.pathsep.join(entries)


def _manifest_class_path(jar: Path) -> list[str]:
    """Return the entries of a jar manifest's ``Class-Path`` attribute (empty when absent)."""
    try:
        with zipfile.ZipFile(jar) as archive:
            manifest = archive.read("META-INF/MANIFEST.MF").decode("utf-8", "replace")
    except (KeyError, OSError, zipfile.BadZipFile):
        return []
    # Manifest lines are wrapped at 72 bytes; a continuation line starts with one space.
    unwrapped = manifest.replace("\r\n", "\n").replace("\n ", "")
    for line in unwrapped.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() == "class-path":
            return value.split()
    return []


def find_java() -> str:
    """Return the ``java`` executable: ``$JAVA_HOME/bin/java`` when set, else ``java`` on PATH.

    Raises:
        ZooKeeperNotInstalledError: when no Java runtime is found.
    """
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise ZooKeeperNotInstalledError(
            "Java runtime not found: run scripts/bootstrap.sh (apt-get install default-jre-headless)"
        )
    return found


def four_letter_word(host: str, port: int, command: str, timeout_s: float = 2.0) -> str:
    """Send a ZooKeeper four-letter-word command (``ruok``, ``srvr``, ...) and return the reply.

    Args:
        host: the server's address.
        port: the server's client port.
        command: the four-letter word; the server must allow it (``4lw.commands.whitelist``).
        timeout_s: the connect and read timeout.

    Raises:
        ValueError: when ``command`` is not four characters long.
        OSError: when the server cannot be reached or the exchange times out.
    """
    if len(command) != 4:
        raise ValueError(f"four-letter word must have 4 characters, got {command!r}")
    chunks: list[bytes] = []
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(command.encode("ascii"))
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


class LocalZooKeeper:
    """A standalone ZooKeeper server process whose files all live in one directory.

    Example::

        zk = LocalZooKeeper(tmp_path / "zk", free_port())
        zk.start()
        client = KazooClient(hosts=zk.connect_string, timeout=6.0)
        ...
        zk.stop()

    It is also a context manager (start on enter, stop on exit).
    """

    def __init__(
        self,
        data_dir: Path,
        port: int,
        *,
        host: str = "127.0.0.1",
        tick_time_ms: int = 500,
        min_session_timeout_ms: int = 1000,
        max_session_timeout_ms: int = 60000,
        heap_mb: int = 256,
        force_sync: bool = True,
    ) -> None:
        """Describe a server; nothing is written or started until :meth:`start`.

        Args:
            data_dir: the directory for configuration, logs, pid file and data (created on start).
            port: the client port.
            host: the address the client port binds (``clientPortAddress``).
            tick_time_ms: ZooKeeper's basic time unit; session expiry is checked once a tick.
            min_session_timeout_ms: the smallest session timeout granted to a client.
            max_session_timeout_ms: the largest session timeout granted to a client.
            heap_mb: the JVM's maximum heap.
            force_sync: fsync the transaction log on every commit (``forceSync``); turning it
                off speeds up throwaway test servers.

        Raises:
            ValueError: on an out-of-range port or inconsistent timeouts.
        """
        if not 0 < port < 65536:
            raise ValueError(f"port must be in 1..65535, got {port}")
        if tick_time_ms <= 0:
            raise ValueError(f"tick_time_ms must be positive, got {tick_time_ms}")
        if not 0 < min_session_timeout_ms <= max_session_timeout_ms:
            raise ValueError(
                "need 0 < min_session_timeout_ms <= max_session_timeout_ms, got "
                f"{min_session_timeout_ms} and {max_session_timeout_ms}"
            )
        if heap_mb < 16:
            raise ValueError(f"heap_mb must be at least 16, got {heap_mb}")
        self.data_dir = Path(data_dir).resolve()
        self.port = port
        self.host = host
        self.tick_time_ms = tick_time_ms
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.heap_mb = heap_mb
        self.force_sync = force_sync
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    # -- paths ---------------------------------------------------------------------------------

    @property
    def config_path(self) -> Path:
        """The server configuration file, ``data_dir/zoo.cfg``."""
        return self.data_dir / "zoo.cfg"

    @property
    def log4j_path(self) -> Path:
        """The logging configuration, ``data_dir/log4j.properties``."""
        return self.data_dir / "log4j.properties"

    @property
    def log_path(self) -> Path:
        """The server log, ``data_dir/zookeeper.log``."""
        return self.data_dir / "zookeeper.log"

    @property
    def out_path(self) -> Path:
        """The JVM's stdout and stderr, ``data_dir/zookeeper.out``."""
        return self.data_dir / "zookeeper.out"

    @property
    def pid_path(self) -> Path:
        """The pid file, ``data_dir/zookeeper.pid``."""
        return _pid_path(self.data_dir)

    @property
    def snapshot_dir(self) -> Path:
        """ZooKeeper's ``dataDir`` (snapshots and transaction logs), ``data_dir/data``."""
        return self.data_dir / "data"

    @property
    def connect_string(self) -> str:
        """The client connect string, ``host:port`` (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs, else None."""
        if self._proc is not None:
            return self._proc.pid if self._proc.poll() is None else None
        return _live_server_pid(self.data_dir)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, timeout_s: float = 30) -> None:
        """Write the configuration, launch the server, and wait until it serves requests.

        Args:
            timeout_s: how long to wait for the server to serve requests.

        Raises:
            ZooKeeperNotInstalledError: when ZooKeeper or Java is missing.
            RuntimeError: when a server already runs from ``data_dir``, the port is taken, or
                the server exits or does not serve within ``timeout_s`` (the message quotes the
                tail of its log; the process is killed).
        """
        if self.is_running():
            raise RuntimeError(f"ZooKeeper from {self.data_dir} is already running (pid {self.pid})")
        classpath = find_classpath()
        java = find_java()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.snapshot_dir.mkdir(exist_ok=True)
        other = _live_server_pid(self.data_dir)
        if other is not None:
            raise RuntimeError(
                f"ZooKeeper from {self.data_dir} is already running as pid {other} "
                "(stop it with LocalZooKeeper.stop_from_pidfile)"
            )
        self.pid_path.unlink(missing_ok=True)
        _check_port_free(self.host, self.port)
        self.config_path.write_text(self._render_config())
        self.log4j_path.write_text(self._render_log4j())
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0

        argv = [java, *self._jvm_options(), "-cp", classpath, MAIN_CLASS, str(self.config_path)]
        with self.out_path.open("wb") as out:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,
                close_fds=True,
            )
        try:
            _write_atomically(self.pid_path, f"{self._proc.pid}\n")
            self._wait_until_serving(timeout_s)
        except BaseException:
            self._kill_now()
            raise

    def stop(self, timeout_s: float = 10) -> None:
        """Stop the server: SIGTERM, then SIGKILL after ``timeout_s``; remove the pid file.

        Works whether this object started the server or another process did (it then uses the
        pid file). Stopping a server that is not running does nothing.
        """
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                _terminate(proc.pid, timeout_s, proc)
            self.pid_path.unlink(missing_ok=True)
        else:
            self.stop_from_pidfile(self.data_dir, timeout_s)

    @classmethod
    def stop_from_pidfile(cls, data_dir: Path, timeout_s: float = 10) -> bool:
        """Stop the server whose pid file is in ``data_dir``, from any process.

        The pid is trusted only if that process is a ZooKeeper server launched with
        ``data_dir/zoo.cfg``, so a stale pid file never kills an unrelated process.

        Returns:
            True if a running server was stopped, False if none was running.
        """
        data_dir = Path(data_dir).resolve()
        pid = _live_server_pid(data_dir)
        if pid is not None:
            _terminate(pid, timeout_s, None)
        _pid_path(data_dir).unlink(missing_ok=True)
        return pid is not None

    def is_running(self) -> bool:
        """Return whether the server process is alive (started here or found via the pid file)."""
        return self.pid is not None

    def __enter__(self) -> LocalZooKeeper:
        """Start the server."""
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the server."""
        self.stop()

    def __repr__(self) -> str:
        """Show the address and the directory."""
        return f"LocalZooKeeper({self.connect_string}, data_dir={str(self.data_dir)!r})"

    # -- internals -----------------------------------------------------------------------------

    def _render_config(self) -> str:
        """Return the text of ``zoo.cfg``."""
        settings = {
            "tickTime": self.tick_time_ms,
            "initLimit": 10,
            "syncLimit": 5,
            "dataDir": self.snapshot_dir,
            "clientPort": self.port,
            "clientPortAddress": self.host,
            "minSessionTimeout": self.min_session_timeout_ms,
            "maxSessionTimeout": self.max_session_timeout_ms,
            "maxClientCnxns": 0,
            "admin.enableServer": "false",
            "4lw.commands.whitelist": _FOUR_LETTER_WORDS,
            "autopurge.snapRetainCount": 3,
            "autopurge.purgeInterval": 1,
            "forceSync": "yes" if self.force_sync else "no",
        }
        lines = ["# Written by sluice.ops.zookeeper.LocalZooKeeper; rewritten on every start."]
        lines += [f"{key}={value}" for key, value in settings.items()]
        return "\n".join(lines) + "\n"

    def _render_log4j(self) -> str:
        """Return the text of ``log4j.properties``: INFO and above to ``zookeeper.log`` only."""
        return (
            "# Written by sluice.ops.zookeeper.LocalZooKeeper; rewritten on every start.\n"
            "log4j.rootLogger=INFO, FILE\n"
            "log4j.appender.FILE=org.apache.log4j.RollingFileAppender\n"
            f"log4j.appender.FILE.File={self.log_path}\n"
            "log4j.appender.FILE.MaxFileSize=10MB\n"
            "log4j.appender.FILE.MaxBackupIndex=2\n"
            "log4j.appender.FILE.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.FILE.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] - %m%n\n"
        )

    def _jvm_options(self) -> list[str]:
        """Return the JVM's options: a small heap, serial GC, and logging to the log file."""
        return [
            f"-Xmx{self.heap_mb}m",
            "-Xss512k",
            "-XX:+UseSerialGC",
            "-XX:+ExitOnOutOfMemoryError",
            "-XX:-UsePerfData",
            f"-XX:ErrorFile={self.data_dir / 'hs_err_pid%p.log'}",
            "-Djava.awt.headless=true",
            f"-Dlog4j.configuration={self.log4j_path.as_uri()}",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-Dzookeeper.admin.enableServer=false",
        ]

    def _wait_until_serving(self, timeout_s: float) -> None:
        """Wait until the launched server answers ``ruok`` and serves requests, or raise."""
        assert self._proc is not None
        deadline = time.monotonic() + timeout_s
        while True:
            code = self._proc.poll()
            if code is not None:
                raise RuntimeError(
                    f"ZooKeeper on {self.connect_string} exited with code {code} during start-up"
                    f"{self._log_tail()}"
                )
            if self._serving():
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"ZooKeeper on {self.connect_string} did not serve requests within "
                    f"{timeout_s:g} s{self._log_tail()}"
                )
            time.sleep(_POLL_INTERVAL_S)

    def _serving(self) -> bool:
        """Return whether this server answers ``imok`` and serves requests on its port.

        Raises:
            RuntimeError: when another ZooKeeper (a different ``dataDir``) answers on the port.
        """
        try:
            if four_letter_word(self.host, self.port, "ruok", 1.0) != "imok":
                return False
            if "Mode: standalone" not in four_letter_word(self.host, self.port, "srvr", 1.0):
                return False
            conf = four_letter_word(self.host, self.port, "conf", 1.0)
        except OSError:
            return False
        expected = f"dataDir={self.snapshot_dir / 'version-2'}"
        if expected not in conf.splitlines():
            raise RuntimeError(
                f"another ZooKeeper answers on {self.connect_string}; its configuration:\n{conf}"
            )
        return True

    def _log_tail(self) -> str:
        """Return the end of this start's server log and JVM output, for error messages."""
        parts: list[str] = []
        for path, offset in ((self.log_path, self._log_offset), (self.out_path, 0)):
            try:
                with path.open("rb") as f:
                    f.seek(offset)
                    text = f.read().decode("utf-8", "replace")
            except OSError:
                continue
            lines = text.rstrip().splitlines()[-_LOG_TAIL_LINES:]
            if lines:
                parts.append(f"\n--- last lines of {path} ---\n" + "\n".join(lines))
        return "".join(parts) or f"\n(no output in {self.log_path} or {self.out_path})"

    def _kill_now(self) -> None:
        """Kill a server that failed to start and forget it."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            _signal_server(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        self.pid_path.unlink(missing_ok=True)


def _pid_path(data_dir: Path) -> Path:
    """Return the pid file of the server in ``data_dir``."""
    return data_dir / "zookeeper.pid"


def _write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so that readers never see a partial file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _check_port_free(host: str, port: int) -> None:
    """Raise RuntimeError when ``host:port`` cannot be bound (as the server would bind it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # The JVM sets SO_REUSEADDR on server sockets, so a port in TIME_WAIT is usable.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            reason = "is already in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound: {exc}"
            raise RuntimeError(f"cannot start ZooKeeper: port {port} on {host} {reason}") from exc


def _live_server_pid(data_dir: Path) -> int | None:
    """Return the pid in ``data_dir``'s pid file if it is a live ZooKeeper launched from there."""
    try:
        pid = int(_pid_path(data_dir).read_text().strip())
    except (OSError, ValueError):
        return None
    if pid <= 0 or not _alive(pid):
        return None
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        # Without /proc (not Linux) the pid file is trusted; with it, the process just exited.
        return None if Path("/proc/self").exists() else pid
    config = os.fsencode(str(data_dir / "zoo.cfg"))
    if os.fsencode(MAIN_CLASS) in argv and config in argv:
        return pid
    return None


def _alive(pid: int) -> bool:
    """Return whether ``pid`` exists and has not exited. A zombie has exited, but a JVM's main
    thread shows as a zombie ("Z") while its other threads still run its shutdown: the process
    is alive until its thread count falls to that one thread."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        fields = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
        )
    except OSError:
        return True
    state = fields.get("State", "").strip()[:1]
    threads = int(fields.get("Threads", "1").strip() or 1)
    return state not in ("Z", "X") or threads > 1


def _signal_server(pid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to the server's process group (it leads its own session), or to the pid."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _terminate(pid: int, timeout_s: float, proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM ``pid``, wait up to ``timeout_s``, then SIGKILL; reap it if it is our child."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        _signal_server(pid, sig)
        if _wait_exit(pid, wait_s, proc):
            return
    raise RuntimeError(f"ZooKeeper pid {pid} did not exit after SIGKILL")


def _wait_exit(pid: int, timeout_s: float, proc: subprocess.Popen[bytes] | None) -> bool:
    """Wait up to ``timeout_s`` for ``pid`` to exit; return whether it did."""
    if proc is not None:
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True
