"""What the network layer may spend on clients: connections, and memory for requests being read.

Plain rules and one counter, no sockets (``server.py`` does the I/O):

- ``connection_refusal``: whether a new connection is over ``max.connections`` or over
  ``max.connections.per.ip`` (with ``max.connections.per.ip.overrides``), as Kafka counts them.
- ``MemoryPool``: the bytes of requests being read or waiting to be handled, across every
  connection (Kafka's ``queued.max.request.bytes``). A connection reserves bytes before it
  receives them; when the pool is full it stops reading its socket until bytes are released,
  so a flood of large requests queues in the kernel's socket buffers, not in the broker's heap.
- ``frame_capacity``: how far a frame's buffer grows next. A frame's buffer follows the bytes
  that actually arrive, so a client announcing 100 MB and sending 10 bytes costs 10 bytes plus
  one ``FRAME_CHUNK_BYTES`` chunk, not 100 MB.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

#: The first allocation of a frame's buffer, and the least it grows by.
FRAME_CHUNK_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int
    max_connections_per_ip: int
    #: per-address limits that replace ``max_connections_per_ip`` (Kafka's overrides)
    per_ip_overrides: Mapping[str, int] = field(default_factory=dict)

    def per_ip(self, ip: str) -> int:
        return self.per_ip_overrides.get(ip, self.max_connections_per_ip)


def connection_refusal(limits: ConnectionLimits, open_total: int, open_from_ip: int, ip: str) -> str | None:
    """Why a new connection from ``ip`` is refused (``"max_connections"`` or
    ``"max_connections_per_ip"``), or None to accept it; ``open_*`` count the connections open
    before this one."""
    if open_total >= limits.max_connections:
        return "max_connections"
    if open_from_ip >= limits.per_ip(ip):
        return "max_connections_per_ip"
    return None


def frame_capacity(have: int, size: int) -> int:
    """The next length of a buffer holding ``have`` bytes of a ``size``-byte frame, all received:
    doubled, at least by one chunk, never past the frame. Doubling keeps the copies of growth
    below one extra copy per byte on average."""
    assert 0 <= have < size
    return min(size, max(FRAME_CHUNK_BYTES, 2 * have))


class MemoryPool:
    """Bytes reserved for requests being read or waiting to be handled, bounded by ``capacity``
    (None: unbounded). Reservations never fail part-way: a reservation fits or is refused."""

    __slots__ = ("available", "capacity")

    def __init__(self, capacity: int | None) -> None:
        assert capacity is None or capacity > 0
        self.capacity = capacity
        self.available = capacity

    @property
    def used(self) -> int:
        return 0 if self.capacity is None or self.available is None else self.capacity - self.available

    def try_reserve(self, nbytes: int, *, keep: int = 0) -> bool:
        """Reserve ``nbytes`` if at least ``keep`` bytes stay available after it."""
        assert nbytes >= 0 and keep >= 0
        if self.available is None:
            return True
        if nbytes + keep > self.available:
            return False
        self.available -= nbytes
        return True

    def release(self, nbytes: int) -> None:
        assert nbytes >= 0
        if self.available is None or self.capacity is None:
            return
        self.available += nbytes
        assert self.available <= self.capacity, "released more than was reserved"
