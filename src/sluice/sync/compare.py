"""Source rows beside target rows: how a value the source database gives and a value read back
from a target are made comparable, and the row-by-row comparison itself. Used by `sluice task
verify` (pipeline/verify.py), the chaos runs' checker (chaos/sync_run.py) and the type-matrix
tests.

The source side is the database's own answer, not a driver's reading of it: `reference_select`
asks MariaDB/MySQL for each column in a form that keeps every bit (HEX of bytes, BIN of a BIT,
UNIX_TIMESTAMP of a TIMESTAMP, a FLOAT widened to DOUBLE, the server's own text of decimals,
dates and times). The target side is what PostgreSQL or SQLite hold in the column type the
mapping gave (sync/types.py). Both become one canonical Python form per kind, compared exactly:

    int        int                              (YEAR too: 0 for 0000)
    decimal    str, fixed-point with its scale  ("1.50" is not "1.5")
    float32    float, the shortest decimal of the float32 (bit-exact)
    double     float (exact)
    bit        str of the column's width in 0/1
    date       "YYYY-MM-DD"                     zero or invalid dates: None (zero_dates: null)
    datetime   "YYYY-MM-DD HH:MM:SS.ffffff"     the same
    timestamp  "YYYY-MM-DD HH:MM:SS.ffffffZ"    in UTC; the zero timestamp: None
    time       "[-]HH:MM:SS.ffffff"             a duration, -838:59:59 .. 838:59:59
    text       str                              (PostgreSQL: U+0000 removed, as its target does)
    binary     bytes                            (BINARY padded, GEOMETRY as stored)
    json       the parsed document

A target value that cannot be read as its column's kind compares unequal and is shown raw.
Rows are matched by their primary key, normalised the same way.
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

from sluice.sync.sources.mysql_values import float32, valid_date
from sluice.sync.types import parse_type

EXAMPLES_MAX = 5


class Kind(enum.StrEnum):
    INT = "int"
    DECIMAL = "decimal"
    FLOAT32 = "float32"
    DOUBLE = "double"
    BIT = "bit"
    DATE = "date"
    DATETIME = "datetime"
    TIMESTAMP = "timestamp"
    TIME = "time"
    TEXT = "text"
    BINARY = "binary"
    JSON = "json"


@dataclass(frozen=True, slots=True)
class Check:
    """How one column is compared: its kind, and a BIT's width."""

    kind: Kind
    width: int = 0


def column_check(type_text: str) -> Check:
    """The comparison of a column of a MySQL type (`information_schema.COLUMNS.COLUMN_TYPE`,
    `json` for MariaDB's JSON columns)."""
    t = parse_type(type_text)
    if t.family == "int" or t.name == "year":
        return Check(Kind.INT)
    if t.family == "decimal":
        return Check(Kind.DECIMAL)
    if t.family == "float":
        return Check(Kind.FLOAT32 if t.size == 4 else Kind.DOUBLE)
    if t.family == "bit":
        return Check(Kind.BIT, t.size)
    if t.family == "temporal":
        return Check(Kind(t.name))
    if t.family in ("binary", "geometry"):
        return Check(Kind.BINARY)
    if t.family == "json":
        return Check(Kind.JSON)
    return Check(Kind.TEXT)  # strings, ENUM, SET, anything else the source prints as text


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def reference_expr(column: str, check: Check) -> str:
    """A MySQL expression giving the database's own answer for a column, every bit of it."""
    c = _q(column)
    kind = check.kind
    if kind is Kind.FLOAT32:
        return f"CAST({c} AS DOUBLE)"
    if kind is Kind.BIT:
        return f"BIN({c})"
    if kind is Kind.TIMESTAMP:
        return f"UNIX_TIMESTAMP({c})"
    if kind is Kind.BINARY:
        return f"HEX({c})"
    if kind in (Kind.DECIMAL, Kind.DATE, Kind.DATETIME, Kind.TIME, Kind.INT):
        return f"CAST({c} AS CHAR)"
    return c


