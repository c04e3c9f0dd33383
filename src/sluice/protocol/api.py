"""Request/response framing: API keys, supported versions, headers, and whole-frame codecs.

Broker side:

* ``decode_request(frame)`` takes one request frame *without* its 4-byte size prefix and returns
  ``(RequestHeader, body dict)``. It raises ``UnsupportedVersion`` (carrying the decoded header,
  so the broker can still answer or log) for an unknown API key or version, and ``DecodeError``
  for malformed input. Nothing else escapes for any input.
* ``encode_response(header, body)`` returns the response frame as a list of chunks, size prefix
  included, ready for ``transport.writelines``; record blobs in the body are not copied.

Header versions: requests use header v1 (api key, version, correlation id, nullable client id)
for non-flexible API versions and v2 (v1 plus a tagged-fields section) for flexible ones; the
client id is always an old-style int16-length string. Responses use header v0 (correlation id)
or v1 (plus tagged fields) when flexible -- except ApiVersions responses, which always use v0 so
a client can read them whatever version it asked for.

KIP-511: an ApiVersions request with a version above ours must still be answered, with a v0
body carrying ``UNSUPPORTED_VERSION`` and our API ranges; ``encode_response`` does that for an
ApiVersions header with an unsupported version, and ``encode_api_versions_fallback`` builds it
directly.

Client side (Sluice's own tools and tests): ``encode_request`` and ``decode_response``.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from sluice.protocol.errors import ErrorCode
from sluice.protocol.messages import REQUESTS, RESPONSES
from sluice.protocol.primitives import Buffer, Chunk, DecodeError, EncodeError, Reader, Writer
from sluice.protocol.schema import Codec

__all__ = [
    "SUPPORTED",
    "ApiKey",
    "DecodeError",
    "EncodeError",
    "RequestHeader",
    "UnsupportedVersion",
    "api_versions_list",
    "decode_request",
    "decode_response",
    "encode_api_versions_fallback",
    "encode_request",
    "encode_response",
    "is_flexible",
    "is_supported",
    "request_codec",
    "request_header_version",
    "response_codec",
    "response_header_version",
]

_I32 = struct.Struct(">i")
_HEADER_FIXED = struct.Struct(">hhi")


class ApiKey(IntEnum):
    """The Kafka APIs Sluice implements."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43
    INCREMENTAL_ALTER_CONFIGS = 44
    ALTER_PARTITION_REASSIGNMENTS = 45
    LIST_PARTITION_REASSIGNMENTS = 46
    OFFSET_DELETE = 47
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61


SUPPORTED: dict[ApiKey, tuple[int, int]] = {
    ApiKey(k): (m.valid.lo, m.valid.hi) for k, m in sorted(REQUESTS.items())
}
"""Supported (min, max) version of each API, as advertised in ApiVersions responses."""

_KEYS: dict[int, ApiKey] = {int(k): k for k in ApiKey}
#: The first flexible version of each API; an API with no flexible version (SaslHandshake) never is.
_FLEXIBLE_FROM: dict[int, int] = {
    k: m.flexible.lo if m.flexible.lo <= m.flexible.hi else 0x7FFF for k, m in REQUESTS.items()
}

# Every request schema must have a response schema with the same versions.
assert set(REQUESTS) == set(RESPONSES) == set(_KEYS)
assert all(REQUESTS[k].valid == RESPONSES[k].valid for k in REQUESTS)
assert all(REQUESTS[k].flexible == RESPONSES[k].flexible for k in REQUESTS)


class UnsupportedVersion(Exception):
    """The request names an API key or version Sluice does not support.

    ``header`` is the decoded request header (``client_id`` may be None if it could not be read).
    """

    def __init__(self, header: RequestHeader) -> None:
        super().__init__(
            f"unsupported API key {header.api_key} version {header.api_version} "
            f"(correlation id {header.correlation_id})"
        )
        self.header = header


