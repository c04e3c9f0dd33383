"""Schema changes in a target: row images translated to the columns they belong to
(sync.schema), the op `s` envelope, and the policies applied to a SQLite target by hand-made
envelopes (the MariaDB end to end runs are in tests/integration/test_schema_changes.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest

from sluice.sync.envelope import BadEventError, parse
from sluice.sync.schema import Recorded, SchemaChange, translate_image
from sluice.sync.targets import open_target
from sluice.sync.targets.evolution import SchemaChangeStopped


def rec(pos: int, kind: str, column: str, new_name: str | None = None, applied: bool = True) -> Recorded:
    return Recorded(pos, SchemaChange(kind, column, new_name), applied)


def test_an_image_older_than_applied_changes_is_renamed_and_loses_dropped_columns() -> None:
    history = [
        rec(10, "rename_column", "a", "b"),
        rec(20, "drop_column", "c"),
        rec(30, "rename_column", "b", "d"),
    ]
    image = {"id": 1, "a": 5, "c": 7}
    assert translate_image(image, 5, history) == {"id": 1, "d": 5}  # older than all three
    assert translate_image({"id": 1, "b": 5, "c": 7}, 15, history) == {"id": 1, "d": 5}
    assert translate_image({"id": 1, "b": 5}, 25, history) == {"id": 1, "d": 5}
    assert translate_image({"id": 1, "d": 5}, 35, history) == {"id": 1, "d": 5}  # newer: as it is


def test_an_image_newer_than_an_ignored_rename_goes_back_to_the_old_name() -> None:
    history = [
        rec(10, "rename_column", "a", "b", applied=False),
        rec(20, "rename_column", "b", "c", applied=False),
    ]
    assert translate_image({"id": 1, "c": 5}, 25, history) == {"id": 1, "a": 5}
    assert translate_image({"id": 1, "b": 5}, 15, history) == {"id": 1, "a": 5}
    assert translate_image({"id": 1, "a": 5}, 5, history) == {"id": 1, "a": 5}
    ignored_drop = [rec(10, "drop_column", "x", applied=False)]
    assert translate_image({"id": 1, "x": 2}, 5, ignored_drop) == {"id": 1, "x": 2}


def env(op: str, pos: int, key: dict[str, Any] | None = None, after: dict[str, Any] | None = None,
        schema: dict[str, Any] | None = None) -> bytes:  # fmt: skip
    doc: dict[str, Any] = {"op": op, "table": "t", "key": key or {}, "before": None, "after": after,
                           "source": {"pos": pos, "ts_ms": 1, "schema": 0}}  # fmt: skip
    if schema is not None:
        doc["schema"] = schema
    return orjson.dumps(doc)


def change(pos: int, kind: str, ddl: str, **fields: Any) -> bytes:
    return env("s", pos, schema={"change": kind, "ddl": ddl, **fields})


def test_the_schema_envelope_is_validated() -> None:
    ev = parse(change(9, "rename_column", "ALTER TABLE t RENAME COLUMN a TO b", column="a", new_name="b"))
    assert ev.op == "s" and ev.schema is not None and ev.schema["new_name"] == "b" and ev.key == {}
    assert parse(ev.to_json()).schema == ev.schema
    with pytest.raises(BadEventError, match=r"schema\.change must be one of"):
        parse(change(9, "explode", "x"))
    with pytest.raises(BadEventError, match=r"rename_column needs schema\.new_name"):
        parse(change(9, "rename_column", "x", column="a"))
    with pytest.raises(BadEventError, match="names no row"):
        parse(env("s", 9, key={"id": 1}, schema={"change": "drop_table", "ddl": "x"}))
    with pytest.raises(BadEventError, match="needs a schema object"):
        parse(env("s", 9))


def records(values: list[bytes], partition: int = 0, first_offset: int = 0) -> pa.Table:
    n = len(values)
    return pa.table({
        "topic": pa.array(["shop.changes"] * n, pa.string()),
        "partition": pa.array([partition] * n, pa.int32()),
        "offset": pa.array(range(first_offset, first_offset + n), pa.int64()),
        "value": pa.array(values, pa.binary()),
        "timestamp": pa.array([1] * n, pa.int64()),
    })  # fmt: skip


RENAME = change(100, "rename_column", "ALTER TABLE t RENAME COLUMN a TO b", column="a", new_name="b")
DROP = change(200, "drop_column", "ALTER TABLE t DROP COLUMN c", column="c")
FIRST = records([env("c", 10, {"id": 1}, {"id": 1, "a": 1, "c": 1})])


def rows_of(url: str, policy: str, batches: list[pa.Table]) -> dict[str, dict[str, Any]]:
    with open_target(url, schema_change_policy=policy) as t:
        e = t.claim("p")
        for b in batches:
            t.apply("p", e, b)
        return t.read_rows("t")


def test_evolve_renames_and_drops_and_a_row_older_than_them_lands_in_the_new_columns(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'e.db'}"
    # partition 0 carries the changes (c dropped, then added again) and a row after them;
    # partition 1 a row written before them and its own copy of the drop, applied later
    # (partitions are read independently): the copy must not drop the new c
    add_again = change(250, "add_column", "ALTER TABLE t ADD COLUMN c INT", column="c", type="int")
    changes = records(
        [RENAME, DROP, add_again, env("c", 300, {"id": 2}, {"id": 2, "b": 2, "c": 22})], first_offset=1
    )
    late = records([env("u", 50, {"id": 3}, {"id": 3, "a": 3, "c": 3}), RENAME, DROP], partition=1)
    got = rows_of(url, "evolve", [FIRST, changes, late, changes])  # the last batch: a replay
    assert got == {
        '{"id":1}': {"id": 1, "b": 1, "c": None},
        '{"id":2}': {"id": 2, "b": 2, "c": 22},
        '{"id":3}': {"id": 3, "b": 3, "c": None},
    }


def test_ignore_keeps_the_columns_and_sends_renamed_values_to_the_old_name(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'i.db'}"
    added = change(250, "add_column", "ALTER TABLE t ADD COLUMN z INT", column="z", type="int")
    changes = records(
        [RENAME, DROP, added, env("c", 300, {"id": 2}, {"id": 2, "b": 2, "z": 9})], first_offset=1
    )
    got = rows_of(url, "ignore", [FIRST, changes])
    assert got == {'{"id":1}': {"id": 1, "a": 1, "c": 1}, '{"id":2}': {"id": 2, "a": 2, "c": None}}


def test_stop_commits_nothing_of_the_batch_and_names_the_change(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    changes = records([env("c", 50, {"id": 4}, {"id": 4, "a": 4, "c": 4}), RENAME], first_offset=1)
    with open_target(url, schema_change_policy="stop") as t:
        e = t.claim("p")
        t.apply("p", e, FIRST)
        with pytest.raises(
            SchemaChangeStopped, match=r"task 'p'.*table 't' at position 100.*schema_change_policy"
        ):
            t.apply("p", e, changes)
        assert t.applied_offsets("p") == {("shop.changes", 0): 1}
        assert list(t.read_rows("t")) == ['{"id":1}']
    # the operator chose evolve: the same batch goes through, once
    assert rows_of(url, "evolve", [changes, changes])['{"id":4}'] == {"id": 4, "b": 4, "c": 4}


def test_a_batchs_column_types_merge_through_the_recorded_changes() -> None:
    """A table's types as a batch named them (oldest first), in the target's names now: a
    renamed column under its new name, a dropped one gone (when the drop was applied), the
    newer variant's type winning, and a type change recorded after every variant applied."""
    from sluice.sync.changes import ChangeBuilder, types_variants
    from sluice.sync.targets.evolution import merged_types

    old = {"id": "int(11)", "a": "int(11)", "c": "int(11)", "w": "int(11)"}
    new = {"id": "int(11)", "b": "int(11)", "w": "int(11)"}
    history = [
        rec(10, "rename_column", "a", "b"),
        rec(20, "drop_column", "c"),
        Recorded(40, SchemaChange("change_type", "w", type="bigint"), True),
    ]
    assert merged_types([(5, old), (30, new)], history) == {"id": "int(11)", "b": "int(11)", "w": "bigint"}
    ignored = [rec(10, "rename_column", "a", "b", applied=False), rec(20, "drop_column", "c", applied=False)]
    assert merged_types([(5, old)], ignored) == old  # the target kept its columns
    assert merged_types([(5, old), (30, new)]) == {**old, **new}
    # what a builder hands over: each distinct set of types once, at its highest position
    builder = ChangeBuilder(collapse=True)
    for pos, types in ((1, old), (2, old), (7, new), (5, old)):
        doc = {"op": "u", "table": "t", "key": {"id": pos}, "before": None, "after": {"id": pos},
               "types": types, "source": {"pos": pos, "ts_ms": 1}}  # fmt: skip
        builder.add(orjson.dumps(doc), "topic", 0, pos, 1)
    texts = set(builder.batch().column("types").to_pylist())
    assert len(texts) == 1 and types_variants(texts) == [(5, old), (7, new)]
