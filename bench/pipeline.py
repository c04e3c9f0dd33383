"""End-to-end pipeline throughput and freshness: generator -> Sluice log -> Spark -> PostgreSQL
(or, with `--target mysql`, a MySQL target on a private MariaDB, whose baseline is PyMySQL on
one connection, one guarded statement per change; with `--target delta`, Delta tables in the
bench's directory, with no baseline: the line says `baseline_rows_s=none ratio=none`).

Runs on a local 3-broker cluster (RF=3, min.insync.replicas 2) and a private PostgreSQL, and
prints:

1. generator: changes written to the log per second (idempotent acks=all producer).
2. pipeline: the apply query (availableNow) draining those changes into PostgreSQL, in a warm
   Spark session (a first small apply has already started the JVM and the Python workers):
   source changes applied per second, from query start to the last commit.
3. baseline: the same changes upserted into the same PostgreSQL with psycopg directly, in
   source order, one statement per change with the same version guard (pipeline mode, one
   transaction per 10,000 changes), as a hand-written sync job would.
4. freshness: the generator writing at a steady rate while a query with a `--trigger-s` trigger
   (1 s by default) applies; per record, the time from its source commit timestamp to the
   commit that made it visible in PostgreSQL: p50, p99, max.
5. one line per run (per source with two):

   pipeline rows_s=N baseline_rows_s=N ratio=R freshness_rate=N freshness_p50_s=X
            freshness_p99_s=X driver_result_bytes_max=N target=postgresql|mysql|delta

   where the last is the most bytes of result the driver received for one batch (the Arrow
   table it collected: with PostgreSQL, the executors' staging summaries, a few rows per task;
   sync/targets/staging.py), over the drain's and the freshness run's batches.

With `--source-format sluice,kafka` the pipeline and freshness runs are made once on each source
(Sluice's own Python Data Source, and Spark's own Kafka source, spark-sql-kafka-0-10: run
scripts/peers.sh first), one after the other on the same log, in one warm session, each
into its own database, and the figures are printed side by side with the ratio:

    rows_s sluice=X kafka=Y
    rows_s ratio sluice/kafka=R
    freshness_p50_s sluice=X kafka=Y
    freshness_p50_s ratio sluice/kafka=R      (lower freshness is better: R < 1 favours sluice)
    freshness_p99_s ...

Usage: .venv/bin/python bench/pipeline.py [--events 1000000] [--rate 20000] [--freshness-s 30]
       [--trigger-s 1] [--source-format sluice|kafka|sluice,kafka] [--master local[*]]
       [--standalone-workers 2]
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from sluice.ops import launcher
from sluice.ops.postgres import LocalPostgres
from sluice.ops.spark_standalone import StandaloneSpark
from sluice.pipeline.apply import ApplyConfig, ApplyQuery, BatchReport
from sluice.pipeline.session import spark_session
from sluice.sync.sources.generator import ChangeGenerator, GeneratorConfig, run_generator
from sluice.sync.targets import open_target
from sluice.sync.truth import compare


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    admin.create_topics([NewTopic(name, partitions, 3)])[name].result()


def drain(
    spark: object,
    bootstrap: str,
    topic: str,
    url: str,
    ckpt: Path,
    split: int | None = None,
    per_trigger: int | None = None,
    source_format: str = "sluice",
    min_records: int | None = None,
) -> tuple[float, int, int, int]:
    batches: list[BatchReport] = []
    q = ApplyQuery(
        spark,
        ApplyConfig(
            bootstrap=bootstrap,
            target=url,
            topics=[topic],
            checkpoint=ckpt,
            available_now=True,
            # the sluice source's range split; the kafka source reads a partition per task
            max_records_per_partition=split if source_format == "sluice" else None,
            max_records_per_trigger=per_trigger,
            min_records_per_partition=min_records if source_format == "sluice" else None,
            source_format=source_format,
        ),
        on_batch=lambda b: (
            batches.append(b),
            print(
                f"  batch {b.batch_id}: {b.result.records:,} rows, collect {b.collect_s:.2f} s "
                f"({b.result_bytes:,} B to the driver), total {b.took_s:.2f} s",
                flush=True,
            ),
        ),
    )
    t0 = time.monotonic()
    with DriverMemory(spark) as memory:
        q.start()
        q.await_termination()
        took = time.monotonic() - t0
    q.stop()
    print(f"  driver memory during the drain: {memory.summary()}")
    records, written = sum(b.result.records for b in batches), sum(b.result.written for b in batches)
    return took, records, written, max((b.result_bytes for b in batches), default=0)


class DriverMemory:
    """Samples the driver's memory once a second while a block runs: the Python process's RSS
    (where `toArrow` used to land every batch) and the driver JVM's heap in use (with local[*]
    the executors' work shares that heap)."""

    def __init__(self, spark: Any) -> None:
        self.runtime = spark._jvm.java.lang.Runtime.getRuntime()
        self.python: list[float] = []
        self.heap: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        rss_kb = next(
            int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
            if line.startswith("VmRSS:")
        )  # fmt: skip
        self.python.append(rss_kb / 1024)
        self.heap.append((self.runtime.totalMemory() - self.runtime.freeMemory()) / 2**20)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self._sample()
            except Exception:
                return  # the JVM went away with the query's end

    def __enter__(self) -> DriverMemory:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def summary(self) -> str:
        def fig(values: list[float]) -> str:
            return f"first {values[0]:.0f} max {max(values):.0f} last {values[-1]:.0f} MB"

        return f"python rss {fig(self.python)}, jvm heap used {fig(self.heap)} ({len(self.python)} samples)"


