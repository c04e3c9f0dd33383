from __future__ import annotations

import threading
import time

from sluice.clients import close_within


class Stuck:
    """A client whose close blocks until released, like librdkafka's on a killed broker."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.closed = False

    def close(self) -> None:
        self.release.wait()
        self.closed = True


class Failing:
    def close(self) -> None:
        raise RuntimeError("broker transport failure")


def test_a_close_that_hangs_returns_after_the_bound_and_finishes_later() -> None:
    client = Stuck()
    started = time.monotonic()
    assert close_within(client, 0.2) is False
    assert 0.2 <= time.monotonic() - started < 2
    client.release.set()
    deadline = time.monotonic() + 5
    while not client.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert client.closed


def test_a_close_that_finishes_returns_true_and_a_failing_close_does_not_raise() -> None:
    client = Stuck()
    client.release.set()
    assert close_within(client, 5) is True and client.closed
    assert close_within(Failing(), 5) is True
