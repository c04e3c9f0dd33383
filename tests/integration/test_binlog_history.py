"""A capture whose source's binlog history changes under it (issue 18: positions that survive a
source failover): RESET MASTER while it runs and while it is stopped, and a replica promoted to
primary. Each time the target must end equal to the source, the changes of the new history must
carry positions above every earlier one, and the capture must say whether it could prove that it
missed nothing (`continuous`). One companion runs the RESET MASTER case with the new base
switched off (`next_base` giving 0): the target then misses the new history's changes, which is
what the version guard did to them before.

The servers here are the module's own: RESET MASTER on the suite's shared MariaDB would pull the
binlog from under every other test's capture."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest

from sluice.ops.mariadb import LocalMariaDB
from sluice.sync.sources import binlog_history, mysql
from sluice.sync.sources.mysql import MySqlCapture, recover_history, recover_position
from sluice.sync.sources.mysql_base import primary_keys
from sluice.sync.tasks import SourceSpec
from sluice.sync.truth import Truth, compare
from tests.integration.test_capture_statements import apply_to, source_rows
from tests.integration.test_mysql_capture import read_all, running, wait_caught_up
from tests.integration.test_pipeline import create_topic
from tests.support.cluster import TestCluster, wait_until

DB = "hist"
SCHEMA = [
    "CREATE TABLE accounts (id INT PRIMARY KEY, owner VARCHAR(40), balance BIGINT)",
    "CREATE TABLE moves (a INT, b INT, amount INT, PRIMARY KEY (a, b))",
]
TABLES = ["accounts", "moves"]


@pytest.fixture(scope="module")
def broker(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    cluster = TestCluster(zookeeper, tmp_path_factory.mktemp("binlog-history"), 1)
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.fixture
def primary(tmp_path: Path) -> Iterator[LocalMariaDB]:
    server = LocalMariaDB(tmp_path / "primary", server_id=1)
    server.start()
    try:
        yield server
    finally:
        server.remove()


_n = iter(range(1000))


class Source:
    """The test's writes to whichever server is the primary now."""

    def __init__(self, server: LocalMariaDB) -> None:
        self.server = server
        self.next_id = 1

    def write(self, transactions: int) -> None:
        conn = pymysql.connect(**self.server.connect_args(DB))  # type: ignore[arg-type]
        try:
            with conn.cursor() as cur:
                for _ in range(transactions):
                    i = self.next_id
                    self.next_id += 1
                    cur.execute("INSERT INTO accounts VALUES (%s, %s, %s)", (i, f"owner {i}", 100))
                    cur.execute("INSERT INTO moves VALUES (%s, %s, %s)", (i, i % 7, i * 3))
                    if i > 3:
                        cur.execute("UPDATE accounts SET balance = balance + %s WHERE id = %s", (i, i - 3))
                    if i % 5 == 0:
                        cur.execute("DELETE FROM moves WHERE a = %s", (i - 4,))
                    conn.commit()
        finally:
            conn.close()


def setup_source(server: LocalMariaDB) -> Source:
    server.execute(f"CREATE DATABASE {DB}")
    server.execute(*SCHEMA, database=DB)
    return Source(server)


class Changes:
    """What the capture told about the history change (its on_history_change)."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def __call__(self, info: dict[str, Any]) -> None:
        self.seen.append(info)


def capture(
    server: LocalMariaDB, broker: TestCluster, topic: str, changes: Changes, start: str | None = None
) -> MySqlCapture:
    spec = SourceSpec(kind="mariadb", port=server.port, user="root", database=DB)
    return MySqlCapture(spec, TABLES, lambda _t: topic, broker.bootstrap, name=topic, start=start,
                        on_history_change=changes)  # fmt: skip


def assert_target_equals_source(
    server: LocalMariaDB, broker: TestCluster, topic: str, tmp_path: Path
) -> None:
    keys = primary_keys(SourceSpec(kind="mariadb", port=server.port, user="root", database=DB), TABLES)
    truth = Truth(tables=source_rows(server, DB, keys), key_columns=keys)
    got = apply_to(f"sqlite:///{tmp_path / f'{topic}.db'}", broker.bootstrap, topic, topic, TABLES, 50)
    cmp = compare(truth, got)
    assert cmp.ok, cmp.summary()


def positions(broker: TestCluster, topic: str) -> list[tuple[int, int, str]]:
    """(partition, source.pos, op) of every change record, in log order per partition."""
    import orjson

    table = read_all(broker.bootstrap, topic)
    out = []
    for part, value in zip(
        table.column("partition").to_pylist(), table.column("value").to_pylist(), strict=True
    ):
        doc = orjson.loads(value)
        if doc.get("table") in TABLES:
            out.append((part, int(doc["source"]["pos"]), str(doc["op"])))
    return out


def assert_positions_only_go_up(broker: TestCluster, topic: str) -> None:
    """Per partition, binlog changes (not snapshot rows) never go back: the new history's
    changes are above the old one's."""
    last: dict[int, int] = {}
    for part, pos, op in positions(broker, topic):
        if op == "r":
            continue
        assert pos > last.get(part, -1), f"partition {part}: position {pos} after {last.get(part)}"
        last[part] = pos


