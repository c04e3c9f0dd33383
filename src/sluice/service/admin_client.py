"""Cluster-aware administration over Sluice's own wire client: metadata, leaders, group
coordinators, offsets. For the CLI and the tools; applications use Kafka clients."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sluice.protocol.api import ApiKey
from sluice.protocol.errors import ErrorCode
from sluice.protocol.primitives import DecodeError, Reader
from sluice.security.client import PLAINTEXT, ClientSecurity
from sluice.sync.wire_client import WireClient

RETRIABLE_COORDINATOR = (
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.NOT_COORDINATOR,
)


class AdminError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class PartitionMeta:
    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    error: int


class AdminClient:
    def __init__(self, bootstrap: str, *, timeout_s: float = 15.0, security: ClientSecurity = PLAINTEXT):
        """``security``: every connection (bootstrap, leaders, coordinators) authenticates with it."""
        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        self.security = security
        self._conns: dict[int, WireClient] = {}
        self._bootstrap_conn = WireClient.connect(
            bootstrap, client_id="sluice-admin", timeout_s=timeout_s, security=security
        )
        self.brokers: dict[int, tuple[str, int]] = {}
        #: brokers the last list_groups could not reach, with why
        self.unreachable: dict[int, str] = {}

    def close(self) -> None:
        self._bootstrap_conn.close()
        for c in self._conns.values():
            c.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def node(self, node_id: int) -> WireClient:
        if node_id not in self._conns:
            if node_id not in self.brokers:
                self.metadata(None)
            if node_id not in self.brokers:
                raise AdminError(f"broker {node_id} is not in the cluster metadata")
            host, port = self.brokers[node_id]
            self._conns[node_id] = WireClient(
                host, port, client_id="sluice-admin", timeout_s=self.timeout_s, security=self.security
            )
        return self._conns[node_id]

    def metadata(self, topics: list[str] | None) -> dict[str, list[PartitionMeta]]:
        body = {
            "topics": None if topics is None else [{"name": t} for t in topics],
            "allow_auto_topic_creation": False,
        }
        r = self._bootstrap_conn.request(ApiKey.METADATA, 9, body)
        self.brokers = {b["node_id"]: (b["host"], b["port"]) for b in r["brokers"]}
        out: dict[str, list[PartitionMeta]] = {}
        for t in r["topics"]:
            if t["error_code"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                continue
            out[t["name"]] = sorted(
                (
                    PartitionMeta(
                        t["name"],
                        p["partition_index"],
                        p["leader_id"],
                        tuple(p["replica_nodes"]),
                        tuple(p["isr_nodes"]),
                        p["error_code"],
                    )
                    for p in t["partitions"]
                ),
                key=lambda pm: pm.partition,
            )
        return out

    def offsets(self, topic_partitions: list[tuple[str, int]], timestamp: int) -> dict[tuple[str, int], int]:
        """ListOffsets (-1 latest, -2 earliest) from each partition's leader; -1 where unknown."""
        meta = self.metadata(sorted({t for t, _ in topic_partitions}))
        by_leader: dict[int, list[tuple[str, int]]] = {}
        for topic, p in topic_partitions:
            parts = {pm.partition: pm for pm in meta.get(topic, [])}
            pm = parts.get(p)
            if pm is not None and pm.leader >= 0:
                by_leader.setdefault(pm.leader, []).append((topic, p))
        result = {tp: -1 for tp in topic_partitions}
        for leader, tps in by_leader.items():
            topics: dict[str, list[dict[str, int]]] = {}
            for topic, p in tps:
                topics.setdefault(topic, []).append({"partition_index": p, "timestamp": timestamp})
            r = self.node(leader).request(
                ApiKey.LIST_OFFSETS,
                7,
                {"replica_id": -1, "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]},
            )
            for t in r["topics"]:
                for p in t["partitions"]:
                    if p["error_code"] == ErrorCode.NONE:
                        result[(t["name"], p["partition_index"])] = p["offset"]
        return result

    def coordinator(self, group_id: str) -> WireClient:
        return self.node(self.coordinator_id(group_id))

    def coordinator_id(self, group_id: str) -> int:
        """The broker coordinating ``group_id``, waiting while one is being elected or loaded."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            r = self._bootstrap_conn.request(ApiKey.FIND_COORDINATOR, 3, {"key": group_id, "key_type": 0})
            if r["error_code"] == ErrorCode.NONE:
                self.brokers[r["node_id"]] = (r["host"], r["port"])
                return int(r["node_id"])
            if r["error_code"] not in RETRIABLE_COORDINATOR or time.monotonic() > deadline:
                raise AdminError(
                    f"no coordinator for group {group_id!r}: {ErrorCode(r['error_code']).name} "
                    f"{r.get('error_message') or ''}".strip()
                )
            time.sleep(0.2)

    def group_request(
        self, group_id: str, api_key: int, version: int, body: dict[str, Any]
    ) -> dict[str, Any]:
        return self.coordinator(group_id).request(api_key, version, body)

    def list_groups(self) -> list[dict[str, Any]]:
        self.metadata(None)
        groups: dict[str, dict[str, Any]] = {}
        self.unreachable = {}
        for node_id in sorted(self.brokers):
            try:
                r = self.node(node_id).request(ApiKey.LIST_GROUPS, 4, {"states_filter": []})
            except (OSError, TimeoutError) as exc:
                # A broker just killed stays in the metadata until its ZooKeeper session ends:
                # the groups of the others are still worth listing. Raise only if none answered.
                dead = self._conns.pop(node_id, None)
                if dead is not None:
                    dead.close()
                self.unreachable[node_id] = f"{type(exc).__name__}: {exc}"
                continue
            for g in r["groups"]:
                groups[g["group_id"]] = {**g, "coordinator": node_id}
        if self.brokers and len(self.unreachable) == len(self.brokers):
            raise AdminError(f"no broker answered ListGroups: {self.unreachable}")
        return [groups[k] for k in sorted(groups)]


def decode_consumer_assignment(data: bytes) -> list[tuple[str, int]]:
    """The partitions in a ``consumer`` protocol assignment (Kafka's ConsumerProtocolAssignment);
    empty for any other protocol's bytes that do not parse."""
    if not data:
        return []
    try:
        r = Reader(memoryview(data))
        r.int16()
        result = []
        for _ in range(r.int32()):
            topic = r.string()
            for _ in range(r.int32()):
                result.append((topic, r.int32()))
        return result
    except (DecodeError, ValueError):
        return []
