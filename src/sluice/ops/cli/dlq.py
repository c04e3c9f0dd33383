"""`sluice dlq`: the changes a task's target refused (task option `on_refused: dlq`), listed,
shown whole, and replayed to the target once it (or the data) is fixed (sync.dead_letters)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from sluice.ops.cli.common import (
    DEFAULT_BOOTSTRAP,
    Bootstrap,
    CommandConfig,
    ZooKeeperOpt,
    client_security,
    fail,
    task_store,
)

dlq_app = typer.Typer(
    no_args_is_help=True,
    help="Dead letters: changes a task's target refused (on_refused: dlq), kept in the topic {task}.dlq.",
)


@contextmanager
def _task(task_id: str, zookeeper: str | None) -> Iterator[tuple[Any, Any]]:
    """The task's definition and its store (ZooKeeper open until the block ends); exit 2 if the
    task is unknown."""
    from sluice.sync.tasks import TaskNotFoundError

    zk, store = task_store(zookeeper)
    try:
        try:
            spec = store.get(task_id)
        except TaskNotFoundError:
            raise fail(f"no task {task_id!r}: see `sluice task list`", 2) from None
        yield spec, store
    finally:
        zk.stop()


def _entries(spec: Any, bootstrap: str, command_config: Path | None, *, dedupe: bool) -> list[Any]:
    """The task's dead letters (each refused change once, with its newest error, if `dedupe`);
    exit 2 naming the task when there are none."""
    from sluice.sync import dead_letters

    client = client_security(command_config, bootstrap).confluent_config()
    try:
        entries = dead_letters.read_entries(bootstrap, spec.dlq_topic(), client)
    except dead_letters.DeadLetterError as exc:
        raise fail(f"task {spec.id} has no dead letters: {exc}", 2) from None
    if dedupe:
        entries = dead_letters.dedupe(entries)
    if not entries:
        raise fail(f"task {spec.id} has no dead letters (topic {spec.dlq_topic()} is empty)", 2)
    return entries


def _when(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dlq_app.command("list")
def dlq_list(
    task_id: str,
    zookeeper: ZooKeeperOpt = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    command_config: CommandConfig = None,
) -> None:
    """One line per refused change (offset, table, key, error, when), then dead_letters=N."""
    import orjson

    with _task(task_id, zookeeper) as (spec, _store):
        entries = _entries(spec, bootstrap, command_config, dedupe=True)
    for e in entries:
        d = e.letter
        error = orjson.dumps(d.error).decode()
        typer.echo(
            f"offset={e.label()} table={d.table} key={d.key} error={error} when={_when(d.failed_at_ms)}"
        )
    typer.echo(f"dead_letters={len(entries)}")


@dlq_app.command("show")
def dlq_show(
    task_id: str,
    offset: Annotated[str, typer.Argument(help="The dead letter's offset (as `sluice dlq list` prints it)")],
    zookeeper: ZooKeeperOpt = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    command_config: CommandConfig = None,
) -> None:
    """The whole dead letter at OFFSET of the task's dead-letter topic, as JSON."""
    import orjson

    with _task(task_id, zookeeper) as (spec, _store):
        entries = _entries(spec, bootstrap, command_config, dedupe=False)
    found = [e for e in entries if e.label() == offset.strip()]
    if not found:
        raise fail(
            f"task {task_id} has no dead letter at offset {offset} of {spec.dlq_topic()} "
            f"(offsets {entries[0].label()}..{entries[-1].label()}): see `sluice dlq list {task_id}`",
            2,
        )
    e = found[0]
    doc = {"offset": e.offset, "partition": e.partition, **e.letter.to_doc()}
    typer.echo(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())


@dlq_app.command("replay")
def dlq_replay(
    task_id: str,
    zookeeper: ZooKeeperOpt = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    command_config: CommandConfig = None,
) -> None:
    """Re-apply every dead letter not replayed yet to the task's target (pipeline {task}.dlq-replay,
    its own fence and offsets): the version guard keeps newer rows; a change refused again goes
    back to the dead-letter topic with its new error. Prints replayed=N refused_again=N skipped=N."""
    import uuid

    from sluice.security.secrets import SecretError, resolved_only
    from sluice.sync import dead_letters
    from sluice.sync.targets import ColumnMapping, StaleEpochError, open_target
    from sluice.sync.tasks import resolved

    with _task(task_id, zookeeper) as (spec, store):
        entries = _entries(spec, bootstrap, command_config, dedupe=True)
        try:
            # the target's password, read here as a worker would, within the cluster's scope
            spec = resolved(spec, store.secret_scope())
        except SecretError as exc:
            raise fail(str(exc), 2) from None
        topic = spec.dlq_topic()
        execution = uuid.uuid4().hex[:12]
        client = client_security(command_config, bootstrap).confluent_config()
        writer = dead_letters.DeadLetterWriter(bootstrap, topic, spec.id, client)
        try:
            target = open_target(
                spec.target, ColumnMapping.from_config(spec.mapping), tables=spec.tables or None,
                password=resolved_only(spec.target_password),
            )  # fmt: skip
        except ConnectionError as exc:
            raise fail(str(exc)) from None
        try:
            result = dead_letters.replay(target, entries, topic, writer, execution)
        except (StaleEpochError, dead_letters.DeadLetterError) as exc:
            raise fail(f"replay of {task_id}'s dead letters rolled back: {exc}") from None
        finally:
            target.close()
            writer.close()
        if result.refused_again:
            store.raise_alarm(
                task_id, "dead-letters",
                {"count": result.refused_again, "execution": execution, "topic": topic,
                 "detail": f"{result.refused_again} dead letter(s) refused again by the replay"},
            )  # fmt: skip
    typer.echo(f"replayed={result.replayed} refused_again={result.refused_again} skipped={result.skipped}")
