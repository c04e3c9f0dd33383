"""Run local Apache ZooKeeper servers from Debian's ``zookeeper`` package: standalone or an ensemble.

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

:class:`ZooKeeperEnsemble` runs M members (:class:`EnsembleNode`, ``QuorumPeerMain`` with
``server.N=host:peerPort:electionPort`` lines and a ``data/myid``), each binding its own address
and optionally started inside a host of a ``sluice.ops.netns.HostNetwork`` (an exec prefix),
under ``base_dir/zk<N>/`` laid out as above. It kills a member with SIGKILL and restarts it on
its data, and finds the leader with the ``srvr`` four-letter word (``Mode: leader``). A member
serves only while it is part of a quorum; its peers' election connections time out after 1 s
(``zookeeper.cnxTimeout``, 5 s by default) so that elections around a partitioned member stay
quick.

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
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from sluice.ops.ports import bind_error, free_ports
from sluice.ops.private_files import PRIVATE_UMASK, open_private_log, private_dir

__all__ = [
    "JAVA_DIR",
    "MAIN_CLASS",
    "QUORUM_MAIN_CLASS",
    "EnsembleMember",
    "EnsembleNode",
    "LocalZooKeeper",
    "ZooKeeperEnsemble",
    "ZooKeeperNotInstalledError",
    "find_classpath",
    "find_java",
    "four_letter_word",
    "parse_mode",
]

#: Where Debian installs Java libraries (``libzookeeper-java`` and its dependencies).
JAVA_DIR = Path("/usr/share/java")

#: The standalone server's entry point (the package's scripts use QuorumPeerMain, which falls
#: back to this class when the configuration names no quorum).
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"

#: An ensemble member's entry point (reads the ``server.N`` lines and ``myid``).
QUORUM_MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"

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

log = logging.getLogger("sluice.ops.zookeeper")

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


def parse_mode(srvr_reply: str) -> str | None:
    """Return the ``Mode:`` of a ``srvr`` reply (``leader``, ``follower``, ``standalone``, ...),
    or None when the reply has none (``This ZooKeeper instance is not currently serving
    requests``)."""
    for line in srvr_reply.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "Mode":
            return value.strip()
    return None


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
        exec_prefix: Sequence[str] = (),
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
            exec_prefix: an argv prefix the JVM is started under, such as a host's
                ``ip netns exec <namespace>`` (``sluice.ops.netns.Host.exec_prefix``): the server
                then binds ``host`` inside that namespace. This process must still reach
                ``host:port`` (it checks the server with four-letter words).

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
        self.exec_prefix = tuple(exec_prefix)
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
        self.launch()
        try:
            self.wait_until_serving(timeout_s)
        except BaseException:
            self._kill_now()
            raise

    def launch(self) -> None:
        """Write the configuration and launch the server without waiting for it to serve.

        An ensemble launches all its members first: none serves before a quorum runs. Follow
        with :meth:`wait_until_serving`.

        Raises:
            ZooKeeperNotInstalledError: when ZooKeeper or Java is missing.
            RuntimeError: when a server already runs from ``data_dir`` or the port is taken.
        """
        if self.is_running():
            raise RuntimeError(f"ZooKeeper from {self.data_dir} is already running (pid {self.pid})")
        classpath = find_classpath()
        java = find_java()
        private_dir(self.data_dir)  # its snapshots, logs and configuration: its owner's alone
        private_dir(self.snapshot_dir)
        other = _live_server_pid(self.data_dir)
        if other is not None:
            raise RuntimeError(
                f"ZooKeeper from {self.data_dir} is already running as pid {other} "
                "(stop it with LocalZooKeeper.stop_from_pidfile)"
            )
        self.pid_path.unlink(missing_ok=True)
        if not self.exec_prefix:
            # Inside another namespace the address is not this namespace's to test; a taken port
            # then shows as the server exiting during start-up, with its log quoted.
            _check_port_free(self.host, self.port)
        self._write_files()
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0

        main = self._main_class
        argv = [*self.exec_prefix, java, *self._jvm_options(), "-cp", classpath, main, str(self.config_path)]
        self.out_path.unlink(missing_ok=True)
        with open_private_log(self.out_path) as out:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,
                close_fds=True,
                umask=PRIVATE_UMASK,
            )
        try:
            # `ip netns exec` replaces itself with the JVM, so this is the JVM's pid.
            _write_atomically(self.pid_path, f"{self._proc.pid}\n")
        except BaseException:
            self._kill_now()
            raise

    def wait_until_serving(self, timeout_s: float = 30) -> None:
        """Wait until the launched server answers ``ruok`` and serves requests, or raise.

        Raises:
            RuntimeError: when the server was not launched here, exits, or does not serve within
                ``timeout_s`` (the message quotes the tail of its log; the process keeps running).
        """
        if self._proc is None:
            raise RuntimeError(f"ZooKeeper from {self.data_dir} was not launched by this object")
        self._wait_until_serving(timeout_s)

    def kill(self) -> None:
        """Kill the server with SIGKILL, as a crash would; its files stay for a restart.

        Killing a server that is not running does nothing.
        """
        pid = self.pid
        if pid is None:
            return
        _signal_server(pid, signal.SIGKILL)
        proc = self._proc
        if not _wait_exit(pid, 10.0, proc if proc is not None and proc.pid == pid else None):
            raise RuntimeError(f"ZooKeeper pid {pid} did not exit after SIGKILL")

    def mode(self, timeout_s: float = 1.0) -> str | None:
        """Return the server's ``Mode`` from ``srvr`` (``standalone``, ``leader``, ``follower``,
        ``observer``), or None when it does not serve requests or cannot be reached."""
        try:
            reply = four_letter_word(self.host, self.port, "srvr", timeout_s)
        except OSError:
            return None
        return parse_mode(reply)

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

    #: The JVM's entry point, and the modes in which ``srvr`` shows the server serves.
    _main_class = MAIN_CLASS
    _serving_modes: tuple[str, ...] = ("standalone",)

    def _write_files(self) -> None:
        """Write ``zoo.cfg`` and ``log4j.properties`` (rewritten on every start)."""
        self.config_path.write_text(self._render_config())
        self.log4j_path.write_text(self._render_log4j())

    def _config_settings(self) -> dict[str, object]:
        """Return the ``zoo.cfg`` settings."""
        return {
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

    def _render_config(self) -> str:
        """Return the text of ``zoo.cfg``."""
        lines = [f"# Written by sluice.ops.zookeeper.{type(self).__name__}; rewritten on every start."]
        lines += [f"{key}={value}" for key, value in self._config_settings().items()]
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
            if parse_mode(four_letter_word(self.host, self.port, "srvr", 1.0)) not in self._serving_modes:
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


# -- ensembles -----------------------------------------------------------------------------------


class HostLike(Protocol):
    """What an ensemble needs of a host (``sluice.ops.netns.Host`` is one): an address to bind,
    and the argv prefix that runs a program on it."""

    @property
    def ip(self) -> str:
        """The host's address."""
        ...

    @property
    def exec_prefix(self) -> Sequence[str]:
        """The argv prefix that runs a program on the host."""
        ...


