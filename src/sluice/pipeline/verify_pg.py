"""`sluice task verify` for a PostgreSQL source and a PostgreSQL target: the two databases' own
text of every value, compared.

The target gives each column the source's own type wherever sync/types.py says so, so the
target's text of a value (`col::text`) is the source's; where the mapping gives another type
(money as numeric, an enum or an extension's type as text) the source's value is read as that
type's text (`col::numeric::text`, `col::text`). Both sessions use the capture's settings
(pg_values.SESSION_OPTIONS). Each table is read whole on both sides, ordered by nothing: rows
are matched by their key's text. Differences are suspects, checked again (as pipeline/verify.py
does for MySQL sources) once the pipeline has passed the source's WAL position read after the
suspects' source rows, in a few rounds; what still differs is reported, in verify.py's report.
A SQLite target is refused with a clear error (its values are not PostgreSQL's text).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sluice.pipeline.verify import RECHECK_ROUNDS, TableReport, Verification, log_ends, wait_passed
from sluice.security.secrets import reveal
from sluice.sync.sources import pg_proto
from sluice.sync.sources.mysql_base import CaptureError
from sluice.sync.sources.pg_values import SESSION_OPTIONS, describe, table_columns
from sluice.sync.sources.postgresql import primary_keys, quote, split_table
from sluice.sync.targets.base import ColumnMapping
from sluice.sync.tasks import TaskSpec
from sluice.sync.types import parse_type, postgres_type

__all__ = ["log_ends", "recheck_postgres", "verify_postgres"]

Rows = dict[tuple[str, ...], tuple[str | None, ...]]


def _source_expr(column: str, source_type: str) -> str:
    """The source's value as the target's type prints it."""
    t = parse_type(source_type)
    if t.family == "money":
        return f"{quote(column)}::numeric::text"
    return f"{quote(column)}::text"


class _Table:
    def __init__(self, spec: TaskSpec, table: str, mapping: ColumnMapping, cur: Any) -> None:
        schema, name = split_table(spec.source, table)
        self.table = table
        self.source_name = f"{quote(schema)}.{quote(name)}"
        columns = table_columns(cur, schema, name)
        types = describe(cur, columns)
        self.keys = primary_keys(cur, spec.source, [table])[table]
        # the columns the mapping keeps, by their target names
        self.columns = [c for c, _, _ in columns if mapping.target_column(table, c) is not None]
        self.target_columns = [str(mapping.target_column(table, c)) for c in self.columns]
        self.target_name = quote(mapping.target_table(table))
        self.source_select = ", ".join(_source_expr(c, types[c]) for c in self.columns)
        self.target_select = ", ".join(f"{quote(c)}::text" for c in self.target_columns)
        self.types = {c: postgres_type(types[c]) for c in self.columns}

    def key_of(self, row: tuple[Any, ...]) -> tuple[str, ...]:
        return tuple(row[self.columns.index(k)] for k in self.keys)

    def key_doc(self, key: tuple[str, ...]) -> dict[str, Any]:
        return dict(zip(self.keys, key, strict=True))


def _connect(url_or_dsn: str, password: str | None = None) -> Any:
    import psycopg

    return psycopg.connect(url_or_dsn, autocommit=True, options=SESSION_OPTIONS, password=password)


def _read(conn: Any, sql: str, t: _Table, keys: list[tuple[str, ...]] | None, key_cols: list[str]) -> Rows:
    where = ""
    params: list[Any] = []
    if keys is not None:
        if not keys:
            return {}
        row = "(" + ", ".join(f"{quote(k)}::text" for k in key_cols) + ")"
        where = (
            f" WHERE {row} IN ("
            + ", ".join("(" + ", ".join(["%s"] * len(key_cols)) + ")" for _ in keys)
            + ")"
        )
        params = [v for k in keys for v in k]
    try:
        rows = conn.execute(sql + where, params).fetchall()
    except Exception as exc:
        if "does not exist" in str(exc) and "relation" in str(exc):
            return {}  # no target table yet: every source row is missing
        raise
    return {t.key_of(r): tuple(r) for r in rows}


def _diff(t: _Table, want: Rows, got: Rows, report: TableReport) -> None:
    for key in want.keys() - got.keys():
        report.missing.append(t.key_doc(key))
    for key in got.keys() - want.keys():
        report.extra.append(t.key_doc(key))
    for key in want.keys() & got.keys():
        if want[key] != got[key]:
            report.different.append(t.key_doc(key))


def _lsn(conn: Any) -> int:
    return pg_proto.parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])


def _lsn_reached(lsn: int) -> Callable[[str], bool]:
    """Whether a captured position (the status's text) is at or past the WAL position `lsn`."""

    def reached(captured: str) -> bool:
        try:
            return pg_proto.parse_lsn(captured) >= lsn
        except ValueError:  # not an LSN
            return False

    return reached


def compare_texts(
    source_url: str, target_url: str, table: str, *, schema: str = "public"
) -> tuple[Rows, Rows, list[str]]:
    """Every row of `table` in a PostgreSQL source and target (no column mapping), each value as
    the databases print it; and the columns, in order (the chaos run's checker)."""
    from sluice.sync.tasks import SourceSpec

    spec = TaskSpec(id="compare", source=SourceSpec(kind="postgresql", schema=schema), target=target_url)
    with _connect(source_url) as src, _connect(target_url) as dst:
        with src.cursor() as cur:
            t = _Table(spec, table, ColumnMapping.from_config({}), cur)
        want = _read(src, f"SELECT {t.source_select} FROM {t.source_name}", t, None, t.keys)
        got = _read(dst, f"SELECT {t.target_select} FROM {t.target_name}", t, None, t.keys)
    return want, got, t.columns


def _sessions(spec: TaskSpec) -> tuple[Any, Any]:
    from sluice.sync.sources.postgresql import dsn

    if not spec.target.startswith(("postgresql://", "postgres://")):
        raise CaptureError(
            f"task {spec.id}: verify of a postgresql source compares it with a PostgreSQL target "
            f"(this task's is {spec.target.split(':', 1)[0]})"
        )
    target_password = reveal(spec.target_password) if spec.target_password is not None else None
    src = _connect(dsn(spec.source, application="sluice-verify"))
    try:
        return src, _connect(spec.target, target_password)
    except BaseException:
        src.close()
        raise


def _settle(
    src: Any,
    dst: Any,
    t: _Table,
    mapping: ColumnMapping,
    report: TableReport,
    status: Callable[[], dict[str, Any] | None],
    ends: Callable[[], dict[str, int]],
    wait_s: float,
    out: Verification,
) -> TableReport:
    """The report's keys compared again once the pipeline passed the source's WAL position read
    after their source rows, in rounds while some of them settle: what still differs."""
    source_sql = f"SELECT {t.source_select} FROM {t.source_name}"
    target_sql = f"SELECT {t.target_select} FROM {t.target_name}"
    target_keys = [str(mapping.target_column(t.table, k)) for k in t.keys]
    for _ in range(RECHECK_ROUNDS):
        suspects = list(dict.fromkeys(tuple(str(k[c]) for c in t.keys) for k in report.keys))
        if not suspects:
            break
        want = _read(src, source_sql, t, suspects, t.keys)
        if not wait_passed(status, _lsn_reached(_lsn(src)), wait_s, ends):
            out.waited = False
        got = _read(dst, target_sql, t, suspects, target_keys)
        again = TableReport(t.table, report.rows)
        _diff(t, want, got, again)
        settled = len(report.keys) - len(again.keys)
        report = again
        if not settled:
            break
    return report


def verify_postgres(
    spec: TaskSpec,
    *,
    tables: list[str] | None = None,
    status: Callable[[], dict[str, Any] | None] = lambda: None,
    ends: Callable[[], dict[str, int]] = dict,
    wait_s: float = 60.0,
) -> Verification:
    """Compare a resolved task's (`tasks.resolved`) PostgreSQL source with its PostgreSQL target."""
    mapping = ColumnMapping.from_config(spec.mapping)
    out = Verification([])
    src, dst = _sessions(spec)
    with src, dst:
        with src.cursor() as cur:
            schemas = {table: _Table(spec, table, mapping, cur) for table in tables or spec.tables}
        for table, t in schemas.items():
            report = TableReport(table)
            want = _read(src, f"SELECT {t.source_select} FROM {t.source_name}", t, None, t.keys)
            target_keys = [str(mapping.target_column(table, k)) for k in t.keys]
            got = _read(dst, f"SELECT {t.target_select} FROM {t.target_name}", t, None, target_keys)
            report.rows = len(want)
            _diff(t, want, got, report)
            out.tables.append(_settle(src, dst, t, mapping, report, status, ends, wait_s, out))
    return out


def recheck_postgres(
    spec: TaskSpec,
    suspects: list[TableReport],
    *,
    status: Callable[[], dict[str, Any] | None],
    ends: Callable[[], dict[str, int]],
    wait_s: float,
    out: Verification,
) -> list[TableReport]:
    """`suspects`' keys (each table's report) compared again, as verify_postgres settles its own
    (verify.repair's check after the re-snapshot)."""
    mapping = ColumnMapping.from_config(spec.mapping)
    reports = []
    src, dst = _sessions(spec)
    with src, dst:
        for found in suspects:
            with src.cursor() as cur:
                t = _Table(spec, found.table, mapping, cur)
            reports.append(_settle(src, dst, t, mapping, found, status, ends, wait_s, out))
    return reports
