"""A PostgreSQL source for tests: tables of many types, a seeded writer of every statement kind,
and the source's own text of every row (the reference a target is compared with)."""

from __future__ import annotations

import random
import threading
from typing import Any

import psycopg

from sluice.sync.sources.pg_values import SESSION_OPTIONS

#: table -> key columns
KEYS = {"items": ["id"], "ledger": ["account", "seq"]}

SCHEMA = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE items (
    id integer PRIMARY KEY,
    name varchar(40),
    big text,                       -- often TOASTed: most updates leave it untouched
    amount numeric(12, 2),
    ratio double precision,
    tags integer[],
    seen timestamptz,
    feel mood,
    doc jsonb,
    raw bytea
);
ALTER TABLE items ALTER COLUMN big SET STORAGE EXTERNAL;  -- stored out of line, uncompressed
CREATE TABLE ledger (
    account text,
    seq bigint,
    note text,
    big text,
    at timestamp(3),
    PRIMARY KEY (account, seq)
);
ALTER TABLE ledger REPLICA IDENTITY FULL;
ALTER TABLE ledger ALTER COLUMN big SET STORAGE EXTERNAL;
"""


def connect(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True, options=SESSION_OPTIONS)


def create_source(url: str, rows: int = 200, seed: int = 0) -> None:
    rng = random.Random(seed)
    with connect(url) as conn:
        conn.execute(SCHEMA)
        for i in range(1, rows + 1):
            conn.execute(*_insert_items(rng, i))
        for i in range(1, rows // 2 + 1):
            conn.execute(*_insert_ledger(rng, f"acct-{i % 7}", i))


def _big(rng: random.Random) -> str:
    # above the TOAST threshold (2 kB), incompressible enough to stay out of line
    return "".join(
        rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(rng.choice([10, 3000, 5000]))
    )


def _insert_items(rng: random.Random, i: int) -> tuple[str, list[Any]]:
    return (
        "INSERT INTO items VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        [
            i, f"item {i}", _big(rng), rng.choice(["0.00", "-12.34", "99999999.99", None]),
            rng.choice([0.1, -1e300, float("inf"), float("nan"), None]),
            rng.choice([[1, 2, 3], [], None, [None, 5]]),
            rng.choice(["2024-02-29 12:00:00.123456+00", "infinity", "1999-12-31 23:59:59-05", None]),
            rng.choice(["sad", "ok", "happy", None]), rng.choice(['{"a": [1, 2]}', '"x"', None]),
            rng.choice([b"\x00\xff", b"", None]),
        ],
    )  # fmt: skip


def _insert_ledger(rng: random.Random, account: str, seq: int) -> tuple[str, list[Any]]:
    return (
        "INSERT INTO ledger VALUES (%s, %s, %s, %s, %s)",
        [account, seq, rng.choice(["n", "", None]), _big(rng), rng.choice(["2020-01-01 00:00:00.5", None])],
    )


class Writer(threading.Thread):
    """`transactions` seeded transactions of inserts, updates (of the key, of a TOASTed column,
    of other columns only), deletes, and now and then a TRUNCATE."""

    def __init__(self, url: str, transactions: int, seed: int = 1, truncate_every: int = 0) -> None:
        super().__init__(daemon=True)
        self.url, self.transactions, self.seed, self.truncate_every = url, transactions, seed, truncate_every
        self.done = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(self.seed)
        try:
            with connect(self.url) as conn:
                next_id = 100_000
                for n in range(self.transactions):
                    with conn.transaction():
                        if self.truncate_every and n and n % self.truncate_every == 0:
                            # a row before the TRUNCATE in its transaction: it must go with it
                            conn.execute(*_insert_ledger(rng, "before-truncate", n))
                            conn.execute("TRUNCATE ledger")
                            # a row after the TRUNCATE in its transaction: it must survive it
                            conn.execute(*_insert_ledger(rng, "after-truncate", n))
                        for _ in range(rng.randint(1, 4)):
                            next_id += 1
                            self._statement(conn, rng, next_id)
                    self.done += 1
        except BaseException as exc:  # reported by the test
            self.error = exc

    def _statement(self, conn: psycopg.Connection[Any], rng: random.Random, next_id: int) -> None:
        ids = [r[0] for r in conn.execute("SELECT id FROM items ORDER BY random() LIMIT 2").fetchall()]
        pick = ids[0] if ids else None
        kind = rng.choice(
            ["insert", "update", "update_big", "update_key", "delete", "ledger", "ledger_update"]
        )
        if kind == "insert" or pick is None:
            conn.execute(*_insert_items(rng, next_id))
        elif kind == "update":
            conn.execute(
                "UPDATE items SET name = %s, amount = amount + 1 WHERE id = %s", [f"n{next_id}", pick]
            )
        elif kind == "update_big":
            conn.execute("UPDATE items SET big = %s WHERE id = %s", [_big(rng), pick])
        elif kind == "update_key":
            conn.execute("UPDATE items SET id = %s WHERE id = %s", [next_id, pick])
        elif kind == "delete":
            conn.execute("DELETE FROM items WHERE id = %s", [pick])
        elif kind == "ledger":
            conn.execute(*_insert_ledger(rng, f"acct-{rng.randint(0, 9)}", next_id))
        else:
            conn.execute(
                "UPDATE ledger SET note = %s WHERE seq = (SELECT max(seq) FROM ledger)", [f"u{next_id}"]
            )


def text_rows(
    url: str, table: str, columns: list[str], keys: list[str]
) -> dict[tuple[str, ...], tuple[Any, ...]]:
    """Every row of `table` as PostgreSQL prints each column (`col::text`), by key."""
    sel = ", ".join(f'"{c}"::text' for c in columns)
    with connect(url) as conn:
        rows = conn.execute(f'SELECT {sel} FROM "{table}"').fetchall()
    idx = [columns.index(k) for k in keys]
    return {tuple(r[i] for i in idx): tuple(r) for r in rows}