@dataclass(frozen=True, slots=True)
class EnsembleMember:
    """One server of an ensemble: its id (``myid``), address, ports, and where it runs.

    Attributes:
        server_id: the ``myid``, 1 to 255, unique in the ensemble.
        host: the address the server binds for clients and peers, and peers connect to.
        client_port: the client port.
        peer_port: the port followers connect to the leader on (``server.N=host:PEER:...``).
        election_port: the leader election port (``server.N=host:...:ELECTION``).
        exec_prefix: an argv prefix the JVM runs under, such as ``ip netns exec <ns>``.
    """

    server_id: int
    host: str
    client_port: int = 2181
    peer_port: int = 2888
    election_port: int = 3888
    exec_prefix: tuple[str, ...] = ()

    @property
    def server_line(self) -> str:
        """The ``zoo.cfg`` value of ``server.<id>``: ``host:peerPort:electionPort``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.peer_port}:{self.election_port}"


#: Modes in which an ensemble member serves requests (``srvr``).
QUORUM_MODES = ("leader", "follower", "observer")


class EnsembleNode(LocalZooKeeper):
    """One member of a :class:`ZooKeeperEnsemble`: a ``QuorumPeerMain`` with ``server.N``
    lines and a ``myid`` file. Files are laid out as :class:`LocalZooKeeper`'s, plus
    ``data/myid``. It serves only while it is part of a quorum."""

    _main_class = QUORUM_MAIN_CLASS
    _serving_modes = QUORUM_MODES

    def __init__(
        self,
        data_dir: Path,
        member: EnsembleMember,
        members: Sequence[EnsembleMember],
        *,
        init_limit_ticks: int = 10,
        sync_limit_ticks: int = 5,
        connect_timeout_ms: int = 1000,
        tick_time_ms: int = 500,
        min_session_timeout_ms: int = 1000,
        max_session_timeout_ms: int = 60000,
        heap_mb: int = 256,
        force_sync: bool = True,
    ) -> None:
        """Describe a member; nothing is written or started until :meth:`start`.

        Args:
            data_dir: the member's directory.
            member: this member.
            members: every member of the ensemble, this one included.
            init_limit_ticks: ticks a follower may take to connect and sync to the leader.
            sync_limit_ticks: ticks a follower may lag or be silent before the leader drops it
                (and before it gives up on the leader).
            connect_timeout_ms: the timeout of a connection to a peer's election port
                (``zookeeper.cnxTimeout``, 5 s by default); peers that do not answer, such as
                partitioned ones, otherwise hold up each election round that long.
            tick_time_ms, min_session_timeout_ms, max_session_timeout_ms, heap_mb, force_sync:
                as for :class:`LocalZooKeeper`.
        """
        if member not in members:
            raise ValueError(f"member {member.server_id} is not in the ensemble's members")
        super().__init__(
            data_dir,
            member.client_port,
            host=member.host,
            tick_time_ms=tick_time_ms,
            min_session_timeout_ms=min_session_timeout_ms,
            max_session_timeout_ms=max_session_timeout_ms,
            heap_mb=heap_mb,
            force_sync=force_sync,
            exec_prefix=member.exec_prefix,
        )
        self.member = member
        self.members = tuple(members)
        self.init_limit_ticks = init_limit_ticks
        self.sync_limit_ticks = sync_limit_ticks
        self.connect_timeout_ms = connect_timeout_ms

    @property
    def server_id(self) -> int:
        """The member's ``myid``."""
        return self.member.server_id

    @property
    def myid_path(self) -> Path:
        """The ``myid`` file, ``data_dir/data/myid``."""
        return self.snapshot_dir / "myid"

    def __repr__(self) -> str:
        """Show the id, address and directory."""
        return f"EnsembleNode({self.server_id}, {self.connect_string}, data_dir={str(self.data_dir)!r})"

    def _write_files(self) -> None:
        super()._write_files()
        self.myid_path.write_text(f"{self.server_id}\n")

    def _config_settings(self) -> dict[str, object]:
        settings = super()._config_settings()
        settings["initLimit"] = self.init_limit_ticks
        settings["syncLimit"] = self.sync_limit_ticks
        # Peer and election ports bind the member's own address, not every address.
        settings["quorumListenOnAllIPs"] = "false"
        # Even a one-member ensemble runs as a quorum (Mode: leader), like the bigger ones.
        settings["standaloneEnabled"] = "false"
        for m in self.members:
            settings[f"server.{m.server_id}"] = m.server_line
        return settings

    def _jvm_options(self) -> list[str]:
        return [
            *super()._jvm_options(),
            f"-Dzookeeper.cnxTimeout={self.connect_timeout_ms}",
            "-Djava.net.preferIPv4Stack=true",
        ]


