"""Every column type captured by Debezium's MySQL connector and by Sluice, value by value (issue
32, item 4): the same rows of the type catalog (chaos/type_catalog.py), read by both from one
MariaDB whose time zone is +02:00, by snapshot (rows there before either capture started) and
by binlog (the same values inserted after), then each value of Debezium's envelope read through
its logical type (the record's schema: the JSON converter runs with schemas enabled) and set
beside Sluice's envelope value (sync/types.py) and MariaDB's own answer (sync/compare.py's
reference reading).

Debezium runs as it does for Sluice's users: Kafka Connect in distributed mode on a Sluice
broker (peers/connect.py), its MySQL connector told that MariaDB is MySQL 8.0.2 (see
test_connect_debezium.py: Debezium 3.6 otherwise asks MariaDB a MySQL 8.4 statement). Its value
handling (`DEBEZIUM_VALUES`) is chosen so that no value is lost before the comparison:

- `decimal.handling.mode=precise` (the default): the exact unscaled integer and its scale;
  `double` would round, `string` would hide Debezium's own encoding.
- `bigint.unsigned.handling.mode=precise`: BIGINT UNSIGNED as a Decimal of scale 0; the
  default, `long`, wraps values above 2^63 - 1 to negative numbers.
- `time.precision.mode=adaptive_time_microseconds` (the default): every TIME, DATETIME(4-6) in
  microseconds; `connect` would cut them to milliseconds.
- `binary.handling.mode=bytes` (the default): every byte, base64 in JSON as Sluice's envelope.
- `enable.time.adjuster=false`: Debezium's default (true) reads the year of a stored DATE or
  DATETIME below 100 as a two-digit year (0001-01-01 becomes 2001-01-01), a conversion MariaDB
  already made when the value was written; the stored year is what the comparison is about.

What is compared, per column and per source literal, on each path:

- value: Debezium's value converted to the form of Sluice's envelope (its logical type:
  io.debezium.time.Date days, Timestamp ms, MicroTimestamp µs, ZonedTimestamp UTC text, MicroTime
  µs, Year, Bits little-endian bytes, Decimal unscaled bytes and scale, Geometry wkb and srid,
  Enum and EnumSet labels) against Sluice's value, exactly. Each difference must be in
  `VALUE_DIFFERENCES`, with which of the two MariaDB's answer agrees with, and why.
- encoding: a type whose values are equal but written differently in JSON (`"0"` and `false`
  for BIT(1)) must be in `ENCODINGS`, with Debezium's logical type and an example seen.
- dates no target holds that MariaDB accepts under ALLOW_INVALID_DATES (`2024-02-30`) stop
  Debezium's connector (`STOPS`): in its snapshot, on its binlog, and on the binlog of a table
  it does not capture. They are kept out of the compared tables, in a table `bad` of their own
  that two more connectors read (and must fail on), written last. Sluice captures them as null
  (`zero_dates: null`), and a Sluice capture of another table under `zero_dates: stop` reads on
  past them.

A difference seen and not listed fails the test, and so does one listed and no longer seen: the
lists cannot rot. docs/COMPATIBILITY.md ("Debezium's MySQL connector, value by value") prints
them (`markdown`), kept equal by `test_compatibility_doc_lists_the_debezium_differences`.

Skipped only when scripts/peers.sh could not fetch Connect's and Debezium's jars.
"""

from __future__ import annotations

import base64
import datetime as dt
import re
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pymysql
import pytest

from sluice.chaos import type_catalog as cat
from sluice.chaos.type_catalog import CatalogType
from sluice.ops.mariadb import LocalMariaDB
from sluice.peers.connect import ConnectError, ConnectWorker, connect_home, debezium_mysql_config
from sluice.sync.compare import Check, normalise, show, table_schema, target_value, values_equal
from sluice.sync.sources.mysql import MySqlCapture
from sluice.sync.sources.mysql_base import column_types
from sluice.sync.sources.mysql_values import (
    bit_text,
    datetime_text,
    decimal_text,
    float32,
    time_text,
    timestamp_text,
    valid_date,
)
from sluice.sync.tasks import SourceSpec
from sluice.sync.types import parse_type
from tests.integration.test_mysql_capture import read_all, running, wait_caught_up
from tests.integration.test_pipeline import create_topic
from tests.support.cluster import TestCluster, wait_until

pytestmark = pytest.mark.timeout(600)

DB = "dbztypes"
PREFIX = "dbzt"
COMPATIBILITY = Path(__file__).resolve().parents[2] / "docs" / "COMPATIBILITY.md"

#: The catalog, and two NOT NULL temporal columns: Debezium's zero date differs there.
TYPES: tuple[CatalogType, ...] = (
    *cat.CATALOG,
    CatalogType("c_date_nn", "DATE NOT NULL", ("'0000-00-00'", "'2024-06-30'")),
    CatalogType("c_datetime_nn", "DATETIME NOT NULL", ("'0000-00-00 00:00:00'", "'2024-06-30 12:00:00'")),
)

