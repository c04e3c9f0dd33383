"""Ordinary statements the source allows, captured from MariaDB and applied to SQLite and
PostgreSQL: the target must end equal to the source (I8) whatever the statement did to its rows.

Each test runs a capture from a snapshot, then the statements, then applies everything in the log
to both targets in several batches, and compares every table with the source."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pymysql
import pytest

from sluice.ops.mariadb import LocalMariaDB
from sluice.sync.envelope import key_text
from sluice.sync.sources.mysql import MySqlCapture, check_source
from sluice.sync.sources.mysql_base import CaptureError, primary_keys
from sluice.sync.targets import open_target
from sluice.sync.tasks import SourceSpec
from sluice.sync.truth import Truth, compare
from tests.integration.test_mysql_capture import read_all, running, wait_caught_up
from tests.integration.test_pipeline import create_topic
from tests.support.cluster import TestCluster, wait_until


@pytest.fixture(scope="module")
def broker(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    """One broker for the module: each test has its own database and topic."""
    cluster = TestCluster(zookeeper, tmp_path_factory.mktemp("capture-statements"), 1)
    try:
        yield cluster
    finally:
        cluster.down()


_n = iter(range(10_000))


def source_rows(
    server: LocalMariaDB, database: str, keys: dict[str, list[str]]
) -> dict[str, dict[str, dict[str, Any]]]:
    """Every row of each table (a table that no longer exists is empty)."""
    conn = pymysql.connect(**server.connect_args(database), cursorclass=pymysql.cursors.DictCursor)  # type: ignore[arg-type]
    out: dict[str, dict[str, dict[str, Any]]] = {}
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW TABLES")
            present = {next(iter(r.values())) for r in cur.fetchall()}
            for table, cols in keys.items():
                out[table] = {}
                if table not in present:
                    continue
                cur.execute(f"SELECT * FROM `{table}`")
                out[table] = {key_text({k: row[k] for k in cols}): dict(row) for row in cur.fetchall()}
    finally:
        conn.close()
    return out


def run_capture(
    mariadb: LocalMariaDB,
    broker: TestCluster,
    schema: list[str],
    tables: list[str],
    statements: list[str | list[str]],
    keys: dict[str, list[str]] | None = None,
) -> tuple[str, str, dict[str, list[str]]]:
    """Create a database with `schema`, capture it from a snapshot, run `statements` (a list is
    one transaction), wait until the capture has read them; return (database, topic, keys)."""
    n = next(_n)
    db, topic = f"stmt{n}", f"stmt{n}.changes"
    mariadb.execute(f"DROP DATABASE IF EXISTS `{db}`", f"CREATE DATABASE `{db}`")
    mariadb.execute(*schema, database=db)
    spec = SourceSpec(kind="mariadb", port=mariadb.port, user="root", database=db)
    keys = keys or primary_keys(spec, tables)
    create_topic(broker.bootstrap, topic, 3, 1)
    cap = MySqlCapture(spec, tables, lambda _t: topic, broker.bootstrap, name=db)
    with running(cap):
        wait_until(lambda: cap.stats.position, 60, "the snapshot")
        conn = pymysql.connect(**mariadb.connect_args(db))  # type: ignore[arg-type]
        try:
            with conn.cursor() as cur:
                for item in statements:
                    for sql in [item] if isinstance(item, str) else item:
                        cur.execute(sql)
                    conn.commit()
        finally:
            conn.close()
        wait_caught_up(cap, mariadb, 60)
    assert not cap.stats.errors, cap.stats.errors
    return db, topic, keys


def apply_to(url: str, bootstrap: str, topic: str, pipeline: str, tables: list[str], chunk: int = 3) -> Any:
    """Everything in the topic applied in batches of `chunk` records; the tables' rows there."""
    records = read_all(bootstrap, topic)
    with open_target(url) as t:
        e = t.claim(pipeline)
        for batch in records.to_batches(max_chunksize=chunk):
            t.apply(pipeline, e, pa.Table.from_batches([batch]))
        t.apply(pipeline, e, records)  # and the whole log once more, as a replay: changes nothing
        return {table: t.read_rows(table) for table in tables}


@pytest.fixture
def targets(tmp_path: Path, postgres_url: str) -> dict[str, str]:
    return {"sqlite": f"sqlite:///{tmp_path / 'target.db'}", "postgresql": postgres_url}


