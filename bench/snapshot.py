"""Initial snapshot of a MariaDB table into the log: the capture's own single-transaction read
against the Spark job reading key ranges in parallel.

A private MariaDB (Debian's mariadb-server) with one table of --rows rows (integer key, a few
columns, about 80 bytes a row), a local 3-broker cluster, a topic of 6 partitions with RF=3.
Each mode snapshots the table into its own topic with an idempotent acks=all producer (per
Spark task, in the parallel mode) and prints rows/s from the start of the capture until every
snapshot row and the position markers are acknowledged. The Spark session is started before
timing (a worker has one running already).

Usage: .venv/bin/python bench/snapshot.py [--rows 1000000] [--chunk-rows 100000] [--master local[*]]
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from sluice.ops import launcher
from sluice.ops.mariadb import LocalMariaDB
from sluice.pipeline.session import spark_session
from sluice.pipeline.snapshot import run_snapshot_chunks
from sluice.sync.sources.mysql import MySqlCapture
from sluice.sync.tasks import SourceSpec


def fill(db: LocalMariaDB, rows: int) -> None:
    db.execute("CREATE DATABASE bench")
    db.execute(
        "CREATE TABLE items (id BIGINT PRIMARY KEY, sku VARCHAR(16), qty INT, price DOUBLE, "
        "note VARCHAR(40))",
        database="bench",
    )
    step = 20_000
    for start in range(1, rows + 1, step):
        values = ", ".join(
            f"({i}, 'SKU{i % 9973}', {i % 100}, {i % 1000 / 7:.2f}, 'note for item number {i}')"
            for i in range(start, min(start + step, rows + 1))
        )
        db.execute(f"INSERT INTO items VALUES {values}", database="bench")
    db.execute("ANALYZE TABLE items", database="bench")


def create_topic(bootstrap: str, name: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    admin.create_topics([NewTopic(name, 6, 3)])[name].result()


def snapshot(
    spec: SourceSpec, bootstrap: str, topic: str, rows: int, runner: object, chunk_rows: int
) -> float:
    stop = threading.Event()
    cap = MySqlCapture(
        spec, ["items"], lambda _t: topic, bootstrap, name=topic, stop=stop,
        snapshot_runner=runner,  # type: ignore[arg-type]
        snapshot_parallel_rows=1, snapshot_chunk_rows=chunk_rows,
    )  # fmt: skip
    t0 = time.monotonic()
    th = threading.Thread(target=cap.run, daemon=True)
    th.start()
    # stats.position is set once the snapshot rows and the markers are acknowledged
    while not (cap.stats.position and cap.stats.snapshot_rows >= rows):
        if not th.is_alive():
            raise SystemExit(f"capture ended early: {cap.stats.errors}")
        time.sleep(0.05)
    took = time.monotonic() - t0
    stop.set()
    th.join(60)
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--chunk-rows", type=int, default=100_000)
    ap.add_argument("--master", default="local[*]")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sluice-bench-snapshot-") as tmp:
        root = Path(tmp)
        db = LocalMariaDB(root / "mariadb").start()
        cluster = None
        try:
            print(f"filling {args.rows:,} rows ...", flush=True)
            fill(db, args.rows)
            cluster = launcher.cluster_up(root / "cluster", 3)
            bootstrap = cluster.bootstrap_servers
            spark = spark_session(args.master, app="sluice-bench-snapshot")
            spark.sparkContext.parallelize([1, 2], 2).count()  # warm: JVM and Python workers
            spec = SourceSpec(kind="mariadb", port=db.port, user="root", database="bench")
            for mode in ("serial", "spark"):
                topic = f"bench-{mode}"
                create_topic(bootstrap, topic)
                runner = (lambda c: run_snapshot_chunks(spark, c)) if mode == "spark" else None
                took = snapshot(spec, bootstrap, topic, args.rows, runner, args.chunk_rows)
                label = (
                    "capture's own transaction"
                    if mode == "serial"
                    else f"Spark {args.master}, ranges of {args.chunk_rows:,}"
                )
                print(f"{mode:6s} {label:45s} {args.rows / took:12,.0f} rows/s  ({took:.1f} s)", flush=True)
            spark.stop()
        finally:
            if cluster is not None:
                launcher.cluster_down(Path(cluster.directory))
            db.remove()


if __name__ == "__main__":
    main()
