"""The seeded workload of `sluice chaos sync --source postgresql`: every statement kind the
PostgreSQL source captures, over a table with a column of every type in `PG_CATALOG` at its edge
values, a table under REPLICA IDENTITY FULL with a composite key, and a table with a column
stored out of line (TOAST) that most updates leave alone.

Statement kinds (`PG_STATEMENT_KINDS`): insert, multi-insert, update, update-key (a primary-key
change), update-toast (the TOASTed column itself), update-other (anything but the TOASTed column:
PostgreSQL does not send it), delete, truncate, alter (ADD COLUMN, then a change to the table so
the next Relation message carries it), rollback (a transaction that writes, then rolls back),
tx-same-row (one transaction changing rows more than once: a new row inserted then updated twice,
an existing one updated then deleted, and a savepoint's insert rolled back; its changes share
the transaction's position, so the last must win).
A step is one transaction; its kind and values depend only on the seed and the step's number
(which rows it touches, on the server's random()).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

from sluice.chaos.sync_workload import WorkloadStats
from sluice.chaos.workload_values import RANDOM

#: column -> (type, edge values as SQL literals): the catalog table holds one column of each
PG_CATALOG: dict[str, tuple[str, list[str]]] = {
    "c_int2": ("smallint", ["-32768", "32767"]),
    "c_int4": ("integer", ["-2147483648", "2147483647"]),
    "c_int8": ("bigint", ["-9223372036854775808", "9223372036854775807"]),
    "c_numeric": ("numeric", ["'NaN'", "'Infinity'", "'-Infinity'", "'-0.000000000000000000000001'",
                              "'123456789012345678901234567890.5'"]),
    "c_numeric_s": ("numeric(12,3)", ["'-999999999.999'", "'0.001'"]),
    "c_real": ("real", ["'NaN'", "'-Infinity'", "'3.4028235e38'", "'1e-45'", "'-0'"]),
    "c_double": ("double precision", ["'Infinity'", "'1.7976931348623157e308'", "'5e-324'", "'0.1'"]),
    "c_money": ("money", ["'-92233720368547758.08'", "'92233720368547758.07'"]),
    "c_bool": ("boolean", ["true", "false"]),
    "c_text": ("text", ["''", "'ünïcødé 🎉'", "E'tab\\tnewline\\n'"]),
    "c_varchar": ("varchar(10)", ["'abcdefghij'"]),
    "c_char": ("char(4)", ["'a'"]),
    "c_bytea": ("bytea", ["'\\x00ff'", "''"]),
    "c_uuid": ("uuid", ["'00000000-0000-0000-0000-000000000000'"]),
    "c_json": ("json", ["'{\"a\":1,  \"a\":2}'"]),
    "c_jsonb": ("jsonb", ["'{\"b\": [1, 2.50, null]}'"]),
    "c_date": ("date", ["'infinity'", "'-infinity'", "'4713-01-01 BC'", "'5874897-12-31'"]),
    "c_time": ("time(6)", ["'24:00:00'", "'00:00:00.000001'"]),
    "c_timetz": ("timetz", ["'23:59:59.999999+15:59'"]),
    "c_timestamp": ("timestamp", ["'infinity'", "'294276-12-31 23:59:59.999999'",
                                  "'4713-01-01 00:00:00 BC'"]),
    "c_timestamptz": ("timestamptz", ["'-infinity'", "'2024-03-31 02:30:00 Europe/Berlin'"]),
    "c_interval": ("interval", ["'-178000000 years'", "'1 mon -1 day -00:00:00.000001'"]),
    "c_int_array": ("integer[]", ["'{}'", "'{{1,2},{3,NULL}}'"]),
    "c_text_array": ("text[]", ["ARRAY['a,b', '\"', NULL, '']"]),
    "c_enum": ("mood", ["'sad'", "'happy'"]),
    "c_domain": ("pct", ["'999.99'"]),
    "c_inet": ("inet", ["'::ffff:1.2.3.4/128'", "'10.1.2.3/8'"]),
    "c_cidr": ("cidr", ["'192.168.0.0/16'"]),
    "c_macaddr": ("macaddr", ["'ff:ff:ff:ff:ff:ff'"]),
    "c_bit": ("bit(3)", ["'101'"]),
    "c_varbit": ("varbit", ["''", "'1'"]),
    "c_int4range": ("int4range", ["'empty'", "'[1,)'"]),
    "c_tstzrange": ("tstzrange", ["'(,2020-01-01 00:00+00]'"]),
    "c_point": ("point", ["'(-0,1e-300)'"]),
    "c_polygon": ("polygon", ["'((0,0),(1,1),(1,0))'"]),
    "c_hstore": ("hstore", ["'\"k\"=>\"v\", \"n\"=>NULL'"]),
}  # fmt: skip

PG_TYPE_NAMES = tuple(PG_CATALOG)
PG_STATEMENT_KINDS = (
    "insert", "multi-insert", "update", "update-key", "update-toast", "update-other", "delete", "truncate",
    "alter", "rollback", "tx-same-row",
)  # fmt: skip
#: tables a task captures, and their keys
PG_KEYS = {"accounts": ["id"], "entries": ["account", "seq"], "catalog": ["id"]}
#: a table no task captures: the end of the run is marked there
PG_MARKER_TABLE = "chaos_marker"

SETUP = f"""
CREATE EXTENSION IF NOT EXISTS hstore;
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN pct AS numeric(5, 2);
CREATE TABLE accounts (id integer PRIMARY KEY, name text, balance numeric(14, 2), big text,
                       updated timestamptz DEFAULT now());
