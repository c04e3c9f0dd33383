"""The ZooKeeper layout of a Sluice cluster and the codecs of its znodes.

Every path lives under the cluster's chroot (default ``/sluice``); kazoo applies the chroot,
so the paths here are relative to it. Znode payloads are JSON objects with a ``version`` field
so that a later format can be told apart from this one. Pure: no I/O.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

BROKER_IDS = "/brokers/ids"
TOPICS = "/brokers/topics"
CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
DELETE_TOPICS = "/admin/delete_topics"
REASSIGN_PARTITIONS = "/admin/reassign_partitions"
#: ephemeral children: brokers in controlled shutdown, waiting for leadership to move off them.
CONTROLLED_SHUTDOWN = "/admin/controlled_shutdown"
#: audit records of unclean leader elections: which partition, which epoch, what may be lost.
UNCLEAN_ELECTIONS = "/admin/unclean_elections"
PRODUCER_ID_BLOCK = "/latest_producer_id_block"
CLUSTER_ID = "/cluster/id"
TASKS = "/tasks"
#: sequential children, one per write of partition states, each listing the states it wrote
#: with their new znode versions: written in the same multi-op as the states themselves, so
#: brokers and the controller follow every leadership change through one watch (not one per
#: partition) and apply it without reading the states back.
STATE_CHANGES = "/brokers/state_changes"
STATE_CHANGE_PREFIX = "change-"

#: The topic holding every consumer group's membership and committed offsets.
OFFSETS_TOPIC = "__consumer_offsets"
#: The topic holding every transactional id's producer id, epoch and transaction state.
TRANSACTION_STATE_TOPIC = "__transaction_state"
#: Topics the cluster keeps for itself (Kafka's internal topics): never deleted on request.
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})

#: Paths every cluster has; created (empty) by the first broker that starts.
PERSISTENT_PATHS = (
    BROKER_IDS,
    TOPICS,
    STATE_CHANGES,
    "/admin",
    DELETE_TOPICS,
    CONTROLLED_SHUTDOWN,
    UNCLEAN_ELECTIONS,
    "/cluster",
    TASKS,
)


def broker_path(broker_id: int) -> str:
    return f"{BROKER_IDS}/{broker_id}"


def topic_path(topic: str) -> str:
    return f"{TOPICS}/{topic}"


def partitions_path(topic: str) -> str:
    return f"{TOPICS}/{topic}/partitions"


def partition_path(topic: str, partition: int) -> str:
    return f"{TOPICS}/{topic}/partitions/{partition}"


def partition_state_path(topic: str, partition: int) -> str:
    return f"{TOPICS}/{topic}/partitions/{partition}/state"


def unclean_election_path(topic: str, partition: int, leader_epoch: int) -> str:
    return f"{UNCLEAN_ELECTIONS}/{topic}-{partition}-{leader_epoch}"


#: Dynamic broker configs (Kafka's layout): one znode per broker id, and ``<default>`` for the
#: cluster-wide defaults, each ``{"version": 1, "config": {key: value}}``.
BROKER_CONFIGS = "/config/brokers"
DEFAULT_BROKER_ENTITY = "<default>"


def broker_config_path(entity: str) -> str:
    """``entity``: a broker id, or DEFAULT_BROKER_ENTITY."""
    return f"{BROKER_CONFIGS}/{entity}"


def encode_dynamic_config(config: dict[str, str]) -> bytes:
    return _dumps({"version": 1, "config": dict(sorted(config.items()))})


def decode_dynamic_config(data: bytes | None, what: str = BROKER_CONFIGS) -> dict[str, str]:
    if not data:
        return {}
    obj = _loads(data, what)
    return {str(k): str(v) for k, v in (obj.get("config") or {}).items()}


def delete_topic_path(topic: str) -> str:
    return f"{DELETE_TOPICS}/{topic}"


def state_change_path() -> str:
    """The prefix of a new sequential state-change notice (ZooKeeper appends the number)."""
    return f"{STATE_CHANGES}/{STATE_CHANGE_PREFIX}"


def _dumps(obj: dict[str, Any]) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)


def _loads(data: bytes, what: str) -> dict[str, Any]:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"znode {what} does not hold JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise ValueError(f"znode {what} holds {type(obj).__name__}, expected a JSON object")
    return obj


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    """What ``/brokers/ids/{id}`` holds: where a live broker listens."""

    broker_id: int
    #: The inter-broker listener's advertised address (peers fetch from it).
    host: str
    port: int
    pid: int
    rack: str | None = None
    #: Every listener: (name, security protocol, advertised host, port). A client is told the
    #: address of the listener it connected on. Empty: one PLAINTEXT listener at host:port.
    endpoints: tuple[tuple[str, str, str, int], ...] = ()

    def endpoint(self, listener: str) -> tuple[str, int] | None:
        """The advertised address of `listener` on this broker; None if it has none of that
        name (a client of that listener is not told about this broker, as in Kafka)."""
        if not self.endpoints:
            return (self.host, self.port) if listener == "PLAINTEXT" else None
        return next(((h, p) for n, _, h, p in self.endpoints if n == listener), None)

    def encode(self) -> bytes:
        obj: dict[str, Any] = {"version": 2, "host": self.host, "port": self.port, "pid": self.pid,
                               "rack": self.rack}  # fmt: skip
        if self.endpoints:  # Kafka's fields for listeners by name
            obj["endpoints"] = [f"{n}://{h}:{p}" for n, _, h, p in self.endpoints]
            obj["listener_security_protocol_map"] = {n: proto for n, proto, _, _ in self.endpoints}
        return _dumps(obj)

    @classmethod
    def decode(cls, broker_id: int, data: bytes) -> BrokerRegistration:
        obj = _loads(data, broker_path(broker_id))
        protocols = obj.get("listener_security_protocol_map") or {}
        endpoints = []
        for item in obj.get("endpoints") or ():
            name, _, address = str(item).partition("://")
            host, _, port = address.rpartition(":")
            endpoints.append((name, str(protocols.get(name, name)), host.strip("[]"), int(port)))
        return cls(
            broker_id, str(obj["host"]), int(obj["port"]), int(obj.get("pid", -1)), obj.get("rack"),
            tuple(endpoints),
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class TopicAssignment:
    """What ``/brokers/topics/{t}`` holds: the topic's id, replica assignment and config."""

    name: str
    topic_id: uuid.UUID
    replicas: dict[int, tuple[int, ...]]
    config: dict[str, str] = field(default_factory=dict)

    @property
    def partition_count(self) -> int:
        return len(self.replicas)

    def encode(self) -> bytes:
        return _dumps(
            {
                "version": 1,
                "topic_id": str(self.topic_id),
                "partitions": {str(p): list(r) for p, r in sorted(self.replicas.items())},
                "config": dict(sorted(self.config.items())),
            }
        )

    @classmethod
    def decode(cls, name: str, data: bytes) -> TopicAssignment:
        obj = _loads(data, topic_path(name))
        replicas = {int(p): tuple(int(b) for b in r) for p, r in obj["partitions"].items()}
        config = {str(k): str(v) for k, v in obj.get("config", {}).items()}
        return cls(name, uuid.UUID(obj["topic_id"]), replicas, config)


