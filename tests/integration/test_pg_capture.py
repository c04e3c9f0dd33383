"""PostgreSQL capture: a snapshot joined to the slot's stream under concurrent writes of every
statement kind, a restart from the slot, TOASTed columns an UPDATE left alone, and the errors a
user meets first. The target is compared with the source's own text of every value."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from sluice.ops.postgres import LocalPostgres
from sluice.pipeline.verify_pg import verify_postgres
from sluice.sync.sources.mysql_base import CaptureError
from sluice.sync.sources.postgresql import PgCapture, check_source, drop_objects, recover_position
from sluice.sync.sources.postgresql import connect as source_connect
from sluice.sync.targets import open_target
from sluice.sync.tasks import SourceSpec, TaskSpec
from tests.integration.test_mysql_capture import read_all
from tests.integration.test_pipeline import create_topic
from tests.support.cluster import TestCluster, wait_until
from tests.support.pg_source import KEYS, Writer, connect, create_source, text_rows

COLUMNS = {
    "items": ["id", "name", "big", "amount", "ratio", "tags", "seen", "feel", "doc", "raw"],
    "ledger": ["account", "seq", "note", "big", "at"],
}


def source_spec(postgres: LocalPostgres, database: str, **extra: str) -> SourceSpec:
    return SourceSpec(kind="postgresql", port=postgres.port, user="postgres", database=database, **extra)


def start(cap: PgCapture) -> threading.Thread:
    th = threading.Thread(target=cap.run, daemon=True)
    th.start()
    return th


def server_lsn(url: str) -> int:
    from sluice.sync.sources.pg_proto import parse_lsn

    with connect(url) as conn:
        return parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])


def caught_up(cap: PgCapture, lsn: int) -> bool:
    from sluice.sync.sources.pg_proto import parse_lsn

    return bool(cap.stats.position) and parse_lsn(cap.stats.position) >= lsn


def apply_all(bootstrap: str, target_url: str) -> None:
    """Every record of the log applied in one batch: a batch of the pipeline holds whole source
    transactions (its cuts), and one transaction's changes share a position."""
    records = read_all(bootstrap, "shop.changes")
    with open_target(target_url) as t:
        e = t.claim("shop")
        t.apply("shop", e, records)


def assert_same(source_url: str, target_url: str) -> None:
    for table, cols in COLUMNS.items():
        want = text_rows(source_url, table, cols, KEYS[table])
        got = text_rows(target_url, table, cols, KEYS[table])
        missing = sorted(set(want) - set(got))[:5]
        extra = sorted(set(got) - set(want))[:5]
        different = [k for k in want if k in got and want[k] != got[k]][:3]
        assert not (missing or extra or different), (
            f"{table}: missing={missing} extra={extra} different={[(want[k], got[k]) for k in different]}"
        )
        assert want, f"{table} is empty at the source: the test checks nothing"


def test_snapshot_and_stream_with_a_restart_equal_the_source_value_for_value(
    postgres: LocalPostgres, make_cluster: Callable[..., TestCluster], postgres_url: str, tmp_path: Path
) -> None:
    cluster = make_cluster(1)
    create_topic(cluster.bootstrap, "shop.changes", 3, 1)
    source_url = postgres.create_database("pgsrc1")
    create_source(source_url, rows=300)
    spec = source_spec(postgres, "pgsrc1")
    writer = Writer(source_url, transactions=600, truncate_every=150)
    writer.start()  # the snapshot is taken while transactions commit

    def capture(at: str | None) -> tuple[threading.Thread, PgCapture]:
        created: dict[str, str] = {}
        cap = PgCapture(
            spec, list(KEYS), lambda _t: "shop.changes", cluster.bootstrap, name="shop", start=at,
            heartbeat_s=1.0, on_created=created.update, created=lambda: dict(objects),
        )  # fmt: skip
        return start(cap), cap

    objects: dict[str, str] = {}
    t1, cap1 = capture(None)
    wait_until(lambda: writer.done >= 200 and cap1.stats.changes > 100, 120, "capture under way")
    objects.update({"slot": cap1.slot, "publication": cap1.publication})
    cap1.stop.set()
    t1.join(60)
    assert not t1.is_alive()
    assert cap1.stats.snapshot_rows >= 400, cap1.stats

    resume = recover_position(cluster.bootstrap, ["shop.changes"])
    assert resume is not None and resume != "snapshot"
    t2, cap2 = capture(resume)
    writer.join(180)
    assert writer.error is None, writer.error
    end = server_lsn(source_url)
    wait_until(lambda: caught_up(cap2, end) or bool(cap2.stats.errors), 120, "catch up")
    cap2.stop.set()
    t2.join(60)
    assert not cap2.stats.errors

    apply_all(cluster.bootstrap, postgres_url)
    assert_same(source_url, postgres_url)

    # `sluice task verify` of a postgresql source: equal now; a target row changed behind the
    # task's back (and one removed) is reported by key
    task = TaskSpec(id="shop", source=spec, target=postgres_url, tables=list(KEYS))
    found = verify_postgres(task, wait_s=1)
    assert found.ok, [t.line() for t in found.tables]
    assert [t.line() for t in found.tables] == [
        f"verify table={t} rows={len(text_rows(source_url, t, COLUMNS[t], KEYS[t]))} "
        "missing=0 extra=0 different=0"
        for t in KEYS
    ]
    with connect(postgres_url) as conn:
        first, second = (r[0] for r in conn.execute("SELECT id FROM items ORDER BY id LIMIT 2"))
        conn.execute("UPDATE items SET tags = '{42}' WHERE id = %s", [first])
        conn.execute("DELETE FROM items WHERE id = %s", [second])
    found = verify_postgres(task, wait_s=1)
    items = found.tables[0]
    assert (items.missing, items.different, items.extra) == ([{"id": str(second)}], [{"id": str(first)}], [])

    done = drop_objects(spec, "shop", objects)
    assert done == ["slot=sluice_shop action=dropped", "publication=sluice_shop action=dropped"], done
    with connect(source_url) as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'sluice_shop'"
        ).fetchone() == (0,)


