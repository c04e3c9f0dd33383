"""Ground truth and the comparison of a target with it.

A `Truth` is the state a source's tables reached, keyed by canonical primary-key text
(`envelope.key_text`). `compare` puts a target's rows beside it and counts rows equal, missing
(in the truth, not the target), extra (in the target only) and different, with examples.
Values are compared after a light normalisation (booleans as 0/1, integral floats as ints),
because SQLite has no boolean type and PostgreSQL's numeric casts may widen.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson


@dataclass
class Truth:
    tables: dict[str, dict[str, dict[str, Any]]]
    key_columns: dict[str, list[str]]
    events: int = 0
    last_pos: int = 0

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(orjson.dumps(self.__dict__))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> Truth:
        doc = orjson.loads(path.read_bytes())
        return cls(**doc)

    def row_count(self) -> int:
        return sum(len(rows) for rows in self.tables.values())


@dataclass
class TableDiff:
    table: str
    equal: int = 0
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    different: list[tuple[str, dict[str, Any], dict[str, Any]]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.different)


@dataclass
class Comparison:
    tables: list[TableDiff]

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.tables)

    def totals(self) -> dict[str, int]:
        return {
            "equal": sum(t.equal for t in self.tables),
            "missing": sum(len(t.missing) for t in self.tables),
            "extra": sum(len(t.extra) for t in self.tables),
            "different": sum(len(t.different) for t in self.tables),
        }

    def summary(self) -> str:
        t = self.totals()
        text = (
            f"rows equal {t['equal']:,}, missing {t['missing']:,}, extra {t['extra']:,}, "
            f"different {t['different']:,}"
        )
        for diff in self.tables:
            for key in diff.missing[:3]:
                text += f"\n  {diff.table} {key}: missing from the target"
            for key in diff.extra[:3]:
                text += f"\n  {diff.table} {key}: in the target but not the source"
            for key, want, got in diff.different[:3]:
                text += f"\n  {diff.table} {key}: source {want} target {got}"
        return text


def _norm(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def compare(truth: Truth, target: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> Comparison:
    """`target` maps table -> key text -> row (only the truth's columns are compared)."""
    out = []
    for table in sorted(set(truth.tables) | set(target)):
        want = truth.tables.get(table, {})
        got = target.get(table, {})
        diff = TableDiff(table)
        for key, row in want.items():
            have = got.get(key)
            if have is None:
                diff.missing.append(key)
                continue
            a = {c: _norm(v) for c, v in row.items()}
            b = {c: _norm(have.get(c)) for c in row}
            if a == b:
                diff.equal += 1
            else:
                diff.different.append((key, row, {c: have.get(c) for c in row}))
        diff.extra = [k for k in got if k not in want]
        out.append(diff)
    return Comparison(out)
