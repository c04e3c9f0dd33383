"""Dead letters (`on_refused: dlq`), against SQLite and a real PostgreSQL: a change the target
refuses goes to the task's dead-letter topic with its coordinates and error and the rest of the
batch commits; with `stop` the batch commits nothing; a dead letter that cannot be produced
commits nothing; `sluice dlq replay` applies them after a fix, once, and never over newer rows."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from sluice.pipeline.execution import ensure_topics
from sluice.sync import dead_letters
from sluice.sync.dead_letters import DeadLetterWriter, dedupe, read_entries, replay
from sluice.sync.targets import Target, open_target
from sluice.sync.targets.base import Refusal
from tests.integration import test_targets
from tests.support.changes import event, records
from tests.support.cluster import TestCluster

#: each target test runs against SQLite, a real PostgreSQL and a real MariaDB (Delta has no
#: savepoints to isolate a refused row: it takes no dead letters)
target = test_targets.target


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def target_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'target.db'}"
    return str(request.getfixturevalue("mysql_url" if request.param == "mysql" else "postgres_url"))


TASK = "shop"
TOPIC = dead_letters.dead_letter_topic(TASK)


def execute(t: Target, sql: str) -> None:
    """DDL on the target outside the pipeline (what a DBA does)."""
    if t.url.startswith("mysql"):
        with t.conn.cursor() as cur:  # type: ignore[attr-defined]
            cur.execute(sql)
    else:
        t.conn.execute(sql)  # type: ignore[attr-defined]
    if not t.url.startswith("sqlite"):
        t.conn.commit()  # type: ignore[attr-defined]


def make_table(t: Target) -> None:
    """acct(id, qty, note): qty must be a non-negative integer, note must not be null."""
    strict = " STRICT" if t.url.startswith("sqlite") else ""
    execute(
        t,
        "CREATE TABLE acct (id INTEGER PRIMARY KEY, qty INTEGER CHECK (qty >= 0), note TEXT NOT NULL, "
        f"_sluice_pos INTEGER NOT NULL){strict}",
    )


def rows(t: Target) -> dict[int, dict[str, Any]]:
    return {int(orjson.loads(k)["id"]): v for k, v in t.read_rows("acct").items()}


def bad_batch() -> list[Any]:
    """Ten inserts; id 4 breaks the CHECK, id 7 holds text for the integer column, id 9 is
    changed twice in the batch (its newest change breaks NOT NULL)."""
    evs = []
    for i in range(1, 11):
        qty: Any = -1 if i == 4 else "many" if i == 7 else i
        evs.append(event("c", i, i, qty=qty, note=f"n{i}"))
    evs.append(event("u", 20, 9, qty=9, note=None))  # offset 10: the newest change of id 9
    return evs


def test_refused_changes_go_to_the_sink_and_the_rest_commits(target: Target) -> None:
    make_table(target)
    epoch = target.claim(TASK)
    got: list[Refusal] = []
    result = target.apply(TASK, epoch, records(bad_batch(), topic="shop.changes"), on_refused=got.extend)
    assert sorted(rows(target)) == [1, 2, 3, 5, 6, 8, 10]
    assert (result.records, result.changes, result.refused) == (11, 10, 3)
    refused = {int(orjson.loads(r.change["key"])["id"]): r for r in got}
    assert sorted(refused) == [4, 7, 9]
    assert re.search("check|constraint", refused[4].error.lower())
    assert refused[7].error  # SQLite STRICT: cannot store TEXT; PostgreSQL: invalid input syntax
    assert "null" in refused[9].error.lower()
    nine = refused[9].change
    # the newest change of id 9, where it sits in the log, standing for both of its records
    assert (nine["topic"], nine["partition"], nine["offset"], nine["pos"], nine["records"]) == (
        "shop.changes", 0, 10, 20, 2,
    )  # fmt: skip
    assert target.applied_offsets(TASK) == {("shop.changes", 0): 11}


def test_on_refused_stop_fails_the_batch_and_commits_nothing(target: Target) -> None:
    make_table(target)
    epoch = target.claim(TASK)
    with pytest.raises(Exception, match=r"(?i)check|constraint|null|integer|text"):
        target.apply(TASK, epoch, records(bad_batch(), topic="shop.changes"))
    assert rows(target) == {}
    assert target.applied_offsets(TASK) == {}


def test_a_sink_that_fails_commits_nothing(target: Target) -> None:
    make_table(target)
    epoch = target.claim(TASK)

    def unacknowledged(refused: list[Refusal]) -> None:
        raise dead_letters.DeadLetterError("not acknowledged")

    with pytest.raises(dead_letters.DeadLetterError):
        target.apply(TASK, epoch, records(bad_batch(), topic="shop.changes"), on_refused=unacknowledged)
    assert rows(target) == {}
    assert target.applied_offsets(TASK) == {}


def test_errors_that_are_not_refusals_still_fail_the_batch(target: Target) -> None:
    # No primary key: the upsert cannot work for any row. That is the target's setup, not one
    # row's fault: the batch fails rather than dead-lettering every row.
    execute(target, "CREATE TABLE acct (id INTEGER, qty INTEGER, note TEXT, _sluice_pos INTEGER NOT NULL)")
    epoch = target.claim(TASK)
    got: list[Refusal] = []
    with pytest.raises(Exception, match=r"(?i)primary key|unique"):
        target.apply(TASK, epoch, records([event("c", 1, 1, qty=1, note="a")]), on_refused=got.extend)
    assert got == [] and target.applied_offsets(TASK) == {}


def test_mapping_errors_are_refusals(target_url: str) -> None:
    """A column name the mapping cannot use, and (PostgreSQL) a cast that fails, refuse that row."""
    from sluice.sync.targets.mapping import ColumnMapping

    mapping = ColumnMapping.from_config({"acct": {"casts": {"qty": "integer"}}})
    with open_target(target_url, mapping) as t:
        evs = [event("c", 1, 1, qty="1"), event("c", 2, 2, qty="2", **{"bad col": 1})]
        if not t.url.startswith("sqlite"):  # SQLite's CAST never fails: '12x' is 12
            evs.append(event("c", 3, 3, qty="12x"))
        got: list[Refusal] = []
        t.apply(TASK, t.claim(TASK), records(evs), on_refused=got.extend)
        assert sorted(rows(t)) == [1]
        errors = {int(orjson.loads(r.change["key"])["id"]): r.error for r in got}
        assert "MappingError" in errors[2] and "bad col" in errors[2]
        assert sorted(errors) == ([2] if t.url.startswith("sqlite") else [2, 3])


def test_on_refused_is_validated_and_names_the_dead_letter_topic() -> None:
    from sluice.sync.tasks import TaskSpecError, parse_spec

    spec = parse_spec(spec_doc("sqlite:///x.db"))
    assert (spec.options["on_refused"], spec.dlq_topic()) == ("dlq", TOPIC)
    with pytest.raises(
        TaskSpecError, match=r"task\.options\.on_refused: must be one of stop, dlq, not 'skip'"
    ):
        parse_spec({**spec_doc("sqlite:///x.db"), "options": {"on_refused": "skip"}})


# --- through the log -------------------------------------------------------------------------------


@pytest.fixture
def dlq(cluster: TestCluster) -> Iterator[DeadLetterWriter]:
    ensure_topics(
        cluster.bootstrap, [TOPIC], dead_letters.DEAD_LETTER_PARTITIONS, 1,
        config=dead_letters.DEAD_LETTER_TOPIC_CONFIG,
    )  # fmt: skip
    writer = DeadLetterWriter(cluster.bootstrap, TOPIC, TASK)
    yield writer
    writer.close()


def topic_config(cluster: TestCluster, topic: str) -> dict[str, str]:
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    (future,) = admin.describe_configs([ConfigResource("topic", topic)]).values()
    return {name: entry.value for name, entry in future.result(timeout=30).items()}


def test_dead_letters_are_kept_replayed_once_and_never_over_newer_rows(
    target: Target, dlq: DeadLetterWriter, cluster: TestCluster
) -> None:
    make_table(target)
    epoch = target.claim(TASK)
    batch = records(bad_batch(), topic="shop.changes")

    # A crash after the dead letters were produced and before the commit: the batch is applied
    # again and its dead letters produced again; readers see each refused change once.
    def crash(refused: list[Refusal]) -> None:
        dlq.sink(TASK, epoch, "x1")(refused)
        raise RuntimeError("killed before the commit")

    with pytest.raises(RuntimeError):
        target.apply(TASK, epoch, batch, on_refused=crash)
    sink = dlq.sink(TASK, epoch, "x2")
    target.apply(TASK, epoch, batch, on_refused=sink)
    assert len(sink.letters) == 3
    entries = read_entries(cluster.bootstrap, TOPIC)
    assert len(entries) == 6
    assert topic_config(cluster, TOPIC)["retention.ms"] == "-1"  # dead letters never expire
    entries = dedupe(entries)
    by_id = {int(orjson.loads(e.letter.key)["id"]): e.letter for e in entries}
    assert sorted(by_id) == [4, 7, 9]
    nine = by_id[9].to_doc()
    assert nine["source"] == {"topic": "shop.changes", "partition": 0, "offset": 10}
    assert (nine["task"], nine["pipeline"], nine["op"], nine["pos"], nine["records"], nine["epoch"]) == (
        TASK, TASK, "u", 20, 2, epoch,
    )  # fmt: skip
    assert nine["key"] == {"id": 9} and nine["after"]["note"] is None and "null" in nine["error"].lower()

    # Newer data for id 4 arrives (and is applied) before the dead letters are replayed.
    target.apply(
        TASK, epoch, records([event("u", 30, 4, qty=40, note="newer")], topic="shop.changes", start=11)
    )

    # Fixed for the CHECK and NOT NULL, not for the text: id 7 is refused again.
    if target.url.startswith("sqlite"):
        execute(target, "ALTER TABLE acct RENAME TO acct_old")
        execute(target, "CREATE TABLE acct (id INTEGER PRIMARY KEY, qty INTEGER, note TEXT, "
                        "_sluice_pos INTEGER NOT NULL) STRICT")  # fmt: skip
        execute(target, "INSERT INTO acct SELECT * FROM acct_old")
    elif target.url.startswith("mysql"):
        execute(
            target, "ALTER TABLE acct MODIFY COLUMN qty INTEGER, MODIFY COLUMN note TEXT NULL"
        )  # a column CHECK goes with its definition
    else:
        execute(target, "ALTER TABLE acct DROP CONSTRAINT acct_qty_check, ALTER COLUMN note DROP NOT NULL")
    first = replay(target, entries, TOPIC, dlq, "r1")
    assert (first.replayed, first.refused_again, first.skipped) == (2, 1, 0)
    now = rows(target)
    assert now[4]["qty"] == 40 and now[4]["note"] == "newer"  # the version guard kept the newer row
    assert now[9]["qty"] == 9 and now[9]["note"] is None
    assert 7 not in now

    # The one refused again is in the topic again, with its new error, and is the only one left.
    again = dedupe(read_entries(cluster.bootstrap, TOPIC))
    assert len(again) == 3
    seven = next(e for e in again if e.letter.key == '{"id":7}').letter
    assert (seven.pipeline, seven.execution) == (dead_letters.replay_pipeline(TASK), "r1")
    assert (seven.source_offset, seven.records) == (6, 1) and "integer" in seven.error.lower()
    second = replay(target, again, TOPIC, dlq, "r2")
    assert (second.replayed, second.refused_again, second.skipped) == (0, 1, 2)
    assert rows(target) == now


def test_apply_query_stops_or_dead_letters_and_the_execution_raises_the_alarm(
    spark: Any, cluster: TestCluster, dlq: DeadLetterWriter, tmp_path: Path
) -> None:
    from confluent_kafka import Producer

    from sluice import metrics
    from sluice.cluster.zkstore import ZkStore
    from sluice.pipeline.apply import ApplyConfig, ApplyQuery
    from sluice.pipeline.execution import TaskExecution
    from sluice.sync.tasks import TaskStore, parse_spec

    ensure_topics(cluster.bootstrap, ["shop.changes"], 1, 1)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "log_level": 0})
    for e in bad_batch():
        producer.produce("shop.changes", e.to_json(), e.record_key())
    assert producer.flush(30) == 0
    url, stop_url = f"sqlite:///{tmp_path / 'target.db'}", f"sqlite:///{tmp_path / 'stop.db'}"
    for each in (url, stop_url):
        with open_target(each) as t:
            make_table(t)

    # on_refused: stop (the default): the batch commits nothing and the query stops.
    stop_config = ApplyConfig(
        bootstrap=cluster.bootstrap,
        target=stop_url,
        topics=["shop.changes"],
        pipeline=TASK,
        available_now=True,
    )
    stopping = ApplyQuery(spark, stop_config)
    stopping.start()
    with pytest.raises(Exception, match=r"(?i)check|constraint|null|integer|text"):
        stopping.await_termination(120)
    stopping.stop()
    with open_target(stop_url) as t:
        assert rows(t) == {} and t.applied_offsets(TASK) == {}

    zk = ZkStore(cluster.zookeeper)
    zk.start()
    try:
        store = TaskStore(zk.client)
        spec = parse_spec(spec_doc(url))
        store.create(spec)
        # The execution's reaction, on a stand-in for the execution (starting a whole one here
        # would start a capture too).
        execution = SimpleNamespace(task_id=TASK, store=store, execution="e1", spec=spec)
        execution._alarm_from_batch = partial(TaskExecution._alarm_from_batch, execution)
        reported: list[Any] = []

        def on_dead_letters(letters: list[Any]) -> None:
            reported.extend(letters)
            TaskExecution._on_dead_letters(execution, letters)  # type: ignore[arg-type]

        config = ApplyConfig(
            bootstrap=cluster.bootstrap, target=url, topics=["shop.changes"], pipeline=TASK,
            available_now=True, on_refused="dlq", dead_letter_topic=TOPIC, execution="e1",
        )  # fmt: skip
        q = ApplyQuery(spark, config, on_dead_letters=on_dead_letters)
        q.start()
        q.await_termination(120)
        q.stop()
        assert q.error is None
        with open_target(url) as t:
            assert sorted(rows(t)) == [1, 2, 3, 5, 6, 8, 10]
        assert sorted(e.letter.key for e in dedupe(read_entries(cluster.bootstrap, TOPIC))) == [
            '{"id":4}', '{"id":7}', '{"id":9}',
        ]  # fmt: skip
        assert len(reported) == 3 and all(d.execution == "e1" for d in reported)
        (alarm,) = [a for a in store.alarms(TASK) if a["kind"] == "dead-letters"]
        assert alarm["count"] == 3 and alarm["topic"] == TOPIC and alarm["table"] == "acct" and alarm["error"]
        assert metrics.TASK_DEAD_LETTERS.labels(TASK)._value.get() == 3
        metrics.forget_task(TASK)
    finally:
        zk.stop()


def spec_doc(target_url: str) -> dict[str, Any]:
    return {
        "id": TASK,
        "source": {"kind": "generator"},
        "target": target_url,
        "options": {"on_refused": "dlq"},
    }


def test_the_manager_raises_a_dead_letters_alarm_from_the_event() -> None:
    from sluice.manager.alarms.rules import Facts, TaskFacts, evaluate, parse_rules

    now = 1_800_000_000.0
    event = {"kind": "dead-letters", "at": now - 10, "count": 3, "table": "acct", "topic": TOPIC,
             "error": "IntegrityError: CHECK constraint failed: qty >= 0"}  # fmt: skip
    facts = Facts(now, [TaskFacts(TASK, running=True, lag_records=0, lag_seconds=0.0, events=[event])])
    [alarm], _ = evaluate(facts, parse_rules({}), {})
    assert alarm.key == ("dead-letters", f"task:{TASK}")
    assert "refused 3 change(s) (table acct: IntegrityError" in alarm.summary
    assert f"sluice dlq replay {TASK}" in alarm.summary


def sluice(cluster: TestCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", "dlq", *args, "--zookeeper", cluster.zookeeper,
         "--bootstrap-server", cluster.bootstrap],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


def test_dlq_cli_list_show_replay(cluster: TestCluster, dlq: DeadLetterWriter, tmp_path: Path) -> None:
    from sluice.cluster.zkstore import ZkStore
    from sluice.sync.tasks import TaskStore, parse_spec

    url = f"sqlite:///{tmp_path / 'target.db'}"
    zk = ZkStore(cluster.zookeeper)
    zk.start()
    try:
        TaskStore(zk.client).create(parse_spec(spec_doc(url)))
    finally:
        zk.stop()
    out = sluice(cluster, "list", "nope")
    assert out.returncode == 2 and "no task 'nope'" in out.stderr
    out = sluice(cluster, "replay", TASK)
    assert out.returncode == 2 and f"task {TASK} has no dead letters" in out.stderr
    with open_target(url) as t:
        make_table(t)
        epoch = t.claim(TASK)
        t.apply(
            TASK, epoch, records(bad_batch(), topic="shop.changes"), on_refused=dlq.sink(TASK, epoch, "x")
        )

    out = sluice(cluster, "list", TASK)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == "dead_letters=3"
    assert lines[0].startswith('offset=0 table=acct key={"id":4} error="IntegrityError: CHECK')
    shown = sluice(cluster, "show", TASK, "2")
    assert shown.returncode == 0, shown.stderr
    doc = orjson.loads(shown.stdout)
    assert doc["offset"] == 2 and doc["key"] == {"id": 9} and doc["source"]["offset"] == 10
    assert sluice(cluster, "show", TASK, "9").returncode == 2

    with open_target(url) as t:
        execute(t, "ALTER TABLE acct RENAME TO acct_old")
        execute(t, "CREATE TABLE acct (id INTEGER PRIMARY KEY, qty, note, _sluice_pos INTEGER NOT NULL)")
    out = sluice(cluster, "replay", TASK)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "replayed=3 refused_again=0 skipped=0"
    with open_target(url) as t:
        assert sorted(rows(t)) == [4, 7, 9]
    out = sluice(cluster, "replay", TASK)
    assert out.stdout.strip() == "replayed=0 refused_again=0 skipped=3"
