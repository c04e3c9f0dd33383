"""Producing a capture's records into the log, the same for every database source: one producer
(a fatal error stops the capture), each record counted in its group (a source transaction, a
snapshot, a DDL statement's events: `transactions.Group`) and acknowledged by its delivery
report, which folds the offset into the next cut and moves the resume position."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import orjson

from sluice import test_switches
from sluice.sync.envelope import encode_value, record_key
from sluice.sync.sources.mysql_base import producer_config
from sluice.sync.sources.transactions import Group, Transactions


class LogProducing:
    """Mixed into a capture, which sets these attributes in its constructor."""

    bootstrap: str
    switches: test_switches.Switches
    topic_for: Callable[[str], str]
    stats: Any  # with `errors`, a list of what stopped the capture
    _producer_config: dict[str, Any]
    _lock: threading.Lock
    _txs: Transactions

    def _make_producer(self) -> Any:
        from confluent_kafka import Producer

        def on_error(err: Any) -> None:
            if err.fatal():
                self.stats.errors.append(f"fatal producer error: {err}")

        return Producer(producer_config(self.bootstrap, **{"error_cb": on_error, **self._producer_config}))

    def _emit(
        self, producer: Any, table: str, env: dict[str, Any], tx: Group, partition: int | None = None,
        topic: str | None = None,
    ) -> None:  # fmt: skip
        """Produce one envelope of `tx` (to `table`'s topic, or `topic`; a partition of it)."""
        test_switches.pause_point(self.switches, "capture-produce")
        key = record_key(table, env["key"])
        value = orjson.dumps(env, default=encode_value)
        acked = self._delivery(tx)
        where = {} if partition is None else {"partition": partition}
        while True:
            try:
                producer.produce(topic or self.topic_for(table), value, key, on_delivery=acked,
                                 timestamp=env["source"]["ts_ms"], **where)  # fmt: skip
                return
            except BufferError:
                producer.poll(0.05)

    def _delivery(self, tx: Group) -> Callable[[Any, Any], None]:
        """Counts a record about to be produced in `tx`; the delivery report it returns records
        the offset the record got (for the cut) and advances the resume position."""
        with self._lock:
            self._txs.produced(tx)

        def acked(err: Any, msg: Any) -> None:
            if err is not None:
                self.stats.errors.append(f"delivery failed: {err}")
                return
            with self._lock:
                self._txs.acked(tx, msg.topic(), msg.partition(), msg.offset())

        return acked

    def _begin_tx(self, start: str, gtid: str = "") -> Group:
        """A group of records from `start`; its id (transaction metadata) is its GTID, if known,
        else `start`."""
        with self._lock:
            return self._txs.begin(start, gtid)

    def _end_tx(self, tx: Group, end: str) -> None:
        with self._lock:
            self._txs.finish(tx, end)

    def resume_position(self) -> str:
        """Where a restart would capture again from: the start of the oldest group not yet
        wholly acknowledged."""
        with self._lock:
            return self._txs.resume
