"""Responses sent from the log's files (broker/zero_copy.py, issue 35): bytes and file regions
arrive whole and in order over a real socket, on asyncio's loop and on uvloop (the broker's);
a segment deleted or replaced by a compacted one while its bytes are in flight is still sent
whole; a file truncated under the send fails the send instead of sending short."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvloop

from sluice.broker import zero_copy
from sluice.protocol.primitives import Chunk, FileRegion, RegionTruncatedError, Writer
from tests.unit._storage_helpers import batch, open_log

MB = 1024 * 1024

LOOPS: dict[str, Callable[[Coroutine[Any, Any, Any]], Any]] = {"asyncio": asyncio.run, "uvloop": uvloop.run}


class Reader:
    """The client's end: reads everything into ``received`` on a thread once ``start`` is
    called (until then the socket's buffers fill and the sender waits)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.received = bytearray()
        self.go = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.go.wait()
        self.sock.settimeout(30)
        while True:
            data = self.sock.recv(1 << 20)
            if not data:
                return
            self.received += data

    def start(self) -> None:
        self.go.set()

    def finish(self) -> bytes:
        self.thread.join(30)
        assert not self.thread.is_alive()
        return bytes(self.received)


def pair() -> tuple[socket.socket, socket.socket]:
    """A loopback TCP connection (the broker's side non-blocking, as its transports make it)."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    server.setblocking(False)
    return server, client


def region_of(path: Path, offset: int, size: int) -> FileRegion:
    fd = os.open(path, os.O_RDONLY)
    try:
        return FileRegion(os.dup(fd), offset, size)
    finally:
        os.close(fd)


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_bytes_and_regions_arrive_whole_and_in_order(tmp_path: Path, loop: str) -> None:
    data = os.urandom(12 * MB)
    path = tmp_path / "segment.log"
    path.write_bytes(data)
    first, second = region_of(path, 0, 8 * MB), region_of(path, 9 * MB, 3 * MB - 5)
    chunks: list[Chunk] = [b"size", b"head", first, memoryview(b"between"), second, b"tail"]
    expected = b"sizehead" + data[: 8 * MB] + b"between" + data[9 * MB : 12 * MB - 5] + b"tail"
    server, client = pair()
    reader = Reader(client)

    async def go() -> None:
        sending = asyncio.ensure_future(zero_copy.send(server.fileno(), chunks))
        await asyncio.sleep(0.2)
        assert not sending.done()  # 11 MB do not fit the socket's buffers: the send waits
        reader.start()
        await asyncio.wait_for(sending, 30)

    LOOPS[loop](go())
    server.close()
    assert reader.finish() == expected
    first.close()
    second.close()


@pytest.mark.parametrize("change", ["deleted", "replaced", "closed"])
def test_a_file_deleted_replaced_or_closed_under_an_in_flight_send_is_sent_whole(
    tmp_path: Path, change: str
) -> None:
    """What retention (delete), compaction (a cleaned file renamed over the old one) and a
    segment's close do to a file whose region is being sent: nothing to the send."""
    data = os.urandom(16 * MB)
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)  # the segment's own descriptor
    region = FileRegion(os.dup(fd), 0, len(data))
    server, client = pair()
    reader = Reader(client)

    async def go() -> None:
        sending = asyncio.ensure_future(zero_copy.send(server.fileno(), [b"head", region]))
        await asyncio.sleep(0.2)
        assert not sending.done()  # in flight
        if change == "deleted":
            path.unlink()
        elif change == "replaced":
            cleaned = tmp_path / "00000000000000000000.log.cleaned"
            cleaned.write_bytes(b"compacted" * 1000)
            cleaned.rename(path)
        os.close(fd)
        reader.start()
        await asyncio.wait_for(sending, 30)

    uvloop.run(go())
    server.close()
    assert reader.finish() == b"head" + data
    region.close()


def test_a_file_truncated_under_an_in_flight_send_fails_the_send(tmp_path: Path) -> None:
    """A log truncated in place (to its leader's epoch) under a send: the size prefix promised
    bytes that are gone, so the send fails (the connection is closed) instead of sending short
    and leaving the client to read the next response's bytes as this one's."""
    data = os.urandom(16 * MB)
    path = tmp_path / "segment.log"
    path.write_bytes(data)
    region = region_of(path, 0, len(data))
    server, client = pair()
    reader = Reader(client)

    async def go() -> None:
        sending = asyncio.ensure_future(zero_copy.send(server.fileno(), [region]))
        await asyncio.sleep(0.2)
        assert not sending.done()
        os.truncate(path, 10 * MB)
        reader.start()
        with pytest.raises(RegionTruncatedError):
            await asyncio.wait_for(sending, 30)

    uvloop.run(go())
    server.close()
    received = reader.finish()
    assert len(received) <= 10 * MB and received == data[: len(received)]
    with pytest.raises(RegionTruncatedError):
        region.read()
    region.close()


def test_a_region_owns_its_descriptor_until_closed_or_collected(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"0123456789")
    region = region_of(path, 2, 5)
    fd = region.fd
    assert region.read() == b"23456" and len(region) == 5
    region.close()
    region.close()  # twice is fine
    with pytest.raises(OSError):
        os.fstat(fd)
    collected = region_of(path, 0, 1)
    fd = collected.fd
    del collected
    with pytest.raises(OSError):
        os.fstat(fd)


def test_the_writer_keeps_a_region_as_a_chunk_and_counts_its_size(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    region = region_of(path, 10, 50)
    w = Writer()
    w.int32(7)
    w.write_blob(region)
    w.int16(1)
    chunks = w.chunks()
    assert chunks[1] is region and w.size == 4 + 50 + 2
    assert w.getvalue() == (7).to_bytes(4, "big") + b"x" * 50 + (1).to_bytes(2, "big")
    region.close()


def test_a_zero_copy_read_is_the_same_bytes_and_outlives_the_segment(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0", segment_bytes=4096)
    for _ in range(40):
        log.append_as_leader(batch(3), leader_epoch=0)
    copied = log.read(0, max_bytes=1 << 20)
    region = log.read(0, max_bytes=1 << 20, zero_copy=True)
    assert isinstance(region.records, FileRegion) and isinstance(copied.records, bytes)
    assert (region.first_offset, region.size_bytes) == (copied.first_offset, copied.size_bytes)
    assert region.data() == copied.records
    later = log.read(60, max_bytes=1 << 20, zero_copy=True)
    assert later.data() == log.read(60, max_bytes=1 << 20).records
    log.close()
    for f in (tmp_path / "t-0").iterdir():
        f.unlink()
    assert region.data() == copied.records  # closed and deleted: still the bytes it was
    assert isinstance(region.records, FileRegion)
    region.records.close()
    assert isinstance(later.records, FileRegion)
    later.records.close()
