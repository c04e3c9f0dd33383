"""The capture's row decoder (sync/sources/binlog_rows.py) against MariaDB itself: a seeded
random workload over every column type (NULLs, zero dates, negative times and decimals,
multi-byte and latin1 text, bytes, enums, sets, BIT, JSON, geometry, values at the types'
limits) of inserts, updates and deletes, decoded from MariaDB's own rows events; the rows the
events leave must equal what the database gives for the table (sync/compare.py's reference
reading), value by value. Only partial row images go to the library."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pymysql
import pytest

from sluice.ops.mariadb import LocalMariaDB
from sluice.sync.compare import compare_table, table_schema
from sluice.sync.sources.binlog_rows import RowDecoder
from sluice.sync.sources.mysql_base import column_types
from sluice.sync.tasks import SourceSpec

COLUMNS: dict[str, tuple[str, Callable[[random.Random], Any]]] = {
    "a": ("TINYINT", lambda r: r.randint(-128, 127)),
    "b": ("TINYINT UNSIGNED", lambda r: r.randint(0, 255)),
    "c": ("SMALLINT", lambda r: r.randint(-32768, 32767)),
    "d": ("SMALLINT UNSIGNED", lambda r: r.randint(0, 65535)),
    "e": ("MEDIUMINT", lambda r: r.randint(-(2**23), 2**23 - 1)),
    "f": ("MEDIUMINT UNSIGNED", lambda r: r.randint(0, 2**24 - 1)),
    "g": ("INT", lambda r: r.randint(-(2**31), 2**31 - 1)),
    "h": ("INT UNSIGNED", lambda r: r.randint(0, 2**32 - 1)),
    "i": ("BIGINT UNSIGNED", lambda r: r.randint(0, 2**64 - 1)),
    "j": ("FLOAT", lambda r: r.uniform(-1e6, 1e6)),
    "k": ("DOUBLE", lambda r: r.uniform(-1e300, 1e300)),
    "l": ("DECIMAL(12,2)", lambda r: f"{r.randint(-(10**10) + 1, 10**10 - 1) / 100:.2f}"),
    "m": (
        "DECIMAL(30,10)",
        lambda r: f"{r.choice('-+')}{r.randint(0, 10**20 - 1)}.{r.randint(0, 10**10 - 1):010d}",
    ),
    "n": ("DECIMAL(5,0)", lambda r: r.randint(-99999, 99999)),
    "o": ("DECIMAL(19,9)", lambda r: f"-{r.randint(0, 10**10 - 1)}.{r.randint(0, 10**9 - 1):09d}"),
    "p": ("DECIMAL(10,4) UNSIGNED", lambda r: f"{r.randint(0, 999999)}.{r.randint(0, 9999):04d}"),
    "q": ("VARCHAR(10)", lambda r: "".join(r.choice("abcé€😀\x00'") for _ in range(r.randint(0, 10)))),
    "s": ("VARCHAR(300)", lambda r: "x" * r.randint(0, 300)),
    "t": ("CHAR(5)", lambda r: r.choice(["", "ab", "abcde"])),
    "u": ("TEXT", lambda r: "héllo" * r.randint(0, 50)),
    "v": ("MEDIUMTEXT", lambda r: "m" * r.randint(0, 70_000)),
    "w": ("VARCHAR(20) CHARACTER SET latin1", lambda r: "çà" * r.randint(0, 5)),
    "x": ("BLOB", lambda r: r.randbytes(r.randint(0, 40))),
    "y": ("VARBINARY(20)", lambda r: r.randbytes(r.randint(0, 20))),
    "z": ("BINARY(4)", lambda r: r.randbytes(4)),
    "aa": ("LONGBLOB", lambda r: r.randbytes(r.randint(0, 300))),
    "ab": (
        "DATETIME",
        lambda r: r.choice(
            ["0000-00-00 00:00:00", "1000-01-01 00:00:00", "2024-02-29 23:59:59", "9999-12-31 23:59:59"]
        ),
    ),
    "ac": (
        "DATETIME(6)",
        lambda r: f"2023-0{r.randint(1, 9)}-1{r.randint(0, 9)} 12:34:56.{r.randint(0, 999999):06d}",
    ),
    "ad": ("DATETIME(3)", lambda r: f"2023-05-06 01:02:03.{r.randint(0, 999):03d}"),
    "ae": ("DATETIME(1)", lambda r: f"2023-05-06 01:02:03.{r.randint(0, 9)}"),
    "af": ("TIMESTAMP(2) NULL", lambda r: f"2020-01-01 00:00:0{r.randint(1, 9)}.{r.randint(0, 99):02d}"),
    "ag": ("TIMESTAMP NULL", lambda r: f"2037-12-31 23:59:{r.randint(10, 59)}"),
    "ah": ("DATE", lambda r: r.choice(["0000-00-00", "2020-02-29", "1000-01-01", "9999-12-31"])),
    "ai": (
        "TIME(4)",
        lambda r: (
            f"{r.choice(['-', ''])}{r.randint(0, 838)}:{r.randint(0, 59):02d}:"
            f"{r.randint(0, 59):02d}.{r.randint(0, 9999):04d}"
        ),
    ),
    "aj": (
        "TIME",
        lambda r: f"{r.choice(['-', ''])}{r.randint(0, 838)}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}",
    ),
    "ak": ("TIME(5)", lambda r: f"-00:00:00.{r.randint(0, 99999):05d}"),
    "al": ("YEAR", lambda r: r.choice([1901, 2155, 2000, 0])),
    "am": ("ENUM('x','y','zz')", lambda r: r.choice(["x", "y", "zz", ""])),
    "an": ("SET('p','q','r')", lambda r: r.choice(["", "p", "p,q", "q,r", "p,q,r"])),
    "ao": ("BIT(13)", lambda r: r.randint(0, 2**13 - 1)),
    "ap": ("BIT(64)", lambda r: r.randint(0, 2**64 - 1)),
    "aq": ("JSON", lambda r: r.choice(['{"a": [1, 2.5, null]}', "[]", '"s"', "true", '{"u": "\\u00e9"}'])),
    "ar": (
        "TIME(6)",
        lambda r: (
            f"-{r.randint(0, 838)}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}.{r.randint(0, 999999):06d}"
        ),
    ),
    "as_": ("FLOAT", lambda r: r.choice([1.1, 3.4028234663852886e38, 1.17549435e-38, 0.1, -2.5e-40])),
}
GEOMETRY = ("POINT(1 2)", "LINESTRING(0 0, 1 1, 2 0)", "POLYGON((0 0,1 0,1 1,0 0))")


def binlog_events(server: LocalMariaDB, start: tuple[str, int], database: str) -> Any:
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    return BinLogStreamReader(
        connection_settings={"host": "127.0.0.1", "port": server.port, "user": "root", "password": ""},
        server_id=4000 + random.randrange(10_000), log_file=start[0], log_pos=start[1], resume_stream=True,
        blocking=False, only_schemas=[database], is_mariadb=False,
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
    )  # fmt: skip


def decoded_rows(server: LocalMariaDB, start: tuple[str, int], database: str) -> tuple[dict[Any, Any], int]:
    """The rows the rows events since `start` leave, by primary key (each event's images applied
    in order), decoded by the capture's decoder; and how many images were decoded."""
    rows: dict[Any, dict[str, Any]] = {}
    images = 0
    decoder = RowDecoder()
    stream = binlog_events(server, start, database)
    try:
        for event in stream:
            decoded = decoder.decode_rows(event)
            assert decoded is not None, "a full row image goes to the capture's decoder"
            for row in decoded:
                images += 1
                if "after_values" in row:
                    rows.pop(row["before_values"]["id"], None)
                    rows[row["after_values"]["id"]] = row["after_values"]
                elif type(event).__name__ == "DeleteRowsEvent":
                    rows.pop(row["values"]["id"], None)
                else:
                    rows[row["values"]["id"]] = row["values"]
    finally:
        stream.close()
    return rows, images


