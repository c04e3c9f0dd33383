"""The network layer: Kafka framing over TCP, one request at a time per connection, in order.

Each connection is a ``BufferedProtocol`` that receives every request straight into its own
``bytearray`` (one kernel copy, no stream-buffer churn: at 1 MB requests this halves the
broker's work per byte). Complete frames queue up, at most ``FRAMES_QUEUED_MAX`` of them,
after which the socket stops being read until the handler catches up (backpressure). One task
per connection takes frames in order, runs the handler, and writes the response before it
takes the next (Kafka's per-connection ordering; clients pipeline on their side).

Bad input never takes the broker down: an oversized, negative or unparseable frame closes
that connection after one log line; every other connection goes on.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import socket
import time
from collections import deque
from typing import TYPE_CHECKING, cast

from sluice.broker.handlers import HANDLERS
from sluice.metrics import TRAFFIC
from sluice.protocol.api import (
    ApiKey,
    UnsupportedVersion,
    decode_request,
    encode_api_versions_fallback,
    encode_response,
)
from sluice.protocol.primitives import DecodeError

if TYPE_CHECKING:
    from sluice.broker.broker import Broker

log = logging.getLogger("sluice.server")

#: Complete requests a connection may hold before the broker stops reading its socket.
FRAMES_QUEUED_MAX = 4
#: Bytes of responses queued to a slow client before the connection waits for them to drain.
WRITE_HIGH_WATER = 16 * 1024 * 1024

#: The host of the client whose request is being handled (per connection task).
current_client_host: contextvars.ContextVar[str] = contextvars.ContextVar("current_client_host", default="")


class ListenerBindError(OSError):
    """The broker's listener address cannot be bound (in use, not an address of this host)."""


