"""A seeded random workload for a MariaDB source: the statements a sync task must carry over.

Three tables (a single integer key, a composite key, a BIGINT key) with text, binary, decimal,
double, date/time, JSON and integer columns and NULLs. Each step of the workload is one
transaction of one statement kind (or an idle gap), drawn from `random.Random(seed)`: the same
seed gives the same statements, with their literal values, whatever the timing. Statements
are plain SQL text, so a failing seed's workload can be printed and replayed by hand.

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

Value kinds that can be turned off (`VALUE_KINDS`): `nul-text` (U+0000 inside text values) and
`non-utf8-binary` (binary columns with bytes that are not UTF-8; with it off they hold printable
ASCII bytes).

Keys are drawn from small ranges, so updates and deletes mostly hit rows that exist and
inserts sometimes collide: a statement the server refuses (duplicate key) is counted as
rejected and the transaction goes on. The source's state depends only on the statements, since
one connection runs them in order.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pymysql.converters import escape_string

STATEMENT_KINDS = (
    "insert", "update", "update-key", "delete", "multi-insert", "multi-update", "multi-delete",
    "upsert-dup", "replace", "tx-same-row", "truncate", "idle",
)  # fmt: skip
VALUE_KINDS = ("nul-text", "non-utf8-binary")

#: How often each statement kind is drawn, relative to the others.
WEIGHTS = {
    "insert": 3.0, "update": 3.0, "update-key": 0.8, "delete": 1.5, "multi-insert": 1.0,
    "multi-update": 1.0, "multi-delete": 0.6, "upsert-dup": 1.0, "replace": 1.0, "tx-same-row": 1.0,
    "truncate": 0.08, "idle": 0.06,
}  # fmt: skip
IDLE_S = (3.0, 6.0)  # an idle gap's length, seconds

TABLES = ("items", "pairs", "events")
MARKER_TABLE = "chaos_marker"  # not captured: a last transaction that moves the binlog position

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
KEYS = {"items": ("id",), "pairs": ("region", "seq"), "events": ("id",)}

ITEM_IDS = 120
REGIONS = ("eu", "us", "ap", "sa")
SEQS = 30
EVENT_IDS = 150
INITIAL_ROWS = {"items": 40, "pairs": 40, "events": 40}


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


@dataclass(frozen=True, slots=True)
class Step:
    """One transaction of the workload (or an idle gap, with no statements)."""

    kind: str
    table: str
    statements: tuple[str, ...]
    idle_s: float = 0.0


# --- literals -----------------------------------------------------------------------------------


def lit(value: object) -> str:
    """A SQL literal for MariaDB (backslash escapes on, the default)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return f"X'{value.hex()}'"
    if isinstance(value, dt.timedelta):
        total = int(value.total_seconds())
        sign = "-" if total < 0 else ""
        total = abs(total)
        return f"'{sign}{total // 3600}:{total // 60 % 60:02d}:{total % 60:02d}'"
    if isinstance(value, (dt.datetime, dt.date)):
        return f"'{value.isoformat(sep=' ') if isinstance(value, dt.datetime) else value.isoformat()}'"
    if isinstance(value, str):
        return "'" + escape_string(value) + "'"
    raise TypeError(f"no SQL literal for {type(value).__name__}")


# --- values -------------------------------------------------------------------------------------

_WORDS = ("alpha", "beta", "gamma", "O'Brien", "back\\slash", 'quote"d', "tab\there", "new\nline",
          "café", "naïve", "漢字", "Ελληνικά", "🙂", "emoji🚀x", "  padded  ", "%_like", "")  # fmt: skip


