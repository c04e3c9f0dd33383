"""`sluice incident run NAME --against kafka` without a JVM: what Kafka's Metadata says of an
offline partition, a peer broker's ZooKeeper override, the key=value lines, and B and D saying
what of them applies to Kafka instead of pretending to run."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sluice.chaos.incidents import Check, IncidentResult, Row
from sluice.cli import app
from sluice.cli.drills import figure_lines
from sluice.peers.incidents_kafka import NOT_APPLICABLE, offline_in_metadata
from sluice.peers.kafka import PeerBroker, broker_properties


@dataclass
class _Error:
    code: str

    def name(self) -> str:
        return self.code


@dataclass
class _Meta:
    leader: int
    replicas: list[int]
    isrs: list[int] = field(default_factory=list)
    error: _Error | None = None


def test_an_offline_partition_is_reported_with_its_error_and_the_replicas_that_are_down() -> None:
    found = offline_in_metadata(
        {
            0: _Meta(-1, [2], [2], _Error("LEADER_NOT_AVAILABLE")),
            1: _Meta(3, [3], [3]),
            2: _Meta(-1, [1, 2], [1]),
        },
        live={1, 3},
    )
    assert found == [
        "partition 0: leader -1, LEADER_NOT_AVAILABLE, replicas [2] (down: [2])",
        "partition 2: leader -1, no error code, replicas [1, 2] (down: [2])",
    ]


def test_no_partition_is_reported_offline_while_each_has_a_leader() -> None:
    assert offline_in_metadata({0: _Meta(1, [1]), 1: _Meta(2, [2])}, live={1, 2}) == []


def test_a_peer_broker_reaches_zookeeper_its_own_way_and_takes_the_drills_settings() -> None:
    broker = PeerBroker(2, 9093, "/tmp/b2", zookeeper="127.0.0.1:4000")
    text = broker_properties(broker, "127.0.0.1:2181", 3, {"zookeeper.session.timeout.ms": "6000"})
    props = dict(line.split("=", 1) for line in text.splitlines())
    assert props["zookeeper.connect"] == "127.0.0.1:4000/kafka-peer"
    assert props["zookeeper.session.timeout.ms"] == "6000"
    plain = dict(
        line.split("=", 1)
        for line in broker_properties(PeerBroker(1, 9092, "/tmp/b1"), "zk:1", 1).splitlines()
    )
    assert plain["zookeeper.connect"] == "zk:1/kafka-peer"


def test_figure_lines_are_key_value_and_say_which_check_broke() -> None:
    result = IncidentResult(
        "single-replica-shutdown",
        rows=[Row("kill -9, no drain", 10, 9, 1, 0, 0, 3, {"_MSG_TIMED_OUT": 3})],
        checks=[Check("a guarantee", True, ""), Check("another one", False, "")],
    )
    lines = [dict(kv.split("=", 1) for kv in shlex.split(line)[1:]) for line in figure_lines(result)]
    assert lines[0] == {
        "run": "kill -9, no drain", "acknowledged": "10", "read": "9", "lost": "1", "duplicated": "0",
        "out_of_order": "0", "failed_sends": "3", "errors": "_MSG_TIMED_OUT x3",
    }  # fmt: skip
    assert [(c["held"], c["guarantee"]) for c in lines[1:]] == [("yes", "a guarantee"), ("no", "another one")]


def test_b_and_d_against_kafka_say_what_applies_and_start_nothing(tmp_path: Path) -> None:
    runner = CliRunner()
    for name, words in (("controller-split-brain", "controller epoch"), ("zombie-task", "KIP-618")):
        result = runner.invoke(app, ["incident", "run", name, "--against", "kafka", "--dir", str(tmp_path)])
        assert result.exit_code == 0, result.output
        assert "verdict=not-applicable" in result.output and words in " ".join(result.output.split())
        assert name in NOT_APPLICABLE
    assert not any(tmp_path.iterdir()), "a not-applicable drill started something"


def test_against_takes_sluice_or_kafka_and_kafka_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    runner = CliRunner()
    bad = runner.invoke(app, ["incident", "run", "acks1-failover", "--against", "redpanda"])
    assert bad.exit_code == 2 and "--against must be one of sluice, kafka" in bad.output
    netns = runner.invoke(
        app, ["incident", "run", "rf1-maintenance", "--against", "kafka", "--hosts", "netns"]
    )
    assert netns.exit_code == 2 and "leave out --hosts" in netns.output
    unknown = runner.invoke(app, ["incident", "run", "no-such", "--against", "kafka"])
    assert unknown.exit_code != 0 and "unknown incident" in unknown.output


def test_zombie_against_connect_runs_both_stacks_and_prints_a_line_per_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both drills are stood in for (each starts JVMs and databases; tests/integration and the
    acceptance run them): what is checked is that one command runs Sluice's and Connect's and
    prints ``missing= extra= different=`` for each, and that Sluice's failing makes it exit 1."""
    import sluice.chaos.incidents as incidents
    import sluice.peers.zombie_connect as zombie_connect
    from sluice.peers.zombie_connect import Attempt

    ran: list[str] = []

    def ours(name: str, directory: Path, **_: object) -> IncidentResult:
        ran.append(f"sluice:{name}")
        return IncidentResult(name, checks=[Check("g", held, "")], target_rows_wrong=(0, 0, 0))

    def theirs(directory: Path, seed: int, attempts: int) -> list[Attempt]:
        ran.append(f"connect:{attempts}")
        return [Attempt(1, stale=[(3, 9, 7)], different=1), Attempt(2), Attempt(3, error="boom")]

    monkeypatch.setattr(incidents, "run_incident", ours)
    monkeypatch.setattr(zombie_connect, "run_zombie_connect", theirs)
    runner = CliRunner()
    argv = ["incident", "run", "zombie-task", "--against", "connect", "--dir", str(tmp_path)]
    held = True
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert ran == ["sluice:zombie-task", "connect:3"]
    lines = [line for line in result.output.splitlines() if line.startswith("zombie stack=")]
    assert lines == [
        "zombie stack=sluice verdict=pass missing=0 extra=0 different=0",
        "zombie stack=connect attempts=3 completed=2 attempts_with_stale_rows=1 stale_rows=1 "
        "missing=0 extra=0 different=1",
    ]
    held = False
    failed = runner.invoke(app, argv)
    assert failed.exit_code == 1 and "zombie stack=sluice verdict=fail" in failed.output
    other = runner.invoke(app, ["incident", "run", "acks1-failover", "--against", "connect"])
    assert other.exit_code == 2 and "zombie-task" in other.output
