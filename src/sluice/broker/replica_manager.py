"""The partitions this broker hosts, and the produce, fetch and list-offsets paths over them.

Runs on the broker's event loop. Leadership comes from the partition states in ZooKeeper (via
the metadata cache); a state with an older leader epoch than the one this broker already
acted on is refused (a stale controller's decision must not undo a newer one).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from sluice import test_switches
from sluice.broker.metadata import MetadataCache
from sluice.broker.partition import (
    DELETE_SUFFIX,
    STRAY_SUFFIX,
    LocalLog,
    Partition,
    has_records,
    local_log_action,
    parse_partition_dir_name,
    set_aside,
)
from sluice.broker.replica_access import ReplicaClaim, replica_refusal
from sluice.broker.replica_fetcher import FetcherManager
from sluice.broker.replication import ReadReplica, preferred_read_replica
from sluice.cluster.layout import TopicAssignment
from sluice.protocol.errors import ErrorCode
from sluice.protocol.records import iter_batches
from sluice.security.session import Session, current_session
from sluice.storage import errors as storage_errors
from sluice.storage.config import LONG_MAX, LogConfig
from sluice.storage.log import ReadResult
from sluice.storage.producer_state import VerificationGuard
from sluice.storage.txn_index import AbortedTxn

log = logging.getLogger("sluice.replica_manager")

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3
#: threads that open or close partition logs at start-up and shutdown (file-system bound)
IO_THREADS = 16


@dataclass(frozen=True, slots=True)
class ProduceResult:
    error: ErrorCode
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    message: str | None = None
    last_offset: int = -1
    #: The replica appended to (acks=all waits on this one, never on whatever holds the key
    #: by the time the wait starts).
    partition: Partition | None = field(default=None, repr=False, compare=False)
    #: The records refused one by one, by their index in the batch (KIP-467's RecordErrors)
    record_errors: tuple[storage_errors.RecordError, ...] = ()


#: A follower's quiet fetch of one partition: the replica read and what it held then.
QuietMark = tuple[Partition, tuple[object, ...]]


@dataclass(frozen=True, slots=True)
class FetchResult:
    error: ErrorCode
    high_watermark: int = -1
    log_start_offset: int = -1
    records: ReadResult | None = None
    last_stable_offset: int = -1
    #: read_committed only: transactions aborted within what ``records`` holds
    aborted: tuple[AbortedTxn, ...] = ()
    #: KIP-392: the replica the consumer should fetch from instead (then no records); -1: here
    preferred_read_replica: int = -1

    @property
    def size(self) -> int:
        return self.records.size_bytes if self.records is not None else 0


#: Followers long-poll for up to replica_fetcher.FETCH_MAX_WAIT_MS (3 s), so an idle follower
#: costs its leader a fetch every 3 s instead of every 0.5 s. New records, watermarks and
#: leadership changes of its partitions end the poll at once. What does not is a partition the
#: follower does not fetch yet: one it is to follow from now on, which its next fetch adds to the
#: session. So for this long after this broker takes on a leadership, a follower's poll is held
#: at most FOLLOWER_WAIT_WHILE_CHANGING_S, and polls waiting at that moment end at once.
LEADERSHIP_SETTLING_S = 10.0
FOLLOWER_WAIT_WHILE_CHANGING_S = 0.5


class PartitionTable(dict[tuple[str, int], Partition]):
    """The replicas on this broker by (topic, partition), with the subsets that periodic work
    looks at kept apart, so that its cost follows them rather than every replica of the broker
    (10,000 of them): by topic (a topic's change; once per topic while a hundred topics were
    created), the replicas led here (the ISR check, twice a second) and those with a time-based
    flush (``flush.ms``; the flusher)."""

    def __init__(self) -> None:
        super().__init__()
        self._by_topic: dict[str, dict[int, Partition]] = {}
        #: the replicas this broker leads (kept by ``mark_role``)
        self.leaders: dict[tuple[str, int], Partition] = {}
        #: the replicas whose topic sets ``flush.ms``
        self.timed_flush: dict[tuple[str, int], Partition] = {}

    def __setitem__(self, key: tuple[str, int], part: Partition) -> None:
        super().__setitem__(key, part)
        self._by_topic.setdefault(key[0], {})[key[1]] = part
        if part.log.config.flush_ms != LONG_MAX:
            self.timed_flush[key] = part
        self.mark_role(part)

    def mark_role(self, part: Partition) -> None:
        """Call after the replica's role may have changed."""
        key = (part.topic, part.index)
        if part.is_leader and self.get(key) is part:
            self.leaders[key] = part
        else:
            self.leaders.pop(key, None)

    def __delitem__(self, key: tuple[str, int]) -> None:
        super().__delitem__(key)
        self._unindex(key)

    def pop(self, key: tuple[str, int], *default: Partition | None) -> Partition | None:  # type: ignore[override]
        if key in self:
            self._unindex(key)
        return super().pop(key, *default)

    def clear(self) -> None:
        super().clear()
        self._by_topic.clear()
        self.leaders.clear()
        self.timed_flush.clear()

    def of_topic(self, topic: str) -> dict[int, Partition]:
        """The topic's replicas here, by partition (a copy)."""
        return dict(self._by_topic.get(topic, {}))

    def _unindex(self, key: tuple[str, int]) -> None:
        self.leaders.pop(key, None)
        self.timed_flush.pop(key, None)
        parts = self._by_topic.get(key[0])
        if parts is not None:
            parts.pop(key[1], None)
            if not parts:
                del self._by_topic[key[0]]


