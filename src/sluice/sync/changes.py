"""Log records as a table of changes: the columnar form targets apply.

`to_changes` parses each record's envelope once (in Spark this runs in the executors, one
input partition per task) and keeps what applying needs: where the record sits in the log, the
table, the canonical key, the source position, the op and the after image as JSON text. The
`before` image and the rest of `source` are dropped there, so the driver receives less.

`collapse` keeps the newest change per row (highest source position), in Arrow, without a
Python loop over rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from sluice.sync.envelope import MAX_POS, OPS, parse

_OPS = OPS

CHANGE_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("table", pa.string()),
        pa.field("key", pa.string()),  # envelope.key_text of the primary key
        pa.field("pos", pa.int64()),
        pa.field("op", pa.string()),
        pa.field("after", pa.string()),  # JSON object text; null for deletes
        pa.field("records", pa.int32()),  # log records this row stands for (1 until collapsed)
    ]
)


def to_changes(records: pa.RecordBatch | pa.Table) -> pa.RecordBatch:
    """Parse the `value` column of log records; a bad record raises BadEventError naming it."""
    topics = records.column("topic").to_pylist()
    parts = records.column("partition").to_pylist()
    offsets = records.column("offset").to_pylist()
    values = records.column("value").to_pylist()
    tables: list[str] = []
    keys: list[str] = []
    poss: list[int] = []
    ops: list[str] = []
    afters: list[str | None] = []
    loads, dumps, sort = orjson.loads, orjson.dumps, orjson.OPT_SORT_KEYS
    for value, t, p, o in zip(values, topics, parts, offsets, strict=True):
        # Fast path for well-formed envelopes; anything unusual goes through envelope.parse,
        # which validates fully and names the record in its error.
        try:
            doc = loads(value)
            op = doc["op"]
            table = doc["table"]
            key = doc["key"]
            after = doc["after"]
            pos = doc["source"]["pos"]
            ok = (
                op in _OPS
                and type(table) is str
                and table
                and type(key) is dict
                and key
                and type(pos) is int
                and 0 <= pos <= MAX_POS
                and type(doc["source"]["ts_ms"]) is int
                and ((after is None) if op == "d" else (type(after) is dict and all(k in after for k in key)))
            )
        except Exception:
            ok = False
        if not ok:
            ev = parse(value, f"{t}[{p}]@{o}")
            table, key, pos, op, after = ev.table, ev.key, ev.pos, ev.op, ev.after
        tables.append(table)
        keys.append(dumps(key, option=sort).decode())
        poss.append(pos)
        ops.append(op)
        afters.append(None if after is None else dumps(after).decode())
    stamps = records.column("timestamp")
    if not pa.types.is_timestamp(stamps.type) or stamps.type != CHANGE_SCHEMA.field("timestamp").type:
        stamps = stamps.cast(pa.timestamp("ms")).cast(CHANGE_SCHEMA.field("timestamp").type)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(topics, pa.string()),
            pa.array(parts, pa.int32()),
            pa.array(offsets, pa.int64()),
            stamps if isinstance(stamps, pa.Array) else stamps.combine_chunks(),
            pa.array(tables, pa.string()),
            pa.array(keys, pa.string()),
            pa.array(poss, pa.int64()),
            pa.array(ops, pa.string()),
            pa.array(afters, pa.string()),
            pa.array([1] * len(poss), pa.int32()),
        ],
        schema=CHANGE_SCHEMA,
    )


def map_to_changes(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Run once per input partition (one range of one topic-partition): log records in, the
    newest change per row out.

    Collapsing here, in parallel, shrinks what the driver receives and the target writes. The
    partition's last record is always kept, so the driver still sees how far the range went
    (the next offset to record) even if an out-of-order source made that record stale."""
    parsed = [to_changes(b) for b in batches if b.num_rows]
    if not parsed:
        return
    changes = pa.Table.from_batches(parsed)
    newest = collapse(changes)
    last = changes.slice(changes.num_rows - 1, 1)
    if newest.num_rows and not _contains(newest, last):
        # Kept for its offset only: it was counted in the collapsed row of its key already.
        last = last.set_column(last.column_names.index("records"), "records", pa.array([0], pa.int32()))
        newest = pa.concat_tables([newest, last.select(newest.column_names)])
    yield from newest.to_batches()


def _contains(table: pa.Table, row: pa.Table) -> bool:
    here = pc.and_(
        pc.equal(table["partition"], row["partition"][0]), pc.equal(table["offset"], row["offset"][0])
    )
    return bool(pc.any(pc.and_(here, pc.equal(table["topic"], row["topic"][0]))).as_py())


def collapse(changes: pa.Table) -> pa.Table:
    """The newest change (highest pos) per (table, key)."""
    if changes.num_rows == 0:
        return changes
    row_ids = pc.binary_join_element_wise(changes["table"], changes["key"], "\x00")
    if pc.count_distinct(row_ids).as_py() == changes.num_rows:
        return changes  # already one change per row (collapsed in the executors)
    ordered = changes.sort_by([("pos", "ascending")])
    rest = [c for c in ordered.column_names if c not in ("table", "key", "records")]
    # skip_nulls=False: a delete's null `after` must win over the upserts before it.
    keep_nulls = pc.ScalarAggregateOptions(skip_nulls=False)
    aggs = [(c, "last", keep_nulls) for c in rest] + [("records", "sum")]
    grouped = ordered.group_by(["table", "key"], use_threads=False).aggregate(aggs)
    grouped = grouped.rename_columns([n.rsplit("_", 1)[0] if n.endswith(("_last", "_sum")) else n
                                      for n in grouped.column_names])  # fmt: skip
    grouped = grouped.set_column(
        grouped.column_names.index("records"), "records", pc.cast(grouped["records"], pa.int32())
    )
    return grouped.select(changes.column_names)