class ZooKeeperEnsemble:
    """An M-member ZooKeeper ensemble on this machine, each member optionally in its own host.

    Each member binds its own address (``server.N=ip:peerPort:electionPort``), so members in
    network namespaces all use the standard ports. Files live under ``base_dir/zk<N>/``.

    Example, three members in three namespaces::

        hosts = [net.add_host(f"zk{i}") for i in (1, 2, 3)]
        with ZooKeeperEnsemble.on_hosts(tmp_path / "zk", hosts) as zk:
            client = KazooClient(hosts=zk.connect_string)
            ...
            zk.kill(zk.leader())      # kill -9 of the leader
            zk.wait_for_quorum(30)    # the other two elect a new one
    """

    def __init__(
        self,
        base_dir: Path,
        members: Sequence[EnsembleMember],
        *,
        tick_time_ms: int = 500,
        init_limit_ticks: int = 10,
        sync_limit_ticks: int = 5,
        connect_timeout_ms: int = 1000,
        min_session_timeout_ms: int = 1000,
        max_session_timeout_ms: int = 60000,
        heap_mb: int = 256,
        force_sync: bool = True,
    ) -> None:
        """Describe the ensemble; nothing is written or started until :meth:`start`.

        See :class:`EnsembleNode` and :class:`LocalZooKeeper` for the options.

        Raises:
            ValueError: on no members, ids out of 1..255 or repeated, or two members on the same
                address and port.
        """
        if not members:
            raise ValueError("an ensemble needs at least one member")
        ids = [m.server_id for m in members]
        if len(set(ids)) != len(ids) or not all(1 <= i <= 255 for i in ids):
            raise ValueError(f"member ids must be distinct and in 1..255, got {ids}")
        endpoints = [(m.host, p) for m in members for p in (m.client_port, m.peer_port, m.election_port)]
        if len(set(endpoints)) != len(endpoints):
            raise ValueError("two members (or two ports of one member) share an address and port")
        self.base_dir = Path(base_dir).resolve()
        self.members = tuple(sorted(members, key=lambda m: m.server_id))
        self.nodes: dict[int, EnsembleNode] = {
            m.server_id: EnsembleNode(
                self.base_dir / f"zk{m.server_id}",
                m,
                self.members,
                init_limit_ticks=init_limit_ticks,
                sync_limit_ticks=sync_limit_ticks,
                connect_timeout_ms=connect_timeout_ms,
                tick_time_ms=tick_time_ms,
                min_session_timeout_ms=min_session_timeout_ms,
                max_session_timeout_ms=max_session_timeout_ms,
                heap_mb=heap_mb,
                force_sync=force_sync,
            )
            for m in self.members
        }

    @classmethod
    def on_hosts(cls, base_dir: Path, hosts: Sequence[HostLike], **options: Any) -> ZooKeeperEnsemble:
        """Return an ensemble with one member per host (ids 1..M in order, standard ports).

        Args:
            base_dir: the directory for the members' files.
            hosts: where each member runs and binds (``sluice.ops.netns.Host`` objects).
            options: as for the constructor.
        """
        members = [
            EnsembleMember(i, h.ip, exec_prefix=tuple(h.exec_prefix)) for i, h in enumerate(hosts, start=1)
        ]
        return cls(base_dir, members, **options)

    @classmethod
    def local(cls, base_dir: Path, size: int, host: str = "127.0.0.1", **options: Any) -> ZooKeeperEnsemble:
        """Return an ensemble of ``size`` members all on ``host``, on free ports."""
        ports = free_ports(3 * size, host)
        members = [
            EnsembleMember(i + 1, host, ports[3 * i], ports[3 * i + 1], ports[3 * i + 2]) for i in range(size)
        ]
        return cls(base_dir, members, **options)

    # -- addresses and state -------------------------------------------------------------------

    @property
    def connect_string(self) -> str:
        """The client connect string, ``host1:port1,host2:port2,...`` (add a chroot as needed)."""
        return ",".join(node.connect_string for node in self.nodes.values())

    @property
    def quorum(self) -> int:
        """How many members make a majority."""
        return len(self.members) // 2 + 1

    def node(self, server_id: int) -> EnsembleNode:
        """Return the member with ``myid`` ``server_id``.

        Raises:
            KeyError: naming the ids that exist.
        """
        try:
            return self.nodes[server_id]
        except KeyError:
            raise KeyError(f"no member {server_id} in the ensemble; members: {sorted(self.nodes)}") from None

    def modes(self, timeout_s: float = 1.0) -> dict[int, str | None]:
        """Return each member's ``srvr`` mode; None for one that does not serve or answer."""
        return {sid: node.mode(timeout_s) for sid, node in self.nodes.items()}

    def leader(self, timeout_s: float = 1.0) -> int | None:
        """Return the member that says ``Mode: leader``, or None when none or several do.

        Right after a split a deposed leader may still say ``leader`` until ``syncLimit``
        passes; :meth:`wait_for_quorum` with ``among`` asks only one side.
        """
        leaders = [sid for sid, mode in self.modes(timeout_s).items() if mode == "leader"]
        return leaders[0] if len(leaders) == 1 else None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, timeout_s: float = 60) -> None:
        """Launch every member, then wait until each serves and exactly one is the leader.

        Raises:
            ZooKeeperNotInstalledError: when ZooKeeper or Java is missing.
            RuntimeError: when a member fails to start or the ensemble does not serve within
                ``timeout_s`` (the message quotes the member's log; every member is killed).
        """
        deadline = time.monotonic() + timeout_s
        try:
            for node in self.nodes.values():
                node.launch()
            for node in self.nodes.values():
                node.wait_until_serving(max(0.0, deadline - time.monotonic()))
            self.wait_for_quorum(max(0.0, deadline - time.monotonic()))
        except BaseException:
            for node in self.nodes.values():
                node._kill_now()
            raise
        log.info("event=zk_ensemble_started members=%d connect=%s", len(self.nodes), self.connect_string)

    def stop(self, timeout_s: float = 10) -> None:
        """Stop every member (SIGTERM to all at once, then SIGKILL to any left after ``timeout_s``)."""
        for node in self.nodes.values():
            pid = node.pid
            if pid is not None:
                _signal_server(pid, signal.SIGTERM)
        for node in self.nodes.values():
            node.stop(timeout_s)
        log.info("event=zk_ensemble_stopped members=%d", len(self.nodes))

    def kill(self, server_id: int) -> None:
        """Kill member ``server_id`` with SIGKILL (a crash); its data stays for :meth:`restart`."""
        node = self.node(server_id)
        pid = node.pid
        node.kill()
        log.info("event=zk_member_killed id=%d pid=%s", server_id, pid)

    def restart(self, server_id: int, timeout_s: float = 60) -> None:
        """Start member ``server_id`` again with its data and wait until it serves.

        It serves once it has joined a quorum, as a follower (or the leader).

        Raises:
            RuntimeError: when it still runs, or does not serve within ``timeout_s``.
        """
        self.node(server_id).start(timeout_s)
        log.info("event=zk_member_restarted id=%d mode=%s", server_id, self.node(server_id).mode())

    def wait_for_quorum(self, timeout_s: float = 30, among: Sequence[int] | None = None) -> int:
        """Wait until a majority of the ensemble, taken from ``among`` (default all), serves with
        exactly one leader among them; return the leader's id.

        Args:
            timeout_s: how long to wait.
            among: the members to ask, such as the majority side of a split.

        Raises:
            TimeoutError: with the members' modes, when no quorum serves in time.
        """
        asked = list(self.nodes) if among is None else [self.node(sid).server_id for sid in among]
        deadline = time.monotonic() + timeout_s
        modes: dict[int, str | None] = {}
        while True:
            modes = {sid: self.nodes[sid].mode(1.0) for sid in asked}
            serving = [sid for sid, mode in modes.items() if mode in QUORUM_MODES]
            leaders = [sid for sid in serving if modes[sid] == "leader"]
            if len(serving) >= self.quorum and len(leaders) == 1:
                return leaders[0]
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"no ZooKeeper quorum with one leader among members {asked} within {timeout_s:g} s; "
                    f"modes: {modes} (None: not serving); see the logs under {self.base_dir}"
                )
            time.sleep(_POLL_INTERVAL_S * 2)

    def __enter__(self) -> ZooKeeperEnsemble:
        """Start the ensemble."""
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the ensemble."""
        self.stop()

    def __repr__(self) -> str:
        """Show the connect string and the directory."""
        return f"ZooKeeperEnsemble({self.connect_string}, base_dir={str(self.base_dir)!r})"


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
    exc = bind_error(host, port)
    if exc is not None:
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
    main_classes = (os.fsencode(MAIN_CLASS), os.fsencode(QUORUM_MAIN_CLASS))
    if any(main in argv for main in main_classes) and config in argv:
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
