"""Delta Lake target: each source table a Delta table under one root, written by Spark.

`delta:///abs/path` (a local directory: `file:///abs/path`) or `delta:<any Hadoop URI>`
(`delta:s3a://bucket/lake`). Source table `orders` lands in `<root>/orders`; the pipeline's own
state is in Delta tables under `<root>/_sluice/<pipeline tag>/`: fence, offsets, tombstones,
truncates, schema (one set per pipeline, so pipelines never contend for them).

Delta has no transaction across tables, so a batch is several commits, each made idempotent by
Delta's own transaction identifiers: every commit carries `SetTransaction(appId, version)`
(`spark.databricks.delta.write.txnAppId` / `txnVersion`, set only around the batch's MERGE and
DELETE statements), and Delta skips a write whose version is not above the table's last one for
that appId. The version is `epoch << 40 | the sum of the batch's next offsets` (after merging
them with the stored ones): strictly higher for every batch that brings a new record, the same
for a batch replayed after a crash, and lower for any batch of an older epoch once the newer one
has committed to the table. So a batch replayed whole or in part changes nothing the second time
(each of its commits that landed is skipped, the rest land), and a zombie's commit to a table the
current execution has written is skipped. One batch makes at most one commit per table and
appId: the truncates' deletes (appId `<pipeline>:truncate`), then one MERGE per table carrying
upserts and deletes, then the tombstones, the truncate watermarks, the schema records, and last
the offsets (appId `<pipeline>`).

Before writing, the fence table's epoch is read (every batch): a newer one than the batch's raises
StaleEpochError. What only this pipeline's executions write (its offsets, appended and read as
each partition's largest; truncate watermarks; schema records) is read once per execution and
kept as it commits, forgotten after any failed batch; a status read (`applied_offsets`,
`fence_epoch`) always reads the tables and never creates them. Tombstones are appended too and
read as each key's largest position.

A zombie that read the fence before the new execution claimed it can still land a commit on a
table the new one has not written yet: its rows are the log's, and the version guard
(`_sluice_pos`, tombstones, truncate watermarks) keeps them from replacing anything newer, as
every target's guard does.

Rows go through the driver: the batch's collapsed changes become a DataFrame with the Delta
table's schema, MERGEd by key with the guard as the MERGE's conditions. Tables are created with
column mapping (`delta.columnMapping.mode = name`), so a dropped or renamed source column is
dropped or renamed in the Delta table too. A value a column cannot hold fails the batch (Delta
has no savepoints to isolate one row: `on_refused: dlq` is not taken here).
"""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import logging
import re
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import orjson
import pyarrow as pa

from sluice.security.secrets import Secret
from sluice.sync.changes import TypesVariants
from sluice.sync.envelope import key_text
from sluice.sync.schema import Recorded
from sluice.sync.targets.base import (
    POS_COLUMN,
    ApplyResult,
    BadTargetUrlError,
    RefusalSink,
    Target,
    merge_offsets,
)
from sluice.sync.targets.evolution import history_from_rows, merged_types, target_types
from sluice.sync.targets.mapping import ColumnMapping
from sluice.sync.targets.rows import Change, changes_by_table, key_targets, source_columns
from sluice.sync.types import spark_type
from sluice.test_switches import OFF, Switches

log = logging.getLogger("sluice.target")

SCHEME = "delta:"
#: batches between two compactions of a pipeline's tables (the task option optimize_every)
OPTIMIZE_EVERY = 100
#: how many bits of a transaction version the offsets take (the epoch is above them)
OFFSET_BITS = 40
_TXN_APP = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION = "spark.databricks.delta.write.txnVersion"
_TABLE_PROPERTIES = (
    "TBLPROPERTIES ('delta.columnMapping.mode' = 'name', 'delta.minReaderVersion' = '2', "
    "'delta.minWriterVersion' = '5')"
)
_META = {
    "fence": "pipeline STRING, epoch BIGINT",
    "offsets": "pipeline STRING, topic STRING, `partition` INT, next_offset BIGINT, epoch BIGINT",
    "tombstones": "tbl STRING, key STRING, pos BIGINT",
    "truncates": "tbl STRING, pos BIGINT",
    "schema": "tbl STRING, pos BIGINT, change STRING, applied BOOLEAN",
}
_TIMESTAMP = re.compile(r"^TIMESTAMP(_NTZ)?$")


class DeltaMissingError(RuntimeError):
    pass


