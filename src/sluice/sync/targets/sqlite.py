"""SQLite, the embedded default target: one `BEGIN IMMEDIATE` transaction per batch.

Collapsed changes are written with `executemany` upserts carrying the version guard.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from sluice.sync.changes import TypesVariants
from sluice.sync.envelope import key_text
from sluice.sync.schema import Recorded
from sluice.sync.targets.base import (
    POS_COLUMN,
    BadTargetUrlError,
    Target,
    infer_type,
    quote,
)
from sluice.sync.targets.evolution import history_from_rows, merged_types, target_types
from sluice.sync.targets.mapping import ColumnMapping, MappingError
from sluice.sync.targets.rows import Change, changes_by_table, key_targets, source_columns
from sluice.sync.types import sqlite_type
from sluice.test_switches import OFF, Switches

log = logging.getLogger("sluice.target")

META = """
CREATE TABLE IF NOT EXISTS _sluice_fence (
    pipeline TEXT PRIMARY KEY, epoch INTEGER NOT NULL, updated_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS _sluice_offsets (
    pipeline TEXT NOT NULL, topic TEXT NOT NULL, partition INTEGER NOT NULL,
    next_offset INTEGER NOT NULL, epoch INTEGER NOT NULL, updated_ms INTEGER NOT NULL,
    PRIMARY KEY (pipeline, topic, partition));
CREATE TABLE IF NOT EXISTS _sluice_tombstones (
    tbl TEXT NOT NULL, key TEXT NOT NULL, pos INTEGER NOT NULL, PRIMARY KEY (tbl, key));
CREATE TABLE IF NOT EXISTS _sluice_truncates (tbl TEXT PRIMARY KEY, pos INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS _sluice_schema (
    tbl TEXT NOT NULL, pos INTEGER NOT NULL, change TEXT NOT NULL, applied INTEGER NOT NULL,
    PRIMARY KEY (tbl, pos));
"""


def sqlite_path(url: str) -> Path:
    if not url.startswith("sqlite:///"):
        raise BadTargetUrlError(f"SQLite target URL must look like sqlite:///path/to/file.db, not {url!r}")
    return Path(url[len("sqlite://") :])


class SqliteTarget(Target):
    def __init__(
        self,
        url: str,
        mapping: ColumnMapping | None = None,
        tables: Collection[str] | None = None,
        switches: Switches = OFF,
        schema_change_policy: str = "evolve",
    ) -> None:
        super().__init__(url, mapping, tables, switches, schema_change_policy)
        self.path = sqlite_path(url)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(self.path, isolation_level=None, timeout=60, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.executescript(META)
        self._columns: dict[str, list[str]] = {}
        self._checked: set[str] = set()  # tables whose column types were compared with the mapping

    def close(self) -> None:
        self.conn.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            self._columns.clear()  # a rolled-back ALTER/CREATE must be looked up again
            raise
        self.conn.execute("COMMIT")

    @contextmanager
    def _read_transaction(self) -> Iterator[sqlite3.Connection]:
        # Deferred: a read lock only, which in WAL mode never blocks a writer (a status read
        # must not hold up a commit, nor hold the write lock if its process is paused).
        self.conn.execute("BEGIN")
        try:
            yield self.conn
        finally:
            self.conn.execute("COMMIT")

    def _lock_epoch(self, tx: sqlite3.Connection, pipeline: str) -> int | None:
        row = tx.execute("SELECT epoch FROM _sluice_fence WHERE pipeline = ?", (pipeline,)).fetchone()
        return None if row is None else int(row[0])

    def _peek_epoch(self, tx: sqlite3.Connection, pipeline: str) -> int | None:
        return self._lock_epoch(tx, pipeline)  # a plain SELECT: SQLite locks whole files

    def _set_epoch(self, tx: sqlite3.Connection, pipeline: str, epoch: int) -> None:
        tx.execute(
            "INSERT INTO _sluice_fence (pipeline, epoch, updated_ms) VALUES (?, ?, ?) "
            "ON CONFLICT (pipeline) DO UPDATE SET epoch = excluded.epoch, updated_ms = excluded.updated_ms",
            (pipeline, epoch, int(time.time() * 1000)),
        )

    def _read_offsets(self, tx: sqlite3.Connection, pipeline: str) -> dict[tuple[str, int], int]:
        rows = tx.execute(
            "SELECT topic, partition, next_offset FROM _sluice_offsets WHERE pipeline = ?", (pipeline,)
        )
        return {(t, int(p)): int(o) for t, p, o in rows}

    def _write_offsets(
        self, tx: sqlite3.Connection, pipeline: str, epoch: int, offsets: Mapping[tuple[str, int], int]
    ) -> None:
        now = int(time.time() * 1000)
        tx.executemany(
            "INSERT INTO _sluice_offsets (pipeline, topic, partition, next_offset, epoch, updated_ms) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (pipeline, topic, partition) DO UPDATE SET "
            "next_offset = max(next_offset, excluded.next_offset), epoch = excluded.epoch, "
            "updated_ms = excluded.updated_ms",
            [(pipeline, t, p, o, epoch, now) for (t, p), o in offsets.items()],
        )

    # --- refusal isolation -----------------------------------------------------------------------
    def _savepoint(self, tx: sqlite3.Connection) -> None:
        tx.execute("SAVEPOINT _sluice_rows")

    def _rollback_to(self, tx: sqlite3.Connection) -> None:
        tx.execute("ROLLBACK TO _sluice_rows")
        self._columns.clear()  # a rolled-back ALTER/CREATE must be looked up again

    def _release(self, tx: sqlite3.Connection) -> None:
        tx.execute("RELEASE _sluice_rows")

    def _is_refusal(self, exc: BaseException) -> bool:
        # IntegrityError: NOT NULL, CHECK, UNIQUE, FOREIGN KEY, a STRICT column's type;
        # OverflowError: an integer beyond SQLite's 64 bits; MappingError: a column name the
        # mapping cannot use. Locked or broken databases (OperationalError) are not refusals.
        return isinstance(exc, (sqlite3.IntegrityError, sqlite3.DataError, OverflowError, MappingError))

    # --- rows ------------------------------------------------------------------------------------
    def _apply_changes(self, tx: sqlite3.Connection, changes: pa.Table, guard: bool) -> int:
        return sum(
            self._write_table(tx, table, rows, guard, types)
            for table, (rows, types) in changes_by_table(changes).items()
        )

    def _apply_truncates(self, tx: sqlite3.Connection, truncates: Mapping[str, int], guard: bool) -> int:
        deleted = 0
        for table, pos in sorted(truncates.items()):
            name = self.mapping.target_table(table)
            if self._table_columns(tx, name):
                older = f" WHERE {POS_COLUMN} < ?" if guard else ""
                deleted += tx.execute(f"DELETE FROM {quote(name)}{older}", (pos,) if guard else ()).rowcount
            if guard:
                tx.execute(
                    "INSERT INTO _sluice_truncates (tbl, pos) VALUES (?, ?) "
                    "ON CONFLICT (tbl) DO UPDATE SET pos = max(pos, excluded.pos)",
                    (name, pos),
                )
                tx.execute("DELETE FROM _sluice_tombstones WHERE tbl = ? AND pos < ?", (name, pos))
        return deleted

    # --- schema changes (targets/evolution.py) ------------------------------------------------------
    def _read_schema_history(self, tx: sqlite3.Connection, tables: list[str]) -> dict[str, list[Recorded]]:
        marks = ", ".join("?" * len(tables))
        sql = f"SELECT tbl, pos, change, applied FROM _sluice_schema WHERE tbl IN ({marks}) ORDER BY pos"
        rows = tx.execute(sql, tables).fetchall()
        return history_from_rows(rows)

    def _record_schema_change(
        self, tx: sqlite3.Connection, table: str, pos: int, doc: Mapping[str, Any], applied: bool
    ) -> bool:
        cur = tx.execute(
            "INSERT INTO _sluice_schema (tbl, pos, change, applied) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (tbl, pos) DO NOTHING",
            (table, pos, orjson.dumps(doc).decode(), int(applied)),
        )
        return cur.rowcount == 1

    def _existing_columns(self, tx: sqlite3.Connection, name: str) -> list[str]:
        return self._table_columns(tx, name)

    def _drop_column(self, tx: sqlite3.Connection, name: str, column: str) -> None:
        if column in self._key_columns(tx, name):
            log.warning("event=schema_change_skipped table=%s column=%s reason=%r", name, column,
                        "SQLite cannot drop a primary key column")  # fmt: skip
            return
        tx.execute(f"ALTER TABLE {quote(name)} DROP COLUMN {quote(column)}")
        self._columns.pop(name, None)

    def _rename_column(self, tx: sqlite3.Connection, name: str, old: str, new: str) -> None:
        tx.execute(f"ALTER TABLE {quote(name)} RENAME COLUMN {quote(old)} TO {quote(new)}")
        self._columns.pop(name, None)

    def _change_column_type(self, tx: sqlite3.Connection, name: str, column: str, source_type: str) -> None:
        """SQLite keeps any value in any column, but a column's declared type converts what is
        written to it (an INTEGER column stores the text '42' as 42): when the new type's
        affinity differs, the column is made again with it, values copied over."""
        declared = {r[1]: r[2] for r in tx.execute(f"PRAGMA table_info({quote(name)})")}
        want = sqlite_type(source_type)
        if _affinity(declared.get(column, "")) == _affinity(want) or column in self._key_columns(tx, name):
            return
        q, tmp = quote(name), quote("_sluice_retype")
        tx.execute(f"ALTER TABLE {q} ADD COLUMN {tmp} {want}")
        tx.execute(f"UPDATE {q} SET {tmp} = {quote(column)}")
        tx.execute(f"ALTER TABLE {q} DROP COLUMN {quote(column)}")
        tx.execute(f"ALTER TABLE {q} RENAME COLUMN {tmp} TO {quote(column)}")
        self._columns.pop(name, None)

    def _drop_table(self, tx: sqlite3.Connection, name: str) -> None:
        tx.execute(f"DROP TABLE IF EXISTS {quote(name)}")
        self._columns.pop(name, None)

    def _key_columns(self, tx: sqlite3.Connection, name: str) -> list[str]:
        return [r[1] for r in tx.execute(f"PRAGMA table_info({quote(name)})") if r[5] > 0]

    def _table_columns(self, tx: sqlite3.Connection, name: str) -> list[str]:
        cols = self._columns.get(name)
        if cols is None:
            cols = [r[1] for r in tx.execute(f"PRAGMA table_info({quote(name)})")]
            if cols:
                self._columns[name] = cols
        return cols

    def _ensure_table(
        self, tx: sqlite3.Connection, table: str, events: list[Change], types: TypesVariants
    ) -> str:
        """Create the target table, or add the columns this batch brings: typed by the source's
        column `types` through the mapping (sync/types.py), or, for a source that names none,
        inferred from the values (a column no value of the batch has is not created yet)."""
        m = self.mapping
        tm = m.for_table(table)
        name = m.target_table(table)
        wanted: dict[str, str] = {}  # target column -> its type
        existing = self._table_columns(tx, name)
        typed = merged_types(types)
        if typed and (not existing or any(m.target_column(table, c) not in existing for c in typed)):
            # a new table or column: the types through the schema changes the target recorded
            typed = target_types(self, tx, table, types)
        if typed:
            for src, source_type in typed.items():
                dst = m.target_column(table, src)
                if dst is not None:
                    wanted[dst] = tm.casts.get(dst) or sqlite_type(source_type)
        else:
            samples: dict[str, list[Any]] = {}
            for ev in events:
                for c, v in (ev.after or ev.key).items():
                    dst = m.target_column(table, c)
                    if dst is not None:
                        samples.setdefault(dst, []).append(v)
            for dst, vals in samples.items():
                if (
                    dst in tm.casts
                    or any(v is not None for v in vals)
                    or dst in key_targets(m, table, events)
                ):
                    wanted[dst] = tm.casts.get(dst) or infer_type(vals, "sqlite")
        if not existing:
            key_cols = [m.target_column(table, c) for c in events[0].key]
            if any(c is None for c in key_cols):
                raise ValueError(f"mapping for {table} drops a primary key column")
            defs = [f"{quote(c)} {t}" for c, t in wanted.items()]
            defs.append(f"{POS_COLUMN} INTEGER NOT NULL")
            pk = ", ".join(quote(c) for c in key_cols if c is not None)
            tx.execute(f"CREATE TABLE IF NOT EXISTS {quote(name)} ({', '.join(defs)}, PRIMARY KEY ({pk}))")
            self._columns.pop(name, None)
        else:
            if typed and name not in self._checked:
                self._checked.add(name)
                self._report_types(tx, name, wanted, tm.casts)
            for c, typ in wanted.items():
                if c not in existing:
                    tx.execute(f"ALTER TABLE {quote(name)} ADD COLUMN {quote(c)} {typ}")
            if POS_COLUMN not in existing:
                tx.execute(f"ALTER TABLE {quote(name)} ADD COLUMN {POS_COLUMN} INTEGER NOT NULL DEFAULT -1")
            self._columns.pop(name, None)
        return name

    def _report_types(
        self, tx: sqlite3.Connection, name: str, wanted: Mapping[str, str], casts: Mapping[str, str]
    ) -> None:
        """Say where an existing column's affinity is not the mapping's (made by an earlier
        version from one batch's values): values are converted to it."""
        declared = {r[1]: r[2] for r in tx.execute(f"PRAGMA table_info({quote(name)})")}
        for column, want in wanted.items():
            have = declared.get(column)
            if have is not None and column not in casts and _affinity(have) != _affinity(want):
                log.warning(
                    "event=target_column_type_mismatch table=%s column=%s have=%r want=%r detail=%r",
                    name, column, have, want,
                    "SQLite converts what is written to the column's affinity; re-create the table "
                    "(`sluice task restart ID --from-position snapshot` after dropping it) to get the "
                    "mapping's type",
                )  # fmt: skip

    def _write_table(
        self, tx: sqlite3.Connection, table: str, events: list[Change], guard: bool, types: TypesVariants
    ) -> int:
        m = self.mapping
        tm = m.for_table(table)
        name = self._ensure_table(tx, table, events, types)
        data_cols = [c for c in self._table_columns(tx, name) if c != POS_COLUMN]
        source_of = {m.target_column(table, c) or "": c for c in source_columns(events)}
        key_src = list(events[0].key)
        key_dst = [m.target_column(table, c) or c for c in key_src]
        q = quote(name)
        ph = ", ".join(f"CAST(? AS {tm.casts[c]})" if c in tm.casts else "?" for c in data_cols)
        cols = ", ".join(quote(c) for c in data_cols)
        sets = ", ".join(f"{quote(c)} = excluded.{quote(c)}" for c in data_cols if c not in key_dst)
        sets = (sets + ", " if sets else "") + f"{POS_COLUMN} = excluded.{POS_COLUMN}"
        if guard:
            upsert = (
                f"INSERT INTO {q} ({cols}, {POS_COLUMN}) SELECT {ph}, ? WHERE NOT EXISTS "
                "(SELECT 1 FROM _sluice_tombstones WHERE tbl = ? AND key = ? AND pos >= ?) AND NOT EXISTS "
                "(SELECT 1 FROM _sluice_truncates WHERE tbl = ? AND pos >= ?) "
                f"ON CONFLICT ({', '.join(quote(c) for c in key_dst)}) DO UPDATE SET {sets} "
                f"WHERE excluded.{POS_COLUMN} > {q}.{POS_COLUMN}"
            )
        else:
            upsert = (
                f"INSERT INTO {q} ({cols}, {POS_COLUMN}) SELECT {ph}, ? WHERE true "
                f"ON CONFLICT ({', '.join(quote(c) for c in key_dst)}) DO UPDATE SET {sets}"
            )
        ups: list[tuple[Any, ...]] = []
        dels: list[tuple[Any, ...]] = []
        stones: list[tuple[Any, ...]] = []
        for ev in events:
            kt = ev.kt
            if ev.after is None:
                keyvals = tuple(_sql_value(ev.key[c]) for c in key_src)
                dels.append((*keyvals, ev.pos) if guard else keyvals)
                stones.append((name, kt, ev.pos))
            else:
                row = tuple(_sql_value(ev.after.get(source_of.get(c, c))) for c in data_cols)
                ups.append((*row, ev.pos, name, kt, ev.pos, name, ev.pos) if guard else (*row, ev.pos))
        written = 0
        if ups:
            written += tx.executemany(upsert, ups).rowcount
        if dels:
            where = " AND ".join(f"{quote(c)} = ?" for c in key_dst)
            if guard:
                where += f" AND {POS_COLUMN} < ?"
            written += tx.executemany(f"DELETE FROM {q} WHERE {where}", dels).rowcount
            tx.executemany(
                "INSERT INTO _sluice_tombstones (tbl, key, pos) VALUES (?, ?, ?) ON CONFLICT (tbl, key) "
                "DO UPDATE SET pos = excluded.pos WHERE excluded.pos > pos",
                stones,
            )
        return written

    def read_rows(self, table: str) -> dict[str, dict[str, Any]]:
        name = self.mapping.target_table(table)
        info = list(self.conn.execute(f"PRAGMA table_info({quote(name)})"))
        if not info:
            return {}
        cols = [r[1] for r in info if r[1] != POS_COLUMN]
        key_cols = [r[1] for r in sorted(info, key=lambda r: r[5]) if r[5] > 0]
        out = {}
        for values in self.conn.execute(f"SELECT {', '.join(quote(c) for c in cols)} FROM {quote(name)}"):
            row = dict(zip(cols, values, strict=True))
            out[key_text({c: row[c] for c in key_cols})] = row
        return out


def _affinity(declared: str) -> str:
    """SQLite's type affinity of a declared column type (its documented rules, in order)."""
    d = declared.upper()
    if "INT" in d:
        return "INTEGER"
    if any(t in d for t in ("CHAR", "CLOB", "TEXT")):
        return "TEXT"
    if "BLOB" in d or not d:
        return "BLOB"
    if any(t in d for t in ("REAL", "FLOA", "DOUB")):
        return "REAL"
    return "NUMERIC"


_INT64 = range(-(2**63), 2**63)


def _sql_value(v: Any) -> Any:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int) and v not in _INT64:
        return str(v)  # BIGINT UNSIGNED above 2^63 - 1: a TEXT column (sync/types.py) holds its digits
    if isinstance(v, (dict, list)):
        return orjson.dumps(v).decode()
    return v
