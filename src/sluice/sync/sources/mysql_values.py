"""The canonical value of every MySQL/MariaDB column type, the same from both capture paths.

sync/types.py says what the envelope holds for each type. The binlog decoder (binlog_rows.py)
builds those values from the row image's bytes; the snapshot (mysql_snapshot.py, the capture's
consistent read, re-snapshots) from the server's text protocol (`snapshot_query`). Both format
through the functions below, so a value reads the same whichever path wrote it first:

- temporal values are text built from their parts, never Python's datetime/timedelta (which
  cannot hold MySQL's zero dates, negative TIMEs past a day, or its formats); TIMESTAMP in UTC
  (the snapshot's session runs with `time_zone = '+00:00'`);
- FLOAT is read by the snapshot as `CAST(col AS DOUBLE)` (the text protocol prints six digits)
  and reduced to the shortest decimal that reads back as the same float32;
- DECIMAL is its exact text with the scale's digits; BIT a string of its width in 0/1;
- text columns in MySQL's latin1 decode as MySQL does (cp1252, with its five unassigned bytes
  kept as the C1 controls), so the binlog's bytes give what the server's conversion gives.

Zero and invalid dates (`0000-00-00`, `2024-02-30` under ALLOW_INVALID_DATES, the zero
TIMESTAMP, year 0) have no value in the targets' date types. The task option `zero_dates`
decides: `null` (the default, as Debezium does for a nullable column, and for NOT NULL ones too
rather than inventing 1970-01-01): the value becomes null, counted per column and logged once;
`stop`: the capture stops, naming the table, column and value.
"""

from __future__ import annotations

import calendar
import logging
import struct
import time
from collections.abc import Callable
from typing import Any

from sluice.sync.types import SourceType, parse_type

log = logging.getLogger("sluice.capture")

#: Values of the task option `zero_dates` (the first is the default).
ZERO_DATE_POLICIES = ("null", "stop")


class ZeroDateError(ValueError):
    """A zero or invalid date under `zero_dates: stop`."""


class ZeroDates:
    """The `zero_dates` policy of one capture, and how many values it made null per column."""

    def __init__(self, policy: str = "null") -> None:
        if policy not in ZERO_DATE_POLICIES:
            raise ValueError(f"zero_dates must be one of {', '.join(ZERO_DATE_POLICIES)}, not {policy!r}")
        self.policy = policy
        self.counts: dict[str, int] = {}

    def seen(self, column: str, text: str) -> None:
        """A zero or invalid date in `column`: None under `null` (counted, logged once), else
        ZeroDateError."""
        if self.policy == "stop":
            raise ZeroDateError(
                f"column {column} holds {text!r}, a zero or invalid date that no target date type can "
                "hold, and the task's zero_dates option is stop. Set zero_dates: null to capture such "
                "values as null, or fix the value at the source (sql_mode NO_ZERO_DATE, "
                "NO_ZERO_IN_DATE keep new ones out)"
            )
        n = self.counts.get(column, 0)
        self.counts[column] = n + 1
        if n == 0:
            log.warning("event=zero_date_as_null column=%s value=%r policy=null", column, text)


# --- formatting shared by both paths ---------------------------------------------------------------------
_F32 = struct.Struct("<f")


def float32(x: float) -> float:
    """The shortest decimal (as a float) that reads back as the same float32 as `x`. Reading
    back is monotonic in the digits kept (p digits read back, so do p + 1), and 9 always do:
    a binary search over 1..9."""
    x = _F32.unpack(_F32.pack(x))[0]  # the float32 itself: equal float32s print the same
    want = _F32.pack(x)
    lo, hi = 1, 9
    while lo < hi:
        mid = (lo + hi) // 2
        if _F32.pack(float(f"{x:.{mid}g}")) == want:
            hi = mid
        else:
            lo = mid + 1
    return float(f"{x:.{lo}g}")


def valid_date(y: int, m: int, d: int) -> bool:
    """A date the targets' date types hold (year 1..9999: MySQL's year 0 has none)."""
    if not (1 <= y <= 9999 and 1 <= m <= 12 and d >= 1):
        return False
    return d <= 28 or d <= calendar.monthrange(y, m)[1]


def fraction(us: int, fsp: int) -> str:
    """`.` and the first `fsp` digits of the microseconds, or nothing for fsp 0."""
    return f".{us:06d}"[: fsp + 1] if fsp else ""


def datetime_text(y: int, mo: int, d: int, h: int, mi: int, s: int, us: int, fsp: int) -> str:
    return f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}{fraction(us, fsp)}"


def timestamp_text(seconds: int, us: int, fsp: int) -> str:
    """A TIMESTAMP (seconds since the epoch, UTC) as ISO 8601 in UTC."""
    t = time.gmtime(seconds)
    return datetime_text(t.tm_year, t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec, us, fsp) + "Z"


def time_text(negative: bool, h: int, m: int, s: int, us: int, fsp: int) -> str:
    """A TIME as MariaDB prints it: `-838:59:59.000000`."""
    return f"{'-' if negative else ''}{h:02d}:{m:02d}:{s:02d}{fraction(us, fsp)}"


def decimal_text(negative: bool, digits: str, scale: int) -> str:
    """A DECIMAL from its sign and all its digits (integral then `scale` fractional), as MariaDB
    prints it: no leading zeros but one, exactly `scale` fractional digits, never `-0`."""
    digits = digits.rjust(scale + 1, "0")
    whole = digits[: len(digits) - scale].lstrip("0") or "0"
    text = f"{whole}.{digits[len(digits) - scale :]}" if scale else whole
    return "-" + text if negative and digits.strip("0") else text


def bit_text(value: int, width: int) -> str:
    return format(value, f"0{width}b")


