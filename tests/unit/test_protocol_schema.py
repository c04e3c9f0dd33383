"""Tests for sluice.protocol.schema and the message schemas in sluice.protocol.messages."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.protocol.messages import REQUESTS, RESPONSES
from sluice.protocol.primitives import DecodeError, EncodeError, Reader, Writer
from sluice.protocol.schema import Field, Message, Versions, snake_case

# ----------------------------------------------------------------------------------------------
# Strategies generated from a schema


_INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1),
}


def _scalar(t: str) -> st.SearchStrategy[Any]:
    if t in _INT_RANGES:
        lo, hi = _INT_RANGES[t]
        return st.integers(lo, hi)
    if t == "float64":
        return st.floats(allow_nan=False)
    if t == "bool":
        return st.booleans()
    if t == "string":
        return st.text(max_size=12)
    if t in ("bytes", "records"):
        return st.binary(max_size=24)
    if t == "uuid":
        return st.uuids()
    raise AssertionError(t)


def _field_strategy(f: Field, version: int) -> st.SearchStrategy[Any]:
    elem = _struct_strategy(f.fields, version) if f.is_struct else _scalar(f.element_type)
    s = st.lists(elem, max_size=3) if f.is_array else elem
    if version in f.nullable:
        s = st.none() | s
    return s


def _struct_strategy(fields: Sequence[Field], version: int) -> st.SearchStrategy[dict[str, Any]]:
    present = {f.key: _field_strategy(f, version) for f in fields if version in f.versions}
    # Every key optional: a missing key must encode as the default.
    return st.fixed_dictionaries({}, optional=present)


def expected(fields: Sequence[Field], version: int, d: dict[str, Any]) -> dict[str, Any]:
    """What decoding an encoding of ``d`` must give: ``d`` with every default filled in."""
    out: dict[str, Any] = {}
    for f in fields:
        if version in f.versions and f.key in d:
            v = d[f.key]
            if f.is_struct and v is not None:
                v = (
                    [expected(f.fields, version, e) for e in v]
                    if f.is_array
                    else expected(f.fields, version, v)
                )
            out[f.key] = v
        else:
            out[f.key] = f.default_value()
    return out


ALL_CODECS = [
    pytest.param(m, v, id=f"{m.name}-v{v}")
    for table in (REQUESTS, RESPONSES)
    for m in table.values()
    for v in m.versions()
]


@pytest.mark.parametrize(("message", "version"), ALL_CODECS)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_round_trip_every_message_and_version(message: Message, version: int, data: st.DataObject) -> None:
    codec = message.codec(version)
    body = data.draw(_struct_strategy(message.fields, version))
    encoded = codec.encode_bytes(body)
    r = Reader(encoded)
    decoded = codec.decode(r)
    assert r.remaining == 0
    assert decoded == expected(message.fields, version, body)
    # and the decoded form encodes to the same bytes
    assert codec.encode_bytes(decoded) == encoded


@pytest.mark.parametrize(("message", "version"), ALL_CODECS)
def test_defaults_round_trip(message: Message, version: int) -> None:
    codec = message.codec(version)
    assert codec.decode_bytes(codec.encode_bytes({})) == codec.default()
    assert codec.default() == expected(message.fields, version, {})


# ----------------------------------------------------------------------------------------------
# DSL behaviour


def test_snake_case() -> None:
    assert snake_case("TopicData") == "topic_data"
    assert snake_case("ThrottleTimeMs") == "throttle_time_ms"
    assert snake_case("IsrNodes") == "isr_nodes"
    assert snake_case("timeoutMs") == "timeout_ms"
    assert snake_case("GroupsNames") == "groups_names"
    assert snake_case("ZkMigrationReady") == "zk_migration_ready"
    assert snake_case("TopicID") == "topic_id"


def test_versions_parse() -> None:
    assert 5 in Versions.parse("3+") and 2 not in Versions.parse("3+")
    assert 7 in Versions.parse("3-7") and 8 not in Versions.parse("3-7")
    assert 0 in Versions.parse("0") and 1 not in Versions.parse("0")
    assert Versions.parse("none").empty


TOY = Message(
    "Toy",
    1000,
    valid="0-2",
    flexible="2+",
    fields=[
        Field("Name", "string", "0+", nullable="1+"),
        Field("Count", "int32", "1+", default="-1"),
        Field("Big", "int32", "0+", default="0x7fffffff"),
        Field("Flag", "bool", "0+", default="true"),
        Field("Note", "string", "2+", nullable="2+", tagged="2+", tag=0, default="null"),
        Field("Ids", "[]int64", "2+", tagged="2+", tag=5),
        Field(
            "Inner",
            "InnerStruct",
            "2+",
            tagged="2+",
            tag=3,
            fields=[Field("A", "int32", "2+", default="-1"), Field("B", "string", "2+")],
        ),
        Field(
            "Items",
            "[]Item",
            "0+",
            fields=[Field("Key", "string", "0+"), Field("Blob", "records", "0+", nullable="0+")],
        ),
    ],
)


def test_defaults_fill_absent_fields() -> None:
    c0 = TOY.codec(0)
    d = c0.decode_bytes(c0.encode_bytes({"name": "x"}))
    assert d == {
        "name": "x",
        "count": -1,
        "big": 0x7FFFFFFF,
        "flag": True,
        "note": None,
        "ids": [],
        "inner": {"a": -1, "b": ""},
        "items": [],
    }
    # encoding a field the version lacks is silently skipped
    assert c0.encode_bytes({"name": "x", "count": 5}) == c0.encode_bytes({"name": "x"})


def test_nullable_depends_on_version() -> None:
    with pytest.raises(EncodeError):
        TOY.codec(0).encode_bytes({"name": None})
    c1 = TOY.codec(1)
    assert c1.decode_bytes(c1.encode_bytes({"name": None}))["name"] is None
    with pytest.raises(DecodeError):
        TOY.codec(0).decode_bytes(b"\xff\xff" + b"\x00" * 9)


def test_tagged_fields_written_only_when_not_default() -> None:
    c2 = TOY.codec(2)
    plain = c2.encode_bytes({"name": "n"})
    # compact "n", count, big, flag, compact array (0 items), tagged section (0 fields)
    assert plain == b"\x02n" + b"\xff\xff\xff\xff" + b"\x7f\xff\xff\xff" + b"\x01" + b"\x01" + b"\x00"
    tagged = c2.encode_bytes({"name": "n", "note": "hi", "ids": [7], "inner": {"a": 1, "b": ""}})
    assert tagged.endswith(
        b"\x03"  # three tagged fields, in tag order
        + b"\x00\x03\x03hi"
        + b"\x03\x06\x00\x00\x00\x01\x01\x00"
        + b"\x05\x09\x02\x00\x00\x00\x00\x00\x00\x00\x07"
    )
    d = c2.decode_bytes(tagged)
    assert d["note"] == "hi" and d["ids"] == [7] and d["inner"] == {"a": 1, "b": ""}


def test_unknown_tagged_fields_are_skipped() -> None:
    c2 = TOY.codec(2)
    base = c2.encode_bytes({"name": "n"})
    with_unknown = base[:-1] + b"\x02" + b"\x09\x03abc" + b"\x00\x03\x03yo"
    d = c2.decode_bytes(with_unknown)
    assert d["note"] == "yo"
    with pytest.raises(DecodeError):
        c2.decode_bytes(base[:-1] + b"\x01\x09\x7fabc")  # tagged field overruns


def test_records_accept_chunk_lists_without_copying() -> None:
    big = b"r" * 100_000
    tail = memoryview(b"t" * 1000)
    for version in (0, 2):
        codec = TOY.codec(version)
        w = Writer()
        codec.encode(
            w, {"name": "n", "items": [{"key": "k", "blob": [big, tail]}, {"key": "z", "blob": None}]}
        )
        chunks = w.chunks()
        assert any(c is big for c in chunks) and any(c is tail for c in chunks)
        d = codec.decode_bytes(b"".join(chunks))
        assert d["items"][0]["blob"] == big + bytes(tail)
        assert isinstance(d["items"][0]["blob"], memoryview)
        assert d["items"][1]["blob"] is None


def test_encode_errors_name_the_field() -> None:
    with pytest.raises(EncodeError, match=r"items\.key"):
        TOY.codec(0).encode_bytes({"items": [{"key": 5}]})
    with pytest.raises(EncodeError, match="count"):
        TOY.codec(1).encode_bytes({"count": 2**40})
    with pytest.raises(EncodeError):
        TOY.codec(1).encode_bytes([])  # type: ignore[arg-type]


def test_codecs_are_cached() -> None:
    assert REQUESTS[0].codec(9) is REQUESTS[0].codec(9)
    with pytest.raises(ValueError):
        REQUESTS[0].codec(2)


def test_uuid_fields() -> None:
    codec = RESPONSES[3].codec(12)
    tid = uuid.uuid4()
    body = {"topics": [{"name": None, "topic_id": tid, "partitions": []}]}
    d = codec.decode_bytes(codec.encode_bytes(body))
    assert d["topics"][0]["topic_id"] == tid and d["topics"][0]["name"] is None


def test_flexible_versions_match_spec() -> None:
    flexible_from = {
        0: 9, 1: 12, 2: 6, 3: 9, 8: 8, 9: 6, 10: 3, 11: 6, 12: 4, 13: 4,
        14: 4, 15: 5, 16: 3, 18: 3, 19: 5, 20: 4, 22: 2, 23: 4, 32: 4, 42: 2,
    }  # fmt: skip
    for key, lo in flexible_from.items():
        assert REQUESTS[key].flexible.lo == lo == RESPONSES[key].flexible.lo