def test_clear_errors_for_wal_level_replication_privilege_and_a_taken_slot(postgres: LocalPostgres) -> None:
    url = postgres.create_database("pgsrc2")
    create_source(url, rows=1)
    with connect(url) as conn:
        conn.execute("DROP ROLE IF EXISTS reader")
        conn.execute("CREATE ROLE reader LOGIN")
        conn.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO reader")
    weak = SourceSpec(kind="postgresql", port=postgres.port, user="reader", database="pgsrc2")
    with pytest.raises(CaptureError, match=r"lacks the REPLICATION attribute.*ALTER ROLE reader REPLICATION"):
        check_source(weak)

    with connect(url) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('someone_elses', 'pgoutput')")
    try:
        spec = source_spec(postgres, "pgsrc2", slot="someone_elses")
        cap = PgCapture(spec, list(KEYS), lambda _t: "x", "127.0.0.1:1", name="t2", start=None)
        cap._sql = source_connect(spec)
        with pytest.raises(CaptureError, match="already exists and this task did not create it"):
            cap._create_slot(None)
        assert drop_objects(spec, "t2", {}) == [
            "slot=someone_elses action=kept reason=not_created_by_task",
            "publication=sluice_t2 action=kept reason=not_created_by_task",
        ]
    finally:
        with connect(url) as conn:
            conn.execute("SELECT pg_drop_replication_slot('someone_elses')")


def test_a_server_without_logical_wal_is_refused_with_what_to_set(tmp_path: Path) -> None:
    server = LocalPostgres(tmp_path / "replica-level").start()
    try:
        spec = SourceSpec(kind="postgresql", port=server.port, user="postgres", database="postgres")
        with pytest.raises(
            CaptureError, match="wal_level is replica; logical decoding needs wal_level = logical"
        ):
            check_source(spec)
    finally:
        server.remove()


