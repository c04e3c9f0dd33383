from __future__ import annotations

import faulthandler
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice.ops.mariadb import LocalMariaDB
from sluice.ops.ports import free_port
from sluice.ops.postgres import LocalPostgres
from sluice.ops.zookeeper import LocalZooKeeper
from tests.support.cluster import TestCluster

#: The longest tests, which start Spark worker processes or ZooKeeper ensembles (and brokers,
#: MariaDB, a target), in three chains. Under pytest-xdist (scripts/test.sh) each chain runs on
#: one worker, one test after another, and the chains are handed out first: a chain started
#: last would keep the suite waiting at its end. The other tests are handed out one by one
#: around them.
CHAINS = {
    # The heaviest tests, each starting several JVMs (Spark drivers and workers, ZooKeeper
    # ensembles), one after another on one worker: run side by side on two cores they starved the
    # short sync chaos run's Spark drivers (a PySpark local socket timed out after 15 s and the
    # run took 542 s instead of 180).
    "test_short_chaos_sync_run_targets_equal_the_source": "chain-1",
    "test_short_netns_chaos_run_loses_and_duplicates_nothing": "chain-1",
    "test_incident_a_with_a_real_network_cut": "chain-1",
    "test_incident_b_with_a_real_network_blip": "chain-1",
    "test_apply_on_a_standalone_cluster_survives_kill_9_of_its_worker": "chain-1",
    "test_a_tasks_spark_master_option_runs_it_on_the_standalone_cluster": "chain-1",
    "test_driver_killed_around_commits_and_a_broker_killed": "chain-2",
    "test_two_workers_share_a_task_through_kills_and_a_pause": "chain-2",
    "test_a_failing_task_leaves_the_worker_running_and_a_task_created_again_commits": "chain-2",
    "test_demo_ends_with_the_target_equal_to_the_source": "chain-2",
    "test_demo_with_a_mariadb_source_ends_verified_with_the_refused_row_dead_lettered": "chain-3",
    "test_zombie_task_passes_from_the_cli": "chain-2",
    "test_task_status_reports_the_lag_the_test_measures": "chain-3",
    "test_a_worker_whose_spark_driver_was_killed_runs_its_task_on_a_new_one": "chain-2",
    "test_a_sync_worker_in_its_own_namespace_runs_a_task": "chain-3",
    "test_brokers_from_config_files_serve_root_namespace_clients_at_their_namespace_addresses": "chain-3",
    # a sync worker (a Spark driver) under a headless Chromium and a PostgreSQL lock
    "test_a_tasks_lag_rises_while_its_target_is_locked_and_its_alarm_is_raised_then_resolved": "chain-3",
    # Spark's own Kafka source on Sluice: its reads and sink (~30 s), and, in the slow suite, the
    # apply query on it through kill -9 (four driver starts, ~75 s)
    "test_spark_kafka_source_and_sink_on_sluice": "chain-3",
    "test_apply_on_the_kafka_source_through_kill_9_of_driver_and_broker": "chain-1",
    # Kafka Connect and Debezium (two JVMs) beside a Spark driver and three brokers (slow)
    "test_debezium_through_connect_into_sluice_survives_broker_and_worker_kills": "chain-3",
}

