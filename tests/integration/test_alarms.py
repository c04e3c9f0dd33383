"""Alarms end to end on a real ZooKeeper: a task's lag raises an alarm a webhook hears of, its
clearing resolves it, acknowledging works; one evaluator among two, and a takeover that notifies
nothing again; a partition offline once its only broker is killed."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from sluice.cluster.zkstore import FencingCounter, ZkStore
from sluice.manager.alarms import AlarmEvaluator, AlarmStore
from sluice.manager.alarms.facts import collect_facts
from sluice.manager.alarms.store import EPOCH
from sluice.pipeline.worker import Membership
from sluice.sync.tasks import TaskStore, parse_spec
from tests.support.cluster import TestCluster, wait_until
from tests.unit.test_webhooks import Receiver

#: nobody listens here: the worker group cannot be read, which the evaluator must tolerate
NO_BROKERS = "127.0.0.1:1"


@pytest.fixture
def zk_address(zookeeper: str) -> str:
    return f"{zookeeper.split('/')[0]}/t-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def open_zk(zk_address: str) -> Iterator[Callable[[], ZkStore]]:
    """Sessions on one chroot, as several managers would hold."""
    sessions: list[ZkStore] = []

    def make() -> ZkStore:
        zk = ZkStore(zk_address)
        zk.start()
        sessions.append(zk)
        return zk

    yield make
    for zk in sessions:
        try:
            zk.stop()
        except Exception:
            pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def create_task(tasks: TaskStore, task_id: str = "orders") -> None:
    tasks.create(
        parse_spec({"id": task_id, "source": {"kind": "generator"}, "target": "sqlite:////tmp/x.db"})
    )


def publish_lag(tasks: TaskStore, lag_records: int, task_id: str = "orders") -> None:
    now = time.time()
    status = {"execution": "e1", "epoch": 1, "worker": "w1", "started": now, "paused": False, "updated": now,
              "error": None, "lag_records": lag_records, "lag_seconds": 1.0}  # fmt: skip
    assert tasks.publish_status(task_id, status)


def events(receiver: Receiver) -> list[tuple[str, str]]:
    return [(b["event"], b["alarm"]["rule"]) for b in receiver.bodies]


def test_lag_raises_an_alarm_a_webhook_hears_of_then_resolves_it(
    open_zk: Callable[[], ZkStore], receiver: Receiver
) -> None:
    zk = open_zk()
    tasks = TaskStore(zk.client)
    store = AlarmStore(zk.client)
    store.set_rules({"task_lag_records": 100})
    store.set_webhooks([{"url": receiver.url, "format": "json", "name": "ops"}])
    create_task(tasks)
    publish_lag(tasks, 99)
    evaluator = AlarmEvaluator(zk, tasks, NO_BROKERS, identity="m1")
    try:
        assert evaluator.evaluate_once() == [] and evaluator.is_leader  # below the threshold

        publish_lag(tasks, 500)
        [raised] = evaluator.evaluate_once()
        assert raised.event == "raised"
        [alarm] = store.list("open")
        assert alarm["rule"] == "task-lag" and alarm["subject"] == "task:orders"
        assert alarm["summary"].startswith("task orders is 500 records (1 s) behind; threshold 100 records")
        wait_until(lambda: events(receiver) == [("raised", "task-lag")], 10, "the webhook to hear of it")
        assert receiver.bodies[0]["alarm"]["id"] == alarm["id"]

        publish_lag(tasks, 600)
        assert evaluator.evaluate_once() == []  # the same condition: one alarm, updated in place
        assert [a["detail"]["lag_records"] for a in store.list()] == [600]

        acked = store.acknowledge(alarm["id"], "alice")
        assert acked["state"] == "acknowledged" and acked["acknowledged_by"] == "alice"
        assert store.acknowledge(alarm["id"], "bob")["acknowledged_by"] == "alice"  # idempotent

        publish_lag(tasks, 0)
        [resolved] = evaluator.evaluate_once()
        assert resolved.event == "resolved" and resolved.alarm["id"] == alarm["id"]
        wait_until(lambda: len(receiver.bodies) == 2, 10, "the resolve notice")
        assert events(receiver) == [("raised", "task-lag"), ("resolved", "task-lag")]
        assert store.get(alarm["id"])["state"] == "resolved" and store.list("open") == []
        assert store.acknowledge(alarm["id"], "bob")["state"] == "resolved"
        wait_until(
            lambda: [(n["event"], n["ok"]) for n in store.get(alarm["id"])["notifications"]]
            == [("raised", True), ("resolved", True)],
            10, "both notices recorded on the alarm",
        )  # fmt: skip
    finally:
        evaluator.stop()


def test_one_evaluator_leads_and_a_successor_notifies_nothing_again(
    open_zk: Callable[[], ZkStore], receiver: Receiver
) -> None:
    evaluators = []
    for name in ("m1", "m2"):
        zk = open_zk()
        evaluators.append(AlarmEvaluator(zk, TaskStore(zk.client), NO_BROKERS, identity=name, interval_s=0.2))
    zk = open_zk()
    tasks, store = TaskStore(zk.client), AlarmStore(zk.client)
    store.set_rules({"task_lag_records": 100})
    store.set_webhooks([{"url": receiver.url, "format": "json"}])
    create_task(tasks)
    try:
        for e in evaluators:
            e.start()
        leader = wait_until(lambda: [e for e in evaluators if e.is_leader], 10, "a leader")
        assert len(leader) == 1
        [first] = leader
        [second] = [e for e in evaluators if e is not first]
        publish_lag(tasks, 500)
        wait_until(lambda: events(receiver) == [("raised", "task-lag")], 10, "the raise notice")
        assert not second.is_leader

        first.stop()
        wait_until(lambda: second.is_leader, 10, "the standby to take over")
        publish_lag(tasks, 5_000)  # ten times the threshold: critical, an update only the new leader makes
        wait_until(lambda: len(receiver.bodies) >= 2, 10, "the update notice")
        passes = second.passes
        wait_until(lambda: second.passes >= passes + 5, 10, "five more passes of the new leader")
        assert events(receiver) == [("raised", "task-lag"), ("updated", "task-lag")]
        assert receiver.bodies[1]["alarm"]["severity"] == "critical"
        assert len(store.list()) == 1
    finally:
        for e in evaluators:
            e.stop()


def test_an_evaluator_whose_epoch_was_taken_writes_nothing_then_contends_again(
    open_zk: Callable[[], ZkStore],
) -> None:
    zk = open_zk()
    tasks, store = TaskStore(zk.client), AlarmStore(zk.client)
    store.set_rules({"task_lag_records": 100})
    create_task(tasks)
    heard: list[str] = []
    evaluator = AlarmEvaluator(
        zk, tasks, NO_BROKERS, identity="m1", deliver=lambda hooks, event, alarm: heard.append(event)
    )
    try:
        assert evaluator.evaluate_once() == [] and evaluator.is_leader
        # What a successor does when this evaluator's session expired during a pause.
        FencingCounter(zk.client, EPOCH).take()
        publish_lag(tasks, 500)
        assert evaluator.evaluate_once() == [] and not evaluator.is_leader
        assert store.list() == []
        [raised] = evaluator.evaluate_once()  # the only contender again, under a new epoch
        assert raised.event == "raised" and evaluator.is_leader and len(store.list()) == 1
    finally:
        evaluator.stop()


def test_a_worker_leaving_and_a_partition_offline_raise_alarms_naming_why(
    make_cluster: Callable[..., TestCluster],
) -> None:
    cluster = make_cluster(1, session_timeout_s=2.0)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    admin.create_topics([NewTopic("orders", num_partitions=1, replication_factor=1)])["orders"].result(30)
    zk = ZkStore(cluster.zookeeper)
    zk.start()
    evaluator = AlarmEvaluator(zk, TaskStore(zk.client), cluster.bootstrap, identity="m1")
    try:

        def alarms() -> dict[tuple[str, str], dict[str, Any]]:
            evaluator.evaluate_once()
            return {(a["rule"], a["subject"]): a for a in evaluator.store.list("open")}

        # A worker as pipeline/worker.py joins: its name is its client id.
        member = Membership(cluster.bootstrap, "sluice-workers", "w1", session_timeout_ms=6000)
        member.join(b'{"worker": "w1", "tasks": []}')
        member.sync({member.member_id: b""})
        facts = collect_facts(zk, evaluator.tasks, cluster.bootstrap)
        assert facts.workers == ["w1"] and facts.unavailable == {}
        assert alarms() == {}
        member.leave()
        lost = wait_until(lambda: alarms().get(("worker-lost", "worker:w1")), 10, "the worker-lost alarm")
        assert lost["summary"].startswith("worker w1 left the worker group")

        offline = ("partition-offline", "partition:orders-0")
        cluster.kill(1)
        alarm = wait_until(lambda: alarms().get(offline), 20, "the partition-offline alarm")
        assert alarm["severity"] == "critical"
        assert alarm["summary"].startswith(
            "partition orders-0 is offline: its only replica, broker 1, is down"
        )
        assert alarm["detail"]["reason"].startswith("its only replica, broker 1, is down")
        # The brokers are gone: the workers cannot be read, and the worker's alarm is held, not resolved.
        assert "workers" in collect_facts(zk, evaluator.tasks, cluster.bootstrap).unavailable
        assert ("worker-lost", "worker:w1") in alarms()
    finally:
        evaluator.stop()
        zk.stop()
