"""What the MySQL/MariaDB source's capture (mysql.py), its snapshot chunks (mysql_snapshot.py)
and re-snapshots (resnapshot.py) all need: binlog positions and how they encode into an
envelope's `source.pos`, the capture's error, connections to the source, how captured records
are produced, and the catalog reads (primary keys, column types). Kept below all three so that
none of them imports another for these.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from sluice.security.secrets import reveal
from sluice.sync.sources.mysql_values import ZeroDateError, snapshot_connect_args
from sluice.sync.tasks import SourceSpec
from sluice.sync.types import parse_type

SNAPSHOT = "snapshot"
#: Defaults of the task options snapshot_parallel_rows and snapshot_chunk_rows (both database
#: sources): tables this large are snapshotted in key ranges of this many rows by Spark, and
#: re-snapshots read chunks of this many rows.
PARALLEL_SNAPSHOT_ROWS = 200_000
SNAPSHOT_CHUNK_ROWS = 50_000


def producer_config(bootstrap: str, **overrides: Any) -> dict[str, Any]:
    """How captured changes are produced, by the capture and by snapshot range tasks alike:
    idempotent and acks=all (a retry is never appended twice, an acknowledgement is durable)."""
    return {
        "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
        "compression.type": "lz4", "message.timeout.ms": 300_000, "log_level": 0, **overrides,
    }  # fmt: skip


class CaptureError(RuntimeError):
    """A source that cannot be captured as configured; the message says what to change."""


#: Bits of the byte offset in an encoded position; the file number takes the 23 above them.
OFFSET_BITS = 40
FILE_BITS = 63 - OFFSET_BITS


def encode_position(file_number: int, offset: int) -> int:
    """`file_number << 40 | offset`, refused rather than wrapped when either is out of range."""
    if not 0 <= offset < 1 << OFFSET_BITS:
        raise CaptureError(f"binlog offset {offset} does not fit in {OFFSET_BITS} bits")
    if not 0 <= file_number < 1 << FILE_BITS:
        raise CaptureError(f"binlog file number {file_number} does not fit in {FILE_BITS} bits")
    return file_number << OFFSET_BITS | offset


@dataclass(frozen=True, order=True)
class BinlogPosition:
    file: str
    pos: int

    @property
    def number(self) -> int:
        return int(self.file.rsplit(".", 1)[1])

    def encode(self) -> int:
        return encode_position(self.number, self.pos)

    def text(self) -> str:
        return f"{self.file}:{self.pos}"

    @classmethod
    def parse(cls, text: str) -> BinlogPosition:
        name, _, pos = text.rpartition(":")
        if not name or not pos.isdigit() or not name.rsplit(".", 1)[-1].isdigit():
            raise CaptureError(f"{text!r} is not a binlog position like mysql-bin.000003:1234")
        return cls(name, int(pos))


def connect(spec: SourceSpec, **extra: Any) -> Any:
    import pymysql

    try:
        return pymysql.connect(
            host=spec.host, port=spec.port, user=spec.user, password=reveal(spec.password),
            database=spec.database, autocommit=True, **extra,
        )  # fmt: skip
    except pymysql.err.OperationalError as exc:
        raise CaptureError(
            f"cannot connect to {spec.user}@{spec.host}:{spec.port}/{spec.database}: {exc}"
        ) from None


def connect_snapshot(spec: SourceSpec) -> Any:
    """A connection for snapshot reads: an unbuffered dict cursor, the server's text for every
    value but numbers, TIMESTAMPs in UTC (mysql_values.snapshot_connect_args)."""
    import pymysql.cursors

    return connect(spec, cursorclass=pymysql.cursors.SSDictCursor, **snapshot_connect_args())


def types_fragment(types: dict[str, str]) -> orjson.Fragment:
    """A table's column types as the envelope's `types`, encoded once for all its rows."""
    return orjson.Fragment(orjson.dumps(types))


def snapshot_row(convert: Callable[[dict[str, Any]], dict[str, Any]], row: dict[str, Any], table: str) -> Any:
    """A snapshot row in its canonical values; a zero date under zero_dates: stop is a
    CaptureError naming the table."""
    try:
        return convert(row)
    except ZeroDateError as exc:
        raise CaptureError(f"snapshot of {table}: {exc}") from None


def primary_keys(spec: SourceSpec, tables: list[str], *, allow_missing: bool = False) -> dict[str, list[str]]:
    """The primary key columns of each table. A table without a primary key is an error; a table
    that does not exist is one too, unless `allow_missing` (the capture's tables may appear
    later, by CREATE TABLE or RENAME TABLE): then it is left out."""
    conn = connect(spec)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT TABLE_NAME, COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE "
                "WHERE TABLE_SCHEMA = %s AND CONSTRAINT_NAME = 'PRIMARY' "
                "ORDER BY TABLE_NAME, ORDINAL_POSITION",
                (spec.database,),
            )
            keys: dict[str, list[str]] = {}
            for table, column in cur.fetchall():
                keys.setdefault(table, []).append(column)
            cur.execute("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s",
                        (spec.database,))  # fmt: skip
            present = {r[0] for r in cur.fetchall()}
    finally:
        conn.close()
    keyless = [t for t in tables if t in present and t not in keys]
    missing = [t for t in tables if t not in present]
    if keyless or (missing and not allow_missing):
        raise CaptureError(
            f"table(s) without a primary key or not found in {spec.database}: {', '.join(keyless + missing)}"
        )
    return {t: keys[t] for t in tables if t in keys}


def column_types(spec: SourceSpec, tables: list[str]) -> dict[str, dict[str, str]]:
    """table -> column -> its type text (`int(11)`, `varchar(32)`), in table order, for the tables
    that exist. MariaDB's JSON is LONGTEXT with a `json_valid(col)` check constraint: such a
    column's type is `json` (sync/types.py)."""
    conn = connect(spec)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS "
                "WHERE TABLE_SCHEMA = %s ORDER BY TABLE_NAME, ORDINAL_POSITION",
                (spec.database,),
            )
            out: dict[str, dict[str, str]] = {}
            for table, column, typ in cur.fetchall():
                if table in tables:
                    out.setdefault(table, {})[column] = as_text(typ).lower()
            for table, column in _json_checked(cur, spec.database):
                if column in out.get(table, {}) and parse_type(out[table][column]).name == "longtext":
                    out[table][column] = "json"
    finally:
        conn.close()
    return out


_JSON_CHECK = re.compile(r"^\s*json_valid\(\s*`((?:[^`]|``)+)`\s*\)\s*$", re.IGNORECASE)


def _json_checked(cur: Any, database: str) -> list[tuple[str, str]]:
    """(table, column) of MariaDB's JSON columns: a column check `json_valid(`col`)`. MySQL has
    a JSON type of its own, and no TABLE_NAME in CHECK_CONSTRAINTS (nothing found there)."""
    import pymysql

    try:
        cur.execute(
            "SELECT TABLE_NAME, CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS "
            "WHERE CONSTRAINT_SCHEMA = %s",
            (database,),
        )
    except (pymysql.err.OperationalError, pymysql.err.ProgrammingError):
        return []
    return [
        (as_text(table), m.group(1).replace("``", "`"))
        for table, clause in cur.fetchall()
        if (m := _JSON_CHECK.match(as_text(clause)))
    ]


def as_text(value: Any) -> str:
    """A catalog or event field as text (PyMySQL gives bytes for some)."""
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value or "")