def delta_root(url: str) -> str:
    """The root URI of a Delta target's tables."""
    if not url.startswith(SCHEME):
        raise BadTargetUrlError(
            f"a Delta target URL looks like delta:///abs/path or delta:s3a://bucket/path, not {url!r}"
        )
    rest = url[len(SCHEME) :]
    if rest.startswith("///"):
        return "file://" + rest[2:].rstrip("/")
    if re.match(r"^[a-z][a-z0-9+.-]*://", rest):
        return rest.rstrip("/")
    raise BadTargetUrlError(
        f"a Delta target URL looks like delta:///abs/path or delta:s3a://bucket/path, not {url!r}"
    )


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _lit(value: str) -> str:
    """A Spark SQL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class _Batch:
    """What one `apply` has decided so far: its transaction identity and the writes it holds
    until their one commit per table."""

    def __init__(self, reading: bool = False) -> None:
        self.reading = reading  # a status read: nothing cached, nothing created
        self.app = ""
        self.version = 0
        self.pipeline = ""
        self.stones: list[tuple[str, str, int]] = []
        self.schema: list[tuple[str, int, str, bool]] = []
        self.compact = False  # compaction is due once the batch's commits are done


class DeltaTarget(Target):
    status_from_commits = True

    def __init__(
        self,
        url: str,
        mapping: ColumnMapping | None = None,
        tables: Collection[str] | None = None,
        password: Secret | None = None,
        switches: Switches = OFF,
        schema_change_policy: str = "evolve",
        spark: Any = None,
        optimize_every: int = OPTIMIZE_EVERY,
    ) -> None:
        from pyspark.sql import SparkSession

        super().__init__(url, mapping, tables, switches, schema_change_policy)
        if password is not None:
            raise BadTargetUrlError("a Delta target has no password (its storage's credentials are Hadoop's)")
        self.root = delta_root(url)
        base = spark or SparkSession.builder.getOrCreate()
        if "DeltaSparkSessionExtension" not in (base.conf.get("spark.sql.extensions", "") or ""):
            raise DeltaMissingError(
                "a Delta target needs Delta Lake in the Spark session: run scripts/peers.sh (it fetches "
                "Delta's jars into .peers/delta-<version>/jars), then start the worker again"
            )
        self.spark = base.newSession()  # its own SQL conf: the transaction identifiers
        self.spark.conf.set("spark.sql.session.timeZone", "UTC")
        # A table's state is rebuilt from its log by a Spark job of this many tasks after every
        # commit; Delta's default of 50 made reading a four-row table take about 4 s here.
        self.spark.conf.set("spark.databricks.delta.snapshotPartitions", "1")
        self._schemas: dict[str, dict[str, str]] = {}  # Delta table -> column -> Spark type
        self._keys: dict[str, list[str]] = {}
        self._batch = _Batch()
        self._made: set[str] = set()
        # What only this pipeline's executions write, kept between batches: each batch's fence
        # read shows whether another execution has taken over (then the batch fails and these
        # are forgotten, as after any failed batch)
        self._offsets: dict[str, dict[tuple[str, int], int]] = {}
        self._history: dict[str, list[tuple[str, int, str, bool]]] = {}
        self._truncated: dict[str, dict[str, int]] = {}
        self.optimize_every = optimize_every
        self._batches = 0  # committed by this instance: every optimize_every-th compacts
        self._written: set[str] = set()  # Delta tables written since the last compaction

    def close(self) -> None:
        pass  # the session is the worker's

    # --- paths and statements --------------------------------------------------------------------
    def _path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def _meta(self, pipeline: str, kind: str, create: bool = True) -> str:
        tag = hashlib.sha256(pipeline.encode()).hexdigest()[:12]
        path = f"{self.root}/_sluice/{tag}/{kind}"
        if create and path not in self._made:
            self._sql(f"CREATE TABLE IF NOT EXISTS delta.{_q(path)} ({_META[kind]}) USING delta")
            self._made.add(path)
        return path

    def _sql(self, statement: str) -> Any:
        return self.spark.sql(statement)

    @contextmanager
    def _txn(self, app: str) -> Iterator[None]:
        """The batch's transaction identity on the statements run inside."""
        self.spark.conf.set(_TXN_APP, app)
        self.spark.conf.set(_TXN_VERSION, str(self._batch.version))
        try:
            yield
        finally:
            self.spark.conf.unset(_TXN_APP)
            self.spark.conf.unset(_TXN_VERSION)

    def committed_version(self, name: str, app: str) -> int | None:
        """The last transaction version of `app` a Delta table's log holds (its commits' JSON:
        tests and drills; Delta keeps them for 30 days after a checkpoint)."""
        log_ = self.spark.read.json(f"{self._path(name)}/_delta_log/*.json")
        if "txn" not in log_.columns:
            return None
        found = log_.where(f"txn.appId = {_lit(app)}").agg({"txn.version": "max"}).collect()
        return None if not found or found[0][0] is None else int(found[0][0])

    # --- the transaction: Delta commits each statement; the batch holds its identity -------------
    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        batch = self._batch = _Batch()
        try:
            yield batch
        except BaseException:
            self._schemas.clear()
            self._keys.clear()
            self._offsets.clear()
            self._history.clear()
            self._truncated.clear()
            raise
        if batch.compact:
            try:
                self.compact(batch.pipeline)
            except Exception as exc:  # the batch landed: a failed OPTIMIZE must not fail it
                log.warning("event=delta_compact_failed pipeline=%s reason=%r action=%r", batch.pipeline,
                            f"{type(exc).__name__}: {str(exc)[:300]}",
                            f"tried again after {self.optimize_every} more batches")  # fmt: skip

    @contextmanager
    def _read_transaction(self) -> Iterator[Any]:
        yield _Batch(reading=True)

    def _read_meta(self, tx: Any, pipeline: str, kind: str, query: str) -> list[Any]:
        """Rows of `query` on a meta table (`{table}` in it); for a status read, none when the
        table is not made yet (a reader never creates the writer's tables)."""
        from pyspark.errors import AnalysisException

        path = self._meta(pipeline, kind, create=not tx.reading)
        try:
            return list(self._sql(query.replace("{table}", f"delta.{_q(path)}", 1)).collect())
        except AnalysisException:
            if tx.reading:
                return []
            raise

    def _lock_epoch(self, tx: Any, pipeline: str) -> int | None:
        return self._peek_epoch(tx, pipeline)

    def _peek_epoch(self, tx: Any, pipeline: str) -> int | None:
        rows = self._read_meta(
            tx, pipeline, "fence", f"SELECT max(epoch) FROM {{table}} WHERE pipeline = {_lit(pipeline)}"
        )
        value = rows[0][0] if rows else None
        return None if value is None or value == 0 else int(value)

    def _set_epoch(self, tx: Any, pipeline: str, epoch: int) -> None:
        # never lowers it: two executions claiming at once both commit, the higher epoch stays
        self._sql(
            f"MERGE INTO delta.{_q(self._meta(pipeline, 'fence'))} t "
            f"USING (SELECT {_lit(pipeline)} AS pipeline, "
            f"CAST({int(epoch)} AS BIGINT) AS epoch) s ON t.pipeline = s.pipeline "
            "WHEN MATCHED AND t.epoch < s.epoch THEN UPDATE SET epoch = s.epoch "
            "WHEN NOT MATCHED THEN INSERT (pipeline, epoch) VALUES (s.pipeline, s.epoch)"
        )

    def _read_offsets(self, tx: Any, pipeline: str) -> dict[tuple[str, int], int]:
        if tx.reading or pipeline not in self._offsets:
            rows = self._read_meta(
                tx, pipeline, "offsets", "SELECT topic, `partition`, max(next_offset) FROM {table} "
                f"WHERE pipeline = {_lit(pipeline)} GROUP BY topic, `partition`",
            )  # fmt: skip
            offsets = {(str(t), int(p)): int(o) for t, p, o in rows}
            if tx.reading:
                return offsets
            self._offsets[pipeline] = offsets
        return dict(self._offsets[pipeline])

    def _batch_begins(
        self,
        tx: Any,
        pipeline: str,
        epoch: int,
        applied: Mapping[tuple[str, int], int],
        new: Mapping[tuple[str, int], int],
    ) -> None:
        total = sum(merge_offsets(applied, new).values())
        if total >= 1 << OFFSET_BITS:
            raise OverflowError(
                f"pipeline {pipeline!r}: offsets beyond 2^{OFFSET_BITS} in one transaction version"
            )
        tx.app = pipeline
        tx.version = (epoch << OFFSET_BITS) | total
        tx.pipeline = pipeline

    def _write_offsets(
        self, tx: Any, pipeline: str, epoch: int, offsets: Mapping[tuple[str, int], int]
    ) -> None:
        # the batch's last commit: everything before it landed, or is skipped on replay
        self._flush_meta(tx, pipeline)
        if not offsets:
            return
        values = ", ".join(
            f"({_lit(pipeline)}, {_lit(t)}, {int(p)}, CAST({int(o)} AS BIGINT), CAST({int(epoch)} AS BIGINT))"
            for (t, p), o in offsets.items()
        )
        # appended (a MERGE took three times as long), read back as each partition's largest
        with self._txn(pipeline):
            self._sql(f"INSERT INTO delta.{_q(self._meta(pipeline, 'offsets'))} VALUES {values}")
        if pipeline in self._offsets:
            self._offsets[pipeline] = merge_offsets(self._offsets[pipeline], offsets)
        self._batches += 1
        if self.optimize_every and self._batches % self.optimize_every == 0:
            tx.compact = True  # once the batch's commits are done (`_transaction`)

    def compact(self, pipeline: str) -> None:
        """Small files into larger ones (Delta's OPTIMIZE) in the tables written since the last
        time and in the pipeline's own; the offsets and tombstones the batches appended first cut to
        each partition's and key's newest. Commits of their own, without the batch's transaction
        identity: they change no row's value (a zombie's write is still skipped by the identities
        the batches left)."""
        self._keep_newest(self._meta(pipeline, "tombstones"), ["tbl", "key"], "pos")
        offsets = self._meta(pipeline, "offsets")
        self._keep_newest(
            offsets, ["pipeline", "topic", "`partition`"], "next_offset", f"pipeline = {_lit(pipeline)}"
        )
        for path in sorted({self._path(n) for n in self._written} | {self._meta(pipeline, k) for k in _META}):
            self._sql(f"OPTIMIZE delta.{_q(path)}")
        log.info("event=delta_compacted pipeline=%s tables=%d", pipeline, len(self._written))
        self._written.clear()

    def _keep_newest(self, path: str, group: list[str], value: str, where: str = "TRUE") -> None:
        """Delete every appended row of a meta table but each group's largest `value`."""
        table = f"delta.{_q(path)}"
        on = " AND ".join(f"o.{c} = n.{c}" for c in group)
        self._sql(
            f"MERGE INTO {table} o USING (SELECT {', '.join(group)}, max({value}) AS top FROM {table} "
            f"WHERE {where} GROUP BY {', '.join(group)}) n ON {on} AND o.{value} < n.top "
            "WHEN MATCHED THEN DELETE"
        )

    def _flush_meta(self, tx: Any, pipeline: str) -> None:
        """The batch's tombstones and schema records, one commit each."""
        if tx.stones:
            newest: dict[tuple[str, str], int] = {}
            for tbl, key, pos in tx.stones:
                newest[(tbl, key)] = max(pos, newest.get((tbl, key), -1))
            df = self.spark.createDataFrame(
                [(t, k, p) for (t, k), p in newest.items()], "tbl STRING, key STRING, pos BIGINT"
            )
            # appended (a MERGE took several times as long), read as each key's largest
            df.createOrReplaceTempView("_sluice_stones")
            with self._txn(pipeline):
                stones = _q(self._meta(pipeline, "tombstones"))
                self._sql(f"INSERT INTO delta.{stones} SELECT * FROM _sluice_stones")
        if tx.schema:
            df = self.spark.createDataFrame(
                tx.schema, "tbl STRING, pos BIGINT, change STRING, applied BOOLEAN"
            )
            df.createOrReplaceTempView("_sluice_schema_new")
            with self._txn(pipeline):
                self._sql(
                    f"MERGE INTO delta.{_q(self._meta(pipeline, 'schema'))} t USING _sluice_schema_new s "
                    "ON t.tbl = s.tbl AND t.pos = s.pos WHEN NOT MATCHED THEN INSERT *"
                )
            for row in tx.schema:
                if row[0] in self._history:
                    self._history[row[0]].append(row)

    # --- refusals: Delta has no savepoints ------------------------------------------------------
    def _write_isolating(
        self, tx: Any, changes: pa.Table, guard: bool, on_refused: RefusalSink | None, result: ApplyResult
    ) -> int:
        return self._apply_changes(tx, changes, guard)

    def _savepoint(self, tx: Any) -> None:
        raise NotImplementedError("Delta has no savepoints")

    def _rollback_to(self, tx: Any) -> None:
        raise NotImplementedError("Delta has no savepoints")

    def _release(self, tx: Any) -> None:
        raise NotImplementedError("Delta has no savepoints")

    def _is_refusal(self, exc: BaseException) -> bool:
        return False

    # --- rows ------------------------------------------------------------------------------------
    def _apply_truncates(self, tx: Any, truncates: Mapping[str, int], guard: bool) -> int:
        pipeline = tx.pipeline
        deleted = 0
        for table, pos in sorted(truncates.items()):
            name = self.mapping.target_table(table)
            if self._load(name):
                older = f" WHERE {POS_COLUMN} < {int(pos)}" if guard else ""
                with self._txn(f"{pipeline}:truncate"):
                    rows = self._sql(f"DELETE FROM delta.{_q(self._path(name))}{older}").collect()
                deleted += int(rows[0][0]) if rows and rows[0][0] is not None else 0
        if guard and truncates:
            names = {self.mapping.target_table(t): p for t, p in truncates.items()}
            floors = self._floors(tx, pipeline)
            for n, p in names.items():
                floors[n] = max(p, floors.get(n, -1))
            values = ", ".join(f"({_lit(n)}, CAST({int(p)} AS BIGINT))" for n, p in sorted(names.items()))
            with self._txn(pipeline):
                self._sql(
                    f"MERGE INTO delta.{_q(self._meta(pipeline, 'truncates'))} t USING (SELECT * FROM VALUES "
                    f"{values} AS s(tbl, pos)) s ON t.tbl = s.tbl WHEN MATCHED AND t.pos < s.pos THEN UPDATE "
                    "SET pos = s.pos WHEN NOT MATCHED THEN INSERT *"
                )
            covered = " OR ".join(f"(tbl = {_lit(n)} AND pos < {int(p)})" for n, p in sorted(names.items()))
            with self._txn(f"{pipeline}:truncate"):
                self._sql(f"DELETE FROM delta.{_q(self._meta(pipeline, 'tombstones'))} WHERE {covered}")
        return deleted

    def _floors(self, tx: Any, pipeline: str) -> dict[str, int]:
        """Each table's truncate watermark, read once per execution (only this pipeline's
        executions write them; `_apply_truncates` keeps them)."""
        if pipeline not in self._truncated:
            rows = self._read_meta(
                tx, pipeline, "truncates", "SELECT tbl, max(pos) FROM {table} GROUP BY tbl"
            )
            self._truncated[pipeline] = {str(t): int(p) for t, p in rows}
        return self._truncated[pipeline]

    def _apply_changes(self, tx: Any, changes: pa.Table, guard: bool) -> int:
        return sum(
            self._write_table(tx, table, rows, guard, types)
            for table, (rows, types) in sorted(changes_by_table(changes).items())
        )

    def _write_table(
        self, tx: Any, table: str, events: list[Change], guard: bool, types: TypesVariants
    ) -> int:
        m = self.mapping
        pipeline = tx.pipeline
        name = self._ensure_table(tx, table, events, types)
        schema = self._schemas[name]
        keys = self._keys[name]
        data = [c for c in schema if c != POS_COLUMN]
        source_of = {m.target_column(table, c) or "": c for c in source_columns(events)}
        convert = {c: _converter(schema[c]) for c in data}
        key_source = {m.target_column(table, c) or c: c for c in events[0].key}
        rows = []
        for ev in events:
            image = (
                ev.after
                if ev.after is not None
                else {key_source.get(k, k): ev.key.get(key_source.get(k, k)) for k in keys}
            )
            values = [convert[c](image.get(source_of.get(c, c))) for c in data]
            rows.append((*values, ev.pos, "d" if ev.after is None else "u", ev.kt))
            if ev.after is None:
                tx.stones.append((name, ev.kt, ev.pos))
        ddl = ", ".join(f"{_q(c)} {schema[c]}" for c in data)
        df = self.spark.createDataFrame(rows, f"{ddl}, _s_pos BIGINT, _s_op STRING, _s_key STRING")
        if guard:
            stones = self.spark.read.format("delta").load(self._meta(pipeline, "tombstones"))
            stones = stones.where(stones.tbl == name).groupBy("key").max("pos").toDF("_t_key", "_t_pos")
            floor = self._floors(tx, pipeline).get(name, -1)
            df = df.join(stones, df["_s_key"] == stones["_t_key"], "left").where(
                f"_s_op = 'd' OR ((_t_pos IS NULL OR _t_pos < _s_pos) AND _s_pos > {floor})"
            )
        df.createOrReplaceTempView("_sluice_rows")
        on = " AND ".join(f"t.{_q(k)} <=> s.{_q(k)}" for k in keys)
        newer = f" AND t.{POS_COLUMN} < s._s_pos" if guard else ""
        sets = ", ".join(
            [*(f"{_q(c)} = s.{_q(c)}" for c in data if c not in keys), f"{POS_COLUMN} = s._s_pos"]
        )
        cols = ", ".join([*(_q(c) for c in data), POS_COLUMN])
        vals = ", ".join([*(f"s.{_q(c)}" for c in data), "s._s_pos"])
        self._written.add(name)
        with self._txn(pipeline):
            out = self._sql(
                f"MERGE INTO delta.{_q(self._path(name))} t USING _sluice_rows s ON {on} "
                f"WHEN MATCHED AND s._s_op = 'd'{newer} THEN DELETE "
                f"WHEN MATCHED AND s._s_op <> 'd'{newer} THEN UPDATE SET {sets} "
                f"WHEN NOT MATCHED AND s._s_op <> 'd' THEN INSERT ({cols}) VALUES ({vals})"
            ).collect()
        return int(out[0][0]) if out and out[0][0] is not None else 0

    # --- tables and columns ----------------------------------------------------------------------
    def _load(self, name: str) -> dict[str, str]:
        schema = self._schemas.get(name)
        if schema is None:
            from pyspark.errors import AnalysisException

            try:
                fields = self.spark.read.format("delta").load(self._path(name)).schema.fields
            except AnalysisException:
                return {}
            schema = {f.name: f.dataType.simpleString().upper() for f in fields}
            self._schemas[name] = schema
            props = self._sql(f"SHOW TBLPROPERTIES delta.{_q(self._path(name))}").collect()
            keys = str(next((v for k, v in props if k == "sluice.key"), ""))
            self._keys[name] = [k for k in keys.split(",") if k]
        return schema

    def _ensure_table(self, tx: Any, table: str, events: list[Change], types: TypesVariants) -> str:
        """Create the Delta table, or add the columns this batch brings (typed by the source's
        `types` through the mapping, sync/types.py, or inferred from the values)."""
        m = self.mapping
        tm = m.for_table(table)
        name = m.target_table(table)
        existing = self._load(name)
        typed = merged_types(types)
        if existing and typed and all((m.target_column(table, c) or POS_COLUMN) in existing for c in typed):
            return name
        if typed:
            typed = target_types(self, tx, table, types)
        wanted: dict[str, str] = {}
        if typed:
            for src, source_type in typed.items():
                dst = m.target_column(table, src)
                if dst is not None:
                    wanted[dst] = tm.casts.get(dst) or spark_type(source_type)
        else:
            keys = key_targets(m, table, events)
            samples: dict[str, list[Any]] = {}
            for ev in events:
                for c, v in (ev.after or ev.key).items():
                    dst = m.target_column(table, c)
                    if dst is not None and dst not in existing:
                        samples.setdefault(dst, []).append(v)
            for dst, vals in samples.items():
                if dst in tm.casts or dst in keys or any(v is not None for v in vals):
                    wanted[dst] = tm.casts.get(dst) or _inferred(vals)
        new = {c: t for c, t in wanted.items() if c not in existing}
        if existing and not new:
            return name
        path = _q(self._path(name))
        if not existing:
            pk = [str(m.target_column(table, c)) for c in events[0].key if m.target_column(table, c)]
            if len(pk) != len(events[0].key):
                raise ValueError(f"mapping for {table} drops a primary key column")
            for key in pk:
                wanted.setdefault(key, "STRING")
            defs = ", ".join(f"{_q(c)} {t}" for c, t in wanted.items())
            props = _TABLE_PROPERTIES.replace(
                "TBLPROPERTIES (", f"TBLPROPERTIES ('sluice.key' = {_lit(','.join(str(c) for c in pk))}, "
            )
            self._sql(
                f"CREATE TABLE IF NOT EXISTS delta.{path} ({defs}, {POS_COLUMN} BIGINT) USING delta {props}"
            )
        else:
            adds = ", ".join(f"{_q(c)} {t}" for c, t in new.items())
            self._sql(f"ALTER TABLE delta.{path} ADD COLUMNS ({adds})")
        self._forget(name)
        self._load(name)
        return name

    def _forget(self, name: str) -> None:
        self._schemas.pop(name, None)
        self._keys.pop(name, None)

    # --- schema changes (targets/evolution.py) ---------------------------------------------------
    def _read_schema_history(self, tx: Any, tables: list[str]) -> dict[str, list[Recorded]]:
        pipeline = tx.pipeline
        if not tables or not pipeline:
            return {}
        unread = [t for t in tables if t not in self._history]
        if unread:
            names = ", ".join(_lit(t) for t in unread)
            rows = self._read_meta(
                tx,
                pipeline,
                "schema",
                f"SELECT tbl, pos, change, applied FROM {{table}} WHERE tbl IN ({names})",
            )
            for t in unread:
                self._history[t] = []
            for t, p, c, a in rows:
                self._history[str(t)].append((str(t), int(p), str(c), bool(a)))
        recorded = [r for t in tables for r in self._history[t]]
        recorded += [r for r in tx.schema if r[0] in tables]
        return history_from_rows(sorted(recorded, key=lambda r: r[1]))

    def _record_schema_change(
        self, tx: Any, table: str, pos: int, doc: Mapping[str, Any], applied: bool
    ) -> bool:
        history = self._read_schema_history(tx, [table]).get(table, [])
        if any(r.pos == pos for r in history):
            return False
        tx.schema.append((table, pos, orjson.dumps(doc).decode(), applied))
        return True

    def _existing_columns(self, tx: Any, name: str) -> list[str]:
        return list(self._load(name))

    def _drop_column(self, tx: Any, name: str, column: str) -> None:
        if column in self._keys.get(name, []):
            return
        self._sql(f"ALTER TABLE delta.{_q(self._path(name))} DROP COLUMN {_q(column)}")
        self._forget(name)

    def _rename_column(self, tx: Any, name: str, old: str, new: str) -> None:
        self._sql(f"ALTER TABLE delta.{_q(self._path(name))} RENAME COLUMN {_q(old)} TO {_q(new)}")
        self._forget(name)

    def _change_column_type(self, tx: Any, name: str, column: str, source_type: str) -> None:
        """Delta changes a column's type only by widening; another change leaves the column (the
        re-read rows are cast to it, or fail the batch naming the column)."""
        want = spark_type(source_type)
        have = self._load(name).get(column)
        if have is None or have == want:
            return
        log.warning("event=schema_change_kept table=%s column=%s have=%s want=%s reason=%r", name, column,
                    have, want, "a Delta column's type is changed only by recreating the table")  # fmt: skip

    def _drop_table(self, tx: Any, name: str) -> None:
        if self._load(name):
            with self._txn(f"{tx.pipeline}:truncate"):
                self._sql(f"DELETE FROM delta.{_q(self._path(name))}")
        self._forget(name)

    # --- reading back and upkeep -------------------------------------------------------------------
    #: the parameter mark `select` takes (a NUL cannot be in a column name or in SQL text)
    MARK = "\x00?\x00"

    def select(self, name: str, columns: list[str], where: str, params: list[Any]) -> list[tuple[Any, ...]]:
        """Rows of `columns` of a Delta table matching `where` (each `MARK` a parameter, put in
        as a Spark SQL literal), each value as `read_rows` reads it; none when the table does not
        exist yet (verify's reads, from the driver)."""
        schema = self._load(name)
        if not schema:
            return []
        pieces = where.split(self.MARK)
        if len(pieces) != len(params) + 1:
            raise ValueError(f"{len(pieces) - 1} parameter marks for {len(params)} parameters")
        cond = pieces[0] + "".join(_literal(v) + rest for v, rest in zip(params, pieces[1:], strict=True))
        exprs = ", ".join(_read_expr(c, schema.get(c, "")) for c in columns)
        rows = self._sql(f"SELECT {exprs} FROM delta.{_q(self._path(name))} WHERE {cond}").collect()
        return [tuple(bytes(v) if isinstance(v, bytearray) else v for v in r) for r in rows]

    def read_rows(self, table: str) -> dict[str, dict[str, Any]]:
        """Every row; a TIMESTAMP as its UTC text, `YYYY-MM-DDTHH:MM:SS.ffffffZ`."""
        name = self.mapping.target_table(table)
        schema = self._load(name)
        if not schema:
            return {}
        keys = self._keys.get(name) or []
        data = [c for c in schema if c != POS_COLUMN]
        rows = self._sql(
            f"SELECT {', '.join(_read_expr(c, schema[c]) for c in data)} FROM delta.{_q(self._path(name))}"
        ).collect()
        out = {}
        for r in rows:
            row = {c: (bytes(v) if isinstance(v, bytearray) else v) for c, v in zip(data, r, strict=True)}
            out[key_text({k: row[k] for k in keys})] = row
        return out

    def offsets_log(self, pipeline: str) -> list[tuple[int, str, int, int, int]]:
        """Every row ever appended to the pipeline's offsets, with the table version that
        appended it, in commit order: (version, topic, partition, next_offset, epoch). A row of an
        older epoch, or a lower offset, after a newer one is a commit that should never have
        landed (drills; the log's JSON commits, kept 30 days after a checkpoint; a compaction
        leaves each partition's newest row, in its own commit)."""
        from pyspark.sql import functions as F

        path = self._meta(pipeline, "offsets", create=False)
        log_ = self.spark.read.json(f"{path}/_delta_log/*.json")
        if "add" not in log_.columns:
            return []
        adds = log_.where("add IS NOT NULL").select(
            F.regexp_extract(F.input_file_name(), r"(\d+)\.json$", 1).cast("bigint").alias("version"),
            F.regexp_extract("add.path", r"([^/]+)$", 1).alias("file"),
        )
        rows = (
            self.spark.read.format("delta")
            .load(path)
            .where(F.col("pipeline") == pipeline)
            .select("topic", "partition", "next_offset", "epoch", F.col("_metadata.file_name").alias("file"))
        )
        found = rows.join(adds, "file").orderBy("version").collect()
        return [
            (int(r.version), str(r.topic), int(r.partition), int(r.next_offset), int(r.epoch)) for r in found
        ]


