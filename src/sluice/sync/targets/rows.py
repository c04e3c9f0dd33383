"""A batch's collapsed changes as Python rows, for the targets that write them from Python
(SQLite, MySQL/MariaDB): parsed once, bytes decoded, grouped by source table."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa

from sluice.sync.changes import TypesVariants, types_variants
from sluice.sync.targets.mapping import ColumnMapping


@dataclass(slots=True)
class Change:
    """One collapsed change: the key's text and values, the source position, the after image
    (None for a delete), bytes already decoded from the envelope's base64."""

    kt: str
    key: dict[str, Any]
    pos: int
    after: dict[str, Any] | None


def changes_by_table(changes: pa.Table) -> dict[str, tuple[list[Change], TypesVariants]]:
    """Each source table's changes, in the batch's order, and its column types' variants."""
    by_table: dict[str, list[Change]] = {}
    types: dict[str, set[str]] = {}  # per table, the `types` texts of its changes
    for table, kt, pos, after, binary, typed in zip(
        changes.column("table").to_pylist(),
        changes.column("key").to_pylist(),
        changes.column("pos").to_pylist(),
        changes.column("after").to_pylist(),
        changes.column("binary").to_pylist(),
        changes.column("types").to_pylist(),
        strict=True,
    ):
        if typed is not None:
            types.setdefault(table, set()).add(typed)
        key = orjson.loads(kt)
        image = None if after is None else orjson.loads(after)
        if binary is not None:  # base64 text back to bytes
            for col in orjson.loads(binary):
                for part in (key, image):
                    if part is not None and isinstance(part.get(col), str):
                        part[col] = base64.b64decode(part[col])
        by_table.setdefault(table, []).append(Change(kt, key, pos, image))
    return {t: (rows, types_variants(types.get(t, ()))) for t, rows in by_table.items()}


def source_columns(events: list[Change]) -> set[str]:
    cols: set[str] = set()
    for ev in events:
        cols.update(ev.after or ev.key)
    return cols


def key_targets(m: ColumnMapping, table: str, events: list[Change]) -> set[str]:
    """The target columns of the table's primary key (from the first change's key)."""
    return {dst for c in events[0].key if (dst := m.target_column(table, c)) is not None}
