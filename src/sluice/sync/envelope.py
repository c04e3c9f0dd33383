"""The change event: one JSON envelope per row change, in the shape Debezium users know.

    {"op": "u",                               c insert, u update, d delete, r snapshot read
     "table": "orders",
     "key": {"id": 17},                       the primary key columns
     "before": {...} | null,                  the row before (null for c and r)
     "after": {...} | null,                   the row after (null for d)
     "source": {"connector": "generator", "name": "demo", "pos": 1234, "txid": 88,
                "ts_ms": 1763800000123},      pos orders every change of one source;
                                              ts_ms is the source commit time
     "ts_ms": 1763800000125}                  when the capture wrote the event

A capture may also write a position marker to each partition (op `m`, table `_sluice`, key
`{"partition": N}`, no images): it changes no row, and tells a restarted capture where it can
resume from (see sources/mysql.py). Targets skip markers.

A truncate (op `t`: TRUNCATE, DROP TABLE, or the old name of a RENAME TABLE) names a table and
no row (`key` is `{}`): it is written to every partition of the table's topic, and a target
removes every row of the table older than its position and keeps the position as the table's
watermark, so that no older change of any row can bring one back.

A schema change (op `s`: a column added, dropped, renamed or retyped, a table created or
dropped; see sync/schema.py) names a table and no row (`key` `{}`, before and after null) and
carries a `schema` object:

    {"change": "rename_column", "ddl": "ALTER TABLE t RENAME COLUMN a TO b",
     "column": "a", "new_name": "b", "type": null, "widening": false}

It is written at the statement's position (each change of a statement one higher than the one
before) to every partition of the table's topic, like a truncate; a target records it by
position and applies it by the task's schema_change_policy. Row events of a MySQL source carry
`source.schema`: the position of the last schema change of their table the capture had seen
(0 if none).

Values are JSON; bytes (BLOB, BINARY columns) are base64 text, and the envelope's `binary`
lists the columns (of key, before and after) that hold such values, so that targets store
bytes as bytes and text as text. A source that knows its schema (MySQL/MariaDB) also names
each column's type in `types` (`{"id": "bigint(20) unsigned", "at": "timestamp(3)"}`): the
value of every column is the canonical one sync/types.py gives that type, and targets make
their columns from the types, not from the values.

The record key is `[table, key]` as canonical JSON, so every change of one row lands in the same
partition, in order. `source.pos` is a non-negative integer (at most 2**63 - 1) that grows with
every change of a source: targets keep it per row and never let an older position replace a
newer one.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
from dataclasses import dataclass
from typing import Any

import orjson

from sluice.sync.schema import KINDS

OPS = frozenset({"c", "u", "d", "r"})
MARKER = "m"
MARKER_TABLE = "_sluice"
TRUNCATE = "t"
SCHEMA = "s"
MAX_POS = 2**63 - 1
#: Tables whose names start with this are Sluice's own in every target (fence, offsets,
#: tombstones, truncate watermarks): no change event may name one.
RESERVED_PREFIX = "_sluice"


class BadEventError(ValueError):
    """A record that is not a valid change event. The message names where it was found."""


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    op: str
    table: str
    key: dict[str, Any]
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    pos: int
    commit_ts_ms: int
    connector: str = "generator"
    source_name: str = ""
    txid: int | None = None
    ts_ms: int | None = None
    binary: tuple[str, ...] = ()
    schema: dict[str, Any] | None = None  # op s only
    types: dict[str, str] | None = None  # column -> the source's type (sync/types.py)

    @property
    def is_delete(self) -> bool:
        return self.op == "d"

    def record_key(self) -> bytes:
        return record_key(self.table, self.key)

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                **({"binary": list(self.binary)} if self.binary else {}),
                **({"schema": self.schema} if self.schema is not None else {}),
                **({"types": self.types} if self.types is not None else {}),
                "op": self.op,
                "table": self.table,
                "key": self.key,
                "before": self.before,
                "after": self.after,
                "source": {
                    "connector": self.connector,
                    "name": self.source_name,
                    "pos": self.pos,
                    "txid": self.txid,
                    "ts_ms": self.commit_ts_ms,
                },
                "ts_ms": self.ts_ms if self.ts_ms is not None else self.commit_ts_ms,
            },
            default=encode_value,
        )


def encode_value(value: Any) -> Any:
    """JSON for the values orjson does not encode itself: bytes as base64 text (the envelope's
    `binary` names such columns), decimals as their exact text, dates and times as ISO-like
    text, sets (MySQL SET columns) as sorted lists."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (dt.date, dt.time, dt.timedelta)):
        return str(value)
    if isinstance(value, set):
        return sorted(value)
    raise TypeError(f"cannot encode {type(value).__name__}")


def binary_columns(*images: dict[str, Any] | None) -> list[str]:
    """Columns of the images that hold bytes (sorted, each once).

    On the capture's hot path: an image whose values are all of types that are never bytes (a
    check done in C) is not walked column by column."""
    found: set[str] = set()
    for image in images:
        if image and not _NOT_BYTES.issuperset(map(type, image.values())):
            found.update(c for c, v in image.items() if isinstance(v, (bytes, bytearray)))
    return sorted(found)


#: Value types that are never bytes: an image holding only these has no binary column.
_NOT_BYTES = frozenset(
    {type(None), bool, int, float, str, decimal.Decimal, dt.datetime, dt.date, dt.time, dt.timedelta,
     dict, list, set}
)  # fmt: skip


