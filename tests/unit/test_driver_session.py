"""A worker's one Spark driver and the tasks' spark_master option (issue 15): the option is
honoured where a process can honour it, and refused with both masters named where it cannot.
Spark itself is replaced by a stand-in: this is about which master a driver starts on."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from sluice.pipeline import session
from sluice.pipeline.session import DriverSession, SparkMasterConflictError


class FakeSpark:
    def __init__(self, master: str | None) -> None:
        self.master = master
        self.stopped = False
        self.sparkContext = SimpleNamespace(_gateway=SimpleNamespace(proc=SimpleNamespace(poll=lambda: -9)))

    def stop(self) -> None:
        self.stopped = True


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[FakeSpark]:
    made: list[FakeSpark] = []

    def fake_session(
        master: str | None, app: str = "", conf: Any = None, *, kafka_connector: bool = False
    ) -> FakeSpark:
        made.append(FakeSpark(master))
        return made[-1]

    monkeypatch.setattr(session, "spark_session", fake_session)
    monkeypatch.setattr(session, "driver_alive", lambda spark: not spark.stopped)
    monkeypatch.setattr(session, "driver_pid", lambda spark: 1)
    monkeypatch.setattr(session, "_forget_driver", lambda spark: None)
    return made


def test_a_task_option_moves_a_warmed_driver_of_a_worker_without_a_master(started: list[FakeSpark]) -> None:
    driver = DriverSession(None)
    driver.warm()
    assert driver.get("spark://m:7077").master == "spark://m:7077"
    assert [s.master for s in started] == [None, "spark://m:7077"] and started[0].stopped
    assert driver.get(None).master == "spark://m:7077"  # a task without the option shares it
    with pytest.raises(
        SparkMasterConflictError, match=r"asks for Spark master spark://other:7077.*runs on spark://m:7077"
    ):
        driver.get("spark://other:7077")


def test_a_worker_with_its_own_master_refuses_a_task_asking_for_another(started: list[FakeSpark]) -> None:
    driver = DriverSession("spark://m:7077")
    driver.warm()
    assert driver.get("spark://m:7077").master == "spark://m:7077"
    with pytest.raises(SparkMasterConflictError, match=r"start workers with\s+--spark-master spark://x:1"):
        driver.get("spark://x:1")
    assert len(started) == 1


def test_a_driver_in_use_keeps_its_master_after_it_died(started: list[FakeSpark]) -> None:
    driver = DriverSession(None)
    assert driver.get("spark://m:7077").master == "spark://m:7077"
    started[-1].stopped = True  # the JVM died
    assert driver.get(None).master == "spark://m:7077" and driver.restarts == 1
    with pytest.raises(SparkMasterConflictError):
        driver.get("local[2]")
