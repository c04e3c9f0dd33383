"""Pick free TCP ports for local servers (ZooKeeper, brokers) in tests and the local launcher.

Ports are picked below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`), where the
kernel never puts the local end of an outgoing connection. A port picked from the ephemeral
range (bind to port 0) was free at that moment only: a client's connection could take it
before the server bound it, or while a killed broker was down, and its restart then failed
with "Address already in use" (seen in the suite: a broker's metrics port taken between its
kill -9 and its restart). Below the range only another server can take it. A random port is
tried until one binds; nothing reserves it afterwards: another test's server that picked the
same port at random can bind it first (seen once in a suite run of two processes). A server
started on it exits ADDRESS_IN_USE_EXIT, and the launcher picks new ports and starts it again.
"""

from __future__ import annotations

import random
import socket
from contextlib import ExitStack

__all__ = ["ADDRESS_IN_USE_EXIT", "bind_error", "free_port", "free_ports", "port_open"]

#: The exit status of a server whose address was taken (errno EADDRINUSE's number on Linux):
#: ``sluice broker start`` exits with it, and the launcher, which picked the port, picks another.
ADDRESS_IN_USE_EXIT = 98


def _family(host: str) -> socket.AddressFamily:
    """Return the address family of a literal host address (IPv6 when it contains a colon)."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


#: The lowest port picked: above the well-known and most registered servers' ports.
LOWEST_PORT = 20_000
#: Tries at random ports below the ephemeral range before asking the kernel for any free port.
TRIES_MAX = 200


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The kernel's range for the local ends of outgoing connections (Linux's default if unread)."""
    try:
        with open(path) as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _bind_free(host: str) -> socket.socket:
    """Return a socket bound to a free port on ``host`` below the ephemeral range (the caller
    closes it); a kernel-chosen one if that range is too small or full."""
    low = ephemeral_range()[0]
    candidates = range(LOWEST_PORT, low) if low - LOWEST_PORT >= 1000 else range(0)
    for port in (random.choice(candidates) for _ in range(TRIES_MAX if candidates else 0)):
        sock = socket.socket(_family(host), socket.SOCK_STREAM)
        try:
            sock.bind((host, port))
            return sock
        except OSError:
            sock.close()
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
        A port number below the kernel's ephemeral range when one is free there.
    """
    with _bind_free(host) as sock:
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
        socks = [stack.enter_context(_bind_free(host)) for _ in range(n)]
        return [int(s.getsockname()[1]) for s in socks]


def bind_error(host: str, port: int) -> OSError | None:
    """Why a server could not bind ``host:port`` now (None: it could). SO_REUSEADDR is set, as
    asyncio's, http.server's and the JVM's server sockets set it: a port whose old connections
    are in TIME_WAIT is free; one another server listens on is not."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc
    return None


def port_open(host: str, port: int) -> bool:
    """Whether a server accepts connections at ``host:port`` now (a connect within 0.5 s)."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False
