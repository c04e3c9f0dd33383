"""The alarm rules over hand-made facts: thresholds, overrides, "for longer than", dedup, resolve,
validation. Pure: no ZooKeeper, no broker."""

from __future__ import annotations

from typing import Any

import pytest

from sluice.cluster.health import OFFLINE, OK, UNDER_REPLICATED, PartitionHealth
from sluice.manager.alarms.rules import (
    CRITICAL,
    RAISE,
    REFRESH,
    REOPEN,
    RESOLVE,
    UPDATE,
    WARNING,
    Condition,
    Facts,
    Key,
    Rules,
    RulesError,
    TaskFacts,
    evaluate,
    parse_rules,
    plan,
    rules_to_doc,
)

NOW = 1_700_000_000.0


def running(task_id: str = "orders", **kw: Any) -> TaskFacts:
    base: dict[str, Any] = {
        "running": True,
        "lag_records": 0,
        "lag_seconds": 0.0,
        "worker": "w1",
        "execution": "e1",
    }
    return TaskFacts(task_id, **{**base, **kw})


def keys(conditions: list[Condition]) -> set[Key]:
    return {c.key for c in conditions}


def run(facts: Facts, rules: Rules | None = None, since: dict[Key, float] | None = None) -> list[Condition]:
    return evaluate(facts, rules or Rules(), since or {})[0]


def stored(c: Condition, state: str = "open", **kw: Any) -> dict[str, Any]:
    """An alarm as the store keeps it, for `plan`."""
    return {"id": f"a-{c.rule}", "rule": c.rule, "subject": c.subject, "severity": c.severity, "state": state,
            "summary": c.summary, "detail": c.detail, "raised_at": NOW - 10, **kw}  # fmt: skip


# --- task lag ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("records", "seconds", "raised"),
    [(9_999, 59.9, False), (10_000, 0.0, True), (0, 60.0, True), (1, 61.0, True), (0, 0.0, False)],
)
def test_task_lag_raises_at_its_threshold_and_not_below(records: int, seconds: float, raised: bool) -> None:
    got = run(Facts(NOW, [running(lag_records=records, lag_seconds=seconds)]))
    assert (("task-lag", "task:orders") in keys(got)) is raised


def test_task_lag_summary_names_the_figures_and_the_thresholds() -> None:
    [c] = run(Facts(NOW, [running(lag_records=12_345, lag_seconds=75.0)]))
    assert c.summary == "task orders is 12,345 records (75 s) behind; threshold 10,000 records / 60 s"
    assert c.severity == WARNING
    [c] = run(Facts(NOW, [running(lag_records=100_000, lag_seconds=1.0)]))
    assert c.severity == CRITICAL  # ten times the threshold


def test_a_per_task_override_beats_the_cluster_default() -> None:
    rules = parse_rules({"task_lag_records": 100, "tasks": {"orders": {"task_lag_records": 5_000}}})
    facts = Facts(NOW, [running("orders", lag_records=1_000), running("refunds", lag_records=1_000)])
    assert keys(run(facts, rules)) == {("task-lag", "task:refunds")}
    off = parse_rules({"tasks": {"orders": {"enabled": {"task-lag": False}}}})
    assert run(Facts(NOW, [running("orders", lag_records=50_000)]), off) == []


def test_a_paused_task_raises_neither_lag_nor_not_running() -> None:
    paused = TaskFacts("orders", paused=True, running=False, lag_records=10**6)
    assert run(Facts(NOW, [paused]), since={("task-not-running", "task:orders"): NOW - 3600}) == []


# --- task not running: "for longer than" through since --------------------------------------------
def test_task_not_running_raises_only_after_its_threshold_through_since() -> None:
    key = ("task-not-running", "task:orders")
    down = Facts(NOW, [TaskFacts("orders", running=False)])
    conditions, since = evaluate(down, Rules(), {})
    assert conditions == [] and since[key] == NOW  # first seen now: pending
    later = Facts(NOW + 59.9, [TaskFacts("orders", running=False)])
    conditions, since = evaluate(later, Rules(), since)
    assert conditions == [] and since[key] == NOW
    at = Facts(NOW + 60, [TaskFacts("orders", running=False)])
    conditions, since = evaluate(at, Rules(), since)
    assert keys(conditions) == {key} and conditions[0].severity == CRITICAL
    assert "not running for 60 s" in conditions[0].summary
    back = Facts(NOW + 61, [running()])
    conditions, since = evaluate(back, Rules(), since)
    assert conditions == [] and key not in since


