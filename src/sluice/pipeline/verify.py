"""`sluice task verify`: does a task's target hold what its source holds? A Spark batch job.

1. Plan key ranges on the source by keyset pagination (a boundary every `chunk_rows` keys, in
   the key's order; composite and text keys too).
2. One Spark task per range reads the source's rows and the target's rows of that range and
   compares a checksum of each side (the source's own answer for each value beside the
   target's, normalised as sync/compare.py says, through the task's column mapping); only a
   range whose checksums differ is compared row by row, and returns the keys missing from the
   target, extra in it, and different.
3. Both sides keep changing while this runs, so a difference is only a suspect: the source's
   binlog position is read after the suspects' rows are read again, the pipeline is waited on
   (bounded) until it has captured past that position and applied everything in the log (the
   task's status: `captured_position`, then applied offsets at the log's end offsets read
   after that), and then the target's rows of those keys are read
   and compared. A few rounds of this; what still differs is reported.
4. `--repair` asks the task's capture to read the differing keys again (a re-snapshot request
   with those keys and delete_absent: a key the source lacks becomes a delete), waits until it
   is served and applied, and checks those keys once more.

The key comparison on the target uses the target's own ordering for ranges; a key whose order
differs between the two (text under different collations) shows as missing in one range and
extra in another, and the point lookups of step 3 find it equal.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sluice.security.secrets import Secret
from sluice.sync.compare import Check, TableSchema, compare_table, source_value, table_schema, target_value
from sluice.sync.sources.mysql_base import BinlogPosition, CaptureError, column_types, connect, primary_keys
from sluice.sync.sources.mysql_snapshot import plan_ranges, range_condition
from sluice.sync.sources.resnapshot import quote as mysql_quote
from sluice.sync.targets.base import ColumnMapping, quote
from sluice.sync.tasks import SourceSpec, TaskSpec

#: keys listed per kind and table in the report
KEYS_SHOWN = 20
#: rounds of "wait for the pipeline, compare the suspects again"
RECHECK_ROUNDS = 3


@dataclass(frozen=True, slots=True)
class RangeJob:
    """One key range (lo, hi] of one table (None: unbounded) and what a Spark task needs."""

    source: SourceSpec
    schema: TableSchema
    target: str
    target_password: Secret | None
    mapping: dict[str, Any]
    lo: tuple[Any, ...] | None
    hi: tuple[Any, ...] | None


@dataclass
class RangeResult:
    table: str
    rows: int
    same: bool
    missing: list[dict[str, Any]] = field(default_factory=list)
    extra: list[dict[str, Any]] = field(default_factory=list)
    different: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class TableReport:
    table: str
    rows: int = 0
    missing: list[dict[str, Any]] = field(default_factory=list)
    extra: list[dict[str, Any]] = field(default_factory=list)
    different: list[dict[str, Any]] = field(default_factory=list)

    @property
    def keys(self) -> list[dict[str, Any]]:
        return self.missing + self.extra + self.different

    def line(self) -> str:
        return (
            f"verify table={self.table} rows={self.rows} missing={len(self.missing)} "
            f"extra={len(self.extra)} different={len(self.different)}"
        )


# --- the source -------------------------------------------------------------------------------


def source_schema(spec: SourceSpec, table: str) -> TableSchema:
    """The table's columns with their comparisons (sync/compare.py), and its primary key."""
    keys = primary_keys(spec, [table])[table]
    return table_schema(table, column_types(spec, [table]).get(table, {}), keys)


def key_condition(cols: list[str], keys: list[tuple[Any, ...]], mark: str) -> tuple[str, list[Any]]:
    """`(k1, k2) IN ((...), ...)` for the key tuples."""
    row = cols[0] if len(cols) == 1 else f"({', '.join(cols)})"
    one = mark if len(cols) == 1 else "(" + ", ".join([mark] * len(cols)) + ")"
    return f"{row} IN ({', '.join([one] * len(keys))})", [v for k in keys for v in k]


def source_read(spec: SourceSpec, schema: TableSchema, cond: str, params: list[Any]) -> list[dict[str, Any]]:
    import pymysql.cursors

    conn = connect(spec, cursorclass=pymysql.cursors.DictCursor)
    try:
        with conn.cursor() as cur:
            cur.execute(f"{schema.reference_select()} WHERE {cond}", params)
            return [dict(r) for r in cur.fetchall()]
    finally:
        conn.close()


def source_position(spec: SourceSpec) -> BinlogPosition:
    conn = connect(spec)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            file, pos = cur.fetchone()[:2]
    finally:
        conn.close()
    return BinlogPosition(str(file), int(pos))


# --- the target -------------------------------------------------------------------------------


