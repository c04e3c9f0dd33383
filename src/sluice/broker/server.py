"""The network layer: Kafka framing over TCP, one request at a time per connection, in order.

A connection reads a 4-byte size, the frame, decodes the header and body, runs the handler
and writes the response before it reads the next request (Kafka's per-connection ordering;
clients pipeline on their side). Bad input never takes the broker down: an oversized or
unparseable frame closes that connection after one log line; every other connection goes on.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import TYPE_CHECKING

from sluice.broker.handlers import HANDLERS
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

#: Bytes buffered by the stream reader before it pauses reading from the socket.
READ_BUFFER_LIMIT = 8 * 1024 * 1024
#: Bytes of responses queued to a slow client before the connection stops reading more requests.
WRITE_HIGH_WATER = 16 * 1024 * 1024


class ConnectionClosed(Exception):
    pass


#: The host of the client whose request is being handled (per connection task).
current_client_host: contextvars.ContextVar[str] = contextvars.ContextVar("current_client_host", default="")


class KafkaServer:
    def __init__(self, broker: Broker):
        self.broker = broker
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(
            self._serve, host, port, limit=READ_BUFFER_LIMIT, backlog=512
        )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        current_client_host.set(f"/{peer[0]}" if isinstance(peer, tuple) else "")
        sock = writer.get_extra_info("socket")
        if sock is not None:
            import socket

            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await self._loop(reader, writer, peer)
        except (asyncio.IncompleteReadError, ConnectionError, ConnectionClosed):
            pass
        except asyncio.CancelledError:
            pass
        finally:
            self._connections.discard(task)
            writer.close()

    async def _loop(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: object) -> None:
        max_bytes = self.broker.config.socket_request_max_bytes
        while True:
            size_bytes = await reader.readexactly(4)
            size = int.from_bytes(size_bytes, "big", signed=True)
            if size < 0 or size > max_bytes:
                log.warning("event=frame_rejected peer=%s size=%d max=%d action=close", peer, size, max_bytes)
                raise ConnectionClosed
            frame = await reader.readexactly(size)
            try:
                header, body = decode_request(frame)
            except UnsupportedVersion as exc:
                h = exc.header
                if h.api_key == ApiKey.API_VERSIONS:
                    # KIP-511: answer in v0 with our ranges so the client can pick a version.
                    writer.writelines(encode_api_versions_fallback(h.correlation_id))
                    continue
                log.warning(
                    "event=unsupported_request peer=%s api_key=%d version=%d client=%s action=close",
                    peer,
                    h.api_key,
                    h.api_version,
                    h.client_id,
                )
                raise ConnectionClosed from None
            except DecodeError as exc:
                log.warning(
                    "event=malformed_request peer=%s size=%d error=%r action=close", peer, size, str(exc)
                )
                raise ConnectionClosed from None
            handler = HANDLERS.get(header.api_key)
            if handler is None:
                log.warning("event=unhandled_api peer=%s api_key=%d action=close", peer, header.api_key)
                raise ConnectionClosed
            try:
                response = await handler(self.broker, header, body)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception(
                    "event=handler_failed peer=%s api_key=%d version=%d action=close",
                    peer,
                    header.api_key,
                    header.api_version,
                )
                raise ConnectionClosed from None
            if response is None:
                continue
            writer.writelines(encode_response(header, response))
            if writer.transport.get_write_buffer_size() > WRITE_HIGH_WATER:
                await writer.drain()
