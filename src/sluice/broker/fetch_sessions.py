"""Incremental fetch sessions (KIP-227), the leader's side: which partitions a fetcher asks for,
kept between its requests, so an idle fetcher of thousands of partitions names none of them.

A Fetch request (v7+) carries a session id and an epoch:

* epoch -1: a sessionless full request, answered in full, as before v7 (a session id with it
  closes that session);
* epoch 0: a full request that also asks for a session (a session id with it closes that one
  first); the full answer carries the new session's id (0: no slot, stay sessionless);
* epoch n > 0: an incremental request in session ``id``, which must be exactly the epoch the
  session expects (``INVALID_FETCH_SESSION_EPOCH`` otherwise, ``FETCH_SESSION_ID_NOT_FOUND``
  for an id the cache does not hold). It names only partitions added or changed since the last
  request and lists removed ones as forgotten; the others keep the offsets cached here. The
  answer names only partitions with something new: records, a high watermark, last stable
  offset or log start offset other than the one last sent, or an error. A partition named in
  the request is always answered, so a fetcher that doubts what it last received can ask again.

A session belongs to whoever opened it (``SessionOwner``: the principal, the listener and the
replica id of the request that opened it). A request of anyone else naming its id is told
FETCH_SESSION_ID_NOT_FOUND, as for an id that does not exist, and a full request of anyone else
naming it does not close it: a session id is no capability (Kafka keys its cache by id alone;
Sluice also re-authorizes every partition a session serves on every fetch, ``handlers.fetch``).
Ids are drawn from ``secrets``, so one cannot be predicted from others.

``FetchSessionCache`` is plain data and logic (no I/O, an injectable clock and id source) run on
the broker's event loop: ``open`` turns a request into a ``FetchContext``, which says which
partitions to read, and ``FetchContext.answer`` says which of the read results to send. It is
bounded (Kafka's ``max.incremental.fetch.session.cache.slots``) with Kafka's eviction rule, and
sessions idle past ``eviction_ms`` expire, so a fetcher that went away frees its slot.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from sluice.protocol.errors import ErrorCode

log = logging.getLogger("sluice.fetch_sessions")

#: The session id of a request or answer outside any session.
INVALID_SESSION_ID = 0
#: A full request that asks for a new session.
INITIAL_EPOCH = 0
#: A full request that wants no session (and closes the one it names).
FINAL_EPOCH = -1
MAX_EPOCH = 2**31 - 1
#: Kafka's ``max.incremental.fetch.session.cache.slots`` default.
DEFAULT_CACHE_SLOTS = 1000
#: How long a session must be unused (or, for eviction by size, have existed) before another may
#: take its slot: Kafka's fixed 120 s.
DEFAULT_EVICTION_MS = 120_000

Key = tuple[str, int]


def next_epoch(epoch: int) -> int:
    """The epoch after ``epoch`` in a session: 1, 2, ... wrapping to 1 (never 0 or -1, which
    mean full requests)."""
    return 1 if epoch >= MAX_EPOCH else epoch + 1


@dataclass(frozen=True, slots=True)
class SessionOwner:
    """Who may use a session: the principal, the listener and the replica id (-1: a consumer)
    of the request that opened it."""

    principal: str
    listener: str
    replica_id: int = -1


#: The owner of sessions opened where no principal is known (tests of the cache alone).
NOBODY = SessionOwner("", "")


@dataclass(frozen=True, slots=True)
class PartitionRequest:
    """What a fetcher asks of one partition, as a request names it or a session caches it."""

    fetch_offset: int
    max_bytes: int
    current_leader_epoch: int = -1
    log_start_offset: int = -1
    last_fetched_epoch: int = -1


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """What a read of one partition found, as far as deciding whether to answer goes."""

    error: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    has_records: bool


@dataclass(slots=True)
class CachedPartition:
    """One partition of a session: the request parameters in force and what was last sent.

    The sent values start at -1, so a partition's first answer in a session always goes out, and
    go back to -1 after an error, so the partition is answered again once the error clears."""

    request: PartitionRequest
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    #: named in the request being answered: answered whatever changed.
    named: bool = False
    #: a follower's last read of it left nothing to do (the broker's mark of what it held then):
    #: while the mark holds, the next unnamed fetch need not read it. Opaque here.
    quiet: object | None = None

    def has_news(self, result: PartitionResult) -> bool:
        """Whether ``result`` tells this fetcher something it has not been told (records, an
        error, or a watermark that moved), without recording anything."""
        return (
            result.has_records
            or result.error != ErrorCode.NONE
            or (result.high_watermark, result.last_stable_offset, result.log_start_offset)
            != (self.high_watermark, self.last_stable_offset, self.log_start_offset)
        )

    def must_answer(self, result: PartitionResult) -> bool:
        """Whether ``result`` has anything this fetcher has not been told; records what is sent."""
        answer = self.named or result.has_records or result.error != ErrorCode.NONE
        sent = (result.high_watermark, result.last_stable_offset, result.log_start_offset)
        if sent != (self.high_watermark, self.last_stable_offset, self.log_start_offset):
            answer = True
        if result.error != ErrorCode.NONE:
            sent = (-1, -1, -1)
        self.high_watermark, self.last_stable_offset, self.log_start_offset = sent
        self.named = False
        return answer


@dataclass(slots=True)
class FetchSession:
    id: int
    #: opened by a follower (replica id >= 0): only another follower's session may evict it
    #: before it goes stale.
    privileged: bool
    #: who opened it: nobody else may use it, or close it.
    owner: SessionOwner
    #: the epoch the next incremental request must carry.
    epoch: int
    created_ms: float
    last_used_ms: float
    #: read order: partitions answered last move to the end, so that a request's byte limit
    #: cannot keep serving the same partitions first.
    partitions: OrderedDict[Key, CachedPartition] = field(default_factory=OrderedDict)


class Kind(Enum):
    SESSIONLESS = "sessionless"
    FULL = "full"
    INCREMENTAL = "incremental"
    ERROR = "error"


@dataclass(slots=True)
class FetchContext:
    """One Fetch request seen through the session cache.

    ``error`` set: answer with that top-level error and no partitions. Otherwise read
    ``partitions`` (in this order) and pass the results to ``answer``.
    """

    kind: Kind
    cache: FetchSessionCache
    partitions: list[tuple[Key, PartitionRequest]]
    error: ErrorCode = ErrorCode.NONE
    privileged: bool = False
    owner: SessionOwner = NOBODY
    session: FetchSession | None = None
    #: incremental: the session's epoch once this request was accepted.
    epoch_after: int = -1

    def has_news(self, results: Mapping[Key, PartitionResult]) -> bool:
        """Incremental: whether any partition's result is news to the fetcher (see
        ``CachedPartition.has_news``). A follower's long poll ends on it, so a high watermark
        its own fetch moved reaches it at once rather than when the poll times out."""
        if self.kind is not Kind.INCREMENTAL or self.session is None:
            return False
        cached = self.session.partitions
        return any(key in cached and cached[key].has_news(r) for key, r in results.items())

    def quiet_mark(self, key: Key) -> object | None:
        """Incremental: the mark ``key``'s last read left (``set_quiet``), unless this request
        names it (a named partition is always read and answered)."""
        if self.kind is not Kind.INCREMENTAL or self.session is None:
            return None
        cached = self.session.partitions.get(key)
        return None if cached is None or cached.named else cached.quiet

    def set_quiet(self, key: Key, mark: object | None) -> None:
        """Incremental: remember what ``key``'s read left (None: read it next time)."""
        if self.kind is Kind.INCREMENTAL and self.session is not None:
            cached = self.session.partitions.get(key)
            if cached is not None:
                cached.quiet = mark

    def answer(self, results: Mapping[Key, PartitionResult]) -> Answer:
        """What to answer, given the read ``results`` (in read order). A partition left out of
        ``results`` (skipped as quiet) has nothing new and is not answered."""
        if self.kind is Kind.ERROR:
            return Answer(INVALID_SESSION_ID, [], self.error)
        if self.kind is Kind.SESSIONLESS:
            return Answer(INVALID_SESSION_ID, list(results))
        if self.kind is Kind.FULL:
            return Answer(
                self.cache.create(self.privileged, self.partitions, results, owner=self.owner), list(results)
            )
        session = self.session
        assert self.kind is Kind.INCREMENTAL and session is not None
        if session.epoch != self.epoch_after:
            # Another request of this session was accepted while this one waited: its fetcher
            # is out of step (Kafka's answer to the same race).
            self.cache.stats.session_errors += 1
            return Answer(session.id, [], ErrorCode.INVALID_FETCH_SESSION_EPOCH)
        included = []
        for key, result in results.items():
            cached = session.partitions.get(key)
            if cached is not None and cached.must_answer(result):
                included.append(key)
        for key in included:
            session.partitions.move_to_end(key)
        self.cache.stats.partitions_answered += len(included)
        return Answer(session.id, included)


