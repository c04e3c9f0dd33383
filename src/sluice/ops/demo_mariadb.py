"""`sluice demo --source mariadb`: a real database captured through schema changes, a
re-snapshot, an added table and a row the target refuses, then proven equal.

1. a local cluster (ZooKeeper, 3 brokers) and two sync workers in one group;
2. a private MariaDB with a `shop` database (customers, orders with a composite key, refunds);
3. a task capturing customers and orders into the target (SQLite by default), with
   `schema_change_policy: evolve` and `on_refused: dlq`;
4. writes throughout (transactions of inserts, updates and deletes), and during the run, in
   order: a column added, one dropped, one renamed, one widened (values past 32 bits follow), a
   re-snapshot of `orders` while streaming (`sluice task snapshot`), `refunds` added to the task
   (snapshotted alone), and a refund the target refuses (its table there is stricter than the
   source's: a CHECK on the amount), corrected at the source a little later;
5. wait until the target has caught up, then `sluice task verify`, and read the dead-letter
   topic.

Exit status 0 only if verify finds source and target equal and the refused change sits in the
dead-letter topic.
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
from sluice.ops.mariadb import LocalMariaDB

TASK = "shop"
DATABASE = "shop"
CUSTOMERS = 2_000
ORDERS = 2_000
#: the refund the target refuses: its amount is over the target's CHECK, not the source's
REFUSED_REFUND_ID = 900_001
REFUSED_AMOUNT = 5_000_000
TARGET_REFUND_LIMIT = 100_000

SCHEMA = [
    "CREATE TABLE customers (id INT PRIMARY KEY, name VARCHAR(64) NOT NULL, note VARCHAR(64), "
    "score INT NOT NULL, active TINYINT NOT NULL)",
    "CREATE TABLE orders (order_id BIGINT, line INT, amount INT NOT NULL, status VARCHAR(16) NOT NULL, "
    "PRIMARY KEY (order_id, line))",
    "CREATE TABLE refunds (id INT PRIMARY KEY, order_id BIGINT NOT NULL, amount_cents BIGINT NOT NULL)",
]

#: the schema changes made while the writes run, as (fraction of the run, statement, what it is)
SCHEMA_CHANGES = [
    (0.15, "ALTER TABLE customers ADD COLUMN tier VARCHAR(8) DEFAULT 'basic'", "a column added"),
    (0.25, "ALTER TABLE customers DROP COLUMN note", "a column dropped"),
    (0.35, "ALTER TABLE customers RENAME COLUMN name TO full_name", "a column renamed"),
    (0.45, "ALTER TABLE orders MODIFY amount BIGINT NOT NULL", "a column widened (INT to BIGINT)"),
]
RESNAPSHOT_AT = 0.55
ADD_TABLE_AT = 0.65
REFUSED_AT = 0.75
CORRECTED_AT = 0.85


@dataclass
class _State:
    """What the writer may touch now: the statements change with the schema."""

    name_column: str = "name"
    has_note: bool = True
    has_tier: bool = False
    wide_amounts: bool = False
    refunds: bool = False
    transactions: int = 0
    events: list[str] = field(default_factory=list)
    error: str | None = None


class _Writer(threading.Thread):
    """Source transactions throughout, and the schema changes at their moments."""

    def __init__(
        self, db: LocalMariaDB, duration_s: float, state: _State, note: Callable[[str], None]
    ) -> None:
        super().__init__(name="demo-writer", daemon=True)
        self.db, self.duration_s, self.state, self.note = db, duration_s, state, note
        self.rng = random.Random(18)
        self.stop = threading.Event()
        self.next_customer = CUSTOMERS + 1
        self.next_order = ORDERS + 1
        self.next_refund = 1_000

    def run(self) -> None:
        import pymysql

        try:
            conn = pymysql.connect(**self.db.connect_args(DATABASE))
            changes = list(SCHEMA_CHANGES)
            start = time.monotonic()
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    elapsed = (time.monotonic() - start) / self.duration_s
                    if elapsed >= 1:
                        break
                    while changes and elapsed >= changes[0][0]:
                        _, ddl, what = changes.pop(0)
                        cur.execute(ddl)
                        self._schema_changed(ddl)
                        self.note(f"source: {what}: {ddl}")
                    self._transaction(cur)
                    conn.commit()
                    self.state.transactions += 1
                    time.sleep(0.01)
            conn.close()
        except Exception as exc:
            self.state.error = f"the writer failed: {exc}"

    def _schema_changed(self, ddl: str) -> None:
        s = self.state
        if "ADD COLUMN tier" in ddl:
            s.has_tier = True
        elif "DROP COLUMN note" in ddl:
            s.has_note = False
        elif "RENAME COLUMN name" in ddl:
            s.name_column = "full_name"
        elif "MODIFY amount BIGINT" in ddl:
            s.wide_amounts = True

    def _transaction(self, cur: Any) -> None:
        s, rng = self.state, self.rng
        for _ in range(rng.randint(1, 5)):
            r = rng.random()
            if r < 0.25:
                cid = self.next_customer
                self.next_customer += 1
                row: dict[str, Any] = {
                    "id": cid,
                    s.name_column: f"c{cid}",
                    "score": rng.randrange(100),
                    "active": 1,
                }
                if s.has_note:
                    row["note"] = "new"
                if s.has_tier:
                    row["tier"] = rng.choice(["basic", "pro"])
                marks = ", ".join(["%s"] * len(row))
                cur.execute(f"INSERT INTO customers ({', '.join(row)}) VALUES ({marks})", list(row.values()))
            elif r < 0.5:
                cid = rng.randrange(1, self.next_customer)
                tier = ", tier = 'pro'" if s.has_tier and rng.random() < 0.3 else ""
                cur.execute(f"UPDATE customers SET score = score + 1{tier} WHERE id = %s", (cid,))
            elif r < 0.7:
                oid = self.next_order
                self.next_order += 1
                amount = rng.randrange(2**31, 2**40) if s.wide_amounts else rng.randrange(100, 99_999)
                for line in (1, 2):
                    cur.execute("INSERT INTO orders VALUES (%s, %s, %s, 'new')", (oid, line, amount + line))
            elif r < 0.85:
                oid = rng.randrange(1, self.next_order)
                cur.execute(
                    "UPDATE orders SET status = 'paid', amount = amount + 1 WHERE order_id = %s", (oid,)
                )
            elif r < 0.92:
                cur.execute("DELETE FROM orders WHERE order_id = %s", (rng.randrange(1, self.next_order),))
            elif r < 0.96:
                cur.execute("DELETE FROM customers WHERE id = %s", (rng.randrange(1, self.next_customer),))
            else:
                rid = self.next_refund
                self.next_refund += 1
                cur.execute("INSERT INTO refunds VALUES (%s, %s, %s)",
                            (rid, rng.randrange(1, self.next_order), rng.randrange(100, 9_999)))  # fmt: skip


def create_source(db: LocalMariaDB) -> None:
    db.execute(f"DROP DATABASE IF EXISTS {DATABASE}", f"CREATE DATABASE {DATABASE}")
    db.execute(*SCHEMA, database=DATABASE)
    db.execute(
        f"INSERT INTO customers SELECT seq, CONCAT('c', seq), 'seed', seq % 100, 1 FROM seq_1_to_{CUSTOMERS}",
        f"INSERT INTO orders SELECT o.seq, l.seq, 1000 + o.seq, 'new' FROM seq_1_to_{ORDERS} AS o "
        "JOIN seq_1_to_2 AS l",
        "INSERT INTO refunds SELECT seq, seq, 100 + seq FROM seq_1_to_50",
        database=DATABASE,
    )


def stricter_refunds_table(target: str) -> None:
    """The target's refunds table, made before the task writes to it, with a CHECK the source
    does not have: the refund over it is refused by the target, not by the source."""
    from sluice.sync.targets.base import POS_COLUMN

    ddl = (
        "CREATE TABLE IF NOT EXISTS refunds (id BIGINT PRIMARY KEY, order_id BIGINT, amount_cents BIGINT "
        f"CHECK (amount_cents <= {TARGET_REFUND_LIMIT}), {POS_COLUMN} BIGINT NOT NULL)"
    )
    if target.startswith("sqlite:///"):
        import sqlite3

        lite = sqlite3.connect(target[len("sqlite:///") :])
        with lite:
            lite.execute(ddl)
        lite.close()
    else:
        import psycopg

        with psycopg.connect(target) as pg:
            pg.execute(ddl)


def run_mariadb_demo(
    directory: Path, *, duration_s: float, target: str | None, keep: bool, console: Console
) -> bool:
    directory = fresh_directory(directory)
    target = target or f"sqlite:///{directory / 'target.db'}"
    console.print(f"[bold]1.[/] a local cluster of 3 brokers and 2 sync workers in {directory}")
    cluster = launcher.cluster_up(directory / "cluster", brokers=3, workers=2)
    db = LocalMariaDB(directory / "mariadb")
    try:  # from here on, MariaDB and the cluster are stopped whatever ends the demo (cli/demo.py)
        console.print(f"   bootstrap.servers={cluster.bootstrap_servers}  zookeeper={cluster.zookeeper}")
        console.print("[bold]2.[/] a private MariaDB with the shop database")
        db.start()
        return _run(cluster, db, directory, target, duration_s, console)
    except Exception as exc:  # a step failed outright: say which, then clean up
        console.print(f"[bold red]FAILED[/]: {type(exc).__name__}: {exc}", markup=True, highlight=False)
        return False
    finally:
        with signals_held():
            db.remove()
            end_cluster(directory, keep, console)


def _run(
    cluster: launcher.LocalCluster, db: LocalMariaDB, directory: Path, target: str, duration_s: float,
    console: Console,
) -> bool:  # fmt: skip
    from sluice.service import tasks as task_service
    from sluice.service.context import Services
    from sluice.sync.tasks import parse_spec

    create_source(db)
    stricter_refunds_table(target)
    started = time.monotonic()

    def note(line: str) -> None:
        console.print(f"   {time.monotonic() - started:6.1f} s  {line}")

    svc = Services(cluster.zookeeper, cluster.bootstrap_servers)
    try:
        definition = {
            "id": TASK,
            "source": {"kind": "mariadb", "host": "127.0.0.1", "port": db.port, "user": "root",
                       "database": DATABASE},
            "tables": ["customers", "orders"], "target": target,
            "options": {"trigger": "500ms", "partitions": 3, "schema_change_policy": "evolve",
                        "on_refused": "dlq"},
        }  # fmt: skip
        task_service.create_task(svc, parse_spec(definition))
        console.print(f"[bold]3.[/] task {TASK}: customers and orders -> {target}")
        wait_for(lambda: _caught_up(svc, db), 240, "the initial snapshot to reach the target")
        note("snapshot applied; writes start")

        console.print(f"[bold]4.[/] writes for {duration_s:.0f} s, with schema changes, a re-snapshot, "
                      "an added table and a refused row")  # fmt: skip
        state = _State()
        writer = _Writer(db, duration_s, state, note)
        writer.start()
        steps = [
            (RESNAPSHOT_AT, lambda: _resnapshot(svc, note)),
            (ADD_TABLE_AT, lambda: _add_table(svc, definition, note)),
            (REFUSED_AT, lambda: _refused_row(db, svc, note)),
            (CORRECTED_AT, lambda: _correct_row(db, note)),
        ]
        begin = time.monotonic()
        while writer.is_alive():
            elapsed = (time.monotonic() - begin) / duration_s
            while steps and elapsed >= steps[0][0]:
                steps.pop(0)[1]()
            writer.join(0.25)
        for _, step in steps:
            step()
        if state.error:
            console.print(f"[bold red]FAILED[/]: {state.error}")
            return False
        note(f"writes done: {state.transactions:,} transactions")
        wait_for(lambda: _caught_up(svc, db), 240, "the target to catch up with the source")
        note("the target has caught up")

        console.print(f"[bold]5.[/] sluice task verify {TASK}")
        verified = run_verify(svc, TASK, console)
        letters = _dead_letters(svc, console)
        refused = _refused_letters(svc)
        console.print(f"dead_letters={len(letters)} refused_row_in_dlq={str(bool(refused)).lower()}")
        ok = verified and bool(refused)
        if ok:
            console.print("[bold green]OK[/]: source and target are equal through every change, and the "
                          "refused row is in the dead-letter topic")  # fmt: skip
        else:
            console.print("[bold red]FAILED[/]: " + ("source and target differ" if not verified else
                          "the refused row is not in the dead-letter topic"))  # fmt: skip
        return ok
    except StepTimeout as exc:
        console.print(f"[bold red]FAILED[/]: {exc}")
        return False
    finally:
        svc.close()


def _caught_up(svc: Any, db: LocalMariaDB) -> bool:
    """The task has captured up to the source's binlog end and applied everything in its log."""
    from sluice.sync.sources.mysql_base import BinlogPosition

    status = svc.tasks.status(TASK) or {}
    captured = status.get("captured_position")
    if not captured or status.get("lag_records") != 0 or status.get("error"):
        return False
    row = db.execute("SHOW MASTER STATUS")[0]
    return BinlogPosition.parse(str(captured)) >= BinlogPosition(str(row[0]), int(str(row[1])))


