"""Prometheus metrics (issue 16): the settings, the exposition, and each place a metric is
updated, without a cluster (tests/integration/test_metrics.py scrapes real brokers)."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from sluice import metrics
from sluice.broker.broker import Broker
from sluice.broker.config import BrokerConfig
from sluice.broker.partition import Partition
from sluice.cluster.controller import Controller, ControllerTerm
from sluice.cluster.layout import PartitionState, TopicAssignment
from sluice.cluster.view import PartitionInfo
from sluice.cluster.zkstore import ChunkResult
from sluice.ops import launcher
from sluice.pipeline.execution import SUPERSEDED, TaskExecution
from sluice.properties import ConfigError
from sluice.sync.targets import StaleEpochError
from sluice.sync.tasks import Control, parse_spec
from sluice.sync.worker_config import WorkerConfig

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "sluice-dashboard.json"


def scrape(*collectors: Collector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """What Prometheus would read from these collectors: (sample name, sorted labels) -> value."""
    registry = CollectorRegistry()
    for c in collectors:
        registry.register(c)
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(collector: Collector, name: str, **labels: str) -> float:
    return scrape(collector).get((name, tuple(sorted(labels.items()))), 0.0)


# -- settings -------------------------------------------------------------------------------------


def test_metrics_port_is_off_when_absent_or_empty_and_zero_picks_a_free_port() -> None:
    assert metrics.parse_metrics_port("") is None
    assert metrics.parse_metrics_port("  ") is None
    assert metrics.parse_metrics_port("0") == 0
    assert metrics.parse_metrics_port(" 9404 ") == 9404
    for bad in ("-1", "65536", "nine"):
        with pytest.raises(ValueError):
            metrics.parse_metrics_port(bad)


REQUIRED = {"broker.id": "1", "log.dirs": "/tmp/d", "zookeeper.connect": "127.0.0.1:2181"}


def test_broker_and_worker_configs_take_metrics_port_and_refuse_a_bad_one() -> None:
    assert BrokerConfig.from_properties(REQUIRED).metrics_port is None
    assert BrokerConfig.from_properties({**REQUIRED, "metrics.port": ""}).metrics_port is None
    assert BrokerConfig.from_properties({**REQUIRED, "metrics.port": "9404"}).metrics_port == 9404
    with pytest.raises(ConfigError, match=r"'metrics.port'.*port in 0..65535"):
        BrokerConfig.from_properties({**REQUIRED, "metrics.port": "99999"})
    with pytest.raises(ConfigError, match=r"did you mean 'metrics.port'"):
        BrokerConfig.from_properties({**REQUIRED, "metric.port": "9404"})
    w = WorkerConfig.from_properties({"bootstrap.servers": "h:9092", "metrics.port": "0"})
    assert (w.metrics_port, w.metrics_host) == (0, "0.0.0.0")
    w = WorkerConfig.from_properties({"bootstrap.servers": "h:9092", "metrics.host": "127.0.0.1"})
    assert (w.metrics_port, w.metrics_host) == (None, "127.0.0.1")


def test_the_deploy_configs_enable_metrics() -> None:
    from sluice.properties import read_properties

    # the guide appends the brokers' password (deploy/README.md, section 3)
    values = {**read_properties(REPO / "deploy/config/broker.properties"), "inter.broker.sasl.password": "pw"}
    broker = BrokerConfig.from_properties(values)
    worker = WorkerConfig.from_properties(read_properties(REPO / "deploy/config/worker.properties"))
    assert (broker.metrics_port, worker.metrics_port) == (9404, 9405)  # one host runs both


# -- the broker's exposition ------------------------------------------------------------------------


def test_requests_are_counted_per_kafka_api_name_with_a_consistent_histogram() -> None:
    from sluice.protocol.api import ApiKey

    traffic = metrics.Traffic()
    for seconds in (0.0001, 0.002, 3.0):
        traffic.api(ApiKey.PRODUCE).observe(seconds)
    traffic.api(ApiKey.OFFSET_FOR_LEADER_EPOCH).observe(0.0005)  # on a bound: in its "le" bucket
    traffic.bytes_in += 1234
    traffic.bytes_out += 99
    got = scrape(metrics.BrokerCollector(traffic))
    assert got[("sluice_requests_total", (("api", "Produce"),))] == 3
    assert got[("sluice_requests_total", (("api", "OffsetForLeaderEpoch"),))] == 1
    produce = (("api", "Produce"),)
    assert got[("sluice_request_seconds_count", produce)] == 3
    assert got[("sluice_request_seconds_sum", produce)] == pytest.approx(3.0021)
    assert got[("sluice_request_seconds_bucket", (("api", "Produce"), ("le", "0.0005")))] == 1
    assert got[("sluice_request_seconds_bucket", (("api", "Produce"), ("le", "0.0025")))] == 2
    assert got[("sluice_request_seconds_bucket", (("api", "Produce"), ("le", "2.5")))] == 2
    assert got[("sluice_request_seconds_bucket", (("api", "Produce"), ("le", "+Inf")))] == 3
    assert got[("sluice_request_seconds_bucket", (("api", "OffsetForLeaderEpoch"), ("le", "0.0005")))] == 1
    assert got[("sluice_bytes_in_total", ())] == 1234
    assert got[("sluice_bytes_out_total", ())] == 99
    assert ("sluice_controller_active", ()) not in got  # no gauges without a source


def test_state_gauges_come_from_the_source_and_a_failing_source_does_not_fail_the_scrape() -> None:
    collector = metrics.BrokerCollector(metrics.Traffic(), lambda: metrics.BrokerGauges(2, 5, 1))
    got = scrape(collector)
    assert got[("sluice_partitions_offline", ())] == 2
    assert got[("sluice_partitions_under_replicated", ())] == 5
    assert got[("sluice_controller_active", ())] == 1

    def broken() -> metrics.BrokerGauges:
        raise RuntimeError("view not ready")

    got = scrape(metrics.BrokerCollector(metrics.Traffic(), broken))
    assert ("sluice_controller_active", ()) not in got
    assert got[("sluice_bytes_in_total", ())] == 0


def test_serve_binds_a_free_port_and_a_taken_port_is_refused_naming_the_setting() -> None:
    registry = CollectorRegistry()
    traffic = metrics.Traffic()
    traffic.bytes_in = 7
    registry.register(metrics.BrokerCollector(traffic))
    port = metrics.serve(0, "127.0.0.1", registry=registry)
    assert port > 0
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    assert "sluice_bytes_in_total 7.0" in text
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(metrics.MetricsBindError, match=r"metrics\.port"):
            metrics.serve(taken.getsockname()[1], "127.0.0.1", registry=registry)


# -- where the broker's metrics are computed ------------------------------------------------------


def _broker_leading(tmp_path: Path, isr: tuple[int, ...], live: set[int]) -> tuple[Broker, Partition]:
    """A broker (id 1, not started) leading t-0 (replicas 1, 2, 3) with `isr`, its view faked."""
    broker = Broker(BrokerConfig(1, tmp_path / "b1", "127.0.0.1:1/unused"))
    part = Partition.open(tmp_path / "b1", "t", 0, uuid.uuid4(), {}, 1)
    broker.replicas.partitions[("t", 0)] = part
    part.become_leader(1, isr, (1, 2, 3), time.monotonic() * 1000)
    broker.replicas.partitions.mark_role(part)
    states = {("t", 0): PartitionState(1, 1, isr, 1), ("u", 0): PartitionState(-1, 3, (2,), 1)}
    broker.metadata.partition_state = lambda t, p: (states[(t, p)], 1)  # type: ignore[method-assign]
    broker.metadata.brokers = lambda: dict.fromkeys(live)  # type: ignore[method-assign,arg-type,return-value]
    broker.metadata.topics = lambda: {"t": None, "u": None}  # type: ignore[method-assign,dict-item]
    broker.metadata.partitions = lambda name: [  # type: ignore[method-assign]
        PartitionInfo(name, 0, (1, 2, 3) if name == "t" else (2,), states[(name, 0)], 1)
    ]
    return broker, part


def test_health_gauges_count_partitions_led_here_and_offline_ones_only_on_the_controller(
    tmp_path: Path,
) -> None:
    broker, part = _broker_leading(tmp_path, (1, 2), live={1, 2})
    assert broker.health_gauges() == metrics.BrokerGauges(0, 1, 0)  # not the controller
    broker.controller.term = ControllerTerm(epoch=4, epoch_zk_version=3)
    # u-0's only replica, broker 2, is alive but not its leader: offline (the one classifier says)
    assert broker.health_gauges() == metrics.BrokerGauges(1, 1, 1)
    part.record_follower_fetch(3, 0, time.monotonic() * 1000)  # broker 3 is back and caught up
    part.set_isr((1, 2, 3), 2)
    broker.metadata.partition_state = lambda t, p: (PartitionState(1, 1, (1, 2, 3), 1), 2)  # type: ignore[method-assign]
    assert broker.health_gauges().partitions_under_replicated == 0
    part.close()


def test_isr_changes_are_counted_on_the_leader_only(tmp_path: Path) -> None:
    part = Partition.open(tmp_path, "t", 0, uuid.uuid4(), {}, 1)
    part.become_leader(0, (1, 2, 3), (1, 2, 3), time.monotonic() * 1000)
    shrinks, expands = (
        value(metrics.ISR_SHRINKS, "sluice_isr_shrinks_total"),
        value(metrics.ISR_EXPANDS, "sluice_isr_expands_total"),
    )
    part.set_isr((1, 2), 1)  # the controller dropped dead broker 3
    part.set_isr((1, 2), 2)  # the same ISR again (the notice of our own write): no change
    assert value(metrics.ISR_SHRINKS, "sluice_isr_shrinks_total") == shrinks + 1
    part.record_follower_fetch(3, 0, time.monotonic() * 1000)
    part.set_isr((1, 2, 3), 3)
    assert value(metrics.ISR_EXPANDS, "sluice_isr_expands_total") == expands + 1
    part.become_follower(2, 1, (1, 2, 3))
    part.set_isr((2,), 4)  # a follower's view of its leader's ISR is not ours to count
    assert value(metrics.ISR_SHRINKS, "sluice_isr_shrinks_total") == shrinks + 1
    part.close()


class _ControllerView:
    def __init__(self, states: dict[tuple[str, int], PartitionState], live: set[int], unclean: bool) -> None:
        self.listeners: list[Any] = []
        self.states = states
        self.live = live
        config = {"unclean.leader.election.enable": "true"} if unclean else {}
        self._topics = {"t": TopicAssignment("t", uuid.uuid4(), {p: (1, 2, 3) for _, p in states}, config)}

    def catch_up(self) -> None: ...
    def brokers(self) -> dict[int, None]:
        return dict.fromkeys(self.live)

    def broker_epochs(self) -> dict[int, int]:
        return {b: 1 for b in self.live}

    def shutting_down(self) -> frozenset[int]:
        return frozenset()

    def topics(self) -> dict[str, TopicAssignment]:
        return self._topics

    def partition_state(self, topic: str, p: int) -> tuple[PartitionState, int]:
        return self.states[(topic, p)], 1

    def apply_writes(self, writes: Any, notice: Any = None) -> None: ...


class _ControllerStore:
    def topics_marked_for_deletion(self) -> list[str]:
        return []

    def reassignment_request(self) -> None:
        return None

    def commit_fenced_many(self, version: int, groups: Any, writer: str) -> list[ChunkResult]:
        return [ChunkResult(writes, notice="/brokers/state_changes/change-1") for _, writes in groups]


def test_the_controller_counts_elections_and_unclean_ones_but_not_an_isr_shrink() -> None:
    states = {
        ("t", 0): PartitionState(2, 5, (2, 3), 1),  # leader 2 dies: 3 is elected
        ("t", 1): PartitionState(1, 5, (1, 2), 1),  # follower 2 dies: the ISR shrinks, no election
        ("t", 2): PartitionState(2, 5, (2,), 1),  # leader 2 dies, ISR empty: unclean, 1 elected
    }
    controller = Controller(_ControllerStore(), 9, view=_ControllerView(states, {1, 3}, unclean=True))  # type: ignore[arg-type]
    controller.term = ControllerTerm(epoch=2, epoch_zk_version=1)
    controller._known_epochs = {1: 1, 2: 1, 3: 1}
    elections = value(metrics.LEADER_ELECTIONS, "sluice_leader_elections_total")
    unclean = value(metrics.UNCLEAN_ELECTIONS, "sluice_unclean_elections_total")
    controller.reconcile(catch_up=False)
    assert value(metrics.LEADER_ELECTIONS, "sluice_leader_elections_total") == elections + 2
    assert value(metrics.UNCLEAN_ELECTIONS, "sluice_unclean_elections_total") == unclean + 1


# -- the worker's metrics, from one execution ---------------------------------------------------


class FakeTaskStore:
    """TaskStore's calls an execution makes, in memory; `history_fails` breaks the history."""

    connected = True

    def __init__(self, history_fails: bool = False) -> None:
        self.spec = parse_spec({"id": "t1", "source": {"kind": "generator"}, "target": "sqlite:///t.db"})
        self.alarms: list[tuple[str, dict[str, Any]]] = []
        self.history: dict[str, dict[str, Any]] = {}
        self.history_fails = history_fails
        self.epochs = 0

    def get(self, task_id: str) -> Any:
        return self.spec

    def control(self, task_id: str) -> Control:
        return Control(paused=True)  # the execution starts without capture or apply query

    def next_epoch(self, task_id: str, at_least: int = 0) -> int:
        self.epochs = max(self.epochs, at_least) + 1
        return self.epochs

    def epoch(self, task_id: str) -> int:
        return self.epochs

    def status(self, task_id: str) -> None:
        return None

    def publish_status(self, task_id: str, status: dict[str, Any]) -> bool:
        return True

    def clear_status(self, task_id: str, execution: str) -> None: ...

    def raise_alarm(self, task_id: str, kind: str, detail: dict[str, Any]) -> None:
        self.alarms.append((kind, detail))

    def record_execution(self, task_id: str, entry: dict[str, Any], *, node: str | None = None) -> str:
        if self.history_fails:
            raise ConnectionError("ZooKeeper is out of reach")
        node = node or f"execution-{len(self.history):010d}"
        self.history[node] = dict(entry)
        return node


