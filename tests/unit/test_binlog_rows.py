"""The binlog decoder's readers on byte vectors from MySQL's own documentation and source of the
binlog formats (decimal2bin's comment, my_time_packed_from_binary's table, the DATETIME2, TIME2,
TIMESTAMP2 and DATE layouts of MySQL's internals manual), never on mysql-replication's output:
tests/integration/test_type_matrix.py checks the same readers against MariaDB's own values."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from sluice.sync.sources import binlog_rows as br
from sluice.sync.sources import mysql_values as mv


def column(type_: int, name: str = "c", **meta: Any) -> Any:
    fields = {"unsigned": False, "character_set_name": None, "enum_values": None, "set_values": None}
    return SimpleNamespace(type=type_, name=name, **{**fields, **meta})


def read(col: Any, raw: bytes, zero: mv.ZeroDates | None = None) -> Any:
    value, end = br.column_reader(col, zero)(raw, 0)
    assert end == len(raw), "a reader consumes exactly its value's bytes"
    return value


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        # MySQL's decimal2bin comment: 1234567890.1234 as DECIMAL(14,4), and its negative
        ("810DFB38D204D2", "1234567890.1234"),
        ("7EF204C72DFB2D", "-1234567890.1234"),
    ],
)
def test_decimals_are_read_as_mysql_documents_them(raw: str, want: str) -> None:
    assert read(column(br.NEWDECIMAL, precision=14, decimals=4), bytes.fromhex(raw)) == want


def test_a_decimal_keeps_every_digit_its_scale_and_no_negative_zero() -> None:
    # DECIMAL(65,30): 35 integral digits and 30 of fraction, past the 28 digits of Decimal's context
    digits = "12345678901234567890123456789012345.123456789012345678901234567890"
    ip, fp = digits.split(".")
    raw = bytearray(int(ip[:8]).to_bytes(4, "big"))  # 8 leftover digits take 4 bytes
    for i in range(8, 35, 9):
        raw += int(ip[i : i + 9]).to_bytes(4, "big")
    for i in range(0, 27, 9):
        raw += int(fp[i : i + 9]).to_bytes(4, "big")
    raw += int(fp[27:]).to_bytes(2, "big")  # 3 leftover digits take 2 bytes
    raw[0] ^= 0x80
    wide = column(br.NEWDECIMAL, precision=65, decimals=30)
    assert read(wide, bytes(raw)) == digits
    # DECIMAL(5,2): 3 integral digits in 2 bytes, 2 fractional in 1; 0.05 and the sign-only -0.00
    small = column(br.NEWDECIMAL, precision=5, decimals=2)
    assert read(small, bytes([0x80, 0x00, 0x05])) == "0.05"
    assert read(small, bytes([0x7F, 0xFF, 0xFF])) == "0.00"  # every bit of 0 inverted: -0 is 0


# my_time_packed_from_binary's table of TIME(2) values (disk value -> time value)
@pytest.mark.parametrize(
    ("disk", "want"),
    [
        ("80000000", "00:00:00.00"),
        ("7FFFFFFF", "-00:00:00.01"),
        ("7FFFFF9D", "-00:00:00.99"),
        ("7FFFFF00", "-00:00:01.00"),
        ("7FFFFEFF", "-00:00:01.01"),
        ("7FFFFEF6", "-00:00:01.10"),
    ],
)
def test_negative_times_with_a_fraction_read_as_mysqls_table_says(disk: str, want: str) -> None:
    assert read(column(br.TIME2, fsp=2), bytes.fromhex(disk)) == want


def time2(hours: int, minutes: int, seconds: int, us: int, fsp: int, negative: bool) -> bytes:
    """A TIME as MySQL's my_time_packed_to_binary stores it: the packed value (hms << 24 |
    microseconds, negated when negative); fsp 0-4 store its int part (the C shift `>> 24`,
    which floors) offset by TIMEF_INT_OFS and its fraction part (the C remainder `% (1 << 24)`,
    which truncates: negative for a negative value) in 1 or 2 bytes; fsp 5-6 the whole value
    offset by TIMEF_OFS."""
    packed = ((hours << 12 | minutes << 6 | seconds) << 24) + us
    if negative:
        packed = -packed
    if fsp >= 5:
        return (packed + 0x800000000000).to_bytes(6, "big")
    head = ((packed >> 24) + 0x800000).to_bytes(3, "big")
    if fsp == 0:
        return head
    c_remainder = packed - int(packed / (1 << 24)) * (1 << 24)
    unit, size = (10000, 1) if fsp <= 2 else (100, 2)
    frac = int(c_remainder / unit)  # C division truncates too
    return head + (frac % (1 << 8 * size)).to_bytes(size, "big")


@pytest.mark.parametrize("fsp", range(7))
@pytest.mark.parametrize(
    ("hms", "us", "negative"),
    [((0, 0, 1), 100000, True), ((12, 34, 56), 1, True), ((838, 59, 59), 0, True), ((838, 59, 59), 0, False),
     ((0, 0, 0), 0, False), ((25, 0, 0), 500000, False), ((0, 0, 0), 10000, True)],
)  # fmt: skip
def test_times_read_back_over_the_whole_range_in_every_precision(
    fsp: int, hms: tuple[int, int, int], us: int, negative: bool
) -> None:
    us = us // 10 ** (6 - fsp) * 10 ** (6 - fsp)  # what TIME(fsp) can hold
    want = mv.time_text(negative and (any(hms) or us > 0), *hms, us, fsp)
    assert read(column(br.TIME2, fsp=fsp), time2(*hms, us, fsp, negative)) == want


def test_the_examples_the_issue_found_wrong() -> None:
    # '-00:00:01.1' as TIME(1) was -1.9 s, '-12:34:56.000001' as TIME(6) -12:34:56.999999
    assert read(column(br.TIME2, fsp=1), time2(0, 0, 1, 100000, 1, True)) == "-00:00:01.1"
    assert read(column(br.TIME2, fsp=6), time2(12, 34, 56, 1, 6, True)) == "-12:34:56.000001"


def datetime2(y: int, mo: int, d: int, h: int, mi: int, s: int) -> bytes:
    """DATETIME's documented 40 bits: sign (1), year*13+month (17), day (5), hour (5), minute (6),
    second (6)."""
    return ((1 << 39) | ((y * 13 + mo) << 22) | (d << 17) | (h << 12) | (mi << 6) | s).to_bytes(5, "big")


def test_datetimes_in_every_precision_and_the_zero_date_by_policy() -> None:
    raw = datetime2(2023, 5, 6, 1, 2, 3)
    assert read(column(br.DATETIME2, fsp=0), raw) == "2023-05-06T01:02:03"
    # fraction: fsp 1-2 one byte of hundredths, 3-4 two bytes of ten-thousandths, 5-6 three of us
    assert read(column(br.DATETIME2, fsp=1), raw + bytes([50])) == "2023-05-06T01:02:03.5"
    assert read(column(br.DATETIME2, fsp=3), raw + (1230).to_bytes(2, "big")) == "2023-05-06T01:02:03.123"
    micros = raw + (999999).to_bytes(3, "big")
    assert read(column(br.DATETIME2, fsp=6), micros) == "2023-05-06T01:02:03.999999"
    assert read(column(br.DATETIME2, fsp=0), datetime2(9999, 12, 31, 23, 59, 59)) == "9999-12-31T23:59:59"
    zero = mv.ZeroDates("null")
    assert read(column(br.DATETIME2, "at", fsp=2), datetime2(0, 0, 0, 0, 0, 0) + b"\0", zero) is None
    assert read(column(br.DATETIME2, "at", fsp=0), datetime2(2024, 2, 30, 0, 0, 0), zero) is None  # invalid
    assert zero.counts == {"at": 2}
    with pytest.raises(mv.ZeroDateError, match="column at holds '0000-00-00 00:00:00'"):
        read(column(br.DATETIME2, "at", fsp=0), datetime2(0, 0, 0, 0, 0, 0), mv.ZeroDates("stop"))


def test_timestamps_are_utc_and_zero_is_the_zero_timestamp() -> None:
    # 2024-06-30T12:00:00Z is 1719748800 s since the epoch, stored big-endian
    assert read(column(br.TIMESTAMP2, fsp=0), (1719748800).to_bytes(4, "big")) == "2024-06-30T12:00:00Z"
    assert read(column(br.TIMESTAMP2, fsp=3), (1).to_bytes(4, "big") + (5000).to_bytes(2, "big")) == (
        "1970-01-01T00:00:01.500Z"
    )
    assert read(column(br.TIMESTAMP2, fsp=0), (2**31 - 1).to_bytes(4, "big")) == "2038-01-19T03:14:07Z"
    zero = mv.ZeroDates()
    assert read(column(br.TIMESTAMP2, "ts", fsp=2), bytes(5), zero) is None and zero.counts == {"ts": 1}


def test_dates_years_bits_enums_and_sets() -> None:
    # DATE: 3 little-endian bytes, day + month * 32 + year * 512
    assert read(column(br.DATE), (30 + 6 * 32 + 2024 * 512).to_bytes(3, "little")) == "2024-06-30"
    assert read(column(br.DATE), bytes(3)) is None
    # YEAR: one byte of years since 1900, 0 for the zero year 0000
    assert [read(column(br.YEAR), bytes([b])) for b in (0, 1, 255)] == [0, 1901, 2155]
    # BIT(n): ceil(n/8) big-endian bytes, as n characters
    assert read(column(br.BIT, bits=5, bytes=1), b"\x05") == "00101"
    assert read(column(br.BIT, bits=64, bytes=8), b"\xff" * 8) == "1" * 64
    assert read(column(br.BIT, bits=10, bytes=2), b"\x02\x01") == "1000000001"
    # ENUM: the label's index, 0 the error value ''; SET: a bitmask, members in definition order
    labels = ["", "x", "y"]
    assert [read(column(br.ENUM, size=1, enum_values=labels), bytes([i])) for i in (0, 2)] == ["", "y"]
    members = ["a", "b", "c"]
    assert read(column(br.SET, size=1, set_values=members), bytes([0b101])) == "a,c"
    assert read(column(br.SET, size=1, set_values=members), bytes([0])) == ""


def test_text_binary_padding_and_mysqls_latin1() -> None:
    latin1 = column(br.VARCHAR, character_set_name="latin1", max_length=20)
    assert read(latin1, b"\x02\xe7\xe0") == "çà"
    # MySQL's latin1 is cp1252, with the bytes cp1252 leaves unassigned as C1 controls
    assert read(latin1, b"\x03\x80\x81\x9d") == "€\x81\x9d"
    blob = column(br.BLOB, character_set_name="binary", length_size=2)
    assert read(blob, b"\x02\x00\xff\x00") == b"\xff\x00"
    assert read(blob, b"\x00\x00") == b""  # empty bytes stay bytes
    # BINARY(4): the binlog drops the trailing 0x00 pad bytes the stored value has
    binary4 = column(br.STRING, character_set_name="binary", max_length=4)
    assert read(binary4, b"\x02ab") == b"ab\0\0"
    assert read(binary4, b"\x00") == b"\0\0\0\0"


def test_floats_are_the_shortest_decimal_of_their_float32() -> None:
    import struct

    assert read(column(br.FLOAT), struct.pack("<f", 1.1)) == 1.1
    assert read(column(br.FLOAT), struct.pack("<f", 1.17549435e-38)) == 1.1754944e-38
    assert read(column(br.DOUBLE), struct.pack("<d", 0.30000000000000004)) == 0.30000000000000004


def test_shortest_float32_text_agrees_with_numpys_dragon4() -> None:
    """An independent reference: numpy prints a float32 as the shortest decimal that reads back."""
    import random
    import struct

    import numpy as np

    rng = random.Random(7)
    for _ in range(20_000):
        f = struct.unpack("<f", struct.pack("<I", rng.getrandbits(32)))[0]
        if f != f or f in (float("inf"), float("-inf")):
            continue
        assert mv.float32(f) == float(str(np.float32(f))), f


class FakeEvent:
    """What decode_rows reads of a library rows event: its table map and remaining bytes."""

    def __init__(self, columns: list[Any], body: bytes, present: bytes | None = None, event_type: int = 30):
        table = SimpleNamespace(table_id=7, columns=columns, table="t")
        self.event_type, self.table_id, self.table_map = event_type, 7, {7: table}
        self.complete, self.number_of_columns = True, len(columns)
        self.columns_present_bitmap = present if present is not None else br._full_bitmap(len(columns))
        self.event_size, self.packet = len(body), FakePacket(body)


class FakePacket:
    def __init__(self, body: bytes):
        self.body, self.read_bytes = body, 0

    def read(self, n: int) -> bytes:
        out = self.body[self.read_bytes : self.read_bytes + n]
        self.read_bytes += n
        return out


def test_rows_of_a_write_event_with_nulls() -> None:
    cols = [column(br.LONG, "id"), column(br.VARCHAR, "s", max_length=10)]
    body = b"\x00" + (5).to_bytes(4, "little") + b"\x01a" + b"\x02" + (6).to_bytes(4, "little")
    assert br.RowDecoder().decode_rows(FakeEvent(cols, body)) == [
        {"values": {"id": 5, "s": "a"}},
        {"values": {"id": 6, "s": None}},
    ]


def test_only_partial_images_go_to_the_library_and_anything_unreadable_stops_with_its_name() -> None:
    cols = [column(br.LONG, "id"), column(br.VARCHAR, "s", max_length=10)]
    body = b"\x00" + (5).to_bytes(4, "little") + b"\x01a"
    partial = FakeEvent(cols, body, present=b"\x01")
    assert br.RowDecoder().decode_rows(partial) is None and partial.packet.read_bytes == 0
    unknown = FakeEvent([column(br.LONG, "id"), column(14, "old", length_size=4)], body)
    with pytest.raises(br.RowDecodeError, match="column old has column type 14"):
        br.RowDecoder().decode_rows(unknown)
    old = FakeEvent([column(br.LONG, "id"), column(br.DATETIME, "at")], body)
    with pytest.raises(br.RowDecodeError, match=r"before 5\.6"):
        br.RowDecoder().decode_rows(old)
    unnamed = FakeEvent([column(br.LONG, None), column(br.VARCHAR, "s", max_length=10)], body)
    with pytest.raises(br.RowDecodeError, match="binlog_row_metadata=FULL"):
        br.RowDecoder().decode_rows(unnamed)
    short = FakeEvent(cols, body[:-1])  # the text's length says one byte more than there is
    with pytest.raises(br.RowDecodeError, match="table t: the row images do not read"):
        br.RowDecoder().decode_rows(short)


def test_a_plan_is_compiled_again_when_the_table_changes_under_the_same_id() -> None:
    decoder = br.RowDecoder()
    narrow = SimpleNamespace(table_id=1, columns=[column(br.VARCHAR, "s", max_length=100)], table="t")
    wide = SimpleNamespace(table_id=1, columns=[column(br.VARCHAR, "s", max_length=300)], table="t")
    same = SimpleNamespace(table_id=1, columns=list(narrow.columns), table="t")
    assert decoder.plan(narrow) is decoder.plan(same)
    assert decoder.plan(wide).image(b"\x00\x01\x00x", 0) == ({"s": "x"}, 4)  # 2 length bytes


def test_equal_float32s_print_the_same_whatever_double_came_in() -> None:
    # both are the float32 0x00800000 (FLT_MIN): one text for both
    assert mv.float32(1.17549435e-38) == mv.float32(1.1754943508222875e-38) == 1.1754944e-38