#: the generator's tables' primary keys, for the baselines' hand-written statements
BASELINE_KEYS = {"customers": ["id"], "orders": ["id"], "inventory": ["sku", "warehouse"]}


def generated_changes(events: int, seed: int) -> list[Any]:
    """The generator's first `events` changes from `seed`: what the pipeline drained, again."""
    gen = ChangeGenerator(GeneratorConfig(seed=seed))
    changes: list[Any] = []
    while len(changes) < events:
        changes.extend(gen.transaction())
    return changes[:events]


def baseline(url: str, events: int, seed: int) -> float:
    """Hand-written psycopg upserts of the same changes (regenerated from the same seed)."""
    changes = generated_changes(events, seed)
    ddl = {
        "customers": "id bigint PRIMARY KEY, name text, email text, tier text, balance double precision, "
        "active boolean, updated_at text, pos bigint",
        "orders": "id bigint PRIMARY KEY, customer_id bigint, amount_cents bigint, status text, note text, "
        "updated_at text, pos bigint",
        "inventory": "sku text, warehouse bigint, qty bigint, price double precision, pos bigint, "
        "PRIMARY KEY (sku, warehouse)",
    }
    keys = BASELINE_KEYS
    with psycopg.connect(url, autocommit=True) as conn:
        for table, cols in ddl.items():
            conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.execute(f"CREATE TABLE {table} ({cols})")
    upsert = {}
    delete = {}
    for table in ddl:
        sample = next(c.after for c in changes if c.table == table and c.after)
        cols = list(sample)
        sets = ", ".join(f"{c} = excluded.{c}" for c in cols if c not in keys[table])
        upsert[table] = (
            f"INSERT INTO {table} ({', '.join(cols)}, pos) VALUES ({', '.join(['%s'] * (len(cols) + 1))}) "
            f"ON CONFLICT ({', '.join(keys[table])}) DO UPDATE SET {sets}, pos = excluded.pos "
            f"WHERE {table}.pos < excluded.pos"
        )
        delete[table] = (
            f"DELETE FROM {table} WHERE {' AND '.join(f'{k} = %s' for k in keys[table])} AND pos < %s"
        )
    cols_of = {t: list(next(c.after for c in changes if c.table == t and c.after)) for t in ddl}
    t0 = time.monotonic()
    with psycopg.connect(url) as conn:
        for i in range(0, len(changes), 10_000):
            with conn.transaction(), conn.pipeline(), conn.cursor() as cur:
                for c in changes[i : i + 10_000]:
                    if c.after is None:
                        cur.execute(delete[c.table], [*(c.key[k] for k in keys[c.table]), c.pos])
                    else:
                        cur.execute(upsert[c.table], [*(c.after[k] for k in cols_of[c.table]), c.pos])
    return time.monotonic() - t0


