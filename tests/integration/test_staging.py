"""Batches staged by the executors and committed by the driver (sync/targets/staging.py): on a
real PostgreSQL and MariaDB the same outcome as the driver path under a seeded randomized
workload; on
PostgreSQL and on MariaDB as a MySQL target, staged rows that must never be merged (a failed task
attempt's, a zombie execution's, a batch whose staging was lost) never are, and are gone after
the next commit. MySQL's randomized workload is test_mysql_staging.py.

The executors' side runs in this process (tests/support/staging.py), the same function Spark's
read tasks run; the Spark-level kills are in test_pipeline.py and test_spark_standalone.py.
"""

from __future__ import annotations

import base64
import random
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

from sluice.sync.envelope import BadEventError, ChangeEvent, key_text
from sluice.sync.targets import StaleEpochError, Target, open_target
from sluice.sync.targets.base import Refusal
from sluice.sync.targets.staging import (
    StageSpec,
    StagingLostError,
    parse_staging_table,
    stage_changes,
    staging_table,
)
from tests.support.changes import event, records
from tests.support.staging import apply_staged, batches_of, execute, stage, staged


@pytest.fixture(params=["postgresql", "mysql"])
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    """A PostgreSQL target, and a MySQL/MariaDB one: both stage in the executors."""
    t = open_target(request.getfixturevalue("mysql_url" if request.param == "mysql" else "postgres_url"))
    yield t
    t.close()


@pytest.fixture
def pg_target(postgres_url: str) -> Iterator[Target]:
    t = open_target(postgres_url)
    yield t
    t.close()


def value(t: Target, key: int = 1, table: str = "acct") -> Any:
    row = t.read_rows(table).get(f'{{"id":{key}}}')
    return None if row is None else row["v"]


# --- the same outcome as the driver path --------------------------------------------------------

TEXTS = ["plain", "tab\there", "line\nbreak", "back\\slash", "nul\x00inside", "é ü 漢", "", "\\N", "'q\""]