@dataclass(frozen=True, slots=True)
class Answer:
    """The top-level part of a Fetch answer: its session id, which partitions it includes (in
    order), and its error (``NONE``, or a session error with no partitions)."""

    session_id: int
    partitions: list[Key]
    error: ErrorCode = ErrorCode.NONE


@dataclass(slots=True)
class FetchSessionStats:
    """Counters since the broker started: what the sessions save, for tests and debugging."""

    full_requests: int = 0
    incremental_requests: int = 0
    sessionless_requests: int = 0
    session_errors: int = 0
    sessions_created: int = 0
    sessions_evicted: int = 0
    sessions_expired: int = 0
    #: requests naming a session another principal, listener or replica opened
    foreign_session_requests: int = 0
    #: partitions named in incremental requests, and partitions in their answers.
    partitions_named: int = 0
    partitions_answered: int = 0


class FetchSessionCache:
    """The broker's fetch sessions, at most ``slots`` of them."""

    def __init__(
        self,
        slots: int = DEFAULT_CACHE_SLOTS,
        eviction_ms: float = DEFAULT_EVICTION_MS,
        *,
        clock_ms: Callable[[], float] | None = None,
        new_id: Callable[[], int] | None = None,
    ):
        self.slots = slots
        self.eviction_ms = eviction_ms
        self._clock_ms = clock_ms or (lambda: time.monotonic() * 1000)
        # Unpredictable ids: knowing one's own sessions says nothing of anyone else's.
        self._new_id = new_id or (lambda: secrets.randbelow(MAX_EPOCH) + 1)
        #: least recently used first.
        self._sessions: OrderedDict[int, FetchSession] = OrderedDict()
        self.stats = FetchSessionStats()

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: int) -> FetchSession | None:
        return self._sessions.get(session_id)

    # -- requests --------------------------------------------------------------------------------

    def open(
        self,
        session_id: int,
        epoch: int,
        requested: Mapping[Key, PartitionRequest],
        forgotten: Iterable[Key],
        *,
        privileged: bool,
        owner: SessionOwner = NOBODY,
    ) -> FetchContext:
        """The context of a request of ``owner`` with this session id and epoch, naming
        ``requested`` (in request order) and forgetting ``forgotten`` (meaningful in incremental
        requests only). A session of another owner is, to this request, a session that does not
        exist."""
        now = self._clock_ms()
        self._expire_idle(now)
        named = self._sessions.get(session_id)
        if named is not None and named.owner != owner:
            self.stats.foreign_session_requests += 1
            log.info(
                "event=fetch_session_not_owner session_id=%d epoch=%d principal=%s listener=%s replica_id=%d",
                session_id,
                epoch,
                owner.principal,
                owner.listener,
                owner.replica_id,
            )
            named = None
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if named is not None:
                self._remove(session_id)  # a full request closes the session it names (its own)
            if epoch == FINAL_EPOCH:
                self.stats.sessionless_requests += 1
                return FetchContext(Kind.SESSIONLESS, self, list(requested.items()))
            self.stats.full_requests += 1
            return FetchContext(Kind.FULL, self, list(requested.items()), privileged=privileged, owner=owner)
        session = named
        if session is None or epoch < 0:
            self.stats.session_errors += 1
            log.debug("event=fetch_session_not_found session_id=%d epoch=%d", session_id, epoch)
            return FetchContext(Kind.ERROR, self, [], ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
        if epoch != session.epoch:
            # A duplicate or lost request: the fetcher must start again with a full request.
            self.stats.session_errors += 1
            log.info(
                "event=fetch_session_epoch_mismatch session_id=%d epoch=%d expected=%d",
                session_id,
                epoch,
                session.epoch,
            )
            return FetchContext(Kind.ERROR, self, [], ErrorCode.INVALID_FETCH_SESSION_EPOCH)
        self.stats.incremental_requests += 1
        self.stats.partitions_named += len(requested)
        for key, request in requested.items():
            cached = session.partitions.get(key)
            if cached is None:
                session.partitions[key] = CachedPartition(request, named=True)
            else:
                cached.request = request
                cached.named = True
        for key in forgotten:
            session.partitions.pop(key, None)
        if not session.partitions:
            # Everything forgotten: Kafka closes the session and answers sessionless.
            self._remove(session.id)
            return FetchContext(Kind.SESSIONLESS, self, [])
        session.epoch = next_epoch(session.epoch)
        session.last_used_ms = now
        self._sessions.move_to_end(session.id)
        partitions = [(key, cached.request) for key, cached in session.partitions.items()]
        return FetchContext(
            Kind.INCREMENTAL,
            self,
            partitions,
            privileged=session.privileged,
            owner=owner,
            session=session,
            epoch_after=session.epoch,
        )

    def create(
        self,
        privileged: bool,
        partitions: list[tuple[Key, PartitionRequest]],
        results: Mapping[Key, PartitionResult],
        *,
        owner: SessionOwner = NOBODY,
    ) -> int:
        """A new session of ``owner`` over ``partitions`` whose full answer is ``results``; its
        id, or ``INVALID_SESSION_ID`` when there is no slot for it (the fetcher stays
        sessionless)."""
        if not partitions:
            return INVALID_SESSION_ID
        now = self._clock_ms()
        if len(self._sessions) >= self.slots and not self._evict_for(privileged, len(partitions), now):
            log.debug(
                "event=fetch_session_not_created reason=cache_full privileged=%s partitions=%d",
                privileged,
                len(partitions),
            )
            return INVALID_SESSION_ID
        session_id = self._new_id()
        while session_id in self._sessions or session_id <= INVALID_SESSION_ID:
            session_id = self._new_id()
        session = FetchSession(session_id, privileged, owner, next_epoch(INITIAL_EPOCH), now, now)
        for key, request in partitions:
            cached = CachedPartition(request)
            result = results.get(key)
            if result is not None:
                cached.must_answer(result)
            session.partitions[key] = cached
        self._sessions[session_id] = session
        self.stats.sessions_created += 1
        log.log(
            logging.INFO if privileged else logging.DEBUG,
            "event=fetch_session_created session_id=%d privileged=%s partitions=%d sessions=%d",
            session_id,
            privileged,
            len(partitions),
            len(self._sessions),
        )
        return session_id

    # -- eviction --------------------------------------------------------------------------------

    def _expire_idle(self, now: float) -> None:
        while self._sessions:
            session = next(iter(self._sessions.values()))
            if now - session.last_used_ms <= self.eviction_ms:
                return
            self._remove(session.id)
            self.stats.sessions_expired += 1
            log.log(
                logging.INFO if session.privileged else logging.DEBUG,
                "event=fetch_session_expired session_id=%d privileged=%s partitions=%d idle_ms=%d",
                session.id,
                session.privileged,
                len(session.partitions),
                now - session.last_used_ms,
            )

    def _evict_for(self, privileged: bool, size: int, now: float) -> bool:
        """Kafka's rule: a new session may take the slot of one that is less valuable and no
        longer new. A follower's session outranks a consumer's, a larger one a smaller one; a
        consumer's session may be evicted by a follower's at any age, any session by one that
        outranks it once it has existed for ``eviction_ms``."""
        victim: FetchSession | None = None
        for s in self._sessions.values():
            old = now - s.created_ms > self.eviction_ms
            if not (old or (privileged and not s.privileged)):
                continue
            if victim is None or (s.privileged, len(s.partitions), s.id) < (
                victim.privileged,
                len(victim.partitions),
                victim.id,
            ):
                victim = s
        if victim is None or (privileged, size) <= (victim.privileged, len(victim.partitions)):
            return False
        self._remove(victim.id)
        self.stats.sessions_evicted += 1
        log.info(
            "event=fetch_session_evicted session_id=%d privileged=%s partitions=%d "
            "for_privileged=%s for_partitions=%d",
            victim.id,
            victim.privileged,
            len(victim.partitions),
            privileged,
            size,
        )
        return True

    def _remove(self, session_id: int) -> None:
        self._sessions.pop(session_id, None)