def reset_master(server: LocalMariaDB, keep_gtid_state: bool) -> str:
    """RESET MASTER; with `keep_gtid_state`, the documented way to keep GTIDs going: the old
    state set again on the new binlog. Returns the state before."""
    state = str(server.execute("SELECT @@gtid_binlog_state")[0][0])
    statements = ["RESET MASTER"] + ([f"SET GLOBAL gtid_binlog_state = '{state}'"] if keep_gtid_state else [])
    server.execute(*statements)
    return state


def thirty_to_capture(
    primary: LocalMariaDB, broker: TestCluster
) -> tuple[str, Source, Changes, MySqlCapture]:
    """A topic, a source with 30 transactions written, and a capture (not started) of it."""
    topic = f"hist{next(_n)}"
    create_topic(broker.bootstrap, topic, 3, 1)
    source = setup_source(primary)
    source.write(30)
    changes = Changes()
    return topic, source, changes, capture(primary, broker, topic, changes)


def reset_under_a_running_capture(
    primary: LocalMariaDB, broker: TestCluster, keep_gtid_state: bool
) -> tuple[str, MySqlCapture, Changes]:
    """30 transactions captured, RESET MASTER, 30 more, all read by one running capture."""
    topic, source, changes, cap = thirty_to_capture(primary, broker)
    with running(cap):
        wait_caught_up(cap, primary, 60)
        reset_master(primary, keep_gtid_state)
        source.write(30)
        wait_until(lambda: changes.seen, 60, "the capture to notice the new history")
        wait_caught_up(cap, primary, 60)
    return topic, cap, changes


@pytest.mark.parametrize("keep_gtid_state", [True, False], ids=["gtid-state-kept", "reset-alone"])
def test_reset_master_under_a_running_capture(
    primary: LocalMariaDB, broker: TestCluster, tmp_path: Path, keep_gtid_state: bool
) -> None:
    topic, cap, changes = reset_under_a_running_capture(primary, broker, keep_gtid_state)
    assert not cap.stats.errors, cap.stats.errors
    [info] = changes.seen
    assert info["continuous"] is keep_gtid_state, info
    assert info["base"] > 0 and info["went_on_at"].startswith("mysql-bin.000001:")
    assert_positions_only_go_up(broker, topic)
    # The capture had read everything before the reset, so even without the GTID state kept
    # nothing was missed here; `continuous` says only whether the capture could prove it.
    assert_target_equals_source(primary, broker, topic, tmp_path)


def test_reset_master_as_the_snapshot_ends(
    primary: LocalMariaDB, broker: TestCluster, tmp_path: Path
) -> None:
    """RESET MASTER between the snapshot taking its binlog position and the capture reading
    from there (under load, the snapshot's rows were still being flushed): the GTID state at
    that position was read with the position, so the capture still tells the new history from
    the old one. Read only after the flush (as before), the reset binlog had no state there,
    the capture had none to compare, and it read the new binlog as if it were the old one."""
    topic, source, changes, cap = thirty_to_capture(primary, broker)
    end_tx = cap._end_tx
    resets = []

    def reset_then_end(tx: Any, position: str) -> None:
        if not resets:  # the snapshot's group, the first to end
            resets.append(reset_master(primary, keep_gtid_state=True))
        end_tx(tx, position)

    cap._end_tx = reset_then_end  # type: ignore[method-assign]
    with running(cap):
        wait_until(lambda: resets, 60, "the snapshot to end")
        source.write(30)
        wait_until(lambda: changes.seen or cap.stats.errors, 60, "the capture to notice the new history")
        assert not cap.stats.errors, cap.stats.errors
        wait_caught_up(cap, primary, 60)
    assert [c["continuous"] for c in changes.seen] == [True], changes.seen
    assert_positions_only_go_up(broker, topic)
    assert_target_equals_source(primary, broker, topic, tmp_path)


