"""The capture's row decoder (sync/sources/binlog_rows.py) against mysql-replication's, on
MariaDB's own rows events: a seeded random workload over every column type the plan reads
(NULLs, zero dates, negative times and decimals, multi-byte and latin1 text, bytes, enums, sets,
values at the types' limits), read twice from the binlog, once by each decoder. Every row must
be the same values of the same Python types, and the types the plan does not read must go to
the library."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pymysql
import pytest

from sluice.ops.mariadb import LocalMariaDB
from sluice.sync.sources.binlog_rows import RowDecoder

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
}


def binlog_events(server: LocalMariaDB, start: tuple[str, int], database: str) -> Any:
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    return BinLogStreamReader(
        connection_settings={"host": "127.0.0.1", "port": server.port, "user": "root", "password": ""},
        server_id=4000 + random.randrange(10_000), log_file=start[0], log_pos=start[1], resume_stream=True,
        blocking=False, only_schemas=[database], is_mariadb=False,
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
    )  # fmt: skip


def without_none_sources(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if "none_sources" not in k} for row in rows]


def both_decodings(
    server: LocalMariaDB, start: tuple[str, int], database: str
) -> tuple[list[list[dict[str, Any]]], list[list[dict[str, Any]] | None]]:
    """Every rows event since `start`, decoded by the library and (read again) by the plan."""
    library, plan = [], []
    stream = binlog_events(server, start, database)
    try:
        library = [without_none_sources(event.rows) for event in stream]
    finally:
        stream.close()
    decoder = RowDecoder()
    stream = binlog_events(server, start, database)
    try:
        plan = [decoder.decode_rows(event) for event in stream]
    finally:
        stream.close()
    return library, plan


def differences(library: list[list[dict[str, Any]]], plan: list[list[dict[str, Any]] | None]) -> list[str]:
    out = []
    for i, (a, b) in enumerate(zip(library, plan, strict=True)):
        if b is None:
            out.append(f"event {i}: the plan gave no rows")
            continue
        for j, (ra, rb) in enumerate(zip(a, b, strict=True)):
            for image, values in ra.items():
                for column, value in values.items():
                    got = rb[image].get(column, "(missing)")
                    if got != value or type(got) is not type(value):
                        out.append(
                            f"event {i} row {j} {image} {column}: library {value!r:.60} plan {got!r:.60}"
                        )
        if len(a) != len(b):
            out.append(f"event {i}: {len(a)} rows by the library, {len(b)} by the plan")
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_the_row_plan_decodes_every_type_as_the_library_does(mariadb: LocalMariaDB, seed: int) -> None:
    db = f"rows_{seed}"
    rnd = random.Random(seed)
    names = list(COLUMNS)
    mariadb.execute(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}")
    mariadb.execute(
        f"CREATE TABLE t (id BIGINT PRIMARY KEY, {', '.join(f'{n} {COLUMNS[n][0]}' for n in names)})",
        database=db,
    )
    file, pos = mariadb.execute("SHOW MASTER STATUS")[0][:2]
    conn = pymysql.connect(**mariadb.connect_args(db), autocommit=True)  # type: ignore[arg-type]
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_mode = ''")  # zero dates, as old applications write them
            for batch in range(25):
                rows = [
                    [batch * 20 + i] + [None if rnd.random() < 0.15 else COLUMNS[n][1](rnd) for n in names]
                    for i in range(20)
                ]
                cur.executemany(
                    f"INSERT INTO t (id, {', '.join(names)}) VALUES ({', '.join(['%s'] * (len(names) + 1))})",
                    rows,
                )
                cur.execute(
                    f"UPDATE t SET g = g + 1, q = CONCAT(IFNULL(q, ''), 'u'), ac = NOW(6), an = NULL "
                    f"WHERE id % 3 = {batch % 3}"
                )
                cur.execute(f"DELETE FROM t WHERE id % 7 = {batch % 7} AND id < {batch * 20}")
    finally:
        conn.close()
    library, plan = both_decodings(mariadb, (str(file), int(pos)), db)
    assert sum(len(rows) for rows in library) > 500  # inserts, updates and deletes, many per event
    assert differences(library, plan) == []


def test_types_the_plan_does_not_read_and_partial_images_go_to_the_library(mariadb: LocalMariaDB) -> None:
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
    library, plan = both_decodings(mariadb, (str(file), int(pos)), db)
    # JSON on MariaDB is LONGTEXT: the plan reads it; BIT and GEOMETRY it leaves to the library,
    # and the MINIMAL image of the update (the insert before it is a full image).
    assert [rows is None for rows in plan] == [True, True, False, True]
    assert library[2] == plan[2]


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
