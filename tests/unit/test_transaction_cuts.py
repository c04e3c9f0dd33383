"""Consistent cuts: what the capture publishes after each source transaction, and where the
apply query's micro-batches end given the cuts (sync/sources/transactions.py,
pipeline/source.py transaction_end)."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest

from sluice.sync.sources.transactions import (
    Group,
    Transactions,
    begin_record,
    cut_record,
    end_record,
    fold,
    parse_cut,
    steps,
)

A0, A1, A2 = ("a", 0), ("a", 1), ("a", 2)


def test_fold_moves_only_the_partitions_a_group_wrote_to_and_never_back() -> None:
    g1 = Group("f.1:4", offsets={A0: 10, A1: 3})
    g2 = Group("f.1:9", offsets={A0: 12})
    g3 = Group("f.1:12", offsets={A1: 2})  # lower than the cut: never back
    assert fold({A0: 5, A1: 1, A2: 7}, [g1, g2, g3]) == {A0: 12, A1: 3, A2: 7}


def test_a_cut_never_passes_a_transaction_whose_records_are_not_all_acknowledged() -> None:
    txs = Transactions("f.1:4", cut={A0: 0, A1: 0, A2: 0})
    t1 = txs.begin("f.1:4")
    t2 = txs.begin("f.1:20")
    for _ in range(3):
        txs.produced(t1)
    txs.produced(t2)
    txs.finish(t1, "f.1:20")
    txs.finish(t2, "f.1:30")
    txs.acked(t2, "a", 2, 0)  # the later transaction is acknowledged first
    txs.acked(t1, "a", 0, 0)
    txs.acked(t1, "a", 1, 0)
    assert txs.take() is None and txs.resume == "f.1:4"  # t1 has a record in flight
    txs.acked(t1, "a", 0, 1)
    assert txs.take() == ({A0: 2, A1: 1, A2: 1}, "f.1:30", "")  # both, folded in order
    assert txs.resume == "f.1:30" and not txs.pending
    assert txs.take() is None  # unchanged since taken


def test_a_cut_after_the_first_transaction_leaves_the_second_out() -> None:
    txs = Transactions("f.1:4", cut={A0: 5, A1: 5})
    t1, t2 = txs.begin("f.1:4"), txs.begin("f.1:20")
    writes = ((t1, 0, 5), (t2, 0, 6), (t1, 1, 5), (t2, 1, 6))
    for tx, _, _ in writes:
        txs.produced(tx)
    txs.finish(t1, "f.1:20")
    for tx, p, off in writes:
        txs.acked(tx, "a", p, off)
    assert txs.take() == ({A0: 6, A1: 6}, "f.1:20", "")  # t2 is not finished: its records stay out
    assert txs.resume == "f.1:20"


def test_records_written_by_other_producers_are_covered_by_raising_the_cut() -> None:
    txs = Transactions("snapshot", cut={A0: 0, A1: 0})
    txs.raise_to({A0: 400, A1: 380}, "f.1:4")
    assert txs.take() == ({A0: 400, A1: 380}, "f.1:4", "")


def test_a_cut_carries_the_gtid_state_of_the_transactions_in_it() -> None:
    txs = Transactions("f.1:4")
    for start, gtid in (("f.1:4", "0-1-7"), ("f.1:9", "1-2-3"), ("f.1:12", "0-1-8"), ("f.1:15", "")):
        txs.finish(txs.begin(start, gtid), start + "0")
    assert txs.take() == ({}, "f.1:150", "0-1-8,1-2-3")
    mysql = Transactions("f.1:4")
    mysql.finish(mysql.begin("f.1:4", "3e11fa47-71ca-11e1-9e33-c80aa9429562:23"), "f.1:9")
    assert mysql.take() == ({}, "f.1:9", "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-23")


def test_a_snapshot_is_cut_in_steps_of_about_the_chunk_size() -> None:
    cuts = steps({A0: 10, A1: 0, A2: 5}, {A0: 110, A1: 100, A2: 5}, 50)
    assert len(cuts) == 4 and cuts[-1] == {A0: 110, A1: 100, A2: 5}
    pairs = list(itertools.pairwise([{A0: 10, A1: 0, A2: 5}, *cuts]))
    sizes = [sum(b.values()) - sum(a.values()) for a, b in pairs]
    assert all(45 <= n <= 55 for n in sizes), sizes
    assert all(a[tp] <= b[tp] for a, b in pairs for tp in a)
    assert steps({A0: 7}, {A0: 7}, 50) == []


def test_the_transactions_topic_records() -> None:
    cut = {A0: 7, ("b", 0): 3}
    value = cut_record(cut, "f.1:99", ts_ms=5)
    assert orjson.loads(value) == {"type": "cut", "offsets": {"a": {"0": 7}, "b": {"0": 3}},
                                   "position": "f.1:99", "ts_ms": 5}  # fmt: skip
    assert parse_cut(value) == cut
    g = Group("f.1:4", id="f.1:4")
    assert g.order("orders") == {"id": "f.1:4", "total_order": 1, "data_collection_order": 1}
    assert g.order("items") == {"id": "f.1:4", "total_order": 2, "data_collection_order": 1}
    assert g.order("orders") == {"id": "f.1:4", "total_order": 3, "data_collection_order": 2}
    assert parse_cut(begin_record(g, 1)) is None
    end = end_record(g, "shop", 2)
    assert parse_cut(end) is None
    assert orjson.loads(end) == {
        "type": "end", "id": "f.1:4", "event_count": 3, "ts_ms": 2,
        "data_collections": [{"data_collection": "shop.items", "event_count": 1},
                             {"data_collection": "shop.orders", "event_count": 2}],
    }  # fmt: skip
    assert parse_cut(b"not json") is None and parse_cut(b'{"type": "cut"}') is None


# --- the reader's choice of end offsets ----------------------------------------------------------


def _end(begin: dict, high: dict, cuts: list, max_rows: int | None = None) -> dict:
    pytest.importorskip("pyspark")
    from sluice.pipeline.source import transaction_end

    return transaction_end(begin, high, cuts, max_rows)


def test_without_a_limit_a_batch_ends_at_the_newest_cut_not_at_the_high_watermark() -> None:
    begin = {A0: 0, A1: 0}
    high = {A0: 50, A1: 40}
    cuts = [{A0: 10, A1: 5}, {A0: 30, A1: 20}]
    assert _end(begin, high, cuts) == {A0: 30, A1: 20}


def test_no_cut_yet_means_an_empty_batch() -> None:
    assert _end({A0: 4, A1: 0}, {A0: 50, A1: 40}, []) == {A0: 4, A1: 0}
    assert _end({A0: 4, A1: 9}, {A0: 50, A1: 40}, [{A0: 4, A1: 9}, {A0: 2, A1: 1}]) == {A0: 4, A1: 9}


def test_a_cut_beyond_the_high_watermark_is_not_used_nor_clamped() -> None:
    begin = {A0: 0, A1: 0}
    cuts = [{A0: 10, A1: 5}, {A0: 30, A1: 45}]
    assert _end(begin, {A0: 50, A1: 40}, cuts) == {A0: 10, A1: 5}


def test_never_below_the_start_and_untouched_partitions_stay() -> None:
    begin = {A0: 20, A1: 0, A2: 8}
    assert _end(begin, {A0: 50, A1: 40, A2: 9}, [{A0: 15, A1: 6}]) == {A0: 20, A1: 6, A2: 8}


def test_with_a_limit_the_newest_cut_within_it_and_at_least_one() -> None:
    begin = {A0: 0, A1: 0}
    high = {A0: 100, A1: 100}
    cuts = [{A0: 3, A1: 3}, {A0: 6, A1: 5}, {A0: 9, A1: 9}, {A0: 60, A1: 60}]
    assert _end(begin, high, cuts, max_rows=12) == {A0: 6, A1: 5}
    assert _end(begin, high, cuts, max_rows=18) == {A0: 9, A1: 9}
    # a transaction larger than the limit is read whole
    assert _end(begin, high, cuts[3:], max_rows=12) == {A0: 60, A1: 60}
    assert _end({A0: 9, A1: 9}, high, cuts, max_rows=12) == {A0: 60, A1: 60}


def test_a_needed_binlog_among_the_two_oldest_or_gone_is_at_risk() -> None:
    from sluice.sync.sources.mysql import purge_risk

    logs = ["b.000004", "b.000005", "b.000006"]
    assert purge_risk("b.000006", logs) is None
    assert purge_risk("b.000005", logs) == "oldest"
    assert purge_risk("b.000004", logs) == "oldest"
    assert purge_risk("b.000003", logs) == "purged"


def test_a_mysql_tasks_apply_reads_its_transactions_topic_and_a_generators_does_not(tmp_path: Any) -> None:
    from sluice.pipeline.execution import apply_config
    from sluice.sync.tasks import parse_spec

    def config(source: dict[str, Any]) -> Any:
        spec = parse_spec({"id": "t1", "source": source, "target": "sqlite:///x.db", "tables": ["a"]})
        return apply_config(spec, "127.0.0.1:1", 1, tmp_path)

    assert config({"kind": "mariadb", "database": "d"}).transaction_topic == "t1.transactions"
    assert config({"kind": "generator"}).transaction_topic is None
