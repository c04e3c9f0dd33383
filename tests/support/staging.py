"""The executors' side of a staged batch, run in the test process: what `ApplyQuery` does on
Spark (sync/targets/staging.py), without Spark, so the targets' tests can drive it batch by
batch."""

from __future__ import annotations

import itertools
import random
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc

from sluice.sync.changes import to_changes
from sluice.sync.envelope import ChangeEvent
from sluice.sync.targets.base import ApplyResult, RefusalSink, Target
from sluice.sync.targets.staging import StageSpec, is_mysql, stage_changes, staging_table
from tests.support.changes import records

_batches = itertools.count(1)


def stage(url: str, table: str, records: pa.Table, tasks_per_partition: int = 2) -> pa.Table:
    """Stage log records as the executors would: each partition's records split over
    `tasks_per_partition` tasks, each collapsed (as the source's `decode=envelope`) and written
    (COPY; INSERTs on MySQL) under a token of its own. Returns the tasks' summaries, as the
    driver collects them."""
    summaries = []
    where = zip(records["topic"].to_pylist(), records["partition"].to_pylist(), strict=True)
    for topic, partition in sorted(set(where)):
        mine = records.filter(
            pc.and_(pc.equal(records["topic"], topic), pc.equal(records["partition"], partition))
        )
        size = max(1, -(-mine.num_rows // tasks_per_partition))
        for lo in range(0, mine.num_rows, size):
            changes = to_changes(mine.slice(lo, size), collapse=True)
            summaries.extend(stage_changes(StageSpec(url, table))([changes]))
    if not summaries:
        return pa.Table.from_batches([], schema=_empty_summary_schema())
    return pa.Table.from_batches(summaries)


def batches_of(parts: list[list[ChangeEvent]], rng: random.Random) -> list[pa.Table]:
    """Two partitions' changes as log records, cut into batches of up to 250 records of each
    partition at random (a seeded workload's batching)."""
    out = []
    starts = [0, 0]
    while any(starts[p] < len(parts[p]) for p in (0, 1)):
        chunk = []
        for p in (0, 1):
            n = rng.randint(0, 250)
            if n and starts[p] < len(parts[p]):
                chunk.append(records(parts[p][starts[p] : starts[p] + n], start=starts[p], partition=p))
                starts[p] += n
        if chunk:
            out.append(pa.concat_tables(chunk))
    return out


def apply_staged(
    target: Target,
    pipeline: str,
    epoch: int,
    records: pa.Table,
    on_refused: RefusalSink | None = None,
    batch: int | None = None,
) -> ApplyResult:
    """`target.apply(pipeline, epoch, records)` the staged way: a new batch id (or `batch`, a
    batch run again), the execution's staging table (made when this epoch first stages, as the
    query's start does), the executors' COPY, the driver's commit."""
    batch = next(_batches) if batch is None else batch
    table = staging_table(pipeline, epoch)
    if table not in staged(target.url):
        target.prepare_staging(pipeline, epoch)
    summaries = stage(target.url, table, records)
    return target.apply_staged(pipeline, epoch, batch, summaries, on_refused=on_refused)


def staged(url: str) -> dict[str, int]:
    """Every staging table in the database at `url`, with the rows it holds."""
    if is_mysql(url):
        conn = _mysql(url)
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() "
                    "AND TABLE_NAME LIKE '\\_sluice\\_staged\\_%'"
                )
                out = {}
                for (name,) in cur.fetchall():
                    cur.execute(f"SELECT COUNT(*) FROM `{name}`")
                    out[name] = cur.fetchone()[0]
                return out
        finally:
            conn.close()
    with psycopg.connect(url) as conn:
        return {n: conn.execute(f'SELECT count(*) FROM "{n}"').fetchone()[0] for n in _staging_tables(conn)}


def staged_tokens(url: str) -> set[int]:
    """The tokens of the rows in every staging table in the database at `url`."""
    with psycopg.connect(url) as conn:
        return {
            r[0] for n in _staging_tables(conn) for r in conn.execute(f'SELECT DISTINCT token FROM "{n}"')
        }


def execute(url: str, statement: str) -> None:
    """One statement on the target at `url`, committed (names unquoted: plain ones only)."""
    if is_mysql(url):
        conn = _mysql(url)
        try:
            with conn.cursor() as cur:
                cur.execute(statement)
        finally:
            conn.close()
        return
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement)  # type: ignore[arg-type]


def _mysql(url: str) -> Any:
    from sluice.sync.targets.mysql_stage import connect

    return connect(url, None)


def _staging_tables(conn: psycopg.Connection) -> list[str]:
    rows = conn.execute(
        "SELECT relname FROM pg_class WHERE relkind = 'r' AND relname LIKE '\\_sluice\\_staged\\_%'"
    ).fetchall()
    return sorted(r[0] for r in rows)


def _empty_summary_schema() -> pa.Schema:
    from sluice.sync.targets.staging import summary

    return summary(0, {("t", 0): 1}, {("t", 0): 0}, 0, 0, []).schema
