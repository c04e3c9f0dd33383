"""Debezium MySQL change events as Sluice's envelope (sync/debezium.py): the JSON converter's
two shapes, the position the version guard keeps, and clear errors for what cannot be applied."""

from __future__ import annotations

from typing import Any

import orjson
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.sync.changes import to_changes
from sluice.sync.debezium import OFFSET_BITS, binlog_position, to_envelope, to_envelope_bytes
from sluice.sync.envelope import BadEventError, parse


def _source(file: str = "mysql-bin.000003", pos: int = 1276, row: int = 0, **more: Any) -> dict[str, Any]:
    return {"version": "3.6.1.Final", "connector": "mysql", "name": "dbz", "ts_ms": 1795721090000,
            "snapshot": "false", "db": "shop", "table": "items", "server_id": 1, "gtid": None,
            "file": file, "pos": pos, "row": row, **more}  # fmt: skip


def _event(op: str, before: Any, after: Any, **source: Any) -> dict[str, Any]:
    return {"before": before, "after": after, "source": _source(**source), "op": op, "ts_ms": 1795721090872}


def _with_schema(payload: Any) -> bytes:
    """What the JSON converter writes with schemas.enable=true (the schema's content does not matter)."""
    return orjson.dumps({"schema": {"type": "struct", "optional": False}, "payload": payload})


def test_an_update_becomes_sluices_envelope_with_the_binlog_position() -> None:
    ev = _event("u", {"id": 1, "qty": 1}, {"id": 1, "qty": 9}, pos=1276, row=2)
    env = to_envelope(b'{"id":1}', orjson.dumps(ev))
    assert env is not None
    assert env["op"] == "u" and env["table"] == "items" and env["key"] == {"id": 1}
    assert env["after"] == {"id": 1, "qty": 9}
    assert env["source"]["pos"] == 3 << OFFSET_BITS | 1278
    assert env["source"]["ts_ms"] == 1795721090000
    parsed = parse(orjson.dumps(env))  # a valid Sluice envelope
    assert parsed.pos == 3 << OFFSET_BITS | 1278 and parsed.op == "u"


def test_schemas_enable_true_and_false_give_the_same_envelope() -> None:
    ev = _event("c", None, {"id": 7, "qty": 3})
    plain = to_envelope(b'{"id":7}', orjson.dumps(ev))
    wrapped = to_envelope(_with_schema({"id": 7}), _with_schema(ev))
    assert plain == wrapped and plain is not None and plain["key"] == {"id": 7}


def test_a_delete_keeps_no_after_image_and_its_tombstone_changes_nothing() -> None:
    env = to_envelope(b'{"id":2}', orjson.dumps(_event("d", {"id": 2, "qty": 2}, None)))
    assert env is not None and env["op"] == "d" and env["after"] is None
    assert to_envelope(b'{"id":2}', None) is None
    assert to_envelope_bytes(b'{"id":2}', None) is None


def test_snapshot_rows_are_below_every_later_binlog_change() -> None:
    snap = to_envelope(b'{"id":1}', orjson.dumps(_event("r", None, {"id": 1}, pos=917, snapshot="true")))
    later = to_envelope(b'{"id":1}', orjson.dumps(_event("u", {"id": 1}, {"id": 1}, pos=1096)))
    assert snap is not None and later is not None
    assert snap["source"]["pos"] < later["source"]["pos"]


def test_a_row_changed_twice_in_one_transaction_ends_at_its_last_image() -> None:
    """Two rows events of one transaction (Debezium: one pos each), and one event changing the
    row as its third image: the collapse keeps the newest."""
    records = [
        (b'{"id":1}', _event("u", {"id": 1, "qty": 1}, {"id": 1, "qty": 9}, pos=1276)),
        (b'{"id":1}', _event("u", {"id": 1, "qty": 9}, {"id": 1, "qty": 10}, pos=1469)),
        (b'{"id":1}', _event("u", {"id": 1, "qty": 10}, {"id": 1, "qty": 11}, pos=1654, row=0)),
        (b'{"id":3}', _event("u", {"id": 3, "qty": 3}, {"id": 3, "qty": 4}, pos=1654, row=2)),
        # one statement changing one row twice (INSERT ... ON DUPLICATE KEY UPDATE, the key
        # repeated): one rows event, two rows
        (b'{"id":5}', _event("c", None, {"id": 5, "qty": 1}, pos=1885, row=0)),
        (b'{"id":5}', _event("u", {"id": 5, "qty": 1}, {"id": 5, "qty": 2}, pos=1885, row=1)),
    ]
    values = [to_envelope_bytes(k, orjson.dumps(v)) for k, v in records]
    table = pa.table(
        {
            "topic": ["dbz.shop.items"] * len(values),
            "partition": [0] * len(values),
            "offset": list(range(len(values))),
            "value": values,
            "timestamp": [0] * len(values),
        }
    )
    out = to_changes(table, collapse=True).to_pylist()
    newest = {r["key"]: orjson.loads(r["after"]) for r in out if r["records"]}
    assert newest['{"id":1}']["qty"] == 11 and newest['{"id":3}']["qty"] == 4
    assert newest['{"id":5}']["qty"] == 2


@given(
    st.lists(
        st.tuples(
            st.integers(1, 3), st.one_of(st.integers(4, 300), st.integers(4, 2**32)), st.integers(0, 50)
        ),
        min_size=2,
        max_size=20,
    )
)
def test_positions_order_as_binlog_coordinates_do(coords: list[tuple[int, int, int]]) -> None:
    """(file, pos + row) order is the encoded order: the guard compares what the binlog orders."""
    encoded = [binlog_position({"file": f"mysql-bin.{f:06d}", "pos": p, "row": r}) for f, p, r in coords]
    by_coords = sorted(range(len(coords)), key=lambda i: (coords[i][0], coords[i][1] + coords[i][2]))
    assert [encoded[i] for i in by_coords] == sorted(encoded)


def test_a_truncate_becomes_sluices_truncate_of_the_table() -> None:
    """Debezium's truncate has no record key and no images: Sluice's names the table only."""
    env = to_envelope(None, orjson.dumps(_event("t", None, None, pos=9000)))
    assert env is not None
    assert env["op"] == "t" and env["table"] == "items" and env["key"] == {}
    assert env["before"] is None and env["after"] is None
    parsed = parse(orjson.dumps(env))  # a valid Sluice truncate
    assert parsed.op == "t" and parsed.pos == 3 << OFFSET_BITS | 9000


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (b'{"id":1}', b"not json", "is not JSON"),
        (b'{"id":1}', b'{"id": 1, "qty": 3}', "is not a change event"),
        (b'{"id":1}', orjson.dumps(_event("x", None, None)), "op 'x' cannot be applied"),
        (None, orjson.dumps(_event("c", None, {"id": 1})), "no primary key"),
        (b'{"id":1}', orjson.dumps({**_event("c", None, {"id": 1}), "source": {"table": "items"}}),
         "has no binlog position"),
        (b'{"id":1}', orjson.dumps(_event("c", None, {"id": 1}, file="binlog")), "does not end in a number"),
    ],
)  # fmt: skip
def test_records_that_cannot_be_applied_say_why(key: bytes | None, value: bytes, message: str) -> None:
    with pytest.raises(BadEventError, match=message):
        to_envelope(key, value, "dbz.shop.items[0]@5")
