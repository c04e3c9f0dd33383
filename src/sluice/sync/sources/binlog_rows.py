"""The row images of a binlog rows event, decoded with a plan compiled once per table map.

Here the columns of a table map are turned once into a tuple of small readers, one per column,
each taking the event's bytes and an offset; a row is one loop over them (mysql-replication's
chain of type tests per value was two thirds of the capture's binlog time, bench/RESULTS.md).

Every reader gives the column's canonical value (sync/types.py, mysql_values.py): the same the
snapshot gives for the same stored value, built by MySQL's own encoding rules
(`my_time_packed_from_binary`, `my_datetime_packed_from_binary`, `my_timestamp_from_binary`,
`decimal2bin`, the BIT, ENUM and SET layouts), not by the library's reading, which gets
negative TIMEs with a fraction, the zero YEAR and TIMESTAMP, BINARY's padding and BIT wrong.
tests/unit/test_binlog_rows.py checks them on MySQL's documented byte vectors, and
tests/integration/test_type_matrix.py against the values MariaDB itself gives.

The library still parses the events and table maps. It decodes the rows only of an event the
plan does not take: a partial row image (binlog_row_image MINIMAL or NOBLOB), whose missing
columns the capture names as it refuses it, and MySQL's PARTIAL_UPDATE_ROWS. A column type the
plan cannot read, or bytes it cannot read as the table map says, stop the capture with the
column named (`RowDecodeError`): a value is never guessed.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from sluice.sync.sources import mysql_values as mv

#: MySQL's column type codes (pymysqlreplication.constants.FIELD_TYPE, the protocol's numbers).
TINY, SHORT, LONG, FLOAT, DOUBLE, TIMESTAMP, LONGLONG, INT24 = 1, 2, 3, 4, 5, 7, 8, 9
DATE, TIME, DATETIME, YEAR, VARCHAR, BIT = 10, 11, 12, 13, 15, 16
TIMESTAMP2, DATETIME2, TIME2 = 17, 18, 19
JSON, NEWDECIMAL, ENUM, SET, BLOB, STRING, GEOMETRY = 245, 246, 247, 248, 252, 254, 255
#: Binlog event types whose rows this module decodes (v1 and v2 of write, update, delete).
ROWS_EVENT_TYPES = frozenset({23, 24, 25, 30, 31, 32})
UPDATE_EVENT_TYPES = frozenset({24, 31})

#: A column reader: (event bytes, offset of the value) -> (value, offset after it).
Reader = Callable[[bytes, int], tuple[Any, int]]

_DECIMAL_BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)  # bytes of a group of 0-9 leftover digits
#: TIMEF_INT_OFS, TIMEF_OFS and DATETIMEF_INT_OFS of MySQL's my_time.cc
_TIMEF_INT_OFS, _TIMEF_OFS, _DATETIMEF_INT_OFS = 0x800000, 0x800000000000, 0x8000000000


class RowDecodeError(ValueError):
    """A column the plan cannot read (its type, or its bytes); the message names it."""


def _fixed(fmt: str) -> Reader:
    s = struct.Struct(fmt)
    size, unpack_from = s.size, s.unpack_from

    def read(data: bytes, pos: int) -> tuple[Any, int]:
        return unpack_from(data, pos)[0], pos + size

    return read


def _float() -> Reader:
    unpack_from, to_f32 = struct.Struct("<f").unpack_from, mv.float32

    def read(data: bytes, pos: int) -> tuple[Any, int]:
        return to_f32(unpack_from(data, pos)[0]), pos + 4

    return read


def _int24(signed: bool) -> Reader:
    def read(data: bytes, pos: int) -> tuple[Any, int]:
        return int.from_bytes(data[pos : pos + 3], "little", signed=signed), pos + 3

    return read


def _frac(data: bytes, pos: int, fsp: int) -> int:
    """Microseconds of a DATETIME2 or TIMESTAMP2 fraction: fsp 1-2 one byte of hundredths,
    3-4 two bytes of ten-thousandths, 5-6 three bytes of microseconds (big-endian)."""
    n = (fsp + 1) // 2
    if n == 0:
        return 0
    return int.from_bytes(data[pos : pos + n], "big") * (10000, 100, 1)[n - 1]


def _text(column: Any, length_bytes: int) -> Reader:
    """VARCHAR, CHAR, TEXT and BLOB: a little-endian length of `length_bytes`, then the bytes,
    decoded as the server converts the column's character set (bytes for binary columns)."""
    try:
        decode = mv.text_decoder(column.character_set_name)
    except LookupError:
        raise RowDecodeError(
            f"column {column.name}: character set {column.character_set_name} has no decoder here"
        ) from None
    if decode is None:

        def read_bytes(data: bytes, pos: int) -> tuple[Any, int]:
            end = pos + length_bytes
            n = int.from_bytes(data[pos:end], "little")
            return data[end : end + n], end + n

        return read_bytes

    def read(data: bytes, pos: int) -> tuple[Any, int]:
        end = pos + length_bytes
        n = int.from_bytes(data[pos:end], "little")
        return decode(data[end : end + n]), end + n

    return read