def reference_select(table: str, columns: Iterable[tuple[str, Check]]) -> str:
    """`SELECT <every column's reference expression> FROM table` (add a WHERE as needed)."""
    cols = ", ".join(f"{reference_expr(c, k)} AS {_q(c)}" for c, k in columns)
    return f"SELECT {cols} FROM {_q(table)}"


class Unreadable:
    """A target value that could not be read as its column's kind; equal to nothing."""

    __slots__ = ("raw", "reason")

    def __init__(self, raw: Any, reason: str) -> None:
        self.raw = raw
        self.reason = reason

    def __repr__(self) -> str:
        return f"unreadable({self.raw!r}: {self.reason})"


# --- one value ----------------------------------------------------------------------------------
_TIME = re.compile(r"^(-)?(\d+):(\d{2}):(\d{2})(?:\.(\d{1,6}))?$")
_STAMP = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?(Z|[+-]00(?::?00)?)?$"
)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8")
    raise TypeError(f"{type(value).__name__} is not text")


def _stamp(value: Any, utc: bool) -> str | None:
    """A datetime (or its text, ISO or MySQL's) as `YYYY-MM-DD HH:MM:SS.ffffff` (+ `Z` when
    `utc`); None for a zero or invalid date."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC)
        return value.strftime("%Y-%m-%d %H:%M:%S.%f") + ("Z" if utc else "")
    m = _STAMP.match(_text(value).strip())
    if m is None:
        raise ValueError(f"not a date and time: {value!r}")
    y, mo, d = int(m[1]), int(m[2]), int(m[3])
    if not valid_date(y, mo, d):
        return None
    return f"{m[1]}-{m[2]}-{m[3]} {m[4]}:{m[5]}:{m[6]}.{(m[7] or '').ljust(6, '0')}" + ("Z" if utc else "")


def _time(value: Any) -> str:
    if isinstance(value, dt.timedelta):
        us = value // dt.timedelta(microseconds=1)
        sign, us = ("-" if us < 0 else ""), abs(us)
        s, us = divmod(us, 1_000_000)
        return f"{sign}{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}.{us:06d}"
    m = _TIME.match(_text(value).strip())
    if m is None:
        raise ValueError(f"not a time: {value!r}")
    negative = bool(m[1]) and any(int(x or 0) for x in m.groups()[1:])
    return f"{'-' if negative else ''}{int(m[2]):02d}:{m[3]}:{m[4]}.{(m[5] or '').ljust(6, '0')}"


def _date(value: Any) -> str | None:
    if isinstance(value, dt.datetime):
        raise ValueError(f"{value!r} is a datetime, not a date")
    if isinstance(value, dt.date):
        return value.isoformat()
    text = _text(value).strip()
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
        raise ValueError(f"not a date: {value!r}")
    return text if valid_date(int(text[:4]), int(text[5:7]), int(text[8:10])) else None


def _decimal(value: Any) -> str:
    if isinstance(value, float):
        raise ValueError(f"{value!r} is a float, not an exact decimal")
    try:
        d = decimal.Decimal(value if isinstance(value, (int, decimal.Decimal)) else _text(value).strip())
    except decimal.InvalidOperation:
        raise ValueError(f"{value!r} is not a decimal") from None
    text = format(d, "f")
    return text[1:] if text.startswith("-") and not text.strip("-0.") else text


def normalise(check: Check, value: Any, *, source: bool = False) -> Any:
    """The canonical form of a value of a column (see the module docstring): from the source's
    reference reading (`source`) or from a target. ValueError/TypeError when unreadable."""
    if value is None:
        return None
    kind = check.kind
    if kind is Kind.INT:
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, (int, decimal.Decimal)):
            if isinstance(value, decimal.Decimal) and value != value.to_integral_value():
                raise ValueError(f"{value!r} is not an integer")
            return int(value)
        if isinstance(value, float):
            raise ValueError(f"{value!r} is a float, not an integer")
        return int(_text(value).strip())
    if kind is Kind.DECIMAL:
        return _decimal(value)
    if kind in (Kind.FLOAT32, Kind.DOUBLE):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            value = float(_text(value))
        return float32(float(value)) if kind is Kind.FLOAT32 else float(value)
    if kind is Kind.BIT:
        text = _text(value).strip()
        if source:
            text = text.rjust(check.width, "0")  # BIN() leaves out leading zeros
        if len(text) != check.width or text.strip("01"):
            raise ValueError(f"{value!r} is not {check.width} bits")
        return text
    if kind is Kind.DATE:
        return _date(value)
    if kind is Kind.DATETIME:
        return _stamp(value, utc=False)
    if kind is Kind.TIMESTAMP:
        if source:  # UNIX_TIMESTAMP(): seconds since the epoch; 0 is the zero timestamp
            seconds = decimal.Decimal(str(value))
            if not seconds:
                return None
            us = int(seconds * 1_000_000)
            return _stamp(_EPOCH + dt.timedelta(microseconds=us), utc=True)
        return _stamp(value, utc=True)
    if kind is Kind.TIME:
        return _time(value)
    if kind is Kind.TEXT:
        return _text(value)
    if kind is Kind.BINARY:
        if source:
            return bytes.fromhex(_text(value))
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        raise TypeError(f"{type(value).__name__} is not bytes")
    if kind is Kind.JSON:
        if isinstance(value, (dict, list, int, float, bool)):
            return value
        return json.loads(_text(value))
    raise AssertionError(f"unhandled kind {kind}")


def source_value(check: Check, value: Any, dialect: str) -> Any:
    """A value of the source's reference reading as the target of `dialect` should hold it."""
    out = normalise(check, value, source=True)
    if dialect == "postgresql" and check.kind is Kind.TEXT and out is not None:
        out = out.replace("\x00", "")  # PostgreSQL text cannot hold U+0000: its target drops it
    return out