class Values:
    """Random column values from one Random, honouring which value kinds are on."""

    def __init__(self, rng: random.Random, value_kinds: tuple[str, ...]) -> None:
        self.rng = rng
        self.nul = "nul-text" in value_kinds
        self.non_utf8 = "non-utf8-binary" in value_kinds

    def maybe(self, make: Callable[[], object], null_p: float = 0.12) -> object:
        return None if self.rng.random() < null_p else make()

    def text(self, max_chars: int) -> str:
        r = self.rng
        parts = [r.choice(_WORDS) for _ in range(r.randint(1, 4))]
        if self.nul and r.random() < 0.15:
            parts.insert(r.randrange(len(parts) + 1), "\x00")
        if r.random() < 0.05:
            parts.append("x" * r.randint(100, 300))
        return " ".join(parts)[:max_chars]

    def binary(self, max_len: int) -> bytes:
        r = self.rng
        n = r.randint(0, max_len)
        if self.non_utf8 and r.random() < 0.5:
            return r.randbytes(n)
        return bytes(r.choice(b"abcdefghijklmnopqrstuvwxyz0123456789+/=") for _ in range(n))

    def decimal(self, digits: int, scale: int) -> decimal.Decimal:
        bound = 10 ** (digits) - 1
        return decimal.Decimal(self.rng.randint(-bound, bound)).scaleb(-scale)

    def double(self) -> float:
        r = self.rng
        pick = r.random()
        if pick < 0.1:
            return r.choice([0.0, -0.0, 1e-9, 123456789.123456789, -2.5e10, 1.7976931348623157e300])
        return r.uniform(-1e6, 1e6)

    def datetime(self, fsp: int) -> dt.datetime:
        r = self.rng
        base = dt.datetime(1990, 1, 1) + dt.timedelta(seconds=r.randint(0, 45 * 365 * 86400))
        micro = r.randint(0, 999_999) // 10 ** (6 - fsp) * 10 ** (6 - fsp) if fsp else 0
        return base.replace(microsecond=micro)

    def date(self) -> dt.date:
        if self.rng.random() < 0.05:
            return self.rng.choice([dt.date(1000, 1, 1), dt.date(9999, 12, 31)])
        return dt.date(1970, 1, 1) + dt.timedelta(days=self.rng.randint(0, 50_000))

    def time(self) -> dt.timedelta:
        return dt.timedelta(seconds=self.rng.randint(0, 99 * 3600))

    def integer(self, bits: int) -> int:
        r = self.rng
        if r.random() < 0.1:
            return r.choice([0, -1, 2 ** (bits - 1) - 1, -(2 ** (bits - 1))])
        return r.randint(-(2 ** (bits - 2)), 2 ** (bits - 2))

    def json(self) -> str:
        r = self.rng
        doc: dict[str, object] = {
            "n": r.randint(-1000, 1000),
            "f": round(r.uniform(-100, 100), 3),
            "s": r.choice(_WORDS),
            "ok": r.random() < 0.5,
            "none": None,
        }
        if r.random() < 0.5:
            doc["list"] = [r.randint(0, 9) for _ in range(r.randint(0, 4))]
        if r.random() < 0.3:
            doc["nested"] = {"deep": {"k": r.choice(_WORDS)}}
        return json.dumps(doc, ensure_ascii=False)


def _row(table: str, key: dict[str, object], v: Values) -> dict[str, object]:
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
    return {
        **key, "kind": v.maybe(lambda: v.rng.choice(["click", "view", "buy", "refund"])),
        "body": v.maybe(lambda: v.text(2000)), "at": v.maybe(lambda: v.datetime(3)),
        "n": v.maybe(lambda: v.integer(32)), "blob_tail": v.maybe(lambda: v.binary(16)),
    }  # fmt: skip


def _random_key(table: str, rng: random.Random) -> dict[str, object]:
    if table == "items":
        return {"id": rng.randint(1, ITEM_IDS)}
    if table == "pairs":
        return {"region": rng.choice(REGIONS), "seq": rng.randint(1, SEQS)}
    return {"id": rng.randint(1, EVENT_IDS)}


def _where(key: dict[str, object]) -> str:
    return " AND ".join(f"`{c}` = {lit(v)}" for c, v in key.items())


def _insert(table: str, rows: list[dict[str, object]], verb: str = "INSERT") -> str:
    cols = list(rows[0])
    values = ", ".join("(" + ", ".join(lit(r[c]) for c in cols) + ")" for r in rows)
    return f"{verb} INTO `{table}` ({', '.join(f'`{c}`' for c in cols)}) VALUES {values}"


def _set(row: dict[str, object], key: dict[str, object], rng: random.Random) -> str:
    cols = [c for c in row if c not in key]
    chosen = rng.sample(cols, rng.randint(1, min(3, len(cols))))
    return ", ".join(f"`{c}` = {lit(row[c])}" for c in chosen)