def _binary_char(length_bytes: int, width: int) -> Reader:
    """BINARY(n): the binlog leaves out its trailing 0x00 pad bytes; the value is stored (and
    read by a SELECT) with them."""

    def read(data: bytes, pos: int) -> tuple[Any, int]:
        end = pos + length_bytes
        n = int.from_bytes(data[pos:end], "little")
        return data[end : end + n].ljust(width, b"\0"), end + n

    return read


def _new_decimal(precision: int, scale: int) -> Reader:
    """DECIMAL(precision, scale) (MySQL's decimal2bin): groups of nine digits in four
    big-endian bytes, leftover digits in fewer (integral part: leftover first; fraction:
    leftover last); the sign is the first bit, and a negative number has every bit inverted.
    The digits are read as one integer and printed with the scale's digits (mv.decimal_text)."""
    integral = precision - scale
    int_words, int_rest = divmod(integral, 9)
    frac_words, frac_rest = divmod(scale, 9)
    # (bytes, digits) of each group, most significant first
    groups = (
        [(_DECIMAL_BYTES[int_rest], int_rest)] * (int_rest > 0)
        + [(4, 9)] * (int_words + frac_words)
        + [(_DECIMAL_BYTES[frac_rest], frac_rest)] * (frac_rest > 0)
    )
    size = sum(n for n, _ in groups)
    shifts = []  # (bit shift, mask, power of ten) per group, read from the least significant
    shift = 0
    for n, digits in reversed(groups):
        shifts.append((shift, (1 << 8 * n) - 1, 10**digits))
        shift += 8 * n
    sign_bit, ones = 1 << (8 * size - 1), (1 << 8 * size) - 1
    text = mv.decimal_text

    def read(data: bytes, pos: int) -> tuple[Any, int]:
        v = int.from_bytes(data[pos : pos + size], "big")
        negative = not v & sign_bit
        v ^= sign_bit
        if negative:
            v ^= ones
        total, scale_of_rest = 0, 1
        for at, mask, power in shifts:
            total += ((v >> at) & mask) * scale_of_rest
            scale_of_rest *= power
        return text(negative, str(total), scale), pos + size

    return read


def _datetime2(fsp: int, name: str, zero: mv.ZeroDates) -> Reader:
    """DATETIME(fsp) (my_datetime_packed_from_binary): 40 bits, offset by DATETIMEF_INT_OFS,
    of year*13+month (17), day (5), hour (5), minute (6), second (6); then the fraction."""
    size = 5 + (fsp + 1) // 2

    def read(data: bytes, pos: int) -> tuple[Any, int]:
        v = int.from_bytes(data[pos : pos + 5], "big") - _DATETIMEF_INT_OFS
        ymd, hms = v >> 17, v & 0x1FFFF
        ym, day = ymd >> 5, ymd & 0x1F
        year, month = ym // 13, ym % 13
        if not mv.valid_date(year, month, day):
            text = f"{year:04d}-{month:02d}-{day:02d} {hms >> 12:02d}:{hms >> 6 & 0x3F:02d}:{hms & 0x3F:02d}"
            zero.seen(name, text)
            return None, pos + size
        us = _frac(data, pos + 5, fsp)
        return mv.datetime_text(year, month, day, hms >> 12, hms >> 6 & 0x3F, hms & 0x3F, us, fsp), pos + size

    return read


