"""Run a Spark standalone cluster (a master and workers) on this machine with pyspark's own launcher.

Tests and drills start one with :class:`StandaloneSpark`; `sluice apply --spark-master URL` and
`sluice worker start --spark-master URL` then run their driver against it. Every daemon is
``<pyspark package>/bin/spark-class`` with the standalone entry points::

    spark-class org.apache.spark.deploy.master.Master --host H --port P --webui-port W \\
        --properties-file DIR/conf/daemon.properties
    spark-class org.apache.spark.deploy.worker.Worker spark://H:P --host H --port P2 \\
        --webui-port W2 --cores 1 --memory 1g --work-dir DIR/worker-N \\
        --properties-file DIR/conf/daemon.properties

each in its own process group (session), so a kill reaches the worker JVM and the executors it
launched together. Everything lives under one directory::

    DIR/
      conf/daemon.properties      the daemons' settings (no REST server, no port fallback)
      conf/spark-defaults.conf    what a driver started with `driver_env()` reads (executor memory)
      master.log, worker-N.log    each daemon's stdout and stderr (Spark logs at INFO there)
      worker-N/                   a worker's work directory: app-ID/EXECUTOR-ID/{stdout,stderr}

Addresses: the daemons bind `host` (default 127.0.0.1) on free ports, and the master's web UI
answers on it too; `state()` reads its ``/json/`` page without any proxy. Nothing is sent to any
other address. `SPARK_LOCAL_IP` is set to `host` in the daemons' environment, which the
executors a worker launches inherit, so they bind it as well. The driver binds 127.0.0.1 by
itself when the master URL's hosts are loopback addresses (`sluice.pipeline.session` sets
``SPARK_LOCAL_IP``; it then advertises itself as ``localhost``). Without that, Spark finds that
the host name resolves to 127.0.0.1, takes the first non-loopback interface's address instead
and tells the executors to connect to the driver there. On several hosts the driver needs an
address the workers can reach: set ``SPARK_LOCAL_IP`` (or ``spark.driver.host``) on its host.

What executors need to run Sluice's Python code (the `sluice` data source's readers are
pickled by reference to `sluice.pipeline.source`, so they import the package):

* The Python interpreter executors run is the driver's: PySpark sends the driver process's
  ``PYSPARK_PYTHON`` with every Python function (data source readers, UDFs, RDD functions), and
  the executor starts that path. `sluice.pipeline.session.spark_session` sets it to the
  ``sluice-spark-python`` installed beside the driver's own interpreter (e.g.
  ``/opt/sluice/.venv/bin/sluice-spark-python``, which runs that interpreter:
  `sluice.pipeline.spark_python`), or to the interpreter itself where there is none, unless
  it is set already. Neither the worker's environment nor ``spark.executorEnv`` is needed for
  it: the daemons here run with every ``PYSPARK_*`` variable removed from their environment,
  and executors still run the driver's interpreter (the integration test checks it).
* That path must exist on every worker host, with the same `sluice` and `pyspark` versions
  installed in it as on the driver (`pip install sluice` into a virtualenv at the same path on
  every host, or point ``PYSPARK_PYTHON`` at a path that exists on all of them). In this
  repository the venv holds `sluice` as an editable install (a ``.pth`` file naming
  ``src/``), so executors import the working tree. Executors put pyspark's own
  ``python/lib/pyspark.zip`` from the worker's Spark home first on ``PYTHONPATH``; the rest
  comes from the interpreter's site-packages.
* Spark's jars come from the worker's Spark home, here the pyspark package directory
  (``SPARK_HOME`` is set to it for the daemons, so ``find-spark-home`` never has to run a
  ``python3`` that may lack pyspark). Driver and workers must run the same Spark version.

Memory: a 2-core machine runs other things too, so the daemons' heaps are small
(``SPARK_DAEMON_MEMORY``, default 256m), a worker offers 1 core and 1g, and a driver started
with `driver_env()` asks for 512m executors (``SPARK_CONF_DIR`` with a spark-defaults.conf; the
driver's own heap is set by `spark_session`).

Failure model: `kill_worker` sends SIGKILL to a worker's process group, i.e. the worker JVM and
its executor JVMs, as a lost host would; their Python workers (which put themselves in a
process group of their own) exit when their executor's pipe closes, and `stop` ends any left
in the cluster's directory. The master notices the closed connection at once, tells the driver
its executors are lost, and gives the application an executor on the next worker that
registers; until one does, the application's tasks wait.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson

from sluice.ops.ports import free_ports

__all__ = [
    "MASTER_CLASS",
    "WORKER_CLASS",
    "SparkDaemon",
    "SparkNotInstalledError",
    "SparkStartError",
    "StandaloneSpark",
    "pids_in",
    "spark_home",
]

log = logging.getLogger("sluice.spark_standalone")

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"

#: Settings every daemon reads (`--properties-file`). The REST submission server would take
#: the fixed port 6066; a port taken between `free_ports` and the bind fails the start (and is
#: retried on new ports) instead of Spark quietly moving to the next port up.
DAEMON_PROPERTIES = {
    "spark.master.rest.enabled": "false",
    "spark.port.maxRetries": "0",
}

_START_ATTEMPTS = 3
_POLL_S = 0.25
_STOP_WAIT_S = 10.0
_BIND_ERRORS = ("Address already in use", "BindException", "Failed to bind")


class SparkNotInstalledError(RuntimeError):
    """pyspark (with its jars and bin/spark-class) or a Java runtime is missing."""


class SparkStartError(RuntimeError):
    """A daemon exited during start-up, or did not come up in time."""


def spark_home() -> Path:
    """The pyspark package directory, which holds `bin/spark-class` and `jars/`.

    Raises:
        SparkNotInstalledError: when pyspark is not importable or lacks its launcher.
    """
    try:
        import pyspark
    except ImportError:
        raise SparkNotInstalledError(
            "pyspark is not installed in this interpreter: run scripts/bootstrap.sh"
        ) from None
    home = Path(pyspark.__file__).resolve().parent
    if not os.access(home / "bin" / "spark-class", os.X_OK) or not (home / "jars").is_dir():
        raise SparkNotInstalledError(f"{home} has no bin/spark-class or jars/: reinstall pyspark")
    return home


@dataclass
class SparkDaemon:
    """One master or worker process (the leader of its own process group)."""

    name: str  # "master", "worker-1", ...
    host: str
    port: int  # RPC port
    webui_port: int
    log_path: Path
    process: subprocess.Popen[bytes]
    work_dir: Path | None = None  # workers only

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class StandaloneSpark:
    """A Spark standalone master and its workers on `host`, with their files under `directory`.

    Example::

        with StandaloneSpark(tmp_path / "spark") as spark:
            url = spark.start_master()          # spark://127.0.0.1:PORT
            worker = spark.start_worker()
            subprocess.run([... "sluice", "apply", "--spark-master", url, ...],
                           env={**os.environ, **spark.driver_env()})
            spark.kill_worker(worker)           # kill -9 of its process group
            spark.start_worker()

    `stop()` (and leaving the `with`) ends every daemon, executor and Python worker it started.
    A driver must ask for executors that fit a worker (`executor_memory` <= `worker_memory`,
    as `driver_env()` does): otherwise the master never places one and its jobs wait.
    """

    directory: Path
    host: str = "127.0.0.1"
    worker_cores: int = 1
    worker_memory: str = "1g"
    daemon_memory: str = "256m"
    executor_memory: str = "512m"
    master: SparkDaemon | None = None
    workers: list[SparkDaemon] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.directory = self.directory.resolve()
        self.home = spark_home()
        self.conf_dir = self.directory / "conf"
        java_home = os.environ.get("JAVA_HOME")
        if not (java_home and os.access(Path(java_home) / "bin" / "java", os.X_OK)) and not shutil.which(
            "java"
        ):
            raise SparkNotInstalledError(
                "no Java runtime (JAVA_HOME or java on PATH): run scripts/bootstrap.sh, which installs one"
            )

    # --- files and environment -------------------------------------------------------------------

    def _write_conf(self) -> None:
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        daemon = "".join(f"{k} {v}\n" for k, v in DAEMON_PROPERTIES.items())
        (self.conf_dir / "daemon.properties").write_text(daemon)
        (self.conf_dir / "spark-defaults.conf").write_text(f"spark.executor.memory {self.executor_memory}\n")

    def _daemon_env(self) -> dict[str, str]:
        """This process's environment without any Spark or PySpark setting, then ours."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        env.update(
            SPARK_HOME=str(self.home),
            SPARK_CONF_DIR=str(self.conf_dir),
            SPARK_LOCAL_IP=self.host,
            SPARK_DAEMON_MEMORY=self.daemon_memory,
        )
        return env

    def driver_env(self) -> dict[str, str]:
        """Environment variables for a driver process (`sluice apply`, `sluice worker start`)
        to run against this cluster with small executors: its spark-defaults.conf."""
        return {"SPARK_CONF_DIR": str(self.conf_dir)}

    @property
    def master_url(self) -> str:
        if self.master is None:
            raise RuntimeError("the master is not started: call start_master() first")
        return f"spark://{self.host}:{self.master.port}"

    # --- the master's view -----------------------------------------------------------------------

    def state(self, timeout_s: float = 3.0) -> dict[str, Any]:
        """The master's web UI JSON (`/json/`): status, workers, active and completed apps."""
        if self.master is None:
            raise RuntimeError("the master is not started: call start_master() first")
        url = f"http://{self.host}:{self.master.webui_port}/json/"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy
        with opener.open(url, timeout=timeout_s) as response:
            doc: dict[str, Any] = orjson.loads(response.read())
        return doc

    def alive_workers(self) -> list[dict[str, Any]]:
        """The workers the master lists as ALIVE (each with host, port, cores, memory, ...)."""
        return [w for w in self.state().get("workers", []) if w.get("state") == "ALIVE"]

    def registered(self, worker: SparkDaemon) -> bool:
        """Whether the master lists `worker` (by its host and RPC port) as ALIVE."""
        return any(
            w.get("host") == worker.host and w.get("port") == worker.port for w in self.alive_workers()
        )

    # --- starting ----------------------------------------------------------------------------------

    def _launch(self, name: str, args: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
        log_path = self.directory / f"{name}.log"
        with log_path.open("ab") as out:
            out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting {' '.join(args)}\n".encode())
            out.flush()
            proc = subprocess.Popen(
                [str(self.home / "bin" / "spark-class"), *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self._daemon_env(),
                cwd=self.directory,
                start_new_session=True,
            )
        return proc, log_path

    def _wait_up(
        self, daemon: SparkDaemon, ready: Callable[[], bool], deadline: float, timeout_s: float, what: str
    ) -> bool:
        """Poll `ready()` until it is true (True), the daemon exits (False), or the deadline
        (SparkStartError, with the daemon killed)."""
        while time.monotonic() < deadline:
            if not daemon.alive():
                return False
            try:
                if ready():
                    return True
            except (OSError, urllib.error.URLError, ValueError):
                pass  # the web UI is not up yet
            time.sleep(_POLL_S)
        self._kill_group(daemon)
        raise SparkStartError(
            f"{what} was not up within {timeout_s:.0f} s; see {daemon.log_path} (on a loaded "
            f"machine, pass a longer timeout_s; check that java runs):\n{daemon.log_tail()}"
        )

    def start_master(self, timeout_s: float = 90.0) -> str:
        """Start the master and wait until its web UI says ALIVE. Returns its spark:// URL.

        Raises:
            SparkStartError: when it exits during start-up (after retrying on new ports if a port
                was taken) or is not ALIVE within `timeout_s`; the message holds its log's tail.
        """
        if self.master is not None and self.master.alive():
            return self.master_url
        self.directory.mkdir(parents=True, exist_ok=True)
        self._write_conf()
        deadline = time.monotonic() + timeout_s
        for _ in range(_START_ATTEMPTS):
            port, webui = free_ports(2, self.host)
            args = [
                MASTER_CLASS, "--host", self.host, "--port", str(port), "--webui-port", str(webui),
                "--properties-file", str(self.conf_dir / "daemon.properties"),
            ]  # fmt: skip
            proc, log_path = self._launch("master", args)
            self.master = SparkDaemon("master", self.host, port, webui, log_path, proc)
            t0 = time.monotonic()
            if self._wait_up(
                self.master, lambda: self.state().get("status") == "ALIVE", deadline, timeout_s, "the master"
            ):
                log.info(
                    "event=spark_master_started url=%s webui=http://%s:%d pid=%d took_s=%.1f log=%s",
                    self.master_url, self.host, webui, proc.pid, time.monotonic() - t0, log_path,
                )  # fmt: skip
                return self.master_url
            self._after_failed_start(self.master)
        raise SparkStartError(self._gave_up("the master", self.master))

    def start_worker(self, timeout_s: float = 90.0) -> SparkDaemon:
        """Start a worker (`worker_cores`, `worker_memory`) and wait until the master lists it
        ALIVE. Its work directory is new (`worker-N/`), as on a replacement host.

        Raises:
            SparkStartError: as for `start_master`.
        """
        master_url = self.master_url
        n = len(self.workers) + 1
        name = f"worker-{n}"
        work_dir = self.directory / name
        work_dir.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout_s
        worker: SparkDaemon | None = None
        for _ in range(_START_ATTEMPTS):
            port, webui = free_ports(2, self.host)
            args = [
                WORKER_CLASS, master_url, "--host", self.host, "--port", str(port),
                "--webui-port", str(webui), "--cores", str(self.worker_cores),
                "--memory", self.worker_memory, "--work-dir", str(work_dir),
                "--properties-file", str(self.conf_dir / "daemon.properties"),
            ]  # fmt: skip
            proc, log_path = self._launch(name, args)
            worker = SparkDaemon(name, self.host, port, webui, log_path, proc, work_dir)
            self.workers.append(worker)
            t0 = time.monotonic()
            if self._wait_up(
                worker, partial(self.registered, worker), deadline, timeout_s, f"{name} registering"
            ):
                log.info(
                    "event=spark_worker_started name=%s master=%s port=%d pid=%d cores=%d memory=%s "
                    "took_s=%.1f log=%s",
                    name, master_url, port, proc.pid, self.worker_cores, self.worker_memory,
                    time.monotonic() - t0, log_path,
                )  # fmt: skip
                return worker
            self.workers.remove(worker)
            self._after_failed_start(worker)
        raise SparkStartError(self._gave_up(name, worker))

    def _after_failed_start(self, daemon: SparkDaemon) -> None:
        """A daemon exited during start-up: retry (on new ports) only if a port was taken."""
        self._kill_group(daemon)
        tail = daemon.log_tail(60)
        if not any(marker in tail for marker in _BIND_ERRORS):
            raise SparkStartError(
                f"{daemon.name} exited during start-up with code {daemon.process.returncode}; "
                f"see {daemon.log_path}:\n{daemon.log_tail()}"
            )
        log.warning("event=spark_port_taken name=%s port=%d: retrying on new ports", daemon.name, daemon.port)

    @staticmethod
    def _gave_up(what: str, daemon: SparkDaemon | None) -> str:
        where = f"; see {daemon.log_path}:\n{daemon.log_tail()}" if daemon else ""
        return f"{what} could not bind a free port in {_START_ATTEMPTS} attempts{where}"

    # --- faults and stopping -----------------------------------------------------------------------

    def kill_worker(self, worker: SparkDaemon, sig: int = signal.SIGKILL, timeout_s: float = 30.0) -> None:
        """Send `sig` (default SIGKILL) to the worker's process group: the worker JVM and the
        executor JVMs it launched, as a lost host would. With SIGKILL, waits until the group is
        gone and the master no longer lists the worker as ALIVE.

        Raises:
            TimeoutError: when either takes longer than `timeout_s`.
        """
        log.info(
            "event=spark_worker_kill name=%s pid=%d signal=%s",
            worker.name,
            worker.pid,
            signal.Signals(sig).name,
        )
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, sig)
        if sig != signal.SIGKILL:
            return
        deadline = time.monotonic() + timeout_s
        while worker.alive() or _group_alive(worker.pid):  # alive() reaps it: a zombie counts
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{worker.name}'s process group {worker.pid} still runs {timeout_s} s after SIGKILL"
                )
            time.sleep(_POLL_S)
        while self.master is not None and self.master.alive() and self.registered(worker):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the master still lists {worker.name} as ALIVE {timeout_s} s after it was killed; "
                    f"see {self.master.log_path}"
                )
            time.sleep(_POLL_S)

    def stop(self) -> None:
        """Stop the workers, then the master (SIGTERM to each process group, SIGKILL after
        10 s), then end any process still running in the cluster's directory (an executor's
        Python workers). Safe to call more than once."""
        daemons = [*self.workers, *([self.master] if self.master else [])]
        for d in daemons:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(d.pid, signal.SIGTERM)
        deadline = time.monotonic() + _STOP_WAIT_S
        while any(_group_alive(d.pid) for d in daemons) and time.monotonic() < deadline:
            for d in daemons:
                d.process.poll()  # reap
            time.sleep(_POLL_S)
        for d in daemons:
            self._kill_group(d)
        strays = pids_in(self.directory)
        for pid in strays:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if daemons:
            log.info("event=spark_standalone_stopped daemons=%d strays=%d", len(daemons), len(strays))

    @staticmethod
    def _kill_group(daemon: SparkDaemon) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(daemon.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            daemon.process.wait(timeout=_STOP_WAIT_S)

    def __enter__(self) -> StandaloneSpark:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pids_in(directory: Path) -> list[int]:
    """Processes whose working directory is `directory` or below it (Linux /proc)."""
    found = []
    prefix = str(directory)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if cwd == prefix or cwd.startswith(prefix + "/"):
            found.append(int(entry.name))
    return found