def assert_targets_equal_source(
    mariadb: LocalMariaDB,
    broker: TestCluster,
    targets: dict[str, str],
    db: str,
    topic: str,
    keys: dict[str, list[str]],
    chunks: tuple[int, ...] = (1, 3, 1000),
) -> None:
    truth = Truth(tables=source_rows(mariadb, db, keys), key_columns=keys)
    for kind, url in targets.items():
        for chunk in chunks if kind == "sqlite" else chunks[-1:]:
            if kind == "sqlite":
                url = url.replace(".db", f"-{chunk}.db")
            got = apply_to(url, broker.bootstrap, topic, db, list(keys), chunk)
            cmp = compare(truth, got)
            assert cmp.ok, f"{kind} (batches of {chunk}): {cmp.summary()}"


def test_one_row_changed_several_times_in_one_statement_ends_at_its_last_image(
    mariadb: LocalMariaDB, broker: TestCluster, targets: dict[str, str]
) -> None:
    """INSERT ... ON DUPLICATE KEY UPDATE with a key repeated in VALUES writes one rows event
    with several images of one row. Before each row change had its own position they all
    carried the event's end position; the collapse kept the first of equals and the target
    ended at an older image. Failing run before the fix:
        sqlite (batches of 1): rows equal 1, missing 0, extra 0, different 1
          kv {"id":1}: source {'id': 1, 'v': 4} target {'id': 1, 'v': 2}"""
    db, topic, keys = run_capture(
        mariadb, broker,
        ["CREATE TABLE kv (id INT PRIMARY KEY, v INT)"],
        ["kv"],
        [
            "INSERT INTO kv VALUES (1, 1), (1, 2), (1, 3), (1, 4) ON DUPLICATE KEY UPDATE v = VALUES(v)",
            "INSERT INTO kv VALUES (2, 1), (3, 1)",
            ["UPDATE kv SET v = 10 WHERE id = 2", "UPDATE kv SET v = 11 WHERE id = 2",
             "UPDATE kv SET v = v + 1 WHERE id = 2"],
        ],
    )  # fmt: skip
    assert_targets_equal_source(mariadb, broker, targets, db, topic, keys)


def test_an_update_that_changes_the_primary_key_leaves_no_old_row(
    mariadb: LocalMariaDB, broker: TestCluster, targets: dict[str, str]
) -> None:
    """An UPDATE that changes the key is a delete of the old key and an insert of the new one.
    Failing run before the fix (the old keys stayed in the target):
        sqlite (batches of 1): rows equal 6, missing 0, extra 4, different 0
          kv {"id":2}: in the target but not the source"""
    db, topic, keys = run_capture(
        mariadb, broker,
        ["CREATE TABLE kv (id INT PRIMARY KEY, v INT)",
         "CREATE TABLE pair (a INT, b VARCHAR(8), v INT, PRIMARY KEY (a, b))",
         "INSERT INTO kv VALUES (1, 1), (2, 2), (3, 3), (4, 4)",
         "INSERT INTO pair VALUES (1, 'x', 1), (2, 'y', 2)"],
        ["kv", "pair"],
        [
            "UPDATE kv SET id = 20 WHERE id = 2",
            "UPDATE kv SET id = id + 100 WHERE id IN (3, 4)",  # several key changes in one event
            "UPDATE kv SET id = 2 WHERE id = 20",  # and back: the old key comes back to life
            ["UPDATE kv SET id = 5 WHERE id = 1", "UPDATE kv SET v = 50 WHERE id = 5",
             "UPDATE kv SET id = 1 WHERE id = 5"],
            "UPDATE pair SET b = 'z' WHERE a = 1",  # part of a composite key
        ],
    )  # fmt: skip
    assert_targets_equal_source(mariadb, broker, targets, db, topic, keys)


