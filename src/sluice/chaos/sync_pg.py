"""`sluice chaos sync --source postgresql`: the sync chaos run (chaos/sync_run.py) with a
PostgreSQL source.

One PostgreSQL server (wal_level=logical) holds the source database and both targets; two tasks
capture the source through two slots: `chaos-pg` into one target database through the TCP proxy
(so it can refuse connections), `chaos-pg2` into another directly. The workload is
pg_workload.py's (every statement kind, every type of PG_CATALOG at its edge values, TOASTed
columns left alone, REPLICA IDENTITY FULL). The faults are the run's own (workers, drivers,
brokers, the proxied target) and `source-walsender-kill`: kill -9 of a task's walsender, upon
which PostgreSQL ends every session and recovers from its WAL (the slots keep the position they
last persisted: changes are sent again, and must not show twice).

The comparison is the two databases' own text of every value, row by row by key (as `sluice task
verify` compares a PostgreSQL source with its target), for each target; the verdict line is the
run's: `chaos-sync verdict=pass missing=0 extra=0 different=0`.
"""

from __future__ import annotations

import os
import signal
import time
from functools import total_ordering
from pathlib import Path
from typing import Any

from sluice.chaos import sync_run
from sluice.chaos.pg_workload import PG_CATALOG, PG_KEYS, PG_MARKER_TABLE, PgWorkload, PgWorkloadRunner
from sluice.chaos.sync_faults import SyncFault
from sluice.ops.postgres import LocalPostgres
from sluice.sync.compare import TableComparison, TargetComparison
from sluice.sync.sources.pg_values import SESSION_OPTIONS

PG2_TASK = "chaos-pg2"
#: the faults of a PostgreSQL-source run (no SQLite target: its lock fault does not apply)
PG_SOURCE_FAULT_KINDS = (
    "worker-kill", "worker-pause", "driver-kill", "driver-pause", "broker-kill", "broker-pause",
    "target-pg-down", "source-walsender-kill",
)  # fmt: skip


