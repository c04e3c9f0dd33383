"""When a rebalance's join completes: once every member is waiting in a JoinGroup and every member
id handed out (KIP-394's MEMBER_ID_REQUIRED) has joined with it or expired, as Kafka's
``GroupMetadata.hasAllMembersJoined`` decides (issue 33, item 7: cooperative rebalancing)."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sluice.broker.coordinator import GroupCoordinator
from sluice.broker.group import GroupState
from sluice.broker.group_placement import OFFSETS_TOPIC
from sluice.broker.partition import Partition
from sluice.protocol.errors import ErrorCode
from tests.unit._offsets_log import Replicas


def _coordinator(tmp_path: Path) -> tuple[GroupCoordinator, Partition]:
    part = Partition.open(tmp_path, OFFSETS_TOPIC, 0, uuid.uuid4(), {}, 1)
    part.become_leader(0, (1,), (1,), time.monotonic() * 1000)
    broker = SimpleNamespace(
        config=SimpleNamespace(
            offsets_topic_partitions=1, group_initial_rebalance_delay_ms=0, group_max_size=100,
            group_max_count=100,
        ),
        replicas=Replicas(part),
    )  # fmt: skip
    return GroupCoordinator(broker), part  # type: ignore[arg-type]


async def _until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


def _join(c: GroupCoordinator, member: str = "") -> asyncio.Future[dict[str, Any]]:
    req = {"group_id": "g", "member_id": member, "session_timeout_ms": 10_000,
           "rebalance_timeout_ms": 60_000, "protocol_type": "consumer",
           "protocols": [{"name": "cooperative-sticky", "metadata": member.encode()}]}  # fmt: skip
    return asyncio.ensure_future(c.join(req, 7, "c", "/127.0.0.1"))


async def _member_id(c: GroupCoordinator) -> str:
    answer = await _join(c)
    assert answer["error_code"] == ErrorCode.MEMBER_ID_REQUIRED, answer
    return str(answer["member_id"])


async def _stable_with_one_member(c: GroupCoordinator) -> str:
    """A group of one member, Stable at generation 1; its member id."""
    a = await _member_id(c)
    joined = await _join(c, a)
    assert joined["error_code"] == ErrorCode.NONE and joined["generation_id"] == 1, joined
    sync = {"group_id": "g", "member_id": a, "generation_id": 1, "assignments": []}
    assert (await c.sync(sync))["error_code"] == ErrorCode.NONE
    assert c.groups["g"].state is GroupState.STABLE
    return a


def test_a_join_waits_for_the_member_ids_handed_out_so_a_burst_of_members_is_one_generation(
    tmp_path: Path,
) -> None:
    """Members arriving together each ask for a member id first; a join that completed while one
    of them was between its two JoinGroups began another rebalance as soon as it joined, which the
    members in the group learn of only at their next heartbeat (3 s for librdkafka), and with
    cooperative rebalancing one more after that. Before, the join completed without the pending
    member:

        AssertionError: the join completed while a member id handed out was still to join:
        {'error_code': <ErrorCode.NONE: 0>, 'generation_id': 2, ...}
    """

    async def run() -> None:
        c, part = _coordinator(tmp_path)
        c.on_became_leader(0)
        await _until(lambda: c.check("g") is ErrorCode.NONE, "the coordinator to load")
        a = await _stable_with_one_member(c)
        b, late = await _member_id(c), await _member_id(c)
        b_joined = _join(c, b)  # starts the rebalance
        a_joined = _join(c, a)  # a learned of it (its heartbeat) and rejoins
        await asyncio.sleep(0.05)
        assert not a_joined.done(), (
            f"the join completed while a member id handed out was still to join: {a_joined.result()}"
        )
        assert c.groups["g"].state is GroupState.PREPARING_REBALANCE
        late_joined = _join(c, late)
        answers = [await asyncio.wait_for(f, 5) for f in (a_joined, b_joined, late_joined)]
        assert {x["generation_id"] for x in answers} == {2}, answers
        leader = next(x for x in answers if x["member_id"] == x["leader"])
        assert len(leader["members"]) == 3
        part.close()

    asyncio.run(run())


def test_a_member_id_that_is_never_used_holds_a_join_only_until_it_expires(tmp_path: Path) -> None:
    """A client that asked for a member id and went away: its id expires after its session
    timeout (Kafka's pending-member heartbeat expiry), and the join completes without it; a
    LeaveGroup naming a pending id lets the join complete at once."""

    async def run() -> None:
        c, part = _coordinator(tmp_path)
        c.on_became_leader(0)
        await _until(lambda: c.check("g") is ErrorCode.NONE, "the coordinator to load")
        a = await _stable_with_one_member(c)
        b, gone = await _member_id(c), await _member_id(c)
        joined = [_join(c, b), _join(c, a)]
        await asyncio.sleep(0.05)
        assert not any(f.done() for f in joined)
        c.groups["g"].pending_members[gone] = 0.0  # its session timeout has passed
        c._tick()
        answers = [await asyncio.wait_for(f, 5) for f in joined]
        assert {x["generation_id"] for x in answers} == {2} and gone not in c.groups["g"].pending_members

        sync = {"group_id": "g", "generation_id": 2, "assignments": []}
        syncs = [asyncio.ensure_future(c.sync({**sync, "member_id": m})) for m in (a, b)]
        assert {(await s)["error_code"] for s in syncs} == {ErrorCode.NONE}
        left = await _member_id(c)
        again = [_join(c, a), _join(c, b)]  # the leader first: a rebalance
        await asyncio.sleep(0.05)
        assert not any(f.done() for f in again)
        assert c.leave("g", [(left, None)])[0] is ErrorCode.NONE
        assert {(await asyncio.wait_for(f, 5))["generation_id"] for f in again} == {3}
        part.close()

    asyncio.run(run())


def test_the_first_rebalance_of_an_empty_group_waits_for_no_pending_member(tmp_path: Path) -> None:
    """Kafka's first rebalance of an empty group (InitialDelayedJoin) completes once
    group.initial.rebalance.delay.ms has passed (0 here), whoever still holds an unused member
    id; the pending member's join is then a rebalance of its own (Kafka 3.9.1 answers so too,
    tests/conformance/test_cooperative_rebalance.py)."""

    async def run() -> None:
        c, part = _coordinator(tmp_path)
        c.on_became_leader(0)
        await _until(lambda: c.check("g") is ErrorCode.NONE, "the coordinator to load")
        _pending, first = await _member_id(c), await _member_id(c)
        answer = await asyncio.wait_for(_join(c, first), 5)
        assert answer["error_code"] == ErrorCode.NONE and answer["generation_id"] == 1, answer
        part.close()

    asyncio.run(run())
