"""Followers fetch from leaders: one fetcher task per leader broker, one connection each.

A replica that becomes a follower first asks the leader for the end offset of its own latest
leader epoch (OffsetForLeaderEpoch); when the leader answers with an epoch the follower does not
have, it asks again about its largest epoch below that answer, until it knows where the two logs
stop agreeing (``replication.truncation_step``), and truncates there, so that it never keeps
records the leader does not have (I2, KIP-101/KIP-279); only then does it fetch, from its log
end offset, as replica ``broker_id``.

Fetches run in an incremental fetch session with the leader (KIP-227,
``fetch_session_client``): after one full request, a request names only the partitions whose
log end (or leader epoch, or log start) moved, and the answer only those with something new, so
an idle follower of thousands of partitions sends and receives almost nothing. A partition left
out of an answer keeps its high watermark; a session error, a lost answer or a new connection
starts over with a full request.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from sluice.broker.fetch_session_client import FetchPlan, FetchSessionClient
from sluice.broker.fetch_sessions import PartitionRequest
from sluice.broker.peer_client import PeerConnection, PeerConnectionError
from sluice.broker.replication import AskAgain, TruncateTo, truncation_step
from sluice.protocol.api import ApiKey
from sluice.protocol.errors import ErrorCode
from sluice.security.client import PLAINTEXT
from sluice.storage import errors as storage_errors

if TYPE_CHECKING:
    from sluice.broker.metadata import MetadataCache
    from sluice.broker.partition import Partition

log = logging.getLogger("sluice.fetcher")

FETCH_VERSION = 11
EPOCH_VERSION = 4
FETCH_MAX_WAIT_MS = 3000
FETCH_MAX_BYTES = 32 * 1024 * 1024
PARTITION_MAX_BYTES = 8 * 1024 * 1024
REQUEST_TIMEOUT_S = 10.0
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 1.0

Key = tuple[str, int]


class FetcherManager:
    def __init__(self, broker_id: int, metadata: MetadataCache, *, fetch_sessions: bool = True):
        self.broker_id = broker_id
        self.metadata = metadata
        #: False: every fetch names every partition (sessionless, as before KIP-227); kept to
        #: measure what sessions save and as a fallback.
        self.fetch_sessions = fetch_sessions
        #: how followers connect to leaders (TLS, SASL on a secured inter-broker listener)
        self.security = PLAINTEXT
        self._fetchers: dict[int, LeaderFetcher] = {}
        self.closed = False

    def add(self, part: Partition) -> None:
        assert part.leader_id >= 0 and part.leader_id != self.broker_id
        if self.closed:
            return
        fetcher = self._fetchers.get(part.leader_id)
        if fetcher is None:
            fetcher = self._fetchers[part.leader_id] = LeaderFetcher(self, part.leader_id)
        fetcher.partitions[(part.topic, part.index)] = part
        fetcher.wake()

    def remove(self, part: Partition) -> None:
        key = (part.topic, part.index)
        for leader_id, fetcher in list(self._fetchers.items()):
            if fetcher.partitions.get(key) is part:
                del fetcher.partitions[key]
                if not fetcher.partitions:
                    fetcher.stop()
                    del self._fetchers[leader_id]

    async def stop(self) -> None:
        self.closed = True
        for fetcher in self._fetchers.values():
            fetcher.stop()
        self._fetchers.clear()


class LeaderFetcher:
    def __init__(self, manager: FetcherManager, leader_id: int):
        self.manager = manager
        self.leader_id = leader_id
        self.partitions: dict[Key, Partition] = {}
        self.session = FetchSessionClient(leader_id, enabled=manager.fetch_sessions)
        self._wakeup = asyncio.Event()
        self._conn: PeerConnection | None = None
        self._stopped = False
        self._task = asyncio.get_running_loop().create_task(self._run())

    def wake(self) -> None:
        self._wakeup.set()

    def stop(self) -> None:
        # The flag too: a cancel can be lost. Python 3.11's wait_for, cancelled as the connect it
        # waits for fails (a leader stopping at the same time refuses it), raises that failure
        # instead, and the loop took it for a refused connection and went on for good.
        self._stopped = True
        self._task.cancel()
        conn, self._conn = self._conn, None
        if conn is not None:
            asyncio.get_running_loop().create_task(conn.close())

    async def _run(self) -> None:
        backoff = BACKOFF_MIN_S
        while not self._stopped:
            if not self.partitions:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            try:
                conn = await self._connection()
                if conn is None:
                    await asyncio.sleep(BACKOFF_MAX_S)
                    continue
                await self._truncate(conn)
                progressed = await self._fetch(conn)
                backoff = BACKOFF_MIN_S
                if not progressed:
                    await asyncio.sleep(BACKOFF_MIN_S)
            except PeerConnectionError as exc:
                log.info("event=fetch_connection_failed leader=%d error=%s", self.leader_id, exc)
                self._conn = None
                await asyncio.sleep(backoff)
                backoff = min(BACKOFF_MAX_S, backoff * 2)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("event=fetcher_error leader=%d", self.leader_id)
                self.session.reset()  # whether the leader applied the last request is unknown
                await asyncio.sleep(BACKOFF_MAX_S)

    async def _connection(self) -> PeerConnection | None:
        reg = self.manager.metadata.brokers().get(self.leader_id)
        if reg is None:
            return None
        if self._conn is not None and (self._conn.host, self._conn.port) == (reg.host, reg.port):
            return self._conn
        if self._conn is not None:
            await self._conn.close()
        # A new connection follows a failed request, whose effect on the session is unknown.
        self.session.reset()
        self._conn = PeerConnection(
            reg.host, reg.port, f"replica-fetcher-{self.manager.broker_id}", self.manager.security
        )
        await self._conn.connect()
        return self._conn

    # -- truncation --------------------------------------------------------------------------------

    async def _truncate(self, conn: PeerConnection) -> None:
        """Truncate every partition that needs it, asking the leader as many rounds as KIP-279
        takes: at most one round per local epoch, since each round asks about a smaller epoch."""
        asking: dict[Key, tuple[Partition, int, int]] = {}
        rounds_max = 0
        for part in self.partitions.values():
            if not part.needs_truncation:
                continue
            epoch = part.log.latest_epoch()
            if epoch < 0 or part.log.log_end_offset == 0:
                part.needs_truncation = False
                continue
            asking[(part.topic, part.index)] = (part, part.leader_epoch, epoch)
            rounds_max = max(rounds_max, len(part.log.epoch_entries))
        for _round in range(rounds_max):
            if not asking:
                return
            asking = await self._truncation_round(conn, asking)
        for part, _leader_epoch, epoch in asking.values():
            # Cannot happen while each round asks about a smaller local epoch; if it does, the
            # partition keeps needs_truncation and starts over on the next pass.
            log.warning(
                "event=truncation_unfinished partition=%s asking_epoch=%d rounds=%d action=retry",
                part.name,
                epoch,
                rounds_max,
            )

    async def _truncation_round(
        self, conn: PeerConnection, asking: dict[Key, tuple[Partition, int, int]]
    ) -> dict[Key, tuple[Partition, int, int]]:
        """One OffsetForLeaderEpoch request for every partition in ``asking`` (partition, the leader
        epoch it follows, the local epoch it asks about); returns those that must ask again."""
        topics: dict[str, list[dict[str, int]]] = {}
        for part, leader_epoch, epoch in asking.values():
            topics.setdefault(part.topic, []).append(
                {"partition": part.index, "current_leader_epoch": leader_epoch, "leader_epoch": epoch}
            )
        body = {
            "replica_id": self.manager.broker_id,
            "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()],
        }
        response = await conn.request(ApiKey.OFFSET_FOR_LEADER_EPOCH, EPOCH_VERSION, body, REQUEST_TIMEOUT_S)
        again: dict[Key, tuple[Partition, int, int]] = {}
        for t in response["topics"]:
            for r in t["partitions"]:
                key = (t["topic"], r["partition"])
                entry = asking.get(key)
                if entry is None:
                    continue
                part, asked_leader_epoch, asked_epoch = entry
                if self.partitions.get(key) is not part or part.leader_epoch != asked_leader_epoch:
                    continue  # the partition changed role meanwhile; it will ask again
                if r["error_code"] != ErrorCode.NONE:
                    continue  # e.g. the leader has not taken its new epoch yet: ask again
                step = truncation_step(
                    asked_epoch,
                    part.log.epoch_entries,
                    part.log.log_end_offset,
                    part.high_watermark,
                    r["leader_epoch"],
                    r["end_offset"],
                )
                if isinstance(step, AskAgain):
                    log.info(
                        "event=truncation_ask_again partition=%s asked_epoch=%d leader_epoch=%d "
                        "leader_end_offset=%d next_epoch=%d",
                        part.name,
                        asked_epoch,
                        r["leader_epoch"],
                        r["end_offset"],
                        step.epoch,
                    )
                    again[key] = (part, asked_leader_epoch, step.epoch)
                    continue
                assert isinstance(step, TruncateTo)
                part.truncate_to(step.offset)
                part.needs_truncation = False
        return again

    # -- fetching ----------------------------------------------------------------------------------

    async def _fetch(self, conn: PeerConnection) -> bool:
        ready = {(p.topic, p.index): p for p in self.partitions.values() if not p.needs_truncation}
        if not ready:
            return False
        # A partition still truncating is left out, so forgotten by the session: the leader must
        # never count this follower at a fetch offset its log may no longer reach.
        plan = self.session.build(
            {
                key: PartitionRequest(
                    part.log.log_end_offset,
                    PARTITION_MAX_BYTES,
                    part.leader_epoch,
                    part.log.log_start_offset,
                )
                for key, part in ready.items()
            }
        )
        try:
            response = await conn.request(
                ApiKey.FETCH,
                FETCH_VERSION,
                self._request_body(plan),
                REQUEST_TIMEOUT_S + FETCH_MAX_WAIT_MS / 1000,
            )
        except PeerConnectionError:
            self.session.reset()
            raise
        if not self.session.on_answer(plan, response["error_code"], response["session_id"]):
            return False
        progressed = False
        for t in response["responses"]:
            for r in t["partitions"]:
                key = (t["topic"], r["partition_index"])
                sent = plan.fetching.get(key)
                part = ready.get(key)
                if sent is None or part is None:
                    continue
                if (
                    self.partitions.get(key) is not part
                    or part.is_leader
                    or part.leader_epoch != sent.current_leader_epoch
                    or part.log.log_end_offset != sent.fetch_offset
                ):
                    # Changed meanwhile: the leader believes this answer was taken, so ask for
                    # the partition by name next time, which it always answers.
                    self.session.name_again(key)
                    continue
                # An answer without records but with a new high watermark is progress too: the
                # leader's poll ends on such news (handlers.fetch), so the next poll must follow
                # at once, not after the back-off for an empty one (that back-off after every
                # watermark update cut acks=all throughput of 1 MB batches from 118 to 17 MB/s).
                progressed |= self._apply(part, r) or r["error_code"] == ErrorCode.NONE
        return progressed

    def _request_body(self, plan: FetchPlan) -> dict[str, Any]:
        topics: dict[str, list[dict[str, Any]]] = {}
        for (topic, index), p in plan.to_send.items():
            topics.setdefault(topic, []).append(
                {
                    "partition": index,
                    "current_leader_epoch": p.current_leader_epoch,
                    "fetch_offset": p.fetch_offset,
                    "log_start_offset": p.log_start_offset,
                    "partition_max_bytes": p.max_bytes,
                }
            )
        forgotten: dict[str, list[int]] = {}
        for topic, index in plan.forgotten:
            forgotten.setdefault(topic, []).append(index)
        return {
            "replica_id": self.manager.broker_id,
            "max_wait_ms": FETCH_MAX_WAIT_MS,
            "min_bytes": 1,
            "max_bytes": FETCH_MAX_BYTES,
            "isolation_level": 0,
            "session_id": plan.session_id,
            "session_epoch": plan.epoch,
            "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()],
            "forgotten_topics_data": [{"topic": t, "partitions": ps} for t, ps in forgotten.items()],
            "rack_id": "",
        }

    def _apply(self, part: Partition, r: dict[str, Any]) -> bool:
        error = r["error_code"]
        if error == ErrorCode.NONE:
            records = r["records"] or b""
            try:
                part.append_as_follower(records, r["high_watermark"])
            except (storage_errors.UnexpectedAppendOffsetError, storage_errors.CorruptRecordError) as exc:
                log.warning(
                    "event=follower_append_failed partition=%s error=%s action=truncate_again", part.name, exc
                )
                part.needs_truncation = True
                return False
            part.follow_log_start(r["log_start_offset"])  # DeleteRecords on the leader
            return len(records) > 0
        if error == ErrorCode.OFFSET_OUT_OF_RANGE:
            leader_start = r["log_start_offset"]
            if leader_start > part.log.log_end_offset:
                log.info(
                    "event=follower_behind_log_start partition=%s leo=%d leader_log_start=%d",
                    part.name,
                    part.log.log_end_offset,
                    leader_start,
                )
                part.log.truncate_fully_and_start_at(leader_start)
                part.high_watermark = leader_start
            else:
                part.needs_truncation = True
            return False
        # NOT_LEADER_OR_FOLLOWER, FENCED/UNKNOWN_LEADER_EPOCH, ...: leadership is moving; the
        # metadata watch brings the new state and the fetcher follows it.
        return False