def target_value(check: Check, value: Any) -> Any:
    """A value read back from a target, or Unreadable when it is not of its column's kind."""
    try:
        return normalise(check, value)
    except (ValueError, TypeError, UnicodeDecodeError, json.JSONDecodeError, OverflowError) as exc:
        return Unreadable(value, str(exc))


def values_equal(check: Check, want: Any, got: Any) -> bool:
    if isinstance(want, Unreadable) or isinstance(got, Unreadable):
        return False
    if want is None or got is None:
        return want is None and got is None
    if check.kind is Kind.JSON:
        return _json_equal(want, got)
    if check.kind in (Kind.FLOAT32, Kind.DOUBLE):
        return want == got or (math.isnan(want) and math.isnan(got))
    return bool(type(want) is type(got) and want == got)


def _json_equal(a: Any, b: Any) -> bool:
    """Parsed JSON documents equal; numbers by value (1 == 1.0), booleans never equal to numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return decimal.Decimal(repr(a)) == decimal.Decimal(repr(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def show(value: Any, limit: int = 60) -> str:
    """A short printable form of a normalised value."""
    if isinstance(value, bytes):
        text = "0x" + value.hex()
    elif isinstance(value, (dict, list)):
        text = json.dumps(value, ensure_ascii=True, sort_keys=True)
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- tables -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TableSchema:
    """A source table: its columns in order with their comparisons, and its primary key columns."""

    name: str
    columns: tuple[tuple[str, Check], ...]
    key: tuple[str, ...]

    def check(self, column: str) -> Check:
        for name, check in self.columns:
            if name == column:
                return check
        raise KeyError(column)

    def reference_select(self) -> str:
        return reference_select(self.name, self.columns)


def table_schema(name: str, types: Mapping[str, str], key: Iterable[str]) -> TableSchema:
    """A table's comparison from its column types (column -> type text, in table order)."""
    return TableSchema(name, tuple((c, column_check(t)) for c, t in types.items()), tuple(key))


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

    `source_rows` hold the source's reference reading (`TableSchema.reference_select`),
    `target_rows` what the target's driver returns (`Target.read_rows`); both are normalised
    here."""
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
