"""The network layer: Kafka framing over TCP, one request at a time per connection, in order.

Each connection is a ``BufferedProtocol`` that receives every request straight into its own
``bytearray`` (one kernel copy, no stream-buffer churn: at 1 MB requests this halves the
broker's work per byte). One task per connection takes complete frames in order, runs the
handler, and writes the response before it takes the next (Kafka's per-connection ordering;
clients pipeline on their side).

Hostile or broken clients cannot stop the broker from serving the others (the limits are in
``connection_quotas``, the rules there, the I/O here):

- a frame's buffer follows the bytes that arrive (``frame_capacity``): announcing 100 MB and
  sending 10 bytes costs 10 bytes and one chunk;
- every byte being read or waiting to be handled is reserved first in the server's
  ``MemoryPool`` (``queued.max.request.bytes``); a connection that cannot reserve stops reading
  its socket until another releases. A frame's first chunk may use the pool's last
  ``POOL_HEADROOM`` bytes, the rest of a large frame may not, so large partial frames cannot
  starve small requests; the rest of a frame is reserved at once, so frames that hold their
  reservation always complete and release it;
- a connection queues at most ``FRAMES_QUEUED_MAX`` complete frames and
  ``socket.request.max.bytes`` of them before it stops reading (backpressure);
- ``max.connections`` and ``max.connections.per.ip`` refuse new connections at accept;
- a connection with nothing in flight for ``connections.max.idle.ms``, and a frame not complete
  ``socket.request.read.timeout.ms`` after its first byte (a slow-loris), are closed by a sweep.

Bad input never takes the broker down: an oversized, negative or unparseable frame closes
that connection after one log line; every other connection goes on.

Where authentication will sit: ``Connection._serve`` hands every complete frame to
``_handle``; a per-connection authentication state belongs between the two (frames before
authentication go to the SASL exchange, never to ``HANDLERS``), and ``current_session`` is set
there once the connection has authenticated.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import time
from collections import deque
from typing import TYPE_CHECKING, Any, cast

from sluice import metrics
from sluice.broker import zero_copy
from sluice.broker.authentication import ConnectionAuth
from sluice.broker.connection_quotas import (
    FRAME_CHUNK_BYTES,
    ConnectionLimits,
    MemoryPool,
    connection_refusal,
    frame_capacity,
)
from sluice.broker.handlers import HANDLERS
from sluice.broker.listeners import Listener
from sluice.metrics import TRAFFIC
from sluice.protocol.api import (
    ApiKey,
    RequestHeader,
    UnsupportedVersion,
    decode_request,
    encode_api_versions_fallback,
    encode_response,
)
from sluice.protocol.primitives import Chunk, DecodeError, FileRegion, RegionTruncatedError
from sluice.security.session import current_client_host, current_session

if TYPE_CHECKING:
    from sluice.broker.context import BrokerContext

log = logging.getLogger("sluice.server")

#: The largest frame a SASL connection may send before it has authenticated (Kafka's default
#: ``sasl.server.max.receive.size``).
PRE_AUTH_MAX_BYTES = 512 * 1024
PLAINTEXT_LISTENER = Listener("PLAINTEXT", "PLAINTEXT", "", 0)
#: How long a connection refused authentication stays open for its client to read why.
FAILED_AUTH_LINGER_S = 1.0
#: Complete requests a connection may hold before the broker stops reading its socket.
FRAMES_QUEUED_MAX = 4
#: The pool's last bytes, which only the first chunk of a frame may take (see the docstring).
POOL_HEADROOM_MAX = 8 * 1024 * 1024
#: How often idle and slow connections are looked for.
SWEEP_INTERVAL_S = 1.0
#: Bytes of responses queued to a slow client before the connection waits for them to drain.
WRITE_HIGH_WATER = 16 * 1024 * 1024


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
        error = ListenerBindError(
            f"listener PLAINTEXT://{host}:{port} cannot be bound: {exc.strerror or exc}; fix listeners "
            "(is another process on that port, or is the address not one of this host's?)"
        )
        error.errno = exc.errno  # EADDRINUSE: the broker exits ADDRESS_IN_USE_EXIT (launcher retries)
        raise error from None
    return sock


class KafkaServer:
    def __init__(self, broker: BrokerContext):
        self.broker = broker
        config = broker.config
        self._server: asyncio.base_events.Server | None = None
        self._servers: list[asyncio.base_events.Server] = []
        self.connections: set[Connection] = set()
        self.limits = ConnectionLimits(
            config.max_connections, config.max_connections_per_ip, config.max_connections_per_ip_overrides
        )
        self._per_ip: dict[str, int] = {}
        self.pool = MemoryPool(config.queued_max_request_bytes)
        capacity = config.queued_max_request_bytes
        self.pool_headroom = 0 if capacity is None else min(POOL_HEADROOM_MAX, capacity // 8)
        #: connections that stopped reading until the pool has room, in the order they asked
        self._pool_waiters: deque[Connection] = deque()
        self._sweeper: asyncio.Task[None] | None = None
        self._refusals_logged_at = 0.0
        self._refused_unlogged = 0

    async def start(self, host: str, port: int, *, sock: socket.socket | None = None) -> None:
        """Serve one PLAINTEXT listener on ``sock`` (bound by :func:`bind_listener`) or, without
        one, on host:port."""
        if sock is None:
            sock = bind_listener(host, port)
        await self.start_listeners([(Listener("PLAINTEXT", "PLAINTEXT", host, port), sock)])

    async def start_listeners(self, bound: list[tuple[Listener, socket.socket]]) -> None:
        """Serve every listener on its bound socket; SSL and SASL_SSL ones with the broker's TLS."""
        loop = asyncio.get_running_loop()
        tls = self.broker.config.tls
        context = tls.context() if tls is not None and any(lst.tls for lst, _ in bound) else None
        for lst, sock in bound:
            server = await loop.create_server(
                functools.partial(Connection, self, lst), sock=sock, backlog=512,
                ssl=context if lst.tls else None,
            )  # fmt: skip
            self._servers.append(server)
        self._server = self._servers[0] if self._servers else None
        self._sweeper = loop.create_task(self._sweep_until_stopped())

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        tasks = [c.task for c in list(self.connections) if c.task is not None]
        for c in list(self.connections):
            c.close()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()

    # -- connection limits -----------------------------------------------------------------------

    def admit(self, conn: Connection) -> bool:
        """Count a new connection in, or refuse it (max.connections, max.connections.per.ip)."""
        ip = conn.ip
        reason = connection_refusal(self.limits, len(self.connections), self._per_ip.get(ip, 0), ip)
        if reason is not None:
            metrics.CONNECTIONS_REFUSED.labels(reason).inc()
            self._log_refusal(ip, reason)
            return False
        self.connections.add(conn)
        self._per_ip[ip] = self._per_ip.get(ip, 0) + 1
        return True

    def forget(self, conn: Connection) -> None:
        if conn in self.connections:
            self.connections.discard(conn)
            left = self._per_ip.get(conn.ip, 1) - 1
            if left:
                self._per_ip[conn.ip] = left
            else:
                self._per_ip.pop(conn.ip, None)
        try:
            self._pool_waiters.remove(conn)
        except ValueError:
            pass

    def _log_refusal(self, ip: str, reason: str) -> None:
        # A flood of connections must not become a flood of log lines: one a second at most.
        now = time.monotonic()
        if now - self._refusals_logged_at < 1.0:
            self._refused_unlogged += 1
            return
        log.warning(
            "event=connection_refused ip=%s reason=%s open=%d open_from_ip=%d refused_since_last_line=%d "
            "action='raise %s if these clients are expected'",
            ip,
            reason,
            len(self.connections),
            self._per_ip.get(ip, 0),
            self._refused_unlogged,
            reason.replace("_", "."),
        )
        self._refusals_logged_at = now
        self._refused_unlogged = 0

    # -- the request memory pool -----------------------------------------------------------------

    def reserve(self, conn: Connection, nbytes: int, *, first_chunk: bool) -> bool:
        """Reserve ``nbytes`` for ``conn``'s frame; False (and ``conn`` queued to be woken) when
        the pool has no room: the connection stops reading until it has."""
        keep = 0 if first_chunk else self.pool_headroom
        # First come, first served: a large frame waiting for room is not overtaken by later ones.
        in_turn = first_chunk or not self._pool_waiters or self._pool_waiters[0] is conn
        if in_turn and self.pool.try_reserve(nbytes, keep=keep):
            return True
        if conn not in self._pool_waiters:
            self._pool_waiters.append(conn)
        return False

    def release(self, nbytes: int) -> None:
        if nbytes:
            self.pool.release(nbytes)
            self._wake_pool_waiters()

    def _wake_pool_waiters(self) -> None:
        while self._pool_waiters:
            conn = self._pool_waiters[0]
            if not conn.retry_reserve():
                return
            if self._pool_waiters and self._pool_waiters[0] is conn:
                self._pool_waiters.popleft()

    # -- idle and slow connections ---------------------------------------------------------------

    async def _sweep_until_stopped(self) -> None:
        config = self.broker.config
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            try:
                self.sweep(
                    time.monotonic(), config.connections_max_idle_ms, config.socket_request_read_timeout_ms
                )
            except Exception:
                log.exception("event=connection_sweep_failed")

    def sweep(self, now: float, idle_ms: int, read_timeout_ms: int) -> None:
        """Close connections idle for ``idle_ms`` (nothing received, queued or in flight) and
        those with a frame started more than ``read_timeout_ms`` ago and still incomplete."""
        idle = slow = 0
        for conn in list(self.connections):
            why = conn.stale(now, idle_ms / 1000.0, read_timeout_ms / 1000.0)
            if why is None:
                continue
            metrics.CONNECTIONS_CLOSED.labels(why).inc()
            if why == "idle":
                idle += 1
            else:
                slow += 1
            conn.close()
        if idle or slow:
            log.info(
                "event=connections_closed idle=%d slow_request=%d idle_ms=%d read_timeout_ms=%d open=%d",
                idle,
                slow,
                idle_ms,
                read_timeout_ms,
                len(self.connections),
            )