def random_image(
    rng: random.Random, table: str, key: dict[str, Any]
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A row image of `table` with every kind of value its columns hold (and nulls)."""

    def maybe(v: Any) -> Any:
        return None if rng.random() < 0.1 else v

    if table == "acct":
        return {
            **key,
            "n": maybe(rng.randint(-(2**62), 2**62)),
            "f": maybe(rng.choice([0.5, -1.25e10, 3.0e-7, 1.0])),
            "s": maybe(rng.choice(TEXTS)),
            "b": maybe(rng.random() < 0.5),
            "j": maybe(rng.choice([{"a": [1, 2, {"b": None}]}, {"x": "y\tz"}, {}])),
        }, ()
    if table == "inv":
        return {**key, "qty": maybe(rng.randint(0, 10_000)), "note": maybe(rng.choice(TEXTS))}, ()
    data = bytes(rng.randrange(256) for _ in range(rng.randint(0, 24)))
    return {**key, "data": base64.b64encode(data).decode()}, ("data",)


def random_log(seed: int, count: int) -> list[list[ChangeEvent]]:
    """Changes of three tables (inserts, updates, deletes, snapshot reads, truncates) in two
    partitions by key, as a capture produces them; positions grow with every change."""
    rng = random.Random(seed)
    parts: list[list[ChangeEvent]] = [[], []]
    keys = {
        "acct": [{"id": i} for i in range(1, 40)],
        "inv": [{"sku": f"s-{i % 7}", "wh": i % 3} for i in range(30)],
        "blob": [{"id": i} for i in range(1, 10)],
    }
    live: dict[tuple[str, str], bool] = {}
    for pos in range(1, count + 1):
        table = rng.choice(["acct", "acct", "inv", "blob"])
        if rng.random() < 0.01:
            ev = event("t", pos, table=table)
            parts[rng.randrange(2)].append(ev)  # one copy, in one partition
            for k in [k for k in live if k[0] == table]:
                del live[k]
            continue
        key = rng.choice(keys[table])
        there = live.get((table, key_text(key)), False)
        op = rng.choice(["u", "u", "d"]) if there else rng.choice(["c", "r"])
        after, binary = (None, ()) if op == "d" else random_image(rng, table, key)
        ev = ChangeEvent(op, table, key, None, after, pos, 1_700_000_000_000 + pos, binary=binary)
        live[(table, key_text(key))] = op != "d"
        parts[zlib.crc32(key_text(key).encode()) % 2].append(ev)
    return parts


@pytest.mark.parametrize("kind", ["postgresql", "mysql"])
@pytest.mark.parametrize("seed", [1, 2])
def test_staged_batches_end_equal_to_the_driver_path(
    request: pytest.FixtureRequest, seed: int, kind: str
) -> None:
    """Changes of a source that names no types (the targets infer them), staged and not."""
    rng = random.Random(seed)
    parts = random_log(seed, 3_000)
    if kind == "postgresql":
        postgres = request.getfixturevalue("postgres")
        driver_url = postgres.create_database(f"staged_driver_{seed}")
        staged_url = postgres.create_database(f"staged_exec_{seed}")
    else:
        mariadb = request.getfixturevalue("mariadb")
        for name in (f"staged_driver_{seed}", f"staged_exec_{seed}"):
            mariadb.execute(f"DROP DATABASE IF EXISTS {name}", f"CREATE DATABASE {name}")
        driver_url, staged_url = (
            f"mysql://root@127.0.0.1:{mariadb.port}/staged_{w}_{seed}" for w in ("driver", "exec")
        )
    batches = batches_of(parts, rng)
    with open_target(driver_url) as by_driver, open_target(staged_url) as by_executors:
        e1, e2 = by_driver.claim("p"), by_executors.claim("p")
        replays = 0
        for i, batch in enumerate(batches):
            want = by_driver.apply("p", e1, batch)
            got = apply_staged(by_executors, "p", e2, batch)
            assert (got.records, got.skipped, got.offsets) == (want.records, want.skipped, want.offsets)
            if i == len(batches) // 2 or rng.random() < 0.2:  # run again after a crash: no change
                again = apply_staged(by_executors, "p", e2, batches[rng.randint(0, i)])
                assert again.skipped == again.records and again.written == 0
                replays += 1
        assert replays > 0
        for table in ("acct", "inv", "blob"):
            rows = by_executors.read_rows(table)
            assert rows == by_driver.read_rows(table), table
            assert rows, table
        assert staged(staged_url) == {staging_table("p", e2): 0}  # emptied after every commit
        if kind == "mysql":  # acct's rows hold JSON objects: from the driver; the others in SQL
            merges = by_executors.merges  # type: ignore[attr-defined]
            assert merges["sql"] > merges["not-plain"] > 0 and merges["sql-rows"] > 0, merges


# --- staged rows that must never be merged -----------------------------------------------------


def test_a_failed_task_attempts_rows_are_never_merged_and_are_dropped(target: Target) -> None:
    epoch = target.claim("p")
    table = target.prepare_staging("p", epoch)
    # A task attempt staged and committed its COPY, then died before Spark had its result.
    lost = stage(target.url, table, records([event("c", 5, 1, v="from a dead attempt")]))
    # Its retry stages the same records under a new token; only that token is in the summaries.
    kept = stage(target.url, table, records([event("c", 5, 1, v="S5")]))
    assert set(lost["token"].to_pylist()).isdisjoint(kept["token"].to_pylist())
    result = target.apply_staged("p", epoch, 1, kept)
    assert (result.records, result.changes) == (1, 1)
    assert value(target) == "S5"
    assert staged(target.url) == {table: 0}


def test_an_earlier_batchs_leftover_rows_are_never_merged(target: Target) -> None:
    epoch = target.claim("p")
    table = target.prepare_staging("p", epoch)
    # A task of batch 1 committed its COPY after batch 1's commit emptied the table (its attempt
    # had been given up on): its rows sit there while batch 2 stages and commits.
    apply_staged(target, "p", epoch, records([event("c", 1, 1, v="S1")]), batch=1)
    late = stage(target.url, table, records([event("c", 9, 7, v="late attempt")], start=5))
    result = apply_staged(target, "p", epoch, records([event("u", 2, 1, v="S2")], start=1), batch=2)
    assert (result.records, result.changes) == (1, 1)
    assert value(target) == "S2" and value(target, 7) is None
    assert late.num_rows and staged(target.url) == {table: 0}


def test_a_zombie_executions_staging_is_never_merged_and_its_commit_is_fenced(target: Target) -> None:
    old = target.claim("p")
    zombie_table = target.prepare_staging("p", old)
    zombie = stage(target.url, zombie_table, records([event("c", 9, 1, v="zombie")]))
    new = target.claim("p")  # a new execution takes the pipeline over
    apply_staged(target, "p", new, records([event("c", 3, 1, v="S3")], start=0))
    new_table = staging_table("p", new)
    assert staged(target.url) == {new_table: 0}  # the zombie's table went when the new one started
    with pytest.raises(StaleEpochError):
        target.apply_staged("p", old, 7, zombie)
    assert value(target) == "S3"
    # The zombie starts again and stages after that: never read; the next execution drops it.
    target.prepare_staging("p", old)
    stage(target.url, zombie_table, records([event("c", 9, 1, v="zombie again")]))
    apply_staged(target, "p", new, records([event("u", 4, 1, v="S4")], start=1))
    assert value(target) == "S4"
    assert staged(target.url) == {new_table: 0, zombie_table: 1}
    newer = target.claim("p")
    target.prepare_staging("p", newer)
    assert staged(target.url) == {staging_table("p", newer): 0}
    assert target.drop_staging("p", newer) == [staging_table("p", newer)]  # as the query's stop
    assert staged(target.url) == {}


def test_a_batch_whose_staged_rows_are_gone_commits_nothing(target: Target) -> None:
    epoch = target.claim("p")
    apply_staged(target, "p", epoch, records([event("c", 1, 1, v="S1")]))
    offsets = target.applied_offsets("p")
    table = staging_table("p", epoch)
    summaries = stage(
        target.url, table, records([event("u", 2, 1, v="S2"), event("c", 3, 2, v="x")], start=1)
    )
    execute(target.url, f"DELETE FROM {table} WHERE pos = 3")  # as a restart empties UNLOGGED tables
    with pytest.raises(StagingLostError, match="not all there"):
        target.apply_staged("p", epoch, 50, summaries)
    assert target.applied_offsets("p") == offsets
    assert value(target) == "S1" and value(target, 2) is None
    # Run again (Spark's replay of the batch, same id), it is staged anew and commits.
    again = records([event("u", 2, 1, v="S2"), event("c", 3, 2, v="x")], start=1)
    apply_staged(target, "p", epoch, again, batch=50)
    assert value(target) == "S2" and value(target, 2) == "x"
    assert staged(target.url) == {table: 0}


def test_a_staged_key_with_nul_is_refused_and_nul_in_values_dropped(pg_target: Target) -> None:
    """PostgreSQL's text cannot hold U+0000 (MySQL's can: test_mysql_staging.py)."""
    target = pg_target
    epoch = target.claim("p")
    apply_staged(target, "p", epoch, records([event("c", 1, 1, v="a\x00b")]))
    assert value(target) == "ab"
    with pytest.raises(BadEventError, match="U\\+0000 in its primary key"):
        apply_staged(target, "p", epoch, records([event("c", 2, {"id": "k\x00"}, v="x")], start=1))
    assert target.applied_offsets("p") == {("t", 0): 1}


def test_refused_staged_changes_go_to_the_sink_and_the_rest_commits(target: Target) -> None:
    epoch = target.claim("p")
    apply_staged(target, "p", epoch, records([event("c", 1, 1, v=1)]))  # v is a bigint column
    refused: list[Refusal] = []
    result = apply_staged(
        target,
        "p",
        epoch,
        records([event("c", 2, 2, v=2), event("c", 3, 3, v="three")], start=1),
        refused.extend,
    )
    assert [r.change["key"] for r in refused] == ['{"id":3}']
    assert (result.refused, value(target, 2), value(target, 3)) == (1, 2, None)
    assert target.applied_offsets("p") == {("t", 0): 3}


def test_staging_names_are_per_pipeline_and_epoch() -> None:
    names = {staging_table(p, e) for p in ("a", "b") for e in (1, 2)}
    assert len(names) == 4 and all(len(n) < 64 for n in names)
    assert len(staging_table("x" * 500, 10**12)) < 64
    assert parse_staging_table(staging_table("a", 12), "a") == 12
    assert parse_staging_table(staging_table("a", 12) + "_7", "a") == 12  # an earlier version's
    assert parse_staging_table(staging_table("a", 12), "b") is None
    spec = StageSpec("postgresql://u@h/db", "t", password="secret")
    assert "secret" not in repr(spec)
    assert StageSpec.from_options(spec.options()) == spec
    assert StageSpec.from_options({"decode": "envelope"}) is None
    with pytest.raises(ValueError, match="both"):
        StageSpec.from_options({"stage.url": "postgresql://u@h/db"})
    assert callable(stage_changes(StageSpec("postgresql://u@h/db", "t")))
