"""Every column type and its edge values, captured from MariaDB (a server whose time zone is not
UTC) by the snapshot and by the binlog, applied to PostgreSQL (by the driver and staged by the
executors' path) and to SQLite: each target value equals the database's own answer for the
source value (sync/compare.py's reference reading: HEX, BIN, UNIX_TIMESTAMP, the server's text),
and a row that came by snapshot equals the same row that came by the binlog (invariant I8).

Three tables with the same columns (chaos/type_catalog.py) and the same rows: `snap` written
before the capture starts (the snapshot reads it), `ins` inserted after (binlog inserts), `upd`
inserted with the rows in reverse order and then updated to them (binlog updates, both images
decoded). Then one UPDATE of only a BIT column, on each table. The PostgreSQL target meets the
tables in both orders: the snapshot's rows first, and (a second target, applied with the binlog
tables first) the binlog's first; each creates the columns' types.

Able to fail with each fix reverted (the runs are in the commit that added this test)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pymysql
import pytest

from sluice.chaos import type_catalog as cat
from sluice.ops.mariadb import LocalMariaDB
from sluice.sync.compare import TableSchema, compare_table, table_schema
from sluice.sync.sources.mysql import MySqlCapture
from sluice.sync.sources.mysql_base import column_types
from sluice.sync.targets import open_target
from sluice.sync.targets.base import Target
from sluice.sync.tasks import SourceSpec
from tests.integration.test_mysql_capture import read_all, running, wait_caught_up
from tests.integration.test_pipeline import create_topic
from tests.support.cluster import TestCluster, wait_until
from tests.support.staging import apply_staged

TABLES = ("snap", "ins", "upd")
BIT_ONLY = "UPDATE `{table}` SET c_bit5 = b'11010' WHERE id = 0"


@pytest.fixture(scope="module")
def zoned_mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMariaDB]:
    """A MariaDB of its own whose time zone is not UTC: TIMESTAMPs must still arrive in UTC."""
    server = LocalMariaDB(
        tmp_path_factory.mktemp("zoned-mariadb"), extra_args=(f"--default-time-zone={cat.TIMESTAMP_ZONE}",)
    )
    server.start()
    try:
        yield server
    finally:
        server.remove()


@pytest.fixture(scope="module")
def captured(
    zoned_mariadb: LocalMariaDB, zookeeper: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[SourceSpec, TestCluster, pa.Table]]:
    """The three tables captured into one topic: (source, broker, every record of the topic)."""
    db, topic = "matrix", "matrix.changes"
    server = zoned_mariadb
    server.execute(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}")
    server.execute(*(cat.create_table(t) for t in TABLES), database=db)
    rows = cat.rows()
    write = _writer(server, db)
    write([cat.insert("snap", i, row) for i, row in enumerate(rows)])
    cluster = TestCluster(zookeeper, tmp_path_factory.mktemp("matrix-broker"), 1)
    try:
        create_topic(cluster.bootstrap, topic, 3, 1)
        spec = SourceSpec(kind="mariadb", port=server.port, user="root", database=db)
        cap = MySqlCapture(spec, list(TABLES), lambda _t: topic, cluster.bootstrap, name=db)
        with running(cap):
            wait_until(lambda: cap.stats.position, 60, "the snapshot")
            write([cat.insert("ins", i, row) for i, row in enumerate(rows)])
            nulls = {c: "NULL" for c in rows[0]}
            write([cat.insert("upd", i, rows[len(rows) - 1 - i]) for i in range(len(rows))])
            write([cat.update("upd", i, nulls) for i in range(len(rows))])
            write([cat.update("upd", i, row) for i, row in enumerate(rows)])
            write([BIT_ONLY.format(table=t) for t in TABLES])
            wait_caught_up(cap, server, 60)
        assert not cap.stats.errors, cap.stats.errors
        yield spec, cluster, read_all(cluster.bootstrap, topic)
    finally:
        cluster.down()


def _writer(server: LocalMariaDB, db: str) -> Callable[[list[str]], None]:
    def write(statements: list[str]) -> None:
        conn = pymysql.connect(**server.connect_args(db), charset="utf8mb4")  # type: ignore[arg-type]
        try:
            with conn.cursor() as cur:
                cur.execute(f"SET SESSION sql_mode = '{cat.SESSION_SQL_MODE}'")
                for sql in statements:
                    cur.execute(sql)
            conn.commit()
        finally:
            conn.close()

    return write


def source_reference(spec: SourceSpec) -> dict[str, tuple[TableSchema, list[dict[str, Any]]]]:
    """Each table's comparison, and its rows as the database itself gives every value."""
    types = column_types(spec, list(TABLES))
    assert types["snap"]["c_json"] == "json", "MariaDB's JSON (LONGTEXT + json_valid) is detected"
    conn = pymysql.connect(host=spec.host, port=spec.port, user=spec.user, database=spec.database,
                           cursorclass=pymysql.cursors.DictCursor)  # fmt: skip
    out = {}
    try:
        with conn.cursor() as cur:
            for table in TABLES:
                schema = table_schema(table, types[table], ["id"])
                cur.execute(schema.reference_select())
                out[table] = (schema, list(cur.fetchall()))
    finally:
        conn.close()
    return out