def _timestamp2(fsp: int, name: str, zero: mv.ZeroDates) -> Reader:
    """TIMESTAMP(fsp) (my_timestamp_from_binary): big-endian seconds since the epoch, then the
    fraction; 0 is MySQL's zero timestamp. In UTC whatever the server's time zone."""
    size = 4 + (fsp + 1) // 2

    def read(data: bytes, pos: int) -> tuple[Any, int]:
        seconds = int.from_bytes(data[pos : pos + 4], "big")
        us = _frac(data, pos + 4, fsp)
        if seconds == 0 and us == 0:
            zero.seen(name, "0000-00-00 00:00:00")
            return None, pos + size
        return mv.timestamp_text(seconds, us, fsp), pos + size

    return read


def time_packed(data: bytes, pos: int, fsp: int) -> int:
    """MySQL's my_time_packed_from_binary: the packed TIME (int part << 24 | microseconds,
    negative for a negative TIME). A negative value with a fraction stores the fraction's
    complement, for binary sort order, with the int part one lower."""
    intpart = int.from_bytes(data[pos : pos + 3], "big") - _TIMEF_INT_OFS
    if fsp in (1, 2):
        frac = data[pos + 3]
        if intpart < 0 and frac:
            intpart, frac = intpart + 1, frac - 0x100
        return (intpart << 24) + frac * 10000
    if fsp in (3, 4):
        frac = int.from_bytes(data[pos + 3 : pos + 5], "big")
        if intpart < 0 and frac:
            intpart, frac = intpart + 1, frac - 0x10000
        return (intpart << 24) + frac * 100
    if fsp in (5, 6):
        return int.from_bytes(data[pos : pos + 6], "big") - _TIMEF_OFS
    return intpart << 24


def _time2(fsp: int) -> Reader:
    """TIME(fsp): the packed value (time_packed) as MySQL's TIME_from_longlong_time_packed
    reads it: the sign, then hour (10 bits), minute (6), second (6) and the microseconds."""
    size = 3 + (fsp + 1) // 2

    def read(data: bytes, pos: int) -> tuple[Any, int]:
        packed = time_packed(data, pos, fsp)
        negative = packed < 0
        if negative:
            packed = -packed
        hms, us = packed >> 24, packed & 0xFFFFFF
        return mv.time_text(negative, hms >> 12 & 0x3FF, hms >> 6 & 0x3F, hms & 0x3F, us, fsp), pos + size

    return read


def _date(name: str, zero: mv.ZeroDates) -> Reader:
    """DATE: 3 little-endian bytes of day (5 bits), month (4), year (15)."""

    def read(data: bytes, pos: int) -> tuple[Any, int]:
        v = int.from_bytes(data[pos : pos + 3], "little")
        year, month, day = v >> 9, (v >> 5) & 0xF, v & 0x1F
        text = f"{year:04d}-{month:02d}-{day:02d}"
        if not mv.valid_date(year, month, day):
            zero.seen(name, text)
            return None, pos + 3
        return text, pos + 3

    return read


def _year(data: bytes, pos: int) -> tuple[Any, int]:
    """YEAR: one byte, years since 1900; 0 is the zero year 0000."""
    return (data[pos] + 1900 if data[pos] else 0), pos + 1


def _bit(bits: int, nbytes: int) -> Reader:
    """BIT(n): ceil(n/8) big-endian bytes."""

    def read(data: bytes, pos: int) -> tuple[Any, int]:
        return mv.bit_text(int.from_bytes(data[pos : pos + nbytes], "big"), bits), pos + nbytes

    return read


def _enum(size: int, values: list[str] | None) -> Reader:
    """ENUM: the label's index (1 or 2 bytes); 0 is the error value ''. The table map's labels
    (binlog_row_metadata=FULL) come with '' first."""
    labels = list(values or [""])

    def read(data: bytes, pos: int) -> tuple[Any, int]:
        index = int.from_bytes(data[pos : pos + size], "little")
        return (labels[index] if index < len(labels) else ""), pos + size

    return read


def _set(size: int, values: list[str] | None) -> Reader:
    """SET: a bitmask of the members (1-8 bytes), as the members in definition order."""
    members = list(values or [])

    def read(data: bytes, pos: int) -> tuple[Any, int]:
        return mv.set_text(int.from_bytes(data[pos : pos + size], "little"), members), pos + size

    return read