class ReplicaManager:
    def __init__(
        self,
        broker_id: int,
        data_dir: Path,
        metadata: MetadataCache,
        log_defaults: LogConfig | None = None,
        *,
        switches: test_switches.Switches = test_switches.OFF,
    ):
        self.broker_id = broker_id
        self.data_dir = data_dir
        self.metadata = metadata
        #: may a session act as a follower (replica_access.may_act_as_replica; the broker sets
        #: it from its authorizer and inter-broker listener)
        self.may_replicate: Callable[[Session], bool] = lambda session: True
        #: KIP-392: a leader points consumers in a rack at an in-sync follower in it
        #: (``replica.selector.class`` RackAwareReplicaSelector; the broker sets it)
        self.rack_aware_reads = False
        #: the broker's defaults for log settings a topic does not set itself
        self.log_defaults = log_defaults or LogConfig()
        self.partitions = PartitionTable()
        #: How this broker knows its logs were closed cleanly: None, by each log's own marker (a
        #: replica manager used on its own); True or False, by the data directory's one marker
        #: as the broker found it at start (``Broker._take_clean_shutdown_marker``), which the
        #: broker writes again once every log is closed.
        self.clean_start: bool | None = None
        self.fetchers = FetcherManager(broker_id, metadata)
        self._unsafe_acks_all = switches.unsafe_acks_all
        #: Called with a leader partition whose ISR may grow; the broker writes the change.
        self.isr_listeners: list[Callable[[Partition], None]] = []
        #: Called with (topic, partition, is_leader) after this broker's role for a partition
        #: changes; the group coordinator follows ``__consumer_offsets`` leadership through it.
        self.leadership_listeners: list[Callable[[str, int, bool], None]] = []
        self._follower_fetch_waiters: list[asyncio.Future[None]] = []
        self._leadership_taken_at = -LEADERSHIP_SETTLING_S

    @property
    def _log_markers(self) -> bool:
        return self.clean_start is None

    # -- followers' long polls -------------------------------------------------------------------

    def follower_wait_cap_s(self) -> float:
        """The longest a follower's fetch may wait now (see LEADERSHIP_SETTLING_S)."""
        if time.monotonic() - self._leadership_taken_at < LEADERSHIP_SETTLING_S:
            return FOLLOWER_WAIT_WHILE_CHANGING_S
        return float("inf")

    def add_follower_fetch_waiter(self, fut: asyncio.Future[None]) -> None:
        """Also wake ``fut`` when this broker takes on a leadership (done ones are dropped as
        new ones come, so the list holds about one per follower session)."""
        self._follower_fetch_waiters = [f for f in self._follower_fetch_waiters if not f.done()]
        self._follower_fetch_waiters.append(fut)

    def _took_leadership(self) -> None:
        self._leadership_taken_at = time.monotonic()
        waiters, self._follower_fetch_waiters = self._follower_fetch_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    # -- startup ---------------------------------------------------------------------------------

    def load_local_logs(self, known_topics: dict[str, TopicAssignment]) -> None:
        """Open (and so recover) every partition directory; set aside those of deleted topics and
        of earlier topics of the same name (``partition.local_log_action``)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        to_open: list[tuple[str, int, TopicAssignment]] = []
        for directory in sorted(self.data_dir.iterdir()):
            if not directory.is_dir():
                continue
            if directory.name.endswith(DELETE_SUFFIX):
                shutil.rmtree(directory, ignore_errors=True)  # a deletion cut short by a crash
                continue
            if directory.name.endswith(STRAY_SUFFIX):
                continue
            parsed = parse_partition_dir_name(directory.name)
            if parsed is None:
                continue
            topic, index = parsed
            found = Partition.read_topic_id(directory)
            assignment = known_topics.get(topic)
            action = local_log_action(
                found, assignment.topic_id if assignment else None, has_records(directory)
            )
            if action is not LocalLog.KEEP:
                moved = set_aside(directory, action)
                log.log(
                    logging.INFO if action is LocalLog.DELETE else logging.WARNING,
                    "event=stray_log_%s dir=%s found_topic_id=%s topic_id=%s moved_to=%s",
                    "deleted" if action is LocalLog.DELETE else "set_aside",
                    directory.name,
                    found,
                    assignment.topic_id if assignment else None,
                    moved.name,
                )
                continue
            assert assignment is not None
            to_open.append((topic, index, assignment))

        def open_one(item: tuple[str, int, TopicAssignment]) -> Partition:
            topic, index, assignment = item
            started = time.monotonic()
            part = Partition.open(
                self.data_dir, topic, index, assignment.topic_id, assignment.config, self.broker_id,
                clean=self.clean_start, defaults=self.log_defaults,
            )  # fmt: skip
            took_ms = (time.monotonic() - started) * 1000
            log.info(
                "event=log_loaded partition=%s log_start=%d log_end=%d took_ms=%d",
                part.name, part.log.log_start_offset, part.log.log_end_offset, took_ms,
            )  # fmt: skip
            return part

        # Opening a log reads its checkpoints and, after a crash, recovers its last segment:
        # thousands are opened side by side (file-system bound).
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=IO_THREADS, thread_name_prefix="load") as pool:
            for part in pool.map(open_one, to_open):
                self.partitions[(part.topic, part.index)] = part
        log.info(
            "event=logs_loaded partitions=%d took_ms=%d", len(to_open), (time.monotonic() - started) * 1000
        )

    # -- reacting to cluster metadata --------------------------------------------------------------

    def on_topic_changed(self, topic: str) -> None:
        """The topic's znode changed: drop replicas of an earlier topic of the same name (this
        broker missed its deletion), then act on every partition's state."""
        for index in self.remove_stale_replicas(topic):
            self.on_partition_state(topic, index)

    def remove_stale_replicas(self, topic: str) -> list[int]:
        """Drop replicas of an earlier topic of the same name and of partitions the topic no
        longer has; returns the topic's partitions, whose states are to be acted on next."""
        assignment = self.metadata.topic(topic)
        if assignment is None:
            return []
        for index, part in self.partitions.of_topic(topic).items():
            if part.topic_id != assignment.topic_id or index not in assignment.replicas:
                self._remove_stale(part, assignment.topic_id)
        return sorted(assignment.replicas)

    def _remove_stale(self, part: Partition, topic_id: object) -> None:
        log.info(
            "event=stale_replica_removed partition=%s topic_id=%s current_topic_id=%s reason=topic_recreated",
            part.name,
            part.topic_id,
            topic_id,
        )
        self._remove_partition(part, delete=True)

    def leads(self, topic: str, index: int) -> bool:
        """Whether this broker acts as the partition's leader now (not only named so in the view)."""
        part = self.partitions.get((topic, index))
        return part is not None and part.is_leader

    async def on_partition_states(self, keys: list[tuple[str, int]]) -> None:
        """Act on many partitions' states at once (a controller's batch of elections, a new
        topic): the logs this broker must create are created side by side off the event loop
        (each is a directory and a few files, made durable at the log's first flush), then each
        state is acted on in turn.

        A new log this broker is to lead also gets its leader epoch entry there, before anything
        is appended in the epoch, as ``become_leader`` would do (which then finds it in place),
        but not one after another on the event loop. No fetcher can append to a log that is
        not registered yet, so the entry starts at the log end as it would on the loop."""
        needed: list[tuple[str, int, TopicAssignment, int | None]] = []
        for topic, index in keys:
            assignment = self.metadata.topic(topic)
            known = self.metadata.partition_state(topic, index)
            if (
                assignment is not None
                and (topic, index) not in self.partitions
                and self.broker_id in assignment.replicas.get(index, ())
                and known is not None
            ):
                state = known[0]
                lead_epoch = state.leader_epoch if state.leader == self.broker_id else None
                needed.append((topic, index, assignment, lead_epoch))
        if needed:
            opened = await asyncio.to_thread(self._open_many, needed)
            for part in opened:
                key = (part.topic, part.index)
                current = self.metadata.topic(part.topic)
                if key in self.partitions or current is None or current.topic_id != part.topic_id:
                    part.close(marker=self._log_markers)  # the topic changed meanwhile: decided again below
                    continue
                self.partitions[key] = part
        for topic, index in keys:
            self.on_partition_state(topic, index)

    def _open_many(self, needed: list[tuple[str, int, TopicAssignment, int | None]]) -> list[Partition]:
        def open_one(item: tuple[str, int, TopicAssignment, int | None]) -> Partition:
            topic, index, assignment, lead_epoch = item
            part = Partition.open(
                self.data_dir, topic, index, assignment.topic_id, assignment.config, self.broker_id,
                clean=self.clean_start, defaults=self.log_defaults,
            )  # fmt: skip
            if lead_epoch is not None and part.log.latest_epoch() < lead_epoch:
                part.log.assign_epoch(lead_epoch, part.log.log_end_offset)
            return part

        # One thread: creating a log is a handful of file-system calls and no fsync, and threads
        # side by side only fought over the GIL and the data directory's lock. At 10,000
        # partitions two threads took 48 s of which 23 s of system time per broker, one 19.5 s.
        return [open_one(item) for item in needed]

    def on_partition_state(self, topic: str, index: int) -> None:
        assignment = self.metadata.topic(topic)
        current = self.metadata.partition_state(topic, index)
        if assignment is None or current is None:
            return
        replicas = assignment.replicas.get(index, ())
        part = self.partitions.get((topic, index))
        if part is not None and part.topic_id != assignment.topic_id:
            # The topic was deleted and created again while this broker was not looking: the
            # replica it has is the old topic's and must never be served as the new one's.
            self._remove_stale(part, assignment.topic_id)
            part = None
        if self.broker_id not in replicas:
            if part is not None:
                # Moved off this broker (reassignment): stop and delete the replica.
                self._remove_partition(part, delete=True)
            return
        state, version = current
        if part is None:
            part = Partition.open(
                self.data_dir, topic, index, assignment.topic_id, assignment.config, self.broker_id,
                clean=self.clean_start, defaults=self.log_defaults,
            )  # fmt: skip
            self.partitions[(topic, index)] = part
        if state.leader_epoch < part.leader_epoch:
            # A decision older than one this broker already acted on (a deposed controller's).
            log.warning(
                "event=stale_leader_epoch_refused partition=%s epoch=%d current=%d",
                part.name,
                state.leader_epoch,
                part.leader_epoch,
            )
            return
        was_leader = part.is_leader
        if was_leader and state.leader == self.broker_id and tuple(replicas) != tuple(part.replicas):
            self._took_leadership()  # a replica added to a partition led here starts fetching it
        part.replicas = replicas
        if state.leader == self.broker_id:
            if not part.is_leader or state.leader_epoch > part.leader_epoch:
                self.fetchers.remove(part)
                part.become_leader(state.leader_epoch, state.isr, replicas, time.monotonic() * 1000)
                self._took_leadership()
            part.set_isr(state.isr, version)
        else:
            if part.is_leader or state.leader_epoch > part.leader_epoch or part.leader_id != state.leader:
                self.fetchers.remove(part)
                part.become_follower(state.leader, state.leader_epoch, replicas)
                if state.leader >= 0:
                    self.fetchers.add(part)
            part.state_version = version
        if part.is_leader != was_leader:
            self.partitions.mark_role(part)
            for listener in self.leadership_listeners:
                listener(topic, index, part.is_leader)

    def _remove_partition(self, part: Partition, *, delete: bool) -> None:
        self.fetchers.remove(part)
        self.partitions.pop((part.topic, part.index), None)
        if part.is_leader:
            part.is_leader = False
            for listener in self.leadership_listeners:
                listener(part.topic, part.index, False)
        part.close(marker=self._log_markers)
        if delete and part.log.directory.exists():
            set_aside(part.log.directory, LocalLog.DELETE)
            log.info("event=log_deleted partition=%s topic_id=%s", part.name, part.topic_id)

    def on_topic_deleted(self, topic: str) -> None:
        for part in self.partitions.of_topic(topic).values():
            self._remove_partition(part, delete=True)

    def leader_partition(self, topic: str, index: int) -> tuple[Partition | None, ErrorCode]:
        part = self.partitions.get((topic, index))
        if part is not None and part.is_leader:
            return part, ErrorCode.NONE
        assignment = self.metadata.topic(topic)
        if assignment is None or index not in assignment.replicas:
            return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return None, ErrorCode.NOT_LEADER_OR_FOLLOWER

    # -- produce -----------------------------------------------------------------------------------

    def begin_txn_verification(
        self, topic: str, index: int, producer_id: int
    ) -> tuple[VerificationGuard | None, ErrorCode]:
        """Before this leader asks the transaction coordinator whether ``producer_id``'s
        transaction has added ``topic``-``index`` (KIP-890): the guard its transactional batch is
        then appended with (None: its transaction is already open here, nothing to verify), or
        the error of a partition this broker does not lead."""
        part, error = self.leader_partition(topic, index)
        if part is None:
            return None, error
        return part.log.begin_verification(producer_id), ErrorCode.NONE

    def append(
        self,
        topic: str,
        index: int,
        records: memoryview | bytes | None,
        *,
        required_acks: int = 1,
        verification: VerificationGuard | None = None,
    ) -> ProduceResult:
        """Append ``records`` as this partition's leader. A transactional batch that opens its
        producer's transaction here is refused INVALID_TXN_STATE unless ``verification`` is the
        guard ``begin_txn_verification`` gave and nothing of the producer's transaction was
        appended since (the coordinator confirmed it meanwhile)."""
        part, error = self.leader_partition(topic, index)
        if part is None:
            return ProduceResult(error)
        if required_acks == -1 and len(part.isr) < part.min_insync_replicas:
            # Refuse before appending: an acks=all write that cannot reach min.insync.replicas
            # must leave no trace (I1, incident A).
            return ProduceResult(
                ErrorCode.NOT_ENOUGH_REPLICAS,
                message=f"{part.name} has {len(part.isr)} in-sync replica(s) {list(part.isr)}; "
                f"min.insync.replicas is {part.min_insync_replicas}; nothing was written",
            )
        if records is None or len(records) == 0:
            return ProduceResult(ErrorCode.CORRUPT_MESSAGE, message="the request carried no record batch")
        # Refusals found once the append reached the log carry the log start offset, as Kafka's
        # do (its ReplicaManager answers those with the partition's log start; a too-large or
        # corrupt batch, refused before, with -1).
        start = part.log.log_start_offset
        try:
            info = part.append(records, verification)
        except storage_errors.RecordTooLargeError as exc:
            return ProduceResult(ErrorCode.MESSAGE_TOO_LARGE, message=str(exc))
        except storage_errors.OutOfOrderSequenceError as exc:
            return ProduceResult(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, log_start_offset=start, message=str(exc)
            )
        except storage_errors.InvalidProducerEpochError as exc:
            return ProduceResult(ErrorCode.INVALID_PRODUCER_EPOCH, log_start_offset=start, message=str(exc))
        except storage_errors.RecordValidationError as exc:
            # KeylessRecordError or InvalidTimestampError: the batch is refused, each refused
            # record named (Kafka answers INVALID_TIMESTAMP if any was refused for its time)
            log.info("event=produce_rejected partition=%s error=%r", part.name, str(exc))
            code = (
                ErrorCode.INVALID_TIMESTAMP
                if isinstance(exc, storage_errors.InvalidTimestampError)
                else ErrorCode.INVALID_RECORD
            )
            return ProduceResult(
                code, log_start_offset=start, message=str(exc), record_errors=exc.record_errors
            )
        except storage_errors.InvalidTxnStateError as exc:
            return ProduceResult(ErrorCode.INVALID_TXN_STATE, log_start_offset=start, message=str(exc))
        except (storage_errors.CorruptRecordError, storage_errors.InvalidRecordError) as exc:
            log.info("event=produce_rejected partition=%s error=%r", part.name, str(exc))
            return ProduceResult(ErrorCode.CORRUPT_MESSAGE, message=str(exc))
        return ProduceResult(
            ErrorCode.NONE,
            info.first_offset,
            info.log_append_time,
            part.log.log_start_offset,
            last_offset=info.last_offset,
            partition=part,
        )

    def append_marker(
        self,
        topic: str,
        index: int,
        producer_id: int,
        producer_epoch: int,
        committed: bool,
        coordinator_epoch: int,
    ) -> ProduceResult:
        """Write a transaction's COMMIT or ABORT marker as leader; the caller waits for it to be
        replicated (``wait_replicated``) as for an acks=all write."""
        part, error = self.leader_partition(topic, index)
        if part is None:
            return ProduceResult(error)
        if len(part.isr) < part.min_insync_replicas:
            return ProduceResult(
                ErrorCode.NOT_ENOUGH_REPLICAS,
                message=f"{part.name} has {len(part.isr)} in-sync replica(s); the marker waits",
            )
        try:
            info = part.append_marker(producer_id, producer_epoch, committed, coordinator_epoch)
        except storage_errors.InvalidProducerEpochError as exc:
            return ProduceResult(ErrorCode.INVALID_PRODUCER_EPOCH, message=str(exc))
        except storage_errors.TransactionCoordinatorFencedError as exc:
            return ProduceResult(ErrorCode.TRANSACTION_COORDINATOR_FENCED, message=str(exc))
        log.debug(
            "event=txn_marker_written partition=%s producer_id=%d epoch=%d committed=%s offset=%d",
            part.name,
            producer_id,
            producer_epoch,
            committed,
            info.first_offset,
        )
        return ProduceResult(
            ErrorCode.NONE,
            info.first_offset,
            -1,
            part.log.log_start_offset,
            last_offset=info.last_offset,
            partition=part,
        )

    async def wait_replicated(
        self, topic: str, index: int, result: ProduceResult, timeout_s: float
    ) -> ProduceResult:
        """acks=all: answer only once every ISR member has the batch (it is below the high watermark).

        The wait is on the replica the batch went into. Looking the partition up again by name
        acknowledged a batch that was never replicated when the replica left this broker between
        the append and the wait (a reassignment moving it away): nothing was found, and the
        append's success went out unchanged (CI: a drained partition lost an acknowledged record
        and the idempotent producer failed with OUT_OF_ORDER_SEQUENCE_NUMBER)."""
        part = result.partition
        if result.error is not ErrorCode.NONE or self._unsafe_acks_all:
            return result
        if part is None:
            raise ValueError(f"a successful append to {topic}-{index} must name its replica")
        if await part.wait_committed(result.last_offset, timeout_s):
            return result
        if not part.is_leader:
            return ProduceResult(
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                message="leadership moved before the write was "
                "replicated; the client retries on the new leader",
            )
        if len(part.isr) < part.min_insync_replicas:
            return ProduceResult(
                ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                message=f"the ISR of {part.name} shrank to {list(part.isr)} during the write",
            )
        return ProduceResult(ErrorCode.REQUEST_TIMED_OUT, message="not replicated to the ISR in time")

    # -- the replication door ------------------------------------------------------------------

    def replica_claim(self, replica_id: int) -> ReplicaClaim:
        """What a request claiming to come from follower ``replica_id`` is judged on: the
        session of the connection it came on and ``/brokers/ids`` as this broker sees it now."""
        session = current_session.get()
        return ReplicaClaim(
            replica_id,
            session,
            self.broker_id,
            frozenset(self.metadata.brokers()),
            self.may_replicate(session),
        )

    def replica_refusal(
        self, claim: ReplicaClaim, key: tuple[str, int], current_leader_epoch: int
    ) -> ErrorCode:
        """``replica_access.replica_refusal`` for a partition led here; NONE for any other (its
        read answers NOT_LEADER_OR_FOLLOWER or UNKNOWN_TOPIC_OR_PARTITION by itself)."""
        part = self.partitions.get(key)
        if part is None or not part.is_leader:
            return ErrorCode.NONE
        return replica_refusal(claim, part.replicas, current_leader_epoch)

    def note_follower_log_start(self, key: tuple[str, int], replica_id: int, log_start: int) -> None:
        """A follower's fetch named its log start for a partition led here (after the door)."""
        part = self.partitions.get(key)
        if part is not None:
            part.record_follower_log_start(replica_id, log_start)

    # -- fetch -------------------------------------------------------------------------------------

    def read(
        self,
        topic: str,
        index: int,
        offset: int,
        max_bytes: int,
        current_leader_epoch: int,
        min_one_batch: bool,
        *,
        replica: ReplicaClaim | None = None,
        read_committed: bool = False,
        client_rack: str | None = None,
        from_follower: bool = False,
    ) -> FetchResult:
        """Read for a consumer, or, with ``replica``, for the follower it claims to be (judged by
        ``replica_access.replica_refusal`` before any follower state is touched). A
        ``read_committed`` consumer reads below the last stable offset only, and is told which
        transactions aborted within what it got.

        KIP-392 (Fetch v11+, which carries the consumer's rack): ``from_follower`` lets a
        consumer read from this broker's follower replica, up to its own high watermark, as
        Kafka lets it; and a leader with ``rack_aware_reads`` answers a consumer in
        ``client_rack`` with the in-sync follower of that rack to read from instead
        (``replication.preferred_read_replica``), reading nothing for it."""
        part, error = self.leader_partition(topic, index)
        if part is None and from_follower and replica is None:
            follower = self.partitions.get((topic, index))
            if follower is not None and not follower.is_leader:
                part, error = follower, ErrorCode.NONE
        if part is None:
            return FetchResult(error)
        epoch_error = self.check_leader_epoch(part, current_leader_epoch)
        if epoch_error is not ErrorCode.NONE:
            if replica is None:
                return FetchResult(epoch_error)  # no offsets with an error: Kafka's answer (-1)
            return FetchResult(epoch_error, part.high_watermark, part.log.log_start_offset)
        if replica is not None:
            refusal = replica_refusal(replica, part.replicas, current_leader_epoch)
            if refusal is not ErrorCode.NONE:
                return FetchResult(refusal)
            return self._read_for_follower(part, replica.replica_id, offset, max_bytes)
        hw, lso, log_start = part.high_watermark, part.last_stable_offset, part.log.log_start_offset
        if self.rack_aware_reads and client_rack and part.is_leader:
            preferred = self._preferred_read_replica(part, client_rack, offset)
            if preferred is not None:
                return FetchResult(
                    ErrorCode.NONE, hw, log_start, last_stable_offset=lso, preferred_read_replica=preferred
                )
        limit = lso if read_committed else hw
        if offset > limit and offset <= part.log.log_end_offset:
            # Data past the limit exists but is not committed (or not stable) yet: nothing to return.
            return FetchResult(ErrorCode.NONE, hw, log_start, last_stable_offset=lso)
        try:
            result = part.read(
                offset, max_bytes, read_committed=read_committed, min_one_batch=min_one_batch, zero_copy=True
            )
        except storage_errors.OffsetOutOfRangeError:
            # A consumer is told the error only, as Kafka tells it (high watermark, last stable
            # and log start offsets -1: its client asks ListOffsets where to go). A follower's
            # answer (below) keeps them: Sluice's replica fetcher restarts from the log start.
            return FetchResult(ErrorCode.OFFSET_OUT_OF_RANGE)
        aborted: tuple[AbortedTxn, ...] = ()
        if read_committed and result.records and part.log.collect_aborted(offset, lso):
            # Bounded by what the read returned (Kafka's rule); walking its headers is paid only
            # where an aborted transaction lies ahead of the reader at all.
            aborted = tuple(part.log.collect_aborted(offset, _next_offset(result)))
        return FetchResult(ErrorCode.NONE, hw, log_start, result, lso, aborted)

    def _preferred_read_replica(self, part: Partition, client_rack: str, fetch_offset: int) -> int | None:
        live = self.metadata.brokers()
        now_ms = time.monotonic() * 1000

        def rack(broker_id: int) -> str | None:
            reg = live.get(broker_id)
            return reg.rack if reg is not None else None

        leader = ReadReplica(
            self.broker_id, rack(self.broker_id), part.log.log_start_offset, part.log.log_end_offset
        )
        followers = [
            ReadReplica(
                r,
                rack(r),
                part.follower_log_starts.get(r, part.log.log_start_offset),
                part.follower_leos.get(r, -1),
                now_ms - part.follower_caught_up_ms.get(r, 0.0),
            )
            for r in part.replicas
            if r != self.broker_id and r in live
        ]
        return preferred_read_replica(client_rack, leader, followers, part.isr, fetch_offset)

    def _read_for_follower(
        self, part: Partition, replica_id: int, offset: int, max_bytes: int
    ) -> FetchResult:
        """A follower the door let in (``read``) fetches ``offset``: record its position."""
        leo = part.log.log_end_offset
        if offset <= leo:
            part.record_follower_fetch(replica_id, offset, time.monotonic() * 1000)
            # Only the follower fetching now may join (Kafka's maybeExpandIsr): a dead one whose
            # last known end happens to equal the high watermark must not be added back.
            if replica_id not in part.isr and replica_id in part.isr_candidates_to_add():
                for listener in self.isr_listeners:
                    listener(part)
        if offset == leo:
            # The follower has the whole log: nothing to read. Most partitions of an idle
            # follower's session are here at every poll, so this path must stay cheap.
            return FetchResult(ErrorCode.NONE, part.high_watermark, part.log.log_start_offset)
        try:
            # A follower reads past the high watermark: it is how records get there.
            result = part.read(offset, max_bytes, committed_only=False, min_one_batch=True, zero_copy=True)
        except storage_errors.OffsetOutOfRangeError:
            return FetchResult(ErrorCode.OFFSET_OUT_OF_RANGE, part.high_watermark, part.log.log_start_offset)
        return FetchResult(ErrorCode.NONE, part.high_watermark, part.log.log_start_offset, result)

    def quiet_follower_mark(
        self, key: tuple[str, int], replica_id: int, fetch_offset: int
    ) -> QuietMark | None:
        """After a follower's read of ``key`` at ``fetch_offset``: its mark if the read left
        nothing to do (``Partition.quiet_mark``), with the replica it was taken on."""
        part = self.partitions.get(key)
        if part is None:
            return None
        mark = part.quiet_mark(replica_id, fetch_offset)
        return None if mark is None else (part, mark)

    def refresh_quiet_follower(
        self, key: tuple[str, int], replica: ReplicaClaim, mark: object, now_ms: float
    ) -> bool:
        """A follower fetches ``key`` again where its last read left ``mark`` (a ``QuietMark``
        kept by its fetch session): True (and the follower recorded as caught up) if the same
        replica is unchanged since, so the read can be skipped; False if it must be read (and
        so judged by the door, as every read is)."""
        part = self.partitions.get(key)
        if part is None or not isinstance(mark, tuple) or mark[0] is not part:
            return False
        # The mark holds the replica set, so only the claim's own facts (principal, liveness)
        # can have changed since the read that took it; the read decides with the epoch.
        if replica_refusal(replica, part.replicas, -1) is not ErrorCode.NONE:
            return False
        return part.refresh_quiet_follower(replica.replica_id, mark[1], now_ms)

    @staticmethod
    def check_leader_epoch(part: Partition, current_leader_epoch: int) -> ErrorCode:
        if current_leader_epoch < 0 or current_leader_epoch == part.leader_epoch:
            return ErrorCode.NONE
        if current_leader_epoch < part.leader_epoch:
            return ErrorCode.FENCED_LEADER_EPOCH
        return ErrorCode.UNKNOWN_LEADER_EPOCH

    def add_waiter(self, keys: list[tuple[str, int]], fut: asyncio.Future[None]) -> None:
        for key in keys:
            part = self.partitions.get(key)
            if part is not None:
                part.add_waiter(fut)

    def end_offset_for_epoch(
        self,
        topic: str,
        index: int,
        leader_epoch: int,
        current_leader_epoch: int,
        *,
        replica: ReplicaClaim | None = None,
    ) -> tuple[ErrorCode, int, int]:
        """(error, epoch, end offset): the largest epoch <= ``leader_epoch`` and where it ends.
        ``replica``: the request comes from that follower, judged by the replication door."""
        part, error = self.leader_partition(topic, index)
        if part is None:
            return error, -1, -1
        epoch_error = self.check_leader_epoch(part, current_leader_epoch)
        if epoch_error is not ErrorCode.NONE:
            return epoch_error, -1, -1
        if replica is not None:
            refusal = replica_refusal(replica, part.replicas, current_leader_epoch)
            if refusal is not ErrorCode.NONE:
                return refusal, -1, -1
        epoch, end = part.log.end_offset_for_epoch(leader_epoch)
        return ErrorCode.NONE, epoch, end

    # -- list offsets ------------------------------------------------------------------------------

    def list_offset(
        self,
        topic: str,
        index: int,
        timestamp: int,
        current_leader_epoch: int,
        *,
        read_committed: bool = False,
    ) -> tuple[ErrorCode, int, int, int]:
        """(error, timestamp, offset, leader_epoch) for one partition; the latest offset of a
        ``read_committed`` client is the last stable offset (Kafka's ListOffsets rule)."""
        part, error = self.leader_partition(topic, index)
        if part is None:
            return error, -1, -1, -1
        epoch_error = self.check_leader_epoch(part, current_leader_epoch)
        if epoch_error is not ErrorCode.NONE:
            return epoch_error, -1, -1, -1
        if timestamp == LATEST_TIMESTAMP:
            latest = part.last_stable_offset if read_committed else part.high_watermark
            return ErrorCode.NONE, -1, latest, part.leader_epoch
        if timestamp == EARLIEST_TIMESTAMP:
            return ErrorCode.NONE, -1, part.log.log_start_offset, part.leader_epoch
        if timestamp == MAX_TIMESTAMP:
            hit = part.log.max_timestamp_offset()
        elif timestamp < 0:
            return ErrorCode.INVALID_REQUEST, -1, -1, -1
        else:
            hit = part.log.offset_for_timestamp(timestamp)
        # As Kafka: a record at or above the high watermark is not there yet for a consumer,
        # and the epoch answered is that of the batch holding the record.
        if hit is None or hit.offset >= part.high_watermark:
            return ErrorCode.NONE, -1, -1, part.leader_epoch
        # Never an offset below the log start (DeleteRecords may have moved it into the batch).
        return ErrorCode.NONE, hit.timestamp, max(hit.offset, part.log.log_start_offset), hit.leader_epoch

    # -- housekeeping ------------------------------------------------------------------------------

    def flush_due(self, now_ms: int) -> None:
        """Flush the logs whose topic sets ``flush.ms`` and whose oldest unflushed data is that old."""
        for part in list(self.partitions.timed_flush.values()):
            if part.log.needs_flush_by_time(now_ms):
                part.log.flush()

    def checkpoint_high_watermarks(self) -> None:
        """Write the high watermark of every replica whose watermark moved since its last
        checkpoint (every ``hw_checkpoint_interval_ms``, as Kafka's
        ``replica.high.watermark.checkpoint.interval.ms``; a restarted replica starts from it and
        never from its log end, so an older one only means starting lower)."""
        for part in list(self.partitions.values()):
            part.checkpoint_high_watermark()

    def enforce_retention(self, now_ms: int) -> None:
        """Delete expired segments, only those wholly below the replica's high watermark and
        never the active one (as Kafka does): a record at or above it is not committed yet, and
        a follower may still need it. Time retention reads batch timestamps, so topics whose
        records carry source times (change topics) use LogAppendTime."""
        for part in list(self.partitions.values()):
            before = part.log.log_start_offset
            deleted = part.log.delete_old_segments(now_ms, high_watermark=part.high_watermark)
            if deleted:
                assert part.log.log_start_offset <= max(before, part.high_watermark), (
                    f"retention of {part.name} passed the high watermark {part.high_watermark}"
                )
                log.info(
                    "event=retention partition=%s segments_deleted=%d log_start=%d hw=%d",
                    part.name,
                    deleted,
                    part.log.log_start_offset,
                    part.high_watermark,
                )

    def reconfigure(self, topic: str | None = None) -> int:
        """Apply the topic configs in the view and this broker's log defaults to the replicas
        here (of ``topic``, or all), live: retention, max.message.bytes, min.insync.replicas ...
        are read from the log's config where they are used, so the next append, read or
        retention pass follows the new value. Returns how many replicas changed. The config is
        worked out once per topic (a topic's znode changes with every move of its partitions)."""
        changed = 0
        topics = [topic] if topic is not None else sorted({t for t, _ in self.partitions})
        for name in topics:
            assignment = self.metadata.topic(name)
            if assignment is None:
                continue
            try:
                new = LogConfig.from_topic_config(dict(assignment.config), base=self.log_defaults)
            except ValueError as exc:  # validated when written; a hand edit in ZooKeeper
                log.warning("event=topic_config_refused topic=%s error=%s", name, exc)
                continue
            moved: dict[str, str] = {}
            indexes = []
            for part in self.partitions.of_topic(name).values():
                if part.topic_id != assignment.topic_id:
                    continue
                part.config = dict(assignment.config)
                if part.log.config != new:
                    moved.update(self._set_log_config(part, new))
                    indexes.append(part.index)
            if indexes:  # one line per topic, not per replica
                log.info(
                    "event=log_config_changed topic=%s partitions=%s changed=%s", name, sorted(indexes), moved
                )
                changed += len(indexes)
        return changed

    def _set_log_config(self, part: Partition, new: LogConfig) -> dict[str, str]:
        """Replace a replica's log config; returns what changed (key -> 'old->new')."""
        old = part.log.config
        part.log.config = new
        key = (part.topic, part.index)
        if new.flush_ms != LONG_MAX:
            self.partitions.timed_flush[key] = part
        else:
            self.partitions.timed_flush.pop(key, None)
        before, after = old.to_topic_config(), new.to_topic_config()
        return {k: f"{v}->{after[k]}" for k, v in before.items() if after[k] != v}

    def leader_partitions(self) -> list[Partition]:
        return list(self.partitions.leaders.values())

    def close_all(self) -> bool:
        """Close every partition, side by side (a close fsyncs what is unflushed); True if every
        one closed, so that the broker may mark its data directory clean."""

        failed: list[str] = []

        def close(part: Partition) -> None:
            try:
                part.close(marker=self._log_markers)
            except Exception:
                failed.append(part.name)
                log.exception("event=close_failed partition=%s", part.name)

        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=IO_THREADS, thread_name_prefix="close") as pool:
            list(pool.map(close, list(self.partitions.values())))
        took_ms = (time.monotonic() - started) * 1000
        log.info(
            "event=logs_closed partitions=%d took_ms=%d failed=%d", len(self.partitions), took_ms, len(failed)
        )
        self.partitions.clear()
        return not failed


def _next_offset(result: ReadResult) -> int:
    """The offset after the last batch a read returned (the bound of its aborted transactions)."""
    last = 0
    for _pos, header in iter_batches(result.data()):
        last = header.next_offset
    return last