def _execution(monkeypatch: pytest.MonkeyPatch, store: FakeTaskStore) -> TaskExecution:
    target = SimpleNamespace(fence_epoch=lambda pipeline: 0, close=lambda: None)
    monkeypatch.setattr(TaskExecution, "_target", lambda self: target)
    return TaskExecution(
        "t1", store, worker="w1", bootstrap="127.0.0.1:1", spark=lambda master: None,  # type: ignore[arg-type]
        workdir=Path("/nonexistent"),
    )  # fmt: skip


def worker_value(name: str, task: str = "t1") -> float | None:
    got = scrape(*metrics.TASK_METRICS)
    return got.get((name, (("task", task),)))


def test_an_execution_exports_lag_refusals_duplicates_and_commit_times_and_forgets_them_on_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = FakeTaskStore()
    ex = _execution(monkeypatch, store)
    monkeypatch.setattr(ex, "_progress", lambda: {"lag_records": 42, "lag_seconds": 1.5})
    ex.tick()
    assert worker_value("sluice_task_lag_records") == 42
    assert worker_value("sluice_task_lag_seconds") == 1.5
    ex._on_batch(SimpleNamespace(commit_s=0.02))
    assert worker_value("sluice_task_apply_batch_seconds_count") == 1
    assert worker_value("sluice_task_apply_batch_seconds_sum") == pytest.approx(0.02)
    ex._on_commit_error(StaleEpochError("t1", 1, 2))
    assert worker_value("sluice_task_commits_refused_total") == 1
    assert [kind for kind, _ in store.alarms] == ["stale-commit-refused"]
    store.epochs = 2
    monkeypatch.setattr(store, "status", lambda task_id: {"execution": "other", "epoch": 2, "worker": "w2"})
    ex.tick()  # a newer epoch runs elsewhere: step down with a duplicate-execution alarm
    assert ex.error == SUPERSEDED
    assert [kind for kind, _ in store.alarms] == ["stale-commit-refused", "duplicate-execution"]
    # stopped for good (the step-down stops it): the task's series are gone
    for name in ("sluice_task_lag_records", "sluice_task_commits_refused_total"):
        assert worker_value(name) is None, name
    assert worker_value("sluice_task_duplicate_executions_total") is None


