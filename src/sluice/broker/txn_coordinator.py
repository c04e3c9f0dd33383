"""The transaction coordinator (KIP-98): the I/O around ``broker.txn_state``.

A transactional id lives on the leader of its ``__transaction_state`` partition
(``abs(javaHash(id)) % transaction.state.log.num.partitions``, placed like a group). Every
change of its metadata is decided by a pure function of ``txn_state`` and written to that
partition, and acted on (answered, its markers sent) only once the write is committed (below
the high watermark), so a new coordinator that replays the partition knows every decision the
old one acted on.

The coordinator epoch is the leader epoch of the ``__transaction_state`` partition when this
broker took it; it goes with every marker, so a partition refuses the markers of a coordinator
older than one that already wrote there (``TRANSACTION_COORDINATOR_FENCED``).

Failover: the new leader waits until its high watermark reaches the log end it found, replays
the partition (the last record per transactional id), sends the markers of every transaction
it finds being prepared and completes it, and aborts every open one at its timeout (the ticker,
every ``transaction.abort.timed.out.transaction.cleanup.interval.ms``). Meanwhile its ids answer
COORDINATOR_LOAD_IN_PROGRESS.

Runs on the broker's event loop: a request's decision and its write are one step of the loop
apart, so ``TxnEntry.pending`` marks a write in flight, and a request meeting one answers
CONCURRENT_TRANSACTIONS (the client retries).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sluice import test_switches
from sluice.broker import txn_records
from sluice.broker import txn_state as ts
from sluice.broker.group_placement import partition_for_group
from sluice.broker.txn_markers import MarkerHost, MarkerListener, MarkerSender
from sluice.cluster.layout import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC
from sluice.protocol.errors import ErrorCode
from sluice.protocol.records import build_batch, decode_records, iter_batches

if TYPE_CHECKING:
    from sluice.broker.admin import TopicAdmin
    from sluice.broker.producer_ids import ProducerIdManager

log = logging.getLogger("sluice.txn_coordinator")

#: ``__transaction_state``'s cleanup policy, in one place. Only the last record per transactional
#: id matters (an expired id's is a tombstone), so the topic is compacted: a new coordinator's
#: replay follows the live ids, not the history.
TRANSACTION_STATE_CLEANUP_POLICY = "compact"
WRITE_TIMEOUT_S = 30.0
LOAD_WAIT_S = 1.0
#: How long a completion waits before writing Complete again after a failed write.
COMPLETE_RETRY_S = 0.5


class GroupPlacement(MarkerListener, Protocol):
    """The group coordinator as a transaction's coordinator sees it: where a group's offsets
    live (AddOffsetsToTxn), and told of the markers written there."""

    def partition_for(self, group_id: str) -> int: ...


class TxnCoordinatorHost(MarkerHost, Protocol):
    """What the transaction coordinator needs of the broker besides writing markers: producer
    ids, the admin to create ``__transaction_state``, and the group coordinator's placement."""

    @property
    def producer_ids(self) -> ProducerIdManager: ...

    @property
    def admin(self) -> TopicAdmin: ...

    @property
    def coordinator(self) -> GroupPlacement: ...


@dataclass(slots=True)
class TxnEntry:
    meta: ts.TxnMetadata
    partition: int
    #: a write of this id's metadata is in flight
    pending: bool = False


