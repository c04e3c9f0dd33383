"""The snapshot of large MySQL/MariaDB tables in key ranges, read in parallel (by Spark tasks,
see `sluice.pipeline.snapshot`), each range straight into the log.

Why it stays correct without one transaction over the whole table: each range is read in its
own consistent snapshot and its rows are labelled with that snapshot's binlog position (on
MariaDB, `binlog_snapshot_file/position` of the range's own transaction: exact; on MySQL, the
position just before the range's transaction starts: a lower bound). The binlog is then read
from `snapshot_start`, a position taken before any range began, so it holds every change made
after any range's snapshot. A target writes a row only over a lower source position, so a
change a range already saw (position below its label) is skipped and every later one applies;
with a lower-bound label an earlier change may be applied again, and the changes after it set
the row right again before the capture catches up.

Ranges are (lo, hi] of the primary key in its own order, None for an open end. A single integer
key is split by value between its MIN and MAX (two queries); any other key, composite or not
an integer, by keyset pagination: a boundary every `chunk_rows` keys (`plan_ranges`), read with
row-value comparisons `(k1, k2) > lo AND (k1, k2) <= hi`. Small tables are read whole in the
capture's own snapshot transaction.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from sluice.sync.envelope import binary_columns, encode_value, record_key
from sluice.sync.sources.mysql_base import (
    SNAPSHOT,
    BinlogPosition,
    CaptureError,
    connect,
    connect_snapshot,
    producer_config,
    snapshot_row,
    types_fragment,
)
from sluice.sync.sources.mysql_values import ZeroDates, row_converter, select_list
from sluice.sync.tasks import SourceSpec

INTEGER_TYPES = ("tinyint", "smallint", "mediumint", "int", "integer", "bigint")


@dataclass(frozen=True, slots=True)
class SnapshotChunk:
    """One key range (lo, hi] of one table (None: open), and everything a Spark task needs to
    capture it."""

    spec: SourceSpec
    table: str
    keys: tuple[str, ...]
    lo: tuple[Any, ...] | None
    hi: tuple[Any, ...] | None
    topic: str
    bootstrap: str
    name: str
    epoch: int
    execution: str
    snapshot_start: str
    is_mariadb: bool
    #: the capture's producer settings, its client security's password among them: never printed
    producer_config: tuple[tuple[str, Any], ...] = field(default=(), repr=False)
    #: the base of the binlog history read (`source.base`) and the highest position the
    #: capture had emitted when it planned the ranges (binlog_history.py)
    base: int = 0
    high: int = 0
    #: the table's columns and their types, in table order (the select list, the values, the
    #: envelope's `types`), and the task's zero_dates policy (mysql_values.py)
    types: tuple[tuple[str, str], ...] = ()
    zero_dates: str = "null"


@dataclass(frozen=True, slots=True)
class ChunkResult:
    table: str
    lo: tuple[Any, ...] | None
    hi: tuple[Any, ...] | None
    rows: int
    position: str


def plan_chunks(
    spec: SourceSpec, tables: dict[str, list[str]], *, min_rows: int, chunk_rows: int
) -> dict[str, list[tuple[Any, Any]]]:
    """Key ranges (lo, hi] for each table worth splitting: at least `min_rows` rows by the
    server's estimate. Tables not in the result are read whole."""
    assert min_rows > 0 and chunk_rows > 0
    conn = connect(spec)
    plans: dict[str, list[tuple[Any, Any]]] = {}
    keyset: list[str] = []
    try:
        with conn.cursor() as cur:
            for table, keys in tables.items():
                cur.execute(
                    "SELECT c.DATA_TYPE, t.TABLE_ROWS FROM information_schema.COLUMNS c "
                    "JOIN information_schema.TABLES t USING (TABLE_SCHEMA, TABLE_NAME) "
                    "WHERE c.TABLE_SCHEMA = %s AND c.TABLE_NAME = %s AND c.COLUMN_NAME = %s",
                    (spec.database, table, keys[0]),
                )
                row = cur.fetchone()
                if row is None or int(row[1] or 0) < min_rows:
                    continue
                if len(keys) != 1 or str(row[0]).lower() not in INTEGER_TYPES:
                    keyset.append(table)
                    continue
                cur.execute(f"SELECT MIN(`{keys[0]}`), MAX(`{keys[0]}`) FROM `{table}`")
                lo, hi = cur.fetchone()
                if lo is None:
                    continue
                # [a, b) of integers is (a - 1, b - 1]
                parts = split_range(int(lo), int(hi) + 1, -(-int(row[1]) // chunk_rows))
                plans[table] = [((a - 1,), (b - 1,)) for a, b in parts]
    finally:
        conn.close()
    for table in keyset:
        plans[table] = plan_ranges(spec, table, tables[table], chunk_rows)
    return plans


def range_condition(
    cols: list[str], lo: tuple[Any, ...] | None, hi: tuple[Any, ...] | None, mark: str
) -> tuple[str, list[Any]]:
    """`(k1, k2) > lo AND (k1, k2) <= hi` (either side left out when None), with `mark` as the
    parameter placeholder; `cols` are quoted already."""
    row = cols[0] if len(cols) == 1 else f"({', '.join(cols)})"
    one = mark if len(cols) == 1 else "(" + ", ".join([mark] * len(cols)) + ")"
    conds: list[str] = []
    params: list[Any] = []
    if lo is not None:
        conds.append(f"{row} > {one}")
        params.extend(lo)
    if hi is not None:
        conds.append(f"{row} <= {one}")
        params.extend(hi)
    return (" AND ".join(conds) or "1 = 1"), params


def plan_ranges(spec: SourceSpec, table: str, key: list[str], chunk_rows: int) -> list[tuple[Any, Any]]:
    """Key ranges (lo, hi] of about `chunk_rows` rows each, covering every key: boundaries found
    by keyset pagination (`WHERE key > last ORDER BY key LIMIT 1 OFFSET n-1`), the last range
    open-ended so rows inserted past the end meanwhile are still in one."""
    keys = [f"`{k}`" for k in key]
    ranges: list[tuple[Any, Any]] = []
    last: tuple[Any, ...] | None = None
    conn = connect(spec)
    try:
        with conn.cursor() as cur:
            while True:
                cond, params = range_condition(keys, last, None, "%s")
                cur.execute(
                    f"SELECT {', '.join(keys)} FROM `{table}` WHERE {cond} "
                    f"ORDER BY {', '.join(keys)} LIMIT 1 OFFSET {int(chunk_rows) - 1}",
                    params,
                )
                row = cur.fetchone()
                if row is None:
                    ranges.append((last, None))
                    return ranges
                ranges.append((last, tuple(row)))
                last = tuple(row)
    finally:
        conn.close()


def split_range(lo: int, hi: int, parts: int) -> list[tuple[int, int]]:
    """[lo, hi) cut into at most `parts` contiguous, non-empty ranges that cover it exactly."""
    assert hi > lo and parts > 0
    width = max(1, -(-(hi - lo) // parts))
    out = [(start, min(start + width, hi)) for start in range(lo, hi, width)]
    assert out[0][0] == lo and out[-1][1] == hi
    return out


def begin_chunk_snapshot(cur: Any, is_mariadb: bool) -> BinlogPosition:
    """Open a consistent-snapshot transaction on `cur` (a dict cursor) without any lock and
    return the position to label its rows with: on MariaDB the snapshot's own (exact), on MySQL
    the position read just before it began (a lower bound: a change between the two is in the
    rows and also comes again from the binlog, above the label, with the same or a later value)."""
    cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    if is_mariadb:
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
        status = {r["Variable_name"].lower(): r["Value"] for r in cur.fetchall()}
        return BinlogPosition(status["binlog_snapshot_file"], int(status["binlog_snapshot_position"]))
    cur.execute("SHOW MASTER STATUS")
    row = cur.fetchone()
    position = BinlogPosition(row["File"], int(row["Position"]))
    cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
    return position


def read_chunk(chunk: SnapshotChunk) -> ChunkResult:
    """Read one key range in a consistent snapshot and produce its rows (op "r") to the log;
    returns once every row is acknowledged. Runs in a Spark task, so it opens its own
    connections; running it twice only writes the same rows again (as new or newer versions)."""
    from confluent_kafka import Producer

    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    producer = Producer(producer_config(chunk.bootstrap, **{"linger.ms": 20, **dict(chunk.producer_config)}))
    conn = connect_snapshot(chunk.spec)
    rows = 0
    types = dict(chunk.types)
    convert = row_converter(types, ZeroDates(chunk.zero_dates))
    try:
        with conn.cursor() as cur:
            position = begin_chunk_snapshot(cur, chunk.is_mariadb)
            cond, params = range_condition([f"`{k}`" for k in chunk.keys], chunk.lo, chunk.hi, "%s")
            cur.execute(f"SELECT {select_list(types) or '*'} FROM `{chunk.table}` WHERE {cond}", params)
            now = int(time.time() * 1000)
            pos = chunk.base + position.encode()
            source = {
                "connector": "mariadb" if chunk.is_mariadb else "mysql", "name": chunk.name,
                "db": chunk.spec.database, "pos": pos, "position": position.text(),
                "resume": SNAPSHOT, "snapshot_start": chunk.snapshot_start, "ts_ms": now,
                "epoch": chunk.epoch, "execution": chunk.execution,
                **({"high": chunk.high} if chunk.high > pos else {}),  # absent: `pos` is the highest
                **({"base": chunk.base} if chunk.base else {}),
            }  # fmt: skip
            fragment = types_fragment(types)
            for raw in cur:
                record = snapshot_row(convert, raw, chunk.table)
                key = {k: record[k] for k in chunk.keys}
                env = {"op": "r", "table": chunk.table, "key": key, "before": None, "after": record,
                       "source": source, "ts_ms": now}  # fmt: skip
                if binary := binary_columns(record):
                    env["binary"] = binary
                env["types"] = fragment
                value = orjson.dumps(env, default=encode_value)
                while True:
                    try:
                        producer.produce(chunk.topic, value, record_key(chunk.table, key),
                                         on_delivery=on_delivery, timestamp=now)  # fmt: skip
                        break
                    except BufferError:
                        producer.poll(0.05)
                rows += 1
                if rows % 5000 == 0:
                    producer.poll(0)
            cur.execute("COMMIT")
    finally:
        conn.close()
    if producer.flush(120) or errors:
        raise CaptureError(
            f"snapshot of {chunk.table} ({chunk.lo}, {chunk.hi}] not acknowledged by the log: "
            f"{errors[0] if errors else 'timed out after 120 s'}"
        )
    return ChunkResult(chunk.table, chunk.lo, chunk.hi, rows, position.text())
