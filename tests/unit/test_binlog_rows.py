"""The row plan's readers on byte vectors from MySQL's documentation of the binlog formats, and
its choice to leave an event to the library (tests/integration/test_binlog_rows.py compares it
with the library on MariaDB's own events)."""

from __future__ import annotations

import datetime
import decimal
from types import SimpleNamespace
from typing import Any

import pytest

from sluice.sync.sources import binlog_rows as br


def column(type_: int, name: str = "c", **meta: Any) -> Any:
    fields = {"unsigned": False, "character_set_name": None, "enum_values": None, "set_values": None}
    return SimpleNamespace(type=type_, name=name, **{**fields, **meta})


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        # MySQL's decimal2bin comment: 1234567890.1234 as DECIMAL(14,4), and its negative
        ("810DFB38D204D2", "1234567890.1234"),
        ("7EF204C72DFB2D", "-1234567890.1234"),
    ],
)
def test_decimals_are_read_as_mysql_documents_them(raw: str, want: str) -> None:
    value, end = br._new_decimal(14, 4)(bytes.fromhex(raw), 0)
    assert (value, str(value), end) == (decimal.Decimal(want), want, 7)


def test_a_decimal_wider_than_decimal_arithmetic_keeps_every_digit() -> None:
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
    value, end = br._new_decimal(65, 30)(bytes(raw), 0)
    assert str(value) == digits and end == len(raw)


def test_temporal_values_and_mysqls_zero_dates() -> None:
    # DATETIME(0) 2023-05-06 01:02:03: sign, year*13+month, day, hour, minute, second in 40 bits
    ym = 2023 * 13 + 5
    v = (1 << 39) | (ym << 22) | (6 << 17) | (1 << 12) | (2 << 6) | 3
    assert br._datetime2(0)(v.to_bytes(5, "big"), 0) == (datetime.datetime(2023, 5, 6, 1, 2, 3), 5)
    # DATETIME(3) .123: the fraction in two bytes, in ten-thousandths of a second (1230)
    frac = (1230).to_bytes(2, "big")
    assert br._datetime2(3)(v.to_bytes(5, "big") + frac, 0) == (
        datetime.datetime(2023, 5, 6, 1, 2, 3, 123000),
        7,
    )
    # the zero date reads as None and still consumes its bytes
    assert br._datetime2(2)((1 << 39).to_bytes(5, "big") + b"\0", 0) == (None, 6)
    assert br._date(b"\0\0\0", 0) == (None, 3)
    # TIME(0) -01:00:00 is stored as the two's complement of +01:00:00
    plus = (1 << 23) | (1 << 12)
    minus = ((1 << 23) - (plus - (1 << 23))) & 0xFFFFFF
    assert br._time2(0)(minus.to_bytes(3, "big"), 0) == (-datetime.timedelta(hours=1), 3)
    assert br._time2(0)(plus.to_bytes(3, "big"), 0) == (datetime.timedelta(hours=1), 3)


def test_text_is_decoded_in_its_character_set_and_binary_stays_bytes() -> None:
    latin1 = br._text(column(br.VARCHAR, character_set_name="latin1", max_length=20), 1)
    assert latin1(b"\x02\xe7\xe0", 0) == ("çà", 3)
    binary = br._text(column(br.BLOB, character_set_name="binary", length_size=2), 2)
    assert binary(b"\x02\x00\xff\x00", 0) == (b"\xff\x00", 4)
    assert binary(b"\x00\x00", 0) == ("", 2)  # as the library: Python decodes no bytes to ""


class FakeEvent:
    """What decode_rows reads of a library rows event: its table map and remaining bytes."""

    def __init__(self, columns: list[Any], body: bytes, present: bytes | None = None, event_type: int = 30):
        table = SimpleNamespace(table_id=7, columns=columns)
        self.event_type, self.table_id, self.table_map = event_type, 7, {7: table}
        self.complete, self.number_of_columns = True, len(columns)
        self.columns_present_bitmap = present if present is not None else br._full_bitmap(len(columns))
        self.event_size, self.packet = len(body), FakePacket(body)


class FakePacket:
    def __init__(self, body: bytes):
        self.body, self.read_bytes, self.unread_data = body, 0, b""

    def read(self, n: int) -> bytes:
        out = self.body[self.read_bytes : self.read_bytes + n]
        self.read_bytes += n
        return out

    def unread(self, data: bytes) -> None:
        self.read_bytes -= len(data)
        self.unread_data = data


def test_rows_of_a_write_event_with_nulls() -> None:
    cols = [column(br.LONG, "id"), column(br.VARCHAR, "s", max_length=10)]
    body = b"\x00" + (5).to_bytes(4, "little") + b"\x01a" + b"\x02" + (6).to_bytes(4, "little")
    assert br.RowDecoder().decode_rows(FakeEvent(cols, body)) == [
        {"values": {"id": 5, "s": "a"}},
        {"values": {"id": 6, "s": None}},
    ]


def test_the_library_decodes_partial_images_unknown_types_and_unreadable_bytes() -> None:
    cols = [column(br.LONG, "id"), column(br.VARCHAR, "s", max_length=10)]
    body = b"\x00" + (5).to_bytes(4, "little") + b"\x01a"
    partial = FakeEvent(cols, body, present=b"\x01")
    assert br.RowDecoder().decode_rows(partial) is None and partial.packet.read_bytes == 0
    json = FakeEvent([column(br.LONG, "id"), column(245, "doc", length_size=4)], body)
    assert br.RowDecoder().decode_rows(json) is None and json.packet.read_bytes == 0
    unnamed = FakeEvent([column(br.LONG, None), column(br.VARCHAR, "s", max_length=10)], body)
    assert br.RowDecoder().decode_rows(unnamed) is None
    short = FakeEvent(cols, body[:-1])  # the text's length says one byte more than there is
    assert br.RowDecoder().decode_rows(short) is None
    assert short.packet.read_bytes == 0 and short.packet.unread_data == body[:-1]


def test_a_plan_is_compiled_again_when_the_table_changes_under_the_same_id() -> None:
    decoder = br.RowDecoder()
    narrow = SimpleNamespace(table_id=1, columns=[column(br.VARCHAR, "s", max_length=100)])
    wide = SimpleNamespace(table_id=1, columns=[column(br.VARCHAR, "s", max_length=300)])
    assert decoder.plan(narrow) is decoder.plan(SimpleNamespace(table_id=1, columns=list(narrow.columns)))
    plan = decoder.plan(wide)
    assert plan is not None and plan.image(b"\x00\x01\x00x", 0) == ({"s": "x"}, 4)  # 2 length bytes
