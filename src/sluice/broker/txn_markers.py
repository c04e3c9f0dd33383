"""Transaction markers: written on the partitions this broker leads (WriteTxnMarkers, and the
local coordinator), and sent by the coordinator to every other partition's leader.

A marker is written like any acks=all record: appended as a control batch by the leader
(``ReplicaManager.append_marker``), answered once it is below the high watermark. A marker on a
``__consumer_offsets`` partition also completes the group's transactional offsets there
(``GroupCoordinator.on_txn_marker``), once it is committed: a failover before that finds the
marker in the log and applies it when the partition loads.

The coordinator keeps sending a transaction's markers until every partition has one (leaders
move, brokers restart; a deleted topic needs none), or until it is no longer the coordinator
(the next one sends them again from ``__transaction_state``), or a partition says it has been
fenced (a newer producer epoch or coordinator epoch wrote there already: this coordinator's
decision is stale and must not be forced through).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from sluice.broker.peer_client import PeerConnection, PeerConnectionError
from sluice.cluster.layout import OFFSETS_TOPIC
from sluice.protocol.api import ApiKey
from sluice.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from sluice.broker.config import BrokerConfig
    from sluice.broker.metadata import MetadataCache
    from sluice.broker.replica_manager import ReplicaManager

log = logging.getLogger("sluice.txn_markers")

WRITE_TXN_MARKERS_VERSION = 1
#: How long a marker waits to be replicated before its leader answers REQUEST_TIMED_OUT.
MARKER_WRITE_TIMEOUT_S = 15.0
REQUEST_TIMEOUT_S = 30.0
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 1.0
#: A partition answering one of these keeps the coordinator from writing its decision: stop.
FENCED = frozenset({ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.TRANSACTION_COORDINATOR_FENCED})

Partitions = Iterable[tuple[str, int]]


class MarkerListener(Protocol):
    """The group coordinator, told of each marker committed on a ``__consumer_offsets``
    partition (it completes the transactional offset commits there)."""

    def on_txn_marker(self, p: int, producer_id: int, committed: bool) -> None: ...


class MarkerHost(Protocol):
    """What writing markers needs of the broker: the partitions led here to append them to, the
    view to find the others' leaders, and the group coordinator to tell."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def metadata(self) -> MetadataCache: ...

    @property
    def replicas(self) -> ReplicaManager: ...

    @property
    def coordinator(self) -> MarkerListener: ...

    @property
    def stopping(self) -> bool: ...


async def write_local(
    broker: MarkerHost,
    producer_id: int,
    producer_epoch: int,
    committed: bool,
    coordinator_epoch: int,
    partitions: Partitions,
) -> dict[tuple[str, int], ErrorCode]:
    """Write one transaction's marker on each of ``partitions`` this broker leads; the error of
    each (NONE once the marker is committed)."""
    results: dict[tuple[str, int], ErrorCode] = {}
    waits = []
    for topic, index in partitions:
        appended = broker.replicas.append_marker(
            topic, index, producer_id, producer_epoch, committed, coordinator_epoch
        )
        if appended.error is ErrorCode.NONE:
            waits.append((topic, index, appended))
        else:
            results[(topic, index)] = appended.error
    outcomes = await asyncio.gather(
        *(broker.replicas.wait_replicated(t, i, r, MARKER_WRITE_TIMEOUT_S) for t, i, r in waits)
    )
    for (topic, index, _), outcome in zip(waits, outcomes, strict=True):
        results[(topic, index)] = outcome.error
        if outcome.error is ErrorCode.NONE and topic == OFFSETS_TOPIC:
            broker.coordinator.on_txn_marker(index, producer_id, committed)
    return results


