"""bench/e2e.py's pure parts (issue 36): the seeded fault schedule both stacks get, and the
percentile its freshness figures use. The benchmark is a script; it is loaded from its file with
bench/ on the path, as ``python bench/e2e.py`` runs it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
_spec = importlib.util.spec_from_file_location("bench_e2e", BENCH / "e2e.py")
assert _spec is not None and _spec.loader is not None
e2e = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = e2e
_spec.loader.exec_module(e2e)


def test_the_fault_schedule_is_seeded_takes_each_kind_once_and_fits_the_run() -> None:
    one = e2e.fault_schedule(1, 120.0)
    assert one == e2e.fault_schedule(1, 120.0)  # both stacks get the same faults at the same times
    assert sorted(kind for _, kind in one) == sorted(e2e.FAULT_KINDS)
    times = [at for at, _ in one]
    assert times == sorted(times) and times[0] > 0 and times[-1] < 120.0
    seeds = {tuple(e2e.fault_schedule(seed, 120.0)) for seed in range(1, 6)}
    assert len(seeds) == 5


def test_a_percentile_of_no_values_is_nan_and_p99_of_a_hundred_is_the_largest_but_one() -> None:
    assert e2e.pct([], 0.99) != e2e.pct([], 0.99)  # NaN
    values = [float(v) for v in range(1, 101)]
    assert e2e.pct(values, 0.99) == 100.0 and e2e.pct(values, 0.5) == 51.0


def test_seed_zero_is_the_control_without_faults() -> None:
    assert e2e.fault_schedule(0, 120.0) == []


def test_the_columns_that_differ_are_counted_per_table_and_column_most_first() -> None:
    from sluice.sync.compare import TableComparison, TargetComparison

    comparison = TargetComparison(
        "t",
        [
            TableComparison("typed", different=[("1", [("c_time", "a", "b"), ("c_bit", "1", "0")]),
                                                ("2", [("c_time", "c", "d")])]),
            TableComparison("items", missing=["3"]),
        ],
    )  # fmt: skip
    assert e2e.different_columns(comparison) == {"typed.c_time": 2, "typed.c_bit": 1}


def test_the_chaos_workloads_types_are_checked_by_name() -> None:
    args = e2e.parse_args(["--faults", "--types", "bit64,time6"])
    assert args.type_list == ("bit64", "time6") and args.workload == "chaos"
    assert e2e.parse_args(["--faults"]).type_list == e2e.TYPE_NAMES
    try:
        e2e.parse_args(["--faults", "--types", "nonsense"])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("an unknown type was taken")


def test_the_jdbc_sink_runs_with_debeziums_defaults_unless_the_tuned_variant_is_asked_for() -> None:
    plain = e2e.sink_config(e2e.parse_args([]), 5432, "src", "dst", ("events", "fresh"), "e2e")
    assert plain["connection.url"] == "jdbc:postgresql://127.0.0.1:5432/dst"
    assert plain["batch.size"] == "500" and "consumer.override.max.poll.records" not in plain
    assert plain["topics.regex"] == r"e2e\.src\.(events|fresh)"
    tuned = e2e.sink_config(
        e2e.parse_args(["--sink-batch-size", "5000", "--sink-rewrite-batched"]), 5432, "src", "dst",
        ("events",), "e2e",
    )  # fmt: skip
    assert tuned["connection.url"].endswith("/dst?reWriteBatchedInserts=true")
    assert tuned["batch.size"] == "5000" and tuned["consumer.override.max.poll.records"] == "5000"
