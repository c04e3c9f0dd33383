"""The manager's login throttle as a pure rule over a clock: free attempts, then waits that double,
per user name and per address (issue 33, finding 5)."""

from __future__ import annotations

import pytest

from sluice.manager.throttle import LoginThrottle, Throttled, address_key, wait_s


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_wait_doubles_past_the_free_attempts_up_to_its_bound() -> None:
    assert [wait_s(n, 5) for n in range(5)] == [0.0] * 5
    assert [wait_s(n, 5) for n in range(5, 10)] == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert wait_s(40, 5) == 300.0 and wait_s(10_000, 5) == 300.0


def test_a_user_guessed_past_the_free_attempts_must_wait_and_nothing_is_counted_meanwhile() -> None:
    clock = Clock()
    t = LoginThrottle(clock=clock)
    for _ in range(5):
        t.begin("admin", "10.0.0.1")
    with pytest.raises(Throttled) as raised:
        t.begin("admin", "10.0.0.9")  # from another address too: the user's count holds
    assert raised.value.retry_after_s == pytest.approx(1.0)
    clock.now += 0.5
    with pytest.raises(Throttled) as raised:
        t.begin("admin", "10.0.0.1")
    assert raised.value.retry_after_s == pytest.approx(0.5)
    clock.now += 0.5
    t.begin("admin", "10.0.0.1")  # the sixth guess, after its wait
    with pytest.raises(Throttled) as raised:
        t.begin("admin", "10.0.0.1")
    assert raised.value.retry_after_s == pytest.approx(2.0)
    t.begin("olivia", "10.0.0.1")  # another user from the same address is not held back


def test_a_success_clears_the_user_and_takes_its_attempt_back_from_the_address() -> None:
    clock = Clock()
    t = LoginThrottle(clock=clock, address_free=3)
    for _ in range(2):
        t.begin("olivia", "10.0.0.1")
    ok = t.begin("olivia", "10.0.0.1")  # the right password, at the third try
    t.succeeded(ok)
    for _ in range(5):  # the user's count starts again
        t.succeeded(t.begin("olivia", "10.0.0.1"))
    t.begin("x", "10.0.0.1")
    with pytest.raises(Throttled):  # the address had 2 failures, now 3: its free attempts are used
        t.begin("y", "10.0.0.1")


def test_spraying_many_users_from_one_address_is_throttled_by_the_address() -> None:
    clock = Clock()
    t = LoginThrottle(clock=clock)
    for i in range(50):
        t.begin(f"user-{i}", "192.0.2.7")
    with pytest.raises(Throttled):
        t.begin("user-50", "192.0.2.7")
    t.begin("user-50", "192.0.2.8")


def test_counts_are_forgotten_after_an_hour_and_bounded_in_number() -> None:
    clock = Clock()
    t = LoginThrottle(clock=clock, keys_max=100)
    for _ in range(6):
        try:
            t.begin("admin", "10.0.0.1")
        except Throttled:
            pass
    clock.now += 3600
    t.begin("admin", "10.0.0.1")
    for i in range(500):
        t.begin(f"user-{i}", f"10.1.{i // 256}.{i % 256}")
    assert len(t) <= 100


def test_an_ipv6_host_counts_by_its_64_and_a_mapped_ipv4_as_itself() -> None:
    assert address_key("2001:db8:1:2::1") == address_key("2001:db8:1:2:ffff::9") == "addr:2001:db8:1:2::/64"
    assert address_key("2001:db8:1:3::1") != address_key("2001:db8:1:2::1")
    assert address_key("::ffff:192.0.2.1") == address_key("192.0.2.1") == "addr:192.0.2.1"
    assert address_key(None) == "addr:unknown" and address_key("testclient") == "addr:testclient"
