"""Kafka's Java client in `sluice chaos run --java-client` (issue 20): a producer and a group
consumer of kafka-clients beside librdkafka's, judged by the same checker. Skipped only when
scripts/peers.sh could not fetch Kafka's jars (Maven Central unreachable)."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sluice.chaos.checker import Ack, Read
from sluice.chaos.random_run import _java_checks, run_chaos
from sluice.chaos.results import IncidentResult
from sluice.chaos.workload import ProducerStats
from sluice.peers.kafka import PeerError, kafka_libs

pytestmark = pytest.mark.timeout(300)


def test_java_client_beside_librdkafka_in_a_short_chaos_run_loses_nothing(tmp_path: Path) -> None:
    try:
        kafka_libs()
    except PeerError as exc:
        pytest.skip(str(exc))
    run = run_chaos(tmp_path / "chaos", seed=3, duration_s=15, kinds=("kill", "pause"), java_client=True)
    result = run.result
    assert sum(run.happened.values()) > 0, "the schedule injected no fault"
    assert result.ok, [(c.guarantee, c.detail) for c in result.checks if not c.passed]
    librdkafka, java = result.rows
    assert java.label.startswith("Java client") and java.acknowledged > 0 and librdkafka.acknowledged > 0
    assert java.acknowledged_by_writer == {"j3": java.acknowledged}
    consumer = next(c for c in result.checks if c.guarantee.startswith("the Java consumer"))
    assert consumer.passed and not consumer.detail.startswith("0 read")


def _java(reads: list[Read]) -> Any:
    return SimpleNamespace(_lock=threading.Lock(), reads=reads, done=True)


def test_the_java_checks_catch_a_lost_acknowledgement_and_a_read_not_in_the_log() -> None:
    """The checks the run above passes, each shown failing on a history that breaks it."""
    log = [Read("chaos", 0, 0, "j3:0:0"), Read("chaos", 0, 1, "j3:0:1")]
    stats = ProducerStats(sent=3, acks=[Ack("chaos", 0, 0, "j3:0:0", -1), Ack("chaos", 0, 1, "j3:0:1", -1)])
    good = _java_checks(IncidentResult("t"), _java(list(log)), stats, log, "j3")
    assert all(c.passed for c in good), [(c.guarantee, c.detail) for c in good]

    stats.acks.append(Ack("chaos", 0, 2, "j3:0:2", -1))  # acknowledged, not in the log
    lost = _java_checks(IncidentResult("t"), _java(list(log)), stats, log, "j3")
    assert [c.guarantee for c in lost if not c.passed] == ["0 records the Java client acknowledged lost"]

    stats.acks.pop()
    phantom = [*log, Read("chaos", 0, 1, "j3:0:9")]  # the consumer was given what the log lacks
    wrong = _java_checks(IncidentResult("t"), _java(phantom), stats, log, "j3")
    assert [c.guarantee for c in wrong if not c.passed] == ["the Java consumer read only what the log holds"]
