"""The leader's cap on a follower's long poll (replica_manager.follower_wait_cap_s): idle
followers poll every 3 s, but for a while after the leader takes on a leadership their polls
are short and the ones waiting end, so a follower starts fetching a new partition at once
instead of after its current poll."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

from sluice.broker import replica_manager as rm
from sluice.broker.replica_manager import ReplicaManager


class NoMetadata:
    pass


def test_polls_are_long_when_settled_short_after_a_leadership_and_waiting_ones_end(tmp_path: Path) -> None:
    async def run() -> None:
        manager = ReplicaManager(1, tmp_path, NoMetadata())  # type: ignore[arg-type]
        assert math.isinf(manager.follower_wait_cap_s()), "settled: the follower's own max wait"
        loop = asyncio.get_running_loop()
        waiting, done_already = loop.create_future(), loop.create_future()
        done_already.set_result(None)
        manager.add_follower_fetch_waiter(done_already)
        manager.add_follower_fetch_waiter(waiting)
        manager._took_leadership()
        assert waiting.done(), "a poll waiting when the leadership was taken ends"
        assert manager.follower_wait_cap_s() == rm.FOLLOWER_WAIT_WHILE_CHANGING_S
        manager._leadership_taken_at -= rm.LEADERSHIP_SETTLING_S
        assert math.isinf(manager.follower_wait_cap_s())

    asyncio.run(run())