class TransactionCoordinator:
    def __init__(self, broker: TxnCoordinatorHost) -> None:
        self.broker = broker
        config = broker.config
        self.partitions = config.transaction_state_partitions
        self.max_timeout_ms = config.transaction_max_timeout_ms
        self.abort_interval_s = config.transaction_abort_interval_ms / 1000.0
        self.expiration_ms = config.transactional_id_expiration_ms
        self.txns: dict[str, TxnEntry] = {}
        #: __transaction_state partitions this broker leads: "loading" or "active"
        self.owned: dict[int, str] = {}
        #: the coordinator epoch of each partition led here (its leader epoch when taken)
        self.epochs: dict[int, int] = {}
        self.markers = MarkerSender(broker)
        #: test-only fault points (the "txn-markers" pause); all off in a deployment
        self.switches: test_switches.Switches = getattr(broker, "switches", test_switches.OFF)
        self._load_tasks: dict[int, asyncio.Task[None]] = {}
        self._completions: dict[str, asyncio.Task[None]] = {}
        self._creating: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        self._ticker = asyncio.get_running_loop().create_task(self._tick_forever())

    async def stop(self) -> None:
        for task in [self._ticker, self._creating, *self._load_tasks.values(), *self._completions.values()]:
            if task is not None:
                task.cancel()
        for p in list(self.owned):
            self.on_resigned(p)
        await self.markers.close()

    # -- placement ---------------------------------------------------------------------------------

    def partition_for(self, transactional_id: str) -> int:
        return partition_for_group(transactional_id, self.partitions)

    def find_coordinator(self, key: str, key_type: int) -> tuple[ErrorCode, str | None, int, str, int]:
        """(error, message, node id, host, port) of a transactional id's coordinator."""
        assert key_type == 1
        if not key:
            return ErrorCode.INVALID_REQUEST, "the transactional id is empty", -1, "", -1
        cache = self.broker.metadata
        if cache.topic(TRANSACTION_STATE_TOPIC) is None:
            self._ensure_topic()
            return (
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                f"{TRANSACTION_STATE_TOPIC} is being created",
                -1,
                "",
                -1,
            )
        p = self.partition_for(key)
        current = cache.partition_state(TRANSACTION_STATE_TOPIC, p)
        brokers = cache.brokers()
        if current is None or current[0].leader < 0 or current[0].leader not in brokers:
            return (
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                f"{TRANSACTION_STATE_TOPIC}-{p} has no leader; the controller is electing one",
                -1,
                "",
                -1,
            )
        leader = brokers[current[0].leader]
        if leader.broker_id == self.broker.config.broker_id and self.owned.get(p) is None:
            # The metadata names this broker the leader before this broker has taken the
            # partition: pointed here now, the client's next request would be answered
            # NOT_COORDINATOR, which clients (librdkafka's committed()) pass up as an error.
            return (
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                f"{TRANSACTION_STATE_TOPIC}-{p}: this broker is taking its leadership",
                -1,
                "",
                -1,
            )
        return ErrorCode.NONE, None, leader.broker_id, leader.host, leader.port

    def _ensure_topic(self) -> None:
        if self._creating is not None and not self._creating.done():
            return

        async def create() -> None:
            config = self.broker.config
            live = len(self.broker.metadata.brokers())
            rf = config.transaction_state_replication_factor
            rf = max(1, min(3, live)) if rf == -1 else rf
            topic = {
                "name": TRANSACTION_STATE_TOPIC,
                "num_partitions": self.partitions,
                "replication_factor": rf,
                "configs": [
                    {"name": "cleanup.policy", "value": TRANSACTION_STATE_CLEANUP_POLICY},
                    {"name": "retention.ms", "value": "-1"},
                    {"name": "segment.bytes", "value": str(100 * 1024 * 1024)},
                    {"name": "min.insync.replicas", "value": str(min(rf, config.transaction_state_min_isr))},
                ],
            }
            results = await self.broker.admin.create_topics([topic], 30_000, False)
            code = results[0]["error_code"]
            if code not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
                log.warning(
                    "event=transaction_state_topic_create_failed error=%s message=%r",
                    ErrorCode(code).name,
                    results[0].get("error_message"),
                )

        self._creating = asyncio.get_running_loop().create_task(create())

    def check(self, transactional_id: str) -> ErrorCode:
        if not transactional_id:
            return ErrorCode.INVALID_REQUEST
        status = self.owned.get(self.partition_for(transactional_id))
        if status is None:
            return ErrorCode.NOT_COORDINATOR
        if status == "loading":
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return ErrorCode.NONE

    # -- leadership of __transaction_state partitions ----------------------------------------------

    def on_became_leader(self, p: int) -> None:
        if self.owned.get(p) is not None:
            return
        part = self.broker.replicas.partitions.get((TRANSACTION_STATE_TOPIC, p))
        if part is None:
            return
        self.owned[p] = "loading"
        self.epochs[p] = part.leader_epoch
        # Nothing is written to the partition while it loads, so this end is every decision the
        # coordinators before this one acted on (each acted only once its write was committed).
        task = asyncio.get_running_loop().create_task(self._load(p, part.log.log_end_offset))
        task.add_done_callback(lambda t: self._load_done(p, t))
        self._load_tasks[p] = task

    def _load_done(self, p: int, task: asyncio.Task[None]) -> None:
        self._load_tasks.pop(p, None)
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "event=txn_coordinator_load_failed partition=%s-%d error=%r",
                TRANSACTION_STATE_TOPIC,
                p,
                task.exception(),
            )

    def on_resigned(self, p: int) -> None:
        if self.owned.pop(p, None) is None:
            return
        self.epochs.pop(p, None)
        task = self._load_tasks.pop(p, None)
        if task is not None and not task.done():
            task.cancel()
        dropped = [tid for tid, e in self.txns.items() if e.partition == p]
        for tid in dropped:
            del self.txns[tid]
            completion = self._completions.pop(tid, None)
            if completion is not None:
                completion.cancel()  # the next coordinator sends its markers again
        log.info(
            "event=txn_coordinator_unloaded partition=%s-%d transactional_ids=%d",
            TRANSACTION_STATE_TOPIC,
            p,
            len(dropped),
        )

    async def _load(self, p: int, end: int) -> None:
        started = time.monotonic()
        part = self.broker.replicas.partitions.get((TRANSACTION_STATE_TOPIC, p))
        if part is None:
            self.owned.pop(p, None)
            return
        while part.high_watermark < end:
            if not part.is_leader or self.owned.get(p) != "loading":
                return
            await part.wait_committed(end - 1, LOAD_WAIT_S)
        latest: dict[str, bytes | None] = {}
        offset = part.log.log_start_offset
        records = 0
        while offset < end:
            result = part.read(offset, 4 * 1024 * 1024)
            if not result.records:
                break
            buf = result.data()
            for pos, header in iter_batches(buf):
                if header.base_offset >= end:
                    break
                for rec in decode_records(buf, pos, header):
                    if rec.offset < offset or rec.key is None:
                        continue
                    tid = txn_records.decode_key(rec.key)
                    if tid is not None:
                        latest[tid] = rec.value
                        records += 1
                offset = header.last_offset + 1
            await asyncio.sleep(0)  # let other connections run during a long replay
        if self.owned.get(p) != "loading":
            return
        owed = {"markers": 0, "watch": 0}
        for tid, value in latest.items():
            meta = txn_records.decode_value(tid, value)
            if meta is None:
                continue
            self.txns[tid] = TxnEntry(meta, p)
            action = ts.on_load(meta)
            if action in owed:
                owed[action] += 1
        self.owned[p] = "active"
        for tid, entry in list(self.txns.items()):
            if entry.partition == p and ts.on_load(entry.meta) == "markers":
                self._start_completion(tid)
        log.log(
            logging.INFO if records else logging.DEBUG,
            "event=txn_coordinator_loaded partition=%s-%d coordinator_epoch=%d transactional_ids=%d "
            "records=%d completing=%d open=%d took_ms=%d",
            TRANSACTION_STATE_TOPIC,
            p,
            self.epochs.get(p, -1),
            len([e for e in self.txns.values() if e.partition == p]),
            records,
            owed["markers"],
            owed["watch"],
            (time.monotonic() - started) * 1000,
        )

    # -- persistence -------------------------------------------------------------------------------

    async def _persist(self, tid: str, entry: TxnEntry, meta: ts.TxnMetadata | None) -> ErrorCode:
        """Write ``meta`` (None: a tombstone) for ``tid`` and, once it is committed, make it the
        entry's metadata. Only one write per id at a time (``pending``)."""
        assert not entry.pending, tid
        p = entry.partition
        epoch = self.epochs.get(p)
        entry.pending = True
        try:
            error = await self._write(p, tid, meta)
        finally:
            entry.pending = False
        if error is ErrorCode.NONE and (self.owned.get(p) != "active" or self.epochs.get(p) != epoch):
            error = ErrorCode.NOT_COORDINATOR  # resigned (or re-elected) while writing
        if error is ErrorCode.NONE and meta is not None and self.txns.get(tid) is entry:
            entry.meta = meta
        return error

    async def _write(self, p: int, tid: str, meta: ts.TxnMetadata | None) -> ErrorCode:
        part = self.broker.replicas.partitions.get((TRANSACTION_STATE_TOPIC, p))
        if part is None or not part.is_leader or self.owned.get(p) != "active":
            return ErrorCode.NOT_COORDINATOR
        batch = build_batch([(txn_records.encode_key(tid), txn_records.encode_value(meta))])
        result = self.broker.replicas.append(TRANSACTION_STATE_TOPIC, p, batch, required_acks=-1)
        if result.error is not ErrorCode.NONE:
            log.warning("event=txn_state_write_failed transactional_id=%s error=%s", tid, result.error.name)
            if result.error is ErrorCode.NOT_LEADER_OR_FOLLOWER:
                return ErrorCode.NOT_COORDINATOR
            if result.error in (ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND):
                return ErrorCode.COORDINATOR_NOT_AVAILABLE  # retriable for the client, as Kafka maps it
            return result.error
        if not await part.wait_committed(result.last_offset, WRITE_TIMEOUT_S):
            return ErrorCode.REQUEST_TIMED_OUT if part.is_leader else ErrorCode.NOT_COORDINATOR
        return ErrorCode.NONE

    # -- the requests ------------------------------------------------------------------------------

    async def init_producer_id(
        self, tid: str, timeout_ms: int, expected: tuple[int, int] | None
    ) -> tuple[ErrorCode, int, int]:
        """InitProducerId with a transactional id: (error, producer id, epoch)."""
        if not tid:
            return ErrorCode.INVALID_REQUEST, -1, -1
        if not 0 < timeout_ms <= self.max_timeout_ms:
            return ErrorCode.INVALID_TRANSACTION_TIMEOUT, -1, -1
        error = self.check(tid)
        if error is not ErrorCode.NONE:
            return error, -1, -1
        entry = self.txns.get(tid)
        if entry is None:
            pid = await self.broker.producer_ids.next_id()
            error = self.check(tid)  # the await may have seen this broker resign
            if error is not ErrorCode.NONE:
                return error, -1, -1
            entry = self.txns.setdefault(
                tid, TxnEntry(ts.new_metadata(tid, pid, timeout_ms, _now_ms()), self.partition_for(tid))
            )
        decision = ts.init_producer_id(
            entry.meta, timeout_ms=timeout_ms, expected=expected, pending=entry.pending, now_ms=_now_ms()
        )
        if decision.needs_producer_id:
            fresh = await self.broker.producer_ids.next_id()
            decision = ts.init_producer_id(
                entry.meta,
                timeout_ms=timeout_ms,
                expected=expected,
                pending=entry.pending,
                now_ms=_now_ms(),
                fresh_producer_id=fresh,
            )
        if decision.error is not ErrorCode.NONE:
            return decision.error, -1, -1
        if decision.fence_first:
            log.info(
                "event=txn_fenced transactional_id=%s producer_id=%d epoch=%d reason=new_producer",
                tid,
                entry.meta.producer_id,
                entry.meta.producer_epoch,
            )
            error = await self._abort_fenced(tid, entry)
            # Retry once the abort completes; the retry bumps the epoch again.
            return (error if error is not ErrorCode.NONE else ErrorCode.CONCURRENT_TRANSACTIONS), -1, -1
        if decision.write is not None:
            error = await self._persist(tid, entry, decision.write)
            if error is not ErrorCode.NONE:
                return error, -1, -1
            log.info(
                "event=txn_producer_initialized transactional_id=%s producer_id=%d epoch=%d partition=%s-%d",
                tid,
                entry.meta.producer_id,
                entry.meta.producer_epoch,
                TRANSACTION_STATE_TOPIC,
                entry.partition,
            )
        return ErrorCode.NONE, entry.meta.producer_id, entry.meta.producer_epoch

    async def add_partitions(
        self, tid: str, producer_id: int, producer_epoch: int, partitions: list[tuple[str, int]]
    ) -> ErrorCode:
        error = self.check(tid)
        if error is not ErrorCode.NONE:
            return error
        entry = self.txns.get(tid)
        if entry is None:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        decision = ts.add_partitions(
            entry.meta, producer_id, producer_epoch, partitions, pending=entry.pending, now_ms=_now_ms()
        )
        if decision.error is not ErrorCode.NONE or decision.write is None:
            return decision.error
        return await self._persist(tid, entry, decision.write)

    def verify_partitions(
        self, tid: str, producer_id: int, producer_epoch: int, partitions: list[tuple[str, int]]
    ) -> dict[tuple[str, int], ErrorCode]:
        """AddPartitionsToTxn with VerifyOnly (KIP-890): has this producer's ongoing transaction
        added each partition? Decided by ``txn_state.verify_partitions``; nothing is written."""
        error = self.check(tid)
        if error is not ErrorCode.NONE:
            return dict.fromkeys(partitions, error)
        entry = self.txns.get(tid)
        return ts.verify_partitions(
            entry.meta if entry is not None else None, producer_id, producer_epoch, partitions
        )

    def offsets_partition(self, group_id: str) -> tuple[str, int]:
        """The partition a group's transactional offsets go to (AddOffsetsToTxn adds it)."""
        return OFFSETS_TOPIC, self.broker.coordinator.partition_for(group_id)

    async def end_txn(self, tid: str, producer_id: int, producer_epoch: int, commit: bool) -> ErrorCode:
        """EndTxn: answered once PrepareCommit / PrepareAbort is committed; the markers follow
        (Kafka's order: a read_committed reader sees the transaction once they are written)."""
        error = self.check(tid)
        if error is not ErrorCode.NONE:
            return error
        entry = self.txns.get(tid)
        if entry is None:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        decision = ts.end_txn(
            entry.meta, producer_id, producer_epoch, commit, pending=entry.pending, now_ms=_now_ms()
        )
        if decision.error is not ErrorCode.NONE or decision.write is None:
            return decision.error
        error = await self._persist(tid, entry, decision.write)
        if error is ErrorCode.NONE:
            log.info(
                "event=txn_ending transactional_id=%s producer_id=%d epoch=%d result=%s partitions=%d",
                tid,
                producer_id,
                producer_epoch,
                "commit" if commit else "abort",
                len(entry.meta.partitions),
            )
            self._start_completion(tid)
        return error

    async def _abort_fenced(self, tid: str, entry: TxnEntry) -> ErrorCode:
        """Fence the open transaction's producer (epoch + 1) and abort it under that epoch."""
        error = await self._persist(tid, entry, ts.fence(entry.meta, now_ms=_now_ms()))
        if error is ErrorCode.NONE:
            self._start_completion(tid)
        return error

    # -- completing transactions ---------------------------------------------------------------------

    def _start_completion(self, tid: str) -> None:
        running = self._completions.get(tid)
        if running is not None and not running.done():
            return
        task = asyncio.get_running_loop().create_task(self._complete(tid))
        self._completions[tid] = task
        task.add_done_callback(lambda t: self._completion_done(tid, t))

    def _completion_done(self, tid: str, task: asyncio.Task[None]) -> None:
        if self._completions.get(tid) is task:
            del self._completions[tid]
        if not task.cancelled() and task.exception() is not None:
            log.error("event=txn_completion_failed transactional_id=%s error=%r", tid, task.exception())

    async def _complete(self, tid: str) -> None:
        """Write the prepared transaction's markers to every partition, then Complete."""
        entry = self.txns.get(tid)
        if entry is None or entry.meta.state not in (ts.TxnState.PREPARE_COMMIT, ts.TxnState.PREPARE_ABORT):
            return
        meta, p = entry.meta, entry.partition
        coordinator_epoch = self.epochs.get(p, -1)

        def still_coordinator() -> bool:
            return (
                self.owned.get(p) == "active"
                and self.epochs.get(p) == coordinator_epoch
                and self.txns.get(tid) is entry
            )

        started = time.monotonic()
        test_switches.pause_point(self.switches, "txn-markers")
        done = await self.markers.write_all(
            tid,
            meta.producer_id,
            meta.producer_epoch,
            meta.state is ts.TxnState.PREPARE_COMMIT,
            coordinator_epoch,
            meta.partitions,
            still_coordinator,
        )
        if not done:
            return
        while still_coordinator():
            if entry.pending:  # an InitProducerId's write meeting this one: it answers CONCURRENT
                await asyncio.sleep(COMPLETE_RETRY_S)
                continue
            error = await self._persist(tid, entry, ts.complete(meta, now_ms=_now_ms()))
            if error is ErrorCode.NONE:
                log.info(
                    "event=txn_completed transactional_id=%s producer_id=%d epoch=%d result=%s "
                    "partitions=%d took_ms=%d",
                    tid,
                    meta.producer_id,
                    meta.producer_epoch,
                    "commit" if meta.state is ts.TxnState.PREPARE_COMMIT else "abort",
                    len(meta.partitions),
                    (time.monotonic() - started) * 1000,
                )
                return
            log.info(
                "event=txn_complete_write_failed transactional_id=%s error=%s action=retry", tid, error.name
            )
            await asyncio.sleep(COMPLETE_RETRY_S)

    # -- timers ------------------------------------------------------------------------------------

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self.abort_interval_s)
            try:
                await self._tick()
            except Exception:
                log.exception("event=txn_coordinator_tick_failed")

    async def _tick(self) -> None:
        now = _now_ms()
        for tid, entry in list(self.txns.items()):
            if (
                self.owned.get(entry.partition) != "active"
                or entry.pending
                or self.txns.get(tid) is not entry
            ):
                continue
            if ts.timed_out(entry.meta, now):
                log.info(
                    "event=txn_timed_out transactional_id=%s producer_id=%d epoch=%d timeout_ms=%d "
                    "action='aborted; the producer is fenced and must be created again'",
                    tid,
                    entry.meta.producer_id,
                    entry.meta.producer_epoch,
                    entry.meta.timeout_ms,
                )
                await self._abort_fenced(tid, entry)
            elif ts.expired(entry.meta, now, self.expiration_ms):
                entry.meta.to(ts.TxnState.DEAD)  # asserts the table allows it
                error = await self._persist(tid, entry, None)  # a tombstone
                if error is ErrorCode.NONE and self.txns.get(tid) is entry:
                    del self.txns[tid]
                    log.info("event=transactional_id_expired transactional_id=%s", tid)


def _now_ms() -> int:
    return int(time.time() * 1000)
