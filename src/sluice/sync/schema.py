"""Schema changes as plain data: what a change is, whether a type change widens, and how a row
image written under an older (or newer) schema is translated to the target table's columns.
(The type a target gives a source type is sync/types.py's.)

A schema change (op `s` in the envelope) is one of:

    add_column     column                  the server filled it in (the table is read again)
    drop_column    column
    rename_column  column -> new_name
    change_type    column, type            type: the new source type text, e.g. "varchar(32)"
    create_table
    drop_table

`widening` says a type change loses no value: an integer to a wider integer, a string to a
longer one or to text, float to double, a decimal to one with at least as many digits on both
sides of the point, or a type of the same family and size. Everything else is narrowing or
incompatible, and a task's `schema_change_policy` decides what the target does with it.

Translation. Each target keeps the schema changes it has seen, by position, and whether it
applied them to its tables (`applied`) or kept its columns (`ignore` policy). A row image at
position p meets the target's columns after:

- every applied rename or drop with a position above p, in order (the row is older than them:
  its column a is called b now; its column c is gone);
- every rename it did not apply with a position at or below p, newest first, backwards (the
  target still calls the column by its old name).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sluice.sync.types import parse_type

ADD_COLUMN = "add_column"
DROP_COLUMN = "drop_column"
RENAME_COLUMN = "rename_column"
CHANGE_TYPE = "change_type"
CREATE_TABLE = "create_table"
DROP_TABLE = "drop_table"
KINDS = frozenset({ADD_COLUMN, DROP_COLUMN, RENAME_COLUMN, CHANGE_TYPE, CREATE_TABLE, DROP_TABLE})

#: Values of the task option `schema_change_policy` (the first is the default).
POLICIES = ("evolve", "ignore", "stop")


@dataclass(frozen=True, slots=True)
class SchemaChange:
    kind: str
    column: str | None = None
    new_name: str | None = None
    type: str | None = None  # the new source type of change_type (and of add_column when known)
    widening: bool = False

    def to_doc(self, ddl: str) -> dict[str, Any]:
        """The envelope's `schema` object."""
        return {"change": self.kind, "ddl": ddl, "column": self.column, "new_name": self.new_name,
                "type": self.type, "widening": self.widening}  # fmt: skip

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> SchemaChange:
        return cls(doc["change"], doc.get("column"), doc.get("new_name"), doc.get("type"),
                   bool(doc.get("widening")))  # fmt: skip

    @property
    def stops(self) -> bool:
        """Whether policy `stop` stops on it: an added column, a new table and a widening type
        change never do (nothing the target holds has to change shape or be lost)."""
        if self.kind in (ADD_COLUMN, CREATE_TABLE):
            return False
        return not (self.kind == CHANGE_TYPE and self.widening)


# --- types -----------------------------------------------------------------------------------------
def is_widening(old: str, new: str) -> bool:
    """Whether changing a column from type `old` to `new` keeps every value it can hold."""
    a, b = parse_type(old), parse_type(new)
    if a.family != b.family:
        return False
    if a.family == "int":
        if a.unsigned and not b.unsigned:
            return b.size > a.size  # unsigned fits a strictly wider signed type
        if not a.unsigned and b.unsigned:
            return False  # negative values
        return b.size >= a.size
    if a.family in ("float", "string", "binary", "bit"):
        return b.size >= a.size
    if a.family == "decimal":
        return b.size >= a.size and b.scale >= a.scale and b.size - b.scale >= a.size - a.scale
    if a.family == "enum":
        return set(a.members) <= set(b.members)
    if a.family == "set":  # a member is a bit: the old ones keep their places
        return b.members[: len(a.members)] == a.members
    if a.family == "temporal":
        return a.name == b.name and b.scale >= a.scale
    return a.name == b.name  # json, geometry, other: the same type only


# --- translation -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Recorded:
    """A schema change as a target recorded it."""

    pos: int
    change: SchemaChange
    applied: bool  # the target's table took it (evolve), or kept its columns (ignore)


def needs_translation(pos: int, history: Iterable[Recorded]) -> bool:
    for r in history:
        if r.change.kind not in (RENAME_COLUMN, DROP_COLUMN):
            continue
        if (r.applied and r.pos > pos) or (not r.applied and r.change.kind == RENAME_COLUMN and r.pos <= pos):
            return True
    return False


def translate_columns(columns: Iterable[str], pos: int, history: list[Recorded]) -> dict[str, str | None]:
    """Column of an image at `pos` -> its name in the target now (None: dropped there)."""
    names: dict[str, str | None] = {c: c for c in columns}

    def rename(old: str, new: str) -> None:
        for c, now in names.items():
            if now == old:
                names[c] = new

    ordered = sorted(history, key=lambda r: r.pos)
    for r in ordered:
        ch = r.change
        if not r.applied or r.pos <= pos or ch.column is None:
            continue
        if ch.kind == RENAME_COLUMN and ch.new_name:
            rename(ch.column, ch.new_name)
        elif ch.kind == DROP_COLUMN:
            for c, now in names.items():
                if now == ch.column:
                    names[c] = None
    for r in reversed(ordered):
        ch = r.change
        if r.applied or r.pos > pos or ch.kind != RENAME_COLUMN or not ch.column or not ch.new_name:
            continue
        rename(ch.new_name, ch.column)
    return names


def translate_image(image: Mapping[str, Any], pos: int, history: list[Recorded]) -> dict[str, Any]:
    """`image` (a row at `pos`) with the target's column names (see the module docstring)."""
    names = translate_columns(image, pos, history)
    return {names[c]: v for c, v in image.items() if names[c] is not None}  # type: ignore[misc]
