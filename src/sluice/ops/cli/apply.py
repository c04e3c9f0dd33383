"""`sluice apply`: change topics to a target through a Spark query."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sluice.ops.cli.common import (
    DEFAULT_BOOTSTRAP,
    Bootstrap,
    err,
    fail,
    parse_seconds,
)


def apply(
    target: Annotated[
        str,
        typer.Option(
            help="sqlite:///path/to.db or postgresql://user@host:port/db (no password: set PGPASSWORD "
            "in the environment, or use ~/.pgpass)"
        ),
    ],
    topics: Annotated[str | None, typer.Option(help="Comma-separated topics to apply")] = None,
    pattern: Annotated[
        str | None, typer.Option(help="Regular expression over topic names (instead of --topics)")
    ] = None,
    trigger: Annotated[str, typer.Option(help="Micro-batch interval, e.g. 1s or 500ms")] = "1s",
    spark_master: Annotated[str | None, typer.Option(help="Spark master URL (default local[*])")] = None,
    checkpoint: Annotated[Path | None, typer.Option(help="Spark checkpoint directory")] = None,
    pipeline: Annotated[
        str | None, typer.Option(help="Pipeline name: keys the target's offsets and fence")
    ] = None,
    epoch: Annotated[
        int | None, typer.Option(help="Fencing epoch (default: one more than the target's)")
    ] = None,
    mapping: Annotated[
        Path | None, typer.Option(help="YAML/JSON column mapping: table -> table/rename/drop/casts")
    ] = None,
    available_now: Annotated[bool, typer.Option(help="Apply what is in the log now, then stop")] = False,
    max_records_per_trigger: Annotated[int | None, typer.Option(help="Read limit per micro-batch")] = None,
    tables: Annotated[
        str | None,
        typer.Option(help="Comma-separated source tables to apply; records of other tables fail the batch"),
    ] = None,
    source_format: Annotated[
        str,
        typer.Option(
            help="Which Spark source reads the log: sluice (Sluice's own) or kafka (Spark's "
            "spark-sql-kafka-0-10, fetched by scripts/peers.sh)"
        ),
    ] = "sluice",
    envelope: Annotated[
        str,
        typer.Option(
            help="The records' envelope: sluice (Sluice's capture) or debezium (Debezium's MySQL "
            "connector, JSON converter; see deploy/debezium/README.md)"
        ),
    ] = "sluice",
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Apply change topics to a target with a Spark Structured Streaming query, in the foreground.

    Each micro-batch is one target transaction: newest change per row, guarded by source
    position, offsets recorded with the rows, fencing epoch checked. A query that fails is started
    again from its checkpoint after 1 s, 2 s, 4 s ... up to 60 s (a committed batch starts the
    count again); the command exits non-zero if the target holds a newer epoch (3) or refuses
    what it was given (1). Stop with Ctrl-C."""
    import signal as _signal

    from sluice.security.secrets import url_has_password
    from sluice.sync.targets import StaleEpochError
    from sluice.sync.targets.mapping import ColumnMapping, MappingError

    if bool(topics) == bool(pattern):
        raise fail("give exactly one of --topics and --pattern", 2)
    if envelope not in ("sluice", "debezium"):
        raise fail(f"--envelope must be sluice or debezium, not {envelope!r}", 2)
    if url_has_password(target):
        raise fail(PASSWORD_IN_URL, 2)
    if source_format not in ("sluice", "kafka"):
        raise fail(f"--source-format must be sluice or kafka, not {source_format!r}", 2)
    try:
        column_mapping = ColumnMapping.from_config(_load_mapping(mapping)) if mapping else ColumnMapping()
    except (MappingError, OSError, ValueError) as exc:
        raise fail(f"bad --mapping: {exc}", 2) from None
    from sluice import test_switches
    from sluice.pipeline.apply import ApplyConfig, ApplyQuery, BatchReport
    from sluice.pipeline.restarting import QueryFailure, RestartingQuery, describe_failure
    from sluice.pipeline.session import ConnectorMissingError, DriverSession

    config = ApplyConfig(
        bootstrap=bootstrap,
        target=target,
        topics=[t.strip() for t in topics.split(",") if t.strip()] if topics else None,
        pattern=pattern,
        pipeline=pipeline,
        epoch=epoch,
        trigger_s=parse_seconds(trigger, "--trigger"),
        available_now=available_now,
        max_records_per_trigger=max_records_per_trigger,
        mapping=column_mapping,
        tables=[t.strip() for t in tables.split(",") if t.strip()] if tables else None,
        switches=test_switches.for_process(),  # all off unless a test harness armed them
        source_format=source_format,
        envelope=envelope,
    )
    name = config.pipeline_name()
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    config.checkpoint = checkpoint or Path(".sluice/checkpoints") / safe

    def on_batch(b: BatchReport) -> None:
        r = b.result
        offsets = " ".join(
            f"{t}[{p}]={o}" for t, parts in r.offsets.items() for p, o in sorted(parts.items())
        )
        err.print(
            f"batch {b.batch_id}: {r.records:,} records ({r.skipped:,} already applied), "
            f"{r.changes:,} row changes, {r.written:,} rows written in {b.took_s:.2f} s; next {offsets}"
        )

    def on_failure(f: QueryFailure) -> None:
        err.print(
            f"the apply query failed (attempt {f.attempt}): {f.error}; starting it again from its "
            f"checkpoint in {f.retry_in_s:.1f} s",
            markup=False, highlight=False, soft_wrap=True,
        )  # fmt: skip

    def on_restart(q: ApplyQuery) -> None:
        err.print(f"the apply query started again under fencing epoch {q.epoch}")

    # The driver JVM is started again if it died: a restart of the query then runs on a new one.
    spark = DriverSession(spark_master, app=f"sluice-apply {name}", kafka_connector=source_format == "kafka")
    runner = RestartingQuery(
        spark.get, config, on_batch=on_batch, on_failure=on_failure, on_restart=on_restart
    )
    try:
        query = runner.open()
    except ConnectorMissingError as exc:
        spark.stop()
        raise fail(str(exc), 2) from None
    except StaleEpochError as exc:
        spark.stop()
        raise fail(str(exc), 3) from None
    except (ConnectionError, ValueError) as exc:
        spark.stop()
        raise fail(str(exc), 2) from None
    err.print(
        f"applying {name} to {target} under fencing epoch {query.epoch} (source {source_format}); "
        f"checkpoint {config.checkpoint}"
    )
    stopping: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        # Only note it: the main thread may be inside a py4j call, and stopping the query from
        # here made a reentrant one (a py4j error and a JVM stack trace on every SIGTERM).
        stopping.append(signum)

    _signal.signal(_signal.SIGTERM, on_signal)
    _signal.signal(_signal.SIGINT, on_signal)
    try:
        runner.start()
        for note in query.notes:
            err.print(note)
        # A failed query is started again after the backoff (pipeline/restarting.py), until a
        # signal stops the command; one that a restart would only meet again ends it.
        while not stopping and not runner.check():
            runner.wait(0.5)
    except StaleEpochError as exc:
        raise fail(str(exc), 3) from None
    except Exception as exc:
        if not stopping:
            raise fail(f"the apply query failed: {describe_failure(exc)}") from None
    finally:
        runner.stop()
        spark.stop()
    err.print("stopped" if stopping else "done")


#: a command line is visible to every user of the host (ps) and kept in shell histories
PASSWORD_IN_URL = (
    "--target: a password in the URL is refused (a command line is visible to every user of this host "
    "and kept in shell histories): leave it out and set PGPASSWORD in this command's environment, or "
    "put it in ~/.pgpass"
)


def _load_mapping(path: Path) -> dict[str, object]:
    import yaml

    doc = yaml.safe_load(path.read_text())
    if isinstance(doc, dict) and "tables" in doc:
        doc = doc["tables"]
    if not isinstance(doc, dict):
        raise ValueError(f"{path} must hold a mapping of table name -> table/rename/drop/casts")
    return doc
