"""The row images of a binlog rows event, decoded with a plan compiled once per table map.

mysql-replication decodes every value through a chain of type tests and a handful of method
calls (`RowsEvent.__read_values_name`): that was two thirds of the capture's binlog time, and
on its own slower than Debezium's whole binlog phase (bench/RESULTS.md, "Change capture beside
Debezium"). Here the columns of a table map are turned once into a tuple of small readers, one
per column, each taking the event's bytes and an offset; a row is one loop over them.

The library stays the reference and the fallback. `decode_rows` answers None, and the caller
asks the library (`event.rows`), whenever the plan could differ from it:

- a column type the plan does not read (JSON, GEOMETRY, BIT, anything unknown);
- a partial row image (a columns-present bitmap without every column: binlog_row_image
  MINIMAL or NOBLOB), whose `none_sources` the capture needs to refuse it;
- a PARTIAL_UPDATE_ROWS event, decode errors set to "ignore", a column without a name.

Every value is what the library gives for the same bytes (the same Python types, the same
None for MySQL's zero dates, the same bytes-or-str choice per character set);
tests/unit/test_binlog_rows.py decodes one event both ways for every type the plan reads, and
tests/integration/test_capture_statements.py does it on MariaDB's own events.
"""

from __future__ import annotations

import codecs
import datetime
import decimal
import struct
from collections.abc import Callable
from typing import Any

#: MySQL's column type codes (pymysqlreplication.constants.FIELD_TYPE, the protocol's numbers).
TINY, SHORT, LONG, FLOAT, DOUBLE, TIMESTAMP, LONGLONG, INT24 = 1, 2, 3, 4, 5, 7, 8, 9
DATE, TIME, DATETIME, YEAR, VARCHAR = 10, 11, 12, 13, 15
TIMESTAMP2, DATETIME2, TIME2 = 17, 18, 19
NEWDECIMAL, ENUM, SET, BLOB, STRING = 246, 247, 248, 252, 254
#: Binlog event types whose rows this module decodes (v1 and v2 of write, update, delete).
ROWS_EVENT_TYPES = frozenset({23, 24, 25, 30, 31, 32})
UPDATE_EVENT_TYPES = frozenset({24, 31})

#: A column reader: (event bytes, offset of the value) -> (value, offset after it).
Reader = Callable[[bytes, int], tuple[Any, int]]

_EPOCH = datetime.datetime(1970, 1, 1)
_DECIMAL_BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)  # bytes of a group of 0-9 leftover digits


def _fixed(fmt: str) -> Reader:
    s = struct.Struct(fmt)
    size, unpack_from = s.size, s.unpack_from

    def read(data: bytes, pos: int) -> tuple[Any, int]:
        return unpack_from(data, pos)[0], pos + size

    return read


def _int24(signed: bool) -> Reader:
    def read(data: bytes, pos: int) -> tuple[Any, int]:
        return int.from_bytes(data[pos : pos + 3], "little", signed=signed), pos + 3

    return read


def _be_signed(data: bytes, pos: int, size: int) -> int:
    return int.from_bytes(data[pos : pos + size], "big", signed=True)


def _fsp_bytes(fsp: int) -> int:
    return (fsp + 1) // 2


def _fraction(data: bytes, pos: int, fsp: int) -> int:
    """Microseconds from a temporal value's fractional part (fsp digits in (fsp+1)//2 bytes)."""
    n = (fsp + 1) // 2
    if n == 0:
        return 0
    value = _be_signed(data, pos, n)
    if fsp % 2:
        value = int(value / 10)
    return value * 10 ** (6 - fsp)