def test_an_idle_databases_slot_follows_the_servers_wal_while_other_databases_write(
    postgres: LocalPostgres, make_cluster: Callable[..., TestCluster]
) -> None:
    """The captured database is idle while another one writes: the task's slot retains a
    bounded amount of WAL, while a slot nobody confirms (a consumer that acknowledges only the
    changes it receives gets none from here) retains all of it. bench/pg_slot_idle.py is the
    same, for 10 minutes."""
    import os
    import time

    cluster = make_cluster(1)
    create_topic(cluster.bootstrap, "idle.changes", 1, 1)
    idle_url = postgres.create_database("pgidle")
    busy_url = postgres.create_database("pgbusy")
    with connect(idle_url) as conn:
        conn.execute("CREATE TABLE quiet (id int PRIMARY KEY)")
        conn.execute("SELECT pg_create_logical_replication_slot('idle_control', 'pgoutput')")
    with connect(busy_url) as conn:
        conn.execute("CREATE TABLE noise (id bigserial PRIMARY KEY, v text)")
    spec = source_spec(postgres, "pgidle")
    cap = PgCapture(spec, ["quiet"], lambda _t: "idle.changes", cluster.bootstrap, name="idle", heartbeat_s=1)
    th = start(cap)
    try:
        payload = os.urandom(2048).hex()
        with connect(busy_url) as conn, connect(idle_url) as idle:

            def retained_now() -> dict[str, int]:
                return dict(
                    idle.execute(
                        "SELECT slot_name, pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8 "
                        "FROM pg_replication_slots WHERE slot_name IN ('sluice_idle', 'idle_control')"
                    ).fetchall()
                )

            # Another database writes (~2 MB of WAL a second on a quiet machine) for at least 35 s
            # (PostgreSQL moves a slot's restart_lsn at its running-transactions records, every
            # 15 s) and until it wrote 50 MB, however loaded the machine is; 150 s at most.
            started = time.monotonic()
            while True:
                with conn.transaction():
                    for _ in range(400):
                        conn.execute("INSERT INTO noise (v) VALUES (%s)", [payload])
                conn.execute("DELETE FROM noise")
                time.sleep(0.5)
                retained = retained_now()
                elapsed = time.monotonic() - started
                if (elapsed >= 35 and retained["idle_control"] > 50_000_000) or elapsed > 150:
                    break
            # Then the slot must come down to a few MB: on a loaded machine PostgreSQL's own
            # decoding of the other database's WAL may run behind the writer (the walsender reads
            # all of it), so while the writer runs the retained WAL measures that too.
            during = retained
            settle_until = time.monotonic() + 90
            while retained["sluice_idle"] > 16_000_000 and time.monotonic() < settle_until:
                time.sleep(1)
                retained = retained_now()
            idle.execute("SELECT pg_drop_replication_slot('idle_control')")
    finally:
        cap.stop.set()
        th.join(60)
    print(
        f"pg_wal_retained_bytes={retained['sluice_idle']} control_retained_bytes={retained['idle_control']} "
        f"while_writing={during}"
    )
    assert not cap.stats.errors, cap.stats.errors
    assert retained["idle_control"] > 50_000_000  # the WAL the other database wrote
    assert retained["sluice_idle"] <= 16_000_000, (retained, during)


def test_a_large_table_is_snapshotted_in_key_ranges_by_spark_tasks_under_the_slots_snapshot(
    postgres: LocalPostgres, make_cluster: Callable[..., TestCluster], postgres_url: str, spark: Any
) -> None:
    """`items` (one integer key, over snapshot_parallel_rows) is read in ranges of 70 rows by
    Spark tasks, each under the slot's exported snapshot, while a writer commits every
    statement kind; `ledger` (a composite key) is read whole by the capture. The target then
    equals the source, and the ranges' rows carry the snapshot's one position."""
    from sluice.pipeline.snapshot import run_snapshot_chunks
    from sluice.sync.sources.pg_snapshot import read_pg_chunk

    cluster = make_cluster(1)
    create_topic(cluster.bootstrap, "shop.changes", 3, 1)
    source_url = postgres.create_database("pgranges")
    create_source(source_url, rows=400)
    with connect(source_url) as conn:
        conn.execute("ANALYZE items")  # the server's row estimate decides which tables are split
    spec = source_spec(postgres, "pgranges")
    ran: list[int] = []

    def runner(chunks: list[Any]) -> list[Any]:
        ran.append(len(chunks))
        return run_snapshot_chunks(spark, chunks, read=read_pg_chunk)

    writer = Writer(source_url, transactions=300, truncate_every=100, seed=5)
    writer.start()
    cap = PgCapture(
        spec, list(KEYS), lambda _t: "shop.changes", cluster.bootstrap, name="ranges", heartbeat_s=1.0,
        snapshot_runner=runner, snapshot_parallel_rows=100, snapshot_chunk_rows=70,
    )  # fmt: skip
    thread = start(cap)
    try:
        writer.join(180)
        assert writer.error is None, writer.error
        end = server_lsn(source_url)
        wait_until(lambda: caught_up(cap, end) or bool(cap.stats.errors), 180, "catch up")
    finally:
        cap.stop.set()
        thread.join(60)
        drop_objects(spec, "ranges", {"slot": cap.slot, "publication": cap.publication})
    assert not cap.stats.errors, cap.stats.errors
    assert ran and ran[0] >= 5, ran  # items in at least 5 ranges, by Spark tasks
    docs = [orjson.loads(v) for v in read_all(cluster.bootstrap, "shop.changes").column("value").to_pylist()]
    snapshot = {d["source"]["pos"] for d in docs if d["op"] == "r"}
    assert len(snapshot) == 1, snapshot  # ranges and the capture's own read: one position
    assert len({d["key"]["id"] for d in docs if d["op"] == "r" and d["table"] == "items"}) >= 400
    apply_all(cluster.bootstrap, postgres_url)
    assert_same(source_url, postgres_url)
