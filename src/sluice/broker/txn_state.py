"""A transactional id's state and the transaction coordinator's decisions, as plain data.

The states and every allowed transition are in ``TRANSITIONS``, one table (KIP-98's
coordinator, with KIP-360's epoch bumps). ``broker.txn_coordinator`` does the I/O: it asks a
function here what a request does to the current ``TxnMetadata``, persists the answer to
``__transaction_state`` before acting on it, and writes the markers. Nothing here touches a
clock, a log or a socket.

Print the table with ``python -c "from sluice.broker.txn_state import transitions_table as t;
print(t())"``.

Why a zombie cannot commit: every InitProducerId bumps the epoch, and every request but
InitProducerId must carry the current epoch exactly (``PRODUCER_FENCED`` otherwise). A new
producer arriving while the old one's transaction is open fences first (PrepareEpochFence: the
epoch is bumped, persisted with PrepareAbort, and the markers carry the bumped epoch), so the
partitions refuse the old epoch's late writes too (``ProducerStateManager.check``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, replace

from sluice.protocol.errors import ErrorCode

__all__ = [
    "EPOCH_EXHAUSTED",
    "NO_EPOCH",
    "NO_PRODUCER_ID",
    "TRANSITIONS",
    "Decision",
    "IllegalTransition",
    "TxnMetadata",
    "TxnState",
    "add_partitions",
    "complete",
    "end_txn",
    "expired",
    "fence",
    "init_producer_id",
    "new_metadata",
    "on_load",
    "timed_out",
    "transitions_table",
    "verify_partitions",
]

NO_PRODUCER_ID = -1
NO_EPOCH = -1
#: An epoch at or above this is spent: the next bump takes a new producer id (Kafka's rule,
#: leaving one epoch for a fence past it).
EPOCH_EXHAUSTED = 32767 - 1


class TxnState(enum.Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    DEAD = "Dead"
    PREPARE_EPOCH_FENCE = "PrepareEpochFence"


S = TxnState

#: state -> the states it may move to, and on what.
TRANSITIONS: dict[TxnState, dict[TxnState, str]] = {
    S.EMPTY: {
        S.EMPTY: "InitProducerId: the epoch is bumped (or a new producer id taken)",
        S.ONGOING: "AddPartitionsToTxn / AddOffsetsToTxn: a transaction begins",
        S.DEAD: "unused for transactional.id.expiration.ms: forgotten",
    },
    S.ONGOING: {
        S.ONGOING: "AddPartitionsToTxn / AddOffsetsToTxn: more partitions",
        S.PREPARE_COMMIT: "EndTxn(commit)",
        S.PREPARE_ABORT: "EndTxn(abort), or the transaction timed out",
        S.PREPARE_EPOCH_FENCE: "InitProducerId from a new producer, or a timeout: the epoch is bumped first",
    },
    S.PREPARE_EPOCH_FENCE: {
        S.PREPARE_ABORT: "the open transaction is aborted under the bumped epoch",
    },
    S.PREPARE_COMMIT: {S.COMPLETE_COMMIT: "every partition has its COMMIT marker"},
    S.PREPARE_ABORT: {S.COMPLETE_ABORT: "every partition has its ABORT marker"},
    S.COMPLETE_COMMIT: {
        S.EMPTY: "InitProducerId: the epoch is bumped",
        S.ONGOING: "AddPartitionsToTxn / AddOffsetsToTxn: the next transaction begins",
        S.DEAD: "unused for transactional.id.expiration.ms: forgotten",
    },
    S.COMPLETE_ABORT: {
        S.EMPTY: "InitProducerId: the epoch is bumped",
        S.ONGOING: "AddPartitionsToTxn / AddOffsetsToTxn: the next transaction begins",
        S.DEAD: "unused for transactional.id.expiration.ms: forgotten",
    },
    S.DEAD: {},
}


def transitions_table() -> str:
    """The table, one transition a line, for docs and for a look at it in a shell."""
    return "\n".join(
        f"{src.value:>18} -> {dst.value:<18} {why}"
        for src, edges in TRANSITIONS.items()
        for dst, why in edges.items()
    )


class IllegalTransition(AssertionError):
    pass


#: The states in which a transaction's partitions may hold its uncommitted records.
_OPEN = frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE})
_PREPARED = frozenset({S.PREPARE_COMMIT, S.PREPARE_ABORT})
_COMPLETE = frozenset({S.COMPLETE_COMMIT, S.COMPLETE_ABORT})


@dataclass(frozen=True, slots=True)
class TxnMetadata:
    """What the coordinator keeps for one transactional id (one ``__transaction_state``
    record). ``last_*`` are the producer id and epoch before the last bump (KIP-360: a retried
    InitProducerId whose answer was lost is recognised by them)."""

    transactional_id: str
    producer_id: int
    last_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[tuple[str, int]]
    #: when the open transaction began (-1: none open)
    start_ms: int
    update_ms: int

    def to(self, state: TxnState, **changes: object) -> TxnMetadata:
        """This metadata moved to ``state`` (with ``changes``), if the table allows it."""
        if state not in TRANSITIONS[self.state]:
            raise IllegalTransition(
                f"transactional id {self.transactional_id}: {self.state.value} -> {state.value}"
            )
        return replace(self, state=state, **changes)  # type: ignore[arg-type]

    @property
    def committing(self) -> bool:
        return self.state in (S.PREPARE_COMMIT, S.COMPLETE_COMMIT)


@dataclass(frozen=True, slots=True)
class Decision:
    """What a request does: refuse it (``error``, nothing written), answer it at once without a
    write (``error`` NONE, ``write`` None), or write ``write`` and then answer. ``fence_first``:
    the open transaction of an older producer is aborted first, and the client told to retry
    (CONCURRENT_TRANSACTIONS). ``needs_producer_id``: ask again with a fresh producer id."""

    error: ErrorCode = ErrorCode.NONE
    write: TxnMetadata | None = None
    fence_first: bool = False
    needs_producer_id: bool = False


def new_metadata(transactional_id: str, producer_id: int, timeout_ms: int, now_ms: int) -> TxnMetadata:
    """A transactional id seen for the first time: Empty, with no epoch yet (the first
    InitProducerId bumps it to 0)."""
    return TxnMetadata(
        transactional_id,
        producer_id,
        NO_PRODUCER_ID,
        NO_EPOCH,
        NO_EPOCH,
        timeout_ms,
        S.EMPTY,
        frozenset(),
        -1,
        now_ms,
    )


def init_producer_id(
    meta: TxnMetadata,
    *,
    timeout_ms: int,
    expected: tuple[int, int] | None,
    pending: bool,
    now_ms: int,
    fresh_producer_id: int | None = None,
) -> Decision:
    """InitProducerId with a transactional id (KIP-98; ``expected``: KIP-360's producer id and
    epoch a producer sends to bump its own epoch after an error).

    - a write in flight or a transaction being prepared: CONCURRENT_TRANSACTIONS (retry);
    - ``expected`` names neither the current producer id nor, with a spent epoch, the last one:
      PRODUCER_FENCED (another producer took the id since);
    - an open transaction: fence it first (its epoch bumped, then aborted), and retry;
    - otherwise the epoch is bumped: +1, or (spent) a new producer id at epoch 0. With
      ``expected`` at the last epoch, it is a retry of a bump whose answer was lost: the current
      epoch is answered again; at any other epoch, PRODUCER_FENCED."""
    if pending or meta.state in _PREPARED:
        return Decision(ErrorCode.CONCURRENT_TRANSACTIONS)
    if expected is not None and not (
        meta.producer_epoch == NO_EPOCH
        or expected[0] == meta.producer_id
        or (expected[0] == meta.last_producer_id and expected[1] >= EPOCH_EXHAUSTED)
    ):
        return Decision(ErrorCode.PRODUCER_FENCED)
    if meta.state in _OPEN:
        return Decision(fence_first=True)
    assert meta.state in (S.EMPTY, *_COMPLETE), meta.state
    common = {"timeout_ms": timeout_ms, "partitions": frozenset(), "start_ms": -1, "update_ms": now_ms}
    if meta.producer_epoch >= EPOCH_EXHAUSTED and (expected is None or expected[1] == meta.producer_epoch):
        if fresh_producer_id is None:
            return Decision(needs_producer_id=True)
        return Decision(
            write=meta.to(
                S.EMPTY,
                producer_id=fresh_producer_id,
                last_producer_id=meta.producer_id,
                producer_epoch=0,
                last_producer_epoch=meta.producer_epoch if expected is not None else NO_EPOCH,
                **common,
            )
        )
    if expected is None or meta.producer_epoch == NO_EPOCH or expected[1] == meta.producer_epoch:
        last_epoch = NO_EPOCH if expected is None else meta.producer_epoch
        return Decision(
            write=meta.to(
                S.EMPTY, producer_epoch=meta.producer_epoch + 1, last_producer_epoch=last_epoch, **common
            )
        )
    if expected[1] == meta.last_producer_epoch:
        return Decision()  # a retry of the bump that gave the current epoch: answer it again
    return Decision(ErrorCode.PRODUCER_FENCED)


def _check_producer(meta: TxnMetadata, producer_id: int, producer_epoch: int, pending: bool) -> ErrorCode:
    if producer_id != meta.producer_id:
        return ErrorCode.INVALID_PRODUCER_ID_MAPPING
    if producer_epoch != meta.producer_epoch:
        return ErrorCode.PRODUCER_FENCED
    if pending or meta.state in _PREPARED:
        return ErrorCode.CONCURRENT_TRANSACTIONS
    return ErrorCode.NONE


def add_partitions(
    meta: TxnMetadata,
    producer_id: int,
    producer_epoch: int,
    partitions: Iterable[tuple[str, int]],
    *,
    pending: bool,
    now_ms: int,
) -> Decision:
    """AddPartitionsToTxn (and AddOffsetsToTxn, with the group's offsets partition): the
    transaction begins, or grows. Already in it: answered at once."""
    error = _check_producer(meta, producer_id, producer_epoch, pending)
    if error is not ErrorCode.NONE:
        return Decision(error)
    added = frozenset(partitions)
    if meta.state is S.ONGOING and added <= meta.partitions:
        return Decision()
    if meta.state not in (S.EMPTY, S.ONGOING, *_COMPLETE):
        return Decision(ErrorCode.CONCURRENT_TRANSACTIONS)
    start = meta.start_ms if meta.state is S.ONGOING else now_ms
    return Decision(
        write=meta.to(S.ONGOING, partitions=meta.partitions | added, start_ms=start, update_ms=now_ms)
    )


def verify_partitions(
    meta: TxnMetadata | None, producer_id: int, producer_epoch: int, partitions: Iterable[tuple[str, int]]
) -> dict[tuple[str, int], ErrorCode]:
    """KIP-890 part 1, the coordinator's answer to a partition leader (AddPartitionsToTxn v4
    with VerifyOnly) about to append a transactional batch of this producer that would open its
    transaction there: may it? Nothing is written; Kafka's answers, partition by partition:

    - no such transactional id, or another producer id: INVALID_PRODUCER_ID_MAPPING;
    - another epoch: PRODUCER_FENCED (the leader tells the producer INVALID_PRODUCER_EPOCH);
    - the transaction being committed or aborted: CONCURRENT_TRANSACTIONS (retriable);
    - otherwise NONE for each partition the ongoing transaction has added, and
      TRANSACTION_ABORTABLE for the others (the leader tells Produce v10 and older clients
      INVALID_TXN_STATE).

    A write in flight (``pending``) is not consulted, as in Kafka: an EndTxn being written
    finds the partition still in the transaction, and its marker, appended after the batch,
    ends the batch's transaction too; appended before it, the marker voids the leader's
    verification guard and the batch is refused (``storage.producer_state``)."""
    keys = list(partitions)
    if meta is None or meta.state is S.DEAD or producer_id != meta.producer_id:
        return dict.fromkeys(keys, ErrorCode.INVALID_PRODUCER_ID_MAPPING)
    if producer_epoch != meta.producer_epoch:
        return dict.fromkeys(keys, ErrorCode.PRODUCER_FENCED)
    if meta.state in _PREPARED:
        return dict.fromkeys(keys, ErrorCode.CONCURRENT_TRANSACTIONS)
    ongoing = meta.state is S.ONGOING
    return {
        key: ErrorCode.NONE if ongoing and key in meta.partitions else ErrorCode.TRANSACTION_ABORTABLE
        for key in keys
    }


def end_txn(
    meta: TxnMetadata,
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    *,
    pending: bool,
    now_ms: int,
) -> Decision:
    """EndTxn from the producer: Ongoing -> PrepareCommit / PrepareAbort. A retry of an EndTxn
    whose transaction already ended the same way is answered NONE (or CONCURRENT_TRANSACTIONS
    while its markers are still being written); ending it the other way, or ending nothing, is
    INVALID_TXN_STATE."""
    error = _check_producer(meta, producer_id, producer_epoch, pending=pending)
    if error is ErrorCode.CONCURRENT_TRANSACTIONS and not pending:
        # Prepared: the same outcome asked again is a retry, the other one a mistake.
        return Decision(
            ErrorCode.CONCURRENT_TRANSACTIONS if meta.committing == commit else ErrorCode.INVALID_TXN_STATE
        )
    if error is not ErrorCode.NONE:
        return Decision(error)
    if meta.state is S.ONGOING:
        target = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
        return Decision(write=meta.to(target, update_ms=now_ms))
    if meta.state in _COMPLETE and meta.committing == commit:
        return Decision()
    return Decision(ErrorCode.INVALID_TXN_STATE)


def fence(meta: TxnMetadata, *, now_ms: int) -> TxnMetadata:
    """The open transaction's producer is fenced before its transaction is aborted (a new
    producer with its id, or its timeout): PrepareEpochFence at epoch + 1, then PrepareAbort at
    that epoch, which is what is written (``abort_fenced``)."""
    assert meta.state is S.ONGOING, meta.state
    fenced = meta.to(
        S.PREPARE_EPOCH_FENCE, producer_epoch=meta.producer_epoch + 1, last_producer_epoch=NO_EPOCH
    )
    return fenced.to(S.PREPARE_ABORT, update_ms=now_ms)


def complete(meta: TxnMetadata, *, now_ms: int) -> TxnMetadata:
    """Every partition has its marker: PrepareCommit / PrepareAbort -> CompleteCommit /
    CompleteAbort, the partitions forgotten."""
    target = S.COMPLETE_COMMIT if meta.state is S.PREPARE_COMMIT else S.COMPLETE_ABORT
    return meta.to(target, partitions=frozenset(), update_ms=now_ms)


def timed_out(meta: TxnMetadata, now_ms: int) -> bool:
    """An open transaction older than its timeout (``transaction.timeout.ms``): aborted, its
    producer fenced."""
    return meta.state is S.ONGOING and meta.start_ms >= 0 and now_ms > meta.start_ms + meta.timeout_ms


def expired(meta: TxnMetadata, now_ms: int, expiration_ms: int) -> bool:
    """A transactional id with nothing open, unused for ``expiration_ms``: forgotten (Dead, a
    tombstone in ``__transaction_state``)."""
    return meta.state in (S.EMPTY, *_COMPLETE) and now_ms - meta.update_ms > expiration_ms


def on_load(meta: TxnMetadata) -> str:
    """What a coordinator that just loaded this metadata owes it: ``"markers"`` for a
    transaction being prepared (its markers may not all be written: write them again, then
    complete it), ``"watch"`` for an open one (aborted at its timeout), ``"none"`` otherwise."""
    if meta.state in _PREPARED:
        return "markers"
    if meta.state is S.ONGOING:
        return "watch"
    return "none"
