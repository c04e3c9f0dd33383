"""Login throttling: how long someone guessing passwords must wait before the next guess.

Every password check (POST /login, and HTTP Basic on any route) first asks `LoginThrottle.begin`
with the user name and the client's address. Each of the two keys counts failed checks: the
first `free` of them are not held back, after that each attempt must come `wait_s` after the
key's last failure, a wait that doubles with every further failure up to `max_wait_s`. An
attempt that must wait is refused at once (429 with Retry-After) and costs no scrypt, so a flood
of guesses costs the manager nothing either. The user key bounds the guesses at one account from
any number of addresses; the address key bounds password spraying (one guess at many accounts)
from one address, and is looser, since many people may share an address. An IPv6 address counts
by its /64, which one host usually holds whole.

An attempt is counted as a failure when it begins, before its scrypt: concurrent guesses each
see the ones before them. A success takes its own count back from the address and clears the
user's. A key with no failure for `forget_after_s` is forgotten, and at most `keys_max` keys are
kept (the least recently failed go first), so the table's memory is bounded.

Each manager counts in its own memory: with N managers a guesser gets N times the attempts
(`docs/ARCHITECTURE.md`, The manager).
"""

from __future__ import annotations

import ipaddress
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

#: failed checks of one user name before waits begin
USER_FREE = 5
#: failed checks from one address before waits begin (people behind one NAT share it)
ADDRESS_FREE = 50
FIRST_WAIT_S = 1.0
MAX_WAIT_S = 300.0
FORGET_AFTER_S = 3600.0
KEYS_MAX = 10_000


def wait_s(failures: int, free: int, *, first_s: float = FIRST_WAIT_S, max_s: float = MAX_WAIT_S) -> float:
    """How long after a key's last failure its next attempt must come: none while `failures`
    is below `free`, then `first_s`, doubling with each failure past it, at most `max_s`."""
    assert failures >= 0 and free >= 0
    if failures < free:
        return 0.0
    return min(max_s, first_s * 2.0 ** min(failures - free, 64))


def address_key(host: str | None) -> str:
    """The key of a client address: an IPv6 address by its /64, anything else as it is."""
    if not host:
        return "addr:unknown"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return f"addr:{host}"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return f"addr:{ip.ipv4_mapped}"
        return f"addr:{ipaddress.ip_network((ip, 64), strict=False)}"
    return f"addr:{ip}"


class Throttled(Exception):
    """An attempt that must wait; `retry_after_s` says how long."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"try again in {math.ceil(retry_after_s)} s")
        self.retry_after_s = retry_after_s


@dataclass(slots=True)
class _Count:
    failures: int
    last_s: float


@dataclass(frozen=True, slots=True)
class Attempt:
    """A password check that may go ahead; hand it back to `succeeded` if the password was right."""

    user_key: str
    address_key: str


class LoginThrottle:
    def __init__(
        self,
        *,
        user_free: int = USER_FREE,
        address_free: int = ADDRESS_FREE,
        first_wait_s: float = FIRST_WAIT_S,
        max_wait_s: float = MAX_WAIT_S,
        forget_after_s: float = FORGET_AFTER_S,
        keys_max: int = KEYS_MAX,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        assert keys_max > 0 and forget_after_s > max_wait_s
        self._free = {"user": user_free, "addr": address_free}
        self._first_s, self._max_s = first_wait_s, max_wait_s
        self._forget_after_s = forget_after_s
        self._keys_max = keys_max
        self._clock = clock
        self._counts: OrderedDict[str, _Count] = OrderedDict()
        self._lock = threading.Lock()

    def _remaining_s(self, key: str, now: float) -> float:
        count = self._counts.get(key)
        if count is None:
            return 0.0
        if now - count.last_s >= self._forget_after_s:
            del self._counts[key]
            return 0.0
        free = self._free[key.split(":", 1)[0]]
        return max(
            0.0, count.last_s + wait_s(count.failures, free, first_s=self._first_s, max_s=self._max_s) - now
        )

    def begin(self, user: str, address: str | None) -> Attempt:
        """Count an attempt at `user` from `address` as a failure until `succeeded` says
        otherwise, or raise Throttled when either key must wait (nothing counted)."""
        attempt = Attempt(f"user:{user}", address_key(address))
        with self._lock:
            now = self._clock()
            remaining = max(
                self._remaining_s(attempt.user_key, now), self._remaining_s(attempt.address_key, now)
            )
            if remaining > 0:
                raise Throttled(remaining)
            for key in (attempt.user_key, attempt.address_key):
                count = self._counts.pop(key, None) or _Count(0, now)
                count.failures += 1
                count.last_s = now
                self._counts[key] = count  # the most recently failed last
            while len(self._counts) > self._keys_max:
                self._counts.popitem(last=False)
        return attempt

    def succeeded(self, attempt: Attempt) -> None:
        """The password was right: the user's failures are cleared, the address's attempt is
        taken back."""
        with self._lock:
            self._counts.pop(attempt.user_key, None)
            count = self._counts.get(attempt.address_key)
            if count is not None:
                count.failures -= 1
                if count.failures <= 0:
                    del self._counts[attempt.address_key]

    def __len__(self) -> int:
        return len(self._counts)