def _json(length_bytes: int) -> Reader:
    """MySQL's binary JSON (type 245; MariaDB's JSON is LONGTEXT), parsed by mysql-replication's
    reader of the format and printed as MySQL prints JSON."""
    from pymysqlreplication.json_binary import parse_json

    def read(data: bytes, pos: int) -> tuple[Any, int]:
        end = pos + length_bytes
        n = int.from_bytes(data[pos:end], "little")
        if n == 0:
            return "null", end
        doc = parse_json(data[end], data[end + 1 : end + n])
        return mv.json_text(doc), end + n

    return read


def column_reader(column: Any, zero: mv.ZeroDates | None = None) -> Reader:
    """The reader of one table-map column (a pymysqlreplication Column); RowDecodeError for a
    type it does not read."""
    t, unsigned, name = column.type, column.unsigned, column.name
    zero = zero or mv.ZeroDates()
    if t == TINY:
        return _fixed("<B" if unsigned else "<b")
    if t == SHORT:
        return _fixed("<H" if unsigned else "<h")
    if t == INT24:
        return _int24(not unsigned)
    if t == LONG:
        return _fixed("<I" if unsigned else "<i")
    if t == LONGLONG:
        return _fixed("<Q" if unsigned else "<q")
    if t == FLOAT:
        return _float()
    if t == DOUBLE:
        return _fixed("<d")
    if t == STRING and column.character_set_name == "binary":
        return _binary_char(2 if column.max_length > 255 else 1, column.max_length)
    if t in (VARCHAR, STRING):
        return _text(column, 2 if column.max_length > 255 else 1)
    if t == BLOB:
        return _text(column, column.length_size)
    if t == GEOMETRY:
        return _text(SimpleColumn(name, "binary"), column.length_size)
    if t == NEWDECIMAL:
        return _new_decimal(column.precision, column.decimals)
    if t == DATETIME2:
        return _datetime2(column.fsp, name, zero)
    if t == TIMESTAMP2:
        return _timestamp2(column.fsp, name, zero)
    if t == TIME2:
        return _time2(column.fsp)
    if t == DATE:
        return _date(name, zero)
    if t == YEAR:
        return _year
    if t == BIT:
        return _bit(column.bits, column.bytes)
    if t == ENUM:
        return _enum(column.size, column.enum_values)
    if t == SET:
        return _set(column.size, column.set_values)
    if t == JSON:
        return _json(column.length_size)
    old = {TIMESTAMP: "TIMESTAMP", DATETIME: "DATETIME", TIME: "TIME"}.get(t)
    if old:
        raise RowDecodeError(
            f"column {name} is a {old} in the storage format of MySQL before 5.6: the capture reads "
            f"the 5.6 format only. Convert the table with `ALTER TABLE ... FORCE` (with "
            f"mysql56_temporal_format on, MariaDB's default), then restart the task from a new snapshot"
        )
    raise RowDecodeError(f"column {name} has column type {t}, which the binlog decoder does not read")


class SimpleColumn:
    """A column as `_text` needs it (name and character set)."""

    __slots__ = ("character_set_name", "name")

    def __init__(self, name: str, character_set_name: str | None) -> None:
        self.name, self.character_set_name = name, character_set_name


class RowPlan:
    """The readers of one table map's columns, in order, with their names."""

    __slots__ = ("columns", "names", "null_bytes")

    def __init__(self, names: tuple[str, ...], readers: tuple[Reader, ...]):
        self.names = names
        self.columns = tuple(
            (name, read, 1 << i) for i, (name, read) in enumerate(zip(names, readers, strict=True))
        )
        self.null_bytes = (len(names) + 7) // 8

    @classmethod
    def compile(cls, columns: list[Any], zero: mv.ZeroDates | None = None) -> RowPlan:
        names, readers = [], []
        for i, column in enumerate(columns):
            if not column.name:
                raise RowDecodeError(
                    f"column {i + 1} of the table map has no name: the server writes names only with "
                    "binlog_row_metadata=FULL; SET GLOBAL binlog_row_metadata=FULL (and in the server's "
                    "configuration), then restart the task"
                )
            readers.append(column_reader(column, zero))
            names.append(column.name)
        return cls(tuple(names), tuple(readers))

    def image(self, data: bytes, pos: int) -> tuple[dict[str, Any], int]:
        """One full row image at `pos`: its null bitmap, then every column not null."""
        end = pos + self.null_bytes
        nulls = int.from_bytes(data[pos:end], "little")
        pos = end
        values: dict[str, Any] = {}
        if nulls:
            for name, read, bit in self.columns:
                if nulls & bit:
                    values[name] = None
                else:
                    values[name], pos = read(data, pos)
        else:
            for name, read, _ in self.columns:
                values[name], pos = read(data, pos)
        return values, pos

    def rows(self, data: bytes, update: bool) -> list[dict[str, Any]]:
        """Every row of a rows event's body: one image each, two for an update."""
        rows: list[dict[str, Any]] = []
        pos, size, image = 0, len(data), self.image
        while pos < size:
            if update:
                before, pos = image(data, pos)
                after, pos = image(data, pos)
                rows.append({"before_values": before, "after_values": after})
            else:
                values, pos = image(data, pos)
                rows.append({"values": values})
        if pos != size:
            raise ValueError(f"the row images end at byte {pos} of {size}")
        return rows


