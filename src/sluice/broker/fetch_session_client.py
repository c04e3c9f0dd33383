"""Incremental fetch sessions (KIP-227), the fetcher's side: what the next Fetch request to one
leader must name, so that a follower of thousands of idle partitions sends and gets back almost
nothing.

The first request is full (epoch 0) and asks the leader for a session. Once the leader answers
with a session id, each request carries the next epoch and names only the partitions whose
fetch state (offset, leader epoch, log start) differs from what the session holds, plus those to
forget. The leader answers only partitions with something new, so a partition left out of an
answer is unchanged: the follower keeps its last known high watermark and log start for it.

Any doubt about what the leader holds starts over with a full request: a session error, an
answer that never came (the request may or may not have been applied), a new connection. A
partition whose answer the follower could not use is named again in the next request, which the
leader always answers for a named partition.

Plain data and logic, no I/O: ``build`` plans a request, ``on_answer`` takes the top-level part
of its answer, ``reset`` forgets the session.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from sluice.broker.fetch_sessions import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    INVALID_SESSION_ID,
    Key,
    PartitionRequest,
    next_epoch,
)
from sluice.protocol.errors import ErrorCode

log = logging.getLogger("sluice.fetcher")


@dataclass(frozen=True, slots=True)
class FetchPlan:
    """One Fetch request to send: its session metadata, the partitions it names and forgets, and
    every partition the leader will read for it (what its answer's partitions must be checked
    against: an incremental answer may include partitions the request did not name)."""

    session_id: int
    epoch: int
    to_send: dict[Key, PartitionRequest]
    forgotten: list[Key]
    fetching: dict[Key, PartitionRequest]

    @property
    def full(self) -> bool:
        return self.epoch in (INITIAL_EPOCH, FINAL_EPOCH)


class FetchSessionClient:
    """The session with one leader, as far as this fetcher knows it."""

    def __init__(self, leader_id: int, *, enabled: bool = True):
        self.leader_id = leader_id
        #: False: every request is full and sessionless (epoch -1), as before sessions.
        self.enabled = enabled
        self.session_id = INVALID_SESSION_ID
        self.epoch = INITIAL_EPOCH if enabled else FINAL_EPOCH
        #: what the leader's session holds once the request in flight is applied.
        self._partitions: dict[Key, PartitionRequest] = {}
        #: partitions whose last answer was not used: named again in the next request.
        self._name_again: set[Key] = set()

    @property
    def established(self) -> bool:
        return self.session_id != INVALID_SESSION_ID and self.epoch > INITIAL_EPOCH

    def build(self, wanted: Mapping[Key, PartitionRequest]) -> FetchPlan:
        """The request that asks for ``wanted`` (in order), and records it as what the leader's
        session will hold."""
        fetching = dict(wanted)
        if not self.established:
            self._partitions = fetching
            self._name_again.clear()
            return FetchPlan(self.session_id, self.epoch, fetching, [], fetching)
        to_send = {
            key: request
            for key, request in fetching.items()
            if self._partitions.get(key) != request or key in self._name_again
        }
        forgotten = [key for key in self._partitions if key not in fetching]
        self._partitions = fetching
        self._name_again.clear()
        return FetchPlan(self.session_id, self.epoch, to_send, forgotten, fetching)

    def on_answer(self, plan: FetchPlan, error: int, session_id: int) -> bool:
        """Take the top-level error and session id of ``plan``'s answer; True when its partitions
        may be used."""
        if not self.enabled:
            return error == ErrorCode.NONE
        if error != ErrorCode.NONE:
            log.info(
                "event=fetch_session_reset leader=%d session_id=%d epoch=%d error=%s action=full_fetch",
                self.leader_id,
                plan.session_id,
                plan.epoch,
                _error_name(error),
            )
            # An unknown id starts afresh; any other error closes the session as it starts again.
            keep = error != ErrorCode.FETCH_SESSION_ID_NOT_FOUND
            self.session_id = plan.session_id if keep else INVALID_SESSION_ID
            self.epoch = INITIAL_EPOCH
            return False
        if session_id == INVALID_SESSION_ID:
            # No session (no slot on the leader), or the leader closed it: full requests again.
            if not plan.full or plan.session_id != INVALID_SESSION_ID:
                log.info(
                    "event=fetch_session_closed leader=%d session_id=%d action=full_fetch",
                    self.leader_id,
                    plan.session_id,
                )
            self.session_id = INVALID_SESSION_ID
            self.epoch = INITIAL_EPOCH
            return True
        if plan.full:
            log.info(
                "event=fetch_session_opened leader=%d session_id=%d partitions=%d",
                self.leader_id,
                session_id,
                len(plan.fetching),
            )
            self.session_id = session_id
            self.epoch = next_epoch(INITIAL_EPOCH)
            return True
        self.epoch = next_epoch(self.epoch)
        return True

    def name_again(self, key: Key) -> None:
        """The answer for ``key`` could not be used: name it in the next request, which makes
        the leader answer it whatever changed."""
        self._name_again.add(key)

    def reset(self) -> None:
        """The answer to the last request never came (or the connection is new): the next
        request is full, and closes the old session on the leader."""
        if self.enabled:
            self.epoch = INITIAL_EPOCH
        self._name_again.clear()


def _error_name(error: int) -> str:
    try:
        return ErrorCode(error).name
    except ValueError:
        return str(error)