def target_dialect(url: str) -> str:
    """sqlite, postgresql, mysql or delta: the kind of target a URL names."""
    scheme = url.split(":", 1)[0]
    return {"postgres": "postgresql", "mariadb": "mysql"}.get(scheme, scheme)


class TargetSide:
    """Reads a target's rows of one table by key range or by keys, renamed back to the source's
    column names through the task's mapping (columns the mapping drops are left out)."""

    def __init__(self, url: str, password: Secret | None, mapping: dict[str, Any], schema: TableSchema):
        from sluice.sync.targets import open_target

        self.mapping = ColumnMapping.from_config(mapping)
        self.target: Any = open_target(url, self.mapping, password=password)
        self.dialect = target_dialect(url)
        self.sqlite = self.dialect == "sqlite"
        self.schema = schema
        self.table = self.mapping.target_table(schema.name)
        self.columns = {
            c: t for c, _ in schema.columns if (t := self.mapping.target_column(schema.name, c)) is not None
        }

    def compared(self) -> TableSchema:
        """The schema of the columns both sides hold."""
        kept = tuple((c, k) for c, k in self.schema.columns if c in self.columns)
        return TableSchema(self.schema.name, kept, self.schema.key)

    def read(self, cond_of: Callable[[list[str], str], tuple[str, list[Any]]]) -> list[dict[str, Any]]:
        q = quote if self.dialect in ("sqlite", "postgresql") else mysql_quote  # Spark's are MySQL's
        keys = [q(self.columns[k]) for k in self.schema.key]
        mark = {"sqlite": "?", "delta": getattr(self.target, "MARK", "")}.get(self.dialect, "%s")
        cond, params = cond_of(keys, mark)
        names = list(self.columns)
        if self.dialect in ("mysql", "delta"):  # their own reading of each type
            rows = self.target.select(self.table, [self.columns[c] for c in names], cond, params)
            return [dict(zip(names, r, strict=True)) for r in rows]
        sql = (
            f"SELECT {', '.join(quote(self.columns[c]) for c in names)} FROM {quote(self.table)} WHERE {cond}"
        )
        conn = self.target.conn
        try:
            rows = conn.execute(sql, params).fetchall()
        except Exception as exc:
            if "no such table" in str(exc) or "does not exist" in str(exc):
                rows = []  # nothing applied to it yet
            else:
                raise
        finally:
            if not self.sqlite:
                conn.rollback()
        return [dict(zip(names, r, strict=True)) for r in rows]

    def close(self) -> None:
        self.target.close()


def _canonical(kind: Check, value: Any) -> Any:
    import decimal

    if isinstance(value, decimal.Decimal):
        return str(value.normalize())
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return repr(value)


def checksum(schema: TableSchema, rows: list[dict[str, Any]], normal: Callable[[Check, Any], Any]) -> str:
    """An order-independent digest of rows' normalised values."""
    digests = sorted(
        hashlib.sha1(
            "\x1f".join(_canonical(k, normal(k, row.get(c))) for c, k in schema.columns).encode()
        ).hexdigest()
        for row in rows
    )
    return hashlib.sha1("".join(digests).encode()).hexdigest()


