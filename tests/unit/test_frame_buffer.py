"""A request frame's buffer (broker/server.py ``Connection.get_buffer``, issue 35): the first
chunk is allocated when the frame's first bytes arrive, and once the pool has reserved the
whole frame the buffer grows once, to the announced size, instead of doubling as bytes arrive
(each doubling copied everything received so far: two extra copies of a 1 MB request)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from sluice.broker.connection_quotas import FRAME_CHUNK_BYTES
from sluice.broker.server import Connection


class Pool:
    def __init__(self, room: int) -> None:
        self.room = room

    def reserve(self, conn: Any, nbytes: int, *, first_chunk: bool) -> bool:
        if nbytes > self.room:
            return False
        self.room -= nbytes
        return True


def connection(room: int) -> Connection:
    config = SimpleNamespace(socket_request_max_bytes=100 * 1024 * 1024)
    server = SimpleNamespace(broker=SimpleNamespace(config=config), **{"reserve": Pool(room).reserve})
    conn = Connection(server)  # type: ignore[arg-type]
    conn.transport = SimpleNamespace(pause_reading=lambda: None, resume_reading=lambda: None)  # type: ignore[assignment]
    return conn


def receive(conn: Connection, data: bytes, step: int) -> list[int]:
    """Feed ``data`` as the socket would, ``step`` bytes at a time; the buffer sizes seen."""
    sizes: list[int] = []
    pos = 0
    while pos < len(data):
        view = conn.get_buffer(-1)
        n = min(step, len(view), len(data) - pos)
        view[:n] = data[pos : pos + n]
        del view
        if conn._frame is not None and (not sizes or sizes[-1] != len(conn._frame)):
            sizes.append(len(conn._frame))
        conn.buffer_updated(n)
        pos += n
    return sizes


@pytest.mark.parametrize(
    "size", [100, FRAME_CHUNK_BYTES, FRAME_CHUNK_BYTES + 1, 1024 * 1024, 5 * 1024 * 1024 + 3]
)
def test_a_frame_is_read_into_at_most_two_buffers_and_arrives_whole(size: int) -> None:
    body = bytes(i % 251 for i in range(size))
    conn = connection(room=64 * 1024 * 1024)
    sizes = receive(conn, size.to_bytes(4, "big") + body, 16 * 1024)
    assert sizes == ([size] if size <= FRAME_CHUNK_BYTES else [FRAME_CHUNK_BYTES, size])
    (got_size, frame), *_ = conn._frames
    assert got_size == size and frame == body


def test_without_room_for_the_rest_the_buffer_stays_at_its_first_chunk() -> None:
    conn = connection(room=FRAME_CHUNK_BYTES)  # the first chunk fits, the rest does not
    size = 1024 * 1024
    sizes = receive(conn, size.to_bytes(4, "big") + bytes(FRAME_CHUNK_BYTES), 16 * 1024)
    assert sizes == [FRAME_CHUNK_BYTES]
    assert conn._wants_pool and conn._reading_paused