def _resnapshot(svc: Any, note: Callable[[str], None]) -> None:
    from sluice.service.tasks import request_snapshot

    request = request_snapshot(svc, TASK, "orders")
    rid = request["snapshot"]["id"]
    note(f"sluice task snapshot {TASK} --table orders (request {rid}): orders read again in "
         "key ranges while the binlog streams")  # fmt: skip


def _add_table(svc: Any, definition: dict[str, Any], note: Callable[[str], None]) -> None:
    from sluice.service import tasks as task_service
    from sluice.sync.tasks import parse_spec

    definition["tables"] = [*definition["tables"], "refunds"]
    task_service.update_task(svc, parse_spec(definition))
    note("refunds added to the task's tables (the task restarts and snapshots just that table)")


def _refused_row(db: LocalMariaDB, svc: Any, note: Callable[[str], None]) -> None:
    """The refund the target refuses, and the wait until it is dead-lettered: corrected at the
    source before its batch was applied, the two changes would collapse into the corrected one
    and the target would never see the refused value (as under load, when the task was still
    restarting for the added table)."""
    db.execute(f"INSERT INTO refunds VALUES ({REFUSED_REFUND_ID}, 1, {REFUSED_AMOUNT})", database=DATABASE)
    note(f"source: refund {REFUSED_REFUND_ID} of {REFUSED_AMOUNT} (the target allows at most "
         f"{TARGET_REFUND_LIMIT}: it refuses the row)")  # fmt: skip
    wait_for(lambda: bool(_refused_letters(svc)), 120, "the refused refund in the dead-letter topic")
    note(
        f"refund {REFUSED_REFUND_ID} refused by the target and dead-lettered; the rest of its batch committed"
    )


