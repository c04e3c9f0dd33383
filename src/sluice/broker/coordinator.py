"""The group coordinator: Kafka's classic group protocol, with every group's state in
``__consumer_offsets``.

A group lives on the leader of its ``__consumer_offsets`` partition. Membership changes are
written to that partition when a rebalance completes, and committed offsets when they are
committed; a response is sent only once the write is committed (below the high watermark). A
broker that becomes leader of the partition rebuilds its groups by replaying it, so nothing
lives only in memory. The protocol type is opaque: consumer groups and Sluice's own workers use
the same coordinator.

Loading: a new leader's high watermark trails its log end until its followers fetch again, yet
the records between them were acknowledged by the previous leader. So, as Kafka does, the new
coordinator notes the log end when it becomes leader, waits until the high watermark has reached
it, and replays everything below it; meanwhile its groups answer COORDINATOR_LOAD_IN_PROGRESS.

Runs on the broker's event loop. Group transitions go through ``Group.transition`` (the table
in ``broker.group``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Coroutine, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from sluice.broker import group_records as gr
from sluice.broker import offset_expiry, txn_verification
from sluice.broker import static_membership as sm
from sluice.broker.group import (
    Group,
    GroupState,
    Member,
    OffsetAndMetadata,
    commit_offset,
    complete_txn,
    delete_offset,
)
from sluice.broker.group_placement import OFFSETS_TOPIC, partition_for_group
from sluice.broker.static_membership import JoinAction, RejoinOutcome
from sluice.protocol.errors import ErrorCode
from sluice.protocol.records import build_batch, decode_records, iter_batches, read_control_marker

if TYPE_CHECKING:
    from sluice.broker.admin import TopicAdmin
    from sluice.broker.config import BrokerConfig
    from sluice.broker.metadata import MetadataCache
    from sluice.broker.replica_manager import ReplicaManager
    from sluice.broker.txn_verification import TxnVerifier
    from sluice.storage.producer_state import VerificationGuard

log = logging.getLogger("sluice.coordinator")

S = GroupState
Body = dict[str, Any]

MIN_SESSION_TIMEOUT_MS = 1_000
MAX_SESSION_TIMEOUT_MS = 1_800_000
OFFSET_METADATA_MAX_BYTES = 4096
WRITE_TIMEOUT_S = 30.0
TICK_S = 0.1
#: How long one wait for the high watermark lasts before the load checks it still leads.
LOAD_WAIT_S = 1.0
#: Bound on the records one coordinator write carries (a commit of many partitions is split).
RECORDS_PER_WRITE_MAX = 5000
#: A record's bytes besides its key and value in a batch (varints, attributes), at most.
RECORD_OVERHEAD_BYTES = 32


def write_chunks(
    records: list[tuple[bytes, bytes | None]], bytes_max: int
) -> list[list[tuple[bytes, bytes | None]]]:
    """``records`` cut into batches of at most ``RECORDS_PER_WRITE_MAX`` records and about
    ``bytes_max`` bytes (at least one record each): a batch must fit the offsets topic's
    segment.bytes and max.message.bytes, which may be small (offsets.topic.segment.bytes)."""
    chunks: list[list[tuple[bytes, bytes | None]]] = []
    chunk: list[tuple[bytes, bytes | None]] = []
    size = 0
    for key, value in records:
        n = len(key) + (len(value) if value is not None else 0) + RECORD_OVERHEAD_BYTES
        if chunk and (size + n > bytes_max or len(chunk) >= RECORDS_PER_WRITE_MAX):
            chunks.append(chunk)
            chunk, size = [], 0
        chunk.append((key, value))
        size += n
    if chunk:
        chunks.append(chunk)
    return chunks


class CoordinatorError(Exception):
    def __init__(self, code: ErrorCode, message: str = ""):
        super().__init__(message or code.name)
        self.code = code


class CoordinatorHost(Protocol):
    """What the group coordinator needs of the broker: the ``__consumer_offsets`` partitions led
    here, the admin to create the topic, the verifier of transactional offset commits (KIP-890),
    and a place to run a group's write in the background."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def metadata(self) -> MetadataCache: ...

    @property
    def replicas(self) -> ReplicaManager: ...

    @property
    def admin(self) -> TopicAdmin: ...

    @property
    def txn_verifier(self) -> TxnVerifier: ...

    def spawn(self, coro: Coroutine[Any, Any, object]) -> None: ...