class MarkerSender:
    """The coordinator's side: every partition's marker, local or over the inter-broker listener."""

    def __init__(self, broker: MarkerHost) -> None:
        self.broker = broker
        self._peers: dict[int, tuple[PeerConnection, asyncio.Lock]] = {}

    async def close(self) -> None:
        for conn, _lock in self._peers.values():
            await conn.close()
        self._peers.clear()

    async def write_all(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        committed: bool,
        coordinator_epoch: int,
        partitions: Partitions,
        still_coordinator: Callable[[], bool],
    ) -> bool:
        """Write the marker to every partition, retrying with a backoff; True once each has it
        (or its topic is gone), False if this broker stopped being the coordinator or a
        partition said the decision is fenced."""
        remaining = set(partitions)
        backoff = BACKOFF_MIN_S
        while remaining:
            if not still_coordinator() or self.broker.stopping:
                return False
            by_leader: dict[int, list[tuple[str, int]]] = {}
            for topic, index in sorted(remaining):
                if self.broker.metadata.topic(topic) is None:
                    remaining.discard((topic, index))  # deleted: nothing left to mark
                    continue
                held = self.broker.metadata.partition_state(topic, index)
                leader = held[0].leader if held is not None else -1
                if leader >= 0:
                    by_leader.setdefault(leader, []).append((topic, index))
            results: dict[tuple[str, int], ErrorCode] = {}
            for part_results in await asyncio.gather(
                *(
                    self._write_to(leader, producer_id, producer_epoch, committed, coordinator_epoch, parts)
                    for leader, parts in by_leader.items()
                )
            ):
                results.update(part_results)
            for key, error in results.items():
                if error is ErrorCode.NONE:
                    remaining.discard(key)
                elif error in FENCED:
                    log.error(
                        "event=txn_markers_fenced transactional_id=%s producer_id=%d epoch=%d "
                        "partition=%s-%d error=%s action='a newer producer epoch or coordinator wrote "
                        "there; this coordinator stops sending the transaction markers'",
                        transactional_id,
                        producer_id,
                        producer_epoch,
                        key[0],
                        key[1],
                        error.name,
                    )
                    return False
                elif (
                    error is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    and self.broker.metadata.topic(key[0]) is None
                ):
                    remaining.discard(key)
            if remaining:
                log.debug(
                    "event=txn_markers_retry transactional_id=%s remaining=%d errors=%s",
                    transactional_id,
                    len(remaining),
                    sorted({e.name for k, e in results.items() if k in remaining}),
                )
                await asyncio.sleep(backoff)
                backoff = min(BACKOFF_MAX_S, backoff * 2)
        return True

    async def _write_to(
        self,
        leader: int,
        producer_id: int,
        producer_epoch: int,
        committed: bool,
        coordinator_epoch: int,
        partitions: list[tuple[str, int]],
    ) -> dict[tuple[str, int], ErrorCode]:
        if leader == self.broker.config.broker_id:
            return await write_local(
                self.broker, producer_id, producer_epoch, committed, coordinator_epoch, partitions
            )
        topics: dict[str, list[int]] = {}
        for topic, index in partitions:
            topics.setdefault(topic, []).append(index)
        body = {
            "markers": [
                {
                    "producer_id": producer_id,
                    "producer_epoch": producer_epoch,
                    "transaction_result": committed,
                    "topics": [{"name": t, "partition_indexes": ps} for t, ps in topics.items()],
                    "coordinator_epoch": coordinator_epoch,
                }
            ]
        }
        try:
            response = await self._request(leader, body)
        except (PeerConnectionError, OSError, TimeoutError) as exc:
            log.info("event=txn_markers_unsent leader=%d error=%s", leader, exc)
            return dict.fromkeys(partitions, ErrorCode.NETWORK_EXCEPTION)
        out: dict[tuple[str, int], ErrorCode] = {}
        for marker in response.get("markers", []):
            for t in marker["topics"]:
                for p in t["partitions"]:
                    out[(t["name"], p["partition_index"])] = ErrorCode(p["error_code"])
        return {key: out.get(key, ErrorCode.UNKNOWN_SERVER_ERROR) for key in partitions}

    async def _request(self, leader: int, body: dict[str, Any]) -> dict[str, Any]:
        reg = self.broker.metadata.brokers().get(leader)
        if reg is None:
            raise PeerConnectionError(f"broker {leader} is not registered")
        held = self._peers.get(leader)
        if held is not None and (held[0].host, held[0].port) != (reg.host, reg.port):
            await held[0].close()
            held = None
        if held is None:
            held = self._peers[leader] = (
                PeerConnection(
                    reg.host,
                    reg.port,
                    f"txn-coordinator-{self.broker.config.broker_id}",
                    self.broker.config.inter_broker_client(),
                ),
                asyncio.Lock(),
            )
        conn, lock = held
        async with lock:  # one request at a time per connection
            return await conn.request(
                ApiKey.WRITE_TXN_MARKERS, WRITE_TXN_MARKERS_VERSION, body, REQUEST_TIMEOUT_S
            )
