"""A seeded random workload for a MariaDB source: the statements a sync task must carry over.

Five tables. Three with a few friendly column types (text, binary, decimal, double, date/time,
JSON, integers; values from `workload_values.Values`): `items` (an INT key), `pairs` (a
composite VARCHAR, INT key) and `events` (a BIGINT key). Two with a column of every type of the
type catalog (chaos/type_catalog.py), whose values are NULL, one of the type's edge values or a
random value of the type (`workload_values.CatalogValues`): `typed` (an INT key) and `stamps`,
whose primary key is a DATETIME(6) and a BINARY(4) (`at`, `tag`; a tag is written now padded
with 0x00 to its four bytes, now not, which is the same key).

Each step of the workload is one transaction of one statement kind (or an idle gap), drawn from
`random.Random(seed)`: the same seed gives the same statements, with their literal values,
whatever the timing. Statements are plain SQL text, so a failing seed's workload can be printed
and replayed by hand (after `SESSION`: the catalog's sql_mode and time zone).

Statement kinds (`STATEMENT_KINDS`):

    insert        one row                           update        some columns of one row
    update-key    an UPDATE that changes the        delete        one row
                  primary key
    multi-insert  INSERT IGNORE of several rows     multi-update  UPDATE of a key range
    multi-delete  DELETE of a key range             upsert-dup    INSERT ... ON DUPLICATE KEY
                                                                  UPDATE with a key repeated in VALUES
    replace       REPLACE of one or two rows        tx-same-row   one transaction changing one row
                                                                  many times (and deleting and
                                                                  re-inserting it)
    truncate      TRUNCATE TABLE                    idle          seconds with no write at all

Value kinds that can be turned off (`VALUE_KINDS`): `nul-text` (U+0000 inside text values),
`non-utf8-binary` (binary values with bytes that are not UTF-8) and `invalid-date` (zero dates,
a zero in a date, days a month does not have: what ALLOW_INVALID_DATES keeps; Debezium's
snapshot stops on them, so bench/e2e.py can leave them out). Catalog types can be left out
(`TYPE_NAMES`, `types`): their columns are then not in `typed` and `stamps` at all.

Keys are drawn from small ranges, so updates and deletes mostly hit rows that exist and
inserts sometimes collide: a statement the server refuses (duplicate key) is counted as
rejected and the transaction goes on. The source's state depends only on the statements, since
one connection runs them in order. Each statement remembers the catalog values it holds
(`Step.met`), so a run can say which types and edge values it met.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sluice.chaos.type_catalog import CATALOG, SESSION_SQL_MODE, TIMESTAMP_ZONE, CatalogType
from sluice.chaos.workload_values import (
    TYPE_NAMES,
    VALUE_KINDS,
    CatalogValues,
    Drawn,
    Values,
    lit,
)

STATEMENT_KINDS = (
    "insert", "update", "update-key", "delete", "multi-insert", "multi-update", "multi-delete",
    "upsert-dup", "replace", "tx-same-row", "truncate", "idle",
)  # fmt: skip

#: How often each statement kind is drawn, relative to the others.
WEIGHTS = {
    "insert": 3.0, "update": 3.0, "update-key": 0.8, "delete": 1.5, "multi-insert": 1.0,
    "multi-update": 1.0, "multi-delete": 0.6, "upsert-dup": 1.0, "replace": 1.0, "tx-same-row": 1.0,
    "truncate": 0.08, "idle": 0.06,
}  # fmt: skip
IDLE_S = (3.0, 6.0)  # an idle gap's length, seconds

TABLES = ("items", "pairs", "events", "typed", "stamps")
CATALOG_TABLES = ("typed", "stamps")  # a column of every (chosen) catalog type
MARKER_TABLE = "chaos_marker"  # not captured: a last transaction that moves the binlog position

#: The writer's session: the catalog's literals need its sql_mode (zero and invalid dates, ENUM's
#: error value) and are in its time zone (TIMESTAMPs).
SESSION = (f"SET SESSION sql_mode = '{SESSION_SQL_MODE}'", f"SET SESSION time_zone = '{TIMESTAMP_ZONE}'")

SCHEMA = (
    "CREATE TABLE items (id INT NOT NULL PRIMARY KEY, name VARCHAR(64), note TEXT, qty INT, "
    "big BIGINT, price DECIMAL(12,3), ratio DOUBLE, created DATETIME(6), day DATE, tod TIME, doc JSON, "
    "raw BLOB)",
    "CREATE TABLE pairs (region VARCHAR(8) NOT NULL, seq INT NOT NULL, label VARCHAR(32), "
    "amount DECIMAL(10,2), payload VARBINARY(64), updated DATETIME, score DOUBLE, doc JSON, "
    "PRIMARY KEY (region, seq))",
    "CREATE TABLE events (id BIGINT NOT NULL PRIMARY KEY, kind VARCHAR(16), body MEDIUMTEXT, "
    "at DATETIME(3), n INT, blob_tail VARBINARY(16))",
    f"CREATE TABLE {MARKER_TABLE} (id INT AUTO_INCREMENT PRIMARY KEY, note VARCHAR(32))",
)
KEYS = {
    "items": ("id",), "pairs": ("region", "seq"), "events": ("id",), "typed": ("id",),
    "stamps": ("at", "tag"),
}  # fmt: skip

ITEM_IDS = 120
REGIONS = ("eu", "us", "ap", "sa")
SEQS = 30
EVENT_IDS = 150
TYPED_IDS = 120
#: `stamps` keys: the catalog's DATETIME(6) edge values and a few more, times the tags below.
STAMP_ATS = (
    dt.datetime(2024, 6, 30, 12, 0, 0, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999_999),
    dt.datetime(1970, 1, 1), dt.datetime(2024, 6, 30, 12), dt.datetime(2024, 2, 29, 23, 59, 59, 500_000),
    dt.datetime(1000, 1, 1, 0, 0, 0, 1),
)  # fmt: skip
STAMP_TAGS = (b"ab\x00\x00", b"\x00\x00\x00\x00", b"a\x00b\x00", b"zzzz")  # as stored: padded to 4 bytes
STAMP_TAGS_NON_UTF8 = (b"\xff\x00\xff\x00", b"\x80\x00\x00\x00")
INITIAL_ROWS = {"items": 40, "pairs": 40, "events": 40, "typed": 40, "stamps": 12}


def parse_kinds(text: str, known: tuple[str, ...], what: str) -> tuple[str, ...]:
    """Kinds from a comma-separated list: names, `all`, and `-name` to leave one out
    (`-truncate` alone means every kind but truncate). Unknown names are a ValueError."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ValueError(f"no {what} given; choose from all, {', '.join(known)} (or -NAME to leave one out)")
    chosen: list[str] = []
    if all(i.startswith("-") for i in items) or "all" in items:
        chosen = list(known)
    for item in items:
        name = item.lstrip("-")
        if name == "all":
            continue
        if name not in known:
            raise ValueError(
                f"unknown {what} {name!r}; choose from all, {', '.join(known)} (or -NAME to leave one out)"
            )
        if item.startswith("-"):
            chosen = [k for k in chosen if k != name]
        elif name not in chosen:
            chosen.append(name)
    ordered = tuple(k for k in known if k in chosen)
    if not ordered:
        raise ValueError(f"every {what} was left out: nothing to run")
    return ordered