def test_reset_master_while_the_capture_is_stopped(
    primary: LocalMariaDB, broker: TestCluster, tmp_path: Path
) -> None:
    topic = f"hist{next(_n)}"
    create_topic(broker.bootstrap, topic, 3, 1)
    source = setup_source(primary)
    changes = Changes()
    first = capture(primary, broker, topic, changes)
    with running(first):
        source.write(20)
        wait_caught_up(first, primary, 60)
    reset_master(primary, keep_gtid_state=True)
    source.write(20)
    resume = recover_position(broker.bootstrap, [topic])
    assert resume is not None and not resume.startswith("snapshot")
    second = capture(primary, broker, topic, changes, start=resume)
    with running(second):
        wait_until(lambda: changes.seen, 60, "the restarted capture to go on in the new history")
        wait_caught_up(second, primary, 60)
    assert not second.stats.errors, second.stats.errors
    assert [c["continuous"] for c in changes.seen] == [True]
    assert_positions_only_go_up(broker, topic)
    assert_target_equals_source(primary, broker, topic, tmp_path)
    # and a third start, in the new history now, stays in it: no change of history, same base
    base = recover_history(broker.bootstrap, [topic]).base
    third = capture(primary, broker, topic, changes, start=recover_position(broker.bootstrap, [topic]))
    with running(third):
        source.write(5)
        wait_caught_up(third, primary, 60)
    assert len(changes.seen) == 1 and recover_history(broker.bootstrap, [topic]).base == base
    assert_target_equals_source(primary, broker, topic, tmp_path)


def test_without_a_new_base_the_new_historys_changes_are_lost(
    primary: LocalMariaDB, broker: TestCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same RESET MASTER with positions left to go down (the guarantee off): the target's
    version guard drops the new history's changes, and the target differs from the source."""
    monkeypatch.setattr(mysql, "next_base", lambda high: 0)
    monkeypatch.setattr(binlog_history, "next_base", lambda high: 0)
    topic, _, _ = reset_under_a_running_capture(primary, broker, keep_gtid_state=True)
    with pytest.raises(AssertionError, match=r"different|missing"):
        assert_target_equals_source(primary, broker, topic, tmp_path)


def start_replica(primary: LocalMariaDB, directory: Path, own_events_first: bool) -> LocalMariaDB:
    """A replica of `primary` by GTID, writing what it replicates to its own binlog. With
    `own_events_first` it writes a statement of its own first (GTID domain 9), so its binlog's
    offsets differ from the primary's; without, they match the primary's byte for byte."""
    replica = LocalMariaDB(directory, server_id=2, extra_args=("--log-slave-updates",))
    replica.start()
    if own_events_first:
        replica.execute("SET SESSION gtid_domain_id = 9", "CREATE DATABASE replica_own")
    replica.execute(
        f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={primary.port}, MASTER_USER='root', "
        "MASTER_PASSWORD='', MASTER_USE_GTID=slave_pos",
        "START SLAVE",
    )
    return replica


def wait_replicated(primary: LocalMariaDB, replica: LocalMariaDB) -> None:
    want = str(primary.execute("SELECT @@gtid_binlog_pos")[0][0])
    wait_until(
        lambda: (
            binlog_history.parse_state(str(replica.execute("SELECT @@gtid_slave_pos")[0][0]))
            == binlog_history.parse_state(want)
        ),
        60,
        f"the replica to reach {want}",
    )


@pytest.mark.parametrize("own_events_first", [True, False], ids=["offsets-differ", "offsets-match"])
def test_a_task_follows_a_promoted_replica(
    primary: LocalMariaDB, broker: TestCluster, tmp_path: Path, own_events_first: bool
) -> None:
    """The capture reads the primary; the replica (GTID replication, log_slave_updates) is
    promoted after the primary stops, and the capture is pointed at it. Where the replica's
    binlog has other offsets, the capture's position is not in its history, and it goes on from
    its GTID state in the replica's own binlog; where the offsets match (the replica wrote
    nothing of its own), BINLOG_GTID_POS agrees at the position and it just reads on. Either
    way nothing is missed and nothing older is written over newer."""
    replica = start_replica(primary, tmp_path / "replica", own_events_first)
    try:
        topic = f"hist{next(_n)}"
        create_topic(broker.bootstrap, topic, 3, 1)
        source = setup_source(primary)
        source.write(25)
        changes = Changes()
        first = capture(primary, broker, topic, changes)
        with running(first):
            wait_caught_up(first, primary, 60)
        source.write(10)  # replicated, but not captured from the primary
        wait_replicated(primary, replica)
        primary.stop()
        replica.execute("STOP SLAVE", "RESET SLAVE ALL")  # promoted
        source.server = replica
        source.write(25)
        second = capture(replica, broker, topic, changes, start=recover_position(broker.bootstrap, [topic]))
        with running(second):
            wait_caught_up(second, replica, 60)
        assert not second.stats.errors, second.stats.errors
        assert [c["continuous"] for c in changes.seen] == ([True] if own_events_first else []), changes.seen
        assert_positions_only_go_up(broker, topic)
        assert_target_equals_source(replica, broker, topic, tmp_path)
    finally:
        replica.remove()
