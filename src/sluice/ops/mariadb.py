"""Run a private MariaDB server from Debian's `mariadb-server` package, for tests and drills.

Everything lives under one directory (data/, the socket, server.log, the pid file). The server
writes a row-based binary log (`log_bin`, `binlog_format=ROW`, `binlog_row_image=FULL`), which
is what change capture reads. As root, the server runs as root too (`--user=root`): a server
running as the `mysql` user needs the search bit on every ancestor of its directory, and a
pytest session started meanwhile resets its base directory to 0700, which took the files away
from a server already running. The root account has no password and is reachable on 127.0.0.1
only.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from sluice.ops.ports import free_port


class MariaDBNotInstalledError(RuntimeError):
    pass


def _binary(*names: str) -> str:
    for name in names:
        for d in ("/usr/sbin", "/usr/bin"):
            if Path(d, name).exists():
                return str(Path(d, name))
    raise MariaDBNotInstalledError(
        f"{names[0]} not found: run scripts/bootstrap.sh (it installs Debian's mariadb-server package)"
    )


class LocalMariaDB:
    def __init__(
        self, directory: Path, port: int | None = None, server_id: int = 1, extra_args: tuple[str, ...] = ()
    ) -> None:
        self.directory = directory.resolve()
        self.extra_args = extra_args  # more mariadbd options, e.g. bench/capture.py's --version
        self.port = port or free_port()
        self.server_id = server_id
        self.proc: subprocess.Popen[bytes] | None = None
        self._user = "root" if os.geteuid() == 0 else None

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def socket(self) -> Path:
        """In the directory, unless that path is too long for a Unix socket (107 bytes): then a
        name of its own under the system's temporary directory (the server refuses to start)."""
        path = self.directory / "mysqld.sock"
        if len(str(path)) < 100:
            return path
        name = hashlib.sha1(str(self.directory).encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"sluice-mysqld-{name}.sock"

    @property
    def tmp_dir(self) -> Path:
        return self.directory / "tmp"

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    def connect_args(self, database: str | None = None) -> dict[str, object]:
        args: dict[str, object] = {"host": "127.0.0.1", "port": self.port, "user": "root", "password": ""}
        if database:
            args["database"] = database
        return args

    def start(self, timeout_s: float = 60) -> LocalMariaDB:
        self.directory.mkdir(parents=True, exist_ok=True)
        # A temporary directory of its own: in the shared /tmp a server's temporary-table files
        # are named by its process id, and a server killed -9 leaves its files behind for the
        # next process given that id (process ids wrap at 32768 here). Seen under the test suite:
        # an install failed with "Could not remove temporary table '/tmp/#sql-temptable-3546-1-3'"
        # and "Unknown table 'mysql.tmp_user_sys'".
        self.tmp_dir.mkdir(exist_ok=True)
        if not (self.data_dir / "mysql").exists():
            cmd = [_binary("mariadb-install-db", "mysql_install_db"), f"--datadir={self.data_dir}",
                   "--auth-root-authentication-method=normal", "--skip-test-db",
                   f"--tmpdir={self.tmp_dir}"]  # fmt: skip
            if self._user:
                cmd.append(f"--user={self._user}")
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"mariadb-install-db failed: {done.stderr.strip() or done.stdout.strip()}")
        cmd = [
            _binary("mariadbd", "mysqld"),
            "--no-defaults",
            f"--datadir={self.data_dir}",
            f"--tmpdir={self.tmp_dir}",
            f"--socket={self.socket}",
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            f"--pid-file={self.directory / 'mysqld.pid'}",
            f"--log-error={self.log_path}",
            f"--server-id={self.server_id}",
            "--log-bin=mysql-bin",
            "--binlog-format=ROW",
            "--binlog-row-image=FULL",
            "--binlog-row-metadata=FULL",  # column names in the row events themselves
            "--innodb-buffer-pool-size=128M",
            "--skip-name-resolve",
            *self.extra_args,
        ]
        if self._user:
            cmd.append(f"--user={self._user}")
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        import pymysql

        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
                raise RuntimeError(f"MariaDB exited during start (code {self.proc.returncode}):\n{tail}")
            try:
                pymysql.connect(**self.connect_args(), connect_timeout=2).close()
                return
            except pymysql.err.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def execute(self, *statements: str, database: str | None = None) -> list[tuple[object, ...]]:
        import pymysql

        conn = pymysql.connect(**self.connect_args(database), autocommit=True)
        try:
            rows: list[tuple[object, ...]] = []
            with conn.cursor() as cur:
                for sql in statements:
                    cur.execute(sql)
                    rows = list(cur.fetchall())
            return rows
        finally:
            conn.close()

    def stop(self, timeout_s: float = 30) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> LocalMariaDB:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