class SyncWorkload:
    """The statements of one seed: `initial()` (schema and first rows, before the tasks start),
    then `steps()` without end (the caller stops by time or count)."""

    def __init__(
        self, seed: int, kinds: tuple[str, ...] = STATEMENT_KINDS, values: tuple[str, ...] = VALUE_KINDS
    ) -> None:
        for k in kinds:
            if k not in STATEMENT_KINDS:
                raise ValueError(f"unknown statement kind {k!r}; choose from {', '.join(STATEMENT_KINDS)}")
        self.seed = seed
        self.kinds = kinds
        self.value_kinds = values
        self.rng = random.Random(seed)
        self.values = Values(self.rng, values)

    def initial(self) -> list[str]:
        rng = random.Random(f"{self.seed}/initial")
        v = Values(rng, self.value_kinds)
        out = list(SCHEMA)
        for table, n in INITIAL_ROWS.items():
            keys: dict[str, dict[str, object]] = {}
            while len(keys) < n:
                key = _random_key(table, rng)
                keys[json.dumps(key, sort_keys=True)] = key
            rows = [_row(table, key, v) for _, key in sorted(keys.items())]
            out.append(_insert(table, rows))
        return out

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
        r, v = self.rng, self.values
        if kind == "idle":
            return Step(kind, "", (), round(r.uniform(*IDLE_S), 2))
        table = r.choice(TABLES)
        key = _random_key(table, r)
        where = _where(key)
        if kind == "insert":
            return Step(kind, table, (_insert(table, [_row(table, key, v)]),))
        if kind == "update":
            return Step(
                kind, table, (f"UPDATE `{table}` SET {_set(_row(table, key, v), key, r)} WHERE {where}",)
            )
        if kind == "update-key":
            new = _random_key(table, r)
            sets = ", ".join(f"`{c}` = {lit(x)}" for c, x in new.items())
            return Step(kind, table, (f"UPDATE `{table}` SET {sets} WHERE {where}",))
        if kind == "delete":
            return Step(kind, table, (f"DELETE FROM `{table}` WHERE {where}",))
        if kind == "multi-insert":
            keys = {
                json.dumps(k, sort_keys=True): k
                for k in (_random_key(table, r) for _ in range(r.randint(2, 6)))
            }
            rows = [_row(table, k, v) for k in keys.values()]
            return Step(kind, table, (_insert(table, rows, "INSERT IGNORE"),))
        if kind in ("multi-update", "multi-delete"):
            rng_where = _range(table, r)
            if kind == "multi-delete":
                return Step(kind, table, (f"DELETE FROM `{table}` WHERE {rng_where}",))
            sets = _set(_row(table, key, v), key, r)
            return Step(kind, table, (f"UPDATE `{table}` SET {sets} WHERE {rng_where}",))
        if kind == "upsert-dup":
            other = _random_key(table, r)
            rows = [_row(table, key, v), _row(table, other, v), _row(table, key, v)]
            if r.random() < 0.5:
                rows.append(_row(table, key, v))
            cols = [c for c in rows[0] if c not in key]
            update = ", ".join(f"`{c}` = VALUES(`{c}`)" for c in r.sample(cols, r.randint(1, len(cols))))
            return Step(kind, table, (_insert(table, rows) + f" ON DUPLICATE KEY UPDATE {update}",))
        if kind == "replace":
            rows = [_row(table, key, v)]
            if r.random() < 0.4:
                other = _random_key(table, r)
                if other != key:
                    rows.append(_row(table, other, v))
            return Step(kind, table, (_insert(table, rows, "REPLACE"),))
        if kind == "tx-same-row":
            stmts = [_insert(table, [_row(table, key, v)], "INSERT IGNORE")]
            for _ in range(r.randint(3, 8)):
                pick = r.random()
                if pick < 0.75:
                    stmts.append(f"UPDATE `{table}` SET {_set(_row(table, key, v), key, r)} WHERE {where}")
                else:
                    stmts.append(f"DELETE FROM `{table}` WHERE {where}")
                    stmts.append(_insert(table, [_row(table, key, v)]))
            return Step(kind, table, tuple(stmts))
        if kind == "truncate":
            return Step(kind, table, (f"TRUNCATE TABLE `{table}`",))
        raise AssertionError(f"unhandled statement kind {kind}")


def _range(table: str, r: random.Random) -> str:
    if table == "pairs":
        lo = r.randint(1, SEQS)
        return f"`region` = {lit(r.choice(REGIONS))} AND `seq` BETWEEN {lo} AND {lo + r.randint(1, 6)}"
    top = ITEM_IDS if table == "items" else EVENT_IDS
    lo = r.randint(1, top)
    return f"`id` BETWEEN {lo} AND {lo + r.randint(1, 8)}"


# --- running it ---------------------------------------------------------------------------------

DUPLICATE_KEY = 1062


@dataclass
class WorkloadStats:
    steps: dict[str, int]  # transactions (or idle gaps) run, by statement kind
    statements: int = 0
    rejected: int = 0  # statements the server refused (duplicate key), transaction went on
    idle_s: float = 0.0
    error: str | None = None


class WorkloadRunner:
    """Runs a workload's steps on one connection, in order, at about `rate_per_s` transactions
    per second, until `stop` is set or `max_steps` ran. Runs in a thread of its own (`start`)."""

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
                with conn.cursor() as cur:
                    for sql in step.statements:
                        try:
                            cur.execute(sql)
                        except pymysql.err.IntegrityError as exc:
                            if exc.args[0] != DUPLICATE_KEY:
                                raise
                            self.stats.rejected += 1
                        self.stats.statements += 1
                conn.commit()
                self.stats.steps[step.kind] += 1
                self.stop.wait(self.interval_s)
        except Exception as exc:
            self.stats.error = f"the workload failed: {exc!r}"
        finally:
            conn.close()