#: Modules whose tests share nothing (no module-scoped fixture, no order between them) and are
#: long in sum: each of their tests is a work unit of its own, spread over the workers. Kept
#: whole, the incident drills (about eight minutes of tests, each starting its own cluster) ran
#: one after another on one worker while the others had finished.
SPLIT_MODULES = {"tests/integration/test_incidents.py"}


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Work units of one module each (`--dist loadscope`), but a chain's tests in one unit of
    their own (xdist's own `loadgroup` marks tests by rewriting their node ids, which pytest 9
    no longer allows). A module stays whole on one worker because its module-scoped fixtures
    (a cluster, a broker) are set up once there, and some of its tests run after others on
    purpose (a broker alive after the fuzz tests; a test killing the module's broker, last).
    Units of one test each split such modules: a module's cluster was started on every worker,
    and `test_sasl_ssl_broker_alive_after_fuzz` ran on a fresh broker no fuzz test had touched."""
    from xdist.scheduler import LoadScopeScheduling

    class ChainScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            test = nodeid.rpartition("::")[2].partition("[")[0]
            module = nodeid.partition("::")[0]
            if test in CHAINS:
                return CHAINS[test]
            return nodeid if module in SPLIT_MODULES else module

        def _assign_work_unit(self, node: Any) -> None:
            """The chains first, then the modules that start processes (integration, browser,
            conformance), then the unit tests: a long unit handed out last keeps the suite
            waiting at its end. (xdist orders units by their number of tests, which put
            hundreds of quick unit tests before a module of a few long drills.)"""
            if not getattr(self, "_ordered", False):
                self._ordered = True
                rank = {scope: (0 if scope in CHAINS.values() else 2 if "/unit/" in scope else 1)
                        for scope in self.workqueue}  # fmt: skip
                for scope in sorted(self.workqueue, key=lambda s: rank[s]):  # stable: by size within
                    self.workqueue.move_to_end(scope)
            super()._assign_work_unit(node)

        def remove_node(self, node: Any) -> str | None:
            """As LoadScopeScheduling's, but the test a worker crashed in is not handed out
            again: it is reported once as crashed, and a hang (see the watchdog below) would
            otherwise cost its full timeout on every fresh worker until xdist gives up."""
            workload = self.assigned_work.pop(node)
            pending = [
                (unit, nodeid) for unit in workload.values() for nodeid, done in unit.items() if not done
            ]
            if not pending:
                return None
            unit, crashitem = pending[0]
            unit[crashitem] = True
            self.workqueue.update({scope: u for scope, u in workload.items() if not all(u.values())})
            for other in self.assigned_work:
                self._reschedule(other)
            return crashitem

    return ChainScheduling(config, log)


#: How long past its pytest-timeout a test may run before the watchdog below ends its process.
WATCHDOG_GRACE_S = 60
_dump_file: Any = None


def pytest_configure(config: pytest.Config) -> None:
    """The controller picks a directory for the watchdog's stack dumps, and every process points
    Spark at the suite's defaults; workers and the commands tests run inherit both."""
    if not hasattr(config, "workerinput") and "SLUICE_TEST_HANG_DUMPS" not in os.environ:
        os.environ["SLUICE_TEST_HANG_DUMPS"] = tempfile.mkdtemp(prefix="sluice-test-hangs-")
    # Spark drivers the tests start, in this process or in the commands they run, take the
    # suite's JVM options (tests/support/spark-conf/spark-defaults.conf says why)
    os.environ.setdefault("SPARK_CONF_DIR", str(Path(__file__).parent / "support" / "spark-conf"))


def _watchdog_file() -> Any:
    global _dump_file
    if _dump_file is None:
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        dumps = os.environ.get("SLUICE_TEST_HANG_DUMPS")
        _dump_file = open(Path(dumps) / f"{worker}.txt", "w") if worker and dumps else sys.__stderr__  # noqa: SIM115
    return _dump_file


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A watchdog for what pytest-timeout cannot stop. Its signal reaches Python only when the
    main thread returns to the interpreter, and a call blocked inside a C library (librdkafka's
    consumer close and destroy can wait forever on a broker that was killed) never returns: the
    whole suite then hangs until CI's own limit. faulthandler's timer runs on a C thread, so it
    still writes every thread's stack and ends the process; pytest-xdist reports the test as
    crashed, with the stacks (below), and starts a fresh worker."""
    marker = item.get_closest_marker("timeout")
    limit = float(marker.args[0]) if marker and marker.args else float(item.config.getini("timeout") or 0)
    if limit > 0:
        faulthandler.dump_traceback_later(limit + WATCHDOG_GRACE_S, exit=True, file=_watchdog_file())
    try:
        yield
    finally:
        if limit > 0:
            faulthandler.cancel_dump_traceback_later()


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report: pytest.TestReport, sched: Any) -> None:
    """Puts the crashed worker's stack dump, if the watchdog wrote one, into the test's report."""
    dump = Path(os.environ["SLUICE_TEST_HANG_DUMPS"]) / f"{report.node.gateway.id}.txt"  # type: ignore[attr-defined]
    if dump.exists() and dump.stat().st_size:
        report.longrepr = f"{report.longrepr}; the watchdog's stack dump:\n{dump.read_text()}"


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real ZooKeeper for the whole run; each cluster gets its own chroot in it."""
    server = LocalZooKeeper(tmp_path_factory.mktemp("zookeeper"), free_port(), force_sync=False)
    server.start()
    try:
        yield server.connect_string
    finally:
        server.stop()


@pytest.fixture
def make_cluster(zookeeper: str, tmp_path: Path) -> Iterator[Callable[..., TestCluster]]:
    clusters: list[TestCluster] = []

    def make(
        brokers: int = 1,
        session_timeout_s: float = 6.0,
        broker_settings: dict[str, str] | None = None,
        security: str = "none",
    ) -> TestCluster:
        c = TestCluster(
            zookeeper, tmp_path / f"cluster-{len(clusters)}", brokers, session_timeout_s, broker_settings,
            security,
        )  # fmt: skip
        clusters.append(c)
        return c

    try:
        yield make
    finally:
        for c in clusters:
            try:
                c.down()
            except Exception:
                pass


@pytest.fixture
def cluster(make_cluster: Callable[..., TestCluster]) -> TestCluster:
    return make_cluster(1)


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPostgres]:
    """One real PostgreSQL (Debian's server binaries) for the whole run, a target and (wal_level
    logical) a source; tests make databases."""
    server = LocalPostgres(tmp_path_factory.mktemp("postgres"), logical=True)  # a source too
    server.start()
    try:
        yield server
    finally:
        server.remove()


_databases = iter(range(1_000_000))


@pytest.fixture
def postgres_url(postgres: LocalPostgres) -> str:
    return postgres.create_database(f"t{next(_databases)}")


@pytest.fixture(scope="session")
def mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMariaDB]:
    """One real MariaDB (Debian's mariadb-server) with a row-based binlog for the whole run."""
    server = LocalMariaDB(tmp_path_factory.mktemp("mariadb"))
    server.start()
    try:
        yield server
    finally:
        server.remove()


@pytest.fixture
def mysql_url(mariadb: LocalMariaDB) -> str:
    """A new database on the session's MariaDB, as a MySQL target's URL."""
    name = f"t{next(_databases)}_{os.getpid()}"
    mariadb.execute(f"CREATE DATABASE {name}")
    return f"mysql://root@127.0.0.1:{mariadb.port}/{name}"


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark session for the tests that run Spark jobs in this process."""
    from sluice.pipeline.session import ConnectorMissingError, kafka_connector_jars, spark_session

    # With Spark's Kafka source when scripts/peers.sh fetched it (test_spark_kafka_source.py
    # reads Sluice through it): a process's driver gets its jars when it starts, not later.
    try:
        connector = bool(kafka_connector_jars())
    except ConnectorMissingError:
        connector = False
    session = spark_session("local[2]", app="sluice-tests", kafka_connector=connector)
    yield session
    session.stop()