@dataclass(frozen=True, slots=True)
class PartitionState:
    """What ``.../partitions/{p}/state`` holds: leadership as the controller last decided it.

    ``leader == -1`` means the partition is offline. The ISR is never empty (I6): when the last
    in-sync replica dies it stays in the ISR so that the partition comes back with it.
    """

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int

    def __post_init__(self) -> None:
        assert self.isr, "I6: an ISR is never written empty"
        assert self.leader == -1 or self.leader in self.isr, "a leader is always in the ISR"

    def encode(self) -> bytes:
        return _dumps(
            {
                "version": 1,
                "leader": self.leader,
                "leader_epoch": self.leader_epoch,
                "isr": list(self.isr),
                "controller_epoch": self.controller_epoch,
            }
        )

    @classmethod
    def decode(cls, data: bytes, what: str = "partition state") -> PartitionState:
        obj = _loads(data, what)
        return cls(
            int(obj["leader"]),
            int(obj["leader_epoch"]),
            tuple(int(b) for b in obj["isr"]),
            int(obj["controller_epoch"]),
        )


@dataclass(frozen=True, slots=True)
class ProducerIdBlock:
    """What ``/latest_producer_id_block`` holds: the last block of producer ids handed out."""

    broker_id: int
    first: int
    size: int

    @property
    def next_first(self) -> int:
        return self.first + self.size

    def encode(self) -> bytes:
        return _dumps({"version": 1, "broker": self.broker_id, "block_start": self.first, "size": self.size})

    @classmethod
    def decode(cls, data: bytes) -> ProducerIdBlock:
        obj = _loads(data, PRODUCER_ID_BLOCK)
        return cls(int(obj["broker"]), int(obj["block_start"]), int(obj["size"]))