Met = tuple[tuple[str, int], ...]  # (type name, edge value index or workload_values.RANDOM)


@dataclass(frozen=True, slots=True)
class Step:
    """One transaction of the workload (or an idle gap, with no statements). `met[i]` holds the
    catalog values statement i writes (not NULL)."""

    kind: str
    table: str
    statements: tuple[str, ...]
    idle_s: float = 0.0
    met: tuple[Met, ...] = ()


def _met(values: Iterable[object]) -> Met:
    return tuple(sorted({(v.type, v.edge) for v in values if isinstance(v, Drawn)}))


def _where(key: dict[str, object]) -> str:
    return " AND ".join(f"`{c}` = {lit(v)}" for c, v in key.items())


def _insert(table: str, rows: list[dict[str, object]], verb: str = "INSERT") -> tuple[str, Met]:
    cols = list(rows[0])
    values = ", ".join("(" + ", ".join(lit(r[c]) for c in cols) + ")" for r in rows)
    sql = f"{verb} INTO `{table}` ({', '.join(f'`{c}`' for c in cols)}) VALUES {values}"
    return sql, _met(v for r in rows for v in r.values())


def _set(row: dict[str, object], table: str, rng: random.Random) -> tuple[str, Met]:
    cols = [c for c in row if c not in KEYS[table]]
    chosen = rng.sample(cols, rng.randint(1, min(3 if len(cols) < 15 else 8, len(cols))))
    return ", ".join(f"`{c}` = {lit(row[c])}" for c in chosen), _met(row[c] for c in chosen)