class Connection(asyncio.BufferedProtocol):
    """One client connection: framing in ``get_buffer``/``buffer_updated``, handling in ``_serve``."""

    def __init__(self, server: KafkaServer, listener: Listener = PLAINTEXT_LISTENER):
        self.server = server
        self.listener = listener
        #: who this connection is (broker/authentication.py); made once connected
        self.auth: ConnectionAuth | None = None
        # Before a SASL connection authenticates, its frames are small (Kafka's 512 KB
        # sasl.server.max.receive.size): an anonymous client cannot make the broker hold more.
        self.max_bytes = server.broker.config.socket_request_max_bytes
        if listener.sasl:
            self.max_bytes = min(self.max_bytes, PRE_AUTH_MAX_BYTES)
        self.transport: asyncio.Transport | None = None
        self.peer: object = None
        self.ip = ""
        self.task: asyncio.Task[None] | None = None
        self._size = bytearray(4)
        #: the frame being received: its announced size, its buffer (grown as bytes arrive, see
        #: ``frame_capacity``), the bytes reserved for it in the pool, and when it started
        self._frame_size = 0
        self._frame: bytearray | None = None
        self._frame_reserved = 0
        self._frame_started = 0.0
        #: waiting for the pool: the frame's next reservation could not be made
        self._wants_pool = False
        self._pos = 0
        #: complete frames; a None entry means "the frame was refused: close the connection"
        self._frames: deque[tuple[int, bytearray | None]] = deque()
        #: pool bytes held by complete frames not yet handled (released once handled)
        self._queued_bytes = 0
        self._frame_ready: asyncio.Event = asyncio.Event()
        self._closed = False
        self._reading_paused = False
        self._writing_paused = False
        self._drained: asyncio.Event = asyncio.Event()
        self._drained.set()
        self._handling = False
        self._last_activity = time.monotonic()
        #: the socket's descriptor, for responses sent from the log's files (broker/zero_copy.py);
        #: None on TLS, whose bytes must pass through the transport
        self._zero_copy_fd: int | None = None

    # -- asyncio protocol callbacks --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.peer = transport.get_extra_info("peername")
        self.ip = str(self.peer[0]) if isinstance(self.peer, tuple) else ""
        if not self.server.admit(self):
            self._closed = True
            self.transport.abort()
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if transport.get_extra_info("ssl_object") is None:
                self._zero_copy_fd = sock.fileno()
        self.auth = ConnectionAuth(
            self.server.broker, self.listener, f"/{self.ip}", transport.get_extra_info("ssl_object")
        )
        self.task = asyncio.get_running_loop().create_task(self._serve())

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is None:
            return memoryview(self._size)[self._pos :]
        if self._pos == len(self._frame):
            if self._frame_reserved == self._frame_size:
                # The whole frame is reserved in the pool (after its first chunk arrived): one
                # buffer of the announced size, instead of doubling as bytes arrive (two extra
                # copies of a 1 MB request). bytearray(n) is calloc'd: its pages are committed
                # only as bytes are received into them.
                grown = bytearray(self._frame_size)
                grown[: self._pos] = self._frame
                self._frame = grown
            else:
                # Grow only for bytes that are arriving: the announcement alone allocates nothing.
                self._frame += bytes(frame_capacity(self._pos, self._frame_size) - self._pos)
        return memoryview(self._frame)[self._pos :]

    def buffer_updated(self, nbytes: int) -> None:
        self._pos += nbytes
        self._last_activity = time.monotonic()
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
            self._frame_size = size
            self._frame = bytearray()
            self._frame_started = self._last_activity
            self._reserve_next()
            return
        if self._pos == self._frame_size:
            frame = self._frame
            assert len(frame) == self._frame_size == self._frame_reserved
            self._queued_bytes += self._frame_reserved
            self._frame, self._frame_reserved, self._frame_size = None, 0, 0
            self._pos = 0
            self._push(len(frame), frame)
        elif self._pos == self._frame_reserved:
            self._reserve_next()

    def _reserve_next(self) -> None:
        """Reserve the frame's next bytes in the pool before reading them: its first chunk,
        then, once that is full, all the rest at once. Without room, stop reading until the pool
        wakes this connection (``retry_reserve``)."""
        assert self._frame is not None
        first = self._frame_reserved == 0
        nbytes = (
            min(self._frame_size, FRAME_CHUNK_BYTES) if first else self._frame_size - self._frame_reserved
        )
        if self.server.reserve(self, nbytes, first_chunk=first):
            self._frame_reserved += nbytes
            self._wants_pool = False
            return
        self._wants_pool = True
        self._pause_reading()

    def retry_reserve(self) -> bool:
        """Called by the server when pool bytes were released: True when this connection no
        longer waits for the pool (it reserved, or closed)."""
        if self._closed or self._frame is None or not self._wants_pool:
            self._wants_pool = False
            return True
        self._reserve_next()
        if self._wants_pool:
            return False
        self._maybe_resume_reading()
        return True

    def stale(self, now: float, idle_s: float, read_timeout_s: float) -> str | None:
        """Why the sweep should close this connection ("idle", "slow_request"), or None."""
        if self._closed:
            return None
        if self.auth is not None and self.auth.expired():
            return "unauthenticated"
        if self._frame is not None or self._pos > 0:
            started = self._frame_started if self._frame is not None else self._last_activity
            return "slow_request" if now - started > read_timeout_s else None
        if self._handling or self._frames:
            return None
        return "idle" if now - self._last_activity > idle_s else None

    def eof_received(self) -> bool:
        self._closed = True
        self._frame_ready.set()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._frame_ready.set()
        self._drained.set()
        self.server.forget(self)
        # Bytes of a partial frame and of frames never handled go back to the pool (frames the
        # serving task is handling now are released by it).
        held, self._frame_reserved, self._frame = self._frame_reserved, 0, None
        queued, self._queued_bytes = self._queued_bytes, 0
        self._frames.clear()
        self.server.release(held + queued)

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
        if self._queue_full():
            self._pause_reading()

    def _queue_full(self) -> bool:
        return len(self._frames) >= FRAMES_QUEUED_MAX or self._queued_bytes >= self.max_bytes

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
        if item[1] is not None:
            self._maybe_resume_reading()
        return item

    def _maybe_resume_reading(self) -> None:
        if (
            self._reading_paused
            and not self._closed
            and not self._wants_pool
            and len(self._frames) < FRAMES_QUEUED_MAX // 2
            and self._queued_bytes < self.max_bytes
        ):
            self._reading_paused = False
            assert self.transport is not None
            self.transport.resume_reading()

    def close(self) -> None:
        self._closed = True
        if self.transport is not None:
            self.transport.close()
        self._frame_ready.set()

    # -- serving ---------------------------------------------------------------------------------

    async def _serve(self) -> None:
        peer = self.peer
        current_client_host.set(f"/{peer[0]}" if isinstance(peer, tuple) else "")
        if self.auth is not None:
            current_session.set(self.auth.session)
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
                self._handling = True
                try:
                    if not await self._handle(frame, size):
                        return
                finally:
                    self._handling = False
                    self._last_activity = time.monotonic()
                    # The frame's bytes go back to the pool once handled (a record blob may be
                    # referenced until the handler returns).
                    released = min(self._queued_bytes, size)
                    self._queued_bytes -= released
                    self.server.release(released)
                    self._maybe_resume_reading()
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
                return await self._write(encode_api_versions_fallback(h.correlation_id))
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
        auth = self.auth
        if auth is not None:
            # KIP-368: a SaslHandshake may begin a re-authentication; otherwise a request after
            # the session's lifetime closes the connection instead of being answered (Kafka's
            # Processor does both, in this order)
            now = time.monotonic()
            reauth = header.api_key == ApiKey.SASL_HANDSHAKE and auth.begin_reauthentication(now)
            if not reauth and auth.session_expired(now):
                metrics.CONNECTIONS_CLOSED.labels("session_expired").inc()
                log.info(
                    "event=session_expired listener=%s peer=%s principal=%s api_key=%d "
                    "session_lifetime_ms=%d action=close hint='the client must re-authenticate "
                    "(KIP-368) within connections.max.reauth.ms'",
                    self.listener.name, peer, auth.session.principal, header.api_key, auth.lifetime_ms,
                )  # fmt: skip
                return False
        if auth is not None and header.api_key in (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE):
            return await self._authenticate(auth, header, body)
        if auth is not None and not auth.allows(header.api_key):
            log.warning(
                "event=unauthenticated_request listener=%s peer=%s api_key=%d action=close "
                "hint='authenticate with SASL (security.protocol=%s) before any other request'",
                self.listener.name, peer, header.api_key, self.listener.protocol,
            )  # fmt: skip
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
            if not await self._write(encode_response(header, response)):
                return False
        finally:
            # Handled, answered or not (acks=0, a closed connection, a handler's failure).
            stats.observe(time.perf_counter() - started)
        if self._writing_paused or self.transport.get_write_buffer_size() > WRITE_HIGH_WATER:
            await self._drained.wait()
        return True

    async def _write(self, chunks: list[Chunk]) -> bool:
        """Write one response (every answer goes through here); False when the connection must
        close. A response with record
        sets read as file regions (a Fetch answer) is sent from the files on a plaintext
        connection (broker/zero_copy.py), after the transport has written out what it held;
        on TLS, or when small, the regions are read and written through the transport."""
        assert self.transport is not None
        regions = [c for c in chunks if isinstance(c, FileRegion)]
        if not regions:
            self.transport.writelines(cast(list[bytes | memoryview], chunks))
            return True
        try:
            fd = self._zero_copy_fd
            size = zero_copy.region_bytes(regions)
            if fd is None or size < zero_copy.ZERO_COPY_MIN_BYTES:
                self.transport.writelines(zero_copy.materialized(chunks))
                metrics.FETCH_RECORD_BYTES.labels("copied").inc(size)
                return True
            if not await self._flushed():
                return False
            await zero_copy.send(fd, chunks)
            metrics.FETCH_RECORD_BYTES.labels("zero_copy").inc(size)
            return True
        except RegionTruncatedError as exc:
            log.warning("event=response_file_truncated peer=%s error=%r action=close", self.peer, str(exc))
            return False
        except OSError as exc:  # the peer went away mid-send (EPIPE, ECONNRESET)
            log.info("event=response_send_failed peer=%s error=%r action=close", self.peer, str(exc))
            return False
        finally:
            for r in regions:
                r.close()

    async def _flushed(self) -> bool:
        """Wait until the transport has written out every byte it holds (with a high water mark
        of 0 it pauses the protocol while any is left, and resumes it at none); False if the
        connection closed meanwhile."""
        assert self.transport is not None
        if self._closed or self.transport.is_closing():
            # A transport closed under us (a reset seen by its read side) may have closed its
            # descriptor already, before connection_lost runs: the number could name another
            # file by now, so it is not used.
            return False
        if self.transport.get_write_buffer_size() == 0:
            return True
        self.transport.set_write_buffer_limits(high=0, low=0)
        try:
            await self._drained.wait()
        finally:
            if not self._closed and not self.transport.is_closing():
                self.transport.set_write_buffer_limits()
        return not self._closed and not self.transport.is_closing()

    async def _authenticate(self, auth: ConnectionAuth, header: RequestHeader, body: dict[str, Any]) -> bool:
        """SaslHandshake or SaslAuthenticate: answered by the connection's ConnectionAuth; a
        failure is answered and the connection closed."""
        assert self.transport is not None
        response, close = await auth.handle(header, body)
        if self._closed:
            return False
        if response is None:
            return False
        if not await self._write(encode_response(header, response)):
            return False
        if auth.authenticated:
            current_session.set(auth.session)
            self.max_bytes = self.server.broker.config.socket_request_max_bytes
        if close:
            await self._linger(FAILED_AUTH_LINGER_S)
        return not close

    async def _linger(self, timeout_s: float) -> None:
        """Before closing after a refusal, let the client read it: wait (bounded) until the answer
        is written and the client hangs up. Closed at once, a TLS connection with bytes of the
        client still unread is reset, and the client's kernel drops the answer it had not read
        yet (kafka-python then saw only "socket disconnected", not the authentication error)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self._closed and loop.time() < deadline:
            self._frame_ready.clear()
            try:
                await asyncio.wait_for(self._frame_ready.wait(), deadline - loop.time())
            except TimeoutError:
                return  # (anything the client sent meanwhile is not answered: it goes with the close)