def _read_expr(column: str, spark_type_name: str) -> str:
    """How a column is read back: a TIMESTAMP as its UTC text (Spark gives a Python datetime in
    the reading process's own zone), any other value as Spark gives it (a TIMESTAMP_NTZ as its
    naive datetime)."""
    if spark_type_name == "TIMESTAMP":
        return f"date_format({_q(column)}, \"yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'\") AS {_q(column)}"
    return _q(column)


def _literal(value: Any) -> str:
    """A Python value as a Spark SQL literal (verify's key ranges and keys)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value) if -(2**63) <= value < 2**63 else f"{value}BD"
    if isinstance(value, decimal.Decimal):
        return f"{value}BD"
    if isinstance(value, float):
        return f"CAST({_lit(repr(value))} AS DOUBLE)"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"X'{bytes(value).hex()}'"
    if isinstance(value, dt.datetime):
        return f"TIMESTAMP {_lit(value.isoformat(sep=' '))}"
    if isinstance(value, dt.date):
        return f"DATE {_lit(value.isoformat())}"
    return _lit(str(value))


def _inferred(values: list[Any]) -> str:
    for v in values:
        if v is None:
            continue
        if isinstance(v, (bytes, bytearray)):
            return "BINARY"
        if isinstance(v, bool):
            return "BOOLEAN"
        if isinstance(v, int):
            return "BIGINT"
        if isinstance(v, float):
            return "DOUBLE"
        return "STRING"
    return "STRING"


def _converter(spark_type_name: str) -> Callable[[Any], Any]:
    """How an envelope value (JSON, bytes decoded) becomes the Python value of a Spark column."""
    t = spark_type_name.upper()
    if t == "DATE":
        return lambda v: dt.date.fromisoformat(v) if isinstance(v, str) else v
    if _TIMESTAMP.match(t):
        naive = t.endswith("_NTZ")

        def stamp(v: Any) -> Any:
            if not isinstance(v, str):
                return v
            parsed = dt.datetime.fromisoformat(v)
            if naive:
                return parsed.replace(tzinfo=None)
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)

        return stamp
    if t.startswith("DECIMAL"):
        return lambda v: decimal.Decimal(str(v)) if v is not None else None
    if t in ("FLOAT", "DOUBLE"):
        return lambda v: float(v) if isinstance(v, (str, int)) and not isinstance(v, bool) else v
    if t in ("TINYINT", "SMALLINT", "INT", "INTEGER", "BIGINT"):  # a cast's column too
        return lambda v: int(v) if isinstance(v, (str, bool)) else v
    if t == "BINARY":
        return lambda v: v.encode() if isinstance(v, str) else v
    if t == "BOOLEAN":
        return lambda v: bool(v) if isinstance(v, int) else v
    if t == "STRING":
        return lambda v: (
            orjson.dumps(v).decode()
            if isinstance(v, (dict, list))
            else (v if v is None or isinstance(v, str) else str(v))
        )
    return lambda v: v
