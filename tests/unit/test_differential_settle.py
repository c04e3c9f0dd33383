"""The conformance drivers' group settle check: a member that joined but whose rebalance is still
running holds nothing while the others keep the generation before's partitions. Reading that as
settled let the next steps race the rebalance (seen on Kafka under load: `assigned-2` answered
[[0, 1], []] and the group was still PreparingRebalance)."""

from __future__ import annotations

import time
from typing import Any

from tests.conformance.differential.drivers import _PythonDriver


class _Scripted(_PythonDriver):
    """Members whose assignments follow a script in time: each phase's assignments for its
    seconds (the last for good), from the first poll on."""

    def __init__(self, phases: list[tuple[float, dict[str, list[int]]]]) -> None:
        super().__init__()
        self.phases = phases
        self.started: float | None = None
        self.members = {handle: handle for handle in phases[0][1]}

    def _poll_assignment(self, member: Any) -> list[int]:
        time.sleep(0.05)  # a poll's wait
        if self.started is None:
            self.started = time.monotonic()
        elapsed = time.monotonic() - self.started
        for seconds, assignments in self.phases:
            if elapsed < seconds:
                return assignments[member]
            elapsed -= seconds
        return self.phases[-1][1][member]


def test_a_member_still_joining_is_not_settled() -> None:
    mid_rebalance = {"m1": [0, 1], "m2": []}
    done = {"m1": [0], "m2": [1]}
    driver = _Scripted([(2.0, mid_rebalance), (0.0, done)])
    assert driver.op_poll_members("unused:0", partitions=2) == done


def test_more_members_than_partitions_settle_with_some_holding_nothing() -> None:
    done = {"m1": [0], "m2": [], "m3": []}
    assert _Scripted([(0.0, done)]).op_poll_members("unused:0", partitions=1) == done
