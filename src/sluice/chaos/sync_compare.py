"""Source rows beside target rows: the one place that says how a value read from MariaDB and a
value read back from a target are made comparable, and the row-by-row comparison itself.

Why one place: each target keeps some types in a form of its own, and the comparison must
follow the sync layer's encodings without being rewritten. A change envelope carries decimals
as exact text, dates and times as `str()`, and binary columns as base64 text listed in its
`binary` field, which targets store as bytes (SQLite BLOB, PostgreSQL bytea); the PostgreSQL
target drops U+0000 from text, which PostgreSQL cannot store. So each value is brought to one
canonical Python form per column kind, from whichever representation a target has for it:

    int       int                     (target: int, integral float, or its text)
    float     float, compared within DOUBLE_REL_TOL
    decimal   decimal.Decimal, compared by value ("1.50" == 1.5)
    text      str                     (PostgreSQL side: U+0000 removed, see strip_nul_for_postgres)
    binary    bytes                   (target text is taken as its UTF-8 bytes, so a base64 stand-in
                                       for bytes that were not UTF-8 shows up as different)
    datetime  datetime.datetime       (target: datetime or ISO text, " " or "T")
    date      datetime.date
    time      datetime.timedelta      (MariaDB TIME is a duration, -838..838 hours)
    json      the parsed JSON value

A target value that cannot be read as its column's kind compares unequal and is shown raw.
Rows are matched by their primary key, normalised the same way, so a key column stored as text
in a target still finds its row.
"""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: Relative tolerance for DOUBLE columns: a binary64 value through JSON text and back is exact,
#: so this only absorbs a target that stores doubles with fewer digits than repr() gives.
DOUBLE_REL_TOL = 1e-12
DOUBLE_ABS_TOL = 1e-300

EXAMPLES_MAX = 5


class ColumnKind(enum.StrEnum):
    INT = "int"
    FLOAT = "float"
    DECIMAL = "decimal"
    TEXT = "text"
    BINARY = "binary"
    DATETIME = "datetime"
    DATE = "date"
    TIME = "time"
    JSON = "json"


_MYSQL_KINDS = {
    ColumnKind.INT: ("tinyint", "smallint", "mediumint", "int", "integer", "bigint", "year", "bit"),
    ColumnKind.FLOAT: ("double", "float", "real"),
    ColumnKind.DECIMAL: ("decimal", "numeric"),
    ColumnKind.TEXT: ("char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set"),
    ColumnKind.BINARY: ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"),
    ColumnKind.DATETIME: ("datetime", "timestamp"),
    ColumnKind.DATE: ("date",),
    ColumnKind.TIME: ("time",),
    ColumnKind.JSON: ("json",),
}


def column_kind(data_type: str, *, json_checked: bool = False) -> ColumnKind:
    """The kind of a MariaDB/MySQL column from information_schema.COLUMNS.DATA_TYPE. MariaDB's
    JSON is a `longtext` with a `json_valid(column)` check: `json_checked` says it has one."""
    name = data_type.strip().lower()
    if json_checked:
        return ColumnKind.JSON
    for kind, names in _MYSQL_KINDS.items():
        if name in names:
            return kind
    raise ValueError(f"no comparison rule for column type {data_type!r}; add one to {__name__}")


class Unreadable:
    """A target value that could not be read as its column's kind; equal to nothing."""

    __slots__ = ("raw", "reason")

    def __init__(self, raw: Any, reason: str) -> None:
        self.raw = raw
        self.reason = reason

    def __repr__(self) -> str:
        return f"unreadable({self.raw!r}: {self.reason})"


# --- one value ----------------------------------------------------------------------------------


def strip_nul_for_postgres(text: str) -> str:
    """What a PostgreSQL target can hold of a text value: it cannot store U+0000 in text, and
    the target removes it. Applied to the source side of text columns compared with PostgreSQL."""
    return text.replace("\x00", "")


_TIME = re.compile(
    r"^(?P<sign>-)?(?:(?P<days>-?\d+) days?, )?(?P<h>\d+):(?P<m>\d{1,2}):(?P<s>\d{1,2})(?:\.(?P<f>\d{1,6}))?$"
)


