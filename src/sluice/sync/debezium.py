"""Debezium's change events as Sluice's own (sync/envelope.py), for teams whose capture is
Debezium's MySQL connector running in Kafka Connect (issue 20, deploy/debezium/).

A Debezium record has the row's primary key as its record key and, as its value, the envelope
``{"before", "after", "op", "source", "ts_ms"}``; with the JSON converter's ``schemas.enable``
true each of them is wrapped as ``{"schema": ..., "payload": ...}``. ``to_envelope`` is a pure
function from one record (key and value bytes) to Sluice's envelope, or None for the records
that change no row (a delete's tombstone: a null value).

The position. Sluice's version guard needs one integer per change that grows with every change
of the source (``source.pos``). Debezium's MySQL connector gives each change ``source.file``
(the binlog file), ``source.pos`` (the start of the rows event in that file) and ``source.row``
(the row's index in the event). The position is ``file_number << 40 | (pos + row)``, the form
Sluice's own MySQL capture uses (sources/mysql.py): every row image takes at least one byte of
its event, so ``pos + row`` stays below the next event's start; a snapshot row (op ``r``) carries
the binlog position the snapshot is consistent with, below every later rows event (each
transaction after it starts with its GTID and table-map events). docs/ARCHITECTURE.md argues it
in full. A record without file/pos (another connector) is refused with a message saying so.

A truncate (op ``t``, sent when the connector's ``skipped.operations`` leaves ``t`` out) has no
row images and no record key, and Debezium writes it to one partition of the table's topic,
where Sluice's capture writes its own to every partition. One is enough: a target applies a
truncate by removing the table's rows below its position and keeping that position as the
table's watermark, which no older change of any partition passes (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

from typing import Any

import orjson

from sluice.sync.envelope import MAX_POS, TRUNCATE, BadEventError

__all__ = ["OFFSET_BITS", "binlog_position", "to_envelope", "to_envelope_bytes"]

#: As in sources/mysql.py: 40 bits of byte offset, the binlog file number above them.
OFFSET_BITS = 40
_OPS = {"c", "u", "d", "r", TRUNCATE}


def _unwrap(doc: Any) -> Any:
    """The payload of a JSON-converter record written with ``schemas.enable=true``."""
    if isinstance(doc, dict) and set(doc) == {"schema", "payload"}:
        return doc["payload"]
    return doc


def binlog_position(source: dict[str, Any], at: str = "") -> int:
    """``file_number << 40 | (pos + row)`` of a Debezium MySQL ``source`` block."""
    where = f" at {at}" if at else ""
    file, pos, row = source.get("file"), source.get("pos"), source.get("row") or 0
    if not isinstance(file, str) or not isinstance(pos, int) or isinstance(pos, bool):
        raise BadEventError(
            f"Debezium record{where} has no binlog position (source.file, source.pos): only Debezium's "
            "MySQL connector's events can be applied with --envelope debezium"
        )
    suffix = file.rsplit(".", 1)[-1]
    if not suffix.isdigit():
        raise BadEventError(f"Debezium record{where}: binlog file name {file!r} does not end in a number")
    if not isinstance(row, int) or row < 0 or pos < 0 or pos + row >= 1 << OFFSET_BITS:
        raise BadEventError(f"Debezium record{where}: source.pos {pos} / source.row {row} out of range")
    value = int(suffix) << OFFSET_BITS | (pos + row)
    if value > MAX_POS:
        raise BadEventError(f"Debezium record{where}: binlog file number {suffix} too large")
    return value


def to_envelope(key: bytes | None, value: bytes | None, at: str = "") -> dict[str, Any] | None:
    """Sluice's envelope for one Debezium record (``at`` names it in errors), or None when the
    record changes no row (a tombstone). Bad input raises BadEventError saying what is wrong."""
    where = f" at {at}" if at else ""
    if value is None:
        return None  # the tombstone after a delete (tombstones.on.delete): log compaction's
    try:
        doc = _unwrap(orjson.loads(value))
        key_doc = _unwrap(orjson.loads(key)) if key is not None else None
    except orjson.JSONDecodeError as exc:
        raise BadEventError(f"Debezium record{where} is not JSON: {exc}") from None
    if doc is None:
        return None
    if not isinstance(doc, dict) or "op" not in doc or "source" not in doc:
        raise BadEventError(
            f"Debezium record{where} is not a change event (no op/source): is the topic a table's "
            "topic, and does the connector use the JSON converter without ExtractNewRecordState?"
        )
    op = doc["op"]
    if op not in _OPS:
        raise BadEventError(
            f"Debezium record{where}: op {op!r} cannot be applied (c, u, d, r and t only): is this a "
            "MySQL connector's change event?"
        )
    source = doc["source"]
    if not isinstance(source, dict) or not isinstance(source.get("table"), str):
        raise BadEventError(f"Debezium record{where}: source.table is missing")
    before, after = doc.get("before"), doc.get("after")
    if op == TRUNCATE:  # no row, no record key: Sluice's truncate names the table only
        before, after, key_doc = None, None, {}
    elif not isinstance(key_doc, dict) or not key_doc:
        raise BadEventError(
            f"Debezium record{where} has no primary key as its record key: Sluice applies tables "
            "with a primary key (or give the connector message.key.columns)"
        )
    ts = source.get("ts_ms")
    return {
        "op": op,
        "table": source["table"],
        "key": key_doc,
        "before": before,
        "after": None if op == "d" else after,
        "source": {
            "connector": "debezium-" + str(source.get("connector", "")),
            "name": str(source.get("name", "")),
            "pos": binlog_position(source, at),
            "ts_ms": ts if isinstance(ts, int) and not isinstance(ts, bool) else 0,
            "file": source.get("file"),
            "row": source.get("row"),
            "gtid": source.get("gtid"),
        },
        "ts_ms": doc.get("ts_ms"),
    }


def to_envelope_bytes(key: bytes | None, value: bytes | None, at: str = "") -> bytes | None:
    """``to_envelope`` as the JSON Sluice's change builder reads (sync/changes.py)."""
    env = to_envelope(key, value, at)
    return None if env is None else orjson.dumps(env)
