"""`generator`: a synthetic OLTP source that needs no database server.

Three tables with a few column types (integers, floats, text, booleans, a nullable column, a
composite key) receive inserts, updates and deletes in small transactions, at a configurable
rate and key skew, for a bounded duration or number of changes. Every change becomes an envelope
on Sluice through an idempotent acks=all producer; the generator keeps the resulting table state
and writes it as the ground truth a target must end up equal to.

The ground truth is written only after the producer has flushed with no delivery error, so
it describes exactly what the log holds.
"""

from __future__ import annotations

import random
import string
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from sluice.sync.envelope import ChangeEvent, key_text
from sluice.sync.truth import Truth

TIERS = ("free", "pro", "team", "enterprise")
STATUSES = ("new", "paid", "packed", "shipped", "delivered", "returned")
WAREHOUSES = (1, 2, 3, 4)


@dataclass(frozen=True)
class TableSpec:
    name: str
    key_columns: tuple[str, ...]


TABLES = (
    TableSpec("customers", ("id",)),
    TableSpec("orders", ("id",)),
    TableSpec("inventory", ("sku", "warehouse")),
)


@dataclass
class GeneratorConfig:
    topic: str = "sluice.gen"  # "{table}" in the name gives one topic per table
    rate: float = 5000.0  # changes per second; 0 = as fast as the producer takes them
    duration_s: float | None = 30.0
    max_events: int | None = None
    skew: float = 2.0  # 1 = uniform over live rows; higher = a few hot rows get most changes
    seed: int = 1
    start_pos: int = 1
    name: str = "gen"
    max_tx_size: int = 4
    mix: tuple[float, float, float] = (0.3, 0.55, 0.15)  # insert, update, delete


@dataclass
class GeneratorStats:
    events: int = 0
    inserts: int = 0
    updates: int = 0
    deletes: int = 0
    transactions: int = 0
    last_pos: int = 0
    started: float = 0.0
    elapsed_s: float = 0.0
    errors: list[str] = field(default_factory=list)


class _Table:
    def __init__(self, spec: TableSpec) -> None:
        self.spec = spec
        self.rows: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.keys: list[tuple[Any, ...]] = []  # live keys, for picking with skew
        self.index: dict[tuple[Any, ...], int] = {}

    def add(self, key: tuple[Any, ...], row: dict[str, Any]) -> None:
        self.rows[key] = row
        self.index[key] = len(self.keys)
        self.keys.append(key)

    def remove(self, key: tuple[Any, ...]) -> None:
        del self.rows[key]
        i = self.index.pop(key)
        last = self.keys.pop()
        if i < len(self.keys):
            self.keys[i] = last
            self.index[last] = i