def set_text(mask: int, members: tuple[str, ...] | list[str]) -> str:
    return ",".join(v for i, v in enumerate(members) if mask >> i & 1)


def _mysql_latin1() -> str:
    """MySQL's latin1 is cp1252, with 0x81, 0x8D, 0x8F, 0x90 and 0x9D (unassigned there) as the
    C1 controls U+0081.. : a table for str.translate over bytes decoded as ISO-8859-1."""
    table = {}
    for b in range(0x80, 0xA0):
        try:
            table[b] = ord(bytes([b]).decode("cp1252"))
        except UnicodeDecodeError:
            table[b] = b
    return "".join(chr(table.get(i, i)) for i in range(256))


_LATIN1 = _mysql_latin1()
_LATIN1_NAMES = frozenset({"latin1", "cp1252"})


def text_decoder(charset: str | None) -> Callable[[bytes], str] | None:
    """How the bytes of a text column in `charset` (MySQL's name, or the library's Python codec
    name; None when the table map names none: UTF-8) become the text the server would send;
    None for binary columns."""
    if charset == "binary":
        return None
    if charset is None:
        return lambda b: b.decode("utf-8")
    from pymysql.charset import charset_by_name

    known = charset_by_name(charset)
    encoding = (known.encoding if known else charset).lower()
    if encoding in _LATIN1_NAMES:
        return lambda b: b.decode("latin-1").translate(_LATIN1)
    import codecs

    codecs.lookup(encoding)  # LookupError: the capture says which column's character set
    return lambda b: b.decode(encoding)


# --- the snapshot: the server's text protocol ---------------------------------------------------------
def _snapshot_conversions() -> dict[Any, Any]:
    """PyMySQL's conversions for the snapshot's connections (its encoders of parameters, and
    decoders of results by field type): numbers parsed, every other type kept as the server's
    text (or bytes, for binary columns) for `row_converter` to finish."""
    from pymysql.constants import FIELD_TYPE as F
    from pymysql.converters import conversions

    text = (F.TIMESTAMP, F.DATETIME, F.TIME, F.DATE, F.DECIMAL, F.NEWDECIMAL)
    return {**conversions, **{t: str for t in text}}


SNAPSHOT_SESSION = "SET time_zone = '+00:00'"  # TIMESTAMPs in UTC, as the binlog holds them


def snapshot_connect_args() -> dict[str, Any]:
    """What every snapshot connection (`mysql_base.connect`) adds: the converters and UTC."""
    return {"conv": _snapshot_conversions(), "init_command": SNAPSHOT_SESSION}


def select_list(types: dict[str, str]) -> str:
    """The snapshot's column list for a table's columns (in table order): FLOAT as its exact
    double, every other column as it is."""
    cols = []
    for column, text in types.items():
        q = "`" + column.replace("`", "``") + "`"
        t = parse_type(text)
        cols.append(f"CAST({q} AS DOUBLE) AS {q}" if t.family == "float" and t.size == 4 else q)
    return ", ".join(cols)


def _temporal_fix(t: SourceType, column: str, zero: ZeroDates) -> Callable[[Any], Any] | None:
    fsp = t.scale
    if t.name == "date":

        def date(v: str) -> str | None:
            y, m, d = int(v[:4]), int(v[5:7]), int(v[8:10])
            if not valid_date(y, m, d):
                zero.seen(column, v)
                return None
            return v

        return date
    if t.name in ("datetime", "timestamp"):
        zone = "Z" if t.name == "timestamp" else ""

        def stamp(v: str) -> str | None:
            y, m, d = int(v[:4]), int(v[5:7]), int(v[8:10])
            if not valid_date(y, m, d):
                zero.seen(column, v)
                return None
            us = int((v[20:] + "000000")[:6]) if len(v) > 19 else 0
            return datetime_text(y, m, d, int(v[11:13]), int(v[14:16]), int(v[17:19]), us, fsp) + zone

        return stamp
    return None  # TIME as MariaDB prints it; YEAR an integer


def row_converter(types: dict[str, str], zero: ZeroDates) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Finishes a snapshot row (a dict from a connection with `snapshot_connect_args`) in place:
    the columns whose text needs it become their canonical values."""
    fixes: list[tuple[str, Callable[[Any], Any]]] = []
    for column, text in types.items():
        t = parse_type(text)
        fix: Callable[[Any], Any] | None = None
        if t.family == "float" and t.size == 4:
            fix = float32
        elif t.family == "decimal":
            fix = _decimal_fix
        elif t.family == "bit":
            width = t.size
            fix = lambda v, w=width: bit_text(int.from_bytes(v, "big"), w)  # noqa: E731
        elif t.family == "temporal":
            fix = _temporal_fix(t, column, zero)
        if fix is not None:
            fixes.append((column, fix))

    def convert(row: dict[str, Any]) -> dict[str, Any]:
        for column, fix in fixes:
            v = row.get(column)
            if v is not None:
                row[column] = fix(v)
        return row

    return convert


def _decimal_fix(v: str) -> str:
    return v[1:] if v.startswith("-") and not v.strip("-0.") else v  # never -0.00


def json_text(doc: Any) -> str:
    """A document of MySQL's binary JSON (mysql-replication gives keys and strings as bytes) as
    MySQL prints JSON: `{"a": 1, "b": [true, null]}`."""
    import json

    def plain(v: Any) -> Any:
        if isinstance(v, (bytes, bytearray)):
            return bytes(v).decode("utf-8")
        if isinstance(v, dict):
            return {plain(k): plain(x) for k, x in v.items()}
        if isinstance(v, list):
            return [plain(x) for x in v]
        return v

    return json.dumps(plain(doc), ensure_ascii=False)
