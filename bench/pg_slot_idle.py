"""Does a PostgreSQL source's slot hold WAL on an idle database? (issue 37)

A private PostgreSQL (wal_level=logical) with two databases: `idle`, captured by a Sluice
PgCapture into a one-broker log, where nothing is written; and `busy`, which a writer fills at
a steady rate for `--idle-s` seconds. Beside the capture's slot, a control slot on `idle` that
nobody reads: what any consumer that confirms only the changes it receives (Debezium's
PostgreSQL connector without heartbeats, `lsn.flush.mode=connector`) holds, since `idle` sends
it none. Every `--every-s` the retained WAL of both (pg_current_wal_lsn() - restart_lsn) is
printed; at the end

    pg_wal_written_bytes=N            WAL the server wrote during the run
    pg_wal_retained_bytes=N           the Sluice slot's retained WAL, the most seen in the run's
                                      second half
    control_retained_bytes=N          the unread slot's at the end
    bounded=true|false                the Sluice slot's retained WAL stayed under --bound-mb

Usage: .venv/bin/python bench/pg_slot_idle.py --idle-s 600
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from sluice.ops.launcher import cluster_down, cluster_up
from sluice.ops.postgres import LocalPostgres
from sluice.pipeline.execution import ensure_topics
from sluice.sync.sources.postgresql import PgCapture
from sluice.sync.tasks import SourceSpec


def retained(conn: object, slot: str) -> int:
    row = conn.execute(  # type: ignore[attr-defined]
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8 FROM pg_replication_slots "
        "WHERE slot_name = %s",
        [slot],
    ).fetchone()
    return int(row[0]) if row and row[0] is not None else -1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--idle-s", type=float, default=600.0)
    ap.add_argument("--every-s", type=float, default=30.0)
    ap.add_argument("--rate-mb-s", type=float, default=1.0, help="WAL the busy database's writer aims at")
    ap.add_argument("--heartbeat-s", type=float, default=10.0, help="the task option heartbeat_interval")
    ap.add_argument("--bound-mb", type=float, default=64.0)
    args = ap.parse_args()

    import psycopg

    work = Path(tempfile.mkdtemp(prefix="sluice-pg-idle-"))
    server = LocalPostgres(work / "pg", logical=True).start()
    cluster = cluster_up(work / "cluster", brokers=1)
    stop = threading.Event()
    try:
        idle_url = server.create_database("idle")
        busy_url = server.create_database("busy")
        with psycopg.connect(idle_url, autocommit=True) as conn:
            conn.execute("CREATE TABLE quiet (id int PRIMARY KEY, v text)")
            conn.execute("INSERT INTO quiet VALUES (1, 'only row')")
            conn.execute("SELECT pg_create_logical_replication_slot('control_unread', 'pgoutput')")
        with psycopg.connect(busy_url, autocommit=True) as conn:
            conn.execute("CREATE TABLE noise (id bigserial PRIMARY KEY, v text)")
        ensure_topics(cluster.bootstrap_servers, ["idle.changes"], 1, 1)
        spec = SourceSpec(kind="postgresql", port=server.port, user="postgres", database="idle")
        cap = PgCapture(spec, ["quiet"], lambda _t: "idle.changes", cluster.bootstrap_servers, name="idle",
                        heartbeat_s=args.heartbeat_s)  # fmt: skip
        th = threading.Thread(target=cap.run, daemon=True)
        th.start()

        def write() -> None:
            payload = os.urandom(4096).hex()  # ~8 kB of WAL per row
            per_s = max(1, int(args.rate_mb_s * 1_000_000 / 8_500))
            with psycopg.connect(busy_url, autocommit=True) as conn:
                while not stop.is_set():
                    t0 = time.monotonic()
                    with conn.transaction():
                        for _ in range(per_s):
                            conn.execute("INSERT INTO noise (v) VALUES (%s)", [payload])
                    conn.execute("DELETE FROM noise WHERE id < (SELECT max(id) - 1000 FROM noise)")
                    stop.wait(max(0.0, 1.0 - (time.monotonic() - t0)))

        writer = threading.Thread(target=write, daemon=True)
        with psycopg.connect(idle_url, autocommit=True) as conn:
            start_lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
            writer.start()
            began = time.monotonic()
            second_half_max = 0
            print("t_s sluice_slot_retained_bytes control_retained_bytes", flush=True)
            while time.monotonic() - began < args.idle_s:
                time.sleep(min(args.every_s, max(0.0, args.idle_s - (time.monotonic() - began))))
                t = time.monotonic() - began
                ours, control = retained(conn, "sluice_idle"), retained(conn, "control_unread")
                if t >= args.idle_s / 2:
                    second_half_max = max(second_half_max, ours)
                print(f"{t:6.0f} {ours:>14,} {control:>14,}", flush=True)
                if cap.stats.errors or not th.is_alive():
                    print(f"capture stopped: {cap.stats.errors}", flush=True)
                    return 1
            written = conn.execute(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)::int8", [start_lsn]
            ).fetchone()[0]  # type: ignore[index]
            control = retained(conn, "control_unread")
        bounded = 0 <= second_half_max < args.bound_mb * 1_000_000
        print(f"pg_wal_written_bytes={written}")
        print(f"pg_wal_retained_bytes={second_half_max}")
        print(f"control_retained_bytes={control}")
        print(f"bounded={'true' if bounded else 'false'} bound_mb={args.bound_mb:g} idle_s={args.idle_s:g} "
              f"heartbeat_s={args.heartbeat_s:g} load_avg={os.getloadavg()[0]:.1f}")  # fmt: skip
        cap.stop.set()
        th.join(30)
        return 0 if bounded else 1
    finally:
        stop.set()
        cluster_down(work / "cluster")
        server.remove()


if __name__ == "__main__":
    sys.exit(main())
