"""A PostgreSQL source fails over to a standby that was behind: the slot is not on the promoted
server (PostgreSQL before 17 has no failover slots), so the capture takes a new snapshot there,
says so (the `source-history-changed` alarm's information), and gives the new history positions
above every one it emitted before; `verify --repair`'s request then removes what the old primary
had and the new one never got."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sluice.ops.postgres import LocalPostgres
from sluice.sync.sources.postgresql import PgCapture, recover_position
from sluice.sync.sources.resnapshot import new_request
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
from tests.support.pg_source import KEYS, connect, create_source


def replayed(standby_url: str, lsn: int) -> bool:
    from sluice.sync.sources.pg_proto import parse_lsn

    with connect(standby_url) as conn:
        at = conn.execute("SELECT pg_last_wal_replay_lsn()::text").fetchone()[0]
    return at is not None and parse_lsn(at) >= lsn


def item_name(url: str, key: int) -> Any:
    with connect(url) as conn:
        row = conn.execute("SELECT name FROM items WHERE id = %s", [key]).fetchone()
    return None if row is None else row[0]


@pytest.mark.timeout(420)
def test_a_promoted_standby_without_the_slot_goes_on_from_a_new_snapshot_above_every_old_position(
    tmp_path: Path, make_cluster: Callable[..., TestCluster], postgres_url: str
) -> None:
    cluster = make_cluster(1)
    create_topic(cluster.bootstrap, "shop.changes", 3, 1)
    primary = LocalPostgres(tmp_path / "primary", logical=True).start()
    standby = LocalPostgres(tmp_path / "standby", logical=True)
    try:
        primary_url = primary.create_database("shop")
        create_source(primary_url, rows=100)
        standby.start_standby_of(primary)
        standby_url = standby.url("shop")
        first = server_lsn(primary_url)
        wait_until(lambda: replayed(standby_url, first), 60, "the standby caught up")

        cap = PgCapture(
            source_spec(primary, "shop"), list(KEYS), lambda _t: "shop.changes", cluster.bootstrap,
            name="shop", heartbeat_s=1.0,
        )  # fmt: skip
        thread = start(cap)
        # The standby falls behind (stopped) while the primary commits, and the capture captures:
        # 10 MB of WAL, then a change of row 1 and a new row the standby will never have.
        standby.stop()
        with connect(primary_url) as conn:
            conn.execute(
                "CREATE TABLE filler AS SELECT g, repeat('x', 500) AS pad FROM generate_series(1, 20000) g"
            )
            conn.execute("UPDATE items SET name = 'lost in the failover' WHERE id = 1")
            conn.execute("INSERT INTO items (id, name) VALUES (5000, 'lost in the failover')")
        lost = server_lsn(primary_url)
        wait_until(
            lambda: caught_up(cap, lost) or bool(cap.stats.errors), 120, "the primary's changes captured"
        )
        cap.stop.set()
        thread.join(60)
        assert not cap.stats.errors, cap.stats.errors
        primary.stop()

        # Failover: the standby promoted; the task's source address now leads to it.
        standby.start()
        standby.promote()
        with connect(standby_url) as conn:
            conn.execute("UPDATE items SET name = 'after the failover' WHERE id = 1")
            conn.execute("INSERT INTO items (id, name) VALUES (6000, 'after the failover')")
            (forked,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        from sluice.sync.sources.pg_proto import parse_lsn

        assert parse_lsn(forked) < lost  # the new primary's WAL forked below what was captured

        changed: list[dict[str, Any]] = []
        requests = Requests()
        resume = recover_position(cluster.bootstrap, ["shop.changes"])
        assert resume is not None and resume != "snapshot"
        cap = PgCapture(
            source_spec(standby, "shop"), list(KEYS), lambda _t: "shop.changes", cluster.bootstrap,
            name="shop", start=resume, heartbeat_s=1.0, on_history_change=changed.append,
            snapshot_requests=requests, snapshot_done=requests.done,
        )  # fmt: skip
        thread = start(cap)
        try:
            end = server_lsn(standby_url)
            # (the alarm's information comes once the new snapshot is in the log)
            wait_until(
                lambda: (caught_up(cap, end) and changed) or bool(cap.stats.errors), 120, "the new snapshot"
            )
            assert not cap.stats.errors, cap.stats.errors
            assert len(changed) == 1 and not changed[0]["continuous"], changed
            assert changed[0]["detail"] == "replication slot sluice_shop was missing", changed
            assert changed[0]["left_at"] == resume and changed[0]["old_base"] == 0, changed
            assert changed[0]["base"] > 0, changed

            apply_all(cluster.bootstrap, postgres_url)
            # the new primary's row 1 over the old primary's newer-looking one; row 5000, which
            # only the old primary had, still in the target: what verify --repair finds
            assert item_name(postgres_url, 1) == "after the failover"
            assert item_name(postgres_url, 6000) == "after the failover"
            assert item_name(postgres_url, 5000) == "lost in the failover"

            with requests.lock:
                requests.pending.append(new_request("items", keys=[{"id": "5000"}], delete_absent=True))
            wait_until(lambda: not requests() or bool(cap.stats.errors), 60, "the repair served")
        finally:
            cap.stop.set()
            thread.join(60)
        assert not cap.stats.errors, cap.stats.errors
        apply_all(cluster.bootstrap, postgres_url)
        assert_same(standby_url, postgres_url)
    finally:
        standby.remove()
        primary.remove()
