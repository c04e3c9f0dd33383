"""The schema step of a target's batch: schema changes by the task's policy, then row images
translated to the target's columns.

Schema changes (op `s`) are applied in position order, after the batch's truncates and before
its rows, each recorded in `_sluice_schema` (table, position, change, applied) in the same
transaction. A change already recorded is skipped: a replayed batch changes nothing.

`schema_change_policy`:

- evolve (default): the target follows the source: a dropped column is dropped, a renamed one
  renamed, a changed type changed (see each target), a dropped table dropped (its truncate
  watermark stays, so no older row comes back); a created table is recorded (its first rows
  create it).
- ignore: the target keeps its tables' columns. Rows keep flowing onto them: a renamed column's
  values go to the column under its old name, a column the target lacks is left out of the row.
  A widening type change is still applied; a dropped table's rows are removed (its truncate)
  and the table kept.
- stop: a change that would alter or lose what the target holds (a dropped or renamed column, a
  narrowing type change, a dropped table) fails the batch with SchemaChangeStopped: nothing of
  it is committed, and the task pauses until its policy is updated. Added columns, new tables
  and widening type changes go through as under evolve.

Then every row image older than an applied rename or drop, or newer than a rename that was not
applied, is translated (sync/schema.py), so each row lands in the columns its values belong to.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from sluice.sync.envelope import SCHEMA
from sluice.sync.schema import (
    CHANGE_TYPE,
    DROP_COLUMN,
    DROP_TABLE,
    POLICIES,
    RENAME_COLUMN,
    Recorded,
    SchemaChange,
    needs_translation,
    translate_columns,
)
from sluice.sync.targets.mapping import ColumnMapping


class SchemaTarget(Protocol):
    """What the schema steps need of a target: its policy and mapping, the recorded history and
    its own DDL (targets/base.py `Target` declares all of it; its subclasses supply the SQL)."""

    schema_change_policy: str
    mapping: ColumnMapping

    def _read_schema_history(self, tx: Any, tables: list[str]) -> dict[str, list[Recorded]]: ...

    def _record_schema_change(
        self, tx: Any, table: str, pos: int, doc: Mapping[str, Any], applied: bool
    ) -> bool: ...

    def _existing_columns(self, tx: Any, name: str) -> list[str]: ...

    def _drop_column(self, tx: Any, name: str, column: str) -> None: ...

    def _rename_column(self, tx: Any, name: str, old: str, new: str) -> None: ...

    def _change_column_type(self, tx: Any, name: str, column: str, source_type: str) -> None: ...

    def _drop_table(self, tx: Any, name: str) -> None: ...


log = logging.getLogger("sluice.target")


class SchemaChangeStopped(RuntimeError):
    """A schema change met the policy `stop`: the batch was rolled back."""

    def __init__(self, task: str, table: str, ddl: str, pos: int, change: SchemaChange) -> None:
        super().__init__(
            f"task {task!r}: the source changed table {table!r} at position {pos} ({change.kind}: "
            f"{ddl!r}) and task.options.schema_change_policy is stop, so nothing of the batch was "
            f"committed and the task is paused. Choose how the target takes it: set "
            f"schema_change_policy to evolve (apply it to the target) or ignore (keep the target's "
            f"columns) with `sluice task update --file TASK.yaml`, then `sluice task resume {task}`; "
            f"the task starts again from this change"
        )
        self.task = task
        self.table = table
        self.ddl = ddl
        self.pos = pos
        self.change = change

    def detail(self) -> dict[str, Any]:
        return {"task": self.task, "table": self.table, "ddl": self.ddl, "position": self.pos,
                "change": self.change.kind, "detail": str(self)}  # fmt: skip


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise ValueError(
            f"task.options.schema_change_policy: must be one of {', '.join(POLICIES)}, not {policy!r}"
        )
    return policy


def schema_step(target: SchemaTarget, tx: Any, pipeline: str, changes: pa.Table) -> pa.Table:
    """Apply the batch's schema changes (collapsed changes, `sync.changes` columns) and return its
    rows, translated to the target's columns."""
    is_schema = pc.equal(changes["op"], SCHEMA)
    if pc.any(is_schema).as_py():
        events = changes.filter(is_schema).sort_by([("pos", "ascending")])
        for table, pos, doc in zip(
            events["table"].to_pylist(), events["pos"].to_pylist(), events["after"].to_pylist(), strict=True
        ):
            _apply_one(target, tx, pipeline, table, pos, orjson.loads(doc))
        changes = changes.filter(pc.invert(is_schema))
    if not changes.num_rows:
        return changes
    return translate_rows(target, tx, changes)


def _apply_one(
    target: SchemaTarget, tx: Any, pipeline: str, table: str, pos: int, doc: dict[str, Any]
) -> None:
    """Record one schema change and apply it by the policy (nothing when recorded already)."""
    change = SchemaChange.from_doc(doc)
    policy = target.schema_change_policy
    applied = policy != "ignore" or (change.kind == CHANGE_TYPE and change.widening)
    if not target._record_schema_change(tx, table, pos, doc, applied):
        return  # recorded by an earlier commit: a replay
    if policy == "stop" and change.stops:
        raise SchemaChangeStopped(pipeline, table, str(doc.get("ddl", "")), pos, change)
    if applied:
        _evolve(target, tx, table, change)
    ddl = str(doc.get("ddl", ""))[:200]
    log.info("event=schema_change table=%s pos=%d change=%s column=%s policy=%s applied=%s ddl=%r",
             table, pos, change.kind, change.column, policy, applied, ddl)  # fmt: skip


