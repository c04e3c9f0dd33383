"""What every target does around its own SQL: fencing, offsets, filtering replays, mapping.

One `apply` is one target transaction:

1. Lock this pipeline's row in `_sluice_fence`. If it holds a newer epoch than ours, another
   execution took the pipeline over: roll back and raise `StaleEpochError`.
2. Read `_sluice_offsets`, the next offset to apply per topic-partition, and drop every record
   below it: those were applied by an earlier commit (a batch replayed after a crash).
3. Refuse the batch if a record names a table the pipeline does not capture (when it was given
   its tables) or one of Sluice's own tables: nothing of it is written.
4. Collapse what is left to the newest change per row (and the newest truncate per table) and
   write it with the version guard. A truncate goes first: it removes the table's rows older
   than its position and raises the table's watermark to it. A row is then replaced only by a
   higher source position than the row's, its tombstone's and its table's watermark, and a
   delete leaves a tombstone with its position, so an older upsert cannot bring the row back.
   Schema changes (op `s`) go after the truncates and before the rows, by the task's
   schema_change_policy, and the rows are translated to the target's columns (evolution.py).
5. Advance the offsets (never backwards) and commit.

Under `on_refused: dlq` a change the target refuses in step 4 (a constraint, a value its column
cannot hold, a mapping error) is isolated by bisection under savepoints and handed to the
caller's sink before the commit (the task's dead-letter topic, `sync.dead_letters`); the rest
of the batch commits. Errors that are not refusals still fail the batch.

So a batch replayed whole or in part changes nothing the second time, and an execution that was
superseded cannot commit anything at all.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sluice import test_switches
from sluice.sync.changes import collapse, to_changes
from sluice.sync.envelope import MARKER, TRUNCATE, BadEventError, is_reserved
from sluice.sync.schema import Recorded
from sluice.sync.targets.evolution import check_policy, schema_step
from sluice.sync.targets.mapping import ColumnMapping

#: Columns of the record tables a target applies: the log's own coordinates and the raw value.
RECORD_COLUMNS = ("topic", "partition", "offset", "value", "timestamp")

POS_COLUMN = "_sluice_pos"


class StaleEpochError(RuntimeError):
    """A commit under an older fencing epoch than the target's: this execution was superseded."""

    def __init__(self, pipeline: str, epoch: int, current: int) -> None:
        super().__init__(
            f"pipeline {pipeline!r}: fencing epoch {epoch} is older than epoch {current} already "
            f"committed to the target; another execution has taken this pipeline over, so this "
            f"one rolled back its batch and stops"
        )
        self.pipeline = pipeline
        self.epoch = epoch
        self.current = current


class BadTargetUrlError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Refusal:
    """A change the target refused (a constraint, a value its column cannot hold, a mapping
    error), as a row of `sync.changes.CHANGE_SCHEMA`, and why."""

    change: dict[str, Any]
    error: str


#: Takes a batch's refused changes inside its transaction, before the commit; raising fails the
#: batch (nothing of it is committed). None: a refusal fails the batch (`on_refused: stop`).
RefusalSink = Callable[[list[Refusal]], None]


@dataclass
class ApplyResult:
    records: int = 0  # records in the batch
    skipped: int = 0  # already applied by an earlier commit (a replay)
    changes: int = 0  # changes left after collapsing to the newest per row
    written: int = 0  # rows inserted, updated or deleted
    refused: int = 0  # changes handed to the refusal sink (dead letters), not written
    offsets: dict[str, dict[int, int]] = field(default_factory=dict)  # next offsets after commit


def batch_next_offsets(records: pa.Table) -> dict[tuple[str, int], int]:
    """The next offset per topic-partition after this batch (max offset + 1)."""
    if records.num_rows == 0:
        return {}
    grouped = records.group_by(["topic", "partition"]).aggregate([("offset", "max")])
    return {
        (t, p): o + 1
        for t, p, o in zip(
            grouped.column("topic").to_pylist(),
            grouped.column("partition").to_pylist(),
            grouped.column("offset_max").to_pylist(),
            strict=True,
        )
    }