def record_key(table: str, key: dict[str, Any]) -> bytes:
    return orjson.dumps([table, key], option=orjson.OPT_SORT_KEYS, default=encode_value)


def key_text(key: dict[str, Any]) -> str:
    """Canonical text of a primary key, used to name a row in tombstones and comparisons
    (bytes as base64, as in the envelope)."""
    return orjson.dumps(key, option=orjson.OPT_SORT_KEYS, default=encode_value).decode()


def is_reserved(table: str) -> bool:
    return table.lower().startswith(RESERVED_PREFIX)


def parse(value: bytes | memoryview | None, where: str = "") -> ChangeEvent:
    """Decode and validate one envelope; errors say what is wrong and `where` it was read."""
    at = f" at {where}" if where else ""
    if value is None:
        raise BadEventError(f"empty record{at}: a change event needs a JSON value")
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise BadEventError(f"record{at} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadEventError(f"record{at} is not a JSON object")
    op = doc.get("op")
    if op not in OPS and op not in (MARKER, TRUNCATE, SCHEMA):
        raise BadEventError(f"record{at}: op must be one of c, u, d, r, t, s (or m), not {op!r}")
    table = doc.get("table")
    if not isinstance(table, str) or not table:
        raise BadEventError(f"record{at}: table must be a non-empty string")
    if is_reserved(table) and not (op == MARKER and table == MARKER_TABLE):
        raise BadEventError(
            f"record{at} names table {table!r}: names starting with {RESERVED_PREFIX} are Sluice's own "
            "tables in the target (fence, offsets, tombstones), which no change may touch"
        )
    key = doc.get("key")
    if not isinstance(key, dict) or (not key and op not in (TRUNCATE, SCHEMA)):
        raise BadEventError(f"record{at}: key must be an object with the primary key columns")
    before, after = doc.get("before"), doc.get("after")
    for name, part in (("before", before), ("after", after)):
        if part is not None and not isinstance(part, dict):
            raise BadEventError(f"record{at}: {name} must be an object or null")
    binary = doc.get("binary") or []
    if not isinstance(binary, list) or not all(isinstance(c, str) for c in binary):
        raise BadEventError(f"record{at}: binary must be a list of column names")
    types = doc.get("types")
    if types is not None and not (
        isinstance(types, dict) and all(isinstance(v, str) for v in types.values())
    ):
        raise BadEventError(f"record{at}: types must be an object of column -> type name")
    schema = doc.get("schema")
    if op == TRUNCATE:
        if after is not None or key:
            raise BadEventError(f"record{at}: a truncate (op t) names no row: key {{}} and after null")
    elif op == SCHEMA:
        if after is not None or before is not None or key:
            raise BadEventError(
                f"record{at}: a schema change (op s) names no row: key {{}}, before and after null"
            )
        _check_schema(schema, at)
    elif op in ("d", MARKER):
        if after is not None:
            raise BadEventError(f"record{at}: a delete (op d) must have after = null")
    elif after is None:
        raise BadEventError(f"record{at}: op {op} needs an after image")
    else:
        missing = [k for k in key if k not in after]
        if missing:
            raise BadEventError(f"record{at}: after lacks the key column(s) {', '.join(missing)}")
    source = doc.get("source")
    if not isinstance(source, dict):
        raise BadEventError(f"record{at}: source must be an object with pos and ts_ms")
    pos = source.get("pos")
    if not isinstance(pos, int) or isinstance(pos, bool) or not 0 <= pos <= MAX_POS:
        raise BadEventError(f"record{at}: source.pos must be an integer in 0..2**63-1, not {pos!r}")
    commit_ts = source.get("ts_ms")
    if not isinstance(commit_ts, int) or isinstance(commit_ts, bool):
        raise BadEventError(f"record{at}: source.ts_ms must be an integer (epoch milliseconds)")
    txid = source.get("txid")
    ts_ms = doc.get("ts_ms")
    return ChangeEvent(
        op=op,
        table=table,
        key=key,
        before=before,
        after=after,
        pos=pos,
        commit_ts_ms=commit_ts,
        connector=str(source.get("connector", "")),
        source_name=str(source.get("name", "")),
        txid=txid if isinstance(txid, int) else None,
        ts_ms=ts_ms if isinstance(ts_ms, int) else None,
        binary=tuple(binary),
        schema=schema if op == SCHEMA else None,
        types=types,
    )


def _check_schema(schema: Any, at: str) -> None:
    if not isinstance(schema, dict):
        raise BadEventError(f"record{at}: a schema change (op s) needs a schema object")
    kind = schema.get("change")
    if kind not in KINDS:
        known = ", ".join(sorted(KINDS))
        raise BadEventError(f"record{at}: schema.change must be one of {known}, not {kind!r}")
    if not isinstance(schema.get("ddl"), str):
        raise BadEventError(f"record{at}: schema.ddl must be the statement's text")
    for name in ("column", "new_name", "type"):
        if schema.get(name) is not None and not isinstance(schema[name], str):
            raise BadEventError(f"record{at}: schema.{name} must be a string or null")
    if not isinstance(schema.get("widening", False), bool):
        raise BadEventError(f"record{at}: schema.widening must be true or false")
    if schema["change"] in ("add_column", "drop_column", "rename_column", "change_type") and not schema.get(
        "column"
    ):
        raise BadEventError(f"record{at}: a {schema['change']} needs schema.column")
    if schema["change"] == "rename_column" and not schema.get("new_name"):
        raise BadEventError(f"record{at}: a rename_column needs schema.new_name")