def test_an_execution_reporting_an_error_counts_as_not_running() -> None:
    failing = running(error="apply failed: target refused connections")
    [c] = run(Facts(NOW + 60, [failing]), since={("task-not-running", "task:orders"): NOW})
    assert c.rule == "task-not-running" and "apply failed: target refused connections" in c.summary


# --- events --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "event", "text"),
    [
        (
            "duplicate-execution",
            {"workers": ["w1", "w2"], "epochs": [3, 4]},
            "on worker w1 (epoch 3) and on w2",
        ),
        ("stale-commit-refused", {"worker": "w1", "epoch": 3, "target_epoch": 4}, "the target holds 4"),
        (
            "task-failed",
            {"worker": "w2", "error": "boom", "attempts": 2, "retry_in_s": 4.0},
            "failed on worker w2",
        ),
        (
            "source-history-changed",
            {
                "continuous": False,
                "detail": "the source's binlog history changed at mysql-bin.000007:900; ...",
            },
            "history changed at mysql-bin.000007:900",
        ),
    ],
)
def test_an_event_raises_its_alarm_until_a_quiet_period_passes(
    kind: str, event: dict[str, Any], text: str
) -> None:
    t = running(events=[{"kind": kind, "at": NOW - 10, **event}])
    [c] = run(Facts(NOW, [t]))
    assert c.key == (kind, "task:orders") and text in c.summary
    assert c.detail["last_event_at"] == NOW - 10
    assert run(Facts(NOW + 289.9, [t])) != []
    assert run(Facts(NOW + 290, [t])) == []  # 300 s after the event: resolved
    assert run(Facts(NOW, [t]), parse_rules({"enabled": {kind: False}})) == []


def test_an_acknowledged_event_alarm_reopens_on_a_newer_event() -> None:
    first = running(events=[{"kind": "duplicate-execution", "at": NOW - 10}])
    [c] = run(Facts(NOW, [first]))
    acked = stored(c, state="acknowledged")
    assert plan([acked], run(Facts(NOW + 5, [first])), Facts(NOW + 5)) == []
    again = running(events=[*first.events, {"kind": "duplicate-execution", "at": NOW + 4}])
    [change] = plan([acked], run(Facts(NOW + 5, [again])), Facts(NOW + 5))
    assert change.action == REOPEN and change.condition is not None
    assert change.condition.detail["events"] == 2


# --- workers -------------------------------------------------------------------------------------
def test_a_worker_that_left_raises_worker_lost_until_it_is_back() -> None:
    _, since = evaluate(Facts(NOW, workers=["w1", "w2"]), Rules(), {})
    conditions, since = evaluate(Facts(NOW + 5, workers=["w1"]), Rules(), since)
    [c] = conditions
    assert c.key == ("worker-lost", "worker:w2") and "worker w2 left" in c.summary
    conditions, since = evaluate(Facts(NOW + 10, workers=["w1", "w2"]), Rules(), since)
    assert conditions == []


def test_a_lost_worker_is_forgotten_after_the_quiet_period() -> None:
    _, since = evaluate(Facts(NOW, workers=["w1", "w2"]), Rules(), {})
    _, since = evaluate(Facts(NOW + 5, workers=["w1"]), Rules(), since)
    conditions, since = evaluate(Facts(NOW + 305, workers=["w1"]), Rules(), since)
    assert conditions == [] and not any("w2" in s for _, s in since)
    assert run(Facts(NOW + 5, workers=["w1"]), parse_rules({"enabled": {"worker-lost": False}}), since) == []


def test_workers_that_could_not_be_read_are_not_lost() -> None:
    _, since = evaluate(Facts(NOW, workers=["w1"]), Rules(), {})
    blind = Facts(NOW + 5, workers=[], unavailable={"workers": "brokers out of reach"})
    conditions, after = evaluate(blind, Rules(), since)
    assert conditions == [] and after == since


# --- partitions ----------------------------------------------------------------------------------
def partition(status: str, reason: str = "") -> PartitionHealth:
    return PartitionHealth("orders", 3, -1 if status == OFFLINE else 1, (2,), (), status, reason)


