"""One partition replica on this broker: its log, its leadership and its high watermark.

Runs on the broker's event loop. The high watermark rules (I3) live in ``high_watermark_for``,
a pure function, so that they can be tested without a broker.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from sluice import metrics
from sluice.broker.replication import can_join_isr, followers_out_of_sync, high_watermark_for
from sluice.storage.config import LogConfig
from sluice.storage.fsutil import atomic_write
from sluice.storage.log import AppendInfo, PartitionLog, ReadResult
from sluice.storage.producer_state import VerificationGuard

log = logging.getLogger("sluice.partition")

METADATA_FILE = "partition.metadata"


HW_FILE = "high-watermark"
#: Length of a partition's waiter list past which finished waiters are dropped.
WAITERS_PRUNE_MIN = 16


def read_high_watermark(directory: Path) -> int:
    """The checkpointed high watermark, 0 when there is none (or it cannot be read)."""
    try:
        return max(0, int((directory / HW_FILE).read_text().strip() or "0"))
    except (OSError, ValueError):
        return 0


#: Suffixes of partition directories moved out of the way (as Kafka names them): "-delete" for a
#: log of a deleted topic, removed right after the rename; "-stray" for a log whose topic cannot
#: be told, kept for an operator and never served.
DELETE_SUFFIX = "-delete"
STRAY_SUFFIX = "-stray"


class LocalLog(Enum):
    """What to do with a partition directory found on disk."""

    KEEP = "keep"
    DELETE = "delete"
    STRAY = "stray"


def local_log_action(
    found_topic_id: uuid.UUID | None, topic_id: uuid.UUID | None, has_records: bool
) -> LocalLog:
    """Whether a partition directory on disk is the log of the topic now in ZooKeeper.

    ``found_topic_id`` is the id in the directory's ``partition.metadata``, ``topic_id`` the
    topic's id in ZooKeeper (None: no such topic now). A topic deleted and created again under
    the same name has a new id: the old log must never be served as the new one's (its offsets
    would start where the old topic's ended, and readers would get records of a deleted topic).
    A log with records but no readable id cannot be told apart from one of an earlier topic; it
    is not served but kept aside, since it may be the only copy of something.
    """
    if topic_id is None or (found_topic_id is not None and found_topic_id != topic_id):
        return LocalLog.DELETE
    if found_topic_id is None and has_records:
        return LocalLog.STRAY
    return LocalLog.KEEP


def set_aside(directory: Path, action: LocalLog) -> Path:
    """Rename a partition directory out of the way (``<topic>-<p>.<uuid>-delete`` or ``-stray``)
    and, for a deletion, remove it. The rename is atomic: a crash leaves either the directory
    as it was or one no partition is ever opened from (start-up finishes such deletions)."""
    assert action is not LocalLog.KEEP
    suffix = DELETE_SUFFIX if action is LocalLog.DELETE else STRAY_SUFFIX
    target = directory.with_name(f"{directory.name}.{uuid.uuid4().hex}{suffix}")
    directory.rename(target)
    if action is LocalLog.DELETE:
        shutil.rmtree(target, ignore_errors=True)
    return target


def has_records(directory: Path) -> bool:
    return any(p.stat().st_size > 0 for p in directory.glob("*.log"))


def partition_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def parse_partition_dir_name(name: str) -> tuple[str, int] | None:
    topic, sep, p = name.rpartition("-")
    if not sep or not topic or not p.isdigit():
        return None
    return topic, int(p)


@dataclass
class Partition:
    topic: str
    index: int
    topic_id: uuid.UUID
    log: PartitionLog
    config: Mapping[str, str]
    broker_id: int
    is_leader: bool = False
    leader_epoch: int = -1
    isr: tuple[int, ...] = ()
    replicas: tuple[int, ...] = ()
    high_watermark: int = 0
    #: leader only: each follower's log end offset, as its last fetch told us.
    follower_leos: dict[int, int] = field(default_factory=dict)
    #: leader only: when each follower last had everything the leader had (monotonic ms).
    follower_caught_up_ms: dict[int, float] = field(default_factory=dict)
    #: leader only: the leader's LEO and clock at each follower's previous fetch.
    follower_last_fetch: dict[int, tuple[int, float]] = field(default_factory=dict)
    #: leader only: each follower's log start offset, as its fetches named it (DeleteRecords
    #: waits until every live replica's start has passed the deleted records).
    follower_log_starts: dict[int, int] = field(default_factory=dict)
    #: leader only: followers whose addition to the ISR is being written to ZooKeeper. Until the
    #: write completes they count for the high watermark but not for min.insync.replicas
    #: (KIP-497's maximal ISR), so the high watermark cannot pass a replica about to join.
    joining: frozenset[int] = frozenset()
    #: follower only: the broker this replica fetches from, and whether it must truncate first.
    leader_id: int = -1
    needs_truncation: bool = False
    #: the znode version of the partition state this broker last acted on (for ISR writes).
    state_version: int = -1
    _waiters: list[asyncio.Future[None]] = field(default_factory=list)
    _waiters_prune_at: int = WAITERS_PRUNE_MIN
    _checkpointed_hw: int = -1

    @classmethod
    def open(
        cls,
        root: Path,
        topic: str,
        index: int,
        topic_id: uuid.UUID,
        config: Mapping[str, str],
        broker_id: int,
        *,
        clean: bool | None = None,
        defaults: LogConfig | None = None,
    ) -> Partition:
        """Open (creating, or recovering) the replica's log. ``clean``: whether the broker's data
        directory was closed cleanly (None: the log's own marker says; see PartitionLog.open).
        ``defaults``: the broker's settings for what the topic's config does not set."""
        directory = root / partition_dir_name(topic, index)
        if directory.exists():
            found = cls.read_topic_id(directory)
            action = local_log_action(found, topic_id, has_records(directory))
            if action is not LocalLog.KEEP:
                moved = set_aside(directory, action)
                log.log(
                    logging.INFO if action is LocalLog.DELETE else logging.WARNING,
                    "event=stale_log_%s partition=%s-%d found_topic_id=%s topic_id=%s moved_to=%s%s",
                    "deleted" if action is LocalLog.DELETE else "set_aside",
                    topic,
                    index,
                    found,
                    topic_id,
                    moved.name,
                    ""
                    if action is LocalLog.DELETE
                    else " note='not served; the replica starts empty and copies the leader; "
                    "delete the directory once it is known to hold nothing needed'",
                )
        # A new replica's files, its metadata among them, become durable at its log's first
        # flush (PartitionLog.open): creating thousands of partitions is bound by fsyncs, and an
        # empty log holds nothing that one would keep.
        new = not directory.exists()
        directory.mkdir(parents=True, exist_ok=True)
        metadata = f"version: 0\ntopic_id: {topic_id}\n".encode()
        deferred: dict[str, bytes] = {}
        if new:
            # Written with the log's first record (PartitionLog.open): until then the directory
            # holds no record, and a directory without an id and without records is opened as
            # this topic's (local_log_action), which an empty log is.
            deferred[METADATA_FILE] = metadata
        else:
            atomic_write(directory / METADATA_FILE, metadata, durable=True)
            assert cls.read_topic_id(directory) == topic_id
        log_config = LogConfig.from_topic_config(dict(config), base=defaults)
        plog = PartitionLog.open(directory, log_config, new=new, clean=clean, deferred_files=deferred)
        part = cls(topic, index, topic_id, plog, config, broker_id)
        # Start from the last checkpointed high watermark, never from the log end: records past
        # it may never have been committed, and exposing them could move what consumers saw
        # backwards after a failover (I3). A leader whose ISR is only itself reaches its log
        # end as soon as it takes over.
        part.high_watermark = min(read_high_watermark(directory), plog.log_end_offset)
        part._checkpointed_hw = part.high_watermark
        return part

    def checkpoint_high_watermark(self) -> None:
        """Persist the high watermark (called periodically and on close)."""
        if self.high_watermark != self._checkpointed_hw:
            atomic_write(self.log.directory / HW_FILE, f"{self.high_watermark}\n".encode(), durable=False)
            self._checkpointed_hw = self.high_watermark

    @staticmethod
    def read_topic_id(directory: Path) -> uuid.UUID | None:
        try:
            for line in (directory / METADATA_FILE).read_text().splitlines():
                key, _, value = line.partition(":")
                if key.strip() == "topic_id":
                    return uuid.UUID(value.strip())
        except (OSError, ValueError):
            return None
        return None

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.index}"

    @property
    def min_insync_replicas(self) -> int:
        return self.log.config.min_insync_replicas

    # -- leadership ------------------------------------------------------------------------------

    def become_leader(
        self, leader_epoch: int, isr: tuple[int, ...], replicas: tuple[int, ...], now_ms: float
    ) -> None:
        assert leader_epoch >= self.leader_epoch, (self.name, leader_epoch, self.leader_epoch)
        self.is_leader = True
        self.leader_id = self.broker_id
        self.needs_truncation = False
        self.leader_epoch = leader_epoch
        self.isr = isr
        self.replicas = replicas
        self.joining = frozenset()
        self.follower_leos = {}
        self.follower_last_fetch = {}
        self.follower_log_starts = {}
        # Every ISR member starts with a full lag allowance under the new leader.
        self.follower_caught_up_ms = {r: now_ms for r in isr if r != self.broker_id}
        if self.log.latest_epoch() < leader_epoch:
            self.log.assign_epoch(leader_epoch, self.log.log_end_offset)
        self._update_high_watermark()
        log.info(
            "event=became_leader partition=%s leader_epoch=%d isr=%s leo=%d hw=%d",
            self.name,
            leader_epoch,
            list(isr),
            self.log.log_end_offset,
            self.high_watermark,
        )

    def become_follower(self, leader: int, leader_epoch: int, replicas: tuple[int, ...]) -> None:
        self.is_leader = False
        self.leader_id = leader
        self.needs_truncation = True
        self.leader_epoch = leader_epoch
        self.replicas = replicas
        self.joining = frozenset()
        self.follower_leos = {}
        log.info(
            "event=became_follower partition=%s leader=%d leader_epoch=%d", self.name, leader, leader_epoch
        )
        self._notify()

    # -- data path -------------------------------------------------------------------------------

    def append(
        self, records: bytes | memoryview, verification: VerificationGuard | None = None
    ) -> AppendInfo:
        assert self.is_leader
        info = self.log.append_as_leader(records, leader_epoch=self.leader_epoch, verification=verification)
        if not info.duplicate:
            self._notify()  # wake followers' fetches
            self._update_high_watermark()
        return info

    def append_as_follower(self, records: bytes | memoryview, leader_hw: int) -> None:
        assert not self.is_leader
        if records:
            self.log.append_as_follower(records)
        # A follower's high watermark trails the leader's and never passes its own log end.
        hw = max(self.high_watermark, min(leader_hw, self.log.log_end_offset))
        if hw != self.high_watermark:
            self.high_watermark = hw
            self.log.last_stable_offset(hw)  # forgets transactions whose markers are now below it
            self._notify()  # consumers reading from this follower (KIP-392) wait on its HW

    def truncate_to(self, offset: int) -> None:
        if offset < self.log.log_end_offset:
            log.info(
                "event=log_truncated partition=%s from=%d to=%d leader_epoch=%d",
                self.name,
                self.log.log_end_offset,
                offset,
                self.leader_epoch,
            )
            self.log.truncate_to(offset)
        self.high_watermark = min(self.high_watermark, self.log.log_end_offset)

    # -- the log start (DeleteRecords, KIP-107) -------------------------------------------------

    def delete_records_before(self, offset: int) -> bool:
        """Leader: move the log start to ``offset`` (at most the high watermark: only committed
        records are deleted). Followers learn it from their next fetch, which this wakes."""
        assert self.is_leader and offset <= self.high_watermark, (self.name, offset, self.high_watermark)
        moved = self.log.advance_log_start(offset)
        if moved:
            log.info(
                "event=log_start_moved partition=%s log_start=%d hw=%d reason=delete_records",
                self.name,
                offset,
                self.high_watermark,
            )
            self._notify()
        return moved

    def follow_log_start(self, leader_log_start: int) -> None:
        """Follower: move the log start with the leader's (never past this replica's own high
        watermark, which only the leader's committed records reach)."""
        target = min(leader_log_start, self.high_watermark)
        if target > self.log.log_start_offset and self.log.advance_log_start(target):
            log.info("event=log_start_moved partition=%s log_start=%d reason=leader", self.name, target)

    def record_follower_log_start(self, replica: int, log_start: int) -> None:
        if self.is_leader and log_start >= 0:
            self.follower_log_starts[replica] = log_start

    def low_watermark(self, live: Collection[int]) -> int:
        """The lowest log start of the live replicas (Kafka's lowWatermarkIfLeader); -1 while a
        live follower's is not known yet."""
        low = self.log.log_start_offset
        for r in self.replicas:
            if r != self.broker_id and r in live:
                low = min(low, self.follower_log_starts.get(r, -1))
        return low

    # -- the leader's view of its followers ------------------------------------------------------

    def record_follower_fetch(self, replica: int, fetch_offset: int, now_ms: float) -> None:
        """A follower fetched from ``fetch_offset``: it has everything below it."""
        leo = self.log.log_end_offset
        has = min(fetch_offset, leo)
        moved = self.follower_leos.get(replica) != has
        self.follower_leos[replica] = has
        prev = self.follower_last_fetch.get(replica)
        if fetch_offset >= leo:
            self.follower_caught_up_ms[replica] = now_ms
        elif prev is not None and fetch_offset >= prev[0]:
            # It has what we had at its previous fetch, so it was caught up then.
            self.follower_caught_up_ms[replica] = max(self.follower_caught_up_ms.get(replica, 0.0), prev[1])
        self.follower_last_fetch[replica] = (leo, now_ms)
        if moved:
            # The high watermark depends on the followers' ends only through this; the leader's
            # own appends and ISR changes update it where they happen.
            self._update_high_watermark()

    def quiet_mark(self, replica: int, fetch_offset: int) -> tuple[object, ...] | None:
        """What a follower's fetch at ``fetch_offset`` found, when it left nothing to do: the
        follower has the whole log, is in the ISR, and there is nothing to send. While the mark
        stays the same, the same fetch would find the same (no record, watermark, log start,
        leadership, ISR or replica change), so ``refresh_quiet_follower`` may stand in for it."""
        leo = self.log.log_end_offset
        if (
            not self.is_leader
            or fetch_offset != leo
            or replica not in self.isr
            or replica not in self.replicas
            or self.follower_leos.get(replica) != leo
        ):
            return None
        return (
            self.leader_epoch,
            leo,
            self.high_watermark,
            self.log.log_start_offset,
            self.isr,
            self.replicas,
        )

    def refresh_quiet_follower(self, replica: int, mark: tuple[object, ...], now_ms: float) -> bool:
        """A follower fetched again where its last fetch left ``mark``: if nothing changed since,
        record it as caught up (all ``record_follower_fetch`` would do) and say so; otherwise
        the fetch must be read in full."""
        leo = mark[1]
        assert isinstance(leo, int)
        if self.quiet_mark(replica, leo) != mark:
            return False
        self.follower_caught_up_ms[replica] = now_ms
        self.follower_last_fetch[replica] = (leo, now_ms)
        return True

    def isr_candidates_to_add(self) -> list[int]:
        epoch_start = self._epoch_start_offset()
        return [
            r
            for r in self.replicas
            if r not in self.isr
            and r in self.follower_leos
            and can_join_isr(self.follower_leos[r], self.high_watermark, epoch_start)
        ]

    def isr_candidates_to_remove(self, now_ms: float, lag_max_ms: float) -> list[int]:
        return followers_out_of_sync(self.isr, self.broker_id, self.follower_caught_up_ms, now_ms, lag_max_ms)

    def _epoch_start_offset(self) -> int:
        for epoch, start in reversed(self.log.epoch_entries):
            if epoch == self.leader_epoch:
                return start
        return self.log.log_end_offset

    def begin_isr_expansion(self, members: frozenset[int]) -> None:
        """``members`` may join the ISR and their write is about to start: from now on the high
        watermark waits for them too (I3)."""
        assert self.is_leader and not self.joining, (self.name, self.joining)
        assert all(self.follower_leos.get(r, -1) >= self.high_watermark for r in members), (
            "only a follower with everything below the high watermark may join the ISR"
        )
        self.joining = members

    def end_isr_expansion(self) -> None:
        """The ISR write finished (written, refused or abandoned)."""
        if self.joining:
            self.joining = frozenset()
            if self.is_leader:
                self._update_high_watermark()

    def set_isr(self, isr: tuple[int, ...], version: int) -> None:
        assert self.broker_id in isr or not self.is_leader, "a leader is always in its own ISR (I6)"
        added = set(isr) - set(self.isr) - {self.broker_id}
        if self.is_leader:  # this leader's write, or the controller's (a dead follower dropped)
            if added:
                metrics.ISR_EXPANDS.inc()
            if not set(self.isr) <= set(isr):
                metrics.ISR_SHRINKS.inc()
        self.isr = isr
        self.state_version = version
        self._update_high_watermark()
        if self.is_leader:
            behind = {r: self.follower_leos.get(r, -1) for r in added}
            assert all(leo >= self.high_watermark for leo in behind.values()), (
                f"I3: {self.name} added {behind} (replica: log end) to its ISR "
                f"behind the high watermark {self.high_watermark}"
            )

    @property
    def last_stable_offset(self) -> int:
        """Below it every transaction has ended by a marker below the high watermark: all a
        read_committed reader may see (PartitionLog.last_stable_offset)."""
        return self.log.last_stable_offset(self.high_watermark)

    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        committed_only: bool = True,
        read_committed: bool = False,
        min_one_batch: bool = True,
        zero_copy: bool = False,
    ) -> ReadResult:
        """Whole batches from ``offset``: below the high watermark (``committed_only``), or
        below the last stable offset (``read_committed``), or anything (a follower's read).
        ``zero_copy``: as a region of the segment file (Log.read), for a Fetch answer."""
        limit = self.last_stable_offset if read_committed else self.high_watermark if committed_only else None
        return self.log.read(
            offset, max_bytes=max_bytes, max_offset=limit, min_one_batch=min_one_batch, zero_copy=zero_copy
        )

    def append_marker(
        self, producer_id: int, producer_epoch: int, committed: bool, coordinator_epoch: int
    ) -> AppendInfo:
        """Write a transaction's marker as leader (the coordinator's WriteTxnMarkers)."""
        assert self.is_leader
        info = self.log.append_marker(
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            committed=committed,
            coordinator_epoch=coordinator_epoch,
            leader_epoch=self.leader_epoch,
        )
        self._notify()
        self._update_high_watermark()
        return info

    def _update_high_watermark(self) -> None:
        new_hw = high_watermark_for(
            self.high_watermark,
            self.log.log_end_offset,
            self.isr,
            self.follower_leos,
            self.broker_id,
            min(self.min_insync_replicas, max(1, len(self.replicas))),
            self.joining,
        )
        assert new_hw >= self.high_watermark, "I3: the high watermark never moves backwards"
        assert new_hw <= self.log.log_end_offset
        if new_hw != self.high_watermark:
            self.high_watermark = new_hw
            self.log.last_stable_offset(new_hw)  # forgets transactions whose markers are now below it
            self._notify()

    # -- waiting for data ------------------------------------------------------------------------

    async def wait_committed(self, offset: int, timeout_s: float) -> bool:
        """Wait until the record at ``offset`` is below the high watermark (committed)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.high_watermark <= offset:
            if not self.is_leader or loop.time() >= deadline:
                return False
            fut: asyncio.Future[None] = loop.create_future()
            self.add_waiter(fut)
            try:
                await asyncio.wait_for(fut, timeout=max(0.0, deadline - loop.time()))
            except TimeoutError:
                return self.high_watermark > offset
        return True

    def add_waiter(self, fut: asyncio.Future[None]) -> None:
        """Wake ``fut`` at the next change. A long poll that timed out leaves its future here
        (done), and an idle partition is never notified: without pruning, every idle fetch of it
        would add one for good. Pruning when the list doubles keeps it at most twice the waiters
        still pending, at constant cost per call."""
        self._waiters.append(fut)
        if len(self._waiters) > self._waiters_prune_at:
            self._waiters = [f for f in self._waiters if not f.done()]
            self._waiters_prune_at = max(WAITERS_PRUNE_MIN, 2 * len(self._waiters))

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def close(self, *, marker: bool = True) -> None:
        """Close the log (``marker``: with its own clean-shutdown marker; see PartitionLog.close)."""
        self._notify()
        try:
            self.checkpoint_high_watermark()
        except OSError as exc:
            log.warning("event=hw_checkpoint_failed partition=%s error=%r", self.name, exc)
        self.log.close(marker=marker)
