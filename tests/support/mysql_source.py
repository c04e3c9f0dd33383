"""A small OLTP workload on MariaDB for capture tests: three tables, concurrent transactions."""

from __future__ import annotations

import random
import threading
from typing import Any

import pymysql

from sluice.ops.mariadb import LocalMariaDB
from sluice.sync.envelope import key_text

SCHEMA = [
    "CREATE TABLE customers (id INT PRIMARY KEY, name VARCHAR(64), balance DOUBLE, active TINYINT)",
    "CREATE TABLE orders (id BIGINT PRIMARY KEY, customer_id INT, amount_cents BIGINT, status VARCHAR(16))",
    "CREATE TABLE line_items (order_id BIGINT, line INT, sku VARCHAR(16), qty INT, "
    "PRIMARY KEY (order_id, line))",
]
KEYS = {"customers": ["id"], "orders": ["id"], "line_items": ["order_id", "line"]}


def create_database(server: LocalMariaDB, name: str, rows: int = 300) -> None:
    server.execute(f"DROP DATABASE IF EXISTS `{name}`", f"CREATE DATABASE `{name}`")
    server.execute(*SCHEMA, database=name)
    rng = random.Random(1)
    conn = pymysql.connect(**server.connect_args(name))  # type: ignore[arg-type]
    with conn.cursor() as cur:
        for i in range(1, rows + 1):
            cur.execute(
                "INSERT INTO customers VALUES (%s, %s, %s, 1)", (i, f"c{i}", round(rng.uniform(0, 99), 2))
            )
            cur.execute("INSERT INTO orders VALUES (%s, %s, %s, 'new')", (i, i, rng.randrange(100, 9999)))
            cur.execute("INSERT INTO line_items VALUES (%s, 1, %s, %s)", (i, f"S{i}", rng.randrange(1, 9)))
    conn.commit()
    conn.close()


class Writer(threading.Thread):
    """Concurrent transactions of inserts, updates and deletes; adds a column half way."""

    def __init__(self, server: LocalMariaDB, database: str, transactions: int, seed: int = 2) -> None:
        super().__init__(daemon=True)
        self.server, self.database, self.transactions = server, database, transactions
        self.rng = random.Random(seed)
        self.error: BaseException | None = None
        self.done = 0

    def run(self) -> None:
        try:
            conn = pymysql.connect(**self.server.connect_args(self.database))  # type: ignore[arg-type]
            next_id = 100_000
            with conn.cursor() as cur:
                for n in range(self.transactions):
                    if n == self.transactions // 2:
                        cur.execute("ALTER TABLE customers ADD COLUMN tier VARCHAR(8)")
                    for _ in range(self.rng.randint(1, 4)):
                        r = self.rng.random()
                        k = self.rng.randrange(1, 400)
                        if r < 0.3:
                            next_id += 1
                            cur.execute("INSERT INTO orders VALUES (%s, %s, %s, 'new')", (next_id, k, k * 7))
                            cur.execute("INSERT INTO line_items VALUES (%s, 1, 'X', 1)", (next_id,))
                        elif r < 0.75:
                            tier = ", tier = 'pro'" if n > self.transactions // 2 else ""
                            cur.execute(
                                f"UPDATE customers SET balance = balance + 1.5{tier} WHERE id = %s", (k,)
                            )
                            cur.execute("UPDATE orders SET status = 'paid', amount_cents = amount_cents + 1 "
                                        "WHERE id = %s", (k,))  # fmt: skip
                        else:
                            cur.execute("DELETE FROM line_items WHERE order_id = %s", (k,))
                            cur.execute("DELETE FROM orders WHERE id = %s", (k,))
                    conn.commit()
                    self.done += 1
            conn.close()
        except BaseException as exc:  # reported by the test
            self.error = exc


def source_rows(server: LocalMariaDB, database: str) -> dict[str, dict[str, dict[str, Any]]]:
    conn = pymysql.connect(**server.connect_args(database), cursorclass=pymysql.cursors.DictCursor)  # type: ignore[arg-type]
    out: dict[str, dict[str, dict[str, Any]]] = {}
    with conn.cursor() as cur:
        for table, keys in KEYS.items():
            cur.execute(f"SELECT * FROM {table}")
            out[table] = {key_text({k: row[k] for k in keys}): dict(row) for row in cur.fetchall()}
    conn.close()
    return out


def master_position(server: LocalMariaDB) -> str:
    rows = server.execute("SHOW MASTER STATUS")
    return f"{rows[0][0]}:{rows[0][1]}"
