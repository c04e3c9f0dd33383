"""Run a private PostgreSQL server from Debian's `postgresql` package, for tests, benchmarks and
the demo's `--target postgresql` option.

Everything lives under one directory (data/, the socket, server.log). PostgreSQL refuses to run
as root, so when we are root the server binaries run as the `postgres` system user, and the
server's files live in a directory of its own under the system's temporary directory (named
after the requested one, so a restart finds its data; `DIR/server` links to it): a directory
that user can reach whatever the requested directory's ancestors allow (a pytest session resets
its base directory to 0700, which would take the files away from a running server).
Authentication is `trust` on 127.0.0.1 only.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from sluice.ops.ports import free_port


class PostgresNotInstalledError(RuntimeError):
    pass


def find_bin_dir() -> Path:
    """The newest /usr/lib/postgresql/<version>/bin that has initdb."""
    root = Path("/usr/lib/postgresql")
    found = sorted(
        (p for p in root.glob("*/bin") if (p / "initdb").exists()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    if not found:
        raise PostgresNotInstalledError(
            "PostgreSQL server binaries not found under /usr/lib/postgresql: run scripts/bootstrap.sh "
            "(it installs Debian's postgresql package)"
        )
    return found[-1]


class LocalPostgres:
    def __init__(self, directory: Path, port: int | None = None, *, logical: bool = False) -> None:
        self.directory = directory.resolve()
        # wal_level=logical and room for replication slots: a server a PostgreSQL source reads
        self.logical = logical
        self.port = port or free_port()
        self.bin = find_bin_dir()
        self._as_user: list[str] = []
        self.server_dir = self.directory
        if os.geteuid() == 0:
            self._as_user = ["runuser", "-u", "postgres", "--"]
            name = hashlib.sha1(str(self.directory).encode()).hexdigest()[:16]
            self.server_dir = Path(tempfile.gettempdir()) / f"sluice-postgres-{name}"

    @property
    def data_dir(self) -> Path:
        return self.server_dir / "data"

    @property
    def log_path(self) -> Path:
        return self.server_dir / "server.log"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self._as_user, *args], check=check, capture_output=True, text=True, cwd="/")

    def start(self, timeout_s: float = 60) -> LocalPostgres:
        self.directory.mkdir(parents=True, exist_ok=True)
        if self._as_user:
            pw = pwd.getpwnam("postgres")
            self.server_dir.mkdir(mode=0o700, exist_ok=True)
            os.chown(self.server_dir, pw.pw_uid, pw.pw_gid)
            link = self.directory / "server"
            if not link.is_symlink():
                link.symlink_to(self.server_dir)
        if not (self.data_dir / "PG_VERSION").exists():
            result = self._run(
                str(self.bin / "initdb"), "-D", str(self.data_dir), "-U", "postgres",
                "--auth=trust", "--encoding=UTF8", "--locale=C", check=False,
            )  # fmt: skip
            if result.returncode != 0:
                raise RuntimeError(f"initdb failed: {result.stderr.strip() or result.stdout.strip()}")
        options = (
            f"-p {self.port} -k {self.server_dir} -c listen_addresses=127.0.0.1 "
            "-c shared_buffers=256MB -c max_wal_size=2GB -c checkpoint_timeout=15min"
        )
        if self.logical:
            options += " -c wal_level=logical -c max_replication_slots=20 -c max_wal_senders=20"

        result = self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_path), "-o", options,
            "-w", "-t", str(int(timeout_s)), "start", check=False,
        )  # fmt: skip
        if result.returncode != 0:
            tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
            raise RuntimeError(f"PostgreSQL did not start: {result.stderr.strip()}\n{tail}")
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with psycopg.connect(self.url(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def start_standby_of(self, primary: LocalPostgres, timeout_s: float = 120) -> LocalPostgres:
        """This server as a streaming standby of `primary` (a base backup of it, with
        standby.signal and the connection to it: `pg_basebackup -R`), started."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if self._as_user:
            pw = pwd.getpwnam("postgres")
            self.server_dir.mkdir(mode=0o700, exist_ok=True)
            os.chown(self.server_dir, pw.pw_uid, pw.pw_gid)
        result = self._run(
            str(self.bin / "pg_basebackup"), "-D", str(self.data_dir), "-h", "127.0.0.1", "-p",
            str(primary.port), "-U", "postgres", "-R", "-X", "stream", "-c", "fast", check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"pg_basebackup failed: {result.stderr.strip() or result.stdout.strip()}")
        return self.start(timeout_s)

    def promote(self, timeout_s: float = 60) -> None:
        """A standby made a primary (`pg_ctl promote`, waiting until it accepts writes)."""
        result = self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data_dir), "-w", "-t", str(int(timeout_s)), "promote",
            check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"pg_ctl promote failed: {result.stderr.strip() or result.stdout.strip()}")

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if (self.data_dir / "postmaster.pid").exists():
            self._run(
                str(self.bin / "pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "stop", check=False
            )

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.server_dir, ignore_errors=True)
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
