"""What `sluice group describe` and `sluice group reset-offsets` compute, over the wire."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluice.protocol.api import ApiKey
from sluice.protocol.errors import ErrorCode
from sluice.security.client import PLAINTEXT, ClientSecurity
from sluice.service.admin_client import AdminClient, AdminError, decode_consumer_assignment

EARLIEST = -2
LATEST = -1


@dataclass(frozen=True, slots=True)
class MemberView:
    member_id: str
    client_id: str
    client_host: str
    assignment: list[tuple[str, int]]


@dataclass(frozen=True, slots=True)
class PartitionView:
    topic: str
    partition: int
    committed: int
    end: int
    member: str | None

    @property
    def lag(self) -> int | None:
        if self.committed < 0 or self.end < 0:
            return None
        return max(0, self.end - self.committed)


@dataclass(frozen=True, slots=True)
class GroupView:
    group_id: str
    state: str
    protocol_type: str
    protocol: str
    coordinator: int
    members: list[MemberView]
    partitions: list[PartitionView]

    @property
    def total_lag(self) -> int:
        return sum(p.lag or 0 for p in self.partitions)


def _describe(admin: AdminClient, group_id: str) -> dict[str, Any]:
    r = admin.group_request(group_id, ApiKey.DESCRIBE_GROUPS, 5, {"groups": [group_id]})
    g = r["groups"][0]
    if g["error_code"] != ErrorCode.NONE:
        raise AdminError(f"cannot describe group {group_id!r}: {ErrorCode(g['error_code']).name}")
    return dict(g)


def describe_group(bootstrap: str, group_id: str, security: ClientSecurity = PLAINTEXT) -> GroupView:
    with AdminClient(bootstrap, security=security) as admin:
        g = _describe(admin, group_id)
        coordinator = admin.coordinator_id(group_id)
        members = [
            MemberView(
                m["member_id"],
                m["client_id"],
                m["client_host"],
                decode_consumer_assignment(bytes(m["member_assignment"]))
                if g["protocol_type"] == "consumer"
                else [],
            )
            for m in g["members"]
        ]
        if g["group_state"] == "Dead":
            raise AdminError(f"group {group_id!r} does not exist")
        f = admin.group_request(group_id, ApiKey.OFFSET_FETCH, 7, {"group_id": group_id, "topics": None})
        if f["error_code"] != ErrorCode.NONE:
            raise AdminError(f"cannot fetch offsets of {group_id!r}: {ErrorCode(f['error_code']).name}")
        committed = {
            (t["name"], p["partition_index"]): p["committed_offset"]
            for t in f["topics"]
            for p in t["partitions"]
        }
        owner = {tp: m.member_id for m in members for tp in m.assignment}
        tps = sorted(set(committed) | set(owner))
        ends = admin.offsets(tps, LATEST) if tps else {}
        partitions = [
            PartitionView(t, p, committed.get((t, p), -1), ends.get((t, p), -1), owner.get((t, p)))
            for t, p in tps
        ]
        return GroupView(
            group_id,
            g["group_state"],
            g["protocol_type"],
            g["protocol_data"],
            coordinator,
            members,
            partitions,
        )


def reset_offsets(
    bootstrap: str, group_id: str, topic: str, target: str | int, security: ClientSecurity = PLAINTEXT
) -> dict[int, int]:
    with AdminClient(bootstrap, security=security) as admin:
        g = _describe(admin, group_id)
        if g["members"]:
            raise AdminError(
                f"group {group_id!r} has {len(g['members'])} active member(s) (state {g['group_state']}); "
                "offsets can only be reset while it has none: stop its consumers first"
            )
        meta = admin.metadata([topic])
        if topic not in meta:
            raise AdminError(f"topic {topic!r} does not exist")
        tps = [(topic, pm.partition) for pm in meta[topic]]
        if target == "earliest":
            offsets = admin.offsets(tps, EARLIEST)
        elif target == "latest":
            offsets = admin.offsets(tps, LATEST)
        else:
            assert isinstance(target, int)
            if target < 0:
                raise AdminError(f"--to-offset must be >= 0, got {target}")
            lows, highs = admin.offsets(tps, EARLIEST), admin.offsets(tps, LATEST)
            # Clamp into the log, as Kafka's tool does, so no consumer starts out of range.
            offsets = {tp: min(max(target, lows[tp]), highs[tp]) for tp in tps}
        missing = [tp for tp, off in offsets.items() if off < 0]
        if missing:
            raise AdminError(f"no leader for {', '.join(f'{t}-{p}' for t, p in missing)}; try again shortly")
        commit_offsets(admin, group_id, offsets)
        return {p: off for (_, p), off in offsets.items()}


def commit_offsets(admin: AdminClient, group_id: str, offsets: dict[tuple[str, int], int]) -> None:
    """OffsetCommit for a group without members (generation -1), as a tool does; AdminError
    names every partition the coordinator refused."""
    by_topic: dict[str, list[tuple[int, int]]] = {}
    for (topic, p), off in sorted(offsets.items()):
        by_topic.setdefault(topic, []).append((p, off))
    r = admin.group_request(
        group_id,
        ApiKey.OFFSET_COMMIT,
        8,
        {
            "group_id": group_id,
            "generation_id_or_member_epoch": -1,
            "member_id": "",
            "group_instance_id": None,
            "topics": [
                {
                    "name": topic,
                    "partitions": [
                        {
                            "partition_index": p,
                            "committed_offset": off,
                            "committed_leader_epoch": -1,
                            "committed_metadata": None,
                        }
                        for p, off in parts
                    ],
                }
                for topic, parts in by_topic.items()
            ],
        },
    )
    errors = [
        (t["name"], p["partition_index"], p["error_code"])
        for t in r["topics"]
        for p in t["partitions"]
        if p["error_code"] != ErrorCode.NONE
    ]
    if errors:
        raise AdminError(
            "offset commit refused: " + ", ".join(f"{t}-{p}: {ErrorCode(e).name}" for t, p, e in errors)
        )
