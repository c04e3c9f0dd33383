"""The conformance drivers' group settle check: a member that joined but whose rebalance is still
running holds nothing while the others keep the generation before's partitions. Reading that as
settled let the next steps race the rebalance (seen on Kafka under load: `assigned-2` answered
[[0, 1], []] and the group was still PreparingRebalance)."""

from __future__ import annotations

from typing import Any

from tests.conformance.differential.drivers import _PythonDriver


class _Scripted(_PythonDriver):
    """Members whose assignments follow a script, one entry per poll round."""

    def __init__(self, rounds: list[dict[str, list[int]]]) -> None:
        super().__init__()
        self.rounds = rounds
        self.polls = 0
        self.members = {handle: handle for handle in rounds[0]}

    def _poll_assignment(self, member: Any) -> list[int]:
        now = self.rounds[min(self.polls // len(self.members), len(self.rounds) - 1)]
        self.polls += 1
        return now[member]


def test_a_member_still_joining_is_not_settled() -> None:
    mid_rebalance = {"m1": [0, 1], "m2": []}
    done = {"m1": [0], "m2": [1]}
    driver = _Scripted([mid_rebalance] * 8 + [done])
    assert driver.op_poll_members("unused:0", partitions=2) == done


def test_more_members_than_partitions_settle_with_some_holding_nothing() -> None:
    done = {"m1": [0], "m2": [], "m3": []}
    assert _Scripted([done]).op_poll_members("unused:0", partitions=1) == done