@total_ordering
class Lsn:
    """A WAL position as the run's catch-up check needs it (ordered, printable)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def text(self) -> str:
        from sluice.sync.sources.pg_proto import lsn_text

        return lsn_text(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Lsn) and self.value == other.value

    def __lt__(self, other: Lsn) -> bool:
        return self.value < other.value

    def __hash__(self) -> int:
        return hash(self.value)


def _connect(server: LocalPostgres, database: str) -> Any:
    import psycopg

    return psycopg.connect(server.url(database), autocommit=True, options=SESSION_OPTIONS, connect_timeout=10)


class PgSeedRun(sync_run.SeedRun):
    """SeedRun with the PostgreSQL source: the same tasks, workers, faults and catch-up, its own
    source, workload, end mark and comparison."""

    def __init__(self, directory: Path, seed: int, *, source: LocalPostgres, **kwargs: Any) -> None:
        super().__init__(directory, seed, mariadb=None, postgres=source, **kwargs)  # type: ignore[arg-type]
        self.pg_workload = PgWorkload(seed)
        self.report.types = tuple(PG_CATALOG)
        self.report.edge_values = len(self.pg_workload.edge_values())
        self.report.snapshot_met = set(self.pg_workload.edge_values())
        self.source_db = f"chaos_src_{seed}"

    def _workload_line(self) -> str:
        return (f"statements: {','.join(self.pg_workload.kinds)}; column types: all {len(PG_CATALOG)} "
                "PostgreSQL catalog types")  # fmt: skip

    def _second_task(self, sqlite_path: Path) -> sync_run._Task:
        """A second PostgreSQL task (its own slot), straight to a database of its own."""
        direct = self.postgres.create_database(f"{self.database}_direct")
        return sync_run._Task(PG2_TASK, direct, direct, "postgresql")

    # -- the source ------------------------------------------------------------------------------
    def _create_source(self) -> None:
        self.postgres.create_database(self.source_db)
        with _connect(self.postgres, self.source_db) as conn:
            self.pg_workload.setup(conn)

    def _task_doc(self, task_id: str, target: str) -> dict[str, Any]:
        return {
            "id": task_id,
            "source": {"kind": "postgresql", "host": "127.0.0.1", "port": self.postgres.port,
                       "user": "postgres", "database": self.source_db},
            "tables": list(PG_KEYS),
            "topic": "{task}.changes",
            "target": target,
            # a small logical_decoding_work_mem: the server streams the larger transactions in
            # progress (protocol version 2's blocks), so the run meets that path too
            "options": {"trigger": sync_run.TRIGGER, "partitions": 3, "heartbeat_interval": "2s",
                        "logical_decoding_work_mem": "64kB"},
        }  # fmt: skip

    def _source_position(self) -> Lsn:
        from sluice.sync.sources.pg_proto import parse_lsn

        with _connect(self.postgres, self.source_db) as conn:
            return Lsn(parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]))

    @staticmethod
    def _captured_to(p: sync_run._Progress, end: Any) -> bool:
        from sluice.sync.sources.pg_proto import parse_lsn

        return bool(p.captured) and "/" in str(p.captured) and parse_lsn(str(p.captured)) >= end.value

    def _heartbeat(self) -> None:
        with _connect(self.postgres, self.source_db) as conn:
            conn.execute(f"INSERT INTO {PG_MARKER_TABLE} (note) VALUES ('heartbeat')")

    def _mark_end(self) -> Any:  # an Lsn where the base run has a binlog position
        self._wait_source_up()
        with _connect(self.postgres, self.source_db) as conn:
            conn.execute(f"INSERT INTO {PG_MARKER_TABLE} (note) VALUES ('end')")
        return self._source_position()

    def _wait_source_up(self) -> None:
        deadline = time.monotonic() + 120
        while True:
            try:
                with _connect(self.postgres, self.source_db):
                    return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)

    def _drop_source(self) -> None:
        try:
            with _connect(self.postgres, "postgres") as conn:
                for slot in ("sluice_chaos_pg", "sluice_chaos_pg2"):
                    conn.execute(
                        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                        "WHERE slot_name = %s AND NOT active", [slot],
                    )  # fmt: skip
                conn.execute(f'DROP DATABASE IF EXISTS "{self.source_db}" WITH (FORCE)')
        except Exception as exc:
            sync_run.log.warning("event=drop_source_failed database=%s error=%r", self.source_db, exc)

    # -- the workload and the source's own fault ------------------------------------------------------
    def _start_workload(self) -> PgWorkloadRunner:
        return PgWorkloadRunner(lambda: _connect(self.postgres, self.source_db), self.pg_workload).start()

    def _workload_and_faults(self, injector: Any) -> None:
        injector.source_fault = self._source_fault
        super()._workload_and_faults(injector)
        self._wait_source_up()  # a walsender killed at the end: the server recovers first

    def _source_fault(self, fault: SyncFault) -> str | None:
        """kill -9 of a task's walsender; what was done, or None when no task streams now (both
        starting again after an earlier fault)."""
        with _connect(self.postgres, "postgres") as conn:
            rows = conn.execute(
                "SELECT pid, application_name FROM pg_stat_replication "
                "WHERE application_name LIKE 'sluice-%' "
                "ORDER BY application_name"
            ).fetchall()
        if not rows:
            return None
        pid, app = rows[int(fault.at_s * 10) % len(rows)]
        os.kill(int(pid), signal.SIGKILL)
        return f"kill -9 the walsender of {app} (pid {pid}): PostgreSQL ends every session and recovers"

    # -- the comparison ----------------------------------------------------------------------------
    def _compare(self, tasks: list[sync_run._Task]) -> None:
        from sluice.pipeline.verify_pg import compare_texts

        with _connect(self.postgres, self.source_db) as conn:
            self.report.types_at_end = {
                c for c in PG_CATALOG if conn.execute(f"SELECT count({c}) FROM catalog").fetchone()[0]
            }
        for task in tasks:
            label = f"postgresql ({task.id})"
            comparison = TargetComparison(label)
            try:
                for table in PG_KEYS:
                    want, got, columns = compare_texts(
                        self.postgres.url(self.source_db), task.direct_url, table
                    )
                    t = TableComparison(table, compared=len(want))
                    for key in sorted(want.keys() - got.keys()):
                        t.missing.append(repr(key))
                    for key in sorted(got.keys() - want.keys()):
                        t.extra.append(repr(key))
                    for key in sorted(want.keys() & got.keys()):
                        if want[key] == got[key]:
                            t.equal += 1
                            continue
                        pairs = zip(columns, want[key], got[key], strict=True)
                        cols = [(c, str(a)[:60], str(b)[:60]) for c, a, b in pairs if a != b]
                        t.different.append((repr(key), cols))
                    comparison.tables.append(t)
            except Exception as exc:
                self.report.problems.append(f"cannot compare target {label}: {exc}")
                continue
            self.report.comparisons.append(comparison)

    def _drop_target_database(self) -> None:
        import psycopg

        for name in (self.database, f"{self.database}_direct"):
            try:
                with psycopg.connect(self.postgres.url(), autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            except Exception as exc:
                sync_run.log.warning("event=drop_target_failed database=%s error=%r", name, exc)


def run_pg_sync_chaos(
    directory: Path,
    seeds: list[int],
    *,
    duration_s: float,
    fault_kinds: tuple[str, ...],
    statement_kinds: tuple[str, ...],
    source: LocalPostgres | None = None,
    out: sync_run.Out = print,
    keep: bool = False,
    catch_up_timeout_s: float = 240.0,
) -> list[sync_run.SeedReport]:
    """Every seed in turn on one PostgreSQL server (a private one unless `source` is given);
    prints as it goes, ending with the verdict line."""
    import shutil
    from contextlib import ExitStack

    from sluice.chaos.sync_faults import make_sync_schedule

    for kind in fault_kinds:
        make_sync_schedule(0, 0, (kind,))
    PgWorkload(0, statement_kinds)
    reports: list[sync_run.SeedReport] = []
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        if source is None:
            source = LocalPostgres(directory / "postgres", logical=True)
            stack.callback(source.remove)
            source.start()
        for seed in seeds:
            run = PgSeedRun(
                directory / f"seed-{seed}", seed, source=source, duration_s=duration_s,
                fault_kinds=fault_kinds,
                statement_kinds=(), value_kinds=(), out=out, catch_up_timeout_s=catch_up_timeout_s,
            )  # fmt: skip
            run.pg_workload = PgWorkload(seed, statement_kinds)
            try:
                reports.append(run.run())
            except Exception as exc:
                sync_run.log.exception("event=chaos_sync_seed_failed seed=%d", seed)
                run.report.problems.append(f"the run stopped: {exc!r}")
                run.say(f"fail: the run stopped: {exc!r}")
                reports.append(run.report)
            finally:
                if not keep:
                    shutil.rmtree(run.directory, ignore_errors=True)
    out(sync_run.types_line(reports))
    out(sync_run.verdict_line(reports))
    return reports
