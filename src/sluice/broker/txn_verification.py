"""KIP-890 part 1, the partition leader's side: before a transactional batch may open its
producer's transaction on a partition, the leader asks the transaction coordinator whether that
producer's transaction is ongoing and has added the partition (Kafka's AddPartitionsToTxnManager,
after its hanging transactions, KAFKA-14402).

Without the question, a client with WRITE on a topic could send a transactional batch for a
partition no transaction added; the partition would then hold a transaction no coordinator
knows of, which no marker ever ends: the last stable offset stays at its first offset, and every
read_committed consumer of the partition stalls there for good.

The question is AddPartitionsToTxn v4 with VerifyOnly, sent over the inter-broker listener as the
broker (the coordinator requires CLUSTER_ACTION for v4), or answered in process when this broker
is the coordinator. The answer is only half of the rule: the leader took a verification guard
from the partition first (``ReplicaManager.begin_txn_verification``), and the append carries it,
so a marker that ended the transaction while the question was out voids the answer
(``storage.producer_state``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from sluice.broker.peer_client import PeerConnection, PeerConnectionError
from sluice.cluster.layout import TRANSACTION_STATE_TOPIC
from sluice.protocol.api import ApiKey
from sluice.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from sluice.broker.broker import Broker

log = logging.getLogger("sluice.txn_verification")

Key = tuple[str, int]

#: Kafka's first broker version of AddPartitionsToTxn (VerifyOnly, a batch of transactions).
VERIFY_VERSION = 4
REQUEST_TIMEOUT_S = 15.0

#: Coordinator answers a producer of Produce v10 and older (all Sluice serves) cannot take as
#: they are, told instead as Kafka's ReplicaManager tells them: retriable ones as
#: NOT_ENOUGH_REPLICAS (a producer retries it without a metadata refresh).
RETRIABLE = frozenset(
    {
        ErrorCode.CONCURRENT_TRANSACTIONS,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
    }
)
NOT_ADDED_MESSAGE = "Partition was not added to the transaction"


def for_producer(error: ErrorCode) -> ErrorCode:
    """A coordinator's verification answer as the leader passes it on (Kafka's
    AddPartitionsToTxnManager): PRODUCER_FENCED is INVALID_PRODUCER_EPOCH to a producer, and
    TRANSACTION_ABORTABLE is INVALID_TXN_STATE to clients older than KIP-890 part 2 (Produce
    v11, TxnOffsetCommit v5: newer than any Sluice serves)."""
    if error is ErrorCode.PRODUCER_FENCED:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    if error is ErrorCode.TRANSACTION_ABORTABLE:
        return ErrorCode.INVALID_TXN_STATE
    return error


def produce_answer(error: ErrorCode) -> tuple[ErrorCode, str | None]:
    """A refused verification as a Produce partition's answer (Kafka's words)."""
    if error is ErrorCode.INVALID_TXN_STATE:
        return error, NOT_ADDED_MESSAGE
    if error in RETRIABLE:
        return (
            ErrorCode.NOT_ENOUGH_REPLICAS,
            "Unable to verify the partition has been added to the transaction. "
            f"Underlying error: {error.name}",
        )
    return error, None


def txn_offset_commit_answer(error: ErrorCode) -> ErrorCode:
    """A refused verification as a TxnOffsetCommit answer (Kafka's maybeConvertOffsetCommitError)."""
    if error is ErrorCode.NETWORK_EXCEPTION:
        return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    if error in (ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION):
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if error is ErrorCode.NOT_LEADER_OR_FOLLOWER:
        return ErrorCode.NOT_COORDINATOR
    return error


class TxnVerifier:
    """Asks the coordinator of a transactional id; one connection per coordinator broker."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._peers: dict[int, tuple[PeerConnection, asyncio.Lock]] = {}

    async def close(self) -> None:
        for conn, _lock in self._peers.values():
            await conn.close()
        self._peers.clear()

    async def verify(
        self, transactional_id: str, producer_id: int, producer_epoch: int, partitions: Iterable[Key]
    ) -> dict[Key, ErrorCode]:
        """Each partition's answer, as the leader passes it on (``for_producer``): NONE for a
        partition the producer's ongoing transaction has added."""
        keys = list(partitions)
        coordinator = self._coordinator(transactional_id)
        if coordinator < 0:
            answers: Mapping[Key, ErrorCode] = dict.fromkeys(keys, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        elif coordinator == self.broker.config.broker_id:
            answers = self.broker.txn_coordinator.verify_partitions(
                transactional_id, producer_id, producer_epoch, keys
            )
        else:
            answers = await self._ask(coordinator, transactional_id, producer_id, producer_epoch, keys)
        out = {key: for_producer(answers.get(key, ErrorCode.UNKNOWN_SERVER_ERROR)) for key in keys}
        refused = {k: e for k, e in out.items() if e is not ErrorCode.NONE}
        if refused:
            (topic, index), error = next(iter(refused.items()))
            log.info(
                "event=txn_verification_refused transactional_id=%s producer_id=%d epoch=%d coordinator=%d "
                "partitions=%d first=%s-%d error=%s",
                transactional_id,
                producer_id,
                producer_epoch,
                coordinator,
                len(refused),
                topic,
                index,
                error.name,
            )
        return out

    def _coordinator(self, transactional_id: str) -> int:
        """The broker leading the transactional id's ``__transaction_state`` partition, or -1."""
        p = self.broker.txn_coordinator.partition_for(transactional_id)
        held = self.broker.metadata.partition_state(TRANSACTION_STATE_TOPIC, p)
        leader = held[0].leader if held is not None else -1
        return leader if leader >= 0 and leader in self.broker.metadata.brokers() else -1

    async def _ask(
        self, coordinator: int, transactional_id: str, producer_id: int, producer_epoch: int, keys: list[Key]
    ) -> dict[Key, ErrorCode]:
        topics: dict[str, list[int]] = {}
        for topic, index in keys:
            topics.setdefault(topic, []).append(index)
        body = {
            "transactions": [
                {
                    "transactional_id": transactional_id,
                    "producer_id": producer_id,
                    "producer_epoch": producer_epoch,
                    "verify_only": True,
                    "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()],
                }
            ]
        }
        try:
            response = await self._request(coordinator, body)
        except (PeerConnectionError, OSError, TimeoutError) as exc:
            log.info("event=txn_verification_unsent coordinator=%d error=%s", coordinator, exc)
            return dict.fromkeys(keys, ErrorCode.NETWORK_EXCEPTION)
        top = ErrorCode(response.get("error_code", 0))
        if top is not ErrorCode.NONE:
            # A producer must not be told CLUSTER_AUTHORIZATION_FAILED for the broker's own
            # request (Kafka's rule): the verification simply did not happen.
            log.warning("event=txn_verification_failed coordinator=%d error=%s", coordinator, top.name)
            error = ErrorCode.INVALID_TXN_STATE if top is ErrorCode.CLUSTER_AUTHORIZATION_FAILED else top
            return dict.fromkeys(keys, error)
        out: dict[Key, ErrorCode] = {}
        for txn in response.get("results_by_transaction", []):
            if txn["transactional_id"] != transactional_id:
                continue
            for t in txn["topic_results"]:
                for p in t["results_by_partition"]:
                    out[(t["name"], p["partition_index"])] = ErrorCode(p["partition_error_code"])
        return out

    async def _request(self, coordinator: int, body: dict[str, Any]) -> dict[str, Any]:
        reg = self.broker.metadata.brokers().get(coordinator)
        if reg is None:
            raise PeerConnectionError(f"broker {coordinator} is not registered")
        held = self._peers.get(coordinator)
        if held is not None and (held[0].host, held[0].port) != (reg.host, reg.port):
            await held[0].close()
            held = None
        if held is None:
            held = self._peers[coordinator] = (
                PeerConnection(
                    reg.host,
                    reg.port,
                    f"txn-verifier-{self.broker.config.broker_id}",
                    self.broker.config.inter_broker_client(),
                ),
                asyncio.Lock(),
            )
        conn, lock = held
        async with lock:  # one request at a time per connection
            try:
                return await conn.request(
                    ApiKey.ADD_PARTITIONS_TO_TXN, VERIFY_VERSION, body, REQUEST_TIMEOUT_S
                )
            except asyncio.CancelledError:
                # The produce that asked went away mid-exchange: its answer must not be read as
                # the next request's.
                await asyncio.shield(conn.close())
                raise
