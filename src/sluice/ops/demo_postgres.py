"""`sluice demo --source postgresql`: a PostgreSQL database captured through a logical
replication slot into a PostgreSQL target, through every kind of statement, then proven equal.

1. a local cluster (ZooKeeper, 3 brokers) and two sync workers in one group;
2. a private PostgreSQL (wal_level=logical) with a `shop` database: customers (with a profile
   column stored out of line, TOASTed) and orders (a composite key);
3. a task capturing both into a `shop_copy` database on the same server (or `--target`): the
   task creates its publication and slot, and snapshots under the slot's exported snapshot;
4. writes throughout (transactions of inserts, updates and deletes; most customer updates leave
   the TOASTed profile untouched, so PostgreSQL does not send it), and during the run, in order:
   a primary-key change, a column added (ALTER TABLE), a TRUNCATE of orders, and an UPDATE of a
   customer whose profile is TOASTed that leaves the profile alone;
5. wait until the target has caught up, then `sluice task verify` (every value compared as the
   two databases print it), the TOASTed profile checked in the target, and the task deleted:
   its slot and publication are dropped with it.

Exit status 0 only if verify prints verified=true and the profile is the source's.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from sluice.ops import launcher
from sluice.ops.demo import StepTimeout, end_cluster, fresh_directory, run_verify, signals_held, wait_for
from sluice.ops.postgres import LocalPostgres

TASK = "shop"
DATABASE = "shop"
TARGET_DATABASE = "shop_copy"
CUSTOMERS = 2_000
ORDERS = 2_000
#: the customer whose TOASTed profile the watched UPDATE leaves alone
TOAST_CUSTOMER = 7

SCHEMA = """
CREATE TABLE customers (id integer PRIMARY KEY, name text NOT NULL, score integer NOT NULL,
                        profile text, joined timestamptz NOT NULL DEFAULT now());
ALTER TABLE customers ALTER COLUMN profile SET STORAGE EXTERNAL;
CREATE TABLE orders (order_id bigint, line integer, amount numeric(12, 2) NOT NULL,
                     status text NOT NULL, PRIMARY KEY (order_id, line));
