"""A TCP proxy that can cut or stall what passes through it: how a broker is cut off from
ZooKeeper only (incident A's trigger), while clients and other brokers still reach it.

Runs its own asyncio loop on a daemon thread. Modes: ``pass`` forwards; ``drop`` closes every
connection and refuses new ones (a clean partition); ``stall`` keeps connections open but
forwards nothing (a black hole: the other side sees only silence).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future

log = logging.getLogger("sluice.chaos.proxy")

MODES = ("pass", "drop", "stall")
CHUNK = 64 * 1024


class TcpProxy:
    def __init__(self, listen_host: str, listen_port: int, target_host: str, target_port: int):
        self.listen = (listen_host, listen_port)
        self.target = (target_host, target_port)
        self.mode = "pass"
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"tcp-proxy-{listen_port}", daemon=True
        )

    @property
    def address(self) -> str:
        return f"{self.listen[0]}:{self.listen[1]}"

    def start(self) -> TcpProxy:
        self._thread.start()
        self._call(self._start()).result(timeout=10)
        return self

    def stop(self) -> None:
        try:
            self._call(self._stop()).result(timeout=10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    def set_mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"proxy mode must be one of {MODES}, got {mode!r}")
        self._call(self._set_mode(mode)).result(timeout=10)

    def _call(self, coro: object) -> Future[None]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._accept, *self.listen)

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._drop_all()

    async def _set_mode(self, mode: str) -> None:
        self.mode = mode
        log.info("event=proxy_mode listen=%s target=%s:%d mode=%s", self.address, *self.target, mode)
        if mode == "drop":
            await self._drop_all()

    async def _drop_all(self) -> None:
        for w in list(self._writers):
            w.close()
        self._writers.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "drop":
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        await asyncio.gather(
            self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True
        )
        for w in (writer, up_writer):
            self._writers.discard(w)
            w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            while self.mode == "stall":
                await asyncio.sleep(0.05)
            if self.mode == "drop" or writer.is_closing():
                break
            writer.write(data)
            await writer.drain()
        writer.close()