def _differences(
    schema: TableSchema, source: list[dict[str, Any]], target: list[dict[str, Any]], dialect: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    result = compare_table(schema, source, target, dialect)
    back = json.loads
    return (
        [back(k) for k in result.missing],
        [back(k) for k in result.extra],
        [back(k) for k, _ in result.different],
    )


def compare_range(job: RangeJob) -> RangeResult:
    """One Spark task: the range's rows on both sides, by checksum, then row by row if need be."""
    side = TargetSide(job.target, job.target_password, job.mapping, job.schema)
    try:
        schema = side.compared()
        source = source_read(
            job.source, schema, *range_condition([mysql_quote(k) for k in schema.key], job.lo, job.hi, "%s")
        )
        target = side.read(lambda keys, mark: range_condition(keys, job.lo, job.hi, mark))
    finally:
        side.close()
    dialect = target_dialect(job.target)
    same = checksum(schema, source, lambda k, v: source_value(k, v, dialect)) == checksum(
        schema, target, target_value
    )
    if same:
        return RangeResult(schema.name, len(source), True)
    missing, extra, different = _differences(schema, source, target, dialect)
    return RangeResult(schema.name, len(source), False, missing, extra, different)


def recheck(
    spec: TaskSpec,
    schema: TableSchema,
    keys: list[dict[str, Any]],
    source_rows: list[dict[str, Any]] | None = None,
) -> TableReport:
    """The listed keys compared by point lookups on both sides (the source's rows as given, or
    read now)."""
    report = TableReport(schema.name)
    if not keys:
        return report
    tuples = [tuple(k[c] for c in schema.key) for k in keys]
    side = TargetSide(spec.target, _secret(spec.target_password), spec.mapping, schema)
    try:
        compared = side.compared()
        if source_rows is None:
            source_rows = read_keys(spec, schema, keys)
        target = side.read(lambda cols, mark: key_condition(cols, tuples, mark))
    finally:
        side.close()
    dialect = target_dialect(spec.target)
    report.missing, report.extra, report.different = _differences(compared, source_rows, target, dialect)
    report.rows = len(source_rows)
    return report


def read_keys(spec: TaskSpec, schema: TableSchema, keys: list[dict[str, Any]]) -> list[dict[str, Any]]:
    tuples = [tuple(k[c] for c in schema.key) for k in keys]
    cond, params = key_condition([mysql_quote(k) for k in schema.key], tuples, "%s")
    return source_read(spec.source, schema, cond, params)


def _secret(value: Any) -> Secret | None:
    return value if isinstance(value, Secret) else None


# --- the pipeline -----------------------------------------------------------------------------


def binlog_reached(position: BinlogPosition) -> Callable[[str], bool]:
    """Whether a captured position (the status's text) is at or past a binlog `position`."""

    def reached(captured: str) -> bool:
        try:
            return BinlogPosition.parse(captured) >= position
        except CaptureError:  # not a binlog position (a task of another source)
            return False

    return reached


def _captured(status: dict[str, Any] | None, reached: Callable[[str], bool], since: float) -> bool:
    """A status written after `since` shows the capture past the position `reached` asks
    about, without an error."""
    if not status or status.get("error") or not status.get("captured_position"):
        return False
    if float(status.get("updated") or 0) <= since:
        return False
    return reached(str(status["captured_position"]))


def _applied(status: dict[str, Any] | None, ends: dict[str, int]) -> bool:
    applied = (status or {}).get("applied_offsets") or {}
    return not (status or {}).get("error") and all(int(applied.get(tp, 0)) >= end for tp, end in ends.items())


def wait_passed(
    status: Callable[[], dict[str, Any] | None],
    reached: Callable[[str], bool],
    timeout_s: float,
    ends: Callable[[], dict[str, int]],
) -> bool:
    """Until the pipeline has passed a source position: the task's status shows the capture
    past it (`reached`, given the captured position's text: `binlog_reached`, or a PostgreSQL
    source's LSN check in verify_pg.py),
    then the applied offsets reach the log's end offsets read after that (`ends`: "topic[p]" ->
    next offset), so every change up to `position` is in the target. False after `timeout_s`,
    or at once when the task has no running execution."""
    deadline = time.monotonic() + timeout_s
    since = time.time()
    target: dict[str, int] | None = None
    while time.monotonic() < deadline:
        current = status()
        if current is None:
            return False  # no execution runs the task: nothing to wait for
        if target is None and _captured(current, reached, since):
            time.sleep(0.5)  # the capture's last records acknowledged by the log
            target = ends()
        if target is not None and _applied(current, target):
            return True
        time.sleep(0.5)
    return False


def log_ends(bootstrap: str, topics: list[str], client: dict[str, str] | None = None) -> dict[str, int]:
    """The end offset of each partition of `topics`, as "topic[p]" (the status's form)."""
    from confluent_kafka import Consumer, TopicPartition

    from sluice.clients import close_within

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "sluice-verify", "log_level": 0,
                         "enable.auto.commit": False, **(client or {})})  # fmt: skip
    out = {}
    try:
        for topic in topics:
            meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
            for p in sorted(meta.partitions) if meta else []:
                out[f"{topic}[{p}]"] = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
    finally:
        close_within(consumer)
    return out


# --- the whole job ----------------------------------------------------------------------------


@dataclass
class Verification:
    tables: list[TableReport]
    repaired: int = 0
    waited: bool = True  # the pipeline passed each position in time (False: reported as found)

    @property
    def ok(self) -> bool:
        return not any(t.keys for t in self.tables)


