"""The Spark session Sluice's jobs run in: `local[*]` by default, or a cluster master URL.

With ``kafka_connector=True`` the session also has Spark's own Kafka source and sink
(``format("kafka")``, spark-sql-kafka-0-10), loaded from the jars ``scripts/peers.sh``
copied into ``.peers/spark-kafka-<pyspark version>/jars``: nothing is fetched at run time. When
``scripts/peers.sh`` has fetched Delta Lake's jars (``.peers/delta-<version>/jars``), every
session has Delta's SQL extension and catalog, for the Delta target."""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

from sluice.bounded import run_within

log = logging.getLogger("sluice.spark")

DEFAULT_MASTER = "local[*]"
#: Spark's Kafka source and sink, for pyspark's Scala version
KAFKA_CONNECTOR = "spark-sql-kafka-0-10_2.13"


class ConnectorMissingError(RuntimeError):
    """Spark's Kafka connector for the running pyspark is not in the set-up's cache."""


def kafka_connector_jars() -> list[Path]:
    """The jars Spark's Kafka source needs beyond pyspark's own, for the running pyspark.

    ``SLUICE_PEERS_DIR`` overrides where they are kept (default ``.peers`` in the project, where
    ``scripts/peers.sh`` puts them). A jar whose artifact pyspark already ships (Scala,
    Hadoop's client, lz4, ...) is left out: two versions of a class on the classpath would make
    which one loads a matter of order. Raises ConnectorMissingError naming the set-up step."""
    import pyspark

    version = pyspark.__version__
    base = Path(os.environ.get("SLUICE_PEERS_DIR") or Path(__file__).resolve().parents[3] / ".peers")
    jars = base / f"spark-kafka-{version}" / "jars"
    if not (jars.parent / ".complete").is_file():
        raise ConnectorMissingError(
            f"Spark's Kafka connector ({KAFKA_CONNECTOR} {version}, for pyspark {version}) is not "
            f"fetched (no {jars}): run scripts/peers.sh (needs Maven and Maven Central; "
            "bench/peers/spark-kafka/pom.xml's spark.version must equal the pyspark pin)"
        )
    shipped = {_artifact(j.name) for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    chosen = sorted(j for j in jars.glob("*.jar") if _artifact(j.name) not in shipped)
    assert any(j.name.startswith(KAFKA_CONNECTOR) for j in chosen), f"{jars} lacks {KAFKA_CONNECTOR}"
    return chosen


#: Delta Lake for pyspark 4.2 (bench/peers/delta/pom.xml; the Delta target, sync/targets/delta.py)
DELTA_VERSION = "4.4.0"
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"


def delta_jars() -> list[Path]:
    """Delta Lake's jars (`scripts/peers.sh` puts them in ``.peers/delta-<version>/jars``), or
    none when they are not fetched: then a session has no Delta, and a Delta target says so."""
    base = Path(os.environ.get("SLUICE_PEERS_DIR") or Path(__file__).resolve().parents[3] / ".peers")
    jars = base / f"delta-{DELTA_VERSION}" / "jars"
    if not (jars.parent / ".complete").is_file():
        return []
    return sorted(jars.glob("*.jar"))


_JAR_NAME = re.compile(r"^(.+?)-(\d+(?:\.\d+)+.*)\.jar$")


def _artifact(jar_name: str) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients``, ``spark-sql-kafka-0-10_2.13-4.2.0.jar``
    -> ``spark-sql-kafka-0-10_2.13``: the name before the first dotted version."""
    match = _JAR_NAME.match(jar_name)
    return match.group(1) if match else jar_name.removesuffix(".jar")


def spark_session(
    master: str | None = None,
    app: str = "sluice",
    conf: dict[str, str] | None = None,
    *,
    kafka_connector: bool = False,
) -> Any:
    """A SparkSession with the `sluice` data source registered, and with Spark's own Kafka
    source and sink (`format("kafka")`) when ``kafka_connector`` is set.

    Executors run this interpreter (the venv's), so they import the same Sluice; Spark starts it
    through `sluice-spark-python` (pipeline.spark_python: a query's source runner connects back
    before its imports, within Spark's fixed 10 s on a starved machine) unless PYSPARK_PYTHON
    names another. The jars of a
    session are fixed when its driver starts: a process that already has a session without the
    connector gets it back without one (``getOrCreate``), so ask for it on the first session."""
    from pyspark.sql import SparkSession

    from sluice.pipeline.source import SluiceDataSource

    os.environ.setdefault("PYSPARK_PYTHON", spark_python())
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    master = master or DEFAULT_MASTER
    if master.startswith("local") or loopback_master(master):
        # A master on a loopback address has its workers on this machine: the driver binds and
        # advertises 127.0.0.1 too. Otherwise Spark, finding that the host name resolves to
        # 127.0.0.1, advertises the first non-loopback interface's address to the executors.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    log4j = Path(__file__).with_name("log4j2.properties")
    java_opts = f"-Dlog4j2.configurationFile=file:{log4j}"
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.streaming.metricsEnabled", "true")
        .config("spark.driver.memory", "1g")
        # Local files (a query's checkpoint on a local path) without Hadoop's .crc side files:
        # each offset and commit log entry is one file written and renamed instead of two. At
        # 5,000 changes/s that took Spark's two log writes per micro-batch from about 50 ms each
        # to about 30. The checkpoint is a cache of the target's offsets: one whose newest entry
        # cannot be read is removed and the query resumes from the target's offsets
        # (pipeline/apply.py `reconcile_checkpoint`), so it needs no checksum of its own.
        .config("spark.hadoop.fs.file.impl", "org.apache.hadoop.fs.RawLocalFileSystem")
        .config("spark.hadoop.fs.AbstractFileSystem.file.impl", "org.apache.hadoop.fs.local.RawLocalFs")
        # A starved machine (load 9-18 on two cores) makes every Python process Spark talks to
        # slow to answer. The Python side's connect and handshake with a JVM socket, and the
        # JVM's wait for the driver's Python to fetch a result (foreachBatch's toArrow), give up
        # after this; at Spark's default of 15 s a starved driver's result socket timed out and
        # failed the batch. A dead peer is still seen at once (its socket closes); this only
        # waits longer for a slow one. Spark's other waits are left as they are: a Python
        # worker's connect-back is a fixed 10 s (no setting; a query that meets it is started
        # again, pipeline/restarting.py and pipeline/worker.py), and an executor is declared lost
        # only after spark.network.timeout (120 s) without a heartbeat, far beyond what load
        # delays a 10 s heartbeat by, while a shorter wait for a dead executor matters on a
        # cluster.
        .config("spark.python.authenticate.socketTimeout", "120s")
        .config("spark.log.level", "ERROR")
        # A streaming query's foreachBatch runs the target's statements on the query's own
        # thread (py4j calls back on the calling thread), under the streaming and callback
        # frames; a Delta MERGE there overflowed the JVM's default 1 MB thread stack (a
        # StackOverflowError in java.util.regex, the query's thread dead) in a chaos run.
        .config("spark.driver.extraJavaOptions", f"{java_opts} -Xss8m")
        .config("spark.executor.extraJavaOptions", java_opts)
    )
    jars = kafka_connector_jars() if kafka_connector else []
    delta = delta_jars()
    if delta:  # every session can write Delta tables when Delta's jars are fetched
        jars += delta
        builder = builder.config("spark.sql.extensions", DELTA_EXTENSION).config(
            "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        )
    if jars:
        builder = builder.config("spark.jars", ",".join(str(j) for j in jars))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(SluiceDataSource)
    return spark


def spark_python() -> str:
    """The interpreter for Spark's Python processes: this one's `sluice-spark-python` (installed
    beside it with Sluice), or this interpreter where there is none (Sluice run from a source
    tree that was not installed)."""
    launcher = Path(sys.executable).with_name("sluice-spark-python")
    return str(launcher) if os.access(launcher, os.X_OK) else sys.executable


def loopback_master(master: str) -> bool:
    """Whether `master` is a standalone master URL (`spark://host:port`, or several for standby
    masters: `spark://h1:p1,h2:p2`) whose hosts are all loopback addresses or `localhost`."""
    if not master.startswith("spark://"):
        return False
    for host_port in master[len("spark://") :].split(","):
        host = host_port.rpartition(":")[0].strip("[]")
        try:
            if not ipaddress.ip_address(host).is_loopback:
                return False
        except ValueError:
            if host != "localhost":
                return False
    return True


def driver_pid(spark: Any) -> int | None:
    """The process id of the session's driver JVM (PySpark starts it as a child process)."""
    proc = getattr(spark.sparkContext._gateway, "proc", None)
    return None if proc is None else int(proc.pid)


def driver_alive(spark: Any) -> bool:
    proc = getattr(spark.sparkContext._gateway, "proc", None)
    return proc is None or proc.poll() is None


class SparkMasterConflictError(RuntimeError):
    """A task asks for a Spark master other than the one this process's driver runs on."""


class DriverSession:
    """A long-lived process's Spark session (a worker's), started again when its driver JVM died.

    A process has one Spark driver, so one master: the worker's own (``--spark-master``), or,
    for a worker started without one, the first task's ``spark_master`` option. A task asking
    for another master is refused with :class:`SparkMasterConflictError`, naming both.

    PySpark keeps one gateway to one JVM per Python process and never starts a second: after the
    JVM was killed (kill -9, out of memory), every call on the old session fails, and so would a
    new `getOrCreate`. `get()` notices the dead JVM, drops PySpark's handles to it and starts a new
    one, so a worker whose driver died runs its tasks again on their next retry."""

    def __init__(
        self,
        master: str | None = None,
        app: str = "sluice",
        conf: dict[str, str] | None = None,
        *,
        kafka_connector: bool = False,
    ):
        import threading

        self.master, self.app, self.conf = master, app, conf
        self.kafka_connector = kafka_connector
        self._lock = threading.Lock()
        self._spark: Any = None
        #: the master the running driver was started with (None: local[*])
        self._running_master: str | None = None
        #: whether a task was handed the running driver (a warmed driver can still change master)
        self._handed_out = False
        self.restarts = 0

    def warm(self) -> None:
        """Start the driver now (it takes seconds), on the worker's master; a worker without one
        may still move it to its first task's master."""
        with self._lock:
            if self._spark is None:
                self._spark = spark_session(
                    self.master, self.app, self.conf, kafka_connector=self.kafka_connector
                )
                self._running_master = self.master

    def get(self, master: str | None = None) -> Any:
        """The session, on ``master`` if given (a task's option), else on the worker's own."""
        with self._lock:
            if self._spark is not None and not driver_alive(self._spark):
                log.warning(
                    "event=spark_driver_lost pid=%s exit=%s: starting a new one",
                    driver_pid(self._spark), self._spark.sparkContext._gateway.proc.poll(),
                )  # fmt: skip
                _forget_driver(self._spark)
                self._spark = None
                self.restarts += 1
            if self._spark is None:
                chosen = self.master or (self._running_master if self._handed_out else None) or master
            elif self.master is None and not self._handed_out and master not in (None, self._running_master):
                # only warmed, used by no task yet: move it to the first task's master
                self._spark.stop()
                self._spark = None
                chosen = master
            else:
                chosen = self._running_master
            if master is not None and master != chosen:
                raise SparkMasterConflictError(
                    f"the task asks for Spark master {master}, but this worker's Spark driver runs on "
                    f"{chosen or 'local[*]'} (one driver per process): start workers with "
                    f"--spark-master {master} (spark.master in worker.properties) for such tasks, or "
                    "remove the task's spark_master option"
                )
            if self._spark is None:
                self._spark = spark_session(chosen, self.app, self.conf, kafka_connector=self.kafka_connector)
                self._running_master = chosen
            self._handed_out = True
            return self._spark

    def pid(self) -> int | None:
        with self._lock:
            return None if self._spark is None else driver_pid(self._spark)

    def stop(self, timeout_s: float | None = None) -> bool:
        """Stop the driver; with ``timeout_s``, wait that long at most (a driver busy with a query
        that does not end, or a JVM that does not answer) and return whether it stopped. A stop
        left running ends with this process: PySpark's gateway JVM exits when its stdin, a pipe
        from this process, closes."""

        def stop() -> None:
            with self._lock:
                if self._spark is None:
                    return
                try:
                    if driver_alive(self._spark):
                        self._spark.stop()
                    else:
                        _forget_driver(self._spark)
                except Exception as exc:  # a driver that fails to stop is left to exit with us
                    log.warning("event=spark_stop_failed error=%r", exc)
                self._spark = None

        if timeout_s is None:
            stop()
            return True
        if run_within(stop, timeout_s, name="spark-stop"):
            return True
        log.warning(
            "event=spark_stop_timed_out waited_s=%.0f action=%r", timeout_s,
            "exiting; the driver JVM exits with this process",
        )  # fmt: skip
        return False


def _forget_driver(spark: Any) -> None:
    """Drop PySpark's process-wide handles to a dead JVM, so that the next session starts one."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    gateway = spark.sparkContext._gateway
    try:
        gateway.shutdown()  # closes its sockets and the callback server foreachBatch used
    except Exception:
        pass
    SparkContext._gateway = None
    SparkContext._jvm = None
    SparkContext._active_spark_context = None
    SparkSession._instantiatedSession = None
    SparkSession._activeSession = None