def target_rows(url: str, table: str) -> list[dict[str, Any]]:
    """A target table's rows as its driver gives them; PostgreSQL's jsonb as its text (the
    driver would read JSON null and SQL NULL both as None)."""
    if url.startswith(("sqlite", "mysql")):
        with open_target(url) as t:
            return list(t.read_rows(table).values())
    with psycopg.connect(url) as conn:
        cols = conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
            "%s::regclass AND attnum > 0 AND NOT attisdropped AND attname <> '_sluice_pos' ORDER BY attnum",
            (f'"{table}"',),
        ).fetchall()
        sel = ", ".join(f'"{c}"::text' if t == "jsonb" else f'"{c}"' for c, t in cols)
        rows = conn.execute(f'SELECT {sel} FROM "{table}"').fetchall()
    return [dict(zip([c for c, _ in cols], r, strict=True)) for r in rows]


def apply_in_order(target: Target, records: pa.Table, first: tuple[str, ...], staged: bool) -> None:
    """The records applied in batches of 7, the tables of `first` before the others: each part
    under a pipeline of its own (the log's offsets of one table's records are not all below the
    other tables': the BIT-only update of `snap` comes last)."""
    rest = tuple(t for t in TABLES if t not in first)
    for n, tables in enumerate((first, rest)):
        part = records.filter(pc.is_in(_tables_of(records), pa.array(tables)))
        pipeline = f"matrix-{n}"
        epoch = target.claim(pipeline)
        for batch in part.to_batches(max_chunksize=7):
            chunk = pa.Table.from_batches([batch], schema=records.schema)
            if staged:
                apply_staged(target, pipeline, epoch, chunk)
            else:
                target.apply(pipeline, epoch, chunk)


def _tables_of(records: pa.Table) -> pa.Array:
    import orjson

    return pa.array([orjson.loads(v)["table"] for v in records["value"].to_pylist()], pa.string())


def check(url: str, spec: SourceSpec) -> list[str]:
    """Every table of the target against the source's own answers, and the snapshot's rows
    against the binlog's, exactly; the problems found."""
    source = source_reference(spec)
    dialect = url.split(":", 1)[0]
    problems: list[str] = []
    got = {table: target_rows(url, table) for table in TABLES}
    for table in TABLES:
        result = compare_table(*source[table], got[table], dialect)
        problems += [f"{table} {line}" for line in _lines(result)]
    by_key = {t: {r["id"]: r for r in got[t]} for t in TABLES}
    for table in ("ins", "upd"):
        for key, row in by_key["snap"].items():
            other = by_key[table].get(key)
            if other != row:
                diff = {c: (v, (other or {}).get(c)) for c, v in row.items() if (other or {}).get(c) != v}
                problems.append(f"snapshot row {key} != {table} row: {diff}")
    return problems


def _lines(result: Any) -> list[str]:
    out = [f"missing {k}" for k in result.missing] + [f"extra {k}" for k in result.extra]
    for key, cols in result.different:
        out += [f"{key} {c}: source {s} target {g}" for c, s, g in cols]
    return out