def _parse_time(text: str) -> dt.timedelta:
    """`str(timedelta)` ("1 day, 6:05:00", "-1 day, 23:00:00") or MySQL's "[-]HHH:MM:SS[.ffffff]"."""
    m = _TIME.match(text.strip())
    if m is None:
        raise ValueError(f"not a time: {text!r}")
    frac = (m["f"] or "").ljust(6, "0")
    value = dt.timedelta(
        days=int(m["days"] or 0),
        hours=int(m["h"]),
        minutes=int(m["m"]),
        seconds=int(m["s"]),
        microseconds=int(frac or 0),
    )
    return -value if m["sign"] else value


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8")
    raise TypeError(f"{type(value).__name__} is not text")


def normalise(kind: ColumnKind, value: Any) -> Any:
    """The canonical form of a value of a column of `kind`, from the source or from a target.
    Raises ValueError/TypeError when the value cannot be read as that kind."""
    if value is None:
        return None
    if kind is ColumnKind.INT:
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, int):
            return value
        if isinstance(value, float):
            if not value.is_integer():
                raise ValueError(f"{value!r} is not an integer")
            return int(value)
        if isinstance(value, decimal.Decimal):
            return int(value)
        return int(_as_text(value).strip())
    if kind is ColumnKind.FLOAT:
        if isinstance(value, (int, float, decimal.Decimal)) and not isinstance(value, bool):
            return float(value)
        return float(_as_text(value))
    if kind is ColumnKind.DECIMAL:
        if isinstance(value, decimal.Decimal):
            return value
        if isinstance(value, float):
            return decimal.Decimal(repr(value))
        if isinstance(value, int):
            return decimal.Decimal(value)
        try:
            return decimal.Decimal(_as_text(value).strip())
        except decimal.InvalidOperation:
            raise ValueError(f"{value!r} is not a decimal") from None
    if kind is ColumnKind.TEXT:
        return _as_text(value)
    if kind is ColumnKind.BINARY:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        if isinstance(value, str):
            return value.encode("utf-8")
        raise TypeError(f"{type(value).__name__} is not binary")
    if kind is ColumnKind.DATETIME:
        if isinstance(value, dt.datetime):
            return (
                value.replace(tzinfo=None)
                if value.tzinfo is None
                else value.astimezone(dt.UTC).replace(tzinfo=None)
            )
        return dt.datetime.fromisoformat(_as_text(value).strip())
    if kind is ColumnKind.DATE:
        if isinstance(value, dt.datetime):
            raise ValueError(f"{value!r} is a datetime, not a date")
        if isinstance(value, dt.date):
            return value
        return dt.date.fromisoformat(_as_text(value).strip())
    if kind is ColumnKind.TIME:
        if isinstance(value, dt.timedelta):
            return value
        if isinstance(value, dt.time):
            return dt.timedelta(
                hours=value.hour, minutes=value.minute, seconds=value.second, microseconds=value.microsecond
            )
        return _parse_time(_as_text(value))
    if kind is ColumnKind.JSON:
        if isinstance(value, (dict, list, int, float, bool)):
            return value
        return json.loads(_as_text(value))
    raise AssertionError(f"unhandled column kind {kind}")


def source_value(kind: ColumnKind, value: Any, dialect: str) -> Any:
    """A source value as the target of `dialect` ("sqlite" or "postgresql") should hold it."""
    out = normalise(kind, value)
    if dialect == "postgresql" and kind is ColumnKind.TEXT and out is not None:
        out = strip_nul_for_postgres(out)
    return out