class ChangeGenerator:
    """Makes changes; `events()` yields envelopes and keeps the state they lead to."""

    def __init__(self, config: GeneratorConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.tables = {spec.name: _Table(spec) for spec in TABLES}
        self.next_id = {"customers": 1, "orders": 1}
        self.pos = config.start_pos - 1
        self.txid = 0
        self.stats = GeneratorStats()

    # --- rows ------------------------------------------------------------------------------------
    def _word(self, n: int) -> str:
        return "".join(self.rng.choices(string.ascii_lowercase, k=n))

    def _new_row(self, table: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
        rng = self.rng
        if table == "customers":
            cid = self.next_id["customers"]
            self.next_id["customers"] += 1
            name = f"{self._word(5).title()} {self._word(7).title()}"
            row = {
                "id": cid,
                "name": name,
                "email": f"{self._word(6)}{cid}@example.com",
                "tier": rng.choice(TIERS),
                "balance": round(rng.uniform(0, 5000), 2),
                "active": True,
                "updated_at": self._now_text(),
            }
            return (cid,), row
        if table == "orders":
            oid = self.next_id["orders"]
            self.next_id["orders"] += 1
            customers = self.tables["customers"].keys
            row = {
                "id": oid,
                "customer_id": customers[rng.randrange(len(customers))][0] if customers else 0,
                "amount_cents": rng.randrange(100, 500_000),
                "status": "new",
                "note": None,
                "updated_at": self._now_text(),
            }
            return (oid,), row
        sku = f"SKU-{rng.randrange(100_000):05d}"
        wh = rng.choice(WAREHOUSES)
        while (sku, wh) in self.tables["inventory"].rows:
            sku = f"SKU-{rng.randrange(100_000):05d}"
        row = {
            "sku": sku,
            "warehouse": wh,
            "qty": rng.randrange(0, 1000),
            "price": round(rng.uniform(1, 999), 2),
        }
        return (sku, wh), row

    def _changed_row(self, table: str, row: dict[str, Any]) -> dict[str, Any]:
        rng = self.rng
        new = dict(row)
        if table == "customers":
            new["balance"] = round(new["balance"] + rng.uniform(-100, 100), 2)
            if rng.random() < 0.2:
                new["tier"] = rng.choice(TIERS)
            if rng.random() < 0.05:
                new["active"] = not new["active"]
            new["updated_at"] = self._now_text()
        elif table == "orders":
            i = STATUSES.index(new["status"])
            new["status"] = STATUSES[min(i + 1, len(STATUSES) - 1)]
            new["note"] = None if rng.random() < 0.5 else f"note {self._word(12)}"
            new["amount_cents"] = max(0, new["amount_cents"] + rng.randrange(-500, 500))
            new["updated_at"] = self._now_text()
        else:
            new["qty"] = max(0, new["qty"] + rng.randrange(-20, 25))
            if rng.random() < 0.1:
                new["price"] = round(rng.uniform(1, 999), 2)
        return new

    def _now_text(self) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{self.rng.randrange(1000):03d}Z"

    def _pick(self, t: _Table) -> tuple[Any, ...]:
        n = len(t.keys)
        return t.keys[min(n - 1, int(n * (self.rng.random() ** self.config.skew)))]

    # --- changes ---------------------------------------------------------------------------------
    def transaction(self, limit: int | None = None) -> list[ChangeEvent]:
        """One source transaction of 1..max_tx_size (at most `limit`) changes sharing a txid
        and commit time."""
        self.txid += 1
        self.stats.transactions += 1
        commit_ts = int(time.time() * 1000)
        out: list[ChangeEvent] = []
        ins, upd, _ = self.config.mix
        size = self.rng.randint(1, self.config.max_tx_size)
        for _ in range(size if limit is None else max(1, min(size, limit))):
            table_name = self.rng.choice(TABLES).name
            t = self.tables[table_name]
            r = self.rng.random()
            if not t.keys or r < ins or (table_name == "orders" and not self.tables["customers"].keys):
                key, row = self._new_row(table_name)
                t.add(key, row)
                op, before, after = "c", None, row
                self.stats.inserts += 1
            elif r < ins + upd:
                key = self._pick(t)
                before = t.rows[key]
                after = self._changed_row(table_name, before)
                t.rows[key] = after
                op = "u"
                self.stats.updates += 1
            else:
                key = self._pick(t)
                before = t.rows[key]
                t.remove(key)
                op, after = "d", None
                self.stats.deletes += 1
            self.pos += 1
            out.append(
                ChangeEvent(
                    op=op,
                    table=table_name,
                    key=dict(zip(t.spec.key_columns, key, strict=True)),
                    before=before,
                    after=after,
                    pos=self.pos,
                    commit_ts_ms=commit_ts,
                    source_name=self.config.name,
                    txid=self.txid,
                )
            )
        self.stats.events += len(out)
        self.stats.last_pos = self.pos
        return out

    def truth(self) -> Truth:
        return Truth(
            tables={
                name: {
                    key_text(dict(zip(t.spec.key_columns, k, strict=True))): row for k, row in t.rows.items()
                }
                for name, t in self.tables.items()
            },
            key_columns={name: list(t.spec.key_columns) for name, t in self.tables.items()},
            events=self.stats.events,
            last_pos=self.pos,
        )


def topic_for(template: str, table: str) -> str:
    return template.replace("{table}", table)


def run_generator(
    bootstrap: str,
    config: GeneratorConfig,
    *,
    truth_path: Path | None = None,
    stop: threading.Event | None = None,
    on_progress: Callable[[GeneratorStats], None] | None = None,
    producer_config: dict[str, Any] | None = None,
) -> tuple[GeneratorStats, Truth]:
    """Write changes to Sluice until the duration or event budget is spent (or `stop` is set).

    Raises RuntimeError if any change could not be delivered: the ground truth would then not
    describe the log, so none is written."""
    from confluent_kafka import KafkaException, Producer

    errors: list[str] = []

    def on_error(err: object) -> None:
        if getattr(err, "fatal", lambda: False)():
            errors.append(f"fatal producer error: {err}")

    def on_delivery(err: object, msg: object) -> None:
        if err is not None:
            errors.append(f"delivery failed: {err}")

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "compression.type": "lz4",
        "batch.num.messages": 10_000,
        "queue.buffering.max.messages": 500_000,
        "message.timeout.ms": 300_000,
        "delivery.report.only.error": True,
        "on_delivery": on_delivery,
        "error_cb": on_error,
        "log_level": 0,  # errors arrive through the callbacks above
    }
    conf.update(producer_config or {})
    producer = Producer(conf)
    gen = ChangeGenerator(config)
    stats = gen.stats
    stats.started = time.time()
    start = time.monotonic()
    deadline = start + config.duration_s if config.duration_s is not None else None
    last_report = start
    try:
        while not errors:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                break
            if config.max_events is not None and stats.events >= config.max_events:
                break
            if stop is not None and stop.is_set():
                break
            if config.rate > 0:
                due = int((now - start) * config.rate) - stats.events
                if due <= 0:
                    time.sleep(0.002)
                    producer.poll(0)
                    continue
            else:
                due = 2000
            if config.max_events is not None:
                due = min(due, config.max_events - stats.events)
            sent = 0
            while sent < due:
                for event in gen.transaction(due - sent if config.max_events is not None else None):
                    _produce(producer, topic_for(config.topic, event.table), event)
                    sent += 1
            producer.poll(0)
            if on_progress is not None and now - last_report >= 0.5:
                last_report = now
                stats.elapsed_s = now - start
                on_progress(stats)
        remaining = producer.flush(300)
        if remaining:
            errors.append(f"{remaining} changes still undelivered after 300 s")
    except KafkaException as exc:
        errors.append(str(exc))
    stats.elapsed_s = time.monotonic() - start
    stats.errors = errors
    if on_progress is not None:
        on_progress(stats)
    if errors:
        raise RuntimeError(f"generator stopped: {errors[0]} ({len(errors)} error(s) in all)")
    truth = gen.truth()
    if truth_path is not None:
        truth.save(truth_path)
    return stats, truth


def _produce(producer: Any, topic: str, event: ChangeEvent) -> None:
    value = event.to_json()
    key = event.record_key()
    while True:
        try:
            producer.produce(topic, value, key, timestamp=event.commit_ts_ms)
            return
        except BufferError:
            producer.poll(0.05)  # the local queue is full: wait for acknowledgements


def describe(stats: GeneratorStats) -> str:
    return orjson.dumps({k: v for k, v in stats.__dict__.items() if k not in ("errors", "started")}).decode()