#: Debezium's value handling (the module docstring says why each).
DEBEZIUM_VALUES = {
    "decimal.handling.mode": "precise",
    "bigint.unsigned.handling.mode": "precise",
    "time.precision.mode": "adaptive_time_microseconds",
    "binary.handling.mode": "bytes",
    "enable.time.adjuster": "false",
}

SNAPSHOT, BINLOG = "snapshot", "binlog"
#: Where an invalid date stops Debezium: its snapshot, its binlog, and the binlog of a table
#: the connector does not capture.
OTHER_TABLE = "binlog, a table not captured"
#: Keys in table `bad`: the invalid dates by snapshot from 0, by binlog from BAD_BINLOG_KEY, and
#: a row of NULLs at PROBE_KEY that shows Debezium's binlog connector is reading past it.
BAD_BINLOG_KEY, PROBE_KEY = 100, 99


# --- the documented differences ------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Encoding:
    """Values equal, JSON different: Debezium writes the column's values in another form."""

    column: str
    logical: str  # Debezium's schema for the column: its type, and its name when it has one
    sluice: str  # an example seen: Sluice's JSON ...
    debezium: str  # ... and Debezium's for the same value
    reason: str  # why Sluice's form


@dataclass(frozen=True, slots=True)
class ValueDifference:
    """A source value Debezium and Sluice give differently (after Debezium's logical type)."""

    column: str
    literal: str  # the catalog's SQL literal written to the source
    path: str  # snapshot or binlog
    sluice: str  # the two values, as `compare.show` prints them
    debezium: str
    mariadb: str  # the server's own answer (the reference reading, before normalising)
    agrees: str  # which of the two matches MariaDB's answer: Sluice, Debezium or neither
    reason: str

    def seen(self) -> tuple[str, ...]:
        """All but the reason: what the test compares with a `Cell.difference`."""
        return (self.column, self.literal, self.path, self.sluice, self.debezium, self.mariadb, self.agrees)


@dataclass(frozen=True, slots=True)
class Stop:
    """Values that stop Debezium's connector (its task FAILED, nothing captured after them)."""

    where: str  # SNAPSHOT, BINLOG or OTHER_TABLE
    values: str  # the source values, as SQL literals
    message: str  # in the failed task's trace
    sluice: str  # what Sluice's capture does instead
    reason: str


_DECIMAL = (
    "the exact value as MariaDB prints it, readable without the record's schema; Debezium's "
    "unscaled two's-complement bytes are a number only with the scale its schema holds"
)
_BITS = (
    "the bits as text, most significant first, whatever the width (PostgreSQL's bit(n) takes it "
    "as is); Debezium's bytes are little-endian and need the schema's length"
)
_DATE = "the date as ISO text, readable without the schema; Debezium's days since 1970 need it"
_DATETIME = (
    "a DATETIME has no time zone: ISO text without one, with the column's fractional digits; "
    "Debezium counts from the epoch as if the wall clock were UTC, in ms or µs by the precision"
)
_TIME = (
    "a TIME is a duration (-838:59:59 .. 838:59:59): MariaDB's own text with the column's digits; "
    "Debezium's µs need the schema to be a TIME"
)
_GEOMETRY = (
    "MySQL's own value in one binary, SRID then WKB: `ST_GeomFromWKB(SUBSTRING(v, 5), srid)` "
    "reads it back, and it goes into a bytea as is"
)

# fmt: off
ENCODINGS: tuple[Encoding, ...] = (
    Encoding("c_bigint_u", "bytes org.apache.kafka.connect.data.Decimal", "18446744073709551615",
             '"AP//////////"', "a JSON integer holds every BIGINT UNSIGNED exactly; Debezium's precise "
             "mode makes it a Decimal of scale 0 (its default, long, wraps values above 2^63 - 1)"),
    Encoding("c_dec65", "bytes org.apache.kafka.connect.data.Decimal", '"-0.000000000000000000000000000001"',
             '"/w=="', _DECIMAL),
    Encoding("c_dec10", "bytes org.apache.kafka.connect.data.Decimal", '"-12345678.90"', '"tmn9Lg=="',
             _DECIMAL),
    Encoding("c_dec5", "bytes org.apache.kafka.connect.data.Decimal", '"-99999"', '"/nlh"', _DECIMAL),
    Encoding("c_float", "float", "1e-45", "1.4e-45",
             "the shortest decimal that reads back as the same float32, from both paths; Debezium prints "
             "Java's Float.toString digits (Java 17 here), the same float32"),
    Encoding("c_bit1", "boolean", '"1"', "true",
             "BIT(1) is a bit string like any BIT(n) (PostgreSQL bit(1)), not a boolean"),
    Encoding("c_bit5", "bytes io.debezium.data.Bits", '"00101"', '"BQ=="', _BITS),
    Encoding("c_bit64", "bytes io.debezium.data.Bits",
             '"0000000000000000000000000000000000000000000000000000000000000001"', '"AQAAAAAAAAA="', _BITS),
    Encoding("c_date", "int32 io.debezium.time.Date", '"2024-02-29"', "19782", _DATE),
    Encoding("c_datetime", "int64 io.debezium.time.Timestamp", '"1000-01-01T00:00:00"', "-30610224000000",
             _DATETIME),
    Encoding("c_datetime3", "int64 io.debezium.time.Timestamp", '"2024-06-30T12:00:00.500"', "1719748800500",
             _DATETIME),
    Encoding("c_datetime6", "int64 io.debezium.time.MicroTimestamp", '"2024-06-30T12:00:00.000001"',
             "1719748800000001", _DATETIME),
    Encoding("c_time", "int64 io.debezium.time.MicroTime", '"-838:59:59"', "-3020399000000", _TIME),
    Encoding("c_time1", "int64 io.debezium.time.MicroTime", '"-00:00:01.1"', "-1100000", _TIME),
    Encoding("c_time6", "int64 io.debezium.time.MicroTime", '"-00:00:00.000001"', "-1", _TIME),
    Encoding("c_geometry", "struct io.debezium.data.geometry.Geometry",
             '"5hAAAAEBAAAAAAAAAAAA8D8AAAAAAAAAQA=="', '{"wkb":"AQEAAAAAAAAAAADwPwAAAAAAAABA","srid":4326}',
             _GEOMETRY),
    Encoding("c_point", "struct io.debezium.data.geometry.Point", '"AAAAAAEBAAAAAAAAAAAA+L8AAAAAAAACQA=="',
             '{"x":-1.5,"y":2.25,"wkb":"AQEAAAAAAAAAAAD4vwAAAAAAAAJA","srid":null}', _GEOMETRY),
    Encoding("c_date_nn", "int32 io.debezium.time.Date", '"2024-06-30"', "19904", _DATE),
    Encoding("c_datetime_nn", "int64 io.debezium.time.Timestamp", '"2024-06-30T12:00:00"', "1719748800000",
             _DATETIME),
)

