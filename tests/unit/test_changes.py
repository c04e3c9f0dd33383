"""The change envelope, its columnar form and collapsing: pure functions over Arrow tables."""

from __future__ import annotations

import orjson
import pyarrow as pa
import pytest

from sluice.sync.changes import CHANGE_SCHEMA, collapse, map_to_changes, to_changes
from sluice.sync.envelope import BadEventError, ChangeEvent, key_text, parse, record_key
from sluice.sync.targets.base import batch_next_offsets, drop_applied
from tests.support.changes import event, records


def test_envelope_round_trip_and_record_key() -> None:
    ev = ChangeEvent(op="u", table="orders", key={"id": 7}, before={"id": 7, "s": "a"},
                     after={"id": 7, "s": "b"}, pos=42, commit_ts_ms=5, txid=3)  # fmt: skip
    doc = orjson.loads(ev.to_json())
    assert doc["source"]["pos"] == 42 and doc["source"]["ts_ms"] == 5 and doc["op"] == "u"
    assert parse(ev.to_json()) == ChangeEvent(
        op="u", table="orders", key={"id": 7}, before={"id": 7, "s": "a"}, after={"id": 7, "s": "b"},
        pos=42, commit_ts_ms=5, connector="generator", source_name="", txid=3, ts_ms=5,
    )  # fmt: skip
    # Every change of a row has the same record key, whatever the key's column order.
    assert record_key("t", {"a": 1, "b": 2}) == record_key("t", {"b": 2, "a": 1})
    assert key_text({"b": 2, "a": 1}) == '{"a":1,"b":2}'


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (b"not json", "is not JSON"),
        (b"[1]", "not a JSON object"),
        (b'{"op":"x"}', "op must be one of"),
        (
            b'{"op":"c","table":"t","key":{"id":1},"after":{"id":1},"source":{"pos":-1,"ts_ms":1}}',
            "source.pos",
        ),
        (b'{"op":"c","table":"t","key":{"id":1},"after":{"x":1},"source":{"pos":1,"ts_ms":1}}', "key column"),
        (
            b'{"op":"d","table":"t","key":{"id":1},"after":{"id":1},"source":{"pos":1,"ts_ms":1}}',
            "after = null",
        ),
        (b'{"op":"u","table":"t","key":{},"after":{"id":1},"source":{"pos":1,"ts_ms":1}}', "key must be"),
        (None, "empty record"),
    ],
)
def test_bad_envelopes_are_named_by_position(value: bytes | None, message: str) -> None:
    with pytest.raises(BadEventError, match=message):
        parse(value, "t[0]@9")
    with pytest.raises(BadEventError, match=r"t\[0\]@9"):
        parse(value, "t[0]@9")


def test_to_changes_fast_path_matches_full_parse() -> None:
    evs = [
        event("c", 1, 1, name="a"),
        event("u", 2, 1, name="b"),
        event("d", 3, 2),
        event("r", 4, {"x": "k", "y": 2}, v=1.5),
    ]
    out = to_changes(records(evs))
    assert out.schema == CHANGE_SCHEMA
    for row, ev in zip(out.to_pylist(), evs, strict=True):
        full = parse(ev.to_json())
        assert (row["table"], row["key"], row["pos"], row["op"]) == (
            full.table,
            key_text(full.key),
            full.pos,
            full.op,
        )
        assert (orjson.loads(row["after"]) if row["after"] else None) == full.after


def test_to_changes_names_the_bad_record() -> None:
    with pytest.raises(BadEventError, match=r"t\[0\]@11: op must be"):
        to_changes(records([event("c", 1), b'{"op":"z"}'], start=10))


def test_collapse_keeps_the_newest_change_per_row_and_a_delete_wins_with_null_after() -> None:
    evs = [event("c", 1, 1, v="a"), event("u", 5, 1, v="b"), event("d", 9, 1), event("u", 3, 2, v="x"),
           event("u", 2, 2, v="older")]  # fmt: skip
    out = collapse(pa.Table.from_batches([to_changes(records(evs))]))
    rows = {r["key"]: r for r in out.to_pylist()}
    assert (
        rows['{"id":1}']["op"] == "d" and rows['{"id":1}']["after"] is None and rows['{"id":1}']["pos"] == 9
    )
    assert orjson.loads(rows['{"id":2}']["after"])["v"] == "x"  # highest pos, not last offset
    assert sum(r["records"] for r in rows.values()) == len(evs)


def test_read_task_collapse_keeps_the_last_offset_for_the_next_offset() -> None:
    # The last record is stale (an out-of-order source): it is kept, counted zero times.
    evs = [event("u", 10, 1, v="new"), event("u", 4, 1, v="stale")]
    out = pa.Table.from_batches(list(map_to_changes(records(evs, start=100).to_batches())))
    assert batch_next_offsets(out) == {("t", 0): 102}
    assert sum(out["records"].to_pylist()) == 2
    newest = collapse(out)
    assert [orjson.loads(a)["v"] for a in newest["after"].to_pylist()] == ["new"]


def test_drop_applied_filters_per_partition() -> None:
    t = pa.concat_tables([records([event("c", i) for i in range(5)], partition=p) for p in (0, 1)])
    kept = drop_applied(t, {("t", 0): 3, ("t", 1): 0, ("other", 0): 99})
    assert sorted(zip(kept["partition"].to_pylist(), kept["offset"].to_pylist(), strict=True)) == [
        (0, 3), (0, 4), (1, 0), (1, 1), (1, 2), (1, 3), (1, 4)
    ]  # fmt: skip


def test_changes_sharing_a_position_collapse_to_the_last_in_the_log() -> None:
    """A PostgreSQL transaction's changes share its commit position: an insert, an update and a
    delete of one row in one transaction end as the delete; an insert then an update, as the
    update. Both collapses (the executors' and the driver's) agree."""
    evs = [event("c", 7, 1, v="a"), event("u", 7, 1, v="b"), event("d", 7, 1),
           event("c", 7, 2, v="x"), event("u", 7, 2, v="y")]  # fmt: skip
    for out in (
        collapse(pa.Table.from_batches([to_changes(records(evs))])),
        collapse(pa.Table.from_batches(list(map_to_changes(records(evs).to_batches())))),
    ):
        rows = {r["key"]: r for r in out.to_pylist()}
        assert rows['{"id":1}']["op"] == "d" and rows['{"id":1}']["after"] is None
        assert orjson.loads(rows['{"id":2}']["after"])["v"] == "y"
