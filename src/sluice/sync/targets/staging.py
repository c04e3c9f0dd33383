"""Executors stage a micro-batch's changes in the PostgreSQL target; the driver commits them.

(The MySQL/MariaDB target stages the same way, with the same tokens, summaries and checks:
sync/targets/mysql_stage.py says where it differs.)

The rows of a batch never pass through the Spark driver. When an execution of a pipeline starts,
the driver creates its UNLOGGED staging table (`staging_table`: named by the pipeline and the
fencing epoch) and removes older executions' tables. Each Spark task reads its ranges, parses and
collapses them and, in the same Python worker (`stage_changes`, called by the sluice source's
reader with `stage.*` options, or fused after `map_to_changes` with Spark's Kafka source), takes a
random 63-bit token and COPYs the collapsed changes into that table tagged with the token, in a
transaction of its own. The task returns a few summary rows (`SUMMARY_DDL`): its token, how many
rows it staged, and per topic-partition the next offset and the records read. The driver collects
only those (bytes per task, not per change) and commits the batch in one target transaction
(`StagingTarget.apply_staged`): fence, offsets, the version guard and the merge of the rows
staged under the summaries' tokens, nothing else. After the commit it empties the table.

Why staged rows that must not be merged never are:

- A task attempt that failed (its executor killed, its connection lost) either never committed
  its COPY, or committed it under a token that is in no summary the driver collected: Spark
  hands `collect` the result of one successful attempt per task. Its rows sit in the table,
  unread, until the table is emptied after a commit.
- Rows of an earlier batch are never read either: each batch merges its own tokens only, and a
  token is a fresh random number per task attempt.
- A zombie execution (an older epoch, a driver that lost the pipeline) stages into the table of
  its own epoch, which the current execution never reads; its commit fails the fence.
- The driver checks that every listed token's row count in the table equals its summary's before
  merging anything (a restarted PostgreSQL empties UNLOGGED tables): a batch missing staged rows
  fails and is run again, it never commits part of itself.
- After each commit the driver truncates its table (a task of a zombie attempt still writing
  holds it: then a later commit does), when an execution starts it drops every older
  execution's table, and when it stops it drops its own (`StagingTarget.drop_staging`).

The executors reach the target with the pipeline's URL and password (shipped in the task, as the
source's broker credentials are). A Python worker keeps one connection per target and reuses it
across batches (Spark reuses its Python workers): no per-batch connection set-up.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
import threading
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sluice import test_switches
from sluice.sync.envelope import MARKER
from sluice.sync.targets.base import ApplyResult, RefusalSink, Target, nested_offsets
from sluice.sync.targets.pg_copy import copy_payloads, strip_nul

log = logging.getLogger("sluice.target")


class StagingLostError(RuntimeError):
    """Rows the executors staged for a batch are not (all) in its staging table."""


#: What each task returns to the driver (Spark DDL): one row per topic-partition it read.
#: `staged` and `nul_stripped` are the task's totals, on each of its rows; the freshness
#: histogram (source timestamps in buckets of `ts_bucket_ms`) is on its first row only.
SUMMARY_DDL = (
    "token long, topic string, partition int, next_offset long, records long, staged long, "
    "nul_stripped long, ts_bucket_ms long, ts_ms array<long>, ts_count array<long>"
)

#: The staged rows' columns (the COPY's column list) and the table's DDL.
STAGED_COLUMNS = ["token", "topic", "partition", "offset", "ts", "tbl", "key", "pos", "op", "after",
                  "records", "binary", "types"]  # fmt: skip
STAGED_DDL = (
    'token bigint NOT NULL, topic text NOT NULL, partition int NOT NULL, "offset" bigint NOT NULL, '
    "ts bigint, tbl text NOT NULL, key text NOT NULL, pos bigint NOT NULL, op text NOT NULL, "
    'after jsonb, records int NOT NULL, "binary" text, types text'
)

#: A freshness histogram keeps at most this many buckets per task (wider buckets beyond), so
#: what a task returns stays small whatever its partition holds.
MAX_BUCKETS = 1024

_PREFIX = "_sluice_staged_"


def pipeline_tag(pipeline: str) -> str:
    return hashlib.sha256(pipeline.encode()).hexdigest()[:12]


def staging_table(pipeline: str, epoch: int) -> str:
    """The staging table of one execution of a pipeline (a name PostgreSQL keeps whole)."""
    return f"{_PREFIX}{pipeline_tag(pipeline)}_{epoch}"


def staging_pattern(pipeline: str) -> str:
    """A LIKE pattern matching every staging table of `pipeline` (underscores escaped)."""
    return (_PREFIX + pipeline_tag(pipeline) + "_").replace("_", "\\_") + "%"


def parse_staging_table(name: str, pipeline: str) -> int | None:
    """The epoch of one of `pipeline`'s staging tables (also of the per-batch tables earlier
    versions made, `<epoch>_<batch>`), or None for any other name."""
    m = re.fullmatch(re.escape(_PREFIX + pipeline_tag(pipeline)) + r"_(\d+)(?:_\d+)?", name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class StageSpec:
    """What a task needs to stage its rows: where, and into which table."""

    url: str
    table: str
    password: str | None = field(default=None, repr=False)

    def options(self) -> dict[str, str]:
        """The sluice source's `stage.*` options that make its readers stage (`from_options`).
        Spark redacts the password in plans and the UI (its key says password)."""
        out = {"stage.url": self.url, "stage.table": self.table}
        if self.password is not None:
            out["stage.password"] = self.password
        return out

    @classmethod
    def from_options(cls, options: dict[str, str]) -> StageSpec | None:
        lowered = {k.lower(): v for k, v in options.items()}
        url, table = lowered.get("stage.url"), lowered.get("stage.table")
        if url is None and table is None:
            return None
        if not url or not table:
            raise ValueError("staging needs both options stage.url and stage.table")
        return cls(url, table, lowered.get("stage.password"))


_connections: dict[tuple[str, str | None], Any] = {}
_connections_lock = threading.Lock()


def is_mysql(url: str) -> bool:
    from sluice.sync.targets.mysql_stage import SCHEMES

    return url.startswith(SCHEMES)


def _open(spec: StageSpec) -> Any:
    if is_mysql(spec.url):
        from sluice.sync.targets.mysql_stage import connect

        return connect(spec.url, spec.password)
    import psycopg

    extra: dict[str, Any] = {} if spec.password is None else {"password": spec.password}
    return psycopg.connect(spec.url, autocommit=True, **extra)


def _usable(conn: Any) -> bool:
    if hasattr(conn, "broken"):  # psycopg
        return not (conn.closed or conn.broken)
    return bool(conn.open)  # PyMySQL


def connection(spec: StageSpec) -> Any:
    """This Python worker's connection to the target (made once, made again when broken)."""
    key = (spec.url, spec.password)
    with _connections_lock:
        conn = _connections.get(key)
        if conn is not None and not _usable(conn):
            _connections.pop(key, None)
            conn = None
        if conn is None:
            conn = _open(spec)
            _connections[key] = conn
        return conn