def baseline_mysql(url: str, events: int, seed: int) -> float:
    """Hand-written PyMySQL upserts of the same changes on one connection: one guarded statement
    per change, in source order, a transaction per 10,000 changes (what a plain sync job does)."""
    import pymysql

    from sluice.sync.targets.mysql import parse_url

    changes = generated_changes(events, seed)
    ddl = {
        "customers": "id bigint PRIMARY KEY, name longtext, email longtext, tier longtext, balance double, "
        "active tinyint(1), updated_at longtext, pos bigint",
        "orders": "id bigint PRIMARY KEY, customer_id bigint, amount_cents bigint, status longtext, "
        "note longtext, updated_at longtext, pos bigint",
        "inventory": "sku varchar(255), warehouse bigint, qty bigint, price double, pos bigint, "
        "PRIMARY KEY (sku, warehouse)",
    }
    keys = BASELINE_KEYS
    conn = pymysql.connect(**parse_url(url), autocommit=True, charset="utf8mb4")
    try:
        with conn.cursor() as cur:
            for table, cols in ddl.items():
                cur.execute(f"DROP TABLE IF EXISTS {table}")
                cur.execute(f"CREATE TABLE {table} ({cols}) ENGINE=InnoDB")
        cols_of = {t: list(next(c.after for c in changes if c.table == t and c.after)) for t in ddl}
        upsert, delete = {}, {}
        for table, cols in cols_of.items():
            sets = ", ".join(
                f"{c} = IF(pos < VALUES(pos), VALUES({c}), {c})" for c in cols if c not in keys[table]
            )
            upsert[table] = (
                f"INSERT INTO {table} ({', '.join(cols)}, pos) "
                f"VALUES ({', '.join(['%s'] * (len(cols) + 1))}) "
                f"ON DUPLICATE KEY UPDATE {sets}, pos = GREATEST(pos, VALUES(pos))"
            )
            delete[table] = (
                f"DELETE FROM {table} WHERE {' AND '.join(f'{k} = %s' for k in keys[table])} AND pos < %s"
            )
        conn.autocommit(False)
        t0 = time.monotonic()
        with conn.cursor() as cur:
            for i in range(0, len(changes), 10_000):
                for c in changes[i : i + 10_000]:
                    if c.after is None:
                        cur.execute(delete[c.table], [*(c.key[k] for k in keys[c.table]), c.pos])
                    else:
                        cur.execute(upsert[c.table], [*(c.after[k] for k in cols_of[c.table]), c.pos])
                conn.commit()
        return time.monotonic() - t0
    finally:
        conn.close()


class MySqlServer:
    """The MySQL target's server for the bench (a private MariaDB), with PostgreSQL's
    `create_database(name) -> URL` and `remove()`."""

    def __init__(self, directory: Path) -> None:
        from sluice.ops.mariadb import LocalMariaDB

        # no binlog needed for a target, and the buffer pool of a small production server
        self.server = LocalMariaDB(directory, extra_args=("--skip-log-bin", "--innodb-buffer-pool-size=1G"))

    def start(self) -> MySqlServer:
        self.server.start()
        return self

    def create_database(self, name: str) -> str:
        self.server.execute(f"DROP DATABASE IF EXISTS `{name}`", f"CREATE DATABASE `{name}`")
        return f"mysql://root@127.0.0.1:{self.server.port}/{name}"

    def remove(self) -> None:
        self.server.remove()


