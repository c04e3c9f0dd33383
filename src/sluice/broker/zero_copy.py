"""Responses sent from the log's files: a Fetch answer's record sets go from the segment files
to the socket with ``sendfile`` (Kafka's ``FileRecords.transferTo``), never through Python.

A Fetch answer encodes as chunks (protocol.api.encode_response): the size prefix, headers and
per-partition fields as bytes, each partition's records as a ``FileRegion`` of its segment file
(storage.log ``Log.read(zero_copy=True)``). `send` writes them in order on a descriptor of its
own of the connection's socket (``os.dup``): bytes with ``os.write``, regions with
``os.sendfile``, waiting for the socket to take more with the event loop's ``add_writer`` on
that descriptor (uvloop refuses ``add_writer`` on the transport's own descriptor, and has no
``loop.sendfile``). Its own descriptor also keeps the socket open while a send is in flight: a
transport closed meanwhile (an idle sweep, a reset seen by its read side) cannot release the
descriptor number to another file while bytes are still being written to it.

The caller (broker/server.py ``Connection``) first lets the transport write out everything it
holds, so responses stay in request order, and uses this only for a plaintext connection: on
TLS the bytes must pass through the transport's encryption, and the regions are read instead
(one ``pread`` per partition, no join of the response).

Each region's descriptor is its own too (``os.dup`` of the segment's), so a segment deleted by
retention or replaced by a compacted one while its bytes are in flight is still sent whole
from the old file. A file truncated in place under the send (a log truncated to its leader's
epoch) ends before the region does: ``sendfile`` returns 0, and `send` raises
``RegionTruncatedError``; the connection is then closed (the response's size prefix promised
bytes that no longer exist, as Kafka's FileRecords.writeTo fails), and the client fetches again.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

from sluice.protocol.primitives import Chunk, FileRegion, RegionTruncatedError

#: Regions of fewer bytes in one response are read and written through the transport instead:
#: for a small answer (a consumer at the log's end, a follower's few new records) the copy costs
#: less than waiting for the transport to drain and the extra system calls.
ZERO_COPY_MIN_BYTES = 64 * 1024


def region_bytes(chunks: Sequence[Chunk]) -> int:
    return sum(c.size for c in chunks if isinstance(c, FileRegion))


def materialized(chunks: Sequence[Chunk]) -> list[bytes | memoryview]:
    """The chunks with each region read (raises RegionTruncatedError if its file ended)."""
    return [c.read() if isinstance(c, FileRegion) else c for c in chunks]


async def _writable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_writer(fd, wake)
    try:
        await ready
    finally:
        loop.remove_writer(fd)


async def _write_all(fd: int, data: memoryview) -> None:
    while data:
        try:
            n = os.write(fd, data)
        except BlockingIOError:
            await _writable(fd)
            continue
        data = data[n:]


async def _send_region(fd: int, region: FileRegion) -> None:
    done = 0
    while done < region.size:
        try:
            n = os.sendfile(fd, region.fd, region.offset + done, region.size - done)
        except BlockingIOError:
            await _writable(fd)
            continue
        if n == 0:
            raise RegionTruncatedError(
                f"the file ended {region.size - done} bytes before the region's end (truncated meanwhile)"
            )
        done += n


async def send(socket_fd: int, chunks: Sequence[Chunk]) -> None:
    """Write ``chunks`` in order to the socket ``socket_fd`` (non-blocking), regions with
    ``sendfile``. The caller has made sure nothing else writes to it meanwhile."""
    fd = os.dup(socket_fd)
    try:
        pending: list[bytes | memoryview] = []
        for chunk in chunks:
            if not isinstance(chunk, FileRegion):
                pending.append(chunk)
                continue
            if pending:
                await _write_all(fd, memoryview(b"".join(pending)))
                pending.clear()
            await _send_region(fd, chunk)
        if pending:
            await _write_all(fd, memoryview(b"".join(pending)))
    finally:
        os.close(fd)