def forget(spec: StageSpec) -> None:
    """Close and drop this worker's connection (a task failed on it: it may be in any state)."""
    with _connections_lock:
        conn = _connections.pop((spec.url, spec.password), None)
    if conn is not None:
        try:
            conn.close()
        except Exception:
            pass  # it is broken already


def stage_changes(spec: StageSpec) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """What a task runs after its parse and collapse: changes (`sync.changes.CHANGE_SCHEMA`) in,
    the task's summary rows (`SUMMARY_DDL`) out, its rows written into `spec.table` under its
    token (COPY on PostgreSQL, multi-row INSERTs on MySQL: `mysql_stage.insert_staged`), in one
    transaction of the task's own."""
    if is_mysql(spec.url):
        from sluice.sync.targets.mysql_stage import insert_staged as write
    else:
        write = _copy_staged

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task = Task(secrets.randbits(63))
        try:
            write(connection(spec), spec.table, task, batches)
        except BaseException:
            forget(spec)
            raise
        if task.ends:
            yield summary(task.token, task.ends, task.counts, task.staged, task.stripped, task.stamps)

    return run


def _copy_staged(conn: Any, table: str, task: Task, batches: Iterable[pa.RecordBatch]) -> None:
    """COPY a task's rows into a PostgreSQL staging table (U+0000 dropped from values: text
    there cannot hold it; counted in the summary)."""
    columns = ", ".join(f'"{c}"' for c in STAGED_COLUMNS)
    with conn.transaction(), conn.cursor() as cur, cur.copy(f'COPY "{table}" ({columns}) FROM STDIN') as copy:
        for batch in batches:
            rows = task.add(batch)
            if rows is None:
                continue
            rows, n = strip_nul(rows, check_keys=False)
            task.stripped += n
            for payload in copy_payloads(rows, STAGED_COLUMNS):
                copy.write(payload)


