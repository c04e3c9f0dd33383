"""Transactions larger than the slot session's logical_decoding_work_mem: PostgreSQL streams them
to the capture in blocks while they are in progress (protocol version 2), between other
transactions' commits. The capture keeps each whole until its Stream Commit, drops it on Stream
Abort, and drops a rolled-back savepoint's changes; the target ends equal to the source."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sluice.ops.postgres import LocalPostgres
from sluice.sync.sources.postgresql import PgCapture
from tests.integration.test_pg_capture import (
    apply_all,
    assert_same,
    caught_up,
    server_lsn,
    source_spec,
    start,
)
from tests.integration.test_pg_resnapshot import drop_slot
from tests.integration.test_pipeline import create_topic
from tests.support.cluster import TestCluster, wait_until
from tests.support.pg_source import KEYS, connect, create_source

ROW = "INSERT INTO items (id, name, big, amount) VALUES (%s, %s, repeat(md5(%s::text), 20), %s)"


@pytest.mark.timeout(300)
def test_transactions_streamed_in_progress_arrive_whole_at_their_commit(
    postgres: LocalPostgres, make_cluster: Callable[..., TestCluster], postgres_url: str, tmp_path: Path
) -> None:
    cluster = make_cluster(1)
    create_topic(cluster.bootstrap, "shop.changes", 3, 1)
    source_url = postgres.create_database("pgstream")
    create_source(source_url, rows=50)
    spec = source_spec(postgres, "pgstream")
    cap = PgCapture(
        spec, list(KEYS), lambda _t: "shop.changes", cluster.bootstrap, name="stream1", heartbeat_s=1.0,
        decoding_work_mem="64kB",
    )  # fmt: skip
    thread = start(cap)
    try:
        wait_until(lambda: bool(cap.stats.position or cap.stats.errors), 120, "the snapshot")
        assert not cap.stats.errors, cap.stats.errors
        with connect(source_url) as big, connect(source_url) as small:
            # a large transaction, with small ones committing while it is in progress
            with big.transaction():
                for i in range(2000):
                    big.execute(ROW, [200_000 + i, f"big-{i}", i, i])
                    if i % 500 == 0:
                        small.execute("UPDATE items SET name = %s WHERE id = 1", [f"small-{i}"])
                        small.execute(ROW, [500_000 + i, "small", i, i])
                # a savepoint rolled back: none of its rows may arrive
                big.execute("SAVEPOINT s1")
                for i in range(1000):
                    big.execute(ROW, [300_000 + i, "rolled back", i, i])
                big.execute("ROLLBACK TO SAVEPOINT s1")
                big.execute("UPDATE items SET name = 'big and last' WHERE id = 1")
                big.execute("DELETE FROM items WHERE id BETWEEN 200000 AND 200099")
            # a large transaction rolled back whole
            with big.transaction(force_rollback=True):
                for i in range(1500):
                    big.execute(ROW, [400_000 + i, "aborted", i, i])
        end = server_lsn(source_url)
        wait_until(lambda: caught_up(cap, end) or bool(cap.stats.errors), 120, "catch up")
    finally:
        cap.stop.set()
        thread.join(60)
        drop_slot(spec, "stream1")
    assert not cap.stats.errors, cap.stats.errors
    assert cap.stats.streamed_blocks >= 2, cap.stats  # the server did stream them in progress

    apply_all(cluster.bootstrap, postgres_url)
    assert_same(source_url, postgres_url)
    with connect(postgres_url) as conn:
        assert conn.execute("SELECT name FROM items WHERE id = 1").fetchone() == ("big and last",)
        assert conn.execute("SELECT count(*) FROM items WHERE id >= 200000 AND id < 300000").fetchone() == (
            1900,
        )