def _correct_row(db: LocalMariaDB, note: Callable[[str], None]) -> None:
    db.execute(f"UPDATE refunds SET amount_cents = 500 WHERE id = {REFUSED_REFUND_ID}", database=DATABASE)
    note(f"source: refund {REFUSED_REFUND_ID} corrected to 500 (the newer change applies)")


def _refused_letters(svc: Any) -> list[dict[str, Any]]:
    """The dead letters of the refund the target refuses (none while its topic is not there)."""
    from sluice.sync.dead_letters import DeadLetterError, dead_letter_topic, read_entries

    try:
        entries = read_entries(svc.bootstrap, dead_letter_topic(TASK), svc.security.confluent_config())
    except DeadLetterError:
        return []
    docs = [e.letter.to_doc() for e in entries]
    return [d for d in docs if d["table"] == "refunds" and d["key"].get("id") == REFUSED_REFUND_ID]


def _dead_letters(svc: Any, console: Console) -> list[dict[str, Any]]:
    """The task's dead letters (`sluice dlq list`), each as its document."""
    from sluice.sync.dead_letters import dead_letter_topic, dedupe, read_entries

    entries = dedupe(read_entries(svc.bootstrap, dead_letter_topic(TASK), svc.security.confluent_config()))
    for e in entries:
        d = e.letter
        console.print(f"   dead letter offset={e.label()} table={d.table} key={d.key} error={d.error}")
    return [e.letter.to_doc() for e in entries]