def map_and_stage(spec: StageSpec) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The `mapInArrow` function over Spark's Kafka source: log records in, summaries out."""
    from sluice.sync.changes import map_to_changes

    stage = stage_changes(spec)

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return stage(map_to_changes(batches))

    return run


@dataclass
class Task:
    """What one task has staged so far."""

    token: int
    ends: dict[tuple[str, int], int] = field(default_factory=dict)
    counts: dict[tuple[str, int], int] = field(default_factory=dict)
    stamps: list[pa.Array] = field(default_factory=list)
    staged: int = 0
    stripped: int = 0

    def add(self, batch: pa.RecordBatch) -> pa.Table | None:
        """Count a batch of changes and return its rows to stage: the change's columns (`table`
        named `tbl`), the task's token and `ts` (the source timestamp in ms); None when it holds
        nothing to stage (position markers count for the offsets only)."""
        if not batch.num_rows:
            return None
        rows = pa.Table.from_batches([batch])
        _count_offsets(rows, self.ends, self.counts)
        rows = rows.filter(pc.not_equal(rows["op"], MARKER))  # position markers: offsets only
        if not rows.num_rows:
            return None
        ms = pc.cast(pc.cast(rows["timestamp"], pa.timestamp("ms", tz="UTC")), pa.int64()).combine_chunks()
        self.stamps.append(ms)
        rows = rows.append_column("token", pa.repeat(pa.scalar(self.token, pa.int64()), rows.num_rows))
        rows = rows.append_column("ts", ms)
        rows = rows.rename_columns(["tbl" if c == "table" else c for c in rows.column_names])
        self.staged += rows.num_rows
        return rows


def _count_offsets(
    rows: pa.Table, ends: dict[tuple[str, int], int], counts: dict[tuple[str, int], int]
) -> None:
    grouped = rows.group_by(["topic", "partition"]).aggregate([("offset", "max"), ("records", "sum")])
    for t, p, o, n in zip(
        grouped["topic"].to_pylist(), grouped["partition"].to_pylist(),
        grouped["offset_max"].to_pylist(), grouped["records_sum"].to_pylist(), strict=True,
    ):  # fmt: skip
        ends[(t, p)] = max(ends.get((t, p), 0), o + 1)
        counts[(t, p)] = counts.get((t, p), 0) + int(n or 0)


def histogram(stamps: list[pa.Array]) -> tuple[int, list[int], list[int]]:
    """Source timestamps (ms) as (bucket width, bucket starts, counts), at most MAX_BUCKETS."""
    if not stamps:
        return 1, [], []
    ms = pa.concat_arrays(stamps)
    width = 1
    while True:
        starts = pc.multiply(pc.divide(ms, width), width) if width > 1 else ms
        counted = pc.value_counts(starts)
        if len(counted) <= MAX_BUCKETS:
            return width, counted.field("values").to_pylist(), counted.field("counts").to_pylist()
        width *= 4


def summary(
    token: int,
    ends: dict[tuple[str, int], int],
    counts: dict[tuple[str, int], int],
    staged: int,
    stripped: int,
    stamps: list[pa.Array],
) -> pa.RecordBatch:
    width, starts, hits = histogram(stamps)
    parts = sorted(ends)
    n = len(parts)
    return pa.RecordBatch.from_pydict(
        {
            "token": pa.array([token] * n, pa.int64()),
            "topic": pa.array([t for t, _ in parts], pa.string()),
            "partition": pa.array([p for _, p in parts], pa.int32()),
            "next_offset": pa.array([ends[tp] for tp in parts], pa.int64()),
            "records": pa.array([counts[tp] for tp in parts], pa.int64()),
            "staged": pa.array([staged] * n, pa.int64()),
            "nul_stripped": pa.array([stripped] * n, pa.int64()),
            "ts_bucket_ms": pa.array([width] * n, pa.int64()),
            "ts_ms": pa.array([starts] + [[]] * (n - 1), pa.list_(pa.int64())),
            "ts_count": pa.array([hits] + [[]] * (n - 1), pa.list_(pa.int64())),
        }
    )