def bind_listener(host: str, port: int) -> socket.socket:
    """Bind (but do not yet listen on) the broker's listener address.

    A broker binds first, before its data directory or ZooKeeper: a listener that cannot be
    bound must stop it before it registers anywhere. Clients connecting meanwhile are refused
    (nothing listens yet) rather than left waiting in a backlog nobody serves."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ListenerBindError(
            f"listener PLAINTEXT://{host}:{port}: host {host!r} does not resolve ({exc.strerror}); "
            "fix listeners"
        ) from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ListenerBindError(
            f"listener PLAINTEXT://{host}:{port} cannot be bound: {exc.strerror or exc}; fix listeners "
            "(is another process on that port, or is the address not one of this host's?)"
        ) from None
    return sock


class KafkaServer:
    def __init__(self, broker: Broker):
        self.broker = broker
        self._server: asyncio.base_events.Server | None = None
        self.connections: set[Connection] = set()

    async def start(self, host: str, port: int, *, sock: socket.socket | None = None) -> None:
        """Serve on ``sock`` (bound by :func:`bind_listener`) or, without one, on host:port."""
        loop = asyncio.get_running_loop()
        if sock is not None:
            self._server = await loop.create_server(lambda: Connection(self), sock=sock, backlog=512)
        else:
            self._server = await loop.create_server(lambda: Connection(self), host, port, backlog=512)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [c.task for c in list(self.connections) if c.task is not None]
        for c in list(self.connections):
            c.close()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()


class Connection(asyncio.BufferedProtocol):
    """One client connection: framing in ``get_buffer``/``buffer_updated``, handling in ``_serve``."""

    def __init__(self, server: KafkaServer):
        self.server = server
        self.max_bytes = server.broker.config.socket_request_max_bytes
        self.transport: asyncio.Transport | None = None
        self.peer: object = None
        self.task: asyncio.Task[None] | None = None
        self._size = bytearray(4)
        self._frame: bytearray | None = None
        self._pos = 0
        #: complete frames; a None entry means "the frame was refused: close the connection"
        self._frames: deque[tuple[int, bytearray | None]] = deque()
        self._frame_ready: asyncio.Event = asyncio.Event()
        self._closed = False
        self._reading_paused = False
        self._writing_paused = False
        self._drained: asyncio.Event = asyncio.Event()
        self._drained.set()

    # -- asyncio protocol callbacks --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.peer = transport.get_extra_info("peername")
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.connections.add(self)
        self.task = asyncio.get_running_loop().create_task(self._serve())

    def get_buffer(self, sizehint: int) -> memoryview:
        target = self._size if self._frame is None else self._frame
        return memoryview(target)[self._pos :]

    def buffer_updated(self, nbytes: int) -> None:
        self._pos += nbytes
        if self._frame is None:
            if self._pos < 4:
                return
            size = int.from_bytes(self._size, "big", signed=True)
            self._pos = 0
            if size <= 0 or size > self.max_bytes:
                # Refuse before allocating anything; the serving task logs and closes.
                self._push(size, None)
                self._pause_reading()
                return
            self._frame = bytearray(size)
            return
        if self._pos == len(self._frame):
            self._push(len(self._frame), self._frame)
            self._frame = None
            self._pos = 0

    def eof_received(self) -> bool:
        self._closed = True
        self._frame_ready.set()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._frame_ready.set()
        self._drained.set()
        self.server.connections.discard(self)

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._drained.clear()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._drained.set()

    # -- framing helpers -------------------------------------------------------------------------

    def _push(self, size: int, frame: bytearray | None) -> None:
        self._frames.append((size, frame))
        self._frame_ready.set()
        if len(self._frames) >= FRAMES_QUEUED_MAX:
            self._pause_reading()

    def _pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None and not self._closed:
            self._reading_paused = True
            self.transport.pause_reading()

    async def _next_frame(self) -> tuple[int, bytearray | None] | None:
        while not self._frames:
            if self._closed:
                return None
            self._frame_ready.clear()
            await self._frame_ready.wait()
        item = self._frames.popleft()
        if self._reading_paused and item[1] is not None and len(self._frames) < FRAMES_QUEUED_MAX // 2:
            self._reading_paused = False
            assert self.transport is not None
            self.transport.resume_reading()
        return item

    def close(self) -> None:
        self._closed = True
        if self.transport is not None:
            self.transport.close()
        self._frame_ready.set()

    # -- serving ---------------------------------------------------------------------------------

    async def _serve(self) -> None:
        peer = self.peer
        current_client_host.set(f"/{peer[0]}" if isinstance(peer, tuple) else "")
        try:
            while True:
                item = await self._next_frame()
                if item is None:
                    return
                size, frame = item
                if frame is None:
                    log.warning(
                        "event=frame_rejected peer=%s size=%d max=%d action=close", peer, size, self.max_bytes
                    )
                    return
                if not await self._handle(frame, size):
                    return
        except asyncio.CancelledError:
            pass
        finally:
            self.close()

    async def _handle(self, frame: bytearray, size: int) -> bool:
        """Answer one request; False when the connection must close."""
        assert self.transport is not None
        peer = self.peer
        try:
            header, body = decode_request(frame)
        except UnsupportedVersion as exc:
            h = exc.header
            if h.api_key == ApiKey.API_VERSIONS:
                # KIP-511: answer in v0 with our ranges so the client can pick a version.
                self.transport.writelines(encode_api_versions_fallback(h.correlation_id))
                return True
            log.warning(
                "event=unsupported_request peer=%s api_key=%d version=%d client=%s action=close",
                peer,
                h.api_key,
                h.api_version,
                h.client_id,
            )
            return False
        except DecodeError as exc:
            log.warning("event=malformed_request peer=%s size=%d error=%r action=close", peer, size, str(exc))
            return False
        handler = HANDLERS.get(header.api_key)
        if handler is None:
            log.warning("event=unhandled_api peer=%s api_key=%d action=close", peer, header.api_key)
            return False
        stats = TRAFFIC.api(header.api_key)
        started = time.perf_counter()
        try:
            try:
                response = await handler(self.server.broker, header, body)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception(
                    "event=handler_failed peer=%s api_key=%d version=%d action=close",
                    peer,
                    header.api_key,
                    header.api_version,
                )
                return False
            if response is None:
                return True
            if self._closed:
                return False
            self.transport.writelines(encode_response(header, response))
        finally:
            # Handled, answered or not (acks=0, a closed connection, a handler's failure).
            stats.observe(time.perf_counter() - started)
        if self._writing_paused or self.transport.get_write_buffer_size() > WRITE_HIGH_WATER:
            await self._drained.wait()
        return True