@dataclass(frozen=True, slots=True)
class Reassignment:
    """One partition's move, as ``/admin/reassign_partitions`` lists it: the target replicas,
    and the replicas the partition had when the move was asked for (None in entries written
    before it was recorded), which ListPartitionReassignments reports and a cancellation
    returns to."""

    topic: str
    partition: int
    replicas: tuple[int, ...]
    original: tuple[int, ...] | None = None


def encode_reassignments(moves: list[Reassignment]) -> bytes:
    entries: list[dict[str, Any]] = []
    for m in moves:
        entry: dict[str, Any] = {"topic": m.topic, "partition": m.partition, "replicas": list(m.replicas)}
        if m.original is not None:
            entry["original_replicas"] = list(m.original)
        entries.append(entry)
    return _dumps({"version": 1, "partitions": entries})


def decode_reassignments(data: bytes) -> list[Reassignment]:
    obj = _loads(data, REASSIGN_PARTITIONS)
    return [
        Reassignment(
            str(e["topic"]),
            int(e["partition"]),
            tuple(int(r) for r in e["replicas"]),
            tuple(int(r) for r in e["original_replicas"]) if "original_replicas" in e else None,
        )
        for e in obj.get("partitions", [])
    ]


def encode_int(value: int) -> bytes:
    return str(value).encode()


def decode_int(data: bytes, what: str) -> int:
    try:
        return int(data.decode() or "0")
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"znode {what} does not hold an integer: {data[:40]!r}") from exc


@dataclass(frozen=True, slots=True)
class StateWrite:
    """One partition state as a write left it: the state, the znode version it now has, and the
    id of the topic it belongs to (a topic deleted and created again under its name has a new id,
    so a notice about the old one is never applied to the new one)."""

    topic: str
    topic_id: uuid.UUID
    partition: int
    state: PartitionState
    version: int


@dataclass(frozen=True, slots=True)
class StateChanges:
    """What a ``/brokers/state_changes/change-N`` notice holds."""

    writer: str
    time_ms: int
    writes: tuple[StateWrite, ...]

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "version": 1,
                "writer": self.writer,
                "time_ms": self.time_ms,
                "states": [
                    [w.topic, str(w.topic_id), w.partition, w.version, w.state.leader, w.state.leader_epoch,
                     list(w.state.isr), w.state.controller_epoch]
                    for w in self.writes
                ],
            }
        )  # fmt: skip

    @classmethod
    def decode(cls, data: bytes, what: str = STATE_CHANGES) -> StateChanges:
        obj = _loads(data, what)
        writes = tuple(
            StateWrite(str(t), uuid.UUID(tid), int(p), PartitionState(int(leader), int(epoch),
                       tuple(int(b) for b in isr), int(cepoch)), int(version))
            for t, tid, p, version, leader, epoch, isr, cepoch in obj["states"]
        )  # fmt: skip
        return cls(str(obj.get("writer", "")), int(obj.get("time_ms", 0)), writes)


#: ZooKeeper refuses requests over 1 MB (jute.maxbuffer); multi-ops stay well below it.
MULTI_OP_MAX_BYTES = 512 * 1024


def chunk_by_size(groups: list[list[Any]], size_of: Any, limit: int = MULTI_OP_MAX_BYTES) -> list[list[Any]]:
    """Split groups of items into chunks whose summed `size_of(item)` stays under `limit`; a
    group is never split (its items must commit together). A group larger than the limit on its
    own becomes a chunk of its own."""
    chunks: list[list[Any]] = []
    current: list[Any] = []
    used = 0
    for group in groups:
        size = sum(size_of(item) for item in group)
        if current and used + size > limit:
            chunks.append(current)
            current, used = [], 0
        current.extend(group)
        used += size
    if current:
        chunks.append(current)
    return chunks
