"""A small blocking Kafka-protocol client on Sluice's own codec.

For tools, tests and benchmarks that need to say exactly what goes on the wire (pre-built
batches, malformed frames, protocol types no library speaks). Applications use real Kafka
clients instead.
"""

from __future__ import annotations

import socket
import struct
from collections import deque
from typing import Any

from sluice.protocol.api import decode_response, encode_request
from sluice.security.client import ClientSecurity, authenticate

_SIZE = struct.Struct(">i")


class WireError(ConnectionError):
    pass


class WireClient:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        client_id: str = "sluice-wire",
        timeout_s: float = 30.0,
        security: ClientSecurity | None = None,
    ):
        """Connect, and with `security` set up TLS and authenticate (SASL) before returning."""
        sock = socket.create_connection((host, port), timeout=timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.client_id = client_id
        self._correlation = 0
        self._inflight: deque[tuple[int, int, int]] = deque()
        context = security.ssl_context() if security is not None else None
        try:
            self.sock = context.wrap_socket(sock, server_hostname=host) if context is not None else sock
            if security is not None and security.sasl:
                authenticate(security, self.request)
        except BaseException:
            sock.close()
            raise

    @classmethod
    def connect(cls, bootstrap: str, **kwargs: Any) -> WireClient:
        host, _, port = bootstrap.split(",")[0].rpartition(":")
        return cls(host or "127.0.0.1", int(port), **kwargs)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, api_key: int, version: int, body: dict[str, Any], *, expect_response: bool = True) -> int:
        self._correlation += 1
        cid = self._correlation
        self.sock.sendall(encode_request(api_key, version, cid, self.client_id, body))
        if expect_response:
            self._inflight.append((cid, api_key, version))
        return cid

    def send_raw(self, frame: bytes) -> None:
        """Send bytes as they are (for malformed-input tests)."""
        self.sock.sendall(frame)

    def receive(self) -> dict[str, Any]:
        cid, api_key, version = self._inflight.popleft()
        frame = self.read_frame()
        got, body = decode_response(api_key, version, frame)
        if got != cid:
            raise WireError(f"response correlation id {got} does not match request {cid}")
        return body

    def read_frame(self) -> bytes:
        size = _SIZE.unpack(self._read_exactly(4))[0]
        if size < 0:
            raise WireError(f"negative frame size {size}")
        return self._read_exactly(size)

    def request(self, api_key: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
        self.send(api_key, version, body)
        return self.receive()

    def _read_exactly(self, n: int) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            r = self.sock.recv_into(view[got:], n - got)
            if r == 0:
                raise WireError("connection closed by the broker")
            got += r
        return bytes(buf)