@pytest.mark.parametrize("first", [("snap",), ("ins", "upd")], ids=["snapshot-first", "binlog-first"])
@pytest.mark.parametrize("kind", ["sqlite", "postgresql", "postgresql-staged", "mysql", "mysql-staged"])
def test_every_type_arrives_as_the_source_holds_it_by_snapshot_and_by_binlog(
    captured: tuple[SourceSpec, TestCluster, pa.Table],
    tmp_path: Path,
    request: pytest.FixtureRequest,
    kind: str,
    first: tuple[str, ...],
) -> None:
    spec, _, records = captured
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'matrix.db'}"
    else:
        url = request.getfixturevalue("mysql_url" if kind.startswith("mysql") else "postgres_url")
    with open_target(url) as target:
        apply_in_order(target, records, first, staged=kind.endswith("-staged"))
        merges = dict(getattr(target, "merges", {}))
    if kind == "mysql-staged":  # in SQL, but ENUM's '' from the driver
        assert set(merges) <= {"sql", "sql-rows", "driver-rows"} and merges["sql-rows"], merges
    problems = check(url, spec)
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:60])


def test_the_target_columns_take_the_mappings_types_whatever_the_first_rows_hold(
    captured: tuple[SourceSpec, TestCluster, pa.Table], postgres_url: str, tmp_path: Path
) -> None:
    """A table created from a batch whose only row is the all-NULL one still gets every column's
    type from the source's schema (it became text before: INT UNSIGNED, BIGINT, FLOAT...)."""
    from sluice.sync.types import postgres_type, sqlite_type

    spec, _, records = captured
    types = column_types(spec, ["snap"])["snap"]
    nulls = len(cat.rows()) - 1
    only = records.filter(pc.is_in(_tables_of(records), pa.array(["ins"])))
    import orjson

    null_row = only.filter(
        pa.array([orjson.loads(v)["key"] == {"id": nulls} for v in only["value"].to_pylist()])
    )
    assert null_row.num_rows >= 1
    for url in (postgres_url, f"sqlite:///{tmp_path / 'nulls.db'}"):
        with open_target(url) as target:
            target.apply("nulls", target.claim("nulls"), null_row)
        if url.startswith("sqlite"):
            import sqlite3

            with sqlite3.connect(url[len("sqlite:///") - 1 :]) as conn:
                have = {r[1]: r[2] for r in conn.execute('PRAGMA table_info("ins")')}
            want = {c: sqlite_type(t) for c, t in types.items()}
        else:
            with psycopg.connect(url) as conn:
                have = dict(conn.execute(
                    "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                    "'ins'::regclass AND attnum > 0 AND attname <> '_sluice_pos'"
                ).fetchall())  # fmt: skip
            want = {c: postgres_type(t) for c, t in types.items()}
        assert have.pop("_sluice_pos", None) is not None or url.startswith("postgres")
        assert have == want


def test_mysql_to_mysql_keeps_each_columns_type(
    captured: tuple[SourceSpec, TestCluster, pa.Table],
    zoned_mariadb: LocalMariaDB,
    mysql_url: str,
    mariadb: LocalMariaDB,
) -> None:
    """MariaDB to the MySQL target: each column of a table the target created has the source
    column's own type (an integer's display width aside, which MySQL 8 dropped), read from both
    servers' information_schema."""
    import re

    spec, _, records = captured
    with open_target(mysql_url) as target:
        apply_in_order(target, records, ("snap",), staged=False)
    query = (
        "SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = '{db}' "
        "AND TABLE_NAME = 'snap' AND COLUMN_NAME <> '_sluice_pos'"
    )
    width = re.compile(r"^((?:tiny|small|medium|big)?int)\(\d+\)")
    source = {c: width.sub(r"\1", str(t)) for c, t in zoned_mariadb.execute(query.format(db=spec.database))}
    target = {
        c: width.sub(r"\1", str(t)) for c, t in mariadb.execute(query.format(db=mysql_url.rsplit("/", 1)[1]))
    }
    assert len(source) > 30 and target == source