def target_value(kind: ColumnKind, value: Any) -> Any:
    """A value read back from a target, or Unreadable when it is not of its column's kind."""
    try:
        return normalise(kind, value)
    except (ValueError, TypeError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return Unreadable(value, str(exc))


def values_equal(kind: ColumnKind, want: Any, got: Any) -> bool:
    if isinstance(want, Unreadable) or isinstance(got, Unreadable):
        return False
    if want is None or got is None:
        return want is None and got is None
    if kind is ColumnKind.FLOAT:
        return math.isclose(want, got, rel_tol=DOUBLE_REL_TOL, abs_tol=DOUBLE_ABS_TOL)
    if kind is ColumnKind.JSON:
        return _json_equal(want, got)
    return bool(want == got)


def _json_equal(a: Any, b: Any) -> bool:
    """Parsed JSON values equal; numbers by value (1 == 1.0), booleans never equal to numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=DOUBLE_REL_TOL, abs_tol=DOUBLE_ABS_TOL)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def show(value: Any, limit: int = 60) -> str:
    """A short printable form of a normalised value."""
    if isinstance(value, bytes):
        text = "0x" + value.hex()
    elif isinstance(value, (dt.datetime, dt.date, dt.timedelta, decimal.Decimal)):
        text = str(value)
    elif isinstance(value, (dict, list)):
        text = json.dumps(value, ensure_ascii=True, sort_keys=True)
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- tables -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TableSchema:
    """A source table: its columns in order with their kinds, and its primary key columns."""

    name: str
    columns: tuple[tuple[str, ColumnKind], ...]
    key: tuple[str, ...]

    def kind(self, column: str) -> ColumnKind:
        for name, kind in self.columns:
            if name == column:
                return kind
        raise KeyError(column)


@dataclass
class TableComparison:
    table: str
    compared: int = 0  # source rows looked up in the target
    equal: int = 0
    missing: list[str] = field(default_factory=list)  # key text: in the source only
    extra: list[str] = field(default_factory=list)  # key text: in the target only
    different: list[tuple[str, list[tuple[str, str, str]]]] = field(default_factory=list)
    # (key text, [(column, source value, target value), ...])


@dataclass
class TargetComparison:
    target: str  # a label: the target's kind and where it is
    tables: list[TableComparison] = field(default_factory=list)

    @property
    def missing(self) -> int:
        return sum(len(t.missing) for t in self.tables)

    @property
    def extra(self) -> int:
        return sum(len(t.extra) for t in self.tables)

    @property
    def different(self) -> int:
        return sum(len(t.different) for t in self.tables)

    @property
    def compared(self) -> int:
        return sum(t.compared for t in self.tables)

    @property
    def ok(self) -> bool:
        return self.missing == self.extra == self.different == 0

    def lines(self, examples: int = EXAMPLES_MAX) -> list[str]:
        """A summary line, then per table its counts and a few examples of each kind of mismatch."""
        out = [
            f"target {self.target}: {len(self.tables)} tables, {self.compared} source rows compared: "
            f"missing={self.missing} extra={self.extra} different={self.different}"
        ]
        for t in self.tables:
            if not (t.missing or t.extra or t.different):
                continue
            out.append(
                f"  {t.table}: missing={len(t.missing)} extra={len(t.extra)} different={len(t.different)}"
            )
            out.extend(
                f"    missing {t.table} {k}: in the source, not in the target" for k in t.missing[:examples]
            )
            out.extend(
                f"    extra {t.table} {k}: in the target, not in the source" for k in t.extra[:examples]
            )
            for key, cols in t.different[:examples]:
                detail = "; ".join(f"{c}: source {s} target {g}" for c, s, g in cols[:4])
                out.append(f"    different {t.table} {key}: {detail}")
        return out


def key_of(schema: TableSchema, row: Mapping[str, Any]) -> str:
    """The row's primary key as canonical text, from normalised key values (integers and text
    as themselves, anything else in its printable form)."""
    parts = {}
    for c in schema.key:
        value = row.get(c)
        plain = value is None or (isinstance(value, (int, str)) and not isinstance(value, bool))
        parts[c] = value if plain else show(value, limit=200)
    return json.dumps(parts, sort_keys=True, ensure_ascii=False)


def compare_table(
    schema: TableSchema,
    source_rows: Iterable[Mapping[str, Any]],
    target_rows: Iterable[Mapping[str, Any]],
    dialect: str,
) -> TableComparison:
    """Every source row looked up by primary key in the target, every column compared.

    `source_rows` hold values as the source's driver returns them, `target_rows` as the target's
    does (`Target.read_rows`); both are normalised here."""
    result = TableComparison(schema.name)
    want: dict[str, dict[str, Any]] = {}
    for row in source_rows:
        norm = {c: source_value(k, row.get(c), dialect) for c, k in schema.columns}
        want[key_of(schema, norm)] = norm
    got: dict[str, dict[str, Any]] = {}
    for row in target_rows:
        norm = {c: target_value(k, row.get(c)) for c, k in schema.columns}
        got[key_of(schema, norm)] = norm
    for key in sorted(want):
        result.compared += 1
        have = got.get(key)
        if have is None:
            result.missing.append(key)
            continue
        diffs = [
            (c, show(want[key][c]), show(have[c]))
            for c, k in schema.columns
            if not values_equal(k, want[key][c], have[c])
        ]
        if diffs:
            result.different.append((key, diffs))
        else:
            result.equal += 1
    result.extra = sorted(k for k in got if k not in want)
    return result