def test_truncate_drop_and_rename_are_applied(
    mariadb: LocalMariaDB, broker: TestCluster, targets: dict[str, str]
) -> None:
    """TRUNCATE empties the target table at its position (older upserts cannot bring rows
    back, newer ones land); DROP TABLE empties it; RENAME TABLE moves the rows from the old
    name to the new one; a table created again is captured again. Failing run before the fix:
        sqlite (batches of 1): rows equal 3, missing 0, extra 4, different 0
          kv {"id":1}: in the target but not the source"""
    db, topic, keys = run_capture(
        mariadb, broker,
        ["CREATE TABLE kv (id INT PRIMARY KEY, v INT)",
         "CREATE TABLE gone (id INT PRIMARY KEY, v INT)",
         "CREATE TABLE old_name (id INT PRIMARY KEY, v INT)",
         "INSERT INTO kv VALUES (1, 1), (2, 2), (3, 3)",
         "INSERT INTO gone VALUES (1, 1)",
         "INSERT INTO old_name VALUES (7, 7), (8, 8)"],
        ["kv", "gone", "old_name", "new_name"],
        [
            "UPDATE kv SET v = 20 WHERE id = 2",
            "TRUNCATE TABLE kv",
            "INSERT INTO kv VALUES (3, 30), (4, 40)",
            "DROP TABLE gone",
            "RENAME TABLE old_name TO new_name",
            "UPDATE new_name SET v = 80 WHERE id = 8",
            "CREATE TABLE old_name (id INT PRIMARY KEY, v INT)",
            "INSERT INTO old_name VALUES (9, 9)",
        ],
        keys={t: ["id"] for t in ("kv", "gone", "old_name", "new_name")},
    )  # fmt: skip
    assert_targets_equal_source(mariadb, broker, targets, db, topic, keys)


def test_binlog_row_image_other_than_full_is_refused_with_the_setting_named(mariadb: LocalMariaDB) -> None:
    """With MINIMAL the capture died on a missing key; with NOBLOB unchanged BLOB/TEXT columns
    became NULL in the target. Failing run before the fix: check_source returned normally."""
    mariadb.execute("DROP DATABASE IF EXISTS image1", "CREATE DATABASE image1")
    spec = SourceSpec(kind="mariadb", port=mariadb.port, user="root", database="image1")
    for image in ("MINIMAL", "NOBLOB"):
        mariadb.execute(f"SET GLOBAL binlog_row_image = '{image}'")
        try:
            with pytest.raises(CaptureError, match=f"binlog_row_image is {image}, capture needs FULL"):
                check_source(spec)
        finally:
            mariadb.execute("SET GLOBAL binlog_row_image = 'FULL'")
    check_source(spec)


def test_a_session_writing_minimal_row_images_stops_the_capture_with_the_setting_named(
    mariadb: LocalMariaDB, broker: TestCluster
) -> None:
    """A session may set its own binlog_row_image: the capture sees the partial image in the
    event itself and stops with a clear error instead of writing NULLs over real values."""
    n = next(_n)
    db, topic = f"stmt{n}", f"stmt{n}.changes"
    mariadb.execute(f"CREATE DATABASE `{db}`")
    mariadb.execute("CREATE TABLE kv (id INT PRIMARY KEY, v INT, t TEXT)", database=db)
    create_topic(broker.bootstrap, topic, 3, 1)
    spec = SourceSpec(kind="mariadb", port=mariadb.port, user="root", database=db)
    cap = MySqlCapture(spec, ["kv"], lambda _t: topic, broker.bootstrap, name=db)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            cap.run()
        except BaseException as exc:
            errors.append(exc)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    try:
        wait_until(lambda: cap.stats.position, 60, "the snapshot")
        mariadb.execute(
            "SET SESSION binlog_row_image = 'MINIMAL'",
            "INSERT INTO kv VALUES (1, 1, 'text')",
            "UPDATE kv SET v = 2 WHERE id = 1",
            database=db,
        )
        th.join(60)
    finally:
        cap.stop.set()
        th.join(60)
    assert errors and isinstance(errors[0], CaptureError), errors
    assert "binlog_row_image" in str(errors[0]) and "FULL" in str(errors[0])


TYPES_SCHEMA = [
    "CREATE TABLE typed (id INT PRIMARY KEY, b VARBINARY(16), blob_col BLOB, t TEXT, "
    "d DECIMAL(12, 3), dt DATETIME(3), j JSON, n INT)",
    "CREATE TABLE bkey (k VARBINARY(8) PRIMARY KEY, v INT)",
]


