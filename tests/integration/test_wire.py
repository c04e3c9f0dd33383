"""The broker at the wire level, with Sluice's own client: bad input never hurts it, and the
protocol paths real clients rely on behave as Kafka's do."""

from __future__ import annotations

import socket
import ssl
import struct
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.protocol.api import ApiKey, encode_request
from sluice.protocol.errors import ErrorCode
from sluice.protocol.records import build_batch
from sluice.security.client import ClientSecurity
from sluice.security.sasl import PRE_AUTH_APIS
from sluice.sync.wire_client import WireClient
from tests.support.cluster import TestCluster, one_broker_with_topic

pytestmark = pytest.mark.timeout(180)

TOPIC = "wire"


@pytest.fixture(scope="module")
def broker(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    with one_broker_with_topic(zookeeper, tmp_path_factory.mktemp("wire-cluster"), TOPIC, 2) as c:
        yield c


def connect(c: TestCluster) -> WireClient:
    return WireClient.connect(c.bootstrap, timeout_s=10)


def produce(
    w: WireClient, records: bytes, *, partition: int = 0, topic: str = TOPIC, version: int = 9
) -> dict:
    r = w.request(
        ApiKey.PRODUCE,
        version,
        {
            "acks": -1,
            "timeout_ms": 10000,
            "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": records}]}],
        },
    )
    return r["responses"][0]["partition_responses"][0]


def end_offset(w: WireClient, partition: int = 0) -> int:
    r = w.request(
        ApiKey.LIST_OFFSETS,
        7,
        {
            "replica_id": -1,
            "topics": [{"name": TOPIC, "partitions": [{"partition_index": partition, "timestamp": -1}]}],
        },
    )
    p = r["topics"][0]["partitions"][0]
    assert p["error_code"] == ErrorCode.NONE
    return int(p["offset"])


def still_serving(c: TestCluster) -> bool:
    with connect(c) as w:
        r = w.request(ApiKey.METADATA, 12, {"topics": None})
    return any(t["name"] == TOPIC for t in r["topics"])