def _text(column: Any, length_bytes: int) -> Reader:
    """VARCHAR, CHAR, TEXT and BLOB: a little-endian length of `length_bytes`, then the bytes,
    decoded in the column's character set (kept as bytes when Python has no codec for it, as
    for `binary`: the library's LookupError fallback)."""
    encoding: str | None = "utf-8"
    if column.character_set_name is not None:
        from pymysql.charset import charset_by_name

        charset = charset_by_name(column.character_set_name)
        encoding = charset.encoding if charset else column.character_set_name
        try:
            codecs.lookup(encoding)
        except LookupError:
            encoding = None

    if encoding is None:

        def read_bytes(data: bytes, pos: int) -> tuple[Any, int]:
            end = pos + length_bytes
            n = int.from_bytes(data[pos:end], "little")
            # Python decodes zero bytes to "" without looking the codec up, so the library
            # gives an empty binary value as str: kept, so that both decoders agree.
            return (data[end : end + n] if n else ""), end + n

        return read_bytes
    codec = encoding

    def read(data: bytes, pos: int) -> tuple[Any, int]:
        end = pos + length_bytes
        n = int.from_bytes(data[pos:end], "little")
        return data[end : end + n].decode(codec), end + n

    return read


def _new_decimal(precision: int, scale: int) -> Reader:
    """DECIMAL(precision, scale): groups of nine digits in four big-endian bytes, leftover
    digits in fewer (integral part: leftover first; fraction: leftover last); the sign is the
    first bit, and a negative number has every bit inverted. The digits are read as one integer
    and handed to Decimal as text with an exponent: exact at any precision (Decimal arithmetic
    would round to its context's 28 digits), and -0 keeps its sign as in the library."""
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
    exponent = f"E-{scale}"

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
        return decimal.Decimal(f"{'-' if negative else ''}{total}{exponent}"), pos + size

    return read


def _datetime2(fsp: int) -> Reader:
    """DATETIME(fsp): 40 bits (sign, year*13+month, day, hour, minute, second) and the
    fraction. A value Python cannot hold (MySQL's zero date) is None."""
    frac = _fsp_bytes(fsp)

    def read(data: bytes, pos: int) -> tuple[Any, int]:
        v = int.from_bytes(data[pos : pos + 5], "big")
        ym = (v >> 22) & 0x1FFFF
        try:
            t = datetime.datetime(
                int(ym / 13), ym % 13, (v >> 17) & 0x1F, (v >> 12) & 0x1F, (v >> 6) & 0x3F, v & 0x3F
            )
        except ValueError:
            return None, pos + 5 + frac
        us = _fraction(data, pos + 5, fsp)
        return (t.replace(microsecond=us) if us > 0 else t), pos + 5 + frac

    return read


def _timestamp2(fsp: int) -> Reader:
    """TIMESTAMP(fsp): big-endian seconds since the epoch and the fraction, as a naive UTC
    datetime (the library's `utcfromtimestamp`)."""
    frac = _fsp_bytes(fsp)

    def read(data: bytes, pos: int) -> tuple[Any, int]:
        t = _EPOCH + datetime.timedelta(seconds=_be_signed(data, pos, 4))
        us = _fraction(data, pos + 4, fsp)
        return (t.replace(microsecond=us) if us > 0 else t), pos + 4 + frac

    return read


def _time2(fsp: int) -> Reader:
    """TIME(fsp): 24 bits (sign, hour, minute, second) and the fraction, as a timedelta; a
    negative value is stored as its two's complement."""
    frac = _fsp_bytes(fsp)

    def read(data: bytes, pos: int) -> tuple[Any, int]:
        v = _be_signed(data, pos, 3)
        sign = 1 if (v >> 23) & 1 else -1
        if sign == -1:
            v = ~v + 1
        t = datetime.timedelta(
            hours=(v >> 12) & 0x3FF,
            minutes=(v >> 6) & 0x3F,
            seconds=v & 0x3F,
            microseconds=_fraction(data, pos + 3, fsp),
        )
        return t * sign, pos + 3 + frac

    return read


def _date(data: bytes, pos: int) -> tuple[Any, int]:
    v = int.from_bytes(data[pos : pos + 3], "little")
    year, month, day = (v >> 9) & 0x7FFF, (v >> 5) & 0xF, v & 0x1F
    if v == 0 or year == 0 or month == 0 or day == 0:
        return None, pos + 3
    return datetime.date(year, month, day), pos + 3