def drop_applied(records: pa.Table, applied: Mapping[tuple[str, int], int]) -> pa.Table:
    """Records at or above each partition's stored next offset (the rest were applied already)."""
    if records.num_rows == 0 or not applied:
        return records
    keep = None
    for (topic, partition), next_offset in applied.items():
        here = pc.and_(pc.equal(records["topic"], topic), pc.equal(records["partition"], partition))
        old = pc.and_(here, pc.less(records["offset"], next_offset))
        keep = old if keep is None else pc.or_(keep, old)
    assert keep is not None
    return records.filter(pc.invert(keep))


class Target(ABC):
    """A database that change events are applied to. Subclasses supply the SQL."""

    url: str
    #: Executors can stage a batch's rows in this target for the driver to commit with
    #: `apply_staged` (a `staging.StagingTarget`); otherwise the driver applies rows it holds.
    stages_in_executors = False
    #: Reading the fence or the offsets is a job of the worker's own Spark (Delta): a running
    #: execution reports the offsets of its own last commit instead of reading them each tick.
    status_from_commits = False

    def __init__(
        self,
        url: str,
        mapping: ColumnMapping | None = None,
        tables: Collection[str] | None = None,
        switches: test_switches.Switches = test_switches.OFF,
        schema_change_policy: str = "evolve",
    ) -> None:
        self.url = url
        self.schema_change_policy = check_policy(schema_change_policy)
        self.mapping = mapping or ColumnMapping()
        # The source tables this pipeline applies (None: any table that is not Sluice's own).
        self.tables = frozenset(tables) if tables else None
        self.switches = switches

    # --- what subclasses implement ---------------------------------------------------------------
    @abstractmethod
    def _transaction(self) -> Any:
        """A context manager for one transaction; the value it yields is passed to the hooks."""

    def _read_transaction(self) -> Any:
        """A transaction for reading the fence and offsets only (status reads, start-up); a
        target whose write transactions lock out others gives a lighter one here."""
        return self._transaction()

    @abstractmethod
    def _lock_epoch(self, tx: Any, pipeline: str) -> int | None:
        """Lock the pipeline's fence row against concurrent commits and return its epoch."""

    @abstractmethod
    def _set_epoch(self, tx: Any, pipeline: str, epoch: int) -> None: ...

    @abstractmethod
    def _peek_epoch(self, tx: Any, pipeline: str) -> int | None:
        """The pipeline's fence epoch, read without locking the row."""

    @abstractmethod
    def _read_offsets(self, tx: Any, pipeline: str) -> dict[tuple[str, int], int]: ...

    @abstractmethod
    def _write_offsets(
        self, tx: Any, pipeline: str, epoch: int, offsets: Mapping[tuple[str, int], int]
    ) -> None:
        """Store next offsets; the SQL keeps the larger of the stored and the new value."""

    @abstractmethod
    def _apply_changes(self, tx: Any, changes: pa.Table, guard: bool) -> int:
        """Write collapsed changes (one per row, `sync.changes` columns); return rows written.
        A row is written only if its position is above its row's, its tombstone's and its
        table's truncate watermark (`guard`)."""

    @abstractmethod
    def _apply_truncates(self, tx: Any, truncates: Mapping[str, int], guard: bool) -> int:
        """For each source table -> truncate position: delete the target table's rows older
        than it, raise the table's watermark to it (never lower it) and drop the tombstones it
        covers; return rows deleted."""

    # Refusal isolation (`on_refused: dlq`): savepoints inside the batch's transaction, and which
    # of the driver's errors mean "this row cannot be written" rather than "the target failed".
    @abstractmethod
    def _savepoint(self, tx: Any) -> None: ...

    @abstractmethod
    def _rollback_to(self, tx: Any) -> None:
        """Undo everything since the savepoint (which stays) and forget cached table layouts."""

    @abstractmethod
    def _release(self, tx: Any) -> None: ...

    @abstractmethod
    def _is_refusal(self, exc: BaseException) -> bool:
        """A refused row (constraint, value, mapping), not a failing target (connection, fence)."""

    # schema changes (evolution.py): the history, and the target's own DDL
    @abstractmethod
    def _read_schema_history(self, tx: Any, tables: list[str]) -> dict[str, list[Recorded]]:
        """The recorded schema changes of these source tables (`_sluice_schema`)."""

    @abstractmethod
    def _record_schema_change(
        self, tx: Any, table: str, pos: int, doc: Mapping[str, Any], applied: bool
    ) -> bool:
        """Record a schema change by (table, position); False when it was recorded already."""

    @abstractmethod
    def _existing_columns(self, tx: Any, name: str) -> list[str]:
        """The columns of a target table (none when it does not exist)."""

    @abstractmethod
    def _drop_column(self, tx: Any, name: str, column: str) -> None: ...

    @abstractmethod
    def _rename_column(self, tx: Any, name: str, old: str, new: str) -> None: ...

    @abstractmethod
    def _change_column_type(self, tx: Any, name: str, column: str, source_type: str) -> None:
        """Give the column the type the target gives values of `source_type` (the rows are read
        again after a type change, so a value that does not convert may become null here)."""

    @abstractmethod
    def _drop_table(self, tx: Any, name: str) -> None: ...

    @abstractmethod
    def read_rows(self, table: str) -> dict[str, dict[str, Any]]:
        """Every row of a (source) table in the target, keyed by `envelope.key_text`."""

    @abstractmethod
    def close(self) -> None: ...

    # Batches the executors staged: `staging.StagingTarget` does these; other targets refuse.
    def _applies_from_the_driver(self) -> NotImplementedError:
        return NotImplementedError(f"{type(self).__name__} applies batches from the driver (Target.apply)")

    def prepare_staging(self, pipeline: str, epoch: int) -> str:
        """Make the staging table of one execution and return its name."""
        raise self._applies_from_the_driver()

    def drop_staging(self, pipeline: str, epoch: int) -> list[str]:
        """Drop the staging tables of `epoch` and older executions; return their names."""
        raise self._applies_from_the_driver()

    def apply_staged(
        self,
        pipeline: str,
        epoch: int,
        batch: int,
        summaries: pa.Table,
        on_refused: RefusalSink | None = None,
    ) -> ApplyResult:
        """Commit one batch the executors staged, from their summaries, in one transaction."""
        raise self._applies_from_the_driver()

    # --- shared ----------------------------------------------------------------------------------
    def claim(self, pipeline: str, epoch: int | None = None) -> int:
        """Take the pipeline for a new execution and return the epoch it runs under.

        With no epoch, the next one after the stored epoch is taken (fencing every earlier
        execution); with an epoch, it must not be older than the stored one."""
        with self._transaction() as tx:
            current = self._lock_epoch(tx, pipeline)
            if epoch is None:
                epoch = (current or 0) + 1
            elif current is not None and epoch < current and not self.switches.disable_target_fence:
                raise StaleEpochError(pipeline, epoch, current)
            if current != epoch:
                self._set_epoch(tx, pipeline, epoch)
        return epoch

    def current_epoch(self, pipeline: str) -> int | None:
        with self._transaction() as tx:
            return self._lock_epoch(tx, pipeline)

    def fence_epoch(self, pipeline: str) -> int | None:
        """The epoch holding the pipeline now, read without waiting for a commit in flight (an
        execution taking a new epoch must go past every epoch the target has seen)."""
        with self._read_transaction() as tx:
            return self._peek_epoch(tx, pipeline)

    def applied_offsets(self, pipeline: str) -> dict[tuple[str, int], int]:
        with self._read_transaction() as tx:
            return self._read_offsets(tx, pipeline)

    def apply(
        self, pipeline: str, epoch: int, records: pa.Table, on_refused: RefusalSink | None = None
    ) -> ApplyResult:
        """Apply one batch in one transaction (see the module docstring).

        `records` is a table of changes (`sync.changes.CHANGE_SCHEMA`), or raw log records with a
        `value` column, which are parsed here. With `on_refused`, changes the target refuses are
        handed to it before the commit and the rest of the batch commits (`_write_isolating`)."""
        if "value" in records.column_names:
            records = pa.Table.from_batches([to_changes(records)]) if records.num_rows else records
        result = ApplyResult(records=_count(records))
        test_switches.pause_point(self.switches, "apply-commit")
        with self._transaction() as tx:
            self._check_fence(tx, pipeline, epoch)
            applied = self._read_offsets(tx, pipeline)
            self._batch_begins(tx, pipeline, epoch, applied, batch_next_offsets(records))
            fresh = drop_applied(records, applied)
            if fresh.num_rows and "op" in fresh.column_names:
                fresh = fresh.filter(pc.not_equal(fresh["op"], MARKER))  # position markers: no rows
            result.skipped = result.records - _count(fresh)
            if fresh.num_rows:
                self._refuse_foreign_tables(fresh)
                collapsed = collapse(fresh)
                result.changes = collapsed.num_rows
                result.written += self._apply_collapsed(tx, pipeline, collapsed, on_refused, result)
            merged = self._advance_offsets(tx, pipeline, epoch, applied, batch_next_offsets(records))
            test_switches.crash_point(self.switches, "before-commit", count=True)
        test_switches.crash_point(self.switches, "after-commit")
        result.offsets = nested_offsets(merged)
        return result

    def _batch_begins(
        self,
        tx: Any,
        pipeline: str,
        epoch: int,
        applied: Mapping[tuple[str, int], int],
        new: Mapping[tuple[str, int], int],
    ) -> None:
        """After the fence and the stored offsets are read, before anything is written (a target
        whose commits carry the batch's identity takes it here: targets/delta.py)."""
        return None

    def _check_fence(self, tx: Any, pipeline: str, epoch: int) -> None:
        """Lock the pipeline's fence row; refuse a commit under an older epoch (I8), take a
        newer one."""
        current = self._lock_epoch(tx, pipeline)
        if current is not None and epoch < current:
            if not self.switches.disable_target_fence:
                raise StaleEpochError(pipeline, epoch, current)
        elif current != epoch:
            self._set_epoch(tx, pipeline, epoch)

    def _advance_offsets(
        self,
        tx: Any,
        pipeline: str,
        epoch: int,
        applied: Mapping[tuple[str, int], int],
        new: Mapping[tuple[str, int], int],
    ) -> dict[tuple[str, int], int]:
        """Store the batch's next offsets (never lower than stored) and return all of them."""
        merged = merge_offsets(applied, new)
        self._write_offsets(tx, pipeline, epoch, {tp: merged[tp] for tp in new})
        return merged

    def _apply_collapsed(
        self, tx: Any, pipeline: str, collapsed: pa.Table, on_refused: RefusalSink | None, result: ApplyResult
    ) -> int:
        """Write a batch's collapsed, not yet applied changes: truncates first, then schema
        changes (evolution.py), then rows; return rows written."""
        guard = not self.switches.disable_version_guard
        written = 0
        is_truncate = pc.equal(collapsed["op"], TRUNCATE)
        truncates = collapsed.filter(is_truncate)
        if truncates.num_rows:
            marks = dict(zip(truncates["table"].to_pylist(), truncates["pos"].to_pylist(), strict=True))
            written += self._apply_truncates(tx, marks, guard)
            collapsed = collapsed.filter(pc.invert(is_truncate))
        if collapsed.num_rows:
            collapsed = schema_step(self, tx, pipeline, collapsed)
        if collapsed.num_rows:
            written += self._write_isolating(tx, collapsed, guard, on_refused, result)
        return written

    def _write_isolating(
        self, tx: Any, changes: pa.Table, guard: bool, on_refused: RefusalSink | None, result: ApplyResult
    ) -> int:
        """`_apply_changes`, and with a sink: the changes the target refuses found by bisection
        under savepoints, every other change written, and the refused ones handed to the sink
        inside the transaction (so a sink that fails, say a dead letter not acknowledged, fails
        the whole batch: every change is written, handed over, or the batch fails)."""
        if on_refused is None:
            return self._apply_changes(tx, changes, guard)
        refused: list[Refusal] = []
        written = self._bisect(tx, changes, guard, refused)
        assert len(refused) <= changes.num_rows
        if refused:
            on_refused(refused)
            result.refused += len(refused)
        return written

    def _bisect(self, tx: Any, changes: pa.Table, guard: bool, refused: list[Refusal]) -> int:
        """Write `changes` under a savepoint; if the target refuses them, undo and write each half
        the same way, down to the single refused changes (about 2 log2(n) tries per refusal)."""
        self._savepoint(tx)
        try:
            written = self._apply_changes(tx, changes, guard)
        except Exception as exc:
            if not self._is_refusal(exc):
                raise  # the transaction rolls back whole: the batch fails
            self._rollback_to(tx)
            self._release(tx)
            if changes.num_rows == 1:
                refused.append(Refusal(changes.to_pylist()[0], f"{type(exc).__name__}: {exc}".strip()))
                return 0
            half = changes.num_rows // 2
            return self._bisect(tx, changes.slice(0, half), guard, refused) + self._bisect(
                tx, changes.slice(half), guard, refused
            )
        self._release(tx)
        return written

    def _refuse_foreign_tables(self, changes: pa.Table) -> None:
        """A record naming one of Sluice's own tables, or a table this pipeline was not given,
        fails the batch with the record named (nothing of the batch is written)."""

        def first(table: str) -> dict[str, Any]:
            return dict(changes.filter(pc.equal(changes["table"], table)).slice(0, 1).to_pylist()[0])

        self._refuse_tables(pc.unique(changes["table"]).to_pylist(), first)

    def _refuse_tables(self, tables: list[str], first: Callable[[str], dict[str, Any]]) -> None:
        """`_refuse_foreign_tables` for the tables a batch changes; `first(table)` is the batch's
        first change of a table (topic, partition, offset), for the message."""
        for table in tables:
            reserved = is_reserved(table)
            if not reserved and (self.tables is None or table in self.tables):
                continue
            first_change = first(table)
            where = f"{first_change['topic']}[{first_change['partition']}]@{first_change['offset']}"
            why = (
                "names starting with _sluice are Sluice's own tables (fence, offsets, tombstones)"
                if reserved
                else f"this pipeline applies only {', '.join(sorted(self.tables or ()))}"
            )
            raise BadEventError(
                f"record at {where} changes table {table!r}, which this pipeline must not write: {why}. "
                "Nothing of the batch was written; remove the record's producer or add the table to "
                "the task's tables"
            )

    def __enter__(self) -> Target:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def merge_offsets(
    applied: Mapping[tuple[str, int], int], new: Mapping[tuple[str, int], int]
) -> dict[tuple[str, int], int]:
    """The stored next offsets with a batch's, each the larger (offsets never go back)."""
    merged = dict(applied)
    for tp, nxt in new.items():
        merged[tp] = max(nxt, merged.get(tp, 0))
    return merged


