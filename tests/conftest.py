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