class _Rows:
    """Keys, key ranges and rows of every table, from one Random."""

    def __init__(
        self, rng: random.Random, value_kinds: tuple[str, ...], types: tuple[CatalogType, ...]
    ) -> None:
        self.rng = rng
        self.v = Values(rng, value_kinds)
        self.catalog = CatalogValues(self.v, value_kinds)
        self.types = types
        self.tags = STAMP_TAGS + (STAMP_TAGS_NON_UTF8 if self.v.non_utf8 else ())

    def key(self, table: str) -> dict[str, object]:
        rng = self.rng
        if table == "items":
            return {"id": rng.randint(1, ITEM_IDS)}
        if table == "pairs":
            return {"region": rng.choice(REGIONS), "seq": rng.randint(1, SEQS)}
        if table == "events":
            return {"id": rng.randint(1, EVENT_IDS)}
        if table == "typed":
            return {"id": rng.randint(1, TYPED_IDS)}
        return {"at": rng.choice(STAMP_ATS), "tag": rng.choice(self.tags)}

    def range(self, table: str) -> str:
        r = self.rng
        if table == "pairs":
            lo = r.randint(1, SEQS)
            return f"`region` = {lit(r.choice(REGIONS))} AND `seq` BETWEEN {lo} AND {lo + r.randint(1, 6)}"
        if table == "stamps":
            ats = sorted(STAMP_ATS)
            i = r.randrange(len(ats))
            j = min(len(ats) - 1, i + r.randint(0, 2))
            where = f"`at` BETWEEN {lit(ats[i])} AND {lit(ats[j])}"
            return where + (f" AND `tag` = {lit(r.choice(self.tags))}" if r.random() < 0.5 else "")
        top = {"items": ITEM_IDS, "events": EVENT_IDS, "typed": TYPED_IDS}[table]
        lo = r.randint(1, top)
        return f"`id` BETWEEN {lo} AND {lo + r.randint(1, 8)}"

    def row(self, table: str, key: dict[str, object]) -> dict[str, object]:
        v = self.v
        if table == "items":
            return {
                **key, "name": v.maybe(lambda: v.text(64)), "note": v.maybe(lambda: v.text(400)),
                "qty": v.maybe(lambda: v.integer(32)), "big": v.maybe(lambda: v.integer(64)),
                "price": v.maybe(lambda: v.decimal(12, 3)), "ratio": v.maybe(v.double),
                "created": v.maybe(lambda: v.datetime(6)), "day": v.maybe(v.date), "tod": v.maybe(v.time),
                "doc": v.maybe(v.json), "raw": v.maybe(lambda: v.binary(40)),
            }  # fmt: skip
        if table == "pairs":
            return {
                **key, "label": v.maybe(lambda: v.text(32)), "amount": v.maybe(lambda: v.decimal(10, 2)),
                "payload": v.maybe(lambda: v.binary(64)), "updated": v.maybe(lambda: v.datetime(0)),
                "score": v.maybe(v.double), "doc": v.maybe(v.json),
            }  # fmt: skip
        if table == "events":
            return {
                **key, "kind": v.maybe(lambda: v.rng.choice(["click", "view", "buy", "refund"])),
                "body": v.maybe(lambda: v.text(2000)), "at": v.maybe(lambda: v.datetime(3)),
                "n": v.maybe(lambda: v.integer(32)), "blob_tail": v.maybe(lambda: v.binary(16)),
            }  # fmt: skip
        row = dict(key)
        tag = key.get("tag")
        if isinstance(tag, bytes) and tag.endswith(b"\x00") and self.rng.random() < 0.5:
            row["tag"] = tag.rstrip(b"\x00")  # BINARY(4) pads it again: the same key
        row.update((t.column, self.catalog.draw(t)) for t in self.types)
        return row


def _key_id(key: dict[str, object]) -> tuple[tuple[str, str], ...]:
    return tuple((c, repr(v)) for c, v in sorted(key.items()))