def _year(data: bytes, pos: int) -> tuple[Any, int]:
    return data[pos] + 1900, pos + 1


def _enum(size: int, values: list[str] | None) -> Reader:
    def read(data: bytes, pos: int) -> tuple[Any, int]:
        index = int.from_bytes(data[pos : pos + size], "little")
        return (values[index] if values else None), pos + size

    return read


def _set(size: int, values: list[str] | None) -> Reader:
    def read(data: bytes, pos: int) -> tuple[Any, int]:
        mask = int.from_bytes(data[pos : pos + size], "little")
        if not values:
            return None, pos + size
        chosen = {v for i, v in enumerate(values) if mask & (1 << i)}
        return (chosen or None), pos + size

    return read


def column_reader(column: Any) -> Reader | None:
    """The reader of one table-map column (a pymysqlreplication Column), or None when the plan
    does not read its type (the library then decodes the whole event)."""
    t, unsigned = column.type, column.unsigned
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
        return _fixed("<f")
    if t == DOUBLE:
        return _fixed("<d")
    if t in (VARCHAR, STRING):
        return _text(column, 2 if column.max_length > 255 else 1)
    if t == BLOB:
        return _text(column, column.length_size)
    if t == NEWDECIMAL:
        return _new_decimal(column.precision, column.decimals)
    if t == DATETIME2:
        return _datetime2(column.fsp)
    if t == TIMESTAMP2:
        return _timestamp2(column.fsp)
    if t == TIME2:
        return _time2(column.fsp)
    if t == DATE:
        return _date
    if t == YEAR:
        return _year
    if t == ENUM:
        return _enum(column.size, column.enum_values)
    if t == SET:
        return _set(column.size, column.set_values)
    return None  # JSON, GEOMETRY, BIT, DATETIME/TIME/TIMESTAMP of MySQL before 5.6, unknown


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
    def compile(cls, columns: list[Any]) -> RowPlan | None:
        names, readers = [], []
        for column in columns:
            reader = column_reader(column)
            if reader is None or not column.name:
                return None
            names.append(column.name)
            readers.append(reader)
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
    on (`_signature`) stay the same: a table altered or a table id reused compiles a new one."""

    def __init__(self) -> None:
        self._plans: dict[int, tuple[tuple[Any, ...], RowPlan | None]] = {}

    def plan(self, table: Any) -> RowPlan | None:
        signature = _signature(table.columns)
        held = self._plans.get(table.table_id)
        if held is not None and held[0] == signature:
            return held[1]
        plan = RowPlan.compile(table.columns)
        self._plans[table.table_id] = (signature, plan)
        return plan

    def decode_rows(self, event: Any) -> list[dict[str, Any]] | None:
        """The rows of a write, update or delete rows event, in the library's shape
        (`values`, or `before_values` and `after_values`), or None when the library must
        decode this event. Reads the event's remaining bytes only when it answers rows."""
        if event.event_type not in ROWS_EVENT_TYPES or getattr(event, "_ignore_decode_errors", False):
            return None
        table = event.table_map.get(event.table_id)
        if table is None or not event.complete:
            return None
        plan = self.plan(table)
        if plan is None or len(plan.names) != event.number_of_columns:
            return None
        full = _full_bitmap(len(plan.names))
        update = event.event_type in UPDATE_EVENT_TYPES
        if event.columns_present_bitmap != full or (update and event.columns_present_bitmap2 != full):
            return None  # a partial image: the library names the missing columns
        packet = event.packet
        data = packet.read(event.event_size - packet.read_bytes)
        try:
            return plan.rows(data, update)
        except Exception:
            # Bytes the plan cannot read as the table map says (a date Python cannot hold, text
            # not in its character set, a short event): the library reads them again and
            # answers or raises as it always did.
            packet.unread(data)
            return None


#: Every Column attribute a reader is built from (column_reader, _text, RowPlan.compile).
_READER_INPUTS = ("type", "name", "unsigned", "character_set_name", "max_length", "length_size", "precision",
                  "decimals", "fsp", "size")  # fmt: skip


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
