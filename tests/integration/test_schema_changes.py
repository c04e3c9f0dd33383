"""Schema changes from a MariaDB binlog into SQLite and PostgreSQL under each
schema_change_policy: a dropped column, a renamed one, a widening and an incompatible type
change, a table created, one dropped and one truncated, with rows written around each.

The source side runs once per module: one database, one capture that is stopped and started
again from the position recovered from the log after every statement (so a restarted capture
reads what follows each change with the schema it had). Each target and policy then applies
that log in small batches, in the order a consumer reads it (partition by partition, so rows
written before a change in one partition arrive after the change in another), opening the
target again (a restart from its stored offsets) and replaying a batch along the way, and ends:

- evolve: equal to the source;
- ignore: the target's first shape kept (old column names and types; no column dropped);
- stop: paused at each change that would alter or lose what the target holds, with nothing of
  that batch committed; resumed with evolve for that change, it ends equal to the source.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from itertools import pairwise
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pymysql
import pytest

from sluice.cluster.zkstore import ZkStore
from sluice.ops.mariadb import LocalMariaDB
from sluice.pipeline.execution import TaskExecution, apply_config
from sluice.sync.envelope import key_text
from sluice.sync.schema import SchemaChange
from sluice.sync.sources.mysql import MySqlCapture, recover_position
from sluice.sync.targets import open_target
from sluice.sync.targets.evolution import SchemaChangeStopped
from sluice.sync.tasks import SourceSpec, TaskSpecError, TaskStore, parse_spec
from sluice.sync.truth import Truth, compare
from tests.integration.test_mysql_capture import read_all, running, wait_caught_up
from tests.integration.test_pipeline import create_topic
from tests.support.cluster import TestCluster, wait_until
from tests.support.staging import apply_staged

DB = "schema_evo"
TOPIC = "schema_evo.changes"
TABLES = ["items", "gone", "fresh"]
KEYS = {"items": ["id"], "gone": ["id"], "fresh": ["id"]}
FIRST_ITEMS_COLUMNS = {"id", "a", "b", "c", "w", "k"}

SETUP = [
    "CREATE TABLE items (id INT PRIMARY KEY, a INT, b VARCHAR(16), c INT, w INT, k INT)",
    "CREATE TABLE gone (id INT PRIMARY KEY, v INT)",
    *(f"INSERT INTO items VALUES ({i}, {i}, 'b{i}', {i * 10}, {i}, {i})" for i in range(1, 21)),
    *(f"INSERT INTO gone VALUES ({i}, {i})" for i in range(1, 6)),
]

# (statement, rows written before it, rows written after it): each a schema change or a
# truncate, with changes of the columns it touched on both sides
STEPS: list[tuple[str, list[str], list[str]]] = [
    ("ALTER TABLE items DROP COLUMN c",
     ["UPDATE items SET c = c + 1, b = 'before-drop' WHERE id <= 6",
      "INSERT INTO items VALUES (21, 21, 'x', 7, 21, 21)"],
     ["UPDATE items SET b = 'after-drop' WHERE id BETWEEN 3 AND 9",
      "INSERT INTO items VALUES (22, 22, 'y', 22, 22)"]),
    ("ALTER TABLE items RENAME COLUMN a TO a2",
     ["UPDATE items SET a = a + 100 WHERE id BETWEEN 5 AND 12", "DELETE FROM items WHERE id = 2"],
     ["UPDATE items SET a2 = a2 + 1000 WHERE id BETWEEN 10 AND 15",
      "INSERT INTO items VALUES (23, 23, 'z', 23, 23)"]),
    ("ALTER TABLE items MODIFY w BIGINT",
     ["UPDATE items SET w = w * 2 WHERE id <= 8"],
     ["UPDATE items SET w = 4000000000 + id WHERE id BETWEEN 6 AND 11"]),
    ("ALTER TABLE items MODIFY k VARCHAR(12)",
     ["UPDATE items SET k = k + 50 WHERE id BETWEEN 1 AND 5"],
     # text an integer column cannot hold as it is (leading zeros)
     ["UPDATE items SET k = CONCAT('00', id) WHERE id BETWEEN 4 AND 14",
      "INSERT INTO items VALUES (24, 24, 'k', 24, '0024')"]),
    ("CREATE TABLE fresh (id INT PRIMARY KEY, v VARCHAR(8))",
     ["UPDATE gone SET v = v + 1 WHERE id = 1"],
     ["INSERT INTO fresh VALUES (1, 'f1'), (2, 'f2'), (3, 'f3')"]),
    ("DROP TABLE gone",
     ["UPDATE gone SET v = 99 WHERE id <= 3", "UPDATE fresh SET v = 'f2b' WHERE id = 2"],
     ["UPDATE items SET b = 'after-gone' WHERE id = 20"]),
    ("TRUNCATE TABLE fresh",
     ["UPDATE fresh SET v = 'old' WHERE id = 3"],
     ["INSERT INTO fresh VALUES (7, 'f7')", "UPDATE items SET a2 = 7 WHERE id = 1"]),
]  # fmt: skip
#: a widening change made while no capture runs: the next one reads the column's type after it
#: only, so it cannot call it widening
WHILE_DOWN = "ALTER TABLE items MODIFY b VARCHAR(32)"
#: the changes policy `stop` stops at (the rest add, create, widen or only truncate)
STOPPING = {("items", "drop_column", "c"), ("items", "rename_column", "a"), ("items", "change_type", "k"),
            ("gone", "drop_table", None), ("items", "change_type", "b")}  # fmt: skip


@dataclass
class SourceLog:
    records: pa.Table
    source: dict[str, dict[str, dict[str, Any]]]
    restarts: int


def source_rows(server: LocalMariaDB) -> dict[str, dict[str, dict[str, Any]]]:
    conn = pymysql.connect(**server.connect_args(DB), cursorclass=pymysql.cursors.DictCursor)  # type: ignore[arg-type]
    out: dict[str, dict[str, dict[str, Any]]] = {}
    try:
        with conn.cursor() as cur:
            for table in ("items", "fresh"):
                cur.execute(f"SELECT * FROM {table}")
                out[table] = {key_text({"id": r["id"]}): dict(r) for r in cur.fetchall()}
    finally:
        conn.close()
    return out


@pytest.fixture(scope="module")
def source_log(
    mariadb: LocalMariaDB, zookeeper: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SourceLog]:
    cluster = TestCluster(zookeeper, tmp_path_factory.mktemp("schema-cluster"), 1)
    try:
        bootstrap = cluster.bootstrap
        create_topic(bootstrap, TOPIC, 3, 1)
        mariadb.execute(f"DROP DATABASE IF EXISTS {DB}", f"CREATE DATABASE {DB}")
        mariadb.execute(*SETUP, database=DB)
        spec = SourceSpec(kind="mariadb", port=mariadb.port, user="root", database=DB)

        def capture(start: str | None) -> MySqlCapture:
            return MySqlCapture(spec, TABLES, lambda _t: TOPIC, bootstrap, name=DB, start=start,
                                stop=threading.Event())  # fmt: skip

        start: str | None = None
        restarts = 0
        written_after: list[str] = []  # the rows after the previous change, for the next capture
        for statement, before, after in [*STEPS, ("", [], [])]:
            if statement.startswith("TRUNCATE"):
                mariadb.execute(WHILE_DOWN, database=DB)
            # a capture per change, started from the position recovered from the log: it reads
            # the rows written after the previous change (under the schema that change made),
            # the rows before this one and this change; then it stops, right after the change
            with running(capture(start)) as cap:
                wait_until(lambda: cap.stats.position, 60, "the capture streaming")
                for sql in [*written_after, *before, *([statement] if statement else [])]:
                    mariadb.execute(sql, database=DB)
                wait_caught_up(cap, mariadb, 60)
            assert not cap.stats.errors, cap.stats.errors
            start = recover_position(bootstrap, [TOPIC])
            assert start is not None and not start.startswith("snapshot")
            restarts += 1
            written_after = after
        yield SourceLog(read_all(bootstrap, TOPIC, 3), source_rows(mariadb), restarts)
    finally:
        cluster.down()


#: "postgresql-staged", "mysql-staged": each batch staged by the executors' function and
#: committed from the staging (the Spark pipeline's path: sync/targets/staging.py)
KINDS = ["sqlite", "postgresql", "postgresql-staged", "mysql", "mysql-staged"]


def target_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'target.db'}"
    return str(request.getfixturevalue("mysql_url" if kind.startswith("mysql") else "postgres_url"))


@dataclass
class Applied:
    rows: dict[str, dict[str, dict[str, Any]]]
    stops: list[SchemaChangeStopped]


def cut(records: pa.Table, most: int, after_schema_change: bool) -> list[pa.Table]:
    """Batches of at most `most` records; with `after_schema_change`, each schema change ends one
    (so no two changes share a batch: the operator's answer to a stop applies its whole batch)."""
    ends, start = [], 0
    for i, value in enumerate(records["value"].to_pylist()):
        if i + 1 - start == most or (after_schema_change and b'"op":"s"' in value):
            ends.append(i + 1)
            start = i + 1
    bounds = [0, *ends, *([records.num_rows] if start < records.num_rows else [])]
    return [records.slice(a, b - a) for a, b in pairwise(bounds)]


def apply_log(url: str, policy: str, records: pa.Table, batch: int = 23, staged: bool = False) -> Applied:
    """The log in batches of `batch` records, the target opened again (a restart from its stored
    offsets, replaying the batch before) after every batch with a schema change and every 5
    batches. Under `stop`, a stopped batch must have committed nothing; it is then applied once
    with evolve (the operator's answer). `staged`: each batch staged as the executors stage it
    and committed from the staging (tests/support/staging.py), as a Spark pipeline does."""
    batches = cut(records, batch, after_schema_change=policy == "stop")

    def commit(target: Any, epoch: int, b: pa.Table) -> Any:
        return apply_staged(target, DB, epoch, b) if staged else target.apply(DB, epoch, b)

    stops: list[SchemaChangeStopped] = []
    target = open_target(url, schema_change_policy=policy)
    epoch = target.claim(DB)
    try:
        for i, b in enumerate(batches):
            if i and (i % 5 == 0 or has_schema_change(batches[i - 1])):
                target.close()
                target = open_target(url, schema_change_policy=policy)
                epoch = target.claim(DB)
                commit(target, epoch, batches[i - 1])  # replayed: changes nothing
            try:
                commit(target, epoch, b)
            except SchemaChangeStopped as exc:
                offsets = target.applied_offsets(DB)
                rows = {t: target.read_rows(t) for t in TABLES}
                with pytest.raises(SchemaChangeStopped):
                    commit(target, epoch, b)  # it stays stopped until the policy changes
                assert target.applied_offsets(DB) == offsets
                assert {t: target.read_rows(t) for t in TABLES} == rows
                stops.append(exc)
                with open_target(url, schema_change_policy="evolve") as evolving:
                    commit(evolving, evolving.claim(DB), b)
                target.close()
                target = open_target(url, schema_change_policy=policy)
                epoch = target.claim(DB)
        return Applied({t: target.read_rows(t) for t in TABLES}, stops)
    finally:
        target.close()


def has_schema_change(records: pa.Table) -> bool:
    return any(b'"op":"s"' in v for v in records["value"].to_pylist())


def assert_equal_to_source(got: Applied, log: SourceLog) -> None:
    truth = Truth(tables=log.source, key_columns={t: KEYS[t] for t in log.source})
    cmp = compare(truth, {t: got.rows[t] for t in log.source})
    assert cmp.ok, cmp.summary()
    items = next(iter(got.rows["items"].values()))
    assert set(items) == {"id", "a2", "b", "w", "k"}  # c dropped, a renamed
    assert len(log.records) > 200
    assert got.rows["gone"] == {}  # dropped, and no older row brought it back


@pytest.mark.parametrize("kind", KINDS)
def test_evolve_follows_every_change_through_restarts(
    source_log: SourceLog, kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    assert source_log.restarts == len(STEPS) + 1
    url = target_url(kind, tmp_path, request)
    got = apply_log(url, "evolve", source_log.records, staged=kind.endswith("staged"))
    assert got.stops == []
    assert_equal_to_source(got, source_log)
    with open_target(url) as t:
        assert "gone" not in table_names(t)  # dropped, and not made again by its older rows
    assert got.rows["items"][key_text({"id": 4})]["k"] == "004"  # text, leading zeros and all


def assert_first_shape_kept(got: Applied, log: SourceLog) -> None:
    items = got.rows["items"]
    assert set(next(iter(items.values()))) == FIRST_ITEMS_COLUMNS
    assert set(items) == set(log.source["items"])
    for key, src in log.source["items"].items():
        row = items[key]
        # the renamed column's values under its old name; the incompatible type kept (an
        # integer column holds '004' as 4); the widened column took the wider values
        assert (row["a"], row["b"], row["w"], row["k"]) == (src["a2"], src["b"], src["w"], int(src["k"])), key
    assert got.rows["fresh"] == log.source["fresh"]
    assert got.rows["gone"] == {}  # its rows removed, the table kept


@pytest.mark.parametrize("kind", KINDS)
def test_ignore_keeps_the_first_shape_and_rows_keep_flowing(
    source_log: SourceLog, kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = target_url(kind, tmp_path, request)
    got = apply_log(url, "ignore", source_log.records, staged=kind.endswith("staged"))
    assert got.stops == []
    assert_first_shape_kept(got, source_log)
    with open_target(url) as t:  # the dropped table is still there, empty
        assert t.applied_offsets(DB)
        assert "gone" in table_names(t)


def table_names(target: Any) -> set[str]:
    if hasattr(target, "path"):
        return {r[0] for r in target.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if target.url.startswith("mysql"):
        with target.conn.cursor() as cur:
            cur.execute("SHOW TABLES")
            return {r[0] for r in cur.fetchall()}
    return {r[0] for r in target.conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}


@pytest.mark.parametrize("kind", KINDS)
def test_stop_pauses_at_each_change_that_alters_the_target(
    source_log: SourceLog, kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    got = apply_log(
        target_url(kind, tmp_path, request), "stop", source_log.records, staged=kind.endswith("staged")
    )
    assert {(e.table, e.change.kind, e.change.column) for e in got.stops} == STOPPING
    for e in got.stops:
        assert "sluice task update" in str(e) and "schema_change_policy" in str(e) and str(e.pos) in str(e)
    assert_equal_to_source(got, source_log)


def test_a_stopped_schema_change_pauses_the_task_with_an_alarm(zookeeper: str) -> None:
    spec = parse_spec({"id": "schemastop", "source": {"kind": "generator"}, "target": "sqlite:///t.db",
                       "options": {"schema_change_policy": "stop"}})  # fmt: skip
    assert apply_config(spec, "b:9092", 1, Path("/tmp")).schema_change_policy == "stop"
    zk = ZkStore(f"{zookeeper.split('/')[0]}/t-{uuid.uuid4().hex[:8]}")
    zk.start()
    try:
        store = TaskStore(zk.client)
        store.create(spec)
        execution = SimpleNamespace(store=store, task_id=spec.id)
        execution._schema_change_stopped = partial(TaskExecution._schema_change_stopped, execution)  # type: ignore[arg-type]
        exc = SchemaChangeStopped(
            spec.id, "items", "ALTER TABLE items DROP COLUMN c", 77, SchemaChange("drop_column", "c")
        )
        TaskExecution._on_commit_error(execution, exc)  # type: ignore[arg-type]
        assert store.control(spec.id).paused
        (alarm,) = store.alarms(spec.id)
        assert alarm["kind"] == "schema-change-stopped"
        assert (alarm["table"], alarm["position"], alarm["change"]) == ("items", 77, "drop_column")
        assert "sluice task update" in alarm["detail"] and "sluice task resume schemastop" in alarm["detail"]
    finally:
        zk.stop()


def test_the_policy_option_is_one_of_three() -> None:
    with pytest.raises(
        TaskSpecError, match=r"task\.options\.schema_change_policy: must be one of evolve, ignore, stop"
    ):
        parse_spec({"id": "x", "source": {"kind": "generator"}, "target": "sqlite:///t.db",
                    "options": {"schema_change_policy": "drop"}})  # fmt: skip
