"""The incident drills pass, and each fails when the guarantee it checks is switched off
(test-only switches in sluice.test_switches, armed for the drill's processes), so a pass means
something."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sluice.chaos.incidents import STALE_RECORDS, IncidentResult, run_incident
from sluice.chaos.random_run import make_schedule, run_chaos
from sluice.test_switches import OFF, Switches

pytestmark = pytest.mark.timeout(400)


def run(name: str, tmp_path: Path, switches: Switches = OFF) -> IncidentResult:
    return run_incident(name, tmp_path / name, switches=switches)


def failed(result: IncidentResult) -> list[str]:
    return [c.guarantee for c in result.checks if not c.passed]


def test_acks1_failover_acks_all_loses_nothing(tmp_path: Path) -> None:
    result = run("acks1-failover", tmp_path)
    assert result.ok, failed(result)
    acks1, acks_all = result.rows
    assert acks_all.lost == 0 and acks_all.acknowledged > 0
    # The stale client's acks=all writes reached the cut-off leader and were refused, not lost.
    assert acks_all.acknowledged_by_writer.get("aall-stale", 0) == 0
    assert sum(n for k, n in acks_all.errors.items() if k.startswith("stale ")) == STALE_RECORDS
    # acks=1 loses what the cut-off leader acknowledged to the stale client: incident A, every run.
    assert acks1.lost_by_writer.get("a1-stale") == STALE_RECORDS


def test_acks1_failover_fails_when_acks_all_does_not_wait_for_the_isr(tmp_path: Path) -> None:
    """With the switch on, acks=all is acknowledged right after the leader's own append, so what
    the cut-off leader acknowledges after the new leader stopped fetching from it is lost.

    The drill used to rely on its librdkafka producer for such writes, and 2 of 4 runs within
    the full suite lost none (a retry hid it). Why: the victim's followers stop fetching from it
    the moment its session expires (its registration is gone from ZooKeeper, so the fetcher has
    no address for it), and from that same moment the other brokers answer Metadata with
    LEADER_NOT_AVAILABLE for its partitions, so the producer leaves it at its next metadata
    refresh from one of them (the workload asks every 0.25 s, librdkafka every 1 s, each time
    of a broker it picks). Loss needs the producer to be the slower of the two: by hand, every
    lost record had been acknowledged within 0.34 s of the session expiring (59 lost in one run:
    the new leader had stopped 59 records, ~60 ms, behind the producer, 1.6 s before the
    controller moved the partition), so a loaded machine can turn it to zero. Now a stale
    client, still believing the victim leads, writes ``STALE_RECORDS`` records to it once the
    new leader acts as leader and while the victim is still cut off: none of them reaches
    another replica, so every one the victim acknowledges is lost, in every run."""
    result = run("acks1-failover", tmp_path, Switches(unsafe_acks_all=True))
    assert "acks=all loses no acknowledged record" in failed(result), result.checks
    acks_all = result.rows[1]
    assert acks_all.acknowledged_by_writer.get("aall-stale") == STALE_RECORDS
    assert acks_all.lost_by_writer.get("aall-stale") == STALE_RECORDS


def test_controller_split_brain_passes(tmp_path: Path) -> None:
    result = run("controller-split-brain", tmp_path)
    assert result.ok, failed(result)


@pytest.mark.slow  # the sweep alone is also shown failing in test_controller_fencing.py, in the default suite
def test_controller_split_brain_fails_without_the_leaderless_sweep(tmp_path: Path) -> None:
    result = run("controller-split-brain", tmp_path, Switches(disable_leaderless_sweep=True))
    assert not result.ok
    assert "no partition with a live in-sync replica stayed leaderless more than 5 s" in failed(result)


def test_single_replica_shutdown_passes(tmp_path: Path) -> None:
    result = run("single-replica-shutdown", tmp_path)
    assert result.ok, failed(result)
    kill_row, drain_row = result.rows
    assert kill_row.failed_sends > 0 and drain_row.failed_sends == 0


@pytest.mark.slow  # the drain alone is also shown failing in test_drain.py, in the default suite
def test_single_replica_shutdown_fails_when_drain_cannot_move_replicas(tmp_path: Path) -> None:
    result = run("single-replica-shutdown", tmp_path, Switches(disable_reassignment=True))
    assert not result.ok
    assert "drain then stop: zero failed sends" in failed(result)


@pytest.mark.timeout(600)  # the drill's own bounds (chaos/zombie.py) end it before this
def test_zombie_task_passes_from_the_cli(tmp_path: Path) -> None:
    """`sluice incident run zombie-task --local`, as an operator runs it."""
    import sys

    from tests.support.processes import run_command

    done = run_command(
        [sys.executable, "-m", "sluice.cli", "incident", "run", "zombie-task", "--local",
         "--dir", str(tmp_path)],
        560, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert done.returncode == 0 and "verdict=pass" in done.stdout, done.stdout[-4000:] + done.stderr[-2000:]
    assert "the zombie's stale commit was refused by the target" in done.stdout


@pytest.mark.slow  # the targets' fence and guard are also in test_targets.py (MySQL in the default suite)
@pytest.mark.parametrize("target", ["mysql", "delta"])
@pytest.mark.parametrize("switches", [None, "disable_target_fence"])
def test_zombie_task_with_a_mysql_or_delta_target(tmp_path: Path, switches: str | None, target: str) -> None:
    """`--target mysql|delta`: the same drill applying to that target; with its fence off, the
    zombie's commit is not refused (on Delta it is then skipped by the transaction identity, as
    test_delta_target.py shows, so the rows still hold)."""
    off = Switches(**({switches: True} if switches else {}))
    result = run_incident("zombie-task", tmp_path / "zombie-task", switches=off, target=target)
    if switches is None:
        assert result.ok, failed(result)
    elif target == "mysql":
        assert failed(result) == ["phase 2: the zombie's stale commit was refused by the target"]
    else:
        # Not refused, and the rows and offsets hold all the same. Whether the zombie itself also
        # reports the duplicate execution is a race on Delta: its commit, Spark jobs that are
        # skipped, takes seconds, and its group rebalance (which stops it without the alarm)
        # can come before its next tick, which would raise it.
        assert "phase 2: the zombie's stale commit was refused by the target" in failed(result)
        assert set(failed(result)) <= {
            "phase 2: the zombie's stale commit was refused by the target",
            "phase 2: the duplicate execution was detected",
        }, failed(result)


@pytest.mark.slow  # the guard alone is also shown failing in test_targets.py, in the default suite
def test_zombie_task_fails_without_the_version_guard(tmp_path: Path) -> None:
    """The zombie's capture writes S2 into the log after the new execution wrote S3: without the
    version guard, S3 is overwritten by S2 (incident D)."""
    result = run("zombie-task", tmp_path, Switches(disable_version_guard=True))
    assert not result.ok
    assert failed(result) == ["phase 1: the target equals the source (S3) after the zombie's writes"]


@pytest.mark.slow  # the fence alone is also shown failing in test_targets.py, in the default suite
def test_zombie_task_fails_without_the_target_fence(tmp_path: Path) -> None:
    result = run("zombie-task", tmp_path, Switches(disable_target_fence=True))
    assert not result.ok
    assert failed(result) == ["phase 2: the zombie's stale commit was refused by the target"]


def test_same_seed_same_fault_schedule() -> None:
    kinds = ("kill", "pause", "shutdown", "zk-cut")
    assert make_schedule(7, 120, kinds) == make_schedule(7, 120, kinds)
    assert make_schedule(7, 120, kinds) != make_schedule(8, 120, kinds)
    with pytest.raises(ValueError, match="unknown fault"):
        make_schedule(1, 30, ("meteor",))
    with pytest.raises(ValueError, match="network faults need --hosts netns"):
        make_schedule(1, 30, ("partition",))


def test_short_chaos_run_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    """One 60 s run of seed 2. Its schedule begins as its 30 s one did (kill, zk-cut) and goes
    on with shutdown, pause and shutdown: every kind that seeds 1 and 2 dealt between them in two
    30 s runs, each on a cluster of its own, in one run on one cluster."""
    kinds = ("kill", "pause", "shutdown", "zk-cut")
    assert {f.kind for f in make_schedule(2, 60, kinds)} == set(kinds)
    run = run_chaos(tmp_path / "chaos-2", seed=2, duration_s=60, kinds=kinds)
    result = run.result
    assert run.schedule and sum(run.happened.values()) > 0, "the schedule injected no fault"
    assert result.ok, [(c.guarantee, c.detail) for c in result.checks if not c.passed]


@pytest.mark.slow
@pytest.mark.timeout(7200)
@pytest.mark.parametrize("seed", range(1, 21))
def test_long_chaos_runs(tmp_path: Path, seed: int) -> None:
    result = run_chaos(
        tmp_path / f"chaos-{seed}", seed=seed, duration_s=120, kinds=("kill", "pause", "shutdown", "zk-cut")
    ).result
    assert result.ok, [(c.guarantee, c.detail) for c in result.checks if not c.passed]


# With security on (TLS, SCRAM users, ACLs: `cluster up --security sasl_ssl`) every client of a
# drill authenticates: its producers, readers and admin calls as the admin, brokers replicating as
# their own user, the zombie drill's workers as the worker user with only its ACLs. The default
# suite runs the quickest drill (19 s) and one chaos seed (36 s); the others are slow (41-232 s).
@pytest.mark.parametrize(
    "name",
    [
        "single-replica-shutdown",
        pytest.param("acks1-failover", marks=pytest.mark.slow),
        pytest.param("controller-split-brain", marks=pytest.mark.slow),
        pytest.param("zombie-task", marks=pytest.mark.slow),
    ],
)
def test_incident_drill_passes_with_security_on(tmp_path: Path, name: str) -> None:
    result = run_incident(name, tmp_path / name, security="sasl_ssl")
    assert result.ok, failed(result)


def test_short_chaos_run_with_security_on_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    run = run_chaos(
        tmp_path / "chaos-sasl", seed=1, duration_s=30, kinds=("kill", "pause", "shutdown", "zk-cut"),
        security="sasl_ssl",
    )  # fmt: skip
    assert run.schedule and sum(run.happened.values()) > 0, "the schedule injected no fault"
    assert run.result.ok, [(c.guarantee, c.detail) for c in run.result.checks if not c.passed]