class SyncWorkload:
    """The statements of one seed: `initial()` (session settings, schema and first rows, before
    the tasks start), then `steps()` without end (the caller stops by time or count)."""

    def __init__(
        self,
        seed: int,
        kinds: tuple[str, ...] = STATEMENT_KINDS,
        values: tuple[str, ...] = VALUE_KINDS,
        types: tuple[str, ...] = TYPE_NAMES,
    ) -> None:
        for k in kinds:
            if k not in STATEMENT_KINDS:
                raise ValueError(f"unknown statement kind {k!r}; choose from {', '.join(STATEMENT_KINDS)}")
        for name in types:
            if name not in TYPE_NAMES:
                raise ValueError(f"unknown column type {name!r}; choose from {', '.join(TYPE_NAMES)}")
        if not types:
            raise ValueError("every column type was left out: the catalog tables need one at least")
        self.seed = seed
        self.kinds = kinds
        self.value_kinds = values
        self.types = types
        self.catalog_types = tuple(t for t in CATALOG if t.column.removeprefix("c_") in types)
        self.rng = random.Random(seed)
        self._rows = _Rows(self.rng, values, self.catalog_types)

    def edge_values(self) -> set[tuple[str, int]]:
        """Every (type, edge value index) the workload can draw, with its value kinds."""
        return {
            (t.column.removeprefix("c_"), i)
            for t in self.catalog_types
            for i in self._rows.catalog.edges[t.column]
        }

    def schema(self) -> list[str]:
        cols = ", ".join(f"`{t.column}` {t.ddl}" for t in self.catalog_types)
        return [
            *SCHEMA,
            f"CREATE TABLE typed (id INT NOT NULL PRIMARY KEY, {cols})",
            f"CREATE TABLE stamps (`at` DATETIME(6) NOT NULL, tag BINARY(4) NOT NULL, {cols}, "
            "PRIMARY KEY (`at`, tag))",
        ]

    def _initial(self) -> tuple[list[str], list[Met]]:
        rows = _Rows(random.Random(f"{self.seed}/initial"), self.value_kinds, self.catalog_types)
        out, met = [*SESSION, *self.schema()], []
        for table, n in INITIAL_ROWS.items():
            keys: dict[tuple[tuple[str, str], ...], dict[str, object]] = {}
            while len(keys) < n:
                key = rows.key(table)
                keys[_key_id(key)] = key
            sql, m = _insert(table, [rows.row(table, key) for _, key in sorted(keys.items())])
            out.append(sql)
            met.append(m)
        return out, met

    def initial(self) -> list[str]:
        """`SESSION`, the tables, their first rows: to run in order on one connection."""
        return self._initial()[0]

    def initial_met(self) -> set[tuple[str, int]]:
        """The catalog values the first rows hold (what the snapshot meets)."""
        return {m for ms in self._initial()[1] for m in ms}

    def steps(self) -> Iterator[Step]:
        kinds = list(self.kinds)
        weights = [WEIGHTS[k] for k in kinds]
        while True:
            kind = self.rng.choices(kinds, weights)[0]
            yield self._step(kind)

    def first(self, n: int) -> list[Step]:
        it = self.steps()
        return [next(it) for _ in range(n)]

    def _step(self, kind: str) -> Step:
        r, rows = self.rng, self._rows
        if kind == "idle":
            return Step(kind, "", (), round(r.uniform(*IDLE_S), 2))
        table = r.choice(TABLES)
        key = rows.key(table)
        where = _where(key)

        def step(*statements: tuple[str, Met]) -> Step:
            return Step(kind, table, tuple(s for s, _ in statements), met=tuple(m for _, m in statements))

        def update(where: str) -> tuple[str, Met]:
            sets, met = _set(rows.row(table, key), table, r)
            return f"UPDATE `{table}` SET {sets} WHERE {where}", met

        if kind == "insert":
            return step(_insert(table, [rows.row(table, key)]))
        if kind == "update":
            return step(update(where))
        if kind == "update-key":
            new = rows.key(table)
            sets = ", ".join(f"`{c}` = {lit(x)}" for c, x in new.items())
            return step((f"UPDATE `{table}` SET {sets} WHERE {where}", ()))
        if kind == "delete":
            return step((f"DELETE FROM `{table}` WHERE {where}", ()))
        if kind == "multi-insert":
            keys = {_key_id(k): k for k in (rows.key(table) for _ in range(r.randint(2, 6)))}
            return step(_insert(table, [rows.row(table, k) for k in keys.values()], "INSERT IGNORE"))
        if kind in ("multi-update", "multi-delete"):
            rng_where = rows.range(table)
            if kind == "multi-delete":
                return step((f"DELETE FROM `{table}` WHERE {rng_where}", ()))
            return step(update(rng_where))
        if kind == "upsert-dup":
            other = rows.key(table)
            batch = [rows.row(table, key), rows.row(table, other), rows.row(table, key)]
            if r.random() < 0.5:
                batch.append(rows.row(table, key))
            cols = [c for c in batch[0] if c not in KEYS[table]]
            chosen = r.sample(cols, r.randint(1, len(cols)))
            sql, met = _insert(table, batch)
            update_sql = ", ".join(f"`{c}` = VALUES(`{c}`)" for c in chosen)
            return step((sql + f" ON DUPLICATE KEY UPDATE {update_sql}", met))
        if kind == "replace":
            batch = [rows.row(table, key)]
            if r.random() < 0.4:
                other = rows.key(table)
                if _key_id(other) != _key_id(key):
                    batch.append(rows.row(table, other))
            return step(_insert(table, batch, "REPLACE"))
        if kind == "tx-same-row":
            stmts = [_insert(table, [rows.row(table, key)], "INSERT IGNORE")]
            for _ in range(r.randint(3, 8)):
                if r.random() < 0.75:
                    stmts.append(update(where))
                else:
                    stmts.append((f"DELETE FROM `{table}` WHERE {where}", ()))
                    stmts.append(_insert(table, [rows.row(table, key)]))
            return step(*stmts)
        if kind == "truncate":
            return step((f"TRUNCATE TABLE `{table}`", ()))
        raise AssertionError(f"unhandled statement kind {kind}")