def test_the_duplicate_execution_counter_follows_each_alarm(monkeypatch: pytest.MonkeyPatch) -> None:
    store = FakeTaskStore()
    monkeypatch.setattr(store, "status", lambda task_id: {"execution": "old", "epoch": 0, "worker": "w0"})
    ex = _execution(monkeypatch, store)  # finds the previous execution still registered
    assert [kind for kind, _ in store.alarms] == ["duplicate-execution"]
    assert worker_value("sluice_task_duplicate_executions_total") == 1
    ex.stop()
    assert worker_value("sluice_task_duplicate_executions_total") is None


def test_each_execution_is_recorded_at_its_start_and_completed_at_its_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = FakeTaskStore()
    ex = _execution(monkeypatch, store)
    ((node, entry),) = store.history.items()
    assert entry["outcome"] == "running" and entry["ended"] is None
    assert (entry["execution"], entry["epoch"], entry["worker"]) == (ex.execution, 1, "w1")
    ex._on_commit_error(StaleEpochError("t1", 1, 2))
    ex.stop()
    ex.stop()  # the worker stops it again: the entry is completed once
    assert list(store.history) == [node]
    assert store.history[node]["outcome"] == "fenced"
    assert store.history[node]["ended"] >= store.history[node]["started"]
    assert "fencing epoch 1 is older" not in str(store.history[node]["error"] or "")