@dataclass(frozen=True, slots=True)
class RequestHeader:
    """A decoded request header. ``api_key`` is an ``ApiKey`` when known, else the raw int."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def is_supported(api_key: int, version: int) -> bool:
    """True if Sluice implements ``version`` of ``api_key``."""
    key = _KEYS.get(api_key)
    if key is None:
        return False
    lo, hi = SUPPORTED[key]
    return lo <= version <= hi


def is_flexible(api_key: int, version: int) -> bool:
    """True if ``version`` of ``api_key`` uses the flexible (compact, tagged-field) encoding."""
    lo = _FLEXIBLE_FROM.get(int(api_key))
    if lo is None:
        raise ValueError(f"unknown API key {api_key}")
    return version >= lo


def request_header_version(api_key: int, version: int) -> int:
    """1 for non-flexible requests, 2 for flexible ones."""
    return 2 if is_flexible(api_key, version) else 1


def response_header_version(api_key: int, version: int) -> int:
    """0 normally, 1 for flexible responses; ApiVersions responses always use 0."""
    if api_key == ApiKey.API_VERSIONS:
        return 0
    return 1 if is_flexible(api_key, version) else 0


def request_codec(api_key: int, version: int) -> Codec:
    """The compiled request body codec (raises ``ValueError`` if unsupported)."""
    m = REQUESTS.get(int(api_key))
    if m is None:
        raise ValueError(f"unknown API key {api_key}")
    return m.codec(version)


def response_codec(api_key: int, version: int) -> Codec:
    """The compiled response body codec (raises ``ValueError`` if unsupported)."""
    m = RESPONSES.get(int(api_key))
    if m is None:
        raise ValueError(f"unknown API key {api_key}")
    return m.codec(version)


def api_versions_list() -> list[dict[str, int]]:
    """The ``api_keys`` array of an ApiVersions response, from ``SUPPORTED``."""
    return [{"api_key": int(k), "min_version": lo, "max_version": hi} for k, (lo, hi) in SUPPORTED.items()]


def _skip_tagged_fields(r: Reader) -> None:
    n = r.unsigned_varint()
    if n * 2 > r.remaining:
        raise DecodeError(f"{n} tagged fields overrun the buffer")
    for _ in range(n):
        r.unsigned_varint()  # tag
        r.skip(r.unsigned_varint())


# ----------------------------------------------------------------------------------------------
# Broker side


def decode_request(frame: Buffer) -> tuple[RequestHeader, dict[str, Any]]:
    """Decode a request frame (without the 4-byte size prefix) into its header and body.

    Raises ``UnsupportedVersion`` for an unknown API key or version (with the header decoded as
    far as possible) and ``DecodeError`` for malformed input; trailing bytes are ignored.
    """
    r = Reader(frame)
    if r.remaining < 8:
        raise DecodeError(f"request frame of {r.remaining} bytes is shorter than a header")
    raw_key, version, correlation_id = _HEADER_FIXED.unpack_from(r.buf, 0)
    r.pos = 8
    key = _KEYS.get(raw_key)
    rng = SUPPORTED.get(key) if key is not None else None
    if rng is None or not rng[0] <= version <= rng[1]:
        try:
            client_id = r.nullable_string()
        except DecodeError:
            client_id = None
        raise UnsupportedVersion(
            RequestHeader(key if key is not None else raw_key, version, correlation_id, client_id)
        )
    assert key is not None
    client_id = r.nullable_string()
    codec = REQUESTS[key].codec(version)
    if codec.flexible:
        _skip_tagged_fields(r)
    try:
        body = codec.decode(r)
    except (struct.error, IndexError, OverflowError) as e:  # defensive: never leak these
        raise DecodeError(f"malformed {key.name} v{version} request: {e!r}") from e
    return RequestHeader(key, version, correlation_id, client_id), body


def _frame(w: Writer) -> list[Chunk]:
    chunks = w.chunks()
    prefix = _I32.pack(w.size)
    first = chunks[0] if chunks else b""
    if isinstance(first, bytes) and len(first) <= 4096:
        chunks[0] = prefix + first
        return chunks
    return [prefix, *chunks]


def encode_api_versions_fallback(correlation_id: int) -> list[Chunk]:
    """The KIP-511 answer to an ApiVersions request of a version we do not support.

    A v0 ApiVersions response (header v0) with ``UNSUPPORTED_VERSION`` and our API ranges.
    """
    w = Writer()
    w.int32(correlation_id)
    RESPONSES[ApiKey.API_VERSIONS].codec(0).encode(
        w, {"error_code": int(ErrorCode.UNSUPPORTED_VERSION), "api_keys": api_versions_list()}
    )
    return _frame(w)


def encode_response(header: RequestHeader, body: Mapping[str, Any]) -> list[Chunk]:
    """Encode a response to ``header``'s request: size prefix, response header, body.

    For an ApiVersions request of an unsupported version this returns the KIP-511 fallback (a v0
    body with ``UNSUPPORTED_VERSION``; ``body`` may override ``api_keys``). Raises
    ``EncodeError`` for a body that cannot be encoded and ``ValueError`` for any other
    unsupported API key or version.
    """
    key = header.api_key
    version = header.api_version
    if key == ApiKey.API_VERSIONS and not is_supported(key, version):
        w = Writer()
        w.int32(header.correlation_id)
        RESPONSES[ApiKey.API_VERSIONS].codec(0).encode(
            w,
            {
                "error_code": int(ErrorCode.UNSUPPORTED_VERSION),
                "api_keys": body.get("api_keys") or api_versions_list(),
            },
        )
        return _frame(w)
    if not is_supported(key, version):
        raise ValueError(f"cannot encode a response for API key {key} version {version}")
    codec = RESPONSES[key].codec(version)
    w = Writer()
    w.int32(header.correlation_id)
    if codec.flexible and key != ApiKey.API_VERSIONS:
        w.unsigned_varint(0)  # empty tagged-fields section of response header v1
    codec.encode(w, body)
    return _frame(w)


# ----------------------------------------------------------------------------------------------
# Client side


def encode_request(
    api_key: int,
    version: int,
    correlation_id: int,
    client_id: str | None,
    body: Mapping[str, Any],
) -> bytes:
    """Encode a whole request frame, 4-byte size prefix included."""
    codec = request_codec(api_key, version)
    w = Writer()
    w.int16(int(api_key))
    w.int16(version)
    w.int32(correlation_id)
    w.nullable_string(client_id)
    if codec.flexible:
        w.unsigned_varint(0)
    codec.encode(w, body)
    return _I32.pack(w.size) + w.getvalue()


def decode_response(api_key: int, version: int, frame: Buffer) -> tuple[int, dict[str, Any]]:
    """Decode a response frame (without its size prefix) to ``(correlation_id, body)``.

    Raises ``DecodeError`` for malformed input and ``ValueError`` for an unsupported version.
    """
    codec = response_codec(api_key, version)
    r = Reader(frame)
    correlation_id = r.int32()
    if response_header_version(api_key, version) == 1:
        _skip_tagged_fields(r)
    try:
        body = codec.decode(r)
    except (struct.error, IndexError, OverflowError) as e:
        raise DecodeError(f"malformed response: {e!r}") from e
    return correlation_id, body