# --- running it ---------------------------------------------------------------------------------

DUPLICATE_KEY = 1062


@dataclass
class WorkloadStats:
    steps: dict[str, int]  # transactions (or idle gaps) run, by statement kind
    statements: int = 0
    rejected: int = 0  # statements the server refused (duplicate key), transaction went on
    idle_s: float = 0.0
    error: str | None = None
    #: catalog values (type, edge index or RANDOM) written by statements the server ran
    met: set[tuple[str, int]] = field(default_factory=set)


class WorkloadRunner:
    """Runs a workload's steps on one connection (after `SESSION`), in order, at about
    `rate_per_s` transactions per second, until `stop` is set or `max_steps` ran. Runs in a
    thread of its own (`start`)."""

    def __init__(
        self,
        connect: Callable[[], object],
        workload: SyncWorkload,
        *,
        rate_per_s: float = 12.0,
        max_steps: int = 1_000_000,
    ) -> None:
        import threading

        self.connect = connect
        self.workload = workload
        self.interval_s = 1.0 / rate_per_s
        self.max_steps = max_steps
        self.stop = threading.Event()
        self.stats = WorkloadStats(steps={k: 0 for k in workload.kinds})
        self._thread = threading.Thread(target=self._run, name="sync-workload", daemon=True)

    def start(self) -> WorkloadRunner:
        self._thread.start()
        return self

    def finish(self, timeout_s: float = 60.0) -> WorkloadStats:
        self.stop.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self.stats.error = self.stats.error or f"the workload did not stop within {timeout_s:.0f} s"
        return self.stats

    def _run(self) -> None:
        import pymysql

        conn: Any = self.connect()
        try:
            with conn.cursor() as cur:
                for sql in SESSION:
                    cur.execute(sql)
            steps = self.workload.steps()
            for _ in range(self.max_steps):
                if self.stop.is_set():
                    return
                step = next(steps)
                if step.kind == "idle":
                    self.stats.steps["idle"] += 1
                    self.stats.idle_s += step.idle_s
                    if self.stop.wait(step.idle_s):
                        return
                    continue
                met: set[tuple[str, int]] = set()
                with conn.cursor() as cur:
                    for sql, values in zip(step.statements, step.met, strict=True):
                        try:
                            cur.execute(sql)
                            met.update(values)
                        except pymysql.err.IntegrityError as exc:
                            if exc.args[0] != DUPLICATE_KEY:
                                raise
                            self.stats.rejected += 1
                        self.stats.statements += 1
                conn.commit()
                self.stats.met |= met
                self.stats.steps[step.kind] += 1
                self.stop.wait(self.interval_s)
        except Exception as exc:
            self.stats.error = f"the workload failed: {exc!r}"
        finally:
            conn.close()