@pytest.mark.parametrize("seed", [1, 2])
def test_the_row_plan_decodes_every_type_as_mariadb_holds_it(mariadb: LocalMariaDB, seed: int) -> None:
    db = f"rows_{seed}"
    rnd = random.Random(seed)
    names = list(COLUMNS)
    mariadb.execute(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}")
    mariadb.execute(
        f"CREATE TABLE t (id BIGINT PRIMARY KEY, {', '.join(f'{n} {COLUMNS[n][0]}' for n in names)}, "
        "geo GEOMETRY)",
        database=db,
    )
    file, pos = mariadb.execute("SHOW MASTER STATUS")[0][:2]
    conn = pymysql.connect(**mariadb.connect_args(db), autocommit=True, charset="utf8mb4")  # type: ignore[arg-type]
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_mode = ''")  # zero dates, as old applications write them
            marks = ", ".join(["%s"] * (len(names) + 1))
            for batch in range(25):
                rows = [
                    [batch * 20 + i]
                    + [None if rnd.random() < 0.15 else COLUMNS[n][1](rnd) for n in names]
                    + [rnd.choice(GEOMETRY)]
                    for i in range(20)
                ]
                cur.executemany(
                    f"INSERT INTO t (id, {', '.join(names)}, geo) VALUES ({marks}, ST_GeomFromText(%s))", rows
                )
                cur.execute(
                    f"UPDATE t SET g = g + 1, q = CONCAT(IFNULL(q, ''), 'u'), ac = NOW(6), an = NULL, "
                    f"ao = ao ^ 1 WHERE id % 3 = {batch % 3}"
                )
                cur.execute(f"UPDATE t SET id = id + 100000 WHERE id = {batch * 20 + 1}")  # a key change
                cur.execute(f"DELETE FROM t WHERE id % 7 = {batch % 7} AND id < {batch * 20}")
    finally:
        conn.close()
    decoded, images = decoded_rows(mariadb, (str(file), int(pos)), db)
    assert images > 500  # inserts, updates and deletes, many per event
    spec = SourceSpec(kind="mariadb", port=mariadb.port, user="root", database=db)
    schema = table_schema("t", column_types(spec, ["t"])["t"], ["id"])
    conn = pymysql.connect(**mariadb.connect_args(db), cursorclass=pymysql.cursors.DictCursor)  # type: ignore[arg-type]
    try:
        with conn.cursor() as cur:
            cur.execute(schema.reference_select())
            source = list(cur.fetchall())
    finally:
        conn.close()
    result = compare_table(schema, source, decoded.values(), "sqlite")
    problems = [f"{k} {c}: MariaDB {s} decoded {g}" for k, cols in result.different for c, s, g in cols]
    assert (result.missing, result.extra, problems[:20]) == ([], [], [])