def test_an_offline_partition_raises_at_once_naming_the_reason() -> None:
    why = "its only replica, broker 2, is down"
    [c] = run(Facts(NOW, partitions=[partition(OFFLINE, why)]))
    assert c.key == ("partition-offline", "partition:orders-3") and why in c.summary
    assert c.severity == CRITICAL
    assert run(Facts(NOW, partitions=[partition(OK)])) == []


def test_an_under_replicated_partition_raises_after_its_threshold() -> None:
    key = ("partition-under-replicated", "partition:orders-3")
    facts = Facts(NOW, partitions=[partition(UNDER_REPLICATED, "replica(s) [2] out of sync")])
    assert run(facts, since={key: NOW - 59}) == []
    [c] = run(facts, since={key: NOW - 60})
    assert c.key == key and c.severity == WARNING
    [c] = run(facts, parse_rules({"partition_under_replicated_seconds": 0}))
    assert c.key == key


# --- dedup and resolve ---------------------------------------------------------------------------
def test_the_same_condition_twice_is_one_alarm() -> None:
    facts = Facts(NOW, [running(lag_records=20_000, lag_seconds=1.0)])
    conditions = run(facts)
    [change] = plan([], conditions + conditions, facts)
    assert change.action == RAISE
    held = stored(conditions[0])
    assert plan([held], run(facts), facts) == []  # held already: nothing to do


def test_a_held_alarm_is_refreshed_in_place_and_updated_when_its_severity_changes() -> None:
    facts = Facts(NOW, [running(lag_records=20_000, lag_seconds=1.0)])
    held = stored(run(facts)[0])
    worse = Facts(NOW, [running(lag_records=30_000, lag_seconds=1.0)])
    assert [c.action for c in plan([held], run(worse), worse)] == [REFRESH]
    critical = Facts(NOW, [running(lag_records=200_000, lag_seconds=1.0)])
    assert [c.action for c in plan([held], run(critical), critical)] == [UPDATE]


def test_an_alarm_resolves_when_its_condition_clears_unless_its_facts_are_unknown() -> None:
    facts = Facts(NOW, [running(lag_records=20_000)])
    held = stored(run(facts)[0])
    clear = Facts(NOW + 5, [running(lag_records=10)])
    [change] = plan([held], run(clear), clear)
    assert change.action == RESOLVE and change.alarm is held
    blind = Facts(NOW + 5, [], unavailable={"tasks": "ZooKeeper out of reach"})
    assert plan([held], run(blind), blind) == []
    gone = Facts(NOW + 5, [])  # the task was deleted
    assert [c.action for c in plan([held], run(gone), gone)] == [RESOLVE]


# --- rules documents -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"tasks": {"orders": {"task_lag_records": -1}}}, "rules.tasks.orders.task_lag_records"),
        ({"tasks": {"orders": {"task_lag_records": 1.5}}}, "rules.tasks.orders.task_lag_records"),
        ({"task_lag_seconds": "60"}, "rules.task_lag_seconds"),
        ({"partition_offline_seconds": True}, "rules.partition_offline_seconds"),
        ({"enabled": {"task-lagg": False}}, "rules.enabled.task-lagg"),
        ({"enabled": {"task-lag": "no"}}, "rules.enabled.task-lag"),
        (
            {"tasks": {"orders": {"enabled": {"worker-lost": False}}}},
            "rules.tasks.orders.enabled.worker-lost",
        ),
        ({"colour": "red"}, "rules.colour"),
        ({"tasks": {"orders": {"lag": 1}}}, "rules.tasks.orders.lag"),
        ({"tasks": []}, "rules.tasks"),
    ],
)
def test_rules_validation_names_the_field(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(RulesError) as err:
        parse_rules(doc)
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}: ")


def test_rules_survive_a_round_trip_through_their_document() -> None:
    assert parse_rules({}) == Rules()
    overrides = {"orders": {"task_lag_records": 5, "enabled": {"task-lag": False}}}
    rules = parse_rules({"task_lag_seconds": 30, "enabled": {"worker-lost": False}, "tasks": overrides})
    assert parse_rules(rules_to_doc(rules)) == rules
    assert not rules.worker_lost
    doc = rules_to_doc(Rules())
    assert doc["task_lag_records"] == 10_000 and doc["partition_under_replicated_seconds"] == 60
