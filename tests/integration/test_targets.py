"""Targets, each run against SQLite, a real PostgreSQL and a real MariaDB (the MySQL target):
fencing, the version guard, tombstones, replays, schema changes, column mapping and bad input."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.sync.envelope import BadEventError, ChangeEvent
from sluice.sync.targets import StaleEpochError, Target, open_target
from sluice.sync.targets.mapping import ColumnMapping, MappingError
from sluice.test_switches import Switches
from tests.support.changes import event, records


#: Delta: every statement is a Spark job (1-3 minutes a test here): in the slow suite
@pytest.fixture(params=["sqlite", "postgresql", "mysql", pytest.param("delta", marks=pytest.mark.slow)])
def target_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'target.db'}"
    if request.param == "delta":
        request.getfixturevalue("spark")  # the session with Delta's jars, made first
        return f"delta://{tmp_path / 'lake'}"
    return str(request.getfixturevalue("mysql_url" if request.param == "mysql" else "postgres_url"))


@pytest.fixture
def target(target_url: str) -> Iterator[Target]:
    t = open_target(target_url)
    yield t
    t.close()


def row(t: Target, key: int = 1, table: str = "acct") -> dict[str, object] | None:
    return t.read_rows(table).get(f'{{"id":{key}}}')


def test_version_guard_and_fence_a_replay_under_an_older_epoch(target: Target) -> None:
    s1, s2, s3 = (event("u" if i else "c", i + 1, 1, v=f"S{i + 1}") for i in range(3))
    old = target.claim("p")
    target.apply("p", old, records([s1], start=0))
    new = target.claim("p")  # a new execution takes the pipeline over
    assert new == old + 1
    target.apply("p", new, records([s2, s3], start=1))
    assert row(target)["v"] == "S3"  # type: ignore[index]

    with pytest.raises(StaleEpochError, match=f"epoch {old} is older than epoch {new}"):
        target.apply("p", old, records([s1, s2], start=3))
    assert row(target)["v"] == "S3"  # type: ignore[index]
    assert target.applied_offsets("p") == {("t", 0): 3}  # the rejected batch recorded nothing

    # The same old changes at new offsets under the current epoch (a source re-reading):
    # accepted, and the version guard keeps the row at S3.
    result = target.apply("p", new, records([s1, s2], start=3))
    assert (result.records, result.skipped, result.written) == (2, 0, 0)
    assert row(target)["v"] == "S3"  # type: ignore[index]
    with pytest.raises(StaleEpochError):
        target.claim("p", old)


def test_a_delete_leaves_a_tombstone_an_older_upsert_cannot_pass(target: Target) -> None:
    e = target.claim("p")
    target.apply("p", e, records([event("c", 1, v="a"), event("d", 3)]))
    assert row(target) is None
    target.apply("p", e, records([event("u", 2, v="older")], start=2))
    assert row(target) is None
    target.apply("p", e, records([event("c", 5, v="again")], start=3))
    assert row(target)["v"] == "again"  # type: ignore[index]


def test_a_replayed_batch_is_skipped_and_offsets_never_go_back(target: Target) -> None:
    e = target.claim("p")
    batch = records([event("c", i, i, v=i) for i in range(1, 6)], start=10)
    first = target.apply("p", e, batch)
    again = target.apply("p", e, batch)
    assert (first.skipped, first.written) == (0, 5)
    assert (again.skipped, again.written, again.records) == (5, 0, 5)
    older = target.apply("p", e, records([event("u", 9, 1, v="x")], start=3))
    assert older.skipped == 1 and row(target)["v"] == 1  # type: ignore[index]
    assert target.applied_offsets("p") == {("t", 0): 15}


def test_new_columns_are_added(target: Target) -> None:
    e = target.claim("p")
    target.apply("p", e, records([event("c", 1, 1, a=1)]))
    target.apply("p", e, records([event("c", 2, 2, a=2, b="new", c=1.5)], start=1))
    assert row(target, 2) == {"id": 2, "a": 2, "b": "new", "c": 1.5}
    assert row(target, 1) == {"id": 1, "a": 1, "b": None, "c": None}


def test_column_mapping_renames_drops_and_casts(target_url: str) -> None:
    mapping = ColumnMapping.from_config(
        {
            "acct": {
                "table": "accounts",
                "rename": {"v": "value"},
                "drop": ["secret"],
                "casts": {"n": "INTEGER"},
            }
        }
    )
    with open_target(target_url, mapping) as t:
        e = t.claim("p")
        t.apply("p", e, records([event("c", 1, 1, v="x", secret="s", n="42")]))
        rows = t.read_rows("acct")
    assert rows == {'{"id":1}': {"id": 1, "value": "x", "n": 42}}


def test_a_truncate_removes_older_rows_and_keeps_older_changes_out(target: Target) -> None:
    """A truncate at position 10 removes the rows older than it, and raises the table's
    watermark: an older change of any row that arrives later (another partition, a replay of
    the source) cannot bring one back; a newer row (from another partition, applied before the
    truncate arrived) stays, and newer changes land."""
    e = target.claim("p")
    target.apply("p", e, records([event("c", 1, 1, v="a"), event("c", 2, 2, v="b")]))
    target.apply("p", e, records([event("c", 12, 3, v="newer")], partition=1))
    result = target.apply("p", e, records([event("t", 10)], start=2))
    assert result.written == 2
    assert set(target.read_rows("acct")) == {'{"id":3}'}
    target.apply("p", e, records([event("u", 5, 1, v="old"), event("d", 6, 2)], start=1, partition=1))
    assert set(target.read_rows("acct")) == {'{"id":3}'}
    target.apply("p", e, records([event("c", 14, 1, v="after"), event("t", 9)], start=3))
    assert {k: r["v"] for k, r in target.read_rows("acct").items()} == {
        '{"id":1}': "after",
        '{"id":3}': "newer",
    }
    # a truncate and changes of the same table in one batch: the truncate goes first
    target.apply("p", e, records([event("u", 15, 1, v="gone"), event("c", 17, 4, v="kept"),
                                  event("t", 16)], start=5))  # fmt: skip
    assert {k: r["v"] for k, r in target.read_rows("acct").items()} == {'{"id":4}': "kept"}


def test_records_naming_sluice_tables_or_tables_outside_the_pipeline_are_refused(target_url: str) -> None:
    """An event must not rewrite the fence or the offsets (a table named _sluice_fence), nor any
    table the pipeline was not given: the batch is refused with the record named."""
    fence = event("c", 1, {"pipeline": "p"}, table="_sluice_fence", epoch=999)
    with open_target(target_url, tables=["acct"]) as t:
        e = t.claim("p")
        with pytest.raises(BadEventError, match=r"t\[0\]@1.*_sluice_fence.*Sluice's own"):
            t.apply("p", e, records([event("c", 1, v="a"), fence]))
        with pytest.raises(BadEventError, match=r"t\[0\]@1 changes table 'other'.*only acct"):
            t.apply("p", e, records([event("c", 1, v="a"), event("c", 2, table="other", v="x")]))
        assert t.read_rows("acct") == {} and t.applied_offsets("p") == {}
        assert t.current_epoch("p") == e
        t.apply("p", e, records([event("c", 1, v="a")]))
        assert row(t)["v"] == "a"  # type: ignore[index]
    with open_target(target_url) as t:  # no tables given: any table but Sluice's own
        with pytest.raises(BadEventError, match="_sluice_offsets"):
            t.apply("p", e, records([event("c", 3, {"pipeline": "p"}, table="_sluice_offsets")], start=1))
        t.apply("p", e, records([event("c", 4, table="other", v="x")], start=1))
        assert t.read_rows("other")


def test_a_tasks_apply_query_refuses_tables_outside_the_tasks_definition(tmp_path: Path) -> None:
    """The refusal above reaches a task's apply query: the query a worker builds for a task
    (`apply_config`) opens its target with the task's tables. Without that wiring the target
    would accept any table, and this test fails on the second apply."""
    from sluice.pipeline.apply import ApplyQuery
    from sluice.pipeline.execution import apply_config
    from sluice.sync.tasks import parse_spec

    spec = parse_spec(
        {"id": "wired", "source": {"kind": "mariadb", "host": "h", "port": 1, "user": "u", "database": "d"},
         "tables": ["acct"], "target": f"sqlite:///{tmp_path / 'wired.db'}"}
    )  # fmt: skip
    query = ApplyQuery(None, apply_config(spec, "127.0.0.1:1", 0, tmp_path))
    try:
        query.target.apply(query.pipeline, query.epoch, records([event("c", 1, v="a")]))
        with pytest.raises(BadEventError, match=r"changes table 'other'.*only acct"):
            query.target.apply(query.pipeline, query.epoch, records([event("c", 2, table="other")], start=1))
    finally:
        query.stop()


def test_a_key_with_nul_is_refused_by_postgresql_and_kept_by_sqlite(target_url: str) -> None:
    """PostgreSQL text cannot hold U+0000, and dropping it from a key would make 'a\\0b' and 'ab'
    one row: that batch is refused with the record named. SQLite and MySQL keep both rows."""
    with open_target(target_url) as t:
        e = t.claim("p")
        batch = records([event("c", 1, {"id": "a\x00b"}, v="nul"), event("c", 2, {"id": "ab"}, v="plain")])
        if target_url.startswith("postgresql"):
            with pytest.raises(BadEventError, match=r"t\[0\]@0 has U\+0000 in its primary key"):
                t.apply("p", e, batch)
            assert t.read_rows("acct") == {} and t.applied_offsets("p") == {}
        else:
            t.apply("p", e, batch)
            assert len(t.read_rows("acct")) == 2


def test_bytes_are_stored_as_bytes_and_text_as_text(target: Target) -> None:
    """The envelope's `binary` columns hold base64 text; the target stores the bytes (BLOB,
    bytea), so bytes that happen to be valid UTF-8 stay distinguishable from text."""
    import dataclasses

    e = target.claim("p")
    ev = event("c", 1, v="abc", b="YWJj")  # base64 of b"abc"
    target.apply("p", e, records([dataclasses.replace(ev, binary=("b",))]))
    got = row(target)
    assert got is not None and got["v"] == "abc" and bytes(got["b"]) == b"abc"  # type: ignore[arg-type]


def test_mapping_errors_name_the_field() -> None:
    with pytest.raises(MappingError, match=r"mapping\.acct\.table '_sluice_fence'.*Sluice's own"):
        ColumnMapping.from_config({"acct": {"table": "_sluice_fence"}})
    with pytest.raises(MappingError, match=r"mapping.acct: unknown field\(s\) renames"):
        ColumnMapping.from_config({"acct": {"renames": {}}})
    with pytest.raises(MappingError, match=r"mapping\.acct\.rename\.v"):
        ColumnMapping.from_config({"acct": {"rename": {"v": "bad name;"}}})
    with pytest.raises(MappingError, match=r"mapping\.acct\.casts\.n"):
        ColumnMapping.from_config({"acct": {"casts": {"n": "int; drop table x"}}})


def test_a_bad_record_rolls_back_the_batch_and_says_where(target: Target) -> None:
    e = target.claim("p")
    with pytest.raises(BadEventError, match=r"t\[0\]@1: record .* is not JSON|t\[0\]@1 is not JSON"):
        target.apply("p", e, records([event("c", 1, v="a"), b"{broken"]))
    assert target.read_rows("acct") == {}
    assert target.applied_offsets("p") == {}


def test_the_guard_tests_fail_with_the_guards_switched_off(target: Target, target_url: str) -> None:
    """The two guards are what keeps the row at S3: with each switched off, it is not."""
    e = target.claim("p")
    target.apply("p", e, records([event("c", 1, v="S1"), event("u", 3, v="S3")]))
    with open_target(target_url, switches=Switches(disable_version_guard=True)) as unguarded:
        unguarded.apply("p", e, records([event("u", 2, v="S2")], start=2))
    assert row(target)["v"] == "S2"  # type: ignore[index]
    newer = target.claim("p")
    with open_target(target_url, switches=Switches(disable_target_fence=True)) as unfenced:
        unfenced.apply("p", e, records([event("u", 9, v="zombie")], start=3))
    assert row(target)["v"] == "zombie" and newer > e  # type: ignore[index]


# --- whatever is replayed, the target ends equal to the source ----------------------------------

ops = st.lists(
    st.tuples(st.sampled_from("cudcudt"), st.integers(1, 4), st.integers(0, 9)), min_size=1, max_size=40
)


@pytest.mark.parametrize("kind", ["sqlite", "mysql"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=ops, cuts=st.lists(st.integers(1, 40), max_size=6), replays=st.lists(st.integers(0, 6), max_size=4)
)
def test_any_batching_and_replay_ends_equal_to_the_source(
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
    kind: str,
    ops: list[tuple[str, int, int]],
    cuts: list[int],
    replays: list[int],
) -> None:
    # The source: a row per key, changed in order; pos grows with every change.
    state: dict[int, int] = {}
    evs: list[ChangeEvent] = []
    for pos, (op, key, value) in enumerate(ops, start=1):
        if op == "t":
            state.clear()
            evs.append(event("t", pos))
        elif op == "d" and key in state:
            del state[key]
            evs.append(event("d", pos, key))
        elif op != "d":
            state[key] = value
            evs.append(event("u" if key in state else "c", pos, key, v=value))
    # Two partitions by key, as the producer's partitioner would (a truncate goes to both);
    # each cut into batches.
    batches = []
    for p in (0, 1):
        mine = [ev for ev in evs if ev.op == "t" or ev.key["id"] % 2 == p]
        bounds = sorted({0, len(mine), *(c for c in cuts if c < len(mine))})
        for lo, hi in itertools.pairwise(bounds):
            batches.append(records(mine[lo:hi], start=lo, partition=p))
    # Replays: after batch i, an already applied batch (j <= i) is applied again, as Spark
    # does with the last batch when the driver died after the target committed.
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('prop') / 't.db'}"
    else:  # a database of its own per example, on the session's MariaDB
        url = str(request.getfixturevalue("mysql_url"))
        url = url.rsplit("/", 1)[0] + "/" + _new_database(request, url)
    with open_target(url) as t:
        e = t.claim("p")
        for i, b in enumerate(batches):
            t.apply("p", e, b)
            for r in replays:
                if r == i % 7:
                    t.apply("p", e, batches[r % (i + 1)])
        got = {int(k.split(":")[1].rstrip("}")): r["v"] for k, r in t.read_rows("acct").items()}
    assert got == state


_examples = itertools.count()


def _new_database(request: pytest.FixtureRequest, url: str) -> str:
    name = f"{url.rsplit('/', 1)[1]}_{next(_examples)}"
    request.getfixturevalue("mariadb").execute(f"CREATE DATABASE {name}")
    return name