def test_a_history_that_cannot_be_written_never_fails_the_task(monkeypatch: pytest.MonkeyPatch) -> None:
    store = FakeTaskStore(history_fails=True)
    ex = _execution(monkeypatch, store)
    assert ex.alive()
    ex.stop()
    assert store.history == {}


# -- the launcher ----------------------------------------------------------------------------------


def test_the_launcher_writes_metrics_ports_into_the_config_files_and_lists_the_urls(tmp_path: Path) -> None:
    b = launcher.BrokerProcess(1, "127.0.0.1", 9092, "/d", "/l", metrics_port=9404)
    assert "metrics.port=9404\n" in launcher.broker_properties(b, "127.0.0.1:2181/sluice", 6.0)
    cluster = launcher.LocalCluster(str(tmp_path), "127.0.0.1:2181/sluice", 2181, True, brokers=[b])
    w = launcher.WorkerProcess("worker-1", "/l", host="10.0.0.5", metrics_port=9404, namespace="ns")
    cluster.workers.append(w)
    text = launcher.worker_properties(cluster, w)
    assert "metrics.port=9404\n" in text and "metrics.host=0.0.0.0\n" in text
    assert cluster.metrics_urls() == ["http://127.0.0.1:9404/metrics", "http://10.0.0.5:9404/metrics"]
    cluster.save()
    assert launcher.LocalCluster.load(tmp_path).metrics_urls() == cluster.metrics_urls()
    saved = json.loads((tmp_path / launcher.STATE_FILE).read_text())
    for proc in saved["brokers"] + saved["workers"]:
        del proc["metrics_port"]  # a cluster saved before metrics
    (tmp_path / launcher.STATE_FILE).write_text(json.dumps(saved))
    assert launcher.LocalCluster.load(tmp_path).metrics_urls() == []


