"""What only the Delta target does: every commit of a batch carries its transaction identity
(Delta's txnAppId/txnVersion), so a batch cut short and replayed lands each commit once, and a
zombie's commit to a table the newer execution wrote is skipped by Delta itself, fence or no
fence; and its compaction. Each test shows the identity matters by turning it off. Slow: every
statement is a Spark job."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from sluice.sync.targets import open_target
from sluice.sync.targets.delta import DeltaTarget
from sluice.test_switches import Switches
from tests.support.changes import event, records

pytestmark = pytest.mark.slow


@pytest.fixture
def lake(spark: Any, tmp_path: Path) -> str:
    return f"delta://{tmp_path / 'lake'}"


def versions(t: DeltaTarget, table: str) -> int:
    """How many commits a Delta table has."""
    return len(t.spark.sql(f"DESCRIBE HISTORY delta.`{t.root}/{table}`").collect())


@contextmanager
def no_identity(t: DeltaTarget) -> Iterator[None]:
    """The batch's commits without their transaction identity (what the tests show matters)."""

    @contextmanager
    def plain(app: str) -> Iterator[None]:
        yield

    t._txn = plain  # type: ignore[method-assign]
    try:
        yield
    finally:
        del t._txn


class Cut(Exception):
    pass


@pytest.mark.parametrize("identity", [True, False])
def test_a_batch_cut_before_its_offsets_lands_each_commit_once(lake: str, identity: bool) -> None:
    t = open_target(lake)
    assert isinstance(t, DeltaTarget)
    e = t.claim("p")
    t.apply("p", e, records([event("c", 1, 1, v="a"), event("c", 2, 2, v="b")]))
    batch = records([event("u", 3, 1, v="a2"), event("d", 4, 2)], start=2)

    def cut(*args: Any, **kwargs: Any) -> None:
        raise Cut("the worker died before the offsets' commit")

    t._write_offsets = cut  # type: ignore[method-assign]
    with pytest.raises(Cut):
        t.apply("p", e, batch)
    del t._write_offsets
    assert t.applied_offsets("p") == {("t", 0): 2}  # the rows' commit landed, the offsets' not
    landed = versions(t, "acct")

    replay = open_target(lake)  # a new execution of the same epoch reads the same offsets
    assert isinstance(replay, DeltaTarget)
    if identity:
        replay.apply("p", e, batch)
    else:
        with no_identity(replay):
            replay.apply("p", e, batch)
    assert replay.applied_offsets("p") == {("t", 0): 4}
    assert set(replay.read_rows("acct")) == {'{"id":1}'}
    assert replay.read_rows("acct")['{"id":1}']["v"] == "a2"
    if identity:
        assert versions(replay, "acct") == landed  # skipped by Delta: its identity was there
        assert replay.committed_version("acct", "p") == (e << 40) | 4
    else:
        assert versions(replay, "acct") == landed + 1  # written again (the guard kept it equal)


@pytest.mark.parametrize("identity", [True, False])
def test_a_zombies_commit_to_a_table_the_newer_execution_wrote_is_skipped(lake: str, identity: bool) -> None:
    """The target fence is off (as if the zombie read the fence before the newer execution took
    it): the zombie's rows are newer by source position than the table's, so only the
    transaction identity keeps them out."""
    zombie = open_target(lake, switches=Switches(disable_target_fence=True))
    assert isinstance(zombie, DeltaTarget)
    old = zombie.claim("p")
    zombie.apply("p", old, records([event("c", 1, 1, v="S1")]))
    heir = open_target(lake)
    new = heir.claim("p")
    heir.apply("p", new, records([event("u", 2, 1, v="S2")], start=1))
    late = records([event("u", 3, 1, v="zombie")], start=1)
    if identity:
        zombie.apply("p", old, late)
    else:
        with no_identity(zombie):
            zombie.apply("p", old, late)
    got = heir.read_rows("acct")['{"id":1}']["v"]
    assert got == ("S2" if identity else "zombie")
    assert heir.applied_offsets("p") == {("t", 0): 2}


def test_compaction_every_n_batches_keeps_rows_offsets_and_tombstones(lake: str) -> None:
    t = open_target(lake, optimize_every=3)
    assert isinstance(t, DeltaTarget)
    e = t.claim("p")
    for b in range(3):  # each batch five new rows and a delete of key 99 (absent: a tombstone)
        changes = [event("c", 10 * b + i, 10 * b + i, v=f"b{b}") for i in range(5)]
        t.apply("p", e, records([*changes, event("d", 10 * b + 9, 99)], start=6 * b))
    detail = t.spark.sql(f"DESCRIBE DETAIL delta.`{t.root}/acct`").collect()[0]
    assert detail["numFiles"] == 1  # three batches' files in one
    offsets = t.spark.read.format("delta").load(t._meta("p", "offsets")).collect()
    assert [(r.topic, r.partition, r.next_offset) for r in offsets] == [("t", 0, 18)]  # the newest only
    stones = t.spark.read.format("delta").load(t._meta("p", "tombstones")).collect()
    assert [(r.key, r.pos) for r in stones] == [('{"id":99}', 29)]  # the newest only
    assert t.applied_offsets("p") == {("t", 0): 18}
    assert len(t.read_rows("acct")) == 15
    t.apply("p", e, records([event("u", 100, 0, v="after"), event("c", 28, 99, v="older")], start=18))
    assert t.read_rows("acct")['{"id":0}']["v"] == "after"
    assert '{"id":99}' not in t.read_rows("acct")  # its tombstone (29) is newer than the change (28)
    assert t.applied_offsets("p") == {("t", 0): 20}


def test_a_failed_compaction_does_not_fail_the_batch_that_landed(
    lake: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    t = open_target(lake, optimize_every=1)
    assert isinstance(t, DeltaTarget)

    def broken(pipeline: str) -> None:
        raise RuntimeError("OPTIMIZE failed")

    monkeypatch.setattr(t, "compact", broken)
    e = t.claim("p")
    with caplog.at_level("WARNING", logger="sluice.target"):
        result = t.apply("p", e, records([event("c", 1, 1, v="S1")]))
    assert result.offsets == {"t": {0: 1}} and t.read_rows("acct")['{"id":1}']["v"] == "S1"
    assert "event=delta_compact_failed pipeline=p" in caplog.text