_FLOAT_TEXT = ("Debezium's snapshot reads FLOAT as the text protocol prints it, 6 significant digits: "
               "another float32 than the stored one (its binlog reader has the stored one); Sluice's "
               "snapshot reads CAST(col AS DOUBLE), exact")
_ZERO_NOT_NULL = ("no target date type holds a zero date: Sluice makes it null (`zero_dates: null`) or "
                  "stops (`stop`), never an invented date; Debezium writes the epoch in a NOT NULL column "
                  "(null in a nullable one, as Sluice)")
_YEAR_ZERO = ("MariaDB stores and prints the zero year as 0000; Debezium's snapshot gives 2000 and its "
              "binlog reader 1900 (1900 + the stored 0)")

VALUE_DIFFERENCES: tuple[ValueDifference, ...] = (
    ValueDifference("c_float", "3.4028234663852886e38", SNAPSHOT, "3.4028235e+38", "3.40282e+38",
                    "3.4028234663852886e+38", "Sluice", _FLOAT_TEXT),
    ValueDifference("c_float", "-3.4028234663852886e38", SNAPSHOT, "-3.4028235e+38", "-3.40282e+38",
                    "-3.4028234663852886e+38", "Sluice", _FLOAT_TEXT),
    ValueDifference("c_float", "1.17549435e-38", SNAPSHOT, "1.1754944e-38", "1.17549e-38",
                    "1.1754943508222875e-38", "Sluice", _FLOAT_TEXT),
    ValueDifference("c_float", "16777217", SNAPSHOT, "16777216.0", "16777200.0", "16777216.0", "Sluice",
                    _FLOAT_TEXT),
    ValueDifference("c_year", "0", SNAPSHOT, "0", "2000", "'0000'", "Sluice", _YEAR_ZERO),
    ValueDifference("c_year", "0", BINLOG, "0", "1900", "'0000'", "Sluice", _YEAR_ZERO),
    ValueDifference("c_latin1", "x'80819DFFE7'", BINLOG, "'€\\x81\\x9dÿç'", "'€\ufffd\ufffdÿç'",
                    "'€\\x81\\x9dÿç'", "Sluice",
                    "Debezium decodes the binlog's latin1 bytes with Java's windows-1252, which has no "
                    "character for 0x81, 0x8D, 0x8F, 0x90 and 0x9D (here 0x81 and 0x9D became U+FFFD); "
                    "MariaDB converts them to the C1 controls U+0081.., as Debezium's snapshot and both of "
                    "Sluice's paths read them"),
    ValueDifference("c_enum", "'a,b'", BINLOG, "'a,b'", "'a\\\\,b'", "'a,b'", "Sluice",
                    "Debezium's binlog reader takes the label from its list of the ENUM's labels, where a "
                    "comma inside a label is escaped (`a\\,b`); its snapshot reads `a,b`"),
    ValueDifference("c_date_nn", "'0000-00-00'", SNAPSHOT, "None", "'1970-01-01'", "'0000-00-00'", "Sluice",
                    _ZERO_NOT_NULL),
    ValueDifference("c_date_nn", "'0000-00-00'", BINLOG, "None", "'1970-01-01'", "'0000-00-00'", "Sluice",
                    _ZERO_NOT_NULL),
    ValueDifference("c_datetime_nn", "'0000-00-00 00:00:00'", SNAPSHOT, "None", "'1970-01-01T00:00:00'",
                    "'0000-00-00 00:00:00'", "Sluice", _ZERO_NOT_NULL),
    ValueDifference("c_datetime_nn", "'0000-00-00 00:00:00'", BINLOG, "None", "'1970-01-01T00:00:00'",
                    "'0000-00-00 00:00:00'", "Sluice", _ZERO_NOT_NULL),
)

