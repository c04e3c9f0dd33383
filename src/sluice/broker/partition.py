"""One partition replica on this broker: its log, its leadership and its high watermark.

Runs on the broker's event loop. The high watermark rules (I3) live in ``high_watermark_for``,
a pure function, so that they can be tested without a broker.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sluice.storage.config import LogConfig
from sluice.storage.log import AppendInfo, PartitionLog, ReadResult

log = logging.getLogger("sluice.partition")

METADATA_FILE = "partition.metadata"


def high_watermark_for(
    current_hw: int,
    leader_leo: int,
    isr: tuple[int, ...],
    follower_leos: Mapping[int, int],
    leader_id: int,
    min_isr: int,
) -> int:
    """The new high watermark: the smallest end offset among ISR members (I3).

    It never moves backwards, and it does not advance while the ISR is smaller than
    ``min_isr`` (a write acknowledged to fewer replicas would not be safe to expose).
    """
    if len(isr) < min_isr:
        return current_hw
    leos = [leader_leo]
    for replica in isr:
        if replica != leader_id:
            leos.append(follower_leos.get(replica, current_hw))
    candidate = min(leos)
    return max(current_hw, candidate)


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
    follower_leos: dict[int, int] = field(default_factory=dict)
    _waiters: list[asyncio.Future[None]] = field(default_factory=list)

    @classmethod
    def open(
        cls,
        root: Path,
        topic: str,
        index: int,
        topic_id: uuid.UUID,
        config: Mapping[str, str],
        broker_id: int,
    ) -> Partition:
        directory = root / partition_dir_name(topic, index)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / METADATA_FILE).write_text(f"version: 0\ntopic_id: {topic_id}\n")
        plog = PartitionLog.open(directory, LogConfig.from_topic_config(dict(config)))
        part = cls(topic, index, topic_id, plog, config, broker_id)
        # Until this broker learns otherwise, only data it already had is visible.
        part.high_watermark = plog.log_end_offset
        return part

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
        return int(self.config.get("min.insync.replicas", "1"))

    # -- leadership ------------------------------------------------------------------------------

    def become_leader(self, leader_epoch: int, isr: tuple[int, ...], replicas: tuple[int, ...]) -> None:
        assert leader_epoch >= self.leader_epoch, (self.name, leader_epoch, self.leader_epoch)
        self.is_leader = True
        self.leader_epoch = leader_epoch
        self.isr = isr
        self.replicas = replicas
        self.follower_leos = {}
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
        self.leader_epoch = leader_epoch
        self.replicas = replicas
        log.info(
            "event=became_follower partition=%s leader=%d leader_epoch=%d", self.name, leader, leader_epoch
        )
        self._notify()

    # -- data path -------------------------------------------------------------------------------

    def append(self, records: bytes | memoryview) -> AppendInfo:
        assert self.is_leader
        info = self.log.append_as_leader(records, leader_epoch=self.leader_epoch)
        if not info.duplicate:
            self._update_high_watermark()
        return info

    def read(
        self, offset: int, max_bytes: int, *, committed_only: bool = True, min_one_batch: bool = True
    ) -> ReadResult:
        return self.log.read(
            offset,
            max_bytes=max_bytes,
            max_offset=self.high_watermark if committed_only else None,
            min_one_batch=min_one_batch,
        )

    def _update_high_watermark(self) -> None:
        new_hw = high_watermark_for(
            self.high_watermark,
            self.log.log_end_offset,
            self.isr,
            self.follower_leos,
            self.broker_id,
            min(self.min_insync_replicas, max(1, len(self.replicas))),
        )
        assert new_hw >= self.high_watermark, "I3: the high watermark never moves backwards"
        assert new_hw <= self.log.log_end_offset
        if new_hw != self.high_watermark:
            self.high_watermark = new_hw
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
        self._waiters.append(fut)

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def close(self) -> None:
        self._notify()
        self.log.close()