class DeltaLake:
    """The Delta target's "server": a directory of lakes, one per `create_database(name)`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def start(self) -> DeltaLake:
        self.directory.mkdir(parents=True, exist_ok=True)
        return self

    def create_database(self, name: str) -> str:
        return f"delta://{self.directory / name}"

    def remove(self) -> None:
        import shutil

        shutil.rmtree(self.directory, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--rate", type=float, default=20_000, help="generator rate for the freshness run")
    ap.add_argument("--freshness-s", type=float, default=30)
    ap.add_argument(
        "--trigger-s", type=float, default=1.0, help="the freshness query's trigger (s; 0: back to back)"
    )
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--master", default="local[*]", help="Spark master (local[*], or spark://host:port)")
    ap.add_argument(
        "--standalone-workers",
        type=int,
        default=0,
        help="start a Spark standalone master with this many workers (1 core, 1g each) and run on it",
    )
    ap.add_argument("--split", type=int, default=1_000_000, help="maxRecordsPerPartition for the drain")
    ap.add_argument("--per-trigger", type=int, default=None, help="maxRecordsPerTrigger for the drain")
    ap.add_argument(
        "--source-format",
        default="sluice",
        help="comma-separated sources to measure: sluice (Sluice's own), kafka (Spark's own)",
    )
    ap.add_argument(
        "--target",
        default="postgresql",
        choices=("postgresql", "mysql", "delta"),
        help="the target: postgresql, mysql (a private MariaDB; its baseline is one PyMySQL connection) or "
        "delta (Delta tables in the bench's directory; no baseline)",
    )
    args = ap.parse_args()
    formats = [f.strip() for f in args.source_format.split(",") if f.strip()]
    if not formats or any(f not in ("sluice", "kafka") for f in formats) or len(set(formats)) != len(formats):
        ap.error(f"--source-format takes sluice, kafka or sluice,kafka, not {args.source_format!r}")

    work = Path(tempfile.mkdtemp(prefix="sluice-bench-pipeline-"))
    standalone = None
    if args.standalone_workers:
        standalone = StandaloneSpark(work / "spark")
        args.master = standalone.start_master()
        for _ in range(args.standalone_workers):
            standalone.start_worker()
        os.environ.update(standalone.driver_env())
        print(f"standalone: {args.master} with {args.standalone_workers} workers")
    cluster = launcher.cluster_up(work / "cluster", brokers=3)
    servers = {"mysql": MySqlServer, "delta": DeltaLake, "postgresql": LocalPostgres}
    pg: Any = servers[args.target](work / args.target).start()
    bootstrap = cluster.bootstrap_servers
    try:
        spark = spark_session(args.master, app="bench-pipeline", kafka_connector="kafka" in formats)
        # Warm-up of each source: JVM, Python workers, planner, on every executor. Its 20,000
        # changes are cut into tasks of 1,000 or more, so the batch has a task per slot: as one
        # task (the default for so small a batch) it warmed one executor of a standalone
        # cluster's two, and the measured drain paid the other's first task (its Python
        # workers' start and imports, its JVM's first run: 2.5-3 s) on its critical path.
        create_topic(bootstrap, "warmup", args.partitions)
        run_generator(bootstrap, GeneratorConfig(topic="warmup", rate=0, duration_s=None, max_events=20_000))
        for fmt in formats:
            drain(
                spark, bootstrap, "warmup", pg.create_database(f"warmup_{fmt}"), work / f"ck-warmup-{fmt}",
                source_format=fmt, min_records=1_000,
            )  # fmt: skip

        create_topic(bootstrap, "bench", args.partitions)
        cfg = GeneratorConfig(topic="bench", rate=0, duration_s=None, max_events=args.events, seed=args.seed)
        t0 = time.monotonic()
        stats, truth = run_generator(bootstrap, cfg)
        gen_s = time.monotonic() - t0
        print(
            f"generator: {stats.events:,} changes in {gen_s:.1f} s = {stats.events / gen_s:,.0f} changes/s "
            f"({truth.row_count():,} rows in the final state)"
        )

        rows_s: dict[str, float] = {}
        result_bytes: dict[str, int] = {}
        for fmt in formats:
            url = pg.create_database(f"pipeline_{fmt}")
            took, records, written, result_bytes[fmt] = drain(
                spark, bootstrap, "bench", url, work / f"ck-bench-{fmt}", args.split, args.per_trigger, fmt
            )
            with open_target(url) as target:
                cmp = compare(truth, {t: target.read_rows(t) for t in truth.tables})
            rows_s[fmt] = records / took
            print(
                f"pipeline {fmt}: {records:,} changes in {took:.1f} s = {records / took:,.0f} rows/s "
                f"({written:,} target rows written after collapsing; target equals truth: {cmp.ok})"
            )

        base_rows_s: float | None = None
        if args.target == "mysql":
            base_s = baseline_mysql(pg.create_database("baseline"), args.events, args.seed)
            how = "PyMySQL on one connection, one guarded upsert/delete per change"
        elif args.target == "postgresql":
            base_s = baseline(pg.create_database("baseline"), args.events, args.seed)
            how = "psycopg, one guarded upsert/delete per change, pipeline mode"
        if args.target != "delta":  # a lake has no one-statement-per-change applier to compare
            base_rows_s = args.events / base_s
            print(f"baseline:  {args.events:,} changes in {base_s:.1f} s = {base_rows_s:,.0f} rows/s ({how})")
            for fmt in formats:
                print(f"ratio:     pipeline {fmt} / baseline = {rows_s[fmt] / base_rows_s:.2f}")

        # Freshness at a steady rate, each source on a topic of its own.
        fresh_p: dict[str, tuple[float, float]] = {}
        fresh_bytes: dict[str, int] = {}
        for fmt in formats:
            p50, p99, fresh_bytes[fmt] = freshness(spark, bootstrap, pg, work, args, fmt)
            fresh_p[fmt] = (p50, p99)

        for fmt in formats:
            p50, p99 = fresh_p[fmt]
            source = f" source={fmt}" if len(formats) > 1 else ""
            base = (
                f"baseline_rows_s={base_rows_s:.0f} ratio={rows_s[fmt] / base_rows_s:.2f}"
                if base_rows_s
                else "baseline_rows_s=none ratio=none"
            )
            print(
                f"pipeline rows_s={rows_s[fmt]:.0f} {base} freshness_rate={args.rate:.0f} "
                f"freshness_p50_s={p50:.2f} freshness_p99_s={p99:.2f} "
                f"driver_result_bytes_max={max(result_bytes[fmt], fresh_bytes[fmt])} "
                f"target={args.target}{source}",
                flush=True,
            )

        if len(formats) == 2:
            print(f"rows_s sluice={rows_s['sluice']:.0f} kafka={rows_s['kafka']:.0f}")
            print(f"rows_s ratio sluice/kafka={rows_s['sluice'] / rows_s['kafka']:.2f}")
            for i, name in enumerate(("freshness_p50_s", "freshness_p99_s")):
                sl, ka = fresh_p["sluice"][i], fresh_p["kafka"][i]
                print(f"{name} sluice={sl:.2f} kafka={ka:.2f}")
                print(
                    f"{name} ratio sluice/kafka={sl / ka:.2f}" if ka > 0 else f"{name} ratio sluice/kafka=n/a"
                )
        spark.stop()
    finally:
        pg.remove()
        launcher.cluster_down(work / "cluster")
        if standalone is not None:
            standalone.stop()
    return 0


def freshness(
    spark: object, bootstrap: str, pg: Any, work: Path, args: argparse.Namespace, fmt: str
) -> tuple[float, float, int]:
    """The generator at a steady rate while a query on `fmt` applies: p50 and p99 (s)
    of source commit to target commit, per applied row, and the most result bytes the driver
    received for one batch."""
    topic = f"fresh-{fmt}"
    create_topic(bootstrap, topic, args.partitions)
    fresh: list[int] = []
    applied = [0]
    most_bytes = [0]
    reports: list[BatchReport] = []

    def on_fresh(b: BatchReport) -> None:
        reports.append(b)
        fresh.extend(b.freshness_ms)
        applied[0] += b.result.records - b.result.skipped
        most_bytes[0] = max(most_bytes[0], b.result_bytes)

    q = ApplyQuery(
        spark,
        ApplyConfig(
            bootstrap=bootstrap,
            target=pg.create_database(f"fresh_{fmt}"),
            topics=[topic],
            checkpoint=work / f"ck-fresh-{fmt}",
            trigger_s=args.trigger_s,
            source_format=fmt,
        ),
        on_batch=on_fresh,
        keep_freshness=True,
    )
    q.start()
    time.sleep(3)
    fcfg = GeneratorConfig(topic=topic, rate=args.rate, duration_s=args.freshness_s, seed=args.seed + 1)
    fstats, _ = run_generator(bootstrap, fcfg)
    deadline = time.monotonic() + 60
    while applied[0] < fstats.events and time.monotonic() < deadline:
        time.sleep(0.5)
    progress = list(q.query.recentProgress or [])
    q.stop()
    fresh.sort()
    spent: dict[str, list[float]] = {}
    for entry in progress:
        if entry.numInputRows:
            for name, ms in (entry.durationMs or {}).items():
                spent.setdefault(name, []).append(ms)
    if spent:  # Spark's own account of its micro-batches (StreamingQueryProgress.durationMs)
        print(f"freshness {fmt} spark ms per batch: " + ", ".join(
            f"{name} {statistics.mean(v):.0f}" for name, v in sorted(spent.items())))  # fmt: skip
    if len(reports) > 1:
        # where a batch's time goes: the Spark job (read, parse, collapse; with PostgreSQL the
        # executors' staging too), the target commit, and the rest of the interval between two
        # commits (Spark's planning, offsets and commit logs, waiting for the trigger)
        span = reports[-1].committed_at - reports[0].committed_at
        gaps = span / (len(reports) - 1)
        job = statistics.mean(b.collect_s for b in reports)
        commit = statistics.mean(b.commit_s for b in reports)
        print(
            f"freshness {fmt} batches: {len(reports)}, one every {gaps:.2f} s: job {job:.2f} s, "
            f"commit {commit:.2f} s, the rest {max(gaps - job - commit, 0):.2f} s"
        )
    if not fresh:
        print(f"freshness {fmt}: nothing applied")
        return 0.0, 0.0, most_bytes[0]
    p50 = fresh[len(fresh) // 2]
    p99 = fresh[min(len(fresh) - 1, int(len(fresh) * 0.99))]
    print(
        f"freshness {fmt}: {applied[0]:,} of {fstats.events:,} changes at {args.rate:,.0f}/s, "
        f"trigger {args.trigger_s:g} s "
        f"({len(fresh):,} row writes after collapsing): "
        f"p50 {p50 / 1000:.2f} s, p99 {p99 / 1000:.2f} s, max {fresh[-1] / 1000:.2f} s, "
        f"mean {statistics.mean(fresh) / 1000:.2f} s"
    )
    return p50 / 1000, p99 / 1000, most_bytes[0]


if __name__ == "__main__":
    sys.exit(main())
