"""A broker's asyncio connection to another broker (followers fetching from leaders).

One request at a time per connection, which is all a fetcher needs.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from sluice.protocol.api import decode_response, encode_request
from sluice.security.client import PLAINTEXT, ClientAuthError, ClientSecurity, authenticate_async

_SIZE = struct.Struct(">i")
MAX_RESPONSE_BYTES = 256 * 1024 * 1024


class PeerConnectionError(ConnectionError):
    pass


class PeerConnection:
    def __init__(self, host: str, port: int, client_id: str, security: ClientSecurity = PLAINTEXT):
        self.host = host
        self.port = port
        self.client_id = client_id
        self.security = security
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._correlation = 0

    async def connect(self, timeout_s: float = 5.0) -> None:
        """Connect (TLS and SASL too, on a secured inter-broker listener). A peer that refuses or
        does not answer (it is stopping, or stopped) is a PeerConnectionError, as a request's
        failure is: the caller's ordinary one-line case, not a traceback."""
        context = self.security.ssl_context()
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(
                    self.host, self.port, limit=8 * 1024 * 1024, ssl=context,
                    server_hostname=self.host if context is not None else None,
                ),
                timeout_s,
            )  # fmt: skip
        except (OSError, TimeoutError) as exc:
            raise PeerConnectionError(f"{self.host}:{self.port}: {exc!r}") from exc
        if self.security.sasl:
            try:
                await authenticate_async(self.security, lambda k, v, b: self._exchange(k, v, b, timeout_s))
            except ClientAuthError as exc:
                await self.close()
                raise PeerConnectionError(f"{self.host}:{self.port}: {exc}") from exc

    @property
    def connected(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def request(
        self, api_key: int, version: int, body: dict[str, Any], timeout_s: float
    ) -> dict[str, Any]:
        if self._reader is None or self._writer is None:
            await self.connect()
        return await self._exchange(api_key, version, body, timeout_s)

    async def _exchange(
        self, api_key: int, version: int, body: dict[str, Any], timeout_s: float
    ) -> dict[str, Any]:
        assert self._reader is not None and self._writer is not None
        self._correlation += 1
        cid = self._correlation
        try:
            self._writer.write(encode_request(api_key, version, cid, self.client_id, body))
            size = _SIZE.unpack(await asyncio.wait_for(self._reader.readexactly(4), timeout_s))[0]
            if not 0 <= size <= MAX_RESPONSE_BYTES:
                raise PeerConnectionError(f"{self.host}:{self.port} sent a frame of {size} bytes")
            frame = await asyncio.wait_for(self._reader.readexactly(size), timeout_s)
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
            await self.close()
            raise PeerConnectionError(f"{self.host}:{self.port}: {exc!r}") from exc
        got, response = decode_response(api_key, version, frame)
        if got != cid:
            await self.close()
            raise PeerConnectionError(f"{self.host}:{self.port}: correlation id {got}, expected {cid}")
        return response

    async def close(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()
            try:
                await writer.wait_closed()
            except (OSError, ConnectionError):
                pass