def nested_offsets(offsets: Mapping[tuple[str, int], int]) -> dict[str, dict[int, int]]:
    """{(topic, partition): offset} as {topic: {partition: offset}} (ApplyResult.offsets)."""
    out: dict[str, dict[int, int]] = {}
    for (t, p), o in sorted(offsets.items()):
        out.setdefault(t, {})[p] = o
    return out


def _count(changes: pa.Table) -> int:
    """Log records a changes table stands for (rows collapsed in the executors count for several)."""
    if "records" not in changes.column_names:
        return changes.num_rows
    return int(pc.sum(changes["records"]).as_py() or 0)


def infer_type(values: list[Any], dialect: str) -> str:
    """A column type for JSON values (and bytes): the first non-null value decides."""
    for v in values:
        if v is None:
            continue
        kind = _INFERRED[dialect]
        if isinstance(v, (bytes, bytearray)):
            return kind["bytes"]
        if isinstance(v, bool):
            return kind["bool"]
        if isinstance(v, int):
            return kind["int"]
        if isinstance(v, float):
            return kind["float"]
        if isinstance(v, (dict, list)):
            return kind["json"]
        return kind["text"]
    return _INFERRED[dialect]["text"]


#: Column types for JSON values of a source that names no types, per target dialect.
_INFERRED = {
    "postgresql": {"bytes": "BYTEA", "bool": "BOOLEAN", "int": "BIGINT", "float": "DOUBLE PRECISION",
                   "json": "JSONB", "text": "TEXT"},
    "sqlite": {"bytes": "BLOB", "bool": "INTEGER", "int": "INTEGER", "float": "REAL", "json": "TEXT",
               "text": "TEXT"},
    "mysql": {"bytes": "LONGBLOB", "bool": "TINYINT(1)", "int": "BIGINT", "float": "DOUBLE", "json": "JSON",
              "text": "LONGTEXT"},
}  # fmt: skip


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
