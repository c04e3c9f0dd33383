"""The initial snapshot of large PostgreSQL tables in key ranges, read in parallel by Spark tasks
(`sluice.pipeline.snapshot.run_snapshot_chunks`), each range straight into the log.

Every range is read under the snapshot the slot exported when it was created (`SET TRANSACTION
SNAPSHOT`), so all of them see the table exactly as the capture's own snapshot read does, and
their rows carry the same position (the slot's consistent point minus one, plus the history's
base): unlike MySQL's ranges, no range has a snapshot of its own. The exported snapshot stays
valid while the replication connection that made it does nothing else: the capture starts
streaming only after every range is acknowledged.

Ranges are (lo, hi] of a single integer key, split by value between its MIN and MAX; a table
whose key is not one integer column, or smaller than `snapshot_parallel_rows` by the server's
estimate (`pg_class.reltuples`), is read whole by the capture itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from sluice.sync.envelope import binary_columns, encode_value, record_key
from sluice.sync.sources.mysql_base import SNAPSHOT, CaptureError, producer_config
from sluice.sync.sources.mysql_snapshot import ChunkResult, range_condition, split_range
from sluice.sync.sources.pg_values import RowReader
from sluice.sync.tasks import SourceSpec

#: the key types split by value
INTEGER_TYPES = ("smallint", "integer", "bigint")


@dataclass(frozen=True, slots=True)
class PgSnapshotChunk:
    """One key range (lo, hi] of one table (None: open), and everything a Spark task needs to
    read it under the exported snapshot and produce its rows."""

    spec: SourceSpec
    table: str
    relation: str  # "schema"."table", quoted
    keys: tuple[str, ...]
    lo: tuple[Any, ...] | None
    hi: tuple[Any, ...] | None
    topic: str
    bootstrap: str
    snapshot: str  # the exported snapshot's id
    #: the envelope's `source` for every row (pos, position, resume, epoch, ...)
    source: tuple[tuple[str, Any], ...]
    #: the table's columns and their types, in table order
    types: tuple[tuple[str, str], ...]
    fragment: str  # the envelope's `types`, as JSON text
    #: the capture's producer settings, its client security's password among them: never printed
    producer_config: tuple[tuple[str, Any], ...] = field(default=(), repr=False)


def plan_ranges(
    cur: Any, relation: str, keys: list[str], *, min_rows: int, chunk_rows: int
) -> list[tuple[Any, Any]]:
    """Key ranges for a table worth splitting (a single integer key, at least `min_rows` rows by
    the server's estimate); [] to read it whole. `cur` is in the exported snapshot."""
    if len(keys) != 1:
        return []
    cur.execute(
        "SELECT c.reltuples::int8, format_type(a.atttypid, NULL) FROM pg_class c JOIN pg_attribute a "
        "ON a.attrelid = c.oid WHERE c.oid = %s::regclass AND a.attname = %s",
        (relation, keys[0]),
    )
    row = cur.fetchone()
    if row is None or int(row[0]) < min_rows or str(row[1]) not in INTEGER_TYPES:
        return []
    key = '"' + keys[0].replace('"', '""') + '"'
    cur.execute(f"SELECT min({key}), max({key}) FROM {relation}")
    lo, hi = cur.fetchone()
    if lo is None:
        return []
    parts = split_range(int(lo), int(hi) + 1, -(-int(row[0]) // chunk_rows))
    ranges: list[tuple[Any, Any]] = [((a - 1,), (b - 1,)) for a, b in parts]
    # open at both ends: a row outside [min, max] (none, under the snapshot) is still read
    ranges[0] = (None, ranges[0][1])
    ranges[-1] = (ranges[-1][0], None)
    return ranges


def read_pg_chunk(chunk: PgSnapshotChunk) -> ChunkResult:
    """Read one key range under the exported snapshot and produce its rows (op "r"); returns
    once every row is acknowledged. Runs in a Spark task (its own connections); run twice it
    writes the same rows at the same position again."""
    from confluent_kafka import Producer

    from sluice.sync.sources.pg_connect import connect, text_cursor

    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    producer = Producer(producer_config(chunk.bootstrap, **{"linger.ms": 20, **dict(chunk.producer_config)}))
    conn = connect(chunk.spec, application=f"sluice-{chunk.table}-snapshot")
    types = dict(chunk.types)
    reader = RowReader(types)
    source = dict(chunk.source)
    fragment = orjson.Fragment(chunk.fragment)
    rows = 0
    try:
        conn.autocommit = False
        with conn.cursor() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            cur.execute("SET TRANSACTION SNAPSHOT %s", (chunk.snapshot,))
        quoted = ['"' + k.replace('"', '""') + '"' for k in chunk.keys]
        cond, params = range_condition(quoted, chunk.lo, chunk.hi, "%s")
        columns = ", ".join('"' + c.replace('"', '""') + '"' for c in types)
        now = int(time.time() * 1000)
        with text_cursor(conn, f"range_{abs(hash((chunk.table, chunk.lo)))}") as cur:
            cur.itersize = 5000
            cur.execute(f"SELECT {columns} FROM {chunk.relation} WHERE {cond}", params)
            for raw in cur:
                record = reader.image(raw)
                key = {k: record[k] for k in chunk.keys}
                env: dict[str, Any] = {"op": "r", "table": chunk.table, "key": key, "before": None,
                                       "after": record}  # fmt: skip
                if binary := binary_columns(key, None, record):
                    env["binary"] = binary
                env["types"] = fragment
                env["source"] = source
                env["ts_ms"] = now
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
        conn.rollback()
    finally:
        conn.close()
    if producer.flush(120) or errors:
        raise CaptureError(
            f"snapshot of {chunk.table} ({chunk.lo}, {chunk.hi}] not acknowledged by the log: "
            f"{errors[0] if errors else 'timed out after 120 s'}"
        )
    return ChunkResult(chunk.table, chunk.lo, chunk.hi, rows, str(source.get("position", SNAPSHOT)))
