"""Re-snapshots of a PostgreSQL source while it streams: a whole table read again in keyset chunks
under concurrent writes of every statement kind, and listed keys read again with the keys the
table lacks deleted (`sluice task verify --repair`'s request), each ending equal to the source."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from sluice.ops.postgres import LocalPostgres
from sluice.sync.sources.pg_proto import parse_lsn
from sluice.sync.sources.postgresql import PgCapture, drop_objects, publication_name, slot_name
from sluice.sync.sources.resnapshot import new_request
from sluice.sync.tasks import SourceSpec
from tests.integration.test_mysql_capture import read_all
from tests.integration.test_pg_capture import (
    apply_all,
    assert_same,
    caught_up,
    server_lsn,
    source_spec,
    start,
)
from tests.integration.test_pipeline import create_topic
from tests.integration.test_resnapshot import Requests
from tests.integration.test_workers import create_task, start_worker, stop_worker
from tests.support.cluster import TestCluster, wait_until
from tests.support.pg_source import KEYS, Writer, connect, create_source, text_rows


def drop_slot(spec: SourceSpec, name: str) -> None:
    """The capture's slot and publication dropped (slots are the server's: one left behind would
    hold WAL for the rest of the run)."""
    drop_objects(spec, name, {"slot": slot_name(spec, name), "publication": publication_name(spec, name)})


def envelopes(bootstrap: str) -> list[dict[str, Any]]:
    return [orjson.loads(v) for v in read_all(bootstrap, "shop.changes").column("value").to_pylist()]


@pytest.mark.timeout(420)
def test_a_table_read_again_while_every_statement_kind_commits_ends_equal_to_the_source(
    postgres: LocalPostgres, make_cluster: Callable[..., TestCluster], postgres_url: str, tmp_path: Path
) -> None:
    """The capture serves a whole-table request for `items` in chunks of 37 rows, between the
    stream's transactions, while a writer commits inserts, updates (of the key, of a TOASTed
    column), deletes and truncates; and a keys request for `ledger` with one key the table never
    had (delete_absent: a delete of it, its key typed as the table's). Applied, the target equals
    the source value for value; the chunks' rows are in the log above the initial snapshot's."""
    cluster = make_cluster(1)
    create_topic(cluster.bootstrap, "shop.changes", 3, 1)
    source_url = postgres.create_database("pgresnap")
    create_source(source_url, rows=400)
    spec = source_spec(postgres, "pgresnap")
    with connect(source_url) as conn:
        kept = conn.execute("SELECT account, seq FROM ledger ORDER BY seq LIMIT 1").fetchone()
    requests = Requests()
    cap = PgCapture(
        spec, list(KEYS), lambda _t: "shop.changes", cluster.bootstrap, name="resnap1", heartbeat_s=1.0,
        snapshot_requests=requests, snapshot_done=requests.done, snapshot_chunk_rows=37,
    )  # fmt: skip
    thread = start(cap)
    writer = Writer(source_url, transactions=500, truncate_every=170, seed=3)
    try:
        wait_until(lambda: bool(cap.stats.position or cap.stats.errors), 120, "the snapshot")
        assert not cap.stats.errors and cap.stats.snapshot_rows >= 600, cap.stats
        initial = cap.stats.snapshot_rows
        writer.start()
        wait_until(lambda: writer.done >= 50, 60, "the writer under way")
        whole = new_request("items")
        # keys as `sluice task verify` reports them: each column's text
        listed = new_request(
            "ledger", keys=[{"account": kept[0], "seq": str(kept[1])}, {"account": "nobody", "seq": "7"}],
            delete_absent=True,
        )  # fmt: skip
        with requests.lock:
            requests.pending += [whole, listed]
        wait_until(lambda: not requests() or bool(cap.stats.errors), 240, "the requests served")
        assert not cap.stats.errors, cap.stats.errors
        assert cap.resnapshots is not None and cap.resnapshots.served == 2
        assert cap.resnapshots.chunks > 10, cap.resnapshots.chunks  # items was read in many chunks
        writer.join(240)
        assert writer.error is None, writer.error
        end = server_lsn(source_url)
        wait_until(lambda: caught_up(cap, end) or bool(cap.stats.errors), 120, "catch up")
    finally:
        writer.join(5)
        cap.stop.set()
        thread.join(60)
        drop_slot(spec, "resnap1")
    assert not cap.stats.errors, cap.stats.errors
    assert cap.stats.snapshot_rows > initial

    docs = envelopes(cluster.bootstrap)
    first = min(d["source"]["pos"] for d in docs if d["op"] == "r")
    again = [d for d in docs if d["op"] == "r" and d["source"]["pos"] > first]
    assert len({d["key"]["id"] for d in again if d["table"] == "items"}) >= 300, len(again)
    gone = [d for d in docs if d["op"] == "d" and d["key"] == {"account": "nobody", "seq": 7}]
    assert len(gone) == 1 and gone[0]["source"]["pos"] > first, gone

    apply_all(cluster.bootstrap, postgres_url)
    assert_same(source_url, postgres_url)


def test_a_chunk_waits_for_the_stream_and_takes_the_position_below_the_next_commit(
    postgres: LocalPostgres, make_cluster: Callable[..., TestCluster]
) -> None:
    """A chunk's rows carry the stream's passed LSN minus one: above the last streamed
    transaction's positions, below the next commit's."""
    cluster = make_cluster(1)
    create_topic(cluster.bootstrap, "shop.changes", 3, 1)
    source_url = postgres.create_database("pgresnap2")
    create_source(source_url, rows=20)
    spec = source_spec(postgres, "pgresnap2")
    requests = Requests()
    cap = PgCapture(
        spec, list(KEYS), lambda _t: "shop.changes", cluster.bootstrap, name="resnap2", heartbeat_s=1.0,
        snapshot_requests=requests, snapshot_done=requests.done,
    )  # fmt: skip
    thread = start(cap)
    try:
        wait_until(lambda: bool(cap.stats.position or cap.stats.errors), 120, "the snapshot")
        assert not cap.stats.errors, cap.stats.errors
        with connect(source_url) as conn:
            conn.execute("UPDATE items SET name = 'before' WHERE id = 1")
        before = server_lsn(source_url)
        wait_until(lambda: caught_up(cap, before), 60, "the update streamed")
        with requests.lock:
            requests.pending.append(new_request("items", where="id <= 3"))
        wait_until(lambda: not requests(), 60, "the request served")
        with connect(source_url) as conn:
            conn.execute("UPDATE items SET name = 'after' WHERE id = 1")
        after = server_lsn(source_url)
        wait_until(lambda: caught_up(cap, after), 60, "the second update streamed")
    finally:
        cap.stop.set()
        thread.join(60)
        drop_slot(spec, "resnap2")
    assert not cap.stats.errors, cap.stats.errors
    docs = [d for d in envelopes(cluster.bootstrap) if d["table"] == "items" and d["key"] == {"id": 1}]
    ops = [(d["op"], d["after"]["name"]) for d in docs]
    assert ops[-3:] == [("u", "before"), ("r", "before"), ("u", "after")], ops
    streamed, chunk, later = (d["source"]["pos"] for d in docs[-3:])
    assert streamed < chunk < later, (streamed, chunk, later)
    assert parse_lsn(docs[-2]["source"]["position"]) == chunk + 1


TASK = """
id: pgvfy
source: {{kind: postgresql, host: 127.0.0.1, port: {port}, user: postgres, database: pgvfy}}
tables: [items, ledger]
topic: "pgvfy.changes"
target: {target}
options: {{trigger: 500ms, partitions: 2, replication_factor: 1, heartbeat_interval: 2s}}
"""

FOUND = [
    "verify table=items rows=200 missing=1 extra=1 different=1",
    '  missing items {"id": "2"}',
    '  extra items {"id": "99999"}',
    '  different items {"id": "1"}',
    "verify table=ledger rows=100 missing=0 extra=0 different=1",
    '  different ledger {"account": "acct-3", "seq": "3"}',
]


@pytest.mark.timeout(600)
def test_verify_repair_and_a_table_snapshot_of_a_postgresql_task_run_by_a_worker(
    postgres: LocalPostgres, make_cluster: Callable[..., TestCluster], postgres_url: str, tmp_path: Path
) -> None:
    """`sluice task verify` finds rows changed, deleted and inserted in the target behind the
    pipeline's back while the source keeps changing other rows; `--repair` re-snapshots exactly
    those keys through the running capture (the stray row deleted), repaired=4 verified=true;
    `sluice task snapshot --table items` reads the table again and it stays equal."""
    cluster = make_cluster(1)
    source_url = postgres.create_database("pgvfy")
    create_source(source_url, rows=200)
    zk, store = create_task(TASK.format(port=postgres.port, target=postgres_url), tmp_path, cluster.zookeeper)
    worker = start_worker("wpv1", cluster.bootstrap, cluster.zookeeper, tmp_path)
    stop = threading.Event()

    def write() -> None:
        # other rows change all along, each every 10 s: the pipeline is always a little behind
        with connect(source_url) as conn:
            n = 0
            while not stop.wait(0.1):
                n += 1
                conn.execute("UPDATE items SET amount = amount + 1 WHERE id = %s", [100 + n % 100])

    writer = threading.Thread(target=write, daemon=True)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sluice.cli", "task", *args, "--zookeeper", cluster.zookeeper,
             *(["-b", cluster.bootstrap] if args[0] == "verify" else [])],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    def target_rows() -> int:
        try:
            with connect(postgres_url) as conn:
                return int(conn.execute("SELECT count(*) FROM items").fetchone()[0])
        except psycopg.errors.UndefinedTable:
            return 0

    try:
        wait_until(lambda: target_rows() == 200, 240, "the task's snapshot applied")
        writer.start()
        with connect(postgres_url) as conn:
            conn.execute("UPDATE items SET name = 'tampered' WHERE id = 1")
            conn.execute("DELETE FROM items WHERE id = 2")
            conn.execute("INSERT INTO items (id, name, _sluice_pos) VALUES (99999, 'stray', 1)")
            conn.execute("UPDATE ledger SET note = 'tampered' WHERE account = 'acct-3' AND seq = 3")

        found = cli("verify", "pgvfy")
        assert found.returncode == 1, found.stdout + found.stderr
        assert found.stdout.splitlines() == [*FOUND, "verified=false"], found.stdout

        repaired = cli("verify", "pgvfy", "--repair")
        assert repaired.returncode == 0, repaired.stdout + repaired.stderr
        assert repaired.stdout.splitlines() == [*FOUND, "repaired=4", "verified=true"], repaired.stdout

        asked = cli("snapshot", "pgvfy", "--table", "items")
        assert asked.returncode == 0, asked.stdout + asked.stderr
        assert asked.stdout.startswith("snapshot="), asked.stdout
        wait_until(lambda: not store.control("pgvfy").snapshots, 120, "the table snapshot served")
        stop.set()
        writer.join(10)
        again = cli("verify", "pgvfy")
        assert again.returncode == 0, again.stdout + again.stderr
        assert again.stdout.splitlines() == [
            "verify table=items rows=200 missing=0 extra=0 different=0",
            "verify table=ledger rows=100 missing=0 extra=0 different=0",
            "verified=true",
        ], again.stdout
    finally:
        stop.set()
        stop_worker(worker)
        zk.stop()
        drop_slot(source_spec(postgres, "pgvfy"), "pgvfy")


def test_a_column_added_with_a_default_or_retyped_is_read_again_for_rows_no_change_carried(
    postgres: LocalPostgres, make_cluster: Callable[..., TestCluster], postgres_url: str
) -> None:
    """ADD COLUMN ... DEFAULT fills every row in without a row change in the WAL, and a type
    change rewrites values the same way: the capture asks for a re-snapshot of the table after
    either (not after a column added without a default), and the target ends equal."""
    cluster = make_cluster(1)
    create_topic(cluster.bootstrap, "shop.changes", 3, 1)
    source_url = postgres.create_database("pgreread")
    create_source(source_url, rows=60)
    spec = source_spec(postgres, "pgreread")
    requests = Requests()
    asked: list[str] = []

    def ask(table: str) -> None:
        asked.append(table)
        with requests.lock:
            requests.pending.append(new_request(table))

    cap = PgCapture(
        spec, list(KEYS), lambda _t: "shop.changes", cluster.bootstrap, name="reread", heartbeat_s=1.0,
        snapshot_requests=requests, snapshot_done=requests.done, ask_snapshot=ask,
    )  # fmt: skip
    thread = start(cap)
    try:
        wait_until(lambda: bool(cap.stats.position or cap.stats.errors), 120, "the snapshot")
        assert not cap.stats.errors, cap.stats.errors
        with connect(source_url) as conn:
            conn.execute("ALTER TABLE items ADD COLUMN plain text")  # NULL everywhere: nothing to read
            conn.execute("UPDATE items SET name = 'after plain' WHERE id = 1")
            conn.execute("ALTER TABLE items ADD COLUMN tier text DEFAULT 'gold'")
            conn.execute("UPDATE items SET name = 'after tier' WHERE id = 1")
            conn.execute("ALTER TABLE items ALTER COLUMN amount TYPE numeric(12, 0)")  # values rounded
            conn.execute("UPDATE items SET name = 'after retype' WHERE id = 1")
        end = server_lsn(source_url)

        def served() -> bool:
            return (caught_up(cap, end) and len(asked) == 2 and not requests()) or bool(cap.stats.errors)

        wait_until(served, 120, "the re-reads served")
    finally:
        cap.stop.set()
        thread.join(60)
        drop_slot(spec, "reread")
    assert not cap.stats.errors, cap.stats.errors
    assert asked == ["items", "items"]
    apply_all(cluster.bootstrap, postgres_url)
    columns = ["id", "name", "amount", "plain", "tier"]
    want = text_rows(source_url, "items", columns, ["id"])
    got = text_rows(postgres_url, "items", columns, ["id"])
    assert {k for k in want if want[k] != got.get(k)} == set(), "the target differs from the source"
    assert {v[4] for v in got.values()} == {"gold"}


def _alter_with(
    postgres: LocalPostgres, bootstrap: str, trigger: bool
) -> tuple[list[dict[str, Any]], list[str]]:
    """A capture (with or without the DDL trigger) passes an ALTER TABLE that no row change
    follows: the schema events of its database in the log, and what drop_objects did."""
    database, name = f"pgddl{int(trigger)}", f"ddl{int(trigger)}"
    source_url = postgres.create_database(database)
    create_source(source_url, rows=10)
    spec = source_spec(postgres, database, ddl_trigger=trigger)
    created: dict[str, str] = {}
    cap = PgCapture(
        spec, list(KEYS), lambda _t: "shop.changes", bootstrap, name=name, heartbeat_s=1.0,
        on_created=created.update, created=lambda: dict(created),
    )  # fmt: skip
    thread = start(cap)
    try:
        wait_until(lambda: bool(cap.stats.position or cap.stats.errors), 120, "the snapshot")
        with connect(source_url) as conn:
            conn.execute("ALTER TABLE items ADD COLUMN added text")
            (at,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        end = parse_lsn(at)
        wait_until(lambda: caught_up(cap, end) or bool(cap.stats.errors), 60, "the ALTER passed")
    finally:
        cap.stop.set()
        thread.join(60)
        done = drop_objects(spec, name, created)
    assert not cap.stats.errors, cap.stats.errors
    if trigger:
        with connect(source_url) as conn:
            assert conn.execute("SELECT count(*) FROM pg_event_trigger").fetchone() == (0,)
    events = [d for d in envelopes(bootstrap) if d["op"] == "s" and d["source"]["db"] == database]
    return events, done


def test_with_the_ddl_trigger_an_alter_reaches_the_log_when_it_commits(
    postgres: LocalPostgres, make_cluster: Callable[..., TestCluster]
) -> None:
    """source.ddl_trigger: the capture installs an event trigger, and an ALTER TABLE with no row
    change after it is a schema change event in the log; without the trigger it is not (pgoutput
    carries it only with the table's next change). drop_objects (`sluice task delete`) removes
    the trigger and its function."""
    cluster = make_cluster(1)
    create_topic(cluster.bootstrap, "shop.changes", 3, 1)
    without, _ = _alter_with(postgres, cluster.bootstrap, False)
    assert without == []
    events, done = _alter_with(postgres, cluster.bootstrap, True)
    assert "ddl_trigger=sluice_ddl_ddl1 action=dropped" in done, done
    assert {(d["table"], d["schema"]["change"], d["schema"]["column"]) for d in events} == {
        ("items", "add_column", "added")
    }, events


def test_a_publication_with_a_column_list_raises_no_schema_change(
    postgres: LocalPostgres, make_cluster: Callable[..., TestCluster]
) -> None:
    """A publication the user made with a column list (PostgreSQL 15+): pgoutput's Relation
    messages list only those columns, and the snapshot's columns compared with them are the
    published ones too, so an update is not mistaken for dropped columns."""
    cluster = make_cluster(1)
    create_topic(cluster.bootstrap, "shop.changes", 3, 1)
    source_url = postgres.create_database("pgcollist")
    create_source(source_url, rows=10)
    with connect(source_url) as conn:
        conn.execute("CREATE PUBLICATION collist FOR TABLE items (id, name, amount), ledger")
    spec = source_spec(postgres, "pgcollist", publication="collist")
    cap = PgCapture(
        spec, list(KEYS), lambda _t: "shop.changes", cluster.bootstrap, name="collist", heartbeat_s=1.0
    )
    thread = start(cap)
    try:
        wait_until(lambda: bool(cap.stats.position or cap.stats.errors), 120, "the snapshot")
        with connect(source_url) as conn:
            conn.execute("UPDATE items SET name = 'listed' WHERE id = 1")
        end = server_lsn(source_url)
        wait_until(lambda: caught_up(cap, end) or bool(cap.stats.errors), 60, "the update")
    finally:
        cap.stop.set()
        thread.join(60)
        drop_objects(spec, "collist", {"slot": cap.slot})
    assert not cap.stats.errors, cap.stats.errors
    docs = [d for d in envelopes(cluster.bootstrap) if d["source"]["db"] == "pgcollist"]
    assert [d["op"] for d in docs if d["op"] in ("s", "u")] == ["u"], [d for d in docs if d["op"] == "s"]
