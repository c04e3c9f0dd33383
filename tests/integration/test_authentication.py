"""A SASL_SSL listener: before a connection authenticates it may send only ApiVersions and the
SASL exchange, in small frames, for a limited time; after, it is its user."""

from __future__ import annotations

import socket
import ssl
import struct
import time
from collections.abc import Callable, Iterator

import pytest

from sluice.protocol.api import ApiKey, encode_request
from sluice.security.client import ClientSecurity
from sluice.sync.wire_client import WireClient
from tests.support.cluster import TestCluster


@pytest.fixture
def secured(make_cluster: Callable[..., TestCluster]) -> TestCluster:
    return make_cluster(1, security="sasl_ssl", broker_settings={"authentication.timeout.ms": "1500"})


def _address(cluster: TestCluster) -> tuple[str, int]:
    host, _, port = cluster.bootstrap.rpartition(":")
    return host, int(port)


def tls_socket(cluster: TestCluster) -> Iterator[ssl.SSLSocket]:
    security = cluster.client_security()
    context = security.ssl_context()
    assert context is not None
    host, port = _address(cluster)
    sock = context.wrap_socket(socket.create_connection((host, port), timeout=10), server_hostname=host)
    try:
        yield sock
    finally:
        sock.close()


def closed_by_broker(sock: ssl.SSLSocket, within_s: float) -> bool:
    sock.settimeout(within_s)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except TimeoutError:
        return False
    except (ConnectionError, ssl.SSLError):
        return True


def test_before_authentication_only_api_versions_and_sasl_are_answered(secured: TestCluster) -> None:
    for sock in tls_socket(secured):
        sock.sendall(encode_request(ApiKey.API_VERSIONS, 3, 1, "probe", {}))
        size = struct.unpack(">i", sock.recv(4))[0]
        assert 0 < size < 4096  # answered
        sock.recv(size)
        sock.sendall(encode_request(ApiKey.METADATA, 9, 2, "probe", {"topics": None}))
        assert closed_by_broker(sock, 5), "a Metadata request before authentication was not refused"
    host, port = _address(secured)
    with WireClient(host, port, security=secured.client_security()) as w:  # the same, authenticated
        r = w.request(ApiKey.METADATA, 9, {"topics": None, "allow_auto_topic_creation": False})
        assert [b["port"] for b in r["brokers"]] == [port]
    log = secured.log_text(1)
    assert "event=unauthenticated_request" in log and "principal=User:admin" in log


def test_a_connection_that_does_not_authenticate_in_time_is_closed(secured: TestCluster) -> None:
    started = time.monotonic()
    for sock in tls_socket(secured):
        assert closed_by_broker(sock, 10), "an idle unauthenticated connection stayed open"
    took = time.monotonic() - started
    assert 1.0 < took < 5.0, took  # authentication.timeout.ms=1500, swept every second


def test_a_large_frame_before_authentication_closes_the_connection(secured: TestCluster) -> None:
    for sock in tls_socket(secured):
        sock.sendall(struct.pack(">i", 600 * 1024) + b"\0" * 1024)  # announces 600 KB (> 512 KB)
        assert closed_by_broker(sock, 5)


def test_a_wrong_password_is_answered_late_then_closed(secured: TestCluster) -> None:
    good = secured.client_security()
    bad = ClientSecurity(good.protocol, good.mechanism, good.username, "wrong", good.ca_location)
    host, port = _address(secured)
    started = time.monotonic()
    with pytest.raises(ConnectionError, match="SASL_AUTHENTICATION_FAILED"):
        WireClient(host, port, security=bad, timeout_s=10)
    assert time.monotonic() - started >= 0.1  # connection.failed.authentication.delay.ms
    assert "event=authentication_failed" in secured.log_text(1)
    import httpx

    scraped = httpx.get(secured.cluster.metrics_urls()[0], timeout=10).text
    counted = [line for line in scraped.splitlines() if line.startswith("sluice_authentications_total{")]
    assert any('result="failed"' in line and not line.endswith(" 0.0") for line in counted), counted
    assert any('result="succeeded"' in line and not line.endswith(" 0.0") for line in counted), counted


def _recv_frame(sock: ssl.SSLSocket) -> bytes:
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            assert chunk, "the broker closed the connection"
            data += chunk
        return data

    return exactly(struct.unpack(">i", exactly(4))[0])


def _scram_first(cluster: TestCluster, user: str) -> dict[str, object]:
    """SaslHandshake and the SCRAM client-first message for `user` on a raw connection: the
    broker's answer to the first SaslAuthenticate."""
    from sluice.protocol.api import decode_response

    for sock in tls_socket(cluster):
        sock.sendall(encode_request(ApiKey.SASL_HANDSHAKE, 1, 1, "probe", {"mechanism": "SCRAM-SHA-512"}))
        _, handshake = decode_response(ApiKey.SASL_HANDSHAKE, 1, _recv_frame(sock))
        assert handshake["error_code"] == 0, handshake
        first = f"n,,n={user},r=probenonce0123456789".encode()
        sock.sendall(encode_request(ApiKey.SASL_AUTHENTICATE, 2, 2, "probe", {"auth_bytes": first}))
        _, answer = decode_response(ApiKey.SASL_AUTHENTICATE, 2, _recv_frame(sock))
        return answer
    raise AssertionError("no connection")


def test_a_probe_cannot_tell_an_unknown_user_from_a_known_one(secured: TestCluster) -> None:
    """RFC 5802 section 5.1's advice: an unknown user gets a challenge too, with a salt and an
    iteration count that are the same at every try. Failing run before the fix: the unknown
    user was answered SASL_AUTHENTICATION_FAILED (58) before any proof, a known user with a
    challenge: {'error_code': 58, 'error_message': 'Authentication failed: invalid user name
    or password', 'auth_bytes': b'', ...}."""
    known = _scram_first(secured, "admin")
    unknown = _scram_first(secured, "nosuchuser")
    assert known["error_code"] == unknown["error_code"] == 0, (known, unknown)

    def fields(answer: dict[str, object]) -> dict[str, str]:
        raw = answer["auth_bytes"]
        assert isinstance(raw, (bytes, memoryview))
        return dict(part.split("=", 1) for part in bytes(raw).decode().split(","))

    k, u = fields(known), fields(unknown)
    assert set(k) == set(u) == {"r", "s", "i"} and k["i"] == u["i"]
    assert len(k["s"]) == len(u["s"]) and u["s"] == fields(_scram_first(secured, "nosuchuser"))["s"]
