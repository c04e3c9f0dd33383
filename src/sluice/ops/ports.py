"""Pick free TCP ports for local servers (ZooKeeper, brokers) in tests and the local launcher.

The kernel hands out a port when a socket binds to port 0; the socket is then closed and the
number returned. Nothing reserves the port afterwards, so another process may take it before
the caller binds it: callers that start a server on the port should treat "address in use" at
start-up as a (rare) retryable failure.
"""

from __future__ import annotations

import socket
from contextlib import ExitStack

__all__ = ["free_port", "free_ports"]


def _family(host: str) -> socket.AddressFamily:
    """Return the address family of a literal host address (IPv6 when it contains a colon)."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _bind_ephemeral(host: str) -> socket.socket:
    """Return a socket bound to a kernel-chosen free port on ``host`` (the caller closes it)."""
    sock = socket.socket(_family(host), socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
    except BaseException:
        sock.close()
        raise
    return sock


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that was free at the time of the call.

    Args:
        host: the literal address the server will bind (IPv4 or IPv6).

    Returns:
        A port number in the kernel's ephemeral range.
    """
    with _bind_ephemeral(host) as sock:
        port: int = sock.getsockname()[1]
        return port


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """Return ``n`` distinct TCP ports on ``host`` that were free at the time of the call.

    All ``n`` sockets are held open together before any is closed, so the kernel cannot hand
    out the same port twice.

    Args:
        n: how many ports (zero or more).
        host: the literal address the servers will bind (IPv4 or IPv6).

    Raises:
        ValueError: when ``n`` is negative.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    with ExitStack() as stack:
        socks = [stack.enter_context(_bind_ephemeral(host)) for _ in range(n)]
        return [int(s.getsockname()[1]) for s in socks]
