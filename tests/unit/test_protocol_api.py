"""Tests for sluice.protocol.api (framing, headers, golden bytes) and sluice.protocol.errors."""

from __future__ import annotations

import struct
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.protocol.api import (
    SUPPORTED,
    ApiKey,
    RequestHeader,
    UnsupportedVersion,
    api_versions_list,
    decode_request,
    decode_response,
    encode_api_versions_fallback,
    encode_request,
    encode_response,
    is_flexible,
    request_codec,
    response_codec,
)
from sluice.protocol.errors import ErrorCode, is_retriable
from sluice.protocol.messages import REQUESTS, RESPONSES
from sluice.protocol.primitives import DecodeError
from tests.unit.test_protocol_schema import _struct_strategy, expected


def _unframe(chunks: list[bytes | memoryview] | bytes) -> bytes:
    data = chunks if isinstance(chunks, bytes) else b"".join(chunks)
    (size,) = struct.unpack_from(">i", data)
    assert size == len(data) - 4
    return data[4:]


# ----------------------------------------------------------------------------------------------
# Golden bytes


def test_api_versions_v0_request_golden() -> None:
    frame = encode_request(ApiKey.API_VERSIONS, 0, 1, "abc", {})
    assert frame == bytes.fromhex("0000000d 0012 0000 00000001 0003") + b"abc"
    header, body = decode_request(frame[4:])
    assert header == RequestHeader(ApiKey.API_VERSIONS, 0, 1, "abc")
    assert body == {"client_software_name": "", "client_software_version": ""}


def test_metadata_v1_request_golden() -> None:
    frame = encode_request(ApiKey.METADATA, 1, 2, "c", {"topics": [{"name": "foo"}]})
    assert (
        frame
        == bytes.fromhex("00000014 0003 0001 00000002 0001") + b"c" + bytes.fromhex("00000001 0003") + b"foo"
    )
    null_topics = bytes.fromhex("0003 0001 00000002 0001") + b"c" + b"\xff\xff\xff\xff"
    header, body = decode_request(null_topics)
    assert header.api_key is ApiKey.METADATA and body["topics"] is None
    assert body["allow_auto_topic_creation"] is True  # default of a field v1 lacks


def test_librdkafka_api_versions_v3_request_golden() -> None:
    # As librdkafka sends it: header v2 (old-style client id + empty tagged fields), then
    # compact strings and an empty tagged-fields section.
    frame = (
        bytes.fromhex("0012 0003 00000001 0007")
        + b"rdkafka"
        + b"\x00"
        + b"\x0blibrdkafka"
        + b"\x062.3.0"
        + b"\x00"
    )
    header, body = decode_request(frame)
    assert header == RequestHeader(ApiKey.API_VERSIONS, 3, 1, "rdkafka")
    assert body == {"client_software_name": "librdkafka", "client_software_version": "2.3.0"}
    assert encode_request(ApiKey.API_VERSIONS, 3, 1, "rdkafka", body) == struct.pack(">i", len(frame)) + frame


def test_api_versions_v3_response_golden_uses_header_v0() -> None:
    header = RequestHeader(ApiKey.API_VERSIONS, 3, 5, "x")
    body = {"error_code": 0, "api_keys": [{"api_key": 0, "min_version": 3, "max_version": 9}]}
    data = _unframe(encode_response(header, body))
    assert data == bytes.fromhex("00000005 0000 02 0000 0003 0009 00 00000000 00")
    with_tag = _unframe(encode_response(header, {**body, "finalized_features_epoch": 5}))
    assert with_tag.endswith(bytes.fromhex("01 01 08 0000000000000005"))
    cid, decoded = decode_response(ApiKey.API_VERSIONS, 3, with_tag)
    assert cid == 5 and decoded["finalized_features_epoch"] == 5


def test_flexible_response_header_has_tagged_fields() -> None:
    header = RequestHeader(ApiKey.METADATA, 9, 77, None)
    data = _unframe(encode_response(header, {}))
    # correlation id, empty header tags, throttle, brokers [], cluster id null, controller -1,
    # topics [], cluster authorized ops, body tags
    assert data == bytes.fromhex("0000004d 00 00000000 01 00 ffffffff 01 80000000 00")
    assert decode_response(ApiKey.METADATA, 9, data)[0] == 77
    nonflex = _unframe(encode_response(RequestHeader(ApiKey.METADATA, 8, 77, None), {}))
    assert nonflex.startswith(bytes.fromhex("0000004d 00000000 00000000"))


