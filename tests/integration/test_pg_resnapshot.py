"""Re-snapshots of a PostgreSQL source while it streams: a whole table read again in keyset chunks
under concurrent writes of every statement kind, and listed keys read again with the keys the
table lacks deleted (`sluice task verify --repair`'s request), each ending equal to the source."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from sluice.ops.postgres import LocalPostgres
from sluice.sync.sources.pg_proto import parse_lsn
from sluice.sync.sources.postgresql import PgCapture
from sluice.sync.sources.resnapshot import new_request
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
from tests.support.cluster import TestCluster, wait_until
from tests.support.pg_source import KEYS, Writer, connect, create_source


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
        spec, list(KEYS), lambda _t: "shop.changes", cluster.bootstrap, name="shop", heartbeat_s=1.0,
        snapshot_requests=requests, snapshot_done=requests.done, snapshot_chunk_rows=37,
    )  # fmt: skip
    thread = start(cap)
    writer = Writer(source_url, transactions=500, truncate_every=170, seed=3)
    try:
        wait_until(lambda: bool(cap.stats.position) and cap.stats.snapshot_rows >= 600, 120, "the snapshot")
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
        spec, list(KEYS), lambda _t: "shop.changes", cluster.bootstrap, name="shop", heartbeat_s=1.0,
        snapshot_requests=requests, snapshot_done=requests.done,
    )  # fmt: skip
    thread = start(cap)
    try:
        wait_until(lambda: bool(cap.stats.position), 120, "the snapshot")
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
    assert not cap.stats.errors, cap.stats.errors
    docs = [d for d in envelopes(cluster.bootstrap) if d["table"] == "items" and d["key"] == {"id": 1}]
    ops = [(d["op"], d["after"]["name"]) for d in docs]
    assert ops[-3:] == [("u", "before"), ("r", "before"), ("u", "after")], ops
    streamed, chunk, later = (d["source"]["pos"] for d in docs[-3:])
    assert streamed < chunk < later, (streamed, chunk, later)
    assert parse_lsn(docs[-2]["source"]["position"]) == chunk + 1