_INVALID = ("c_date '2024-02-30', c_datetime '2024-02-30 12:00:00'")
_SLUICE = "null (`zero_dates: null`, the default), or stops naming the column (`zero_dates: stop`)"
_STOP = ("MariaDB accepts such dates under ALLOW_INVALID_DATES and no target date type holds them; "
         "Debezium's task fails and captures nothing more of any of its tables (a restart meets the same "
         "row again)")
STOPS: tuple[Stop, ...] = (
    Stop(SNAPSHOT, _INVALID, "Snapshotting of table dbztypes.bad failed", _SLUICE, _STOP),
    Stop(BINLOG, _INVALID, "Invalid date 'FEBRUARY 30'", _SLUICE, _STOP),
    Stop(OTHER_TABLE, _INVALID, "Invalid date 'FEBRUARY 30'",
         "captures its own tables on, under `zero_dates: stop` too: it decodes only their rows",
         "Debezium's binlog reader decodes the rows of every table before it filters them by "
         "table.include.list: a date it cannot decode in any table of the server stops it"),
)
# fmt: on


def markdown() -> str:
    """The three lists as docs/COMPATIBILITY.md prints them."""

    def row(*cells: str) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    def code(text: str) -> str:
        return f"`{text}`" if "`" not in text else f"``{text}``"

    out = [
        "Values equal, written differently (Debezium's value read through its logical type is Sluice's):",
        "",
        "| column type | Debezium's logical type | Sluice writes | Debezium writes | why Sluice's form |",
        "|---|---|---|---|---|",
    ]
    ddl = {t.column: t.ddl for t in TYPES}
    for e in ENCODINGS:
        out.append(row(ddl[e.column], code(e.logical), code(e.sluice), code(e.debezium), e.reason))
    out += [
        "",
        "Values that differ:",
        "",
        "| column type | source value | path | Sluice | Debezium | MariaDB's answer | equals it | why |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v in VALUE_DIFFERENCES:
        out.append(row(ddl[v.column], code(v.literal), v.path, code(v.sluice), code(v.debezium),
                       code(v.mariadb), v.agrees, v.reason))  # fmt: skip
    out += [
        "",
        "Values that stop Debezium's connector:",
        "",
        "| path | source values | Debezium's task fails with | Sluice | why |",
        "|---|---|---|---|---|",
    ]
    for s in STOPS:
        out.append(row(s.where, code(s.values), code(s.message), s.sluice, s.reason))
    return "\n".join(out) + "\n"


# --- the source and the two captures -------------------------------------------------------------
_DATE_LITERAL = re.compile(r"^'(\d{4})-(\d{2})-(\d{2})")


def invalid_date(literal: str) -> bool:
    """A date literal with a real year, month and day that is no date (`'2024-02-30'`); zero
    dates and zero-in-date ones (`'2024-00-15'`) Debezium reads, as null."""
    m = _DATE_LITERAL.match(literal)
    if m is None:
        return False
    y, mo, d = int(m[1]), int(m[2]), int(m[3])
    return bool(y and mo and d) and not valid_date(y, mo, d)


def main_rows() -> list[dict[str, str]]:
    """The catalog's rows, invalid dates as NULL (they go to `bad_rows`), and the NULL row's
    NOT NULL columns given their first value."""
    out = []
    not_null = {t.column: t.values[0] for t in TYPES if "NOT NULL" in t.ddl}
    for row in cat.rows(TYPES):
        out.append({c: ("NULL" if invalid_date(v) else not_null[c] if v == "NULL" and c in not_null else v)
                    for c, v in row.items()})  # fmt: skip
    return out


def bad_types() -> tuple[CatalogType, ...]:
    return tuple(t for t in TYPES if any(invalid_date(v) for v in t.values))


def bad_rows() -> list[dict[str, str]]:
    """One row per invalid date, its other columns NULL."""
    return [{t.column: v} for t in bad_types() for v in t.values if invalid_date(v)]


@dataclass
class Captured:
    spec: SourceSpec
    sluice: list[dict[str, Any]]  # Sluice's envelopes (rows only)
    debezium: dict[str, list[dict[str, Any]]]  # table -> Debezium's records, {schema, payload}
    stops: dict[str, str] = field(default_factory=dict)  # path -> the failed task's trace


def _home_or_skip() -> Path:
    try:
        return connect_home()
    except ConnectError as exc:
        pytest.skip(str(exc))


def _writer(server: LocalMariaDB) -> Callable[[list[str]], None]:
    def write(statements: list[str]) -> None:
        conn = pymysql.connect(**server.connect_args(DB), charset="utf8mb4")
        try:
            with conn.cursor() as cur:
                cur.execute(f"SET SESSION sql_mode = '{cat.SESSION_SQL_MODE}'")
                for sql in statements:
                    cur.execute(sql)
            conn.commit()
        finally:
            conn.close()

    return write


def _connector(
    server: LocalMariaDB, bootstrap: str, name: str, server_id: int, tables: list[str], snapshot: str
) -> dict[str, str]:
    config = debezium_mysql_config(
        host="127.0.0.1", port=server.port, user="root", password="", database=DB, server_id=server_id,
        topic_prefix=f"{PREFIX}-{name}", bootstrap=bootstrap, history_topic=f"{PREFIX}-{name}.history",
        tables=tables, partitions=1,
    )  # fmt: skip
    config.update(DEBEZIUM_VALUES)
    config.update({
        "snapshot.mode": snapshot,
        # one broker: the table topics as the internal ones, one replica
        "topic.creation.default.replication.factor": "1",
        "topic.creation.default.min.insync.replicas": "1",
    })  # fmt: skip
    return config


def _topic(name: str, table: str) -> str:
    return f"{PREFIX}-{name}.{DB}.{table}"


def _count(bootstrap: str, topic: str) -> int:
    try:
        return read_all(bootstrap, topic, 1).num_rows
    except Exception:  # not created yet
        return 0


def _records(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    return [orjson.loads(v) for v in read_all(bootstrap, topic, 1).column("value").to_pylist() if v]


def wait_failed(worker: ConnectWorker, name: str, timeout_s: float) -> str | None:
    """The trace of connector ``name``'s task once it FAILED, or None if it still runs after
    ``timeout_s``."""
    traces: list[str] = []

    def failed() -> bool:
        for task in worker.status(name).get("tasks", []):
            if task["state"] == "FAILED":
                traces.append(task.get("trace") or "")
        return bool(traces)

    try:
        wait_until(failed, timeout_s, f"connector {name} to fail", interval_s=0.5)
    except AssertionError:
        return None
    return traces[-1]


@pytest.fixture
def captured(zookeeper: str, tmp_path: Path) -> Iterator[Captured]:
    """Both captures of `snap` (by snapshot), `ins` (by binlog) and `bad` (invalid dates, by
    both); and Sluice's capture of a table `plain` under `zero_dates: stop` beside them."""
    _home_or_skip()
    cluster = TestCluster(zookeeper, tmp_path / "broker", 1)
    bootstrap = cluster.bootstrap
    worker = ConnectWorker(tmp_path / "connect", bootstrap, group_id=PREFIX, topic_prefix=PREFIX,
                           replication_factor=1, schemas_enable=True)  # fmt: skip
    server = LocalMariaDB(
        tmp_path / "mariadb",
        extra_args=(f"--default-time-zone={cat.TIMESTAMP_ZONE}", "--version=8.0.2-MariaDB-10.11"),
    )
    try:
        worker.start(wait=False)  # its JVM starts while MariaDB and Sluice's snapshot do
        server.start()
        server.execute(f"CREATE DATABASE {DB}")
        server.execute(cat.create_table("snap", TYPES), cat.create_table("ins", TYPES),
                       cat.create_table("bad", bad_types()), "CREATE TABLE plain (id INT PRIMARY KEY)",
                       database=DB)  # fmt: skip
        write = _writer(server)
        rows, bad = main_rows(), bad_rows()
        write([cat.insert("snap", i, row) for i, row in enumerate(rows)])
        write([cat.insert("bad", i, row) for i, row in enumerate(bad)])
        for topic in (f"{PREFIX}.sluice", f"{PREFIX}.strict"):
            create_topic(bootstrap, topic, 1, 1)
        spec = SourceSpec(kind="mariadb", port=server.port, user="root", database=DB)
        cap = MySqlCapture(spec, ["snap", "ins", "bad"], lambda _t: f"{PREFIX}.sluice", bootstrap, name=DB)
        strict = MySqlCapture(spec, ["plain"], lambda _t: f"{PREFIX}.strict", bootstrap, name=f"{DB}-strict",
                              zero_dates="stop")  # fmt: skip
        stops: dict[str, str] = {}
        with running(cap), running(strict):
            wait_until(lambda: cap.stats.position and strict.stats.position, 60, "Sluice's snapshots")
            worker.wait_ready()
            for name, server_id, tables, mode in (
                ("types", 5411, ["snap", "ins"], "initial"),
                ("bad-snapshot", 5412, ["bad"], "initial"),
                ("bad-binlog", 5413, ["bad"], "no_data"),
            ):
                worker.put_connector(name, _connector(server, bootstrap, name, server_id, tables, mode))
            worker.wait_running("types")
            worker.wait_running("bad-binlog")
            stops.update(_failed(worker, SNAPSHOT, "bad-snapshot"))
            wait_until(lambda: _count(bootstrap, _topic("types", "snap")) >= len(rows), 120,
                       "Debezium's snapshot", interval_s=0.5)  # fmt: skip
            # the binlog: the same rows, and a row of NULLs that shows the binlog connector on
            # `bad` reads past it
            write([cat.insert("ins", i, row) for i, row in enumerate(rows)]
                  + [f"INSERT INTO bad (id) VALUES ({PROBE_KEY})"])  # fmt: skip
            wait_until(lambda: _count(bootstrap, _topic("types", "ins")) >= len(rows), 60,
                       "Debezium's binlog inserts", interval_s=0.5)  # fmt: skip
            wait_until(lambda: _count(bootstrap, _topic("bad-binlog", "bad")) >= 1, 60,
                       "Debezium's binlog connector on `bad`", interval_s=0.5)  # fmt: skip
            # last, as they stop Debezium: the invalid dates on the binlog; then a row of `plain`
            write([cat.insert("bad", BAD_BINLOG_KEY + i, row) for i, row in enumerate(bad)])
            write(["INSERT INTO plain VALUES (1)"])
            stops.update(_failed(worker, BINLOG, "bad-binlog"))
            stops.update(_failed(worker, OTHER_TABLE, "types"))
            wait_caught_up(cap, server, 60)
            wait_caught_up(strict, server, 60)
        assert not cap.stats.errors, cap.stats.errors
        assert not strict.stats.errors, strict.stats.errors
        plain = [
            orjson.loads(v) for v in read_all(bootstrap, f"{PREFIX}.strict", 1).column("value").to_pylist()
        ]
        assert [e["key"] for e in plain if e["op"] == "c"] == [{"id": 1}], plain
        envelopes = [
            orjson.loads(v) for v in read_all(bootstrap, f"{PREFIX}.sluice", 1).column("value").to_pylist()
        ]
        yield Captured(
            spec,
            [e for e in envelopes if e["op"] in ("r", "c")],
            {t: _records(bootstrap, _topic("types", t)) for t in ("snap", "ins")},
            stops,
        )
    finally:
        worker.stop(grace_s=10)
        cluster.down()
        server.remove()


def _failed(worker: ConnectWorker, where: str, name: str) -> dict[str, str]:
    """{where: the trace} once connector ``name``'s task FAILED; {} if it still runs after 30 s
    (a documented stop that no longer happens, reported by the test)."""
    trace = wait_failed(worker, name, 30)
    return {} if trace is None else {where: trace}


# --- Debezium's values through their logical types -----------------------------------------------
_EPOCH = dt.datetime(1970, 1, 1)
_F32 = struct.Struct("<f")


def _wall_clock(us: int, fsp: int) -> str:
    t = _EPOCH + dt.timedelta(microseconds=us)
    return datetime_text(t.year, t.month, t.day, t.hour, t.minute, t.second, t.microsecond, fsp)


def logical_type(schema: dict[str, Any]) -> str:
    """A field's schema as the docs name it: its type, and its name when it has one."""
    return " ".join(x for x in (schema["type"], schema.get("name")) if x)


def debezium_value(schema: dict[str, Any], value: Any, source_type: str) -> Any:
    """Debezium's JSON value of a column (``schema``: the column's field in the record's schema)
    in the form Sluice's envelope holds for ``source_type`` (sync/types.py), bytes as bytes."""
    if value is None:
        return None
    t = parse_type(source_type)
    name = schema.get("name")
    params = schema.get("parameters") or {}
    if name == "org.apache.kafka.connect.data.Decimal":  # unscaled big-endian two's complement
        unscaled = int.from_bytes(base64.b64decode(value), "big", signed=True)
        if t.family == "int":  # BIGINT UNSIGNED, precise
            return unscaled
        return decimal_text(unscaled < 0, str(abs(unscaled)), int(params["scale"]))
    if name == "io.debezium.data.Bits":  # little-endian bytes, `length` bits
        return bit_text(int.from_bytes(base64.b64decode(value), "little"), int(params["length"]))
    if name == "io.debezium.time.Date":  # days since the epoch
        return (dt.date(1970, 1, 1) + dt.timedelta(days=value)).isoformat()
    if name == "io.debezium.time.Timestamp":  # ms since the epoch, the wall clock read as UTC
        return _wall_clock(value * 1000, t.scale)
    if name == "io.debezium.time.MicroTimestamp":
        return _wall_clock(value, t.scale)
    if name == "io.debezium.time.ZonedTimestamp":  # ISO 8601 text in UTC
        at = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        return timestamp_text(int(at.timestamp()), at.microsecond, t.scale)
    if name == "io.debezium.time.MicroTime":  # µs, a signed duration
        s, us = divmod(abs(value), 1_000_000)
        return time_text(value < 0, s // 3600, s // 60 % 60, s % 60, us, t.scale)
    if name in ("io.debezium.data.geometry.Geometry", "io.debezium.data.geometry.Point"):
        return (value.get("srid") or 0).to_bytes(4, "little") + base64.b64decode(value["wkb"])
    if schema["type"] == "boolean":  # BIT(1), or a TINYINT(1) read as BOOLEAN
        return ("1" if value else "0") if t.family == "bit" else int(value)
    if schema["type"] == "float":  # FLOAT32: the float32 the number denotes, as Sluice prints it
        return float32(_F32.unpack(_F32.pack(value))[0])
    if schema["type"] == "bytes":
        return base64.b64decode(value)
    return value  # integers, Year, double, strings, Enum, EnumSet, Json


def sluice_value(envelope: dict[str, Any], column: str) -> Any:
    value = envelope["after"][column]
    if value is not None and column in envelope.get("binary", ()):
        return base64.b64decode(value)
    return value


def same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


# --- side by side --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Cell:
    """One column of one row by one path: MariaDB's answer, Sluice's value, Debezium's."""

    column: str
    literal: str
    path: str
    logical: str  # Debezium's logical type for the column
    mariadb: Any  # the reference reading's answer
    sluice: Any  # Sluice's envelope value (bytes decoded)
    debezium: Any  # Debezium's, read through its logical type into Sluice's form
    sluice_json: str  # each as its envelope writes it
    debezium_json: str
    sluice_agrees: bool  # equal to MariaDB's answer (sync/compare.py)
    debezium_agrees: bool

    def difference(self) -> tuple[str, ...]:
        """What a ValueDifference documenting this cell says (`ValueDifference.seen`)."""
        agrees = ("Sluice" if self.sluice_agrees else "") + ("Debezium" if self.debezium_agrees else "")
        return (self.column, self.literal, self.path, show(self.sluice), show(self.debezium),
                show(self.mariadb), agrees or "neither")  # fmt: skip


def reference_rows(spec: SourceSpec, tables: list[str]) -> dict[str, tuple[dict[str, Check], dict[int, Any]]]:
    """Each table's column comparisons, and its rows by key as MariaDB answers them."""
    types = column_types(spec, tables)
    conn = pymysql.connect(host=spec.host, port=spec.port, user=spec.user, database=spec.database,
                           cursorclass=pymysql.cursors.DictCursor)  # fmt: skip
    out = {}
    try:
        with conn.cursor() as cur:
            for table in tables:
                schema = table_schema(table, types[table], ["id"])
                cur.execute(schema.reference_select())
                out[table] = (dict(schema.columns), {int(r["id"]): r for r in cur.fetchall()})
    finally:
        conn.close()
    return out


def cells(captured: Captured) -> list[Cell]:
    """Every column of every row of `snap` (snapshot) and `ins` (binlog), side by side."""
    rows = main_rows()
    reference = reference_rows(captured.spec, ["snap", "ins"])
    sluice = {(e["table"], e["key"]["id"]): e for e in captured.sluice}
    out = []
    for path, table in ((SNAPSHOT, "snap"), (BINLOG, "ins")):
        checks, answers = reference[table]
        records = captured.debezium[table]
        assert sorted(r["payload"]["after"]["id"] for r in records) == list(range(len(rows))), table
        for record in records:
            assert record["payload"]["op"] == ("r" if path == SNAPSHOT else "c"), record["payload"]
            fields = next(f for f in record["schema"]["fields"] if f["field"] == "after")["fields"]
            after = record["payload"]["after"]
            key = after["id"]
            envelope = sluice[(table, key)]
            for schema in fields[1:]:  # after the key, `id`
                column = schema["field"]
                check = checks[column]
                mine = sluice_value(envelope, column)
                theirs = debezium_value(schema, after[column], envelope["types"][column])
                answer = answers[key][column]
                want = normalise(check, answer, source=True)
                out.append(
                    Cell(
                        column, rows[key][column], path, logical_type(schema), answer, mine, theirs,
                        orjson.dumps(envelope["after"][column]).decode(),
                        orjson.dumps(after[column]).decode(),
                        values_equal(check, want, target_value(check, mine)),
                        values_equal(check, want, target_value(check, theirs)),
                    )
                )  # fmt: skip
    return out


def encodings_seen(all_cells: list[Cell]) -> dict[str, tuple[str, set[tuple[str, str]]]]:
    """Column -> (Debezium's logical type, the (Sluice, Debezium) JSON pairs of equal values
    written differently)."""
    out: dict[str, tuple[str, set[tuple[str, str]]]] = {}
    for c in all_cells:
        if same(c.sluice, c.debezium) and c.sluice is not None and c.sluice_json != c.debezium_json:
            out.setdefault(c.column, (c.logical, set()))[1].add((c.sluice_json, c.debezium_json))
    return out


def problems(all_cells: list[Cell], stops: dict[str, str]) -> list[str]:
    """Sluice's values unequal to MariaDB's answer; differences seen and not documented, and
    documented and not seen."""
    out = [
        f"Sluice's value is not MariaDB's: {c.column} {c.literal} ({c.path}): Sluice {show(c.sluice)}, "
        f"MariaDB {show(c.mariadb)}"
        for c in all_cells
        if not c.sluice_agrees
    ]
    seen = {c.difference() for c in all_cells if not same(c.sluice, c.debezium)}
    documented = {v.seen() for v in VALUE_DIFFERENCES}
    out += [f"undocumented: ValueDifference{(*key, '<why>')}" for key in sorted(seen - documented)]
    out += [f"documented, no longer seen: ValueDifference{key}" for key in sorted(documented - seen)]
    encodings = encodings_seen(all_cells)
    listed = {e.column: e for e in ENCODINGS}
    for column, (logical, examples) in sorted(encodings.items()):
        e = listed.get(column)
        if e is None:
            out.append(f"undocumented: Encoding{(column, logical, *sorted(examples)[0], '<why>')}")
        elif e.logical != logical or (e.sluice, e.debezium) not in examples:
            out.append(f"Encoding of {column} not as documented: {logical}, {sorted(examples)[:3]}")
    out += [f"documented, no longer seen: Encoding of {c}" for c in sorted(set(listed) - set(encodings))]
    invalid = ", ".join(f"{c} {v}" for row in bad_rows() for c, v in row.items())
    for s in STOPS:
        trace = stops.get(s.where)
        if trace is None:
            out.append(f"documented, no longer seen: Debezium stops at {s.values} ({s.where}): compare "
                       "them with the other values and drop the Stop")  # fmt: skip
        elif s.message not in trace:
            out.append(f"Debezium stopped ({s.where}) without {s.message!r}:\n{trace[:1500]}")
        if s.values != invalid:
            out.append(f"Stop ({s.where}) names {s.values!r}; the invalid dates are {invalid!r}")
    for where in sorted(set(stops) - {s.where for s in STOPS}):
        out.append(f"undocumented: Debezium stops at the invalid dates ({where}):\n{stops[where][:1500]}")
    return out


def table_text(all_cells: list[Cell], stops: dict[str, str]) -> str:
    """Per type (in catalog order) and source value: Sluice's value, Debezium's (its JSON, and
    read through its logical type), and whether they are equal; one line for both paths when
    alike."""
    documented = {v.seen() for v in VALUE_DIFFERENCES}
    encodings = {e.column for e in ENCODINGS}
    ddl = {t.column: t.ddl for t in TYPES}
    width = 34
    lines = [f"{'column':<14} {'type':<22} {'source value':<26} {'path':<8} {'Sluice':<{width}} "
             f"{'Debezium JSON':<{width}} {'Debezium value':<{width}} verdict"]  # fmt: skip
    by_value: dict[tuple[str, str], dict[tuple[str, ...], list[str]]] = {}
    for c in all_cells:
        if same(c.sluice, c.debezium):
            verdict = "equal"
            if c.sluice is not None and c.sluice_json != c.debezium_json:
                verdict += ", other JSON" + ("" if c.column in encodings else " (UNDOCUMENTED)")
        else:
            known = "documented" if c.difference() in documented else "UNDOCUMENTED"
            verdict = f"DIFFERENT ({known}); MariaDB agrees with {c.difference()[-1]}"
        shown: tuple[str, ...] = (
            show(c.sluice, width),
            show(c.debezium_json, width),
            show(c.debezium, width),
            verdict,
        )
        by_value.setdefault((c.column, c.literal), {}).setdefault(shown, []).append(c.path)
    order = {t.column: i for i, t in enumerate(TYPES)}
    for (column, literal), variants in sorted(by_value.items(), key=lambda kv: order[kv[0][0]]):
        for shown, paths in variants.items():
            path = "both" if len(set(paths)) == 2 else paths[0]
            cols = " ".join(f"{x:<{width}}" for x in shown[:3])
            lines.append(
                f"{column:<14} {ddl[column][:22]:<22} {show(literal, 26):<26} {path:<8} {cols} {shown[3]}"
            )
    for row in bad_rows():
        for column, literal in row.items():
            blank = " ".join(f"{x:<{width}}" for x in ("None", "-", "-"))
            lines.append(f"{column:<14} {ddl[column][:22]:<22} {show(literal, 26):<26} {'both':<8} {blank} "
                         "Debezium's connector stops")  # fmt: skip
    for where, trace in sorted(stops.items()):
        causes = [line for line in trace.splitlines() if line.startswith("Caused by")]
        lines.append(f"Debezium's connector stopped ({where}): {causes[-1] if causes else trace[:200]}")
    return "\n".join(lines)


def test_debezium_and_sluice_give_every_type_the_same_value_or_a_documented_difference(
    captured: Captured,
) -> None:
    all_cells = cells(captured)
    print(table_text(all_cells, captured.stops))
    # the invalid dates: Sluice captured them, as null (zero_dates: null), by both paths
    bad = [e for e in captured.sluice if e["table"] == "bad" and e["key"]["id"] != PROBE_KEY]
    assert len(bad) == 2 * len(bad_rows()), bad
    for e in bad:
        row = bad_rows()[e["key"]["id"] % BAD_BINLOG_KEY]
        assert all(e["after"][c] is None for c in row), e
    trouble = problems(all_cells, captured.stops)
    assert not trouble, f"{len(trouble)} problems:\n" + "\n".join(trouble)


def test_compatibility_doc_lists_the_debezium_differences() -> None:
    """docs/COMPATIBILITY.md prints this module's lists (regenerate with `markdown()`)."""
    text = COMPATIBILITY.read_text()
    begin = "<!-- generated: tests/integration/test_debezium_types.py markdown() -->\n"
    end = "<!-- end generated -->"
    assert begin in text and end in text, f"{COMPATIBILITY} has no generated Debezium section"
    have = text.split(begin, 1)[1].split(end, 1)[0]
    assert have.strip() == markdown().strip(), (
        "docs/COMPATIBILITY.md's Debezium tables differ from markdown()"
    )
