"""A follower's fetcher ends when it is stopped, even when the cancel that stops it is lost.

Python 3.11's ``asyncio.wait_for``, cancelled in the same turn as the connect it waits for fails,
raises that failure instead of the CancelledError. When every broker stops at once (``cluster
down`` with ZooKeeper gone), a follower's connect to a leader that is stopping is refused just as
its own stop cancels it: the fetcher took the refusal for an ordinary one, slept its backoff and
tried again, for good, and its broker logged ``broker_stopped`` and never exited.
"""

from __future__ import annotations

import asyncio

from sluice.broker.peer_client import PeerConnectionError
from sluice.broker.replica_fetcher import FetcherManager, LeaderFetcher


class NoBrokers:
    def brokers(self) -> dict[int, object]:
        return {}


def test_a_stopped_fetcher_ends_even_when_its_cancel_is_lost() -> None:
    connects = 0

    async def connect_lost_cancel() -> None:
        nonlocal connects
        connects += 1
        try:
            await asyncio.sleep(30)  # connecting to a leader that is stopping
        except asyncio.CancelledError:
            # wait_for's answer when the connect failed as the cancel came
            raise PeerConnectionError("127.0.0.1:1: ConnectionRefusedError(111)") from None

    async def run() -> bool:
        fetcher = LeaderFetcher(FetcherManager(2, NoBrokers()), leader_id=1)  # type: ignore[arg-type]
        fetcher.partitions[("t", 0)] = object()  # type: ignore[assignment]  # only needs one
        fetcher._connection = connect_lost_cancel  # type: ignore[assignment, method-assign]
        while connects == 0:
            await asyncio.sleep(0.01)
        fetcher.stop()
        done, _ = await asyncio.wait({fetcher._task}, timeout=2.0)
        fetcher._task.cancel()  # (a fetcher still running must not outlive the test)
        return bool(done)

    assert asyncio.run(run()), f"the fetcher went on after its stop ({connects} connects)"
    assert connects == 1