# -- the dashboard ---------------------------------------------------------------------------------

REQUIRED_METRICS = (
    "sluice_partitions_offline",
    "sluice_partitions_under_replicated",
    "sluice_controller_active",
    "sluice_leader_elections_total",
    "sluice_unclean_elections_total",
    "sluice_isr_shrinks_total",
    "sluice_isr_expands_total",
    "sluice_requests_total",
    "sluice_request_seconds_bucket",
    "sluice_bytes_in_total",
    "sluice_bytes_out_total",
    "sluice_group_lag_records",
    "sluice_task_lag_records",
    "sluice_task_lag_seconds",
    "sluice_task_apply_batch_seconds_bucket",
    "sluice_task_commits_refused_total",
    "sluice_task_duplicate_executions_total",
)


def _panels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in doc.get("panels", []):
        out.append(panel)
        out.extend(panel.get("panels", []))  # inside collapsed rows
    return out


def test_the_dashboard_is_importable_and_charts_every_metric() -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert [i["name"] for i in doc["__inputs"]] == ["DS_PROMETHEUS"]
    assert doc["__inputs"][0]["pluginId"] == "prometheus"
    panels = _panels(doc)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    exprs = []
    for p in panels:
        if p.get("type") == "row":
            continue
        assert p["datasource"]["uid"] == "${DS_PROMETHEUS}", p["title"]
        assert p["targets"], p["title"]
        exprs += [t["expr"] for t in p["targets"]]
    text = "\n".join(exprs)
    missing = [m for m in REQUIRED_METRICS if m not in text]
    assert not missing, f"no panel charts {missing}"
    assert "histogram_quantile(0.99, sum by (api, le) (rate(sluice_request_seconds_bucket" in text
