"""Every PostgreSQL type data teams use, at its edge values, through both capture paths (the
snapshot and the slot's stream, inserts and updates) into a PostgreSQL target, compared with the
source's own text of each value; and the same records into SQLite, every row there."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from sluice.ops.postgres import LocalPostgres
from sluice.sync.sources.postgresql import PgCapture
from sluice.sync.targets import open_target
from sluice.sync.tasks import SourceSpec
from tests.integration.test_mysql_capture import read_all
from tests.integration.test_pg_capture import caught_up, server_lsn
from tests.integration.test_pipeline import create_topic
from tests.support.cluster import TestCluster, wait_until
from tests.support.pg_source import connect

#: column -> (its type, edge values as SQL literals). The target's type is the source's except
#: where sync/types.py says (money, enum, hstore, citext), and `SOURCE_TEXT` says how the source's
#: text compares then.
MATRIX: dict[str, tuple[str, list[str]]] = {
    "i2": ("smallint", ["-32768", "32767", "0"]),
    "i4": ("integer", ["-2147483648", "2147483647"]),
    "i8": ("bigint", ["-9223372036854775808", "9223372036854775807"]),
    "num": ("numeric", ["'NaN'", "'Infinity'", "'-Infinity'", "'0.000000000000000000000000000001'",
                        "'-123456789012345678901234567890.123456789'", "'-0'", "'1e20'"]),
    "num103": ("numeric(10,3)", ["'-0.001'", "'1234567.891'", "0"]),
    "f4": ("real", ["'NaN'", "'Infinity'", "'-Infinity'", "'1.1'", "'3.4028235e38'", "'1e-45'", "'-0'"]),
    "f8": ("double precision", ["'NaN'", "'-Infinity'", "'1.7976931348623157e308'", "'5e-324'", "'-0'",
                                "'0.1'", "'123456789.123456789'"]),
    "cash": ("money", ["'-92233720368547758.08'", "'92233720368547758.07'", "'0'", "'-1.5'"]),
    "flag": ("boolean", ["true", "false"]),
    "txt": ("text", ["''", "'ünïcødé 🎉 日本'", "E'line\\nbreak\\ttab'", "'\\x41 \"q\" ''s'''", "'NULL'"]),
    "vc": ("varchar(5)", ["'abcde'", "' '"]),
    "ch": ("char(5)", ["'ab'", "''"]),
    "bin": ("bytea", ["'\\x00ff10'", "''", "'\\x5c78'"]),
    "uid": ("uuid", ["'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'"]),
    "js": ("json", ["'{\"b\":1,  \"a\": [1, 2.50], \"a\": 3}'", "'null'", "'\"\\u00e9\"'"]),
    "jb": ("jsonb", ["'{\"b\":1,  \"a\": [1, 2.50], \"a\": 3}'", "'[]'", "'1e-5'"]),
    "d": ("date", ["'infinity'", "'-infinity'", "'4713-01-01 BC'", "'5874897-12-31'", "'2000-02-29'"]),
    "t": ("time", ["'24:00:00'", "'00:00:00.000001'"]),
    "t3": ("time(3)", ["'12:34:56.789'"]),
    "tz": ("timetz", ["'23:59:59.999999+15:59'", "'00:00:00-15:59'"]),
    "ts": ("timestamp", ["'infinity'", "'-infinity'", "'4713-01-01 00:00:00 BC'",
                         "'294276-12-31 23:59:59.999999'", "'2024-02-29 12:34:56.789012'"]),
    "ts3": ("timestamp(3)", ["'2020-01-01 00:00:00.123'", "'1970-01-01'"]),
    "tstz": ("timestamptz", ["'infinity'", "'2024-03-31 02:30:00 Europe/Berlin'",
                             "'0001-01-01 00:00:00+00 BC'", "'1901-12-13 20:45:52+00'"]),
    "iv": ("interval", ["'-178000000 years'", "'178000000 years'", "'1 mon -1 day 00:00:00.000001'",
                        "'-1 days +23:59:59'"]),
    "ivym": ("interval year to month", ["'-1 year -2 mons'"]),
    "ia": ("integer[]", ["'{}'", "'{{1,2},{3,4}}'", "'{NULL,1}'", "'[0:1]={1,2}'"]),
    "ta": ("text[]", ["ARRAY['a,b', '\"q\" \\', NULL, '', 'NULL']"]),
    "feel": ("mood", ["'sad'", "'happy'"]),
    "feels": ("mood[]", ["'{sad,happy}'", "'{}'"]),
    "pct": ("pct", ["'123.45'", "'-0.5'"]),
    "ip": ("inet", ["'192.168.0.1/24'", "'::1'", "'10.0.0.1'"]),
    "net": ("cidr", ["'10.0.0.0/8'", "'2001:4f8:3:ba::/64'"]),
    "mac": ("macaddr", ["'08:00:2b:01:02:03'"]),
    "mac8": ("macaddr8", ["'08:00:2b:01:02:03:04:05'"]),
    "b4": ("bit(4)", ["'1010'", "'0000'"]),
    "vb": ("varbit(8)", ["'1'", "''"]),
    "r4": ("int4range", ["'[1,5)'", "'empty'", "'(,)'", "'(1,2]'"]),
    "rn": ("numrange", ["'[1.5,2.5]'", "'(,0)'"]),
    "rts": ("tstzrange", ["'[2020-01-01 00:00+00,2020-01-02 00:00+00)'"]),
    "rd": ("daterange", ["'[2020-01-01,infinity)'"]),
    "mr": ("int4multirange", ["'{[1,3),[5,7)}'", "'{}'"]),
    "pt": ("point", ["'(1.5,-2)'", "'(1e300,-0)'"]),
    "ln": ("line", ["'{1,-1,0}'"]),
    "ls": ("lseg", ["'[(0,0),(1,1)]'"]),
    "bx": ("box", ["'(1,1),(0,0)'"]),
    "pa": ("path", ["'[(0,0),(1,1),(2,0)]'", "'((0,0),(1,1))'"]),
    "pg": ("polygon", ["'((0,0),(1,1),(1,0))'"]),
    "ci": ("circle", ["'<(0,0),1.5>'"]),
    "x": ("xml", ["'<a b=\"1\">x</a>'"]),
    "tv": ("tsvector", ["'a:1 fat:2 cat:3'"]),
    "lsn": ("pg_lsn", ["'16/B374D848'"]),
    "hs": ("hstore", ["'a=>1, \"b c\"=>NULL'"]),
    "ct": ("citext", ["'MiXeD'"]),
}  # fmt: skip

#: how the source's value reads as the target's text, where the target's type differs
SOURCE_TEXT = {"cash": '"cash"::numeric::text'}

SETUP = """
CREATE EXTENSION IF NOT EXISTS hstore;
CREATE EXTENSION IF NOT EXISTS citext;
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN pct AS numeric(5, 2) CHECK (VALUE > -1000);
"""


def _rows(offset: int) -> list[tuple[int, str, str]]:
    """(id, column, literal): one row per edge value, that column set, the others NULL."""
    out = []
    n = offset
    for col, (_type, values) in MATRIX.items():
        for v in values:
            n += 1
            out.append((n, col, v))
    return out


def _insert(conn: Any, rows: list[tuple[int, str, str]]) -> None:
    with conn.transaction():
        for i, col, v in rows:
            conn.execute(f'INSERT INTO matrix (id, "{col}") VALUES ({i}, {v})')  # type: ignore[arg-type]


def test_every_type_and_edge_value_arrives_as_the_source_holds_it(
    postgres: LocalPostgres, make_cluster: Callable[..., TestCluster], postgres_url: str, tmp_path: Path
) -> None:
    cluster = make_cluster(1)
    create_topic(cluster.bootstrap, "m.changes", 3, 1)
    url = postgres.create_database("pgmatrix")
    with connect(url) as conn:
        conn.execute(SETUP)
        cols = ", ".join(f'"{c}" {t}' for c, (t, _) in MATRIX.items())
        conn.execute(f"CREATE TABLE matrix (id integer PRIMARY KEY, {cols})")  # type: ignore[arg-type]
        conn.execute("INSERT INTO matrix (id) VALUES (0)")  # every column NULL
        snap = _rows(0)
        _insert(conn, snap)  # read by the snapshot
    spec = SourceSpec(kind="postgresql", port=postgres.port, user="postgres", database="pgmatrix")
    cap = PgCapture(spec, ["matrix"], lambda _t: "m.changes", cluster.bootstrap, name="matrix", heartbeat_s=1)
    th = threading.Thread(target=cap.run, daemon=True)
    th.start()
    try:
        wait_until(lambda: cap.stats.snapshot_rows == len(snap) + 1 or cap.stats.errors, 120, "the snapshot")
        with connect(url) as conn:
            _insert(conn, _rows(10_000))  # streamed inserts
            # streamed updates: every other snapshot row gets the next value of its column (the
            # others keep the value the snapshot read)
            with conn.transaction():
                for i, col, _v in snap[::2]:
                    values = MATRIX[col][1]
                    later = values[(values.index(_v) + 1) % len(values)]
                    conn.execute(f'UPDATE matrix SET "{col}" = {later} WHERE id = {i}')  # type: ignore[arg-type]
        end = server_lsn(url)
        wait_until(lambda: caught_up(cap, end) or cap.stats.errors, 120, "the stream")
    finally:
        cap.stop.set()
        th.join(60)
    assert not cap.stats.errors, cap.stats.errors

    records = read_all(cluster.bootstrap, "m.changes")
    for target_url in (postgres_url, f"sqlite:///{tmp_path / 'matrix.db'}"):
        with open_target(target_url) as t:
            e = t.claim("matrix")
            for batch in records.to_batches(max_chunksize=40):
                t.apply("matrix", e, pa.Table.from_batches([batch]))
    with open_target(f"sqlite:///{tmp_path / 'matrix.db'}") as t:
        assert len(t.read_rows("matrix")) == len(snap) * 2 + 1

    source_sel = ", ".join(SOURCE_TEXT.get(c, f'"{c}"::text') for c in MATRIX)
    target_sel = ", ".join(f'"{c}"::text' for c in MATRIX)
    with connect(url) as conn:
        want = {r[0]: r[1:] for r in conn.execute(f"SELECT id, {source_sel} FROM matrix")}  # type: ignore[arg-type]
    with connect(postgres_url) as conn:
        got = {r[0]: r[1:] for r in conn.execute(f"SELECT id, {target_sel} FROM matrix")}  # type: ignore[arg-type]
        types = dict(
            conn.execute(
                "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                "WHERE attrelid = 'matrix'::regclass AND attnum > 0 AND NOT attisdropped"
            ).fetchall()
        )
    assert set(got) == set(want)
    different = [
        (col, want[i][n], got[i][n])
        for i in sorted(want)
        for n, col in enumerate(MATRIX)
        if want[i][n] != got[i][n]
    ]
    assert not different, different[:20]
    # the target's column types: the source's own, but where the mapping says otherwise
    special = {"cash": "numeric(19,2)", "feel": "text", "feels": "text[]", "pct": "numeric(5,2)",
               "hs": "text", "ct": "text", "vb": "bit varying(8)", "f8": "double precision",
               "tstz": "timestamp with time zone", "ts": "timestamp without time zone",
               "ts3": "timestamp(3) without time zone", "t": "time without time zone",
               "t3": "time(3) without time zone", "tz": "time with time zone", "vc": "character varying(5)",
               "ch": "character(5)", "i2": "smallint", "i4": "integer", "i8": "bigint", "f4": "real",
               "flag": "boolean", "num103": "numeric(10,3)"}  # fmt: skip
    for col, (source_type, _) in MATRIX.items():
        assert types[col] == special.get(col, source_type), (col, types[col])