"""

#: the moments of the run (a fraction of it) and what happens then
KEY_CHANGE_AT = 0.2
ALTER_AT = 0.4
TRUNCATE_AT = 0.6
TOAST_UPDATE_AT = 0.8


@dataclass
class _State:
    has_tier: bool = False
    transactions: int = 0
    error: str | None = None
    events: list[str] = field(default_factory=list)


def _profile(rng: random.Random) -> str:
    # about 6 kB of letters: stored out of line, so an UPDATE that leaves it alone does not send it
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(6_000))


class _Writer(threading.Thread):
    def __init__(self, url: str, duration_s: float, state: _State, note: Callable[[str], None]) -> None:
        super().__init__(name="demo-writer", daemon=True)
        self.url, self.duration_s, self.state, self.note = url, duration_s, state, note
        self.rng = random.Random(37)
        self.next_customer = CUSTOMERS + 1
        self.next_order = ORDERS + 1

    def run(self) -> None:
        import psycopg

        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                moments = [
                    (KEY_CHANGE_AT, self._key_change), (ALTER_AT, self._alter), (TRUNCATE_AT, self._truncate),
                    (TOAST_UPDATE_AT, self._toast_update),
                ]  # fmt: skip
                start = time.monotonic()
                while True:
                    elapsed = (time.monotonic() - start) / self.duration_s
                    if elapsed >= 1:
                        break
                    while moments and elapsed >= moments[0][0]:
                        moments.pop(0)[1](conn)
                    with conn.transaction():
                        self._transaction(conn)
                    self.state.transactions += 1
                    time.sleep(0.01)
                for _, moment in moments:
                    moment(conn)
        except Exception as exc:
            self.state.error = f"the writer failed: {exc}"

    def _key_change(self, conn: Any) -> None:
        new = self.next_customer
        self.next_customer += 1
        conn.execute("UPDATE customers SET id = %s WHERE id = 1", [new])
        self.note(f"source: UPDATE customers SET id = {new} WHERE id = 1 (a primary-key change)")

    def _alter(self, conn: Any) -> None:
        conn.execute("ALTER TABLE customers ADD COLUMN tier text")
        self.state.has_tier = True
        self.note("source: ALTER TABLE customers ADD COLUMN tier text")

    def _truncate(self, conn: Any) -> None:
        conn.execute("TRUNCATE orders")
        self.note("source: TRUNCATE orders")

    def _toast_update(self, conn: Any) -> None:
        conn.execute("UPDATE customers SET score = score + 1000 WHERE id = %s", [TOAST_CUSTOMER])
        self.note(f"source: UPDATE customers SET score = score + 1000 WHERE id = {TOAST_CUSTOMER} "
                  "(its TOASTed profile untouched: PostgreSQL does not send it)")  # fmt: skip

    def _transaction(self, conn: Any) -> None:
        rng = self.rng
        for _ in range(rng.randint(1, 4)):
            r = rng.random()
            if r < 0.2:
                cid = self.next_customer
                self.next_customer += 1
                tier = rng.choice(["basic", "pro"]) if self.state.has_tier else None
                cols = "id, name, score, profile" + (", tier" if tier else "")
                values = [cid, f"c{cid}", rng.randrange(100), _profile(rng) if rng.random() < 0.3 else None]
                marks = ", ".join(["%s"] * (len(values) + (1 if tier else 0)))
                conn.execute(
                    f"INSERT INTO customers ({cols}) VALUES ({marks})", values + ([tier] if tier else [])
                )
            elif r < 0.5:
                cid = rng.randrange(1, self.next_customer)
                tier = ", tier = 'pro'" if self.state.has_tier and rng.random() < 0.3 else ""
                conn.execute(f"UPDATE customers SET score = score + 1{tier} WHERE id = %s", [cid])
            elif r < 0.55:
                conn.execute("UPDATE customers SET profile = %s WHERE id = %s",
                             [_profile(rng), rng.randrange(1, self.next_customer)])  # fmt: skip
            elif r < 0.75:
                oid = self.next_order
                self.next_order += 1
                for line in (1, 2):
                    conn.execute(
                        "INSERT INTO orders VALUES (%s, %s, %s, 'new')",
                        [oid, line, rng.randrange(100, 99_999) / 100],
                    )
            elif r < 0.9:
                conn.execute("UPDATE orders SET status = 'paid', amount = amount + 1 WHERE order_id = %s",
                             [rng.randrange(1, self.next_order)])  # fmt: skip
            elif r < 0.96:
                conn.execute("DELETE FROM orders WHERE order_id = %s", [rng.randrange(1, self.next_order)])
            else:
                conn.execute("DELETE FROM customers WHERE id = %s AND id <> %s",
                             [rng.randrange(2, self.next_customer), TOAST_CUSTOMER])  # fmt: skip


def create_source(server: LocalPostgres) -> str:
    import psycopg

    url = server.create_database(DATABASE)
    rng = random.Random(5)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SCHEMA)
        with conn.cursor().copy("COPY customers (id, name, score, profile) FROM STDIN") as copy:
            for i in range(1, CUSTOMERS + 1):
                profile = _profile(rng) if i == TOAST_CUSTOMER or rng.random() < 0.2 else None
                copy.write_row((i, f"c{i}", i % 100, profile))
        conn.execute(
            f"INSERT INTO orders SELECT o, l, 10 + o / 100.0, 'new' FROM generate_series(1, {ORDERS}) o, "
            "generate_series(1, 2) l"
        )
    return url


def run_postgres_demo(
    directory: Path, *, duration_s: float, target: str | None, keep: bool, console: Console
) -> bool:
    directory = fresh_directory(directory)
    console.print(f"[bold]1.[/] a local cluster of 3 brokers and 2 sync workers in {directory}")
    cluster = launcher.cluster_up(directory / "cluster", brokers=3, workers=2)
    server = LocalPostgres(directory / "postgresql", logical=True)
    try:  # from here on, PostgreSQL and the cluster are stopped whatever ends the demo (cli/demo.py)
        console.print(f"   bootstrap.servers={cluster.bootstrap_servers}  zookeeper={cluster.zookeeper}")
        console.print("[bold]2.[/] a private PostgreSQL (wal_level=logical) with the shop database")
        server.start()
        return _run(cluster, server, target, duration_s, console)
    except Exception as exc:
        console.print(f"[bold red]FAILED[/]: {type(exc).__name__}: {exc}", markup=True, highlight=False)
        return False
    finally:
        with signals_held():
            server.remove()
            end_cluster(directory, keep, console)


def _run(
    cluster: launcher.LocalCluster, server: LocalPostgres, target: str | None, duration_s: float,
    console: Console,
) -> bool:  # fmt: skip
    from sluice.service import tasks as task_service
    from sluice.service.context import Services
    from sluice.sync.tasks import parse_spec

    source_url = create_source(server)
    target = target or server.create_database(TARGET_DATABASE)
    started = time.monotonic()

    def note(line: str) -> None:
        console.print(f"   {time.monotonic() - started:6.1f} s  {line}")

    svc = Services(cluster.zookeeper, cluster.bootstrap_servers)
    try:
        definition = {
            "id": TASK,
            "source": {"kind": "postgresql", "host": "127.0.0.1", "port": server.port, "user": "postgres",
                       "database": DATABASE},
            "tables": ["customers", "orders"], "target": target,
            "options": {"trigger": "500ms", "partitions": 3, "schema_change_policy": "evolve",
                        "heartbeat_interval": "2s"},
        }  # fmt: skip
        task_service.create_task(svc, parse_spec(definition))
        console.print(f"[bold]3.[/] task {TASK}: customers and orders -> {target}")
        wait_for(_caught_up(svc, source_url), 240, "the initial snapshot to reach the target")
        note("snapshot applied (slot sluice_shop, publication sluice_shop); writes start")

        console.print(f"[bold]4.[/] writes for {duration_s:.0f} s, with a primary-key change, an ALTER "
                      "TABLE, a TRUNCATE and an UPDATE that leaves a TOASTed column alone")  # fmt: skip
        state = _State()
        writer = _Writer(source_url, duration_s, state, note)
        writer.start()
        writer.join(duration_s + 120)
        if state.error or writer.is_alive():
            console.print(f"[bold red]FAILED[/]: {state.error or 'the writer did not finish'}")
            return False
        note(f"writes done: {state.transactions:,} transactions")
        wait_for(_caught_up(svc, source_url), 240, "the target to catch up with the source")
        note("the target has caught up")

        console.print(f"[bold]5.[/] sluice task verify {TASK}")
        verified = run_verify(svc, TASK, console)
        kept = _toast_kept(source_url, target)
        console.print(f"toast_kept={str(kept).lower()} (customer {TOAST_CUSTOMER}'s profile in the target "
                      "is the source's)")  # fmt: skip
        result = task_service.delete_task(svc, TASK)
        for line in result.get("source_objects", []):
            console.print(f"   task deleted: source_object {line}", markup=False, highlight=False)
        ok = verified and kept
        console.print("[bold green]OK[/]: source and target are equal through every change" if ok else
                      "[bold red]FAILED[/]: source and target differ")  # fmt: skip
        return ok
    except StepTimeout as exc:
        console.print(f"[bold red]FAILED[/]: {exc}")
        return False
    finally:
        svc.close()


def _caught_up(svc: Any, source_url: str) -> Callable[[], bool]:
    """Whether the task has captured up to the source's WAL position as it is now (read once,
    here: the WAL never stops growing) and applied its whole log."""
    import psycopg

    from sluice.sync.sources.pg_proto import parse_lsn

    with psycopg.connect(source_url, autocommit=True) as conn:
        now = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])  # type: ignore[index]

    def done() -> bool:
        status = svc.tasks.status(TASK) or {}
        captured = status.get("captured_position")
        if not captured or "/" not in str(captured) or status.get("lag_records") != 0 or status.get("error"):
            return False
        return parse_lsn(str(captured)) >= now

    return done


def _toast_kept(source_url: str, target_url: str) -> bool:
    import psycopg

    sql = "SELECT profile FROM customers WHERE id = %s"
    with psycopg.connect(source_url) as src, psycopg.connect(target_url) as dst:
        want = src.execute(sql, [TOAST_CUSTOMER]).fetchone()
        got = dst.execute(sql, [TOAST_CUSTOMER]).fetchone()
    return want is not None and want[0] is not None and want == got