def verify(
    spark: Any,
    spec: TaskSpec,
    *,
    tables: list[str] | None = None,
    chunk_rows: int = 50_000,
    status: Callable[[], dict[str, Any] | None] = lambda: None,
    ends: Callable[[], dict[str, int]] = dict,
    wait_s: float = 60.0,
) -> Verification:
    """Compare the tables of a resolved task definition (`tasks.resolved`) chunk by chunk in
    one Spark job, then re-check what differs once the pipeline has passed the source's position."""
    schemas = {table: source_schema(spec.source, table) for table in tables or spec.tables}
    jobs = [
        RangeJob(spec.source, schema, spec.target, _secret(spec.target_password), spec.mapping, lo, hi)
        for table, schema in schemas.items()
        for lo, hi in plan_ranges(spec.source, table, list(schema.key), chunk_rows)
    ]
    spark.sparkContext.setJobGroup(f"sluice-verify-{spec.id}", f"verify {spec.id} in {len(jobs)} key ranges")
    results: list[RangeResult]
    if target_dialect(spec.target) == "delta":  # read with Spark, which only the driver has
        results = [compare_range(job) for job in jobs]
    else:
        results = spark.sparkContext.parallelize(jobs, len(jobs)).map(compare_range).collect()
    found = {table: TableReport(table) for table in schemas}
    for r in results:
        t = found[r.table]
        t.rows += r.rows
        t.missing += r.missing
        t.extra += r.extra
        t.different += r.different
    out = Verification([])
    out.tables = settle(spec, schemas, list(found.values()), status, ends, wait_s, out)
    return out


def settle(
    spec: TaskSpec,
    schemas: dict[str, TableSchema],
    found: list[TableReport],
    status: Callable[[], dict[str, Any] | None],
    ends: Callable[[], dict[str, int]],
    wait_s: float,
    out: Verification,
) -> list[TableReport]:
    """The suspects compared again after the pipeline passed the source position read after
    their source rows, in rounds while some of them settle (at most RECHECK_ROUNDS): what still
    differs then, per table (with the rows counted in `found`)."""
    reports = found
    suspects = {t.table: _unique(t.keys) for t in found}
    for _ in range(RECHECK_ROUNDS):
        if not any(suspects.values()):
            break
        rows = {table: read_keys(spec, schemas[table], keys) for table, keys in suspects.items() if keys}
        if not wait_passed(status, binlog_reached(source_position(spec.source)), wait_s, ends):
            out.waited = False
        reports = [
            recheck(spec, schemas[t.table], suspects[t.table], rows[t.table])
            if suspects[t.table] else TableReport(t.table)
            for t in found
        ]  # fmt: skip
        left = {r.table: _unique(r.keys) for r in reports}
        settled = sum(len(v) for v in suspects.values()) - sum(len(v) for v in left.values())
        suspects = left
        if not settled:
            break  # nothing in flux: what differs stays different
    for report, t in zip(reports, found, strict=True):
        report.rows = t.rows
    return reports


def _unique(keys: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for k in keys:
        seen.setdefault(json.dumps(k, sort_keys=True, default=str), k)
    return list(seen.values())


def repair(
    spec: TaskSpec,
    found: Verification,
    *,
    request: Callable[[str, list[dict[str, Any]]], str],
    pending: Callable[[], list[str]],
    status: Callable[[], dict[str, Any] | None],
    ends: Callable[[], dict[str, int]],
    wait_s: float = 120.0,
    recheck: Callable[[list[TableReport], Verification], list[TableReport]] | None = None,
) -> Verification:
    """Re-snapshot the differing keys of each table (delete_absent: keys the source lacks are
    deleted), wait until the requests are served and applied, and check those keys again (with
    `recheck(suspects, out)` when the source is not MySQL's: verify_pg.recheck_postgres)."""
    asked = {t.table: request(t.table, _unique(t.keys)) for t in found.tables if t.keys}
    deadline = time.monotonic() + wait_s
    while set(pending()) & set(asked.values()):
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"re-snapshot request(s) {', '.join(asked.values())} not served within {wait_s:.0f} s: is "
                f"task {spec.id} running? (`sluice task status {spec.id}`)"
            )
        time.sleep(0.5)
    after = Verification([], waited=found.waited)
    suspects = [TableReport(t.table, t.rows, different=_unique(t.keys)) for t in found.tables]
    if recheck is not None:
        after.tables = recheck(suspects, after)
    else:
        schemas = {t.table: source_schema(spec.source, t.table) for t in found.tables if t.keys}
        after.tables = settle(spec, schemas, suspects, status, ends, wait_s, after)
    after.repaired = sum(len(_unique(t.keys)) for t in found.tables) - sum(len(t.keys) for t in after.tables)
    return after


def key_shown(key: dict[str, Any]) -> str:
    return json.dumps(key, sort_keys=True, default=str)


def report_lines(result: Verification) -> list[str]:
    """Per table its counts, then its keys (the first KEYS_SHOWN of each kind)."""
    lines = []
    for t in result.tables:
        lines.append(t.line())
        for kind in ("missing", "extra", "different"):
            lines.extend(f"  {kind} {t.table} {key_shown(k)}" for k in getattr(t, kind)[:KEYS_SHOWN])
    return lines


__all__ = ["Verification", "repair", "report_lines", "verify"]