def binary_columns(texts: Iterable[str | None] | None) -> set[str]:
    """The columns holding bytes, from the distinct `binary` lists of a table's changes."""
    import orjson

    out: set[str] = set()
    for text in texts or []:
        if text is not None:
            out.update(orjson.loads(text))
    return out


def changes_table(rows: list[tuple[Any, ...]]) -> pa.Table:
    """Staged rows read back into the driver, each (topic, partition, offset, ts ms, tbl, key,
    pos, op, after text, records, binary, types), as changes (`sync.changes.CHANGE_SCHEMA`)."""
    from sluice.sync.changes import CHANGE_SCHEMA

    cols = list(zip(*rows, strict=True)) if rows else [()] * len(CHANGE_SCHEMA)
    types = [pa.int64() if f.name == "timestamp" else f.type for f in CHANGE_SCHEMA]
    arrays = [pa.array(c, t) for c, t in zip(cols, types, strict=True)]
    arrays[3] = arrays[3].cast(pa.timestamp("ms")).cast(CHANGE_SCHEMA.field("timestamp").type)
    return pa.Table.from_arrays(arrays, schema=CHANGE_SCHEMA)


def staged_counts(summaries: pa.Table) -> dict[int, int]:
    """Token -> rows staged under it, from the tasks' summaries (tokens that staged nothing
    are left out: there is nothing of them to check or merge)."""
    if not summaries.num_rows:
        return {}
    return {
        int(t): int(n)
        for t, n in zip(summaries["token"].to_pylist(), summaries["staged"].to_pylist(), strict=True)
        if n
    }


def next_offsets(summaries: pa.Table) -> dict[tuple[str, int], int]:
    """The batch's next offset per topic-partition, from the tasks' summaries."""
    out: dict[tuple[str, int], int] = {}
    for t, p, o in zip(
        summaries["topic"].to_pylist(), summaries["partition"].to_pylist(),
        summaries["next_offset"].to_pylist(), strict=True,
    ):  # fmt: skip
        out[(t, p)] = max(o, out.get((t, p), 0))
    return out


