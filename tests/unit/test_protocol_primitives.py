"""Tests for sluice.protocol.primitives: bounds-checked Reader and chunking Writer."""

from __future__ import annotations

import struct
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.protocol.primitives import BIG_CHUNK, DecodeError, EncodeError, Reader, Writer


def _rt(method: str, value: object) -> object:
    w = Writer()
    getattr(w, method)(value)
    data = w.getvalue()
    assert w.size == len(data)
    r = Reader(data)
    out = getattr(r, method)()
    assert r.remaining == 0
    return out


@pytest.mark.parametrize(
    ("method", "value"),
    [
        ("int8", -128),
        ("int8", 127),
        ("int16", -32768),
        ("int32", -(2**31)),
        ("int64", 2**63 - 1),
        ("uint16", 65535),
        ("uint32", 2**32 - 1),
        ("float64", 1.5),
        ("boolean", True),
        ("boolean", False),
        ("varint", -(2**31)),
        ("varint", 2**31 - 1),
        ("varlong", -(2**63)),
        ("varlong", 2**63 - 1),
        ("unsigned_varint", 2**32 - 1),
        ("string", "héllo"),
        ("nullable_string", None),
        ("compact_string", ""),
        ("compact_nullable_string", None),
        ("compact_nullable_string", "x"),
    ],
)
def test_scalar_round_trip(method: str, value: object) -> None:
    assert _rt(method, value) == value


def test_uuid_round_trip_and_raw_bytes() -> None:
    u = uuid.uuid4()
    assert _rt("uuid", u) == u
    w = Writer()
    w.uuid(u.bytes)
    assert Reader(w.getvalue()).uuid() == u
    with pytest.raises(EncodeError):
        Writer().uuid(b"short")


@given(st.integers(-(2**31), 2**31 - 1))
def test_varint_property(v: int) -> None:
    assert _rt("varint", v) == v


@given(st.integers(-(2**63), 2**63 - 1))
def test_varlong_property(v: int) -> None:
    assert _rt("varlong", v) == v


def test_varint_known_encodings() -> None:
    w = Writer()
    for v in (0, -1, 1, -2, 63, -64, 64):
        w.varint(v)
    assert w.getvalue() == bytes([0, 1, 2, 3, 0x7E, 0x7F, 0x80, 0x01])
    w = Writer()
    w.unsigned_varint(300)
    assert w.getvalue() == b"\xac\x02"


def test_bytes_are_zero_copy_views() -> None:
    payload = b"\x00\x00\x00\x05hello" + b"\xff\xff\xff\xff"
    r = Reader(payload)
    v = r.bytes()
    assert isinstance(v, memoryview) and v == b"hello"
    assert v.obj is payload
    assert r.nullable_bytes() is None


def test_compact_bytes() -> None:
    w = Writer()
    w.compact_bytes(b"abc")
    w.compact_nullable_bytes(None)
    r = Reader(w.getvalue())
    assert r.compact_bytes() == b"abc"
    assert r.compact_nullable_bytes() is None


@pytest.mark.parametrize(
    ("data", "method"),
    [
        (b"", "int8"),
        (b"\x00", "int16"),
        (b"\x00\x00\x00", "int32"),
        (b"\x00" * 7, "int64"),
        (b"\x00" * 15, "uuid"),
        (b"\x80\x80\x80\x80\x80\x01", "unsigned_varint"),  # longer than 5 bytes
        (b"\xff\xff\xff\xff\x7f", "unsigned_varint"),  # more than 32 bits
        (b"\x80" * 10 + b"\x01", "unsigned_varlong"),
        (b"\x80", "unsigned_varint"),
        (b"\xff\xfe", "nullable_string"),  # -2
        (b"\xff\xff", "string"),  # null in a non-nullable string
        (b"\x00\x05abc", "string"),  # short
        (b"\x00\x02\xc3\x28", "string"),  # invalid UTF-8
        (b"\x00", "compact_string"),  # null in a non-nullable compact string
        (b"\x7f\xff\xff\xff", "bytes"),  # huge length
        (b"\xff\xff\xff\xfe", "nullable_bytes"),
        (b"\x8f\xff\xff\xff\x0f", "compact_bytes"),
        (b"\x7f\xff\xff\xff", "array_length"),
        (b"\xff\xff\xff\xfe", "nullable_array_length"),
        (b"\x00", "compact_array_length"),
        (b"\x8f\xff\xff\xff\x0f", "compact_nullable_array_length"),
    ],
)
def test_malformed_input_raises_decode_error(data: bytes, method: str) -> None:
    with pytest.raises(DecodeError):
        getattr(Reader(data), method)()


def test_array_length_checks_min_element_size() -> None:
    data = struct.pack(">i", 3) + b"\x00" * 8
    assert Reader(data).array_length(1) == 3
    with pytest.raises(DecodeError):
        Reader(data).array_length(4)  # 3 int32s need 12 bytes


def test_reader_window() -> None:
    r = Reader(b"\x00\x01\x02\x03", 1, 3)
    assert r.remaining == 2
    assert r.int16() == 0x0102
    with pytest.raises(DecodeError):
        r.int8()
    with pytest.raises(DecodeError):
        Reader(b"ab", 5)


def test_writer_keeps_big_blobs_by_reference() -> None:
    blob = b"z" * (BIG_CHUNK * 4)
    mv = memoryview(bytearray(b"q" * BIG_CHUNK))
    w = Writer()
    w.int32(1)
    w.write_blob(blob)
    w.write_blob(b"small")
    w.write_blob(mv)
    chunks = w.chunks()
    assert any(c is blob for c in chunks)
    assert any(c is mv for c in chunks)
    assert w.size == 4 + len(blob) + 5 + BIG_CHUNK
    assert w.getvalue() == b"\x00\x00\x00\x01" + blob + b"small" + b"q" * BIG_CHUNK


def test_writer_rejects_bad_values() -> None:
    with pytest.raises(EncodeError):
        Writer().string(None)  # type: ignore[arg-type]
    with pytest.raises(EncodeError):
        Writer().unsigned_varint(-1)
    with pytest.raises(EncodeError):
        Writer().varint(2**31)
    with pytest.raises(struct.error):
        Writer().int16(1 << 20)


@settings(max_examples=200)
@given(st.binary(max_size=64))
def test_reader_never_raises_other_errors(data: bytes) -> None:
    for method in (
        "int8",
        "int64",
        "varint",
        "varlong",
        "string",
        "nullable_string",
        "compact_string",
        "compact_nullable_string",
        "bytes",
        "nullable_bytes",
        "compact_bytes",
        "compact_nullable_bytes",
        "uuid",
        "array_length",
        "compact_nullable_array_length",
    ):
        try:
            getattr(Reader(data), method)()
        except DecodeError:
            pass
