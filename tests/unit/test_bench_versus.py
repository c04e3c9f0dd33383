"""bench/versus.py: how the side-by-side benchmarks (issue 20) order the systems and print each
figure with its ratio. The benchmarks are scripts, not a package: the module is loaded from its
file, as ``python bench/produce.py`` finds it."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


versus = _load("versus")


def test_against_accepts_sluice_and_kafka_once_each() -> None:
    assert versus.parse_against("sluice") == ["sluice"]
    assert versus.parse_against(" sluice , kafka ") == ["sluice", "kafka"]
    for bad in ("", "redpanda", "sluice,sluice", "sluice,kafka,pulsar"):
        with pytest.raises(ValueError, match="--against takes sluice and/or kafka"):
            versus.parse_against(bad)


def test_first_system_alternates_from_round_to_round() -> None:
    assert versus.round_orders(["sluice", "kafka"], 3) == [
        ["sluice", "kafka"],
        ["kafka", "sluice"],
        ["sluice", "kafka"],
    ]
    assert versus.round_orders(["sluice"], 2) == [["sluice"], ["sluice"]]
    with pytest.raises(ValueError):
        versus.round_orders(["sluice"], 0)


def test_figures_are_medians_of_the_rounds_and_the_ratio_is_of_the_medians() -> None:
    rounds = [
        {"client_mb_s": {"sluice": 100.0, "kafka": 50.0}, "only_sluice": {"sluice": 1.0}},
        {"client_mb_s": {"sluice": 140.0, "kafka": 100.0}},
        {"client_mb_s": {"sluice": 120.0, "kafka": 200.0}},
    ]
    assert versus.median_figures(rounds) == [("client_mb_s", 120.0, 100.0)]
    assert versus.ratios_json(versus.median_figures(rounds)) == {"client_mb_s": 1.2}


def test_a_round_without_a_figure_does_not_count_as_zero() -> None:
    nan = float("nan")
    rounds = [{"p99_ms": {"sluice": 4.0, "kafka": nan}}, {"p99_ms": {"sluice": 6.0, "kafka": 8.0}}]
    assert versus.median_figures(rounds) == [("p99_ms", 5.0, 8.0)]
    assert math.isnan(versus.median([nan, nan]))


def test_each_figure_prints_both_values_then_its_ratio_in_the_issues_format() -> None:
    assert versus.figure_lines("client_mb_s", 131.24, 117.0) == [
        "client_mb_s sluice=131.2 kafka=117.0",
        "client_mb_s ratio sluice/kafka=1.12",
    ]
    assert versus.figure_lines("kill9_first_ack_s", 6.5, 6.25, digits=2)[0] == (
        "kill9_first_ack_s sluice=6.50 kafka=6.25"
    )
    assert versus.figure_lines("x", 1.0, 0.0)[1] == "x ratio sluice/kafka=nan"
    assert versus.ratios_json([("x", 1.0, 0.0)]) == {}


def test_the_whole_pipelines_figures_name_debezium_as_the_peer() -> None:
    assert versus.figure_lines("backlog_rows_s", 30000.0, 20000.0, digits=0, peer="debezium") == [
        "backlog_rows_s sluice=30000 debezium=20000",
        "backlog_rows_s ratio sluice/debezium=1.50",
    ]


def test_the_json_line_has_no_infinity_a_figure_that_never_came_is_null() -> None:
    assert versus.finite({"p99": float("inf"), "p50": [float("nan"), 1.0]}) == {
        "p99": None,
        "p50": [None, 1.0],
    }


def test_a_printed_figure_reads_back_as_a_number_per_broker_values_averaged() -> None:
    assert versus.figure_value("3.20") == 3.2
    assert versus.figure_value("b1:1.0,b2:3.0,b3:2.0") == 2.0
    for missing in ("timeout", "-", None, "b1:?"):
        assert math.isnan(versus.figure_value(missing))


def test_the_json_line_carries_null_for_a_figure_not_measured() -> None:
    nan = float("nan")
    assert versus.finite({"p99_ms": nan, "runs": [{"x": nan, "y": 1.5}], "n": 3}) == {
        "p99_ms": None,
        "runs": [{"x": None, "y": 1.5}],
        "n": 3,
    }