def freshness_ms(summaries: pa.Table, committed_ms: int) -> list[int]:
    """Commit time minus each staged change's source timestamp (bucket midpoints), from the
    tasks' histograms: what `BatchReport.freshness_ms` holds for a batch staged in executors."""
    out: list[int] = []
    for width, starts, hits in zip(
        summaries["ts_bucket_ms"].to_pylist(), summaries["ts_ms"].to_pylist(),
        summaries["ts_count"].to_pylist(), strict=True,
    ):  # fmt: skip
        for start, count in zip(starts or [], hits or [], strict=True):
            out.extend([committed_ms - (start + width // 2)] * count)
    return out


class StagingTarget(Target):
    """A target the executors stage batches in (this module) and whose driver commits them: the
    steps every such target takes, in one place; each target's SQL in the hooks below."""

    stages_in_executors = True

    def prepare_staging(self, pipeline: str, epoch: int) -> str:
        """Create the staging table of this execution (empty), drop older executions' tables
        (`drop_staging`), and return its name."""
        self.drop_staging(pipeline, epoch - 1)
        name = staging_table(pipeline, epoch)
        self._create_staging_table(name)
        return name

    def drop_staging(self, pipeline: str, epoch: int) -> list[str]:
        """Drop every staging table of `pipeline` from `epoch` or an older one (a dead driver's,
        a zombie's, this execution's when it stops); return their names. A table still locked (a
        task of a zombie still writing) is left for the next execution; it is never read."""
        dropped = []
        for name in self._staging_tables(staging_pattern(pipeline)):
            tag = parse_staging_table(name, pipeline)
            if tag is None or tag > epoch:
                continue
            if self._staging_ddl("DROP TABLE IF EXISTS", name, "a later start drops it"):
                dropped.append(name)
        return dropped

    def _staging_ddl(self, verb: str, table: str, later: str) -> bool:
        """Drop or empty a staging table (`verb` then its name) in a transaction of its own,
        unless a task still writing to it holds it for 2 s or it is gone: then leave it to
        `later`. Returns whether it ran."""
        kept = self._try_staging_ddl(verb, table)
        if kept is not None:
            log.info("event=staging_kept table=%s reason=%r", table, f"{kept}: {later}")
        return kept is None

    def apply_staged(
        self,
        pipeline: str,
        epoch: int,
        batch: int,
        summaries: pa.Table,
        on_refused: RefusalSink | None = None,
    ) -> ApplyResult:
        """Commit one batch the executors staged (`stage_changes`), in one transaction: the
        fence, the offsets, then the rows staged under the summaries' tokens, collapsed to the
        newest change per row and merged with the version guard as `apply` writes them
        (`_merge_staged`: in SQL, or read into the driver where the target's SQL cannot).

        Rows another attempt, batch or execution staged are never read. After the commit the
        table is emptied: the batch's rows, merged now, and any a failed attempt left."""
        stage = staging_table(pipeline, epoch)
        expected = staged_counts(summaries)
        records = int(pc.sum(summaries["records"]).as_py() or 0) if summaries.num_rows else 0
        result = ApplyResult(records=records)
        test_switches.pause_point(self.switches, "apply-commit")
        with self._transaction() as tx:
            self._check_fence(tx, pipeline, epoch)
            applied = self._read_offsets(tx, pipeline)
            if expected:
                rows = self._staged_rows(stage, pipeline, applied, list(expected))
                fresh = self._check_staged(tx, rows, stage, expected)
                result.skipped = records - fresh
                if fresh:
                    result.written += self._merge_staged(tx, pipeline, rows, on_refused, result)
            merged = self._advance_offsets(tx, pipeline, epoch, applied, next_offsets(summaries))
            test_switches.crash_point(self.switches, "before-commit", count=True)
        test_switches.crash_point(self.switches, "after-commit")
        result.offsets = nested_offsets(merged)
        self._after_staged_commit(pipeline, batch, summaries)
        if expected:
            self._staging_ddl("TRUNCATE TABLE", stage, "a later commit empties it")
        return result

    def _check_staged(self, tx: Any, rows: Any, stage: str, expected: Mapping[int, int]) -> int:
        """Every listed token's rows are in the staging table, all of them (a restarted
        PostgreSQL empties UNLOGGED tables; a dropped table is gone): else fail the batch.
        Returns the records the batch's rows not applied yet stand for."""
        found = self._staged_per_token(tx, rows)
        missing = {t: n for t, n in expected.items() if found.get(t, (0, 0))[0] != n}
        if missing:
            token, n = next(iter(missing.items()))
            raise StagingLostError(
                f"the executors staged rows for this batch in {stage}, but {len(missing)} of "
                f"its {len(expected)} tasks' rows are not all there (token {token}: "
                f"{found.get(token, (0, 0))[0]} of {n} rows; was the target restarted, or the table "
                "dropped?). Nothing of the batch was committed; the query stops, and run again it "
                "stages the batch anew"
            )
        return sum(fresh for _, fresh in found.values())

    def _after_staged_commit(self, pipeline: str, batch: int, summaries: pa.Table) -> None:
        """What a target says once a staged batch committed (nothing by default)."""

    # -- each target's SQL --------------------------------------------------------------------------
    @abstractmethod
    def _create_staging_table(self, name: str) -> None:
        """(Re)create one execution's staging table, empty; fail rather than wait for good on a
        task of an earlier query still writing to it."""

    @abstractmethod
    def _staging_tables(self, pattern: str) -> list[str]:
        """The names of the tables matching the LIKE `pattern` (`staging_pattern`)."""

    @abstractmethod
    def _try_staging_ddl(self, verb: str, table: str) -> str | None:
        """Run `verb` on `table` in a transaction of its own, waiting at most 2 s for its lock;
        None when it ran, else why it was left (the lock was held, the table is gone)."""

    @abstractmethod
    def _staged_rows(
        self, stage: str, pipeline: str, applied: Mapping[tuple[str, int], int], tokens: list[int]
    ) -> Any:
        """The target's handle on the batch's staged rows: those of `tokens` in `stage`."""

    @abstractmethod
    def _staged_per_token(self, tx: Any, rows: Any) -> dict[int, tuple[int, int]]:
        """Per token of the batch: its rows in the staging table and the records its rows not
        applied yet stand for (empty when the table is gone)."""

    @abstractmethod
    def _merge_staged(
        self, tx: Any, pipeline: str, rows: Any, on_refused: RefusalSink | None, result: ApplyResult
    ) -> int:
        """Write the batch's staged changes not applied yet into the target; return the rows
        written."""