def _evolve(target: SchemaTarget, tx: Any, table: str, change: SchemaChange) -> None:
    """Make the target's table follow `change` (what is not there to change is left alone)."""
    m = target.mapping
    name = m.target_table(table)
    columns = target._existing_columns(tx, name)
    if not columns:
        return  # no such table in the target (yet): its first rows create it as they are
    if change.kind == DROP_TABLE:
        target._drop_table(tx, name)
        return
    if change.column is None:
        return
    column = m.target_column(table, change.column)
    if column is None or column not in columns:
        return
    if change.kind == DROP_COLUMN:
        target._drop_column(tx, name, column)
    elif change.kind == RENAME_COLUMN and change.new_name:
        new = m.target_column(table, change.new_name)
        if new is not None and new not in columns:
            target._rename_column(tx, name, column, new)
    elif change.kind == CHANGE_TYPE and change.type and column not in m.for_table(table).casts:
        target._change_column_type(tx, name, column, change.type)


def translate_rows(target: SchemaTarget, tx: Any, changes: pa.Table) -> pa.Table:
    """`changes` with each image (and key, and `binary` names) in the target's column names (the
    `types` stay as the source named them: `target_types` translates them)."""
    tables = sorted(pc.unique(changes["table"]).to_pylist())
    history = target._read_schema_history(tx, tables)
    if not history:
        return changes
    keep_only: dict[str, set[str]] = {}
    if target.schema_change_policy == "ignore":
        for table, recs in history.items():
            if any(not r.applied for r in recs):
                cols = target._existing_columns(tx, target.mapping.target_table(table))
                if cols:
                    keep_only[table] = set(cols)
    # the target table was dropped after these rows: the truncate watermark refuses them, and
    # leaving them out keeps them from creating the table again, empty
    dropped = {
        table: max(drops)
        for table, recs in history.items()
        if (drops := [r.pos for r in recs if r.applied and r.change.kind == DROP_TABLE])
    }
    names, poss = changes["table"].to_pylist(), changes["pos"].to_pylist()
    keys, afters, binaries = (changes[c].to_pylist() for c in ("key", "after", "binary"))
    wanted = [pos >= dropped.get(table, -1) for table, pos in zip(names, poss, strict=True)]
    touched = not all(wanted)
    for i, (table, pos) in enumerate(zip(names, poss, strict=True)):
        recs = history.get(table, [])
        keep = keep_only.get(table)
        if not recs or (keep is None and not needs_translation(pos, recs)):
            continue
        touched = True
        key = orjson.loads(keys[i])
        after = None if afters[i] is None else orjson.loads(afters[i])
        now = translate_columns({*key, *(after or {})}, pos, recs)
        if keep is not None:
            for c, n in now.items():
                if c not in key and n is not None and target.mapping.target_column(table, n) not in keep:
                    now[c] = None
        keys[i] = orjson.dumps({now[c] or c: v for c, v in key.items()}, option=orjson.OPT_SORT_KEYS).decode()
        if after is not None:
            afters[i] = orjson.dumps({n: v for c, v in after.items() if (n := now[c]) is not None}).decode()
        if binaries[i] is not None:
            named = [n for c in orjson.loads(binaries[i]) if (n := now.get(c, c))]
            binaries[i] = orjson.dumps(named).decode()
    if not touched:
        return changes
    for col, values in (("key", keys), ("after", afters), ("binary", binaries)):
        changes = changes.set_column(changes.column_names.index(col), col, pa.array(values, pa.string()))
    return changes.filter(pa.array(wanted, pa.bool_()))


def merged_types(
    variants: Iterable[tuple[int, Mapping[str, str]]], history: Iterable[Recorded] = ()
) -> dict[str, str]:
    """The column types a table has after a batch, from the batch's `types` variants (oldest
    first, `changes.types_variants`): each variant's columns in the target's names as of its
    position (renamed, dropped: `translate_columns`), the newer variant's type winning; then
    every type change the target recorded after the newest variant (a change that came before
    the table existed there, whose rows came later or never)."""
    recs = sorted(history, key=lambda r: r.pos)
    merged: dict[str, str] = {}
    newest = -1
    for pos, types in variants:
        names = translate_columns(types, pos, recs) if recs else {c: c for c in types}
        for column, source_type in types.items():
            if (name := names[column]) is not None:
                merged[name] = source_type
        newest = max(newest, pos)
    for r in recs:
        ch = r.change
        if r.applied and r.pos > newest and ch.kind == CHANGE_TYPE and ch.type and ch.column in merged:
            merged[str(ch.column)] = ch.type
    return merged


def target_types(
    target: SchemaTarget, tx: Any, table: str, variants: Iterable[tuple[int, Mapping[str, str]]]
) -> dict[str, str]:
    """`merged_types` with the target's recorded schema changes of `table`; under `ignore`, once
    the target kept its columns through a change, only the columns it has (as `translate_rows`
    keeps the rows' values)."""
    history = target._read_schema_history(tx, [table]).get(table, [])
    merged = merged_types(variants, history)
    if target.schema_change_policy == "ignore" and any(not r.applied for r in history):
        m = target.mapping
        have = set(target._existing_columns(tx, m.target_table(table)))
        if have:
            merged = {c: t for c, t in merged.items() if m.target_column(table, c) in have}
    return merged


def history_from_rows(rows: list[tuple[str, int, Any, Any]]) -> dict[str, list[Recorded]]:
    """`_sluice_schema` rows (table, pos, change document or its JSON text, applied) by table."""
    out: dict[str, list[Recorded]] = {}
    for table, pos, doc, applied in rows:
        change = SchemaChange.from_doc(orjson.loads(doc) if isinstance(doc, (str, bytes)) else doc)
        out.setdefault(table, []).append(Recorded(int(pos), change, bool(applied)))
    return out