def test_api_versions_fallback_for_too_new_version() -> None:
    frame = bytes.fromhex("0012 0009 0000002a 0002") + b"js" + b"\x00\x05junk"
    with pytest.raises(UnsupportedVersion) as info:
        decode_request(frame)
    hdr = info.value.header
    assert hdr == RequestHeader(ApiKey.API_VERSIONS, 9, 42, "js")
    data = _unframe(encode_response(hdr, {}))
    assert data == _unframe(encode_api_versions_fallback(42))
    cid, body = decode_response(ApiKey.API_VERSIONS, 0, data)
    assert cid == 42 and body["error_code"] == ErrorCode.UNSUPPORTED_VERSION
    assert body["api_keys"] == api_versions_list()
    assert {e["api_key"]: (e["min_version"], e["max_version"]) for e in body["api_keys"]} == SUPPORTED


def test_unsupported_key_and_version() -> None:
    with pytest.raises(UnsupportedVersion) as info:
        decode_request(bytes.fromhex("0100 0000 00000003 ffff"))
    assert info.value.header == RequestHeader(256, 0, 3, None)
    with pytest.raises(UnsupportedVersion) as info:
        decode_request(bytes.fromhex("0000 0002 00000004 0001") + b"a")  # Produce v2
    assert info.value.header.api_key is ApiKey.PRODUCE
    with pytest.raises(DecodeError):
        decode_request(b"\x00\x00\x00")
    with pytest.raises(ValueError):
        encode_response(RequestHeader(ApiKey.PRODUCE, 2, 1, None), {})


def test_metadata_v0_reads_an_empty_topic_list_as_every_topic() -> None:
    """Kafka 2.8/3.x serve Metadata v0 (its topic list cannot be null: empty means every topic);
    Sluice closed the connection at v0 (UnsupportedVersion)."""
    from sluice.broker.metadata import requested_topics

    frame = encode_request(ApiKey.METADATA, 0, 5, "c", {"topics": []})
    header, body = decode_request(frame[4:])
    assert (header.api_version, body["topics"]) == (0, [])
    assert requested_topics(0, body["topics"]) is None
    assert requested_topics(1, []) == [] and requested_topics(0, [{"name": "t"}]) == [{"name": "t"}]


def test_supported_table() -> None:
    assert SUPPORTED[ApiKey.PRODUCE] == (3, 10)
    assert SUPPORTED[ApiKey.FETCH] == (4, 16)
    assert SUPPORTED[ApiKey.METADATA] == (0, 12)  # v0: librdkafka's broker.version.fallback=0.9.0
    assert SUPPORTED[ApiKey.API_VERSIONS] == (0, 3)
    assert SUPPORTED[ApiKey.DELETE_GROUPS] == (0, 2)
    assert SUPPORTED[ApiKey.SASL_HANDSHAKE] == (0, 1) and SUPPORTED[ApiKey.SASL_AUTHENTICATE] == (0, 2)
    assert SUPPORTED[ApiKey.CREATE_PARTITIONS] == (0, 3)
    assert SUPPORTED[ApiKey.INCREMENTAL_ALTER_CONFIGS] == (0, 1)
    assert SUPPORTED[ApiKey.DESCRIBE_LOG_DIRS] == (1, 4)
    assert len(SUPPORTED) == 43
    assert is_flexible(ApiKey.PRODUCE, 9) and not is_flexible(ApiKey.PRODUCE, 8)
    assert is_flexible(ApiKey.API_VERSIONS, 3)
    assert not is_flexible(ApiKey.SASL_HANDSHAKE, 1)  # no flexible version at all


# ----------------------------------------------------------------------------------------------
# Whole-frame round trips for every API and version


ALL = [
    pytest.param(k, v, id=f"{k.name}-v{v}") for k, (lo, hi) in SUPPORTED.items() for v in range(lo, hi + 1)
]