def closed_by_broker(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_oversized_frame_closes_only_that_connection(broker: TestCluster) -> None:
    with connect(broker) as bystander, connect(broker) as w:
        w.send_raw(struct.pack(">i", 200 * 1024 * 1024) + b"\x00" * 64)
        assert closed_by_broker(w.sock)
        assert bystander.request(ApiKey.API_VERSIONS, 3, {})["error_code"] == ErrorCode.NONE
    assert "event=frame_rejected" in broker.log_text(1)


def test_negative_frame_size_closes_connection(broker: TestCluster) -> None:
    with connect(broker) as w:
        w.send_raw(struct.pack(">i", -5))
        assert closed_by_broker(w.sock)
    assert still_serving(broker)


def test_unknown_api_key_closes_connection_and_broker_serves_others(broker: TestCluster) -> None:
    with connect(broker) as w:
        body = struct.pack(">hhi", 9999, 0, 7) + struct.pack(">h", 1) + b"x"
        w.send_raw(struct.pack(">i", len(body)) + body)
        assert closed_by_broker(w.sock)
    assert still_serving(broker)
    assert "event=unsupported_request" in broker.log_text(1)


def test_api_versions_above_max_answers_with_supported_ranges(broker: TestCluster) -> None:
    with connect(broker) as w:
        body = struct.pack(">hhi", ApiKey.API_VERSIONS, 99, 42) + struct.pack(">h", -1) + b"\x00" * 8
        w.send_raw(struct.pack(">i", len(body)) + body)
        frame = w.read_frame()
    correlation_id, error_code = struct.unpack(">ih", frame[:6])
    assert correlation_id == 42
    assert error_code == ErrorCode.UNSUPPORTED_VERSION


def test_truncated_request_body_closes_connection(broker: TestCluster) -> None:
    full = encode_request(ApiKey.METADATA, 1, 5, "t", {"topics": [{"name": TOPIC}]})
    body = full[4:-3]
    with connect(broker) as w:
        w.send_raw(struct.pack(">i", len(body)) + body)
        assert closed_by_broker(w.sock)
    assert still_serving(broker)


def test_crc_mismatch_is_corrupt_message_and_appends_nothing(broker: TestCluster) -> None:
    with connect(broker) as w:
        before = end_offset(w)
        good = build_batch([(b"k", b"good")])
        bad = bytearray(build_batch([(b"k", b"value-to-corrupt")]))
        bad[-3] ^= 0xFF
        assert produce(w, bytes(bad))["error_code"] == ErrorCode.CORRUPT_MESSAGE
        assert end_offset(w) == before
        # A good batch followed by a corrupt one is two batches for one partition: refused
        # whole, as Kafka refuses it (Produce v3+ takes exactly one), before any CRC is read.
        assert produce(w, good + bytes(bad))["error_code"] == ErrorCode.INVALID_RECORD
        assert end_offset(w) == before
        assert produce(w, good)["error_code"] == ErrorCode.NONE
        assert end_offset(w) == before + 1


def test_produce_to_missing_topic_is_unknown_topic(broker: TestCluster) -> None:
    with connect(broker) as w:
        result = produce(w, build_batch([(None, b"x")]), topic="does-not-exist")
    assert result["error_code"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_produce_to_missing_partition_is_unknown_topic(broker: TestCluster) -> None:
    with connect(broker) as w:
        result = produce(w, build_batch([(None, b"x")]), partition=7)
    assert result["error_code"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_invalid_acks_is_rejected(broker: TestCluster) -> None:
    with connect(broker) as w:
        before = end_offset(w)
        r = w.request(
            ApiKey.PRODUCE,
            8,
            {
                "acks": 2,
                "timeout_ms": 1000,
                "topic_data": [
                    {"name": TOPIC, "partition_data": [{"index": 0, "records": build_batch([(None, b"x")])}]}
                ],
            },
        )
        assert r["responses"][0]["partition_responses"][0]["error_code"] == ErrorCode.INVALID_REQUIRED_ACKS
        assert end_offset(w) == before


def test_idempotent_retry_returns_original_offset_and_gap_is_out_of_order(broker: TestCluster) -> None:
    with connect(broker) as w:
        pid_resp = w.request(
            ApiKey.INIT_PRODUCER_ID,
            4,
            {
                "transactional_id": None,
                "transaction_timeout_ms": 60000,
                "producer_id": -1,
                "producer_epoch": -1,
            },
        )
        assert pid_resp["error_code"] == ErrorCode.NONE
        pid, epoch = pid_resp["producer_id"], pid_resp["producer_epoch"]
        b0 = build_batch([(None, b"a"), (None, b"b")], producer_id=pid, producer_epoch=epoch, base_sequence=0)
        first = produce(w, b0, partition=1)
        assert first["error_code"] == ErrorCode.NONE
        leo = end_offset(w, 1)
        retry = produce(w, b0, partition=1)
        assert retry["error_code"] == ErrorCode.NONE
        assert retry["base_offset"] == first["base_offset"]
        assert end_offset(w, 1) == leo, "a retried batch must not be appended twice"
        gap = build_batch([(None, b"c")], producer_id=pid, producer_epoch=epoch, base_sequence=5)
        assert produce(w, gap, partition=1)["error_code"] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert end_offset(w, 1) == leo
        nxt = build_batch([(None, b"c")], producer_id=pid, producer_epoch=epoch, base_sequence=2)
        assert produce(w, nxt, partition=1)["base_offset"] == leo


def test_fetch_long_poll_waits_for_max_wait_then_wakes_on_data(broker: TestCluster) -> None:
    with connect(broker) as w, connect(broker) as writer:
        leo = end_offset(w)
        request = {
            "replica_id": -1,
            "max_wait_ms": 600,
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "isolation_level": 0,
            "session_id": 0,
            "session_epoch": -1,
            "topics": [
                {
                    "topic": TOPIC,
                    "partitions": [
                        {
                            "partition": 0,
                            "fetch_offset": leo,
                            "partition_max_bytes": 1 << 20,
                            "current_leader_epoch": -1,
                            "log_start_offset": -1,
                        }
                    ],
                }
            ],
        }
        started = time.monotonic()
        r = w.request(ApiKey.FETCH, 11, request)
        waited = time.monotonic() - started
        assert r["responses"][0]["partitions"][0]["error_code"] == ErrorCode.NONE
        assert len(r["responses"][0]["partitions"][0]["records"] or b"") == 0
        assert waited >= 0.55, f"returned after {waited:.2f} s without data, before max_wait_ms"

        request["max_wait_ms"] = 20000
        w.send(ApiKey.FETCH, 11, request)
        time.sleep(0.2)
        started = time.monotonic()
        produce(writer, build_batch([(None, b"wake-up")]))
        r = w.receive()
        assert time.monotonic() - started < 10, "the fetch did not wake up when data arrived"
        records = r["responses"][0]["partitions"][0]["records"]
        assert records is not None and len(records) > 0


def test_list_offsets_by_timestamp(broker: TestCluster) -> None:
    with connect(broker) as w:
        t0 = int(time.time() * 1000) + 100_000
        produce(w, build_batch([(None, b"old")], timestamp_ms=t0))
        leo_mid = end_offset(w)
        produce(w, build_batch([(None, b"new")], timestamp_ms=t0 + 5000))
        r = w.request(
            ApiKey.LIST_OFFSETS,
            7,
            {
                "replica_id": -1,
                "topics": [
                    {
                        "name": TOPIC,
                        "partitions": [
                            {"partition_index": 0, "timestamp": t0 + 1},
                            {"partition_index": 1, "timestamp": -2},
                        ],
                    }
                ],
            },
        )
        parts = {p["partition_index"]: p for p in r["topics"][0]["partitions"]}
        assert parts[0]["offset"] == leo_mid
        assert parts[0]["timestamp"] == t0 + 5000
        assert parts[1]["offset"] == 0


def test_describe_configs_shows_overrides_and_defaults(broker: TestCluster) -> None:
    with connect(broker) as w:
        r = w.request(
            ApiKey.CREATE_TOPICS,
            7,
            {
                "topics": [
                    {
                        "name": "configured",
                        "num_partitions": 1,
                        "replication_factor": 1,
                        "configs": [{"name": "retention.ms", "value": "3600000"}],
                    }
                ],
                "timeout_ms": 30000,
            },
        )
        assert r["topics"][0]["error_code"] == ErrorCode.NONE
        bad = w.request(
            ApiKey.CREATE_TOPICS,
            7,
            {
                "topics": [
                    {
                        "name": "badcfg",
                        "num_partitions": 1,
                        "replication_factor": 1,
                        "configs": [{"name": "retention.ms", "value": "soon"}],
                    }
                ],
                "timeout_ms": 30000,
            },
        )
        assert bad["topics"][0]["error_code"] == ErrorCode.INVALID_CONFIG
        assert "retention.ms" in bad["topics"][0]["error_message"]
        d = w.request(
            ApiKey.DESCRIBE_CONFIGS,
            4,
            {"resources": [{"resource_type": 2, "resource_name": "configured", "configuration_keys": None}]},
        )
        configs = {c["name"]: c for c in d["results"][0]["configs"]}
        assert configs["retention.ms"]["value"] == "3600000"
        assert configs["retention.ms"]["config_source"] == 1
        assert configs["segment.bytes"]["config_source"] == 5


# -- fuzz: random and mutated frames against the live broker ----------------------------------------


def _valid_frames() -> list[bytes]:
    frames = [
        encode_request(
            ApiKey.API_VERSIONS, 3, 1, "fuzz", {"client_software_name": "f", "client_software_version": "1"}
        ),
        encode_request(ApiKey.METADATA, 12, 2, "fuzz", {"topics": [{"name": TOPIC}]}),
        encode_request(
            ApiKey.PRODUCE,
            9,
            3,
            "fuzz",
            {
                "acks": -1,
                "timeout_ms": 1000,
                "topic_data": [
                    {"name": TOPIC, "partition_data": [{"index": 0, "records": build_batch([(b"k", b"v")])}]}
                ],
            },
        ),
        encode_request(
            ApiKey.FETCH,
            12,
            4,
            "fuzz",
            {
                "replica_id": -1,
                "max_wait_ms": 0,
                "min_bytes": 0,
                "max_bytes": 1024,
                "topics": [
                    {
                        "topic": TOPIC,
                        "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1024}],
                    }
                ],
            },
        ),
        encode_request(
            ApiKey.LIST_OFFSETS,
            5,
            5,
            "fuzz",
            {
                "replica_id": -1,
                "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0, "timestamp": -1}]}],
            },
        ),
    ]
    return [f[4:] for f in frames]


VALID = _valid_frames()


#: what a client sends before it has authenticated: the SASL requests, with ApiVersions
SASL = [
    f[4:]
    for f in (
        encode_request(ApiKey.SASL_HANDSHAKE, 1, 6, "fuzz", {"mechanism": "SCRAM-SHA-512"}),
        encode_request(ApiKey.SASL_AUTHENTICATE, 2, 7, "fuzz", {"auth_bytes": b"n,,n=admin,r=fuzznonce"}),
    )
]


@st.composite
def frames(draw: st.DrawFn, valid: list[bytes] = VALID) -> bytes:
    if draw(st.booleans()):
        return draw(st.binary(min_size=0, max_size=300))
    frame = bytearray(draw(st.sampled_from(valid)))
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["flip", "truncate", "extend", "int"]))
        if kind == "flip" and frame:
            i = draw(st.integers(0, len(frame) - 1))
            frame[i] ^= draw(st.integers(1, 255))
        elif kind == "truncate" and frame:
            del frame[draw(st.integers(0, len(frame) - 1)) :]
        elif kind == "extend":
            frame += draw(st.binary(max_size=40))
        elif kind == "int" and len(frame) >= 4:
            i = draw(st.integers(0, len(frame) - 4))
            frame[i : i + 4] = struct.pack(">i", draw(st.sampled_from([-1, -2, 0x7FFFFFFF, 1 << 30, 65536])))
    return bytes(frame)


@settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(frame=frames())
def test_fuzzed_frames_never_take_the_broker_down(broker: TestCluster, frame: bytes) -> None:
    with socket.create_connection((broker.broker(1).host, broker.broker(1).port), timeout=10) as s:
        s.sendall(struct.pack(">i", len(frame)) + frame)
        s.settimeout(5)
        try:
            # The broker either answers or closes; it must not hang on a complete frame.
            s.recv(65536)
        except (ConnectionResetError, TimeoutError):
            pass


def test_broker_alive_after_fuzz(broker: TestCluster) -> None:
    # Runs after the fuzz test in file order; the broker process must still be the same one.
    from sluice.ops.launcher import pid_alive

    assert pid_alive(broker.broker(1).pid)
    assert still_serving(broker)
    assert "event=handler_failed" not in broker.log_text(1), "a handler raised on fuzzed input"


# -- the same against a SASL_SSL listener, before and after authentication ---------------------------


@pytest.fixture(scope="module")
def secure_broker(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    c = TestCluster(zookeeper, tmp_path_factory.mktemp("wire-secure-cluster"), 1, security="sasl_ssl")
    try:
        with WireClient.connect(c.bootstrap, timeout_s=10, security=c.client_security()) as w:
            r = w.request(ApiKey.CREATE_TOPICS, 5, {"timeout_ms": 30000, "topics": [
                {"name": TOPIC, "num_partitions": 2, "replication_factor": 1}]})  # fmt: skip
            assert r["topics"][0]["error_code"] == ErrorCode.NONE, r
        yield c
    finally:
        c.down()


def admin_security(c: TestCluster) -> ClientSecurity:
    assert c.client_properties is not None
    return ClientSecurity.from_file(c.client_properties)


def answer_or_close(sock: socket.socket) -> bytes:
    """What the broker sends back to a fuzzed frame: an answer, or b"" when it closes."""
    sock.settimeout(5)
    try:
        # The broker either answers or closes; it must not hang on a complete frame.
        return sock.recv(65536)
    except (ConnectionResetError, ssl.SSLError):
        return b""
    except TimeoutError:
        return b"(no answer)"


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(frame=frames(VALID + SASL))
def test_fuzzed_frames_before_authentication_never_take_a_sasl_ssl_broker_down(
    secure_broker: TestCluster, frame: bytes
) -> None:
    b = secure_broker.broker(1)
    context = admin_security(secure_broker).ssl_context()
    assert context is not None
    with context.wrap_socket(
        socket.create_connection((b.host, b.port), timeout=10), server_hostname=b.host
    ) as s:
        s.sendall(struct.pack(">i", len(frame)) + frame)
        answer = answer_or_close(s)
    api_key = struct.unpack(">h", frame[:2])[0] if len(frame) >= 2 else -1
    if api_key not in PRE_AUTH_APIS:
        # Before authentication only ApiVersions and SASL are answered; anything else closes.
        assert answer == b"", f"api key {api_key} before authentication was answered: {answer[:60]!r}"


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(frame=frames())
def test_fuzzed_frames_after_authentication_never_take_a_sasl_ssl_broker_down(
    secure_broker: TestCluster, frame: bytes
) -> None:
    b = secure_broker.broker(1)
    # SCRAM-SHA-512 with the admin user: the frames reach every handler, not only the SASL ones
    with WireClient(b.host, b.port, timeout_s=10, security=admin_security(secure_broker)) as w:
        w.send_raw(struct.pack(">i", len(frame)) + frame)
        answer_or_close(w.sock)


def test_sasl_ssl_broker_alive_after_fuzz(secure_broker: TestCluster) -> None:
    from sluice.ops.launcher import pid_alive

    assert pid_alive(secure_broker.broker(1).pid)
    with WireClient.connect(
        secure_broker.bootstrap, timeout_s=10, security=admin_security(secure_broker)
    ) as w:
        r = w.request(ApiKey.METADATA, 12, {"topics": None})
    assert any(t["name"] == TOPIC for t in r["topics"])
    log = secure_broker.log_text(1)
    assert "event=handler_failed" not in log, "a handler raised on fuzzed input"
    assert "event=authenticated" in log


def test_offset_for_leader_epoch_returns_the_end_of_the_current_epoch(broker: TestCluster) -> None:
    with connect(broker) as w:
        produce(w, build_batch([(None, b"epoch-check")]))
        leo = end_offset(w)
        r = w.request(
            ApiKey.OFFSET_FOR_LEADER_EPOCH,
            4,
            {
                "replica_id": -2,
                "topics": [
                    {
                        "topic": TOPIC,
                        "partitions": [
                            {"partition": 0, "current_leader_epoch": -1, "leader_epoch": 0},
                            {"partition": 1, "current_leader_epoch": 7, "leader_epoch": 0},
                        ],
                    }
                ],
            },
        )
    parts = {p["partition"]: p for p in r["topics"][0]["partitions"]}
    assert (parts[0]["error_code"], parts[0]["leader_epoch"], parts[0]["end_offset"]) == (
        ErrorCode.NONE,
        0,
        leo,
    )
    assert parts[1]["error_code"] == ErrorCode.UNKNOWN_LEADER_EPOCH