def test_bytes_stay_bytes_and_text_with_nul_is_accepted(
    mariadb: LocalMariaDB, broker: TestCluster, targets: dict[str, str]
) -> None:
    """Binary columns arrive as bytes in both targets (even bytes that happen to be valid
    UTF-8, which used to become text), text stays text; PostgreSQL cannot store U+0000 in text,
    so its target drops that character instead of failing the batch again and again (the
    pipeline stalled forever). Failing run before the fix:
        sqlite: rows equal 0, missing 0, extra 0, different 3
          typed {"id":1}: source {... 'b': b'abc' ...} target {... 'b': 'abc' ...}
        postgresql: psycopg.errors.UntranslatableCharacter: unsupported Unicode escape sequence"""
    db, topic, keys = run_capture(
        mariadb, broker, TYPES_SCHEMA, ["typed", "bkey"],
        [
            "INSERT INTO typed VALUES (1, 'abc', x'00ff10', 'plain', 12.5, '2024-02-29 10:11:12.345', "
            "'{\"a\": [1, 2]}', NULL)",
            "INSERT INTO typed VALUES (2, x'c328', 'text-looking', 'nul\\0inside', -0.001, NULL, NULL, 7)",
            "INSERT INTO typed VALUES (3, NULL, NULL, 'YWJj', NULL, '1999-12-31 23:59:59', '[]', 0)",
            "INSERT INTO bkey VALUES (x'0001', 1), ('text', 2)",
            "UPDATE bkey SET v = 3 WHERE k = x'0001'",
        ],
    )  # fmt: skip
    truth = source_rows(mariadb, db, keys)
    for kind, url in targets.items():
        got = apply_to(url, broker.bootstrap, topic, db, list(keys), 1000)
        assert set(got["typed"]) == set(truth["typed"]), kind
        for key, want in truth["typed"].items():
            row = got["typed"][key]
            assert isinstance(row["b"], (bytes, type(None))) and row["b"] == want["b"], (kind, key, row)
            assert row["blob_col"] == want["blob_col"], (kind, key, row)
            expected_text = want["t"].replace("\x00", "") if kind == "postgresql" else want["t"]
            assert row["t"] == expected_text, (kind, key, row)
            assert (row["d"] is None) == (want["d"] is None) and (
                want["d"] is None or float(row["d"]) == float(want["d"])
            ), (kind, key, row)
        assert {bytes(r["k"]) for r in got["bkey"].values()} == {b"\x00\x01", b"text"}, kind
        assert sorted(r["v"] for r in got["bkey"].values()) == [2, 3], kind


def test_a_table_read_again_cut_short_by_the_next_ddl_starts_over(
    mariadb: LocalMariaDB, make_cluster: Callable[..., TestCluster], caplog: pytest.LogCaptureFixture
) -> None:
    """A column type change makes the capture read the table again in a consistent snapshot; a
    second ALTER landing after that snapshot began (two ALTERs run back to back) makes InnoDB
    refuse the read (error 1412, "Table definition has changed, please retry transaction").
    The read starts over in a new snapshot and the capture goes on: it reaches the server's
    position with every row of the table, in its newest shape, in the log. Before, the error
    ended the capture (its task was started again)."""
    db = "read_again_cut"
    topic = f"{db}.changes"
    bootstrap = make_cluster(1).bootstrap
    create_topic(bootstrap, topic, 1, 1)
    mariadb.execute(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}")
    mariadb.execute(
        "CREATE TABLE t (id INT PRIMARY KEY, v INT)",
        *(f"INSERT INTO t VALUES ({i}, {i})" for i in range(1, 51)),
        database=db,
    )
    spec = SourceSpec(kind="mariadb", port=mariadb.port, user="root", database=db)
    cap = MySqlCapture(spec, ["t"], lambda _t: topic, bootstrap, name=db, stop=threading.Event())
    original = cap._begin_consistent_snapshot
    cut: list[str] = []

    def snapshot_then_alter(cur: Any) -> Any:
        began = original(cur)
        if not cut:  # once: the next ALTER lands after this snapshot began
            cut.append("ALTER TABLE t MODIFY v BIGINT")
            mariadb.execute(cut[0], database=db)
        return began

    with running(cap) as running_cap:
        wait_until(lambda: running_cap.stats.position, 60, "the capture streaming")
        cap._begin_consistent_snapshot = snapshot_then_alter  # type: ignore[method-assign]
        with caplog.at_level(logging.INFO, logger="sluice.capture"):
            mariadb.execute("ALTER TABLE t MODIFY v INT UNSIGNED", database=db)
            wait_caught_up(running_cap, mariadb, 90)
    assert not cap.stats.errors, cap.stats.errors
    assert cut, "the read again never began"
    assert "event=table_read_again_retry table=t attempt=1" in caplog.text
    assert caplog.text.count("event=table_read_again table=t") >= 1
    records = read_all(bootstrap, topic, 1)
    snapshots = [orjson.loads(v) for v in records.column("value").to_pylist()]
    reread = {s["key"]["id"] for s in snapshots if s["op"] == "r"}
    assert reread == set(range(1, 51)), sorted(set(range(1, 51)) - reread)[:10]