@pytest.mark.parametrize(("key", "version"), ALL)
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_frame_round_trip(key: ApiKey, version: int, data: st.DataObject) -> None:
    req_fields = REQUESTS[key].fields
    body = data.draw(_struct_strategy(req_fields, version))
    client_id = data.draw(st.none() | st.text(max_size=8))
    frame = encode_request(key, version, 123, client_id, body)
    header, decoded = decode_request(frame[4:])
    assert header == RequestHeader(key, version, 123, client_id)
    assert decoded == expected(req_fields, version, body)

    resp_fields = RESPONSES[key].fields
    rbody = data.draw(_struct_strategy(resp_fields, version))
    cid, rdecoded = decode_response(key, version, _unframe(encode_response(header, rbody)))
    assert cid == 123
    assert rdecoded == expected(resp_fields, version, rbody)


# ----------------------------------------------------------------------------------------------
# Zero copy and speed


def _produce_body(blob: bytes) -> dict[str, Any]:
    return {
        "transactional_id": None,
        "acks": -1,
        "timeout_ms": 30000,
        "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": blob}]}],
    }


@pytest.mark.parametrize("version", [3, 9])
def test_produce_decode_is_zero_copy_and_fast(version: int) -> None:
    blob = bytes(range(256)) * 4096  # 1 MiB
    frame = encode_request(ApiKey.PRODUCE, version, 1, "p", _produce_body(blob))
    payload = frame[4:]
    _, body = decode_request(payload)
    records = body["topic_data"][0]["partition_data"][0]["records"]
    assert isinstance(records, memoryview) and records.obj is payload
    assert records == blob
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        decode_request(payload)
    per_call = (time.perf_counter() - t0) / n
    assert per_call < 200e-6, f"{per_call * 1e6:.1f} us per decode"


@pytest.mark.parametrize("version", [4, 11, 12])
def test_fetch_response_encode_does_not_copy_records(version: int) -> None:
    seg = memoryview(b"s" * 1_000_000)
    parts = [seg[:600_000], seg[600_000:]]
    body = {
        "responses": [
            {
                "topic": "t",
                "partitions": [
                    {"partition_index": 0, "high_watermark": 9, "records": parts},
                    {"partition_index": 1, "high_watermark": 0, "records": b"tiny"},
                    {"partition_index": 2, "error_code": 1, "records": None},
                ],
            }
        ]
    }
    chunks = encode_response(RequestHeader(ApiKey.FETCH, version, 5, "c"), body)
    assert sum(1 for c in chunks if any(c is p for p in parts)) == 2
    _, decoded = decode_response(ApiKey.FETCH, version, _unframe(chunks))
    p = decoded["responses"][0]["partitions"]
    assert p[0]["records"] == bytes(seg) and p[1]["records"] == b"tiny" and p[2]["records"] is None


def test_codec_helpers() -> None:
    assert request_codec(ApiKey.FETCH, 12).flexible
    assert not response_codec(ApiKey.FETCH, 11).flexible
    with pytest.raises(ValueError):
        request_codec(999, 0)


# ----------------------------------------------------------------------------------------------
# Error codes


def test_error_codes() -> None:
    assert ErrorCode.UNKNOWN_SERVER_ERROR == -1
    assert ErrorCode.NOT_LEADER_OR_FOLLOWER == 6
    assert ErrorCode.UNSUPPORTED_VERSION == 35
    assert ErrorCode.KAFKA_STORAGE_ERROR == 56
    assert ErrorCode.UNKNOWN_PRODUCER_ID == 59
    assert ErrorCode.NON_EMPTY_GROUP == 68
    assert ErrorCode.GROUP_ID_NOT_FOUND == 69
    assert ErrorCode.FENCED_LEADER_EPOCH == 74
    assert ErrorCode.MEMBER_ID_REQUIRED == 79
    assert ErrorCode.UNKNOWN_TOPIC_ID == 100
    assert ErrorCode.TRANSACTION_ABORTABLE == 120
    assert {int(c) for c in ErrorCode} >= set(range(-1, 121))
    assert is_retriable(ErrorCode.NOT_LEADER_OR_FOLLOWER) and is_retriable(6)
    assert not is_retriable(ErrorCode.TOPIC_ALREADY_EXISTS)
