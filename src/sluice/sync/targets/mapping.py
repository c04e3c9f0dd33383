"""How a pipeline's source tables land in the target: the `mapping` of a task or pipeline
definition (a table's name there, renamed, dropped and cast columns), checked when it is read.
Below targets/base.py and targets/evolution.py, which both apply it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sluice.sync.envelope import is_reserved

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


class MappingError(ValueError):
    pass


def check_identifier(name: str, what: str) -> str:
    if not _IDENT.match(name):
        raise MappingError(f"{what} {name!r} is not a plain SQL identifier (letters, digits, _)")
    if what.endswith("table") and is_reserved(name):
        raise MappingError(f"{what} {name!r}: names starting with _sluice are Sluice's own tables")
    return name


@dataclass
class TableMapping:
    """How one source table lands in the target: its name there, renamed, dropped and cast columns."""

    target: str | None = None
    rename: dict[str, str] = field(default_factory=dict)
    drop: list[str] = field(default_factory=list)
    casts: dict[str, str] = field(default_factory=dict)  # target column -> SQL type


_CAST_TYPE = re.compile(r"^[A-Za-z][A-Za-z0-9_ ]*(\(\s*\d+\s*(,\s*\d+\s*)?\))?$")


@dataclass
class ColumnMapping:
    """Column mapping from a pipeline's config:

    {"orders": {"table": "shop_orders", "rename": {"amount_cents": "amount"},
                "drop": ["note"], "casts": {"amount": "numeric(12,2)"}}}
    """

    tables: dict[str, TableMapping] = field(default_factory=dict)

    @classmethod
    def from_config(cls, doc: Mapping[str, Any] | None) -> ColumnMapping:
        out: dict[str, TableMapping] = {}
        for table, spec in (doc or {}).items():
            where = f"mapping.{table}"
            if not isinstance(spec, Mapping):
                raise MappingError(f"{where} must be a mapping with table/rename/drop/casts")
            unknown = set(spec) - {"table", "rename", "drop", "casts"}
            if unknown:
                raise MappingError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
            tm = TableMapping(
                target=spec.get("table"),
                rename=dict(spec.get("rename") or {}),
                drop=list(spec.get("drop") or []),
                casts=dict(spec.get("casts") or {}),
            )
            if tm.target is not None:
                check_identifier(str(tm.target), f"{where}.table")
            for src, dst in tm.rename.items():
                check_identifier(str(dst), f"{where}.rename.{src}")
            for col, typ in tm.casts.items():
                if not isinstance(typ, str) or not _CAST_TYPE.match(typ):
                    raise MappingError(f"{where}.casts.{col}: {typ!r} is not a SQL type name")
            out[str(table)] = tm
        return cls(out)

    def for_table(self, table: str) -> TableMapping:
        return self.tables.get(table) or TableMapping()

    def target_table(self, table: str) -> str:
        return check_identifier(self.for_table(table).target or table, "table")

    def target_column(self, table: str, column: str) -> str | None:
        """The target column for a source column, or None when the mapping drops it."""
        tm = self.for_table(table)
        if column in tm.drop:
            return None
        return check_identifier(tm.rename.get(column, column), "column")