class RowDecoder:
    """Plans by table id. The library makes a new table object for every table map event (one
    before each rows event), so a plan is kept while the table id and what its readers depend
    on (`_signature`) stay the same: a table altered or a table id reused compiles a new one.
    `zero` is the capture's zero_dates policy (mysql_values.ZeroDates)."""

    def __init__(self, zero: mv.ZeroDates | None = None) -> None:
        self.zero = zero or mv.ZeroDates()
        self._plans: dict[int, tuple[tuple[Any, ...], RowPlan]] = {}

    def plan(self, table: Any) -> RowPlan:
        signature = _signature(table.columns)
        held = self._plans.get(table.table_id)
        if held is not None and held[0] == signature:
            return held[1]
        try:
            plan = RowPlan.compile(table.columns, self.zero)
        except RowDecodeError as exc:
            raise RowDecodeError(f"table {table.table}: {exc}") from None
        self._plans[table.table_id] = (signature, plan)
        return plan

    def decode_rows(self, event: Any) -> list[dict[str, Any]] | None:
        """The rows of a write, update or delete rows event, in the library's shape
        (`values`, or `before_values` and `after_values`), or None when the library must
        decode this event (a partial image). Reads the event's remaining bytes only when it
        answers rows; RowDecodeError names the table and column it cannot read."""
        if event.event_type not in ROWS_EVENT_TYPES:
            return None  # MySQL's PARTIAL_UPDATE_ROWS (JSON diffs)
        table = event.table_map.get(event.table_id)
        if table is None or not event.complete:
            return None
        plan = self.plan(table)
        if len(plan.names) != event.number_of_columns:
            raise RowDecodeError(
                f"table {table.table}: a rows event of {event.number_of_columns} columns under a table map "
                f"of {len(plan.names)}"
            )
        full = _full_bitmap(len(plan.names))
        update = event.event_type in UPDATE_EVENT_TYPES
        if event.columns_present_bitmap != full or (update and event.columns_present_bitmap2 != full):
            return None  # a partial image: the library names the missing columns
        packet = event.packet
        data = packet.read(event.event_size - packet.read_bytes)
        try:
            return plan.rows(data, update)
        except mv.ZeroDateError as exc:
            raise mv.ZeroDateError(f"table {table.table}: {exc}") from None
        except Exception as exc:
            raise RowDecodeError(
                f"table {table.table}: the row images do not read as its table map says "
                f"({type(exc).__name__}: {exc}); the capture stopped rather than guess a value"
            ) from None


#: Every Column attribute a reader is built from (column_reader, _text, RowPlan.compile).
_READER_INPUTS = ("type", "name", "unsigned", "character_set_name", "max_length", "length_size", "precision",
                  "decimals", "fsp", "size", "bits", "bytes")  # fmt: skip


def _signature(columns: list[Any]) -> tuple[Any, ...]:
    return tuple(
        (
            *(getattr(c, a, None) for a in _READER_INPUTS),
            tuple(c.enum_values) if c.enum_values else None,
            tuple(c.set_values) if c.set_values else None,
        )
        for c in columns
    )


def _full_bitmap(columns: int) -> bytes:
    whole, rest = divmod(columns, 8)
    return b"\xff" * whole + (bytes([(1 << rest) - 1]) if rest else b"")
