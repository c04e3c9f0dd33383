from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice.ops.mariadb import LocalMariaDB
from sluice.ops.ports import free_port
from sluice.ops.postgres import LocalPostgres
from sluice.ops.zookeeper import LocalZooKeeper
from tests.support.cluster import TestCluster

#: The longest tests, which start Spark worker processes (and brokers, MariaDB, a target), in
#: two chains of about equal length. Under pytest-xdist (scripts/test.sh) each chain runs on one
#: worker, one test after another, and the chains are handed out first: two of these at once
#: is what two cores carry, and a chain started last would keep the suite waiting at its end.
#: The other tests are handed out one by one around them.
CHAINS = {
    "test_short_chaos_sync_run_targets_equal_the_source": "chain-1",
    "test_zombie_task_passes_from_the_cli": "chain-1",
    "test_task_status_reports_the_lag_the_test_measures": "chain-1",
    "test_driver_killed_around_commits_and_a_broker_killed": "chain-2",
    "test_two_workers_share_a_task_through_kills_and_a_pause": "chain-2",
    "test_a_failing_task_leaves_the_worker_running_and_a_task_created_again_commits": "chain-2",
    "test_demo_ends_with_the_target_equal_to_the_source": "chain-2",
}


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Work units of one test each, but a chain's tests in one unit (xdist's own `loadgroup`
    marks tests by rewriting their node ids, which pytest 9 no longer allows)."""
    from xdist.scheduler import LoadScopeScheduling

    class ChainScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return CHAINS.get(nodeid.rpartition("::")[2].partition("[")[0], nodeid)

    return ChainScheduling(config, log)


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

    def make(brokers: int = 1, session_timeout_s: float = 6.0) -> TestCluster:
        c = TestCluster(zookeeper, tmp_path / f"cluster-{len(clusters)}", brokers, session_timeout_s)
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
    """One real PostgreSQL (Debian's server binaries) for the whole run; tests make databases."""
    server = LocalPostgres(tmp_path_factory.mktemp("postgres"))
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


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark session for the tests that run Spark jobs in this process."""
    from sluice.pipeline.session import spark_session

    session = spark_session("local[2]", app="sluice-tests")
    yield session
    session.stop()