ALTER TABLE accounts ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE entries (account integer, seq bigint, amount numeric, note text, big text,
                      PRIMARY KEY (account, seq));
ALTER TABLE entries REPLICA IDENTITY FULL;
ALTER TABLE entries ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE catalog (id integer PRIMARY KEY, {", ".join(f"{c} {t}" for c, (t, _) in PG_CATALOG.items())});
CREATE TABLE {PG_MARKER_TABLE} (id serial PRIMARY KEY, note text);
"""


def _big(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(rng.choice([20, 4000])))


class PgWorkload:
    def __init__(self, seed: int, kinds: tuple[str, ...] = PG_STATEMENT_KINDS) -> None:
        unknown = [k for k in kinds if k not in PG_STATEMENT_KINDS]
        if unknown:
            raise ValueError(f"unknown statement kind(s) {', '.join(unknown)}; choose from "
                             f"{', '.join(PG_STATEMENT_KINDS)}")  # fmt: skip
        self.seed = seed
        self.kinds = kinds
        self.next_id = 1_000_000
        self.added = 0

    def edge_values(self) -> list[tuple[str, int]]:
        return [(c, i) for c, (_, values) in PG_CATALOG.items() for i in range(len(values))]

    def setup(self, conn: Any, rows: int = 200) -> None:
        rng = random.Random(f"pg-initial/{self.seed}")
        conn.execute(SETUP)
        for i in range(1, rows + 1):
            conn.execute("INSERT INTO accounts (id, name, balance, big) VALUES (%s, %s, %s, %s)",
                         [i, f"a{i}", rng.randrange(-10**6, 10**6) / 100, _big(rng)])  # fmt: skip
            conn.execute("INSERT INTO entries VALUES (%s, %s, %s, %s, %s)",
                         [i % 17, i, str(rng.random()), rng.choice(["x", None]), _big(rng)])  # fmt: skip
        for i, (col, n) in enumerate(self.edge_values(), start=1):
            conn.execute(f"INSERT INTO catalog (id, {col}) VALUES ({i}, {PG_CATALOG[col][1][n]})")

    def step(self, conn: Any, number: int, met: set[tuple[str, int]]) -> tuple[str, int]:
        """Run step `number` (one transaction); its kind and how many statements it ran."""
        rng = random.Random(f"pg-step/{self.seed}/{number}")
        kind = rng.choice(self.kinds)
        statements = 0
        ids = [r[0] for r in conn.execute("SELECT id FROM accounts ORDER BY random() LIMIT 3").fetchall()]
        pick = ids[0] if ids else 1
        import psycopg

        with conn.transaction():
            if kind in ("insert", "multi-insert"):
                for _ in range(1 if kind == "insert" else rng.randint(2, 20)):
                    self.next_id += 1
                    conn.execute("INSERT INTO accounts (id, name, balance, big) VALUES (%s, %s, %s, %s)",
                                 [self.next_id, f"n{self.next_id}", rng.randrange(10**6) / 100,
                                  _big(rng)])  # fmt: skip
                    conn.execute("INSERT INTO entries VALUES (%s, %s, %s, %s, %s)",
                                 [rng.randrange(17), self.next_id, "1.5", None, _big(rng)])  # fmt: skip
                    statements += 2
                cols = rng.sample(PG_TYPE_NAMES, 4)
                values = []
                for col in cols:
                    n = rng.randrange(len(PG_CATALOG[col][1]))
                    values.append(PG_CATALOG[col][1][n])
                    met.add((col, n))
                self.next_id += 1
                conn.execute(
                    f"INSERT INTO catalog (id, {', '.join(cols)}) "
                    f"VALUES ({self.next_id}, {', '.join(values)})"
                )
                statements += 1
            elif kind == "update":
                col = rng.choice(PG_TYPE_NAMES)
                n = rng.randrange(len(PG_CATALOG[col][1]))
                conn.execute(f"UPDATE catalog SET {col} = {PG_CATALOG[col][1][n]} WHERE id IN "
                             "(SELECT id FROM catalog ORDER BY random() LIMIT 3)")  # fmt: skip
                met.add((col, n))
                conn.execute("UPDATE entries SET note = %s WHERE seq IN "
                             "(SELECT seq FROM entries ORDER BY random() "
                             "LIMIT 2)", [f"u{number}"])  # fmt: skip
                statements += 2
            elif kind == "update-key":
                self.next_id += 1
                conn.execute("UPDATE accounts SET id = %s WHERE id = %s", [self.next_id, pick])
                conn.execute(
                    "UPDATE entries SET seq = %s WHERE seq = (SELECT max(seq) FROM entries)",
                    [self.next_id + 10**9],
                )
                statements += 2
            elif kind == "update-toast":
                conn.execute("UPDATE accounts SET big = %s WHERE id = %s", [_big(rng), pick])
                statements += 1
            elif kind == "update-other":
                conn.execute(
                    "UPDATE accounts SET balance = balance + 1, name = %s WHERE id = ANY(%s)",
                    [f"o{number}", ids],
                )
                conn.execute("UPDATE entries SET amount = amount + 1 WHERE account = %s", [rng.randrange(17)])
                statements += 2
            elif kind == "delete":
                conn.execute("DELETE FROM accounts WHERE id = %s", [pick])
                conn.execute("DELETE FROM entries WHERE seq = (SELECT min(seq) FROM entries)")
                conn.execute("DELETE FROM catalog WHERE id = (SELECT max(id) FROM catalog)")
                statements += 3
            elif kind == "truncate":
                if rng.random() < 0.3:  # rare: a table emptied often holds little to compare
                    conn.execute("TRUNCATE entries")
                    statements += 1
                conn.execute(
                    "INSERT INTO entries VALUES (%s, %s, '0', 't', %s)",
                    [1, self.next_id + 2 * 10**9, _big(rng)],
                )
                self.next_id += 1
                statements += 1
            elif kind == "alter":
                if self.added < 3:
                    self.added += 1
                    conn.execute(f"ALTER TABLE accounts ADD COLUMN extra{self.added} text")
                    conn.execute(f"UPDATE accounts SET extra{self.added} = 'x' WHERE id = %s", [pick])
                    statements += 2
                else:
                    conn.execute("UPDATE accounts SET name = 'after-alter' WHERE id = %s", [pick])
                    statements += 1
            elif kind == "rollback":
                conn.execute("DELETE FROM accounts")
                statements += 1
                raise psycopg.Rollback()  # nothing of it may reach a target
            elif kind == "tx-same-row":
                self.next_id += 1
                conn.execute("INSERT INTO accounts (id, name, balance, big) VALUES (%s, 'new', 1, %s)",
                             [self.next_id, _big(rng)])  # fmt: skip
                conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = %s", [self.next_id])
                conn.execute(
                    "UPDATE accounts SET name = 'twice', big = %s WHERE id = %s", [_big(rng), self.next_id]
                )
                conn.execute("UPDATE accounts SET name = 'doomed' WHERE id = %s", [pick])
                conn.execute("DELETE FROM accounts WHERE id = %s", [pick])
                with conn.transaction():  # a savepoint
                    conn.execute(
                        "INSERT INTO accounts (id, name) VALUES (%s, 'rolled back')", [self.next_id + 1]
                    )
                    raise psycopg.Rollback()
                statements += 6
        return kind, statements


class PgWorkloadRunner:
    """Steps on one connection at about `rate_per_s` per second until `stop` (its own thread)."""

    def __init__(self, connect: Callable[[], Any], workload: PgWorkload, rate_per_s: float = 12.0) -> None:
        self.connect, self.workload, self.rate_per_s = connect, workload, rate_per_s
        self.stop = threading.Event()
        self.stats = WorkloadStats(steps={})
        self._thread = threading.Thread(target=self._run, name="pg-workload", daemon=True)

    def start(self) -> PgWorkloadRunner:
        self._thread.start()
        return self

    def finish(self) -> WorkloadStats:
        self.stop.set()
        self._thread.join(60)
        return self.stats

    def _run(self) -> None:
        number = 0
        conn = None
        try:
            while not self.stop.is_set():
                if conn is None:
                    conn = self._connect_again()
                    if conn is None:
                        return
                try:
                    kind, n = self.workload.step(conn, number, self.stats.met)
                except Exception as exc:
                    if _connection_lost(exc):  # the source restarted (a walsender killed): go on
                        conn = None
                        self.stats.idle_s += 1.0
                        continue
                    raise
                number += 1
                self.stats.steps[kind] = self.stats.steps.get(kind, 0) + 1
                self.stats.statements += n
                self.stop.wait(1.0 / self.rate_per_s)
        except Exception as exc:
            self.stats.error = f"the workload failed at step {number}: {exc!r}"
        finally:
            if conn is not None:
                conn.close()

    def _connect_again(self) -> Any:
        deadline = time.monotonic() + 120
        while not self.stop.is_set():
            try:
                return self.connect()
            except Exception:
                if time.monotonic() > deadline:
                    raise
                self.stop.wait(1.0)
        return None


def _connection_lost(exc: BaseException) -> bool:
    import psycopg

    return isinstance(exc, psycopg.OperationalError)


__all__ = ["PG_CATALOG", "PG_KEYS", "PG_STATEMENT_KINDS", "RANDOM", "PgWorkload", "PgWorkloadRunner"]