class GroupCoordinator:
    def __init__(self, broker: CoordinatorHost):
        self.broker = broker
        self.partitions = broker.config.offsets_topic_partitions
        self.initial_rebalance_delay_s = broker.config.group_initial_rebalance_delay_ms / 1000.0
        self.groups: dict[str, Group] = {}
        self._limit_logged_at = -1.0
        #: __consumer_offsets partitions this broker leads: "loading" or "active".
        self.owned: dict[int, str] = {}
        self._load_tasks: dict[int, asyncio.Task[None]] = {}
        #: transaction markers committed on a partition while it loads (producer id, committed):
        #: applied, in order, once its replay is done (they lie past the replay's end)
        self._markers_while_loading: dict[int, list[tuple[int, bool]]] = {}
        self._creating: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        self._ticker = asyncio.get_running_loop().create_task(self._tick_forever())

    async def stop(self) -> None:
        for task in [self._ticker, self._creating, *self._load_tasks.values()]:
            if task is not None:
                task.cancel()
        for p in list(self.owned):
            self.on_resigned(p)

    # -- placement ---------------------------------------------------------------------------------

    def partition_for(self, group_id: str) -> int:
        return partition_for_group(group_id, self.partitions)

    def find_coordinator(self, key: str, key_type: int) -> tuple[ErrorCode, str | None, int, str, int]:
        """(error, message, node id, host, port) for one coordinator key."""
        if key_type != 0:
            return (
                ErrorCode.INVALID_REQUEST,
                f"key type {key_type} is neither a group (0) nor a transactional id (1)",
                -1,
                "",
                -1,
            )
        if not key:
            return ErrorCode.INVALID_GROUP_ID, "the group id is empty", -1, "", -1
        cache = self.broker.metadata
        if cache.topic(OFFSETS_TOPIC) is None:
            self._ensure_offsets_topic()
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{OFFSETS_TOPIC} is being created", -1, "", -1
        p = self.partition_for(key)
        current = cache.partition_state(OFFSETS_TOPIC, p)
        brokers = cache.brokers()
        if current is None or current[0].leader < 0 or current[0].leader not in brokers:
            return (
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                f"{OFFSETS_TOPIC}-{p} has no leader; the controller is electing one",
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
                f"{OFFSETS_TOPIC}-{p}: this broker is taking its leadership",
                -1,
                "",
                -1,
            )
        return ErrorCode.NONE, None, leader.broker_id, leader.host, leader.port

    def _offsets_replication_factor(self, live: int) -> int:
        configured = self.broker.config.offsets_topic_replication_factor
        return max(1, min(3, live)) if configured == -1 else configured

    def _ensure_offsets_topic(self) -> None:
        if self._creating is not None and not self._creating.done():
            return

        async def create() -> None:
            live = len(self.broker.metadata.brokers())
            topic = {
                "name": OFFSETS_TOPIC,
                "num_partitions": self.partitions,
                "replication_factor": self._offsets_replication_factor(live),
                # Compacted: the log cleaner keeps the last record per group and offset, and the
                # tombstones of deleted groups and expired offsets remove them, so a new leader
                # replays the live groups rather than their history.
                "configs": [
                    {"name": "cleanup.policy", "value": "compact"},
                    {"name": "segment.bytes", "value": str(self.broker.config.offsets_topic_segment_bytes)},
                ],
            }
            results = await self.broker.admin.create_topics([topic], 30_000, False)
            code = results[0]["error_code"]
            if code not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
                log.warning(
                    "event=offsets_topic_create_failed error=%s message=%r",
                    ErrorCode(code).name,
                    results[0].get("error_message"),
                )

        self._creating = asyncio.get_running_loop().create_task(create())

    def check(self, group_id: str) -> ErrorCode:
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID
        status = self.owned.get(self.partition_for(group_id))
        if status is None:
            return ErrorCode.NOT_COORDINATOR
        if status == "loading":
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return ErrorCode.NONE

    # -- leadership of __consumer_offsets partitions ------------------------------------------------

    def on_became_leader(self, p: int) -> None:
        if self.owned.get(p) is not None:
            return
        part = self.broker.replicas.partitions.get((OFFSETS_TOPIC, p))
        if part is None:
            return
        self.owned[p] = "loading"
        # Nothing is appended to the partition while it loads (writes need it active), so this
        # end is every group record this coordinator must know before it answers.
        end = part.log.log_end_offset
        task = asyncio.get_running_loop().create_task(self._load(p, end))
        task.add_done_callback(lambda t: self._load_done(p, t))
        self._load_tasks[p] = task

    def _load_done(self, p: int, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            # The partition stays "loading" (its groups answer COORDINATOR_LOAD_IN_PROGRESS)
            # rather than serving groups from a partial replay.
            log.error(
                "event=coordinator_load_failed partition=%s-%d error=%r",
                OFFSETS_TOPIC,
                p,
                task.exception(),
            )

    def on_resigned(self, p: int) -> None:
        if self.owned.pop(p, None) is None:
            return
        self._markers_while_loading.pop(p, None)
        task = self._load_tasks.pop(p, None)
        if task is not None and not task.done():
            task.cancel()
        dropped = [g for g in self.groups.values() if self.partition_for(g.group_id) == p]
        for group in dropped:
            for member in group.members.values():
                self._fail_futures(member, ErrorCode.NOT_COORDINATOR)
            del self.groups[group.group_id]
        log.info("event=coordinator_unloaded partition=%s-%d groups=%d", OFFSETS_TOPIC, p, len(dropped))

    async def _load(self, p: int, end: int) -> None:
        """Replay the partition below ``end``, the log end when this broker became its leader,
        once the high watermark has reached it (until then the records above the high watermark
        may be this leader's alone; once it has, they are committed)."""
        started = time.monotonic()
        part = self.broker.replicas.partitions.get((OFFSETS_TOPIC, p))
        if part is None:
            self.owned.pop(p, None)
            return
        waited = False
        while part.high_watermark < end:
            if not waited:
                log.info(
                    "event=coordinator_load_waiting partition=%s-%d hw=%d load_end=%d",
                    OFFSETS_TOPIC,
                    p,
                    part.high_watermark,
                    end,
                )
                waited = True
            if not part.is_leader or self.owned.get(p) != "loading":
                return  # resigned meanwhile; on_resigned has cleaned up
            await part.wait_committed(end - 1, LOAD_WAIT_S)
        now = asyncio.get_running_loop().time()
        latest: dict[gr.GroupKey, bytes | None] = {}
        # Offsets by the rules memory follows (group.commit_offset, delete_offset, complete_txn),
        # so that a coordinator loading the log answers what the previous one did.
        offsets: dict[gr.OffsetKey, OffsetAndMetadata] = {}
        #: transactional offset commits by producer id, until their marker (applied at it)
        pending: dict[int, dict[gr.OffsetKey, OffsetAndMetadata]] = {}
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
                if header.is_control:
                    marker = read_control_marker(buf, pos, header)
                    committed = marker is not None and marker.committed
                    complete_txn(offsets, pending, header.producer_id, committed)
                    offset = header.last_offset + 1
                    continue
                for rec in decode_records(buf, pos, header):
                    if rec.offset < offset or rec.key is None:
                        continue
                    key = gr.decode_key(rec.key)
                    if isinstance(key, gr.GroupKey):
                        latest[key] = rec.value
                    elif isinstance(key, gr.OffsetKey):
                        om = _offset_from_record(rec.value, rec.offset)
                        if om is None:  # a tombstone: at once, in a transaction too (as Kafka)
                            delete_offset(offsets, pending, key, rec.offset)
                        elif header.is_transactional:
                            pending.setdefault(header.producer_id, {})[key] = om
                        else:
                            commit_offset(offsets, key, om)
                    records += 1
                offset = header.last_offset + 1
            await asyncio.sleep(0)  # let other connections run during a long replay
        loaded = 0
        for key, value in latest.items():
            obj = gr.decode_value(value)
            if obj is None:
                continue
            group = self.groups.setdefault(key.group_id, Group(key.group_id))
            group.protocol_type = obj.get("protocol_type")
            group.protocol = obj.get("protocol")
            group.generation = int(obj.get("generation", 0))
            group.leader = obj.get("leader")
            group.members = {
                m["member_id"]: Member.from_record(m, group.protocol_type or "", now)
                for m in obj.get("members", [])
            }
            group.state = S.STABLE if group.members else S.EMPTY
            group.state_timestamp_ms = int(obj.get("state_ts", group.state_timestamp_ms))
            loaded += 1
        for key, om in offsets.items():
            group = self.groups.setdefault(key.group_id, Group(key.group_id))
            group.offsets[(key.topic, key.partition)] = om
        for producer_id, keys in pending.items():  # transactions whose marker is still to come
            for key, om in keys.items():
                group = self.groups.setdefault(key.group_id, Group(key.group_id))
                group.pending_txn_offsets.setdefault(producer_id, {})[(key.topic, key.partition)] = om
        assert offset >= end, f"loaded {OFFSETS_TOPIC}-{p} to {offset}, short of {end}"
        if self.owned.get(p) == "loading":
            self.owned[p] = "active"
            for producer_id, committed in self._markers_while_loading.pop(p, []):
                self.on_txn_marker(p, producer_id, committed)
        log.log(
            logging.INFO if records or waited else logging.DEBUG,
            "event=coordinator_loaded partition=%s-%d groups=%d records=%d load_end=%d took_ms=%d",
            OFFSETS_TOPIC,
            p,
            loaded,
            records,
            end,
            (time.monotonic() - started) * 1000,
        )

    # -- persistence -------------------------------------------------------------------------------

    async def _write(
        self,
        group_id: str,
        items: list[tuple[gr.Key, dict[str, Any] | None]],
        *,
        producer_id: int = -1,
        producer_epoch: int = -1,
    ) -> ErrorCode:
        """Append records to the group's partition and wait until they are committed; with a
        producer id, as that producer's transactional records (TxnOffsetCommit: the partition
        refuses a fenced epoch, and the transaction's marker decides their fate)."""
        error, at = self._append(group_id, items, producer_id=producer_id, producer_epoch=producer_epoch)
        if error is not ErrorCode.NONE:
            return error
        return await self._committed(group_id, at[-1] if at else -1)

    def _append(
        self,
        group_id: str,
        items: list[tuple[gr.Key, dict[str, Any] | None]],
        *,
        producer_id: int = -1,
        producer_epoch: int = -1,
        verification: VerificationGuard | None = None,
    ) -> tuple[ErrorCode, list[int]]:
        """``_write``'s append, in one step of the event loop: the error, and the offset in the
        log of each record of ``items`` appended, in order (all of them unless refused; a write
        cut in batches may be refused after its first ones)."""
        p = self.partition_for(group_id)
        part = self.broker.replicas.partitions.get((OFFSETS_TOPIC, p))
        if part is None or not part.is_leader or self.owned.get(p) != "active":
            return ErrorCode.NOT_COORDINATOR, []
        now_ms = int(time.time() * 1000)
        at: list[int] = []
        cfg = part.log.config
        for chunk in write_chunks(
            [(gr.encode_key(k), gr.encode_value(v)) for k, v in items],
            min(cfg.segment_bytes, cfg.max_message_bytes) // 2,
        ):
            batch = build_batch(
                chunk,
                timestamp_ms=now_ms,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                transactional=producer_id >= 0,
            )
            result = self.broker.replicas.append(OFFSETS_TOPIC, p, batch, verification=verification)
            if result.error is not ErrorCode.NONE:
                log.warning("event=coordinator_write_failed group=%s error=%s", group_id, result.error.name)
                error = (
                    ErrorCode.NOT_COORDINATOR
                    if result.error is ErrorCode.NOT_LEADER_OR_FOLLOWER
                    else result.error
                )
                return error, at
            at.extend(range(result.base_offset, result.base_offset + len(chunk)))
        return ErrorCode.NONE, at

    async def _committed(self, group_id: str, last_offset: int) -> ErrorCode:
        """``_write``'s wait: until the record at ``last_offset`` of the group's partition is
        committed."""
        part = self.broker.replicas.partitions.get((OFFSETS_TOPIC, self.partition_for(group_id)))
        if part is None:
            return ErrorCode.NOT_COORDINATOR
        if not await part.wait_committed(last_offset, WRITE_TIMEOUT_S):
            return ErrorCode.REQUEST_TIMED_OUT if part.is_leader else ErrorCode.NOT_COORDINATOR
        return ErrorCode.NONE

    async def _persist_group(self, group: Group) -> ErrorCode:
        value = None if group.state is S.DEAD else group.to_record()
        return await self._write(group.group_id, [(gr.GroupKey(group.group_id), value)])

    # -- timers ------------------------------------------------------------------------------------

    async def _tick_forever(self) -> None:
        check_s = self.broker.config.offsets_retention_check_interval_ms / 1000.0
        next_expiry = time.monotonic() + check_s
        expiring: asyncio.Task[int] | None = None
        while True:
            await asyncio.sleep(TICK_S)
            try:
                self._tick()
            except Exception:
                log.exception("event=coordinator_tick_failed")
            if time.monotonic() >= next_expiry and (expiring is None or expiring.done()):
                next_expiry = time.monotonic() + check_s
                expiring = asyncio.get_running_loop().create_task(self.expire_offsets())

    async def expire_offsets(self, now_ms: int | None = None) -> int:
        """Write tombstones for the offsets that expired (broker/offset_expiry.py), and for the
        groups that go with them; returns how many offsets expired. A tombstone is written for
        one group at a time and takes effect in memory only once committed, and only for the
        offsets not committed again meanwhile.

        A group's decision and the append of its tombstones are one step of the event loop
        (``_write`` appends before its first await), and a TxnOffsetCommit makes its partitions
        pending in that same step as it appends its record: so a tombstone never follows a
        transactional record whose marker is still to come (the cleaner would keep the
        tombstone over the transaction's offset)."""
        retention_ms = self.broker.config.offsets_retention_ms
        expired_total = 0
        for group in list(self.groups.values()):
            if self.check(group.group_id) is not ErrorCode.NONE:
                continue
            now = int(time.time() * 1000) if now_ms is None else now_ms
            facts = self._expiry_facts(group)
            expired = offset_expiry.expired_offsets(facts, now, retention_ms)
            goes = offset_expiry.group_expires(facts, expired, now, retention_ms)
            if not expired and not goes:
                continue
            decided = {tp: group.offsets[tp] for tp in expired}
            generation = group.generation
            items: list[tuple[gr.Key, dict[str, Any] | None]] = [
                (gr.OffsetKey(group.group_id, t, p), None) for t, p in expired
            ]
            if goes:
                items.append((gr.GroupKey(group.group_id), None))
            error = await self._write(group.group_id, items)
            if error is not ErrorCode.NONE:
                log.warning("event=offsets_expiry_failed group=%s error=%s", group.group_id, error.name)
                continue
            for tp, om in decided.items():
                if group.offsets.get(tp) is om:  # not committed again while the tombstone was written
                    del group.offsets[tp]
            expired_total += len(expired)
            gone = (
                goes
                and group.state is S.EMPTY
                and not group.offsets
                and not group.pending_txn_offsets  # a transaction committed to it meanwhile
                and group.generation == generation
                and self.groups.get(group.group_id) is group
            )
            if gone:
                group.transition(S.DEAD)
                del self.groups[group.group_id]
            log.info(
                "event=offsets_expired group=%s offsets=%d group_removed=%s state=%s retention_ms=%d",
                group.group_id,
                len(expired),
                str(gone).lower(),
                facts.state,
                retention_ms,
            )
        return expired_total

    @staticmethod
    def _expiry_facts(group: Group) -> offset_expiry.ExpiryFacts:
        subscribed: frozenset[str] | None = None
        if group.protocol_type == offset_expiry.CONSUMER_PROTOCOL_TYPE and group.protocol and group.members:
            topics: set[str] = set()
            for m in group.members.values():
                got = offset_expiry.consumer_subscribed_topics(m.metadata_for(group.protocol))
                if got is None:
                    topics = set()
                    break
                topics |= got
            subscribed = frozenset(topics) if topics else None
        return offset_expiry.ExpiryFacts(
            group.state.value,
            group.protocol_type,
            group.state_timestamp_ms,
            {tp: om.commit_timestamp_ms for tp, om in group.offsets.items()},
            subscribed,
            frozenset(tp for pending in group.pending_txn_offsets.values() for tp in pending),
        )

    def _tick(self) -> None:
        now = asyncio.get_running_loop().time()
        for group in list(self.groups.values()):
            if self.check(group.group_id) is not ErrorCode.NONE:
                continue
            for member_id, expires in list(group.pending_members.items()):
                if now > expires:
                    del group.pending_members[member_id]
            expired = [
                m
                for m in group.members.values()
                if not m.awaiting_join
                and (m.sync_future is None or m.sync_future.done())
                and now - m.last_heartbeat > m.session_timeout_ms / 1000.0
            ]
            for m in expired:
                log.info(
                    "event=member_expired group=%s member=%s client=%s session_timeout_ms=%d",
                    group.group_id,
                    m.member_id,
                    m.client_id,
                    m.session_timeout_ms,
                )
                self._remove_member(group, m)
            if expired and group.state in (S.STABLE, S.COMPLETING_REBALANCE):
                self._prepare_rebalance(group, "member expired")
            if group.state is S.PREPARING_REBALANCE:
                self._maybe_complete_join(group)

    # -- the protocol ------------------------------------------------------------------------------

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        loop_now = asyncio.get_running_loop().time()
        if group.state is S.COMPLETING_REBALANCE:
            for m in group.members.values():
                if m.sync_future is not None and not m.sync_future.done():
                    m.sync_future.set_result(
                        {"error_code": ErrorCode.REBALANCE_IN_PROGRESS, "assignment": b""}
                    )
        was_empty = group.state is S.EMPTY
        group.transition(S.PREPARING_REBALANCE)
        group.rebalance_deadline = loop_now + group.max_rebalance_timeout_ms() / 1000.0
        group.initial_delay_until = loop_now + self.initial_rebalance_delay_s if was_empty else 0.0
        group.initial_join = was_empty
        log.info(
            "event=rebalance_started group=%s generation=%d members=%d reason=%r",
            group.group_id,
            group.generation,
            len(group.members),
            reason,
        )

    def _remove_member(self, group: Group, member: Member) -> None:
        self._fail_futures(member, ErrorCode.UNKNOWN_MEMBER_ID)
        group.members.pop(member.member_id, None)
        if group.leader == member.member_id:
            group.leader = next(iter(group.members), None)

    @staticmethod
    def _fail_futures(member: Member, code: ErrorCode) -> None:
        for fut in (member.join_future, member.sync_future):
            if fut is not None and not fut.done():
                fut.set_result({"error_code": code, "member_id": member.member_id, "assignment": b""})

    def _maybe_complete_join(self, group: Group) -> None:
        if group.state is not S.PREPARING_REBALANCE:
            return
        now = asyncio.get_running_loop().time()
        deadline_passed = now >= group.rebalance_deadline
        if not deadline_passed:
            if now < group.initial_delay_until:
                return
            if not group.all_members_joined():
                return
        for m in [m for m in group.members.values() if not m.awaiting_join]:
            log.info(
                "event=member_removed group=%s member=%s reason=did_not_rejoin_in_time",
                group.group_id,
                m.member_id,
            )
            self._remove_member(group, m)
        group.generation += 1
        if not group.members:
            group.transition(S.EMPTY)
            group.protocol = None
            group.leader = None
            log.info("event=group_empty group=%s generation=%d", group.group_id, group.generation)
            self.broker.spawn(self._persist_group(group))
            return
        group.protocol = group.select_protocol()
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.transition(S.COMPLETING_REBALANCE)
        log.info(
            "event=rebalance_joined group=%s generation=%d protocol=%s leader=%s members=%d",
            group.group_id,
            group.generation,
            group.protocol,
            group.leader,
            len(group.members),
        )
        for m in group.members.values():
            assert m.join_future is not None
            m.join_future.set_result(self._join_response(group, m))
            m.last_heartbeat = now

    def _join_response(self, group: Group, m: Member) -> Body:
        members = []
        if m.member_id == group.leader:
            members = [
                {
                    "member_id": o.member_id,
                    "group_instance_id": o.group_instance_id,
                    "metadata": o.metadata_for(group.protocol or ""),
                }
                for o in group.members.values()
            ]
        return {
            "error_code": ErrorCode.NONE,
            "generation_id": group.generation,
            "protocol_type": group.protocol_type,
            "protocol_name": group.protocol,
            "leader": group.leader or "",
            "member_id": m.member_id,
            "members": members,
        }

    async def join(self, req: Body, version: int, client_id: str, client_host: str) -> Body:
        group_id: str = req["group_id"]
        member_id: str = req["member_id"]
        instance_id: str | None = req.get("group_instance_id") if version >= 5 else None
        error = self.check(group_id)
        if error is not ErrorCode.NONE:
            return {"error_code": error, "member_id": member_id}
        session_ms = int(req["session_timeout_ms"])
        rebalance_ms = int(req.get("rebalance_timeout_ms", -1))
        rebalance_ms = session_ms if rebalance_ms < 0 else rebalance_ms
        if not MIN_SESSION_TIMEOUT_MS <= session_ms <= MAX_SESSION_TIMEOUT_MS:
            return {"error_code": ErrorCode.INVALID_SESSION_TIMEOUT, "member_id": member_id}
        protocols = [(p["name"], bytes(p["metadata"])) for p in req["protocols"]]
        group = self.groups.get(group_id)
        limits = self.broker.config
        if group is None:
            if member_id:
                return {"error_code": ErrorCode.UNKNOWN_MEMBER_ID, "member_id": member_id}
            if len(self.groups) >= limits.group_max_count:
                self._log_group_limit("group_max_count", group_id, len(self.groups), limits.group_max_count)
                return {"error_code": ErrorCode.GROUP_MAX_SIZE_REACHED, "member_id": member_id}
            group = self.groups[group_id] = Group(group_id)
        ruling = sm.join_ruling(group.instance_ids(), set(group.pending_members), member_id, instance_id)
        if ruling.action is JoinAction.REFUSED:
            return {"error_code": ruling.error, "member_id": member_id}
        joining_new = ruling.action is not JoinAction.REPLACE and (
            not member_id or (member_id not in group.members and member_id not in group.pending_members)
        )
        size = len(group.members) + len(group.pending_members)
        if joining_new and size >= limits.group_max_size:
            # Members and members-to-be (KIP-394's pending ids) both count: either is memory a
            # client can make the broker hold.
            self._log_group_limit("group_max_size", group_id, size, limits.group_max_size)
            return {"error_code": ErrorCode.GROUP_MAX_SIZE_REACHED, "member_id": member_id}
        if group.state is S.DEAD:
            return {"error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE, "member_id": member_id}
        if not group.supports(req["protocol_type"], protocols):
            return {"error_code": ErrorCode.INCONSISTENT_GROUP_PROTOCOL, "member_id": member_id}
        loop = asyncio.get_running_loop()
        now = loop.time()
        if ruling.action is JoinAction.REPLACE:
            assert ruling.replaces is not None and instance_id is not None
            return await self._replace_static_member(
                group, ruling.replaces, instance_id, req, version, client_id, client_host
            )
        if not member_id:
            new_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if version >= 4 and instance_id is None:
                # KIP-394: hand out the id first; the member joins with it in a second request
                # (a static member is named by its instance id and joins at once, as in Kafka).
                group.pending_members[new_id] = now + session_ms / 1000.0
                return {"error_code": ErrorCode.MEMBER_ID_REQUIRED, "member_id": new_id}
            member_id = new_id
        elif member_id in group.pending_members:
            del group.pending_members[member_id]
        elif member_id not in group.members:
            return {"error_code": ErrorCode.UNKNOWN_MEMBER_ID, "member_id": member_id}

        existing = group.members.get(member_id)
        follower_of_stable = group.state is S.STABLE and member_id != group.leader
        unchanged_rejoin = (
            existing is not None
            and existing.protocols == protocols
            and (group.state is S.COMPLETING_REBALANCE or follower_of_stable)
        )
        if existing is not None and unchanged_rejoin:
            # A rejoin that changes nothing (a follower, or a lost join response): answer with
            # the current generation instead of starting a rebalance.
            existing.last_heartbeat = now
            return self._join_response(group, existing)
        fut: asyncio.Future[Body] = loop.create_future()
        if existing is not None:
            if existing.join_future is not None and not existing.join_future.done():
                existing.join_future.set_result(
                    {"error_code": ErrorCode.REBALANCE_IN_PROGRESS, "member_id": member_id}
                )
            existing.protocols = protocols
            existing.session_timeout_ms = session_ms
            existing.rebalance_timeout_ms = rebalance_ms
            existing.join_future = fut
            existing.last_heartbeat = now
        else:
            if not group.members:
                group.protocol_type = req["protocol_type"]
            group.members[member_id] = Member(
                member_id=member_id,
                group_instance_id=instance_id,
                client_id=client_id or "",
                client_host=client_host,
                session_timeout_ms=session_ms,
                rebalance_timeout_ms=rebalance_ms,
                protocol_type=req["protocol_type"],
                protocols=protocols,
                join_future=fut,
                last_heartbeat=now,
            )
            log.info(
                "event=member_joined group=%s member=%s instance=%s client=%s host=%s",
                group_id,
                member_id,
                instance_id,
                client_id,
                client_host,
            )
        if group.state is not S.PREPARING_REBALANCE:
            self._prepare_rebalance(group, f"member {member_id} joined")
        else:
            group.rebalance_deadline = max(group.rebalance_deadline, now + rebalance_ms / 1000.0)
        self._maybe_complete_join(group)
        return await fut

    async def _replace_static_member(
        self,
        group: Group,
        old_id: str,
        instance_id: str,
        req: Body,
        version: int,
        client_id: str,
        client_host: str,
    ) -> Body:
        """KIP-345: a JoinGroup without a member id for an instance the group has. The new
        member id takes the old one's place and assignment, and the old one is fenced; then
        ``rejoin_outcome`` says whether the group must rebalance. A Stable group whose protocol
        would not change answers at once with the current generation (and the group written with
        the new member id first), so no other member notices the restart."""
        loop = asyncio.get_running_loop()
        member = group.members[old_id]
        previous_leader = group.leader
        before = (member.protocols, member.session_timeout_ms, member.rebalance_timeout_ms)
        new_id = f"{client_id or 'member'}-{uuid.uuid4()}"
        # whatever the replaced process was waiting on ends: it is fenced, as are its next requests
        self._fail_futures(member, ErrorCode.FENCED_INSTANCE_ID)
        group.rename_member(old_id, new_id)
        session_ms = int(req["session_timeout_ms"])
        rebalance_ms = int(req.get("rebalance_timeout_ms", -1))
        member.protocols = [(p["name"], bytes(p["metadata"])) for p in req["protocols"]]
        member.session_timeout_ms = session_ms
        member.rebalance_timeout_ms = session_ms if rebalance_ms < 0 else rebalance_ms
        member.client_id, member.client_host = client_id or "", client_host
        member.last_heartbeat = loop.time()
        outcome = sm.rejoin_outcome(group.state, group.protocol, group.select_protocol())
        log.info(
            "event=static_member_replaced group=%s instance=%s old_member=%s member=%s outcome=%s",
            group.group_id,
            instance_id,
            old_id,
            new_id,
            outcome.value,
        )
        if outcome is RejoinOutcome.KEEP_ASSIGNMENT:
            generation = group.generation
            write_error = await self._persist_group(group)
            if write_error is not ErrorCode.NONE:
                if group.members.get(new_id) is member:  # undo: the old member id stays the group's
                    group.rename_member(new_id, old_id)
                    member.protocols, member.session_timeout_ms, member.rebalance_timeout_ms = before
                return {"error_code": write_error, "member_id": ""}
            leads = previous_leader == old_id
            skip = leads and version >= 9
            # Below v9 the previous leader's id is answered, so a restarted leader does not take
            # itself for one and assign while the group is Stable (a Stable group would not hand
            # out what it assigned); v9 says so with SkipAssignment (KIP-814).
            return {
                "error_code": ErrorCode.NONE,
                "generation_id": generation,
                "protocol_type": group.protocol_type,
                "protocol_name": group.protocol,
                "leader": new_id if skip else (previous_leader or ""),
                "skip_assignment": skip,
                "member_id": new_id,
                "members": self._join_response(group, member)["members"] if skip else [],
            }
        fut: asyncio.Future[Body] = loop.create_future()
        member.join_future = fut
        if outcome is RejoinOutcome.REBALANCE:
            self._prepare_rebalance(group, f"static member {instance_id} rejoined as {new_id}")
        else:
            group.rebalance_deadline = max(
                group.rebalance_deadline, loop.time() + member.rebalance_timeout_ms / 1000.0
            )
        self._maybe_complete_join(group)
        return await fut

    def _log_group_limit(self, limit: str, group_id: str, current: int, maximum: int) -> None:
        now = time.monotonic()
        if now - self._limit_logged_at < 1.0:  # a client retrying in a loop logs once a second
            return
        self._limit_logged_at = now
        log.warning(
            "event=join_refused group=%s limit=%s current=%d max=%d error=GROUP_MAX_SIZE_REACHED "
            "action='raise %s if this is expected'",
            group_id,
            limit,
            current,
            maximum,
            limit.replace("_", "."),
        )

    async def sync(self, req: Body) -> Body:
        group_id, member_id, generation = req["group_id"], req["member_id"], req["generation_id"]
        error = self.check(group_id)
        if error is not ErrorCode.NONE:
            return {"error_code": error}
        group = self.groups.get(group_id)
        if group is None:
            return {"error_code": ErrorCode.UNKNOWN_MEMBER_ID}
        member_error = sm.member_error(group.instance_ids(), member_id, req.get("group_instance_id"))
        if member_error is not ErrorCode.NONE:
            return {"error_code": member_error}
        if generation != group.generation:
            return {"error_code": ErrorCode.ILLEGAL_GENERATION}
        if req.get("protocol_type") not in (None, group.protocol_type) or req.get("protocol_name") not in (
            None,
            group.protocol,
        ):
            return {"error_code": ErrorCode.INCONSISTENT_GROUP_PROTOCOL}
        member = group.members[member_id]
        member.last_heartbeat = asyncio.get_running_loop().time()
        if group.state is S.PREPARING_REBALANCE:
            return {"error_code": ErrorCode.REBALANCE_IN_PROGRESS}
        if group.state is S.STABLE:
            return self._sync_response(group, member)
        if group.state is not S.COMPLETING_REBALANCE:
            return {"error_code": ErrorCode.UNKNOWN_MEMBER_ID}
        fut: asyncio.Future[Body] = asyncio.get_running_loop().create_future()
        member.sync_future = fut
        if member_id == group.leader:
            assignments = {a["member_id"]: bytes(a["assignment"]) for a in req["assignments"]}
            for m in group.members.values():
                m.assignment = assignments.get(m.member_id, b"")
            write_error = await self._persist_group(group)
            if group.state is not S.COMPLETING_REBALANCE or group.generation != generation:
                pass  # a new rebalance began while writing; its own outcome answers the members
            elif write_error is not ErrorCode.NONE:
                for m in group.members.values():
                    if m.sync_future is not None and not m.sync_future.done():
                        m.sync_future.set_result({"error_code": write_error, "assignment": b""})
                self._prepare_rebalance(group, f"group state could not be written: {write_error.name}")
            else:
                group.transition(S.STABLE)
                log.info(
                    "event=rebalance_completed group=%s generation=%d members=%d",
                    group.group_id,
                    group.generation,
                    len(group.members),
                )
                for m in group.members.values():
                    if m.sync_future is not None and not m.sync_future.done():
                        m.sync_future.set_result(self._sync_response(group, m))
        return await fut

    @staticmethod
    def _sync_response(group: Group, member: Member) -> Body:
        return {
            "error_code": ErrorCode.NONE,
            "protocol_type": group.protocol_type,
            "protocol_name": group.protocol,
            "assignment": member.assignment,
        }

    def heartbeat(self, req: Body) -> ErrorCode:
        group_id, member_id = req["group_id"], req["member_id"]
        error = self.check(group_id)
        if error is not ErrorCode.NONE:
            return error
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        member_error = sm.member_error(group.instance_ids(), member_id, req.get("group_instance_id"))
        if member_error is not ErrorCode.NONE:
            return member_error
        if req["generation_id"] != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        group.members[member_id].last_heartbeat = asyncio.get_running_loop().time()
        if group.state is S.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave(
        self, group_id: str, members: Iterable[tuple[str, str | None]]
    ) -> tuple[ErrorCode, list[ErrorCode]]:
        """LeaveGroup: each (member id, group.instance.id) named, in order, with its answer. A
        member named by instance id alone (v3+, KIP-345) is the instance's current member."""
        error = self.check(group_id)
        if error is not ErrorCode.NONE:
            return error, []
        group = self.groups.get(group_id)
        results: list[ErrorCode] = []
        removed = forgot = False
        for member_id, instance_id in members:
            if group is None:
                results.append(ErrorCode.UNKNOWN_MEMBER_ID)
                continue
            ruling = sm.leave_ruling(group.instance_ids(), set(group.pending_members), member_id, instance_id)
            if ruling.forget_pending is not None:
                # a rebalance may have been waiting for it (Group.all_members_joined)
                forgot = group.pending_members.pop(ruling.forget_pending, None) is not None or forgot
            member = group.members.get(ruling.remove) if ruling.remove is not None else None
            if member is not None:
                log.info(
                    "event=member_left group=%s member=%s instance=%s",
                    group_id,
                    member.member_id,
                    instance_id,
                )
                self._remove_member(group, member)
                removed = True
            results.append(ruling.error)
        if group is not None and removed:
            if group.state in (S.STABLE, S.COMPLETING_REBALANCE):
                self._prepare_rebalance(group, "member left")
            self._maybe_complete_join(group)
        elif group is not None and forgot:
            self._maybe_complete_join(group)
        return ErrorCode.NONE, results

    # -- offsets -----------------------------------------------------------------------------------

    async def commit_offsets(self, req: Body) -> dict[tuple[str, int], ErrorCode]:
        group_id = req["group_id"]
        generation = req.get("generation_id_or_member_epoch", -1)
        member_id = req.get("member_id", "")
        wanted = [(t["name"], p) for t in req["topics"] for p in t["partitions"]]
        error = self.check(group_id)
        if error is ErrorCode.NONE:
            error = self._commit_allowed(group_id, generation, member_id, req.get("group_instance_id"))
        if error is not ErrorCode.NONE:
            return {(topic, p["partition_index"]): error for topic, p in wanted}
        results: dict[tuple[str, int], ErrorCode] = {}
        values: dict[tuple[str, int], OffsetAndMetadata] = {}
        now_ms = int(time.time() * 1000)
        for topic, p in wanted:
            tp = (topic, p["partition_index"])
            metadata = p.get("committed_metadata")
            if metadata is not None and len(metadata.encode()) > OFFSET_METADATA_MAX_BYTES:
                results[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
                continue
            om = OffsetAndMetadata(
                int(p["committed_offset"]), int(p.get("committed_leader_epoch", -1)), metadata, now_ms
            )
            values[tp] = om
        items = _offset_records(group_id, values)  # one a partition, in the order of ``values``
        if items:
            write_error, at = self._append(group_id, items)
            for om, record_offset in zip(values.values(), at, strict=False):  # at: short if refused
                om.record_offset = record_offset
            if write_error is ErrorCode.NONE:
                write_error = await self._committed(group_id, at[-1])
            group = self.groups.setdefault(group_id, Group(group_id))
            for tp, om in values.items():
                results[tp] = write_error
                if write_error is ErrorCode.NONE:
                    # Unless a newer record committed it meanwhile (a transaction's, applied at
                    # its marker): memory keeps what a coordinator loading the log would.
                    commit_offset(group.offsets, tp, om)
        return results

    async def commit_txn_offsets(self, req: Body) -> dict[tuple[str, int], ErrorCode]:
        """TxnOffsetCommit: the offsets are written as the producer's transactional records and
        held apart (``Group.pending_txn_offsets``) until the transaction's marker reaches this
        partition (``on_txn_marker``). Kafka's member checks apply when the request names a
        member or a generation (version 3, KIP-447)."""
        group_id = req["group_id"]
        wanted = [(t["name"], p) for t in req["topics"] for p in t["partitions"]]
        error = self.check(group_id)
        guard: VerificationGuard | None = None
        if error is ErrorCode.NONE and wanted:
            # KIP-890 part 1: the offsets open the producer's transaction on the group's
            # partition only if its coordinator says the transaction added it (AddOffsetsToTxn):
            # else they would be a transaction no coordinator ends, holding the partition's last
            # stable offset and the group's require_stable fetches for good.
            error, guard = await self._verify_txn_offsets(req)
        group = self.groups.get(group_id)
        if error is ErrorCode.NONE and group is not None:
            member_id, generation = req.get("member_id") or "", req.get("generation_id", -1)
            if group.state is S.DEAD:
                error = ErrorCode.COORDINATOR_NOT_AVAILABLE
            elif member_id and member_id not in group.members:
                error = ErrorCode.UNKNOWN_MEMBER_ID
            elif generation >= 0 and generation != group.generation:
                error = ErrorCode.ILLEGAL_GENERATION
        if error is not ErrorCode.NONE:
            return {(topic, p["partition_index"]): error for topic, p in wanted}
        results: dict[tuple[str, int], ErrorCode] = {}
        values: dict[tuple[str, int], OffsetAndMetadata] = {}
        now_ms = int(time.time() * 1000)
        for topic, p in wanted:
            tp = (topic, p["partition_index"])
            metadata = p.get("committed_metadata")
            if metadata is not None and len(metadata.encode()) > OFFSET_METADATA_MAX_BYTES:
                results[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
                continue
            om = OffsetAndMetadata(
                int(p["committed_offset"]), int(p.get("committed_leader_epoch", -1)), metadata, now_ms
            )
            values[tp] = om
        items = _offset_records(group_id, values)  # one a partition, in the order of ``values``
        if items:
            producer_id = int(req["producer_id"])
            write_error, at = self._append(
                group_id,
                items,
                producer_id=producer_id,
                producer_epoch=int(req["producer_epoch"]),
                verification=guard,
            )
            # Pending from the append on, in the same step of the event loop, not from its
            # commit (Kafka's prepareTxnOffsetCommit): an expiry pass deciding while the record
            # waits for the followers must skip these partitions, or its tombstone lands after
            # the record and wins at compaction. Only what is in the log: a refused append left
            # nothing for the marker to apply. A write that times out stays pending: its record
            # is in the log, so its marker decides, as a coordinator loading the log would.
            if at:
                group = self.groups.setdefault(group_id, Group(group_id))
                pending = group.pending_txn_offsets.setdefault(producer_id, {})
                for (tp, om), record_offset in zip(values.items(), at, strict=False):
                    om.record_offset = record_offset
                    pending[tp] = om
            if write_error is ErrorCode.NONE:
                write_error = await self._committed(group_id, at[-1])
            for tp in values:
                results[tp] = write_error
        return results

    async def _verify_txn_offsets(self, req: Body) -> tuple[ErrorCode, VerificationGuard | None]:
        """The verification guard of a TxnOffsetCommit's producer on the group's partition (None:
        its transaction is open there already), once the transaction coordinator confirmed the
        transaction added the partition; else the error to answer (Kafka's)."""
        p = self.partition_for(req["group_id"])
        producer_id, producer_epoch = int(req["producer_id"]), int(req["producer_epoch"])
        guard, error = self.broker.replicas.begin_txn_verification(OFFSETS_TOPIC, p, producer_id)
        if error is not ErrorCode.NONE:
            return txn_verification.txn_offset_commit_answer(error), None
        if guard is None:
            return ErrorCode.NONE, None
        verdict = await self.broker.txn_verifier.verify(
            req["transactional_id"], producer_id, producer_epoch, [(OFFSETS_TOPIC, p)]
        )
        error = verdict[(OFFSETS_TOPIC, p)]
        if error is not ErrorCode.NONE:
            return txn_verification.txn_offset_commit_answer(error), None
        error = self.check(req["group_id"])  # the await may have seen this broker resign
        return error, guard if error is ErrorCode.NONE else None

    def on_txn_marker(self, p: int, producer_id: int, committed: bool) -> None:
        """A transaction's marker is committed on ``__consumer_offsets``-``p``: the offsets it
        committed to this partition's groups apply (COMMIT; each unless a record newer than its
        own committed or deleted that partition meanwhile, ``group.complete_txn``, the rule
        ``_load`` follows) or are dropped (ABORT)."""
        status = self.owned.get(p)
        if status is None:
            return  # not this partition's coordinator: the next one's load replays the marker
        if status == "loading":
            self._markers_while_loading.setdefault(p, []).append((producer_id, committed))
            return
        for group in self.groups.values():
            if producer_id in group.pending_txn_offsets and self.partition_for(group.group_id) == p:
                n = group.complete_txn_offsets(producer_id, committed)
                log.info(
                    "event=txn_offsets_%s group=%s producer_id=%d partitions=%d",
                    "committed" if committed else "aborted",
                    group.group_id,
                    producer_id,
                    n,
                )

    def _commit_allowed(
        self, group_id: str, generation: int, member_id: str, instance_id: str | None = None
    ) -> ErrorCode:
        group = self.groups.get(group_id)
        if generation < 0 and not member_id and instance_id is None:
            # A commit from outside the group protocol (assign()-style consumers, tools): only
            # while no member could be committing for the same partitions.
            if group is not None and group.members:
                return ErrorCode.UNKNOWN_MEMBER_ID
            return ErrorCode.NONE
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        member_error = sm.member_error(group.instance_ids(), member_id, instance_id)
        if member_error is not ErrorCode.NONE:
            return member_error
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        if group.state is S.COMPLETING_REBALANCE:
            # While preparing a rebalance, members of the current generation may still commit
            # what they processed (clients commit on revocation); only once the new generation
            # is formed are the old one's commits refused.
            return ErrorCode.REBALANCE_IN_PROGRESS
        group.members[member_id].last_heartbeat = asyncio.get_running_loop().time()
        return ErrorCode.NONE

    def unstable_offsets(self, group_id: str) -> set[tuple[str, int]]:
        """The group's partitions with a transactional commit awaiting its marker: an
        OffsetFetch asking for stable offsets (KIP-447) is answered UNSTABLE_OFFSET_COMMIT for
        them, so a new owner does not start from an offset a transaction may still move."""
        group = self.groups.get(group_id)
        if group is None:
            return set()
        return {tp for pending in group.pending_txn_offsets.values() for tp in pending}

    def fetch_offsets(
        self, group_id: str, topics: list[tuple[str, list[int]]] | None
    ) -> tuple[ErrorCode, dict[str, list[tuple[int, OffsetAndMetadata | None]]]]:
        error = self.check(group_id)
        if error is not ErrorCode.NONE:
            return error, {}
        group = self.groups.get(group_id)
        offsets = group.offsets if group else {}
        out: dict[str, list[tuple[int, OffsetAndMetadata | None]]] = {}
        if topics is None:
            for (topic, p), om in sorted(offsets.items()):
                out.setdefault(topic, []).append((p, om))
        else:
            for topic, partitions in topics:
                out[topic] = [(p, offsets.get((topic, p))) for p in partitions]
        return ErrorCode.NONE, out

    # -- administration ----------------------------------------------------------------------------

    def describe(self, group_id: str) -> Body:
        error = self.check(group_id)
        if error is not ErrorCode.NONE:
            return {
                "error_code": error,
                "group_id": group_id,
                "group_state": "",
                "protocol_type": "",
                "protocol_data": "",
                "members": [],
            }
        group = self.groups.get(group_id)
        if group is None:
            return {
                "error_code": ErrorCode.NONE,
                "group_id": group_id,
                "group_state": S.DEAD.value,
                "protocol_type": "",
                "protocol_data": "",
                "members": [],
            }
        return {
            "error_code": ErrorCode.NONE,
            "group_id": group_id,
            "group_state": group.state.value,
            "protocol_type": group.protocol_type or "",
            "protocol_data": group.protocol or "",
            "members": [
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.group_instance_id,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "member_metadata": m.metadata_for(group.protocol or ""),
                    "member_assignment": m.assignment if group.state is S.STABLE else b"",
                }
                for m in group.members.values()
            ],
        }

    def list_groups(self, states: list[str]) -> list[Body]:
        wanted = {s.lower() for s in states}
        out = []
        for group in sorted(self.groups.values(), key=lambda g: g.group_id):
            if self.check(group.group_id) is not ErrorCode.NONE:
                continue
            if wanted and group.state.value.lower() not in wanted:
                continue
            out.append(
                {
                    "group_id": group.group_id,
                    "protocol_type": group.protocol_type or "",
                    "group_state": group.state.value,
                }
            )
        return out

    async def delete_offsets(self, group_id: str, partitions: Iterable[tuple[str, int]]) -> ErrorCode:
        """Delete a group's committed offsets of ``partitions`` (OffsetDelete: the caller decided
        which, ``admin_groups.offset_deletion``): tombstones first, then from memory."""
        error = self.check(group_id)
        if error is not ErrorCode.NONE:
            return error
        keys = list(dict.fromkeys(partitions))
        items: list[tuple[gr.Key, dict[str, Any] | None]] = [
            (gr.OffsetKey(group_id, topic, p), None) for topic, p in keys
        ]
        error, at = self._append(group_id, items)
        if error is ErrorCode.NONE and at:
            error = await self._committed(group_id, at[-1])
        group = self.groups.get(group_id)
        if error is ErrorCode.NONE and group is not None:
            for tp, record_offset in zip(keys, at, strict=True):
                # The committed offset and the pending transactional ones written before the
                # tombstone: their marker must apply nothing, as the cleaner keeps the tombstone.
                delete_offset(group.offsets, group.pending_txn_offsets, tp, record_offset)
            log.info("event=group_offsets_deleted group=%s partitions=%d", group_id, len(keys))
        return error

    async def delete_group(self, group_id: str) -> ErrorCode:
        error = self.check(group_id)
        if error is not ErrorCode.NONE:
            return error
        group = self.groups.get(group_id)
        if group is None or (group.state is S.EMPTY and not group.offsets and group.generation == 0):
            return ErrorCode.GROUP_ID_NOT_FOUND
        if group.state is not S.EMPTY:
            return ErrorCode.NON_EMPTY_GROUP
        # A tombstone for each partition a pending transaction wrote too (Kafka's
        # deleteAllOffsets): the group leaves memory, so its marker applies nothing here, and a
        # coordinator loading the log must not apply it either and bring the group back.
        pending = (tp for offsets in group.pending_txn_offsets.values() for tp in offsets)
        items: list[tuple[gr.Key, dict[str, Any] | None]] = [
            (gr.OffsetKey(group_id, t, p), None) for (t, p) in dict.fromkeys([*group.offsets, *pending])
        ]
        items.append((gr.GroupKey(group_id), None))
        write_error = await self._write(group_id, items)
        if write_error is ErrorCode.NONE:
            group.transition(S.DEAD)
            del self.groups[group_id]
            log.info("event=group_deleted group=%s", group_id)
        return write_error


def _offset_records(
    group_id: str, values: dict[tuple[str, int], OffsetAndMetadata]
) -> list[tuple[gr.Key, dict[str, Any] | None]]:
    return [
        (
            gr.OffsetKey(group_id, topic, partition),
            gr.offset_value(om.offset, om.leader_epoch, om.metadata, om.commit_timestamp_ms),
        )
        for (topic, partition), om in values.items()
    ]


def _offset_from_record(value: bytes | None, record_offset: int) -> OffsetAndMetadata | None:
    obj = gr.decode_value(value)
    if obj is None:
        return None
    return OffsetAndMetadata(
        int(obj["offset"]),
        int(obj.get("leader_epoch", -1)),
        obj.get("metadata"),
        int(obj.get("commit_ts", 0)),
        record_offset,
    )