def test_only_partial_images_go_to_the_library(mariadb: LocalMariaDB) -> None:
    db = "rows_fallback"
    mariadb.execute(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}")
    mariadb.execute(
        "CREATE TABLE j (id INT PRIMARY KEY, doc JSON, b BIT(10))",
        "CREATE TABLE g (id INT PRIMARY KEY, shape GEOMETRY)",
        "CREATE TABLE m (id INT PRIMARY KEY, a INT, b VARCHAR(10))",
        database=db,
    )
    file, pos = mariadb.execute("SHOW MASTER STATUS")[0][:2]
    mariadb.execute(
        """INSERT INTO j VALUES (1, '{"a": [1, 2]}', b'1010101010')""",
        "INSERT INTO g VALUES (1, ST_GeomFromText('POINT(1 1)'))",
        "INSERT INTO m VALUES (1, 1, 'x')",
        "SET SESSION binlog_row_image = 'MINIMAL'",
        "UPDATE m SET a = 2 WHERE id = 1",
        database=db,
    )
    decoder = RowDecoder()
    stream = binlog_events(mariadb, (str(file), int(pos)), db)
    try:
        plan = [decoder.decode_rows(event) for event in stream]
    finally:
        stream.close()
    # JSON (MariaDB: LONGTEXT), BIT and GEOMETRY are read; the MINIMAL image of the update is not
    assert [rows is None for rows in plan] == [False, False, False, True]
    assert plan[0] == [{"values": {"id": 1, "doc": '{"a": [1, 2]}', "b": "1010101010"}}]


def test_every_alter_table_gives_the_table_a_new_table_id(mariadb: LocalMariaDB) -> None:
    """What the capture's freeze_schema rests on (sync/sources/mysql.py, _stream): a table map is
    parsed once per table id, so a definition changed under the same id would be decoded with
    the old columns. Every kind of ALTER, instant ones included, must change the id."""
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import TableMapEvent

    db = "rows_ids"
    mariadb.execute(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}")
    mariadb.execute("CREATE TABLE t (id INT PRIMARY KEY, a INT, b VARCHAR(10))", database=db)
    file, pos = mariadb.execute("SHOW MASTER STATUS")[0][:2]
    alters = [
        "ADD COLUMN c INT, ALGORITHM=INSTANT",
        "DROP COLUMN c, ALGORITHM=INSTANT",
        "MODIFY b VARCHAR(300)",
        "RENAME COLUMN a TO aa, ALGORITHM=INSTANT",
        "ALTER COLUMN aa SET DEFAULT 3",
        "ADD INDEX ix (aa)",
        "MODIFY b VARCHAR(300) CHARACTER SET latin1",
        "CHANGE COLUMN b b VARCHAR(300) CHARACTER SET latin1 NOT NULL DEFAULT 'x'",
    ]
    mariadb.execute("INSERT INTO t (id, b) VALUES (0, 'v')", database=db)
    for i, alter in enumerate(alters, 1):
        mariadb.execute(f"ALTER TABLE t {alter}", f"INSERT INTO t (id, b) VALUES ({i}, 'v')", database=db)
    stream = BinLogStreamReader(
        connection_settings={"host": "127.0.0.1", "port": mariadb.port, "user": "root", "password": ""},
        server_id=4000 + random.randrange(10_000), log_file=str(file), log_pos=int(pos), resume_stream=True,
        blocking=False, only_schemas=[db], only_events=[TableMapEvent],
    )  # fmt: skip
    try:
        ids = [event.table_id for event in stream]
    finally:
        stream.close()
    assert len(ids) == len(alters) + 1 and len(set(ids)) == len(ids), ids
