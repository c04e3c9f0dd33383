"""Every broker serves Prometheus metrics (issue 16): three brokers under an acks=all load, then
one killed with SIGKILL. What the scrapes must show: one active controller before and after, the
Produce requests and bytes the client sent, and after the kill under-replicated partitions and ISR
shrinks on the surviving leaders and leader elections on the controller."""

from __future__ import annotations

import signal
import time
import urllib.request
from collections.abc import Callable

import orjson
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from tests.support.cluster import TestCluster, wait_until

pytestmark = pytest.mark.timeout(120)

TOPIC = "metered"
RECORDS_MAX = 20_000
PRODUCE_S_MAX = 8.0
VALUE = b"v" * 200

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_broker_metrics_follow_a_produce_load_and_a_broker_killed(
    make_cluster: Callable[..., TestCluster],
) -> None:
    c = make_cluster(3)
    urls = {b.broker_id: b.metrics_url for b in c.cluster.brokers}
    assert all(urls.values()), f"the launcher gives every broker a metrics port: {urls}"

    def scrape_all(ids: list[int]) -> dict[int, Samples]:
        return {i: scrape(str(urls[i])) for i in ids}

    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 3, 3)])[TOPIC].result(30)

    # An acks=all load, bounded in records and time; librdkafka's statistics count the Produce
    # requests it sent (per broker, retries included).
    stats: list[dict[str, object]] = []
    producer = Producer({
        "bootstrap.servers": c.bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 0,
        "batch.num.messages": 50,  # many requests, each with few records
        "statistics.interval.ms": 100, "stats_cb": lambda s: stats.append(orjson.loads(s)),
    })  # fmt: skip
    acked: list[int] = []
    errors: list[str] = []

    def delivered(err: object, msg: object) -> None:
        if err is None:
            acked.append(len(msg.value()))  # type: ignore[attr-defined]
        else:
            errors.append(str(err))

    started = time.monotonic()
    for i in range(RECORDS_MAX):
        if time.monotonic() - started > PRODUCE_S_MAX:
            break
        try:
            producer.produce(TOPIC, VALUE, key=str(i).encode(), on_delivery=delivered)
        except BufferError:
            producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert not errors, errors[:3]
    stats_at = len(stats)

    def fresh_statistics() -> bool:
        producer.poll(0.05)  # statistics are delivered by poll
        return len(stats) > stats_at + 1  # the second after the flush: all of it counted

    wait_until(fresh_statistics, 10, "the producer's statistics after the flush")
    client_produce_requests = sum(
        int(b["req"].get("Produce", 0))  # type: ignore[index,union-attr]
        for b in stats[-1]["brokers"].values()  # type: ignore[union-attr]
    )
    sent_bytes = sum(acked)
    assert client_produce_requests > 0 and sent_bytes >= 1000 * len(VALUE)

    before = scrape_all(list(urls))
    assert sum(value(s, "sluice_controller_active") for s in before.values()) == 1
    broker_produce = sum(value(s, "sluice_requests_total", api="Produce") for s in before.values())
    assert client_produce_requests <= broker_produce <= len(acked), (client_produce_requests, broker_produce)
    timed = sum(value(s, "sluice_request_seconds_count", api="Produce") for s in before.values())
    assert timed == broker_produce
    assert sum(value(s, "sluice_requests_total", api="Metadata") for s in before.values()) >= 1
    assert sum(value(s, "sluice_bytes_in_total") for s in before.values()) >= sent_bytes
    assert all(value(s, "sluice_partitions_under_replicated") == 0 for s in before.values())
    assert sum(value(s, "sluice_partitions_offline") for s in before.values()) == 0

    # Kill the leader of partition 0 (any broker: the controller too, if it is the one).
    meta = admin.list_topics(TOPIC, timeout=10)
    victim = meta.topics[TOPIC].partitions[0].leader
    survivors = [i for i in urls if i != victim]
    c.kill(victim, signal.SIGKILL)

    def degraded() -> dict[int, Samples] | None:
        now = scrape_all(survivors)
        under = sum(value(s, "sluice_partitions_under_replicated") for s in now.values())
        shrinks = sum(
            value(now[i], "sluice_isr_shrinks_total") - value(before[i], "sluice_isr_shrinks_total")
            for i in survivors
        )
        controllers = [i for i in survivors if value(now[i], "sluice_controller_active") == 1]
        if under > 0 and shrinks > 0 and len(controllers) == 1:
            return now
        return None

    after = wait_until(degraded, 30, f"under-replicated partitions and ISR shrinks once broker {victim} died")
    assert sum(value(s, "sluice_controller_active") for s in after.values()) == 1
    (controller,) = [i for i in survivors if value(after[i], "sluice_controller_active") == 1]
    # The controller elected a leader for the dead broker's partitions (as its first act, if the
    # dead one was the controller).
    wait_until(
        lambda: (
            value(scrape(str(urls[controller])), "sluice_leader_elections_total")
            > value(before[controller], "sluice_leader_elections_total")
        ),
        15,
        f"leader elections on controller {controller}",
    )
    assert sum(value(s, "sluice_partitions_offline") for s in scrape_all(survivors).values()) == 0
