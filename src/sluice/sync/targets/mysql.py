"""MySQL/MariaDB target: one InnoDB transaction per batch, multi-row upserts with the guard.

`mysql://user@host:port/db` (or `mariadb://`); the password comes apart from the URL, as for
PostgreSQL. The same `_sluice_*` tables as every target hold the fence, the offsets, the
tombstones, the truncate watermarks and the schema history, in the target database.

A batch is written as PostgreSQL's is, in SQL over many rows at a time: one multi-row
`INSERT ... ON DUPLICATE KEY UPDATE col = IF(_sluice_pos < VALUES(_sluice_pos), VALUES(col),
col)` per table and chunk (the position is assigned last, so each column's IF sees the row's old
position), deletes by a join with a temporary table of keys and positions, tombstones upserted
with `GREATEST`. Rows a tombstone or a truncate watermark at or above their position covers are
left out before the insert (both read under the fence's lock, in the same transaction).

Sessions run in UTC (`time_zone = '+00:00'`: TIMESTAMP values go in and come out as the
envelope's UTC text) and strict (`STRICT_ALL_TABLES`: a value a column cannot hold is an error,
so a refusal, never a silently changed value); zero dates are allowed, as the source allowed
them. Tables are created in utf8mb4 with a binary no-pad collation, so two keys the source tells
apart (`a` and `A`, `a` and `a `) stay two rows.

MySQL commits the open transaction before every DDL statement (CREATE TABLE, ALTER TABLE), so a
batch that creates a table, adds a column or applies a schema change commits in steps: after
each statement the fence row is locked again and its epoch checked, so a superseded execution
stops at the next step, and each step is safe to repeat (rows by the version guard, truncates by
their watermark, DDL checked against the table's columns first). A schema change is recorded in
`_sluice_schema` only after its DDL ran (`_ddl`): one that did not run is applied again by the
replay of its batch.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import struct
from collections import Counter
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa

from sluice.security.secrets import Secret
from sluice.sync.changes import TypesVariants, types_variants
from sluice.sync.envelope import MAX_POS, SCHEMA, TRUNCATE, key_text
from sluice.sync.schema import DROP_COLUMN, DROP_TABLE, RENAME_COLUMN, Recorded
from sluice.sync.targets.base import (
    POS_COLUMN,
    ApplyResult,
    RefusalSink,
    infer_type,
)
from sluice.sync.targets.evolution import history_from_rows, merged_types, target_types
from sluice.sync.targets.mapping import ColumnMapping, MappingError
from sluice.sync.targets.mysql_stage import (
    INTEGER_TEXT,
    INTEGER_TYPES,
    STAGED_DDL,
    exception_sql,
    json_path,
    parse_url,
    value_sql,
)
from sluice.sync.targets.rows import Change, changes_by_table, key_targets, source_columns
from sluice.sync.targets.staging import (
    StagingTarget,
    binary_columns,
    changes_table,
)
from sluice.sync.types import mysql_type, parse_type
from sluice.test_switches import OFF, Switches

log = logging.getLogger("sluice.target")

_TABLE_OPTIONS = "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={collation}"
META = (
    "CREATE TABLE IF NOT EXISTS _sluice_fence (pipeline VARCHAR(255) NOT NULL PRIMARY KEY, "
    "epoch BIGINT NOT NULL, updated_at TIMESTAMP(6) NULL DEFAULT CURRENT_TIMESTAMP(6)) " + _TABLE_OPTIONS,
    "CREATE TABLE IF NOT EXISTS _sluice_offsets (pipeline VARCHAR(255) NOT NULL, topic VARCHAR(255) NOT "
    "NULL, `partition` INT NOT NULL, next_offset BIGINT NOT NULL, epoch BIGINT NOT NULL, "
    "updated_at TIMESTAMP(6) NULL DEFAULT CURRENT_TIMESTAMP(6), PRIMARY KEY (pipeline, topic, `partition`)) "
    + _TABLE_OPTIONS,
    # keys can be longer than an index holds: the tombstone's index is the key text's SHA-256
    "CREATE TABLE IF NOT EXISTS _sluice_tombstones (tbl VARCHAR(64) NOT NULL, kh BINARY(32) NOT NULL, "
    "`key` LONGTEXT NOT NULL, pos BIGINT NOT NULL, PRIMARY KEY (tbl, kh)) " + _TABLE_OPTIONS,
    "CREATE TABLE IF NOT EXISTS _sluice_truncates (tbl VARCHAR(64) NOT NULL PRIMARY KEY, "
    "pos BIGINT NOT NULL) " + _TABLE_OPTIONS,
    "CREATE TABLE IF NOT EXISTS _sluice_schema (tbl VARCHAR(64) NOT NULL, pos BIGINT NOT NULL, "
    "`change` LONGTEXT NOT NULL, applied TINYINT NOT NULL, PRIMARY KEY (tbl, pos)) " + _TABLE_OPTIONS,
)

#: Strict (a value a column cannot hold is refused, never changed), zero dates allowed.
SQL_MODE = "STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION,NO_AUTO_VALUE_ON_ZERO,ERROR_FOR_DIVISION_BY_ZERO"
#: For rows holding ENUM's error value only (`_write_lax`): every warning is checked instead.
LAX_SQL_MODE = "NO_ENGINE_SUBSTITUTION,NO_AUTO_VALUE_ON_ZERO"

#: Server errors that mean "this row cannot be written" (a refusal: dead-lettered under
#: on_refused: dlq), not "the target failed": NOT NULL, duplicate and foreign keys, values out of
#: range, too long, of the wrong kind, bad dates, bad geometry, invalid JSON, CHECK constraints.
REFUSAL_CODES = frozenset(
    {1048, 1062, 1138, 1264, 1265, 1292, 1366, 1367, 1406, 1411, 1416, 1451, 1452, 1690, 3140, 3819, 4025}
)

#: Bytes of one multi-row statement (below every server's max_allowed_packet default).
CHUNK_BYTES = 4 << 20
#: InnoDB's longest index key (bytes), shared by a table's key columns.
KEY_BYTES = 3072
_BLOB_TYPES = frozenset({"tinyblob", "blob", "mediumblob", "longblob"})
_TEXT_TYPES = frozenset({"tinytext", "text", "mediumtext", "longtext", "json"})
_GEOMETRY_TYPES = frozenset({"geometry", "point", "linestring", "polygon", "multipoint", "multilinestring",
                             "multipolygon", "geometrycollection"})  # fmt: skip
_BYTE_TYPES = _BLOB_TYPES | _GEOMETRY_TYPES | {"binary", "varbinary"}


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class MySqlTarget(StagingTarget):
    def __init__(
        self,
        url: str,
        mapping: ColumnMapping | None = None,
        tables: Collection[str] | None = None,
        password: Secret | None = None,
        switches: Switches = OFF,
        schema_change_policy: str = "evolve",
    ) -> None:
        import pymysql

        from sluice.sync.tasks import redact

        super().__init__(url, mapping, tables, switches, schema_change_policy)
        args = parse_url(url)
        if password is not None:
            args["password"] = password.reveal()
        try:
            self.conn = pymysql.connect(
                **args, charset="utf8mb4", autocommit=True, connect_timeout=30,
                init_command=f"SET SESSION sql_mode = '{SQL_MODE}', time_zone = '+00:00'",
            )  # fmt: skip
        except pymysql.err.OperationalError as exc:
            raise ConnectionError(f"cannot connect to the MySQL target {redact(url)}: {exc}") from None
        self._one("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        version = self._one("SELECT VERSION()")
        # a binary collation that does not pad: `a` and `a ` are two keys, as the source had them
        self.collation = "utf8mb4_nopad_bin" if "mariadb" in str(version).lower() else "utf8mb4_0900_bin"
        options = _TABLE_OPTIONS.format(collation=self.collation)
        with self.conn.cursor() as cur:
            for ddl in META:
                cur.execute(ddl.replace(_TABLE_OPTIONS, options))
        self.conn.autocommit(False)
        self._columns: dict[str, dict[str, str]] = {}  # table -> column -> COLUMN_TYPE
        self._keys: dict[str, list[str]] = {}
        self._fence: tuple[str, int] | None = None  # the batch's pipeline and epoch, for `_ddl`
        self._unflushed: list[tuple[str, int, str, bool]] = []  # schema records not committed
        #: Tables of staged batches merged in SQL ("sql"), or from the driver, by why (`_sql_plan`);
        #: the changes merged in SQL ("sql-rows") and from the driver in an SQL table ("driver-rows").
        self.merges: Counter[str] = Counter()

    def _one(self, sql: str, args: Any = None) -> Any:
        with self.conn.cursor() as cur:
            cur.execute(sql, args)
            row = cur.fetchone()
        return None if row is None else row[0]

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass  # closed or broken already

    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        self.conn.begin()
        cur = self.conn.cursor()
        try:
            yield cur
            self.conn.commit()
        except BaseException:
            try:
                self.conn.rollback()
            except Exception:
                pass  # the connection is gone: the server rolls back
            self._columns.clear()
            self._keys.clear()
            raise
        finally:
            cur.close()
            self._fence = None
            self._unflushed.clear()

    def _lock_epoch(self, tx: Any, pipeline: str) -> int | None:
        tx.execute("INSERT IGNORE INTO _sluice_fence (pipeline, epoch) VALUES (%s, 0)", (pipeline,))
        tx.execute("SELECT epoch FROM _sluice_fence WHERE pipeline = %s FOR UPDATE", (pipeline,))
        row = tx.fetchone()
        return None if row is None or row[0] == 0 else int(row[0])

    def _peek_epoch(self, tx: Any, pipeline: str) -> int | None:
        tx.execute("SELECT epoch FROM _sluice_fence WHERE pipeline = %s", (pipeline,))
        row = tx.fetchone()
        return None if row is None or row[0] == 0 else int(row[0])

    def _set_epoch(self, tx: Any, pipeline: str, epoch: int) -> None:
        tx.execute(
            "UPDATE _sluice_fence SET epoch = %s, updated_at = CURRENT_TIMESTAMP(6) WHERE pipeline = %s",
            (epoch, pipeline),
        )

    def _check_fence(self, tx: Any, pipeline: str, epoch: int) -> None:
        super()._check_fence(tx, pipeline, epoch)
        self._fence = (pipeline, epoch)

    def _read_offsets(self, tx: Any, pipeline: str) -> dict[tuple[str, int], int]:
        tx.execute(
            "SELECT topic, `partition`, next_offset FROM _sluice_offsets WHERE pipeline = %s", (pipeline,)
        )
        return {(t, int(p)): int(o) for t, p, o in tx.fetchall()}

    def _write_offsets(
        self, tx: Any, pipeline: str, epoch: int, offsets: Mapping[tuple[str, int], int]
    ) -> None:
        if offsets:
            tx.executemany(
                "INSERT INTO _sluice_offsets (pipeline, topic, `partition`, next_offset, epoch) "
                "VALUES (%s, %s, %s, %s, %s) ON DUPLICATE KEY UPDATE "
                "next_offset = GREATEST(next_offset, VALUES(next_offset)), epoch = VALUES(epoch), "
                "updated_at = CURRENT_TIMESTAMP(6)",
                [(pipeline, t, p, o, epoch) for (t, p), o in offsets.items()],
            )

    # --- DDL inside a batch: MySQL commits before it ------------------------------------------------
    def _ddl(self, tx: Any, statement: str) -> None:
        """Run one DDL statement of a batch, then take the fence again (see the module docstring).
        Schema records of this batch not committed yet are held back over it and written again
        after, so a record is committed only with or after its DDL."""
        held = list(self._unflushed)
        for table, pos, _, _ in held:
            tx.execute("DELETE FROM _sluice_schema WHERE tbl = %s AND pos = %s", (table, pos))
        tx.execute(statement)  # commits what came before it, and itself
        self.conn.begin()
        if self._fence is not None:
            self._check_fence(tx, *self._fence)  # a newer execution took over meanwhile: stop here
        for row in held:
            tx.execute(
                "INSERT INTO _sluice_schema (tbl, pos, `change`, applied) VALUES (%s, %s, %s, %s)", row
            )

    # --- refusal isolation -----------------------------------------------------------------------
    def _savepoint(self, tx: Any) -> None:
        tx.execute("SAVEPOINT _sluice_rows")

    def _rollback_to(self, tx: Any) -> None:
        tx.execute("ROLLBACK TO SAVEPOINT _sluice_rows")

    def _release(self, tx: Any) -> None:
        tx.execute("RELEASE SAVEPOINT _sluice_rows")

    def _is_refusal(self, exc: BaseException) -> bool:
        import pymysql

        if isinstance(exc, MappingError):
            return True
        if isinstance(exc, pymysql.err.MySQLError) and exc.args and isinstance(exc.args[0], int):
            return exc.args[0] in REFUSAL_CODES
        return False

    # --- rows ------------------------------------------------------------------------------------
    def _write_isolating(
        self, tx: Any, changes: pa.Table, guard: bool, on_refused: RefusalSink | None, result: ApplyResult
    ) -> int:
        # tables and columns first, outside any savepoint (their DDL commits)
        for table, (rows, types) in changes_by_table(changes).items():
            self._ensure_table(tx, table, rows, types)
        return super()._write_isolating(tx, changes, guard, on_refused, result)

    def _apply_changes(self, tx: Any, changes: pa.Table, guard: bool) -> int:
        return sum(
            self._write_table(tx, table, rows, guard, types)
            for table, (rows, types) in sorted(changes_by_table(changes).items())
        )

    def _apply_truncates(self, tx: Any, truncates: Mapping[str, int], guard: bool) -> int:
        deleted = 0
        for table, pos in sorted(truncates.items()):
            name = self.mapping.target_table(table)
            if self._load(tx, name):
                older = f" WHERE {POS_COLUMN} < %s" if guard else ""
                deleted += tx.execute(f"DELETE FROM {quote(name)}{older}", (pos,) if guard else None)
            if guard:
                tx.execute(
                    "INSERT INTO _sluice_truncates (tbl, pos) VALUES (%s, %s) "
                    "ON DUPLICATE KEY UPDATE pos = GREATEST(pos, VALUES(pos))",
                    (name, pos),
                )
                tx.execute("DELETE FROM _sluice_tombstones WHERE tbl = %s AND pos < %s", (name, pos))
        return deleted

    def _write_table(
        self, tx: Any, table: str, events: list[Change], guard: bool, types: TypesVariants
    ) -> int:
        m = self.mapping
        name = self._ensure_table(tx, table, events, types)
        cols = self._columns[name]
        keys = self._keys.get(name) or []
        if not keys:
            raise ValueError(f"target table {name} has no primary key: the apply step upserts by key")
        data = [c for c in cols if c != POS_COLUMN]
        source_of = {m.target_column(table, c) or "": c for c in source_columns(events)}
        convert = {c: _converter(cols[c]) for c in data}
        hashes = {ev.kt: hashlib.sha256(ev.kt.encode()).digest() for ev in events}
        if guard:
            events = self._unburied(tx, name, events, hashes)
        written = 0
        upserts = [ev for ev in events if ev.after is not None]
        deletes = [ev for ev in events if ev.after is None]
        q = quote(name)
        if upserts:
            head = f"INSERT INTO {q} ({', '.join(quote(c) for c in data)}, {POS_COLUMN}) VALUES "
            tail = _upsert_tail(data, keys, guard)
            rows = [
                (*(convert[c](after.get(source_of.get(c, c))) for c in data), ev.pos)
                for ev in upserts
                if (after := ev.after) is not None
            ]
            # ENUM's error value '' (the source wrote it outside strict mode) cannot be written in
            # strict mode: those rows go one by one without it, and any warning but that one
            # refuses the row
            lax = [
                i
                for i, c in enumerate(data)
                if _base(cols[c]) == "enum" and "" not in parse_type(cols[c]).members
            ]
            errors = [r for r in rows if any(r[i] == "" for i in lax)] if lax else []
            if errors:
                rows = [r for r in rows if not any(r[i] == "" for i in lax)]
                written += self._write_lax(tx, head, tail, errors, {data[i] for i in lax})
            written += self._insert_rows(tx, head, tail, iter(rows))
        if deletes:
            key_src = {c: m.target_column(table, c) or c for c in deletes[0].key}
            back = {dst: src for src, dst in key_src.items()}
            tx.execute("DROP TEMPORARY TABLE IF EXISTS _sluice_deletes")
            tx.execute(
                f"CREATE TEMPORARY TABLE _sluice_deletes ENGINE=InnoDB SELECT "
                f"{', '.join(quote(k) for k in keys)}, {POS_COLUMN} FROM {q} WHERE 1 = 0"
            )
            self._insert_rows(
                tx,
                f"INSERT INTO _sluice_deletes ({', '.join(quote(k) for k in keys)}, {POS_COLUMN}) VALUES ",
                "",
                ((*(convert[k](ev.key.get(back.get(k, k))) for k in keys), ev.pos) for ev in deletes),
            )
            match = " AND ".join(f"t.{quote(k)} = d.{quote(k)}" for k in keys)
            older = f" WHERE t.{POS_COLUMN} < d.{POS_COLUMN}" if guard else ""
            written += tx.execute(f"DELETE t FROM {q} t JOIN _sluice_deletes d ON {match}{older}")
            tx.execute("DROP TEMPORARY TABLE _sluice_deletes")
            self._insert_rows(
                tx,
                "INSERT INTO _sluice_tombstones (tbl, kh, `key`, pos) VALUES ",
                " ON DUPLICATE KEY UPDATE `key` = VALUES(`key`), pos = GREATEST(pos, VALUES(pos))",
                ((name, hashes[ev.kt], ev.kt, ev.pos) for ev in deletes),
            )
        return written

    def _unburied(
        self, tx: Any, name: str, events: list[Change], hashes: Mapping[str, bytes]
    ) -> list[Change]:
        """The changes no tombstone of their row and no truncate of their table is at or above
        (a delete is always kept: it removes only older rows and leaves its tombstone)."""
        tx.execute("SELECT pos FROM _sluice_truncates WHERE tbl = %s", (name,))
        row = tx.fetchone()
        floor = -1 if row is None else int(row[0])
        stones: dict[bytes, int] = {}
        wanted = [hashes[ev.kt] for ev in events if ev.after is not None]
        for i in range(0, len(wanted), 1000):
            chunk = wanted[i : i + 1000]
            marks = ", ".join(["%s"] * len(chunk))
            tx.execute(
                f"SELECT kh, pos FROM _sluice_tombstones WHERE tbl = %s AND kh IN ({marks})", (name, *chunk)
            )
            stones.update((bytes(kh), int(pos)) for kh, pos in tx.fetchall())
        return [
            ev
            for ev in events
            if ev.after is None or (ev.pos > floor and ev.pos > stones.get(hashes[ev.kt], -1))
        ]

    def _write_lax(self, tx: Any, head: str, tail: str, rows: list[tuple[Any, ...]], enums: set[str]) -> int:
        import pymysql

        written = 0
        tx.execute(f"SET SESSION sql_mode = '{LAX_SQL_MODE}'")
        try:
            for row in rows:
                written += self._insert_rows(tx, head, tail, iter([row]))
                tx.execute("SHOW WARNINGS")
                for _level, code, message in tx.fetchall():
                    if not (code == 1265 and any(f"column '{c}'" in message for c in enums)):
                        raise pymysql.err.DataError(code, message)
        finally:
            tx.execute(f"SET SESSION sql_mode = '{SQL_MODE}'")
        return written

    def _insert_rows(self, tx: Any, head: str, tail: str, rows: Iterator[tuple[Any, ...]] | Any) -> int:
        """Multi-row INSERTs of `head` + rows + `tail`, a few MB each; return rows written (an
        upsert's update counts once, as an insert does)."""
        written = 0
        parts: list[str] = []
        size = 0
        escape = self.conn.escape

        def flush() -> int:
            n = tx.execute(head + ",".join(parts) + tail)
            info = tx._result.message if tx._result is not None else b""
            # "Records: N  Duplicates: D  Warnings: W": inserted N - D rows, each updated row
            # counts 2 in the affected rows
            dup = _info_number(info, b"Duplicates")
            if dup is None:
                return int(n)
            inserted = len(parts) - dup
            return inserted + max(int(n) - inserted, 0) // 2

        for row in rows:
            text = escape(row)
            parts.append(text)
            size += len(text)
            if size >= CHUNK_BYTES:
                written += flush()
                parts, size = [], 0
        if parts:
            written += flush()
        return written

    # --- tables and columns ----------------------------------------------------------------------
    def _load(self, tx: Any, name: str) -> dict[str, str]:
        cols = self._columns.get(name)
        if cols is None:
            tx.execute(
                "SELECT COLUMN_NAME, COLUMN_TYPE, COLUMN_KEY FROM information_schema.COLUMNS "
                "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
                (name,),
            )
            rows = tx.fetchall()
            cols = {str(c): str(t).lower() for c, t, _ in rows}
            if cols:
                self._columns[name] = cols
                tx.execute(
                    "SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() "
                    "AND TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX",
                    (name,),
                )
                self._keys[name] = [str(k) for (k,) in tx.fetchall()]
        return cols

    def _ensure_table(self, tx: Any, table: str, events: list[Change], types: TypesVariants) -> str:
        """Create the target table, or add the columns this batch brings: typed by the source's
        column `types` through the mapping (sync/types.py), or, for a source that names none,
        inferred from the values (a column no value of the batch has is not created yet)."""
        m = self.mapping
        tm = m.for_table(table)
        name = m.target_table(table)
        existing = self._load(tx, name)
        typed = merged_types(types)
        if existing and typed and all(_column_or_none(m, table, c) in existing or
                                      _column_or_none(m, table, c) is None for c in typed):  # fmt: skip
            return name
        if typed:
            typed = target_types(self, tx, table, types)
        wanted: dict[str, str] = {}
        if typed:
            for src, source_type in typed.items():
                dst = _column_or_none(m, table, src)
                if dst is not None:
                    wanted[dst] = tm.casts.get(dst) or mysql_type(source_type)
        else:
            keys = key_targets(m, table, events)
            samples: dict[str, list[Any]] = {}
            for ev in events:
                for c, v in (ev.after or ev.key).items():
                    dst = _column_or_none(m, table, c)
                    if dst is not None and dst not in existing:
                        samples.setdefault(dst, []).append(v)
            for dst, vals in samples.items():
                if dst in tm.casts or dst in keys or any(v is not None for v in vals):
                    wanted[dst] = tm.casts.get(dst) or infer_type(vals, "mysql")
        new = {c: t for c, t in wanted.items() if c not in existing}
        if existing and not new:
            return name
        if not existing:
            key_cols = [m.target_column(table, c) for c in events[0].key]
            if any(c is None for c in key_cols):
                raise ValueError(f"mapping for {table} drops a primary key column")
            pk = [c for c in key_cols if c is not None]
            for c in pk:
                wanted.setdefault(c, "longtext")
            sized = _key_types({c: wanted[c] for c in pk})
            defs = [f"{quote(c)} {sized[c]} NOT NULL" if c in sized else f"{quote(c)} {t} NULL"
                    for c, t in wanted.items()]  # fmt: skip
            defs.append(f"{POS_COLUMN} BIGINT NOT NULL")
            options = _TABLE_OPTIONS.format(collation=self.collation)
            self._ddl(
                tx,
                f"CREATE TABLE IF NOT EXISTS {quote(name)} ({', '.join(defs)}, "
                f"PRIMARY KEY ({', '.join(quote(c) for c in pk)})) {options}",
            )
        else:
            adds = [f"ADD COLUMN {quote(c)} {t} NULL" for c, t in new.items()]
            if POS_COLUMN not in existing:
                adds.append(f"ADD COLUMN {POS_COLUMN} BIGINT NOT NULL DEFAULT -1")
            self._ddl(tx, f"ALTER TABLE {quote(name)} {', '.join(adds)}")
        self._forget(name)
        self._load(tx, name)
        return name

    def _forget(self, name: str) -> None:
        self._columns.pop(name, None)
        self._keys.pop(name, None)

    # --- schema changes (targets/evolution.py) ------------------------------------------------------
    def _read_schema_history(self, tx: Any, tables: list[str]) -> dict[str, list[Recorded]]:
        if not tables:
            return {}
        tx.execute(
            f"SELECT tbl, pos, `change`, applied FROM _sluice_schema WHERE tbl IN "
            f"({', '.join(['%s'] * len(tables))}) ORDER BY pos",
            tables,
        )
        return history_from_rows(list(tx.fetchall()))

    def _record_schema_change(
        self, tx: Any, table: str, pos: int, doc: Mapping[str, Any], applied: bool
    ) -> bool:
        row = (table, pos, orjson.dumps(doc).decode(), applied)
        if not tx.execute(
            "INSERT IGNORE INTO _sluice_schema (tbl, pos, `change`, applied) VALUES (%s, %s, %s, %s)", row
        ):
            return False
        self._unflushed.append(row)
        return True

    def _existing_columns(self, tx: Any, name: str) -> list[str]:
        return list(self._load(tx, name))

    def _drop_column(self, tx: Any, name: str, column: str) -> None:
        self._load(tx, name)
        if column in self._keys.get(name, []):
            log.warning("event=schema_change_skipped table=%s column=%s reason=%r", name, column,
                        "the column is in the target table's primary key")  # fmt: skip
            return
        self._ddl(tx, f"ALTER TABLE {quote(name)} DROP COLUMN {quote(column)}")
        self._forget(name)

    def _rename_column(self, tx: Any, name: str, old: str, new: str) -> None:
        self._ddl(tx, f"ALTER TABLE {quote(name)} RENAME COLUMN {quote(old)} TO {quote(new)}")
        self._forget(name)

    def _change_column_type(self, tx: Any, name: str, column: str, source_type: str) -> None:
        """MODIFY the column, values that do not convert made the type's nearest (the source
        table is read again after a type change, and its rows bring the converted values)."""
        cols = self._load(tx, name)
        want = mysql_type(source_type)
        if cols.get(column) in (None, want) or column in self._keys.get(name, []):
            return
        tx.execute("SET SESSION sql_mode = ''")
        try:
            self._ddl(tx, f"ALTER TABLE {quote(name)} MODIFY COLUMN {quote(column)} {want} NULL")
        finally:
            tx.execute(f"SET SESSION sql_mode = '{SQL_MODE}'")
        self._forget(name)

    def _drop_table(self, tx: Any, name: str) -> None:
        self._ddl(tx, f"DROP TABLE IF EXISTS {quote(name)}")
        self._forget(name)

    # --- batches staged by the executors (mysql_stage.py) ------------------------------------------
    def _create_staging_table(self, name: str) -> None:
        options = _TABLE_OPTIONS.format(collation=self.collation)
        with self.conn.cursor() as cur:
            cur.execute("SET SESSION lock_wait_timeout = 30")
            try:
                cur.execute(f"DROP TABLE IF EXISTS {quote(name)}")
                cur.execute(f"CREATE TABLE {quote(name)} ({STAGED_DDL}) {options}")
            finally:
                cur.execute("SET SESSION lock_wait_timeout = DEFAULT")
        self.conn.commit()

    def _staging_tables(self, pattern: str) -> list[str]:
        return [
            str(name)
            for (name,) in self._rows(
                "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() "
                "AND TABLE_NAME LIKE %s",
                (pattern,),
            )
        ]

    def _rows(self, sql: str, args: Any = None) -> list[tuple[Any, ...]]:
        with self.conn.cursor() as cur:
            cur.execute(sql, args)
            rows = list(cur.fetchall())
        self.conn.commit()
        return rows

    def _try_staging_ddl(self, verb: str, table: str) -> str | None:
        import pymysql

        with self.conn.cursor() as cur:
            cur.execute("SET SESSION lock_wait_timeout = 2")
            try:
                cur.execute(f"{verb} {quote(table)}")
                return None
            except pymysql.err.MySQLError as exc:
                if not (exc.args and exc.args[0] in (1146, 1205)):  # no such table, lock wait
                    raise
                return str(exc.args[1])
            finally:
                cur.execute("SET SESSION lock_wait_timeout = DEFAULT")
                self.conn.commit()

    def _staged_rows(
        self, stage: str, pipeline: str, applied: Mapping[tuple[str, int], int], tokens: list[int]
    ) -> _Staged:
        return _Staged(stage, pipeline, tokens)

    def _staged_per_token(self, tx: Any, rows: _Staged) -> dict[int, tuple[int, int]]:
        tx.execute(
            "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() "
            "AND TABLE_NAME = %s",
            (rows.stage,),
        )
        if not tx.fetchone()[0]:
            return {}
        tx.execute(
            f"SELECT s.token, COUNT(*), COALESCE(SUM(IF({_NOT_APPLIED}, s.records, 0)), 0) "
            f"{rows.of_tokens} GROUP BY s.token",
            rows.params,
        )
        return {int(t): (int(n), int(fresh)) for t, n, fresh in tx.fetchall()}

    def _merge_staged(
        self, tx: Any, pipeline: str, rows: _Staged, on_refused: RefusalSink | None, result: ApplyResult
    ) -> int:
        """Write the batch's staged changes not applied yet: each table in SQL when
        `_sql_plan` has a plan for it, from the driver otherwise."""
        tables = self._shapes(tx, rows)
        self._refuse_tables(list(tables), lambda table: rows.first(tx, "s.tbl = %(tbl)s", {"tbl": table}))
        history = self._read_schema_history(tx, list(tables))
        plans: dict[str, _Plan] = {}
        guard = not self.switches.disable_version_guard
        written = 0
        for table, ts in list(tables.items()):
            if not ts.variants and not ts.schema and ts.truncate is not None:  # a truncate, nothing else
                written += self._apply_truncates(tx, {table: ts.truncate}, guard)
                result.changes += 1
                self.merges["sql"] += 1
                del tables[table]
                continue
            plan: _Plan | str = "schema" if ts.schema else "not-plain"
            if ts.plain and not ts.schema:
                plan = self._sql_plan(tx, rows, table, ts, history.get(table, []))
                if plan == "ddl":  # made or widened here (MySQL commits), then merged in SQL
                    self._prepare_table(tx, rows, table, ts)
                    plan = self._sql_plan(tx, rows, table, ts, history.get(table, []))
            if isinstance(plan, _Plan):
                plans[table] = plan
            else:
                log.info(
                    "event=staged_table_from_driver pipeline=%s table=%s reason=%s", pipeline, table, plan
                )
            self.merges[plan if isinstance(plan, str) else "sql"] += 1
        # the tables applied from the driver first: their DDL commits what came before it
        others = [t for t in tables if t not in plans]
        written += self._from_driver(tx, pipeline, rows, others, on_refused, result)
        # A table the server refuses is applied again from the driver: under dlq that isolates
        # the refused changes; without a sink the driver's error names the change and why (the
        # server's says only "Data truncated for column 'v' at row 1")
        refused = []
        action = "isolating the refused changes in the driver" if on_refused else "naming the refused change"
        for table, plan in sorted(plans.items()):
            truncate = tables[table].truncate
            self._savepoint(tx)
            counted = result.changes
            try:
                written += self._merge_table(tx, rows, table, plan, truncate, guard, result)
            except Exception as exc:
                if not self._is_refusal(exc):
                    raise
                self._rollback_to(tx)
                result.changes = counted
                log.info("event=staged_batch_refused pipeline=%s table=%s reason=%r action=%r", pipeline,
                         table, str(exc)[:200], action)  # fmt: skip
                refused.append(table)
                self.merges["refused"] += 1
            self._release(tx)
        if refused:
            written += self._from_driver(tx, pipeline, rows, refused, on_refused, result)
        return written

    def _shapes(self, tx: Any, rows: _Staged) -> dict[str, _Shape]:
        """What decides how each table of the batch is merged, from one pass over its fresh rows
        grouped by their `shape` hash (mysql_stage.staged_values), then one row of each shape."""
        tx.execute(
            "SELECT MIN(s.id), MAX(IF(s.op = %(truncate)s, s.pos, NULL)), MIN(s.plain) "
            f"{rows.fresh} GROUP BY s.shape",
            {**rows.params, "truncate": TRUNCATE},
        )
        groups = {int(first): (truncate, bool(plain)) for first, truncate, plain in tx.fetchall()}
        if not groups:
            return {}
        tx.execute(
            f"SELECT id, tbl, `binary`, types, cols, op FROM {quote(rows.stage)} "
            f"WHERE id IN ({', '.join(str(i) for i in groups)}) ORDER BY id"
        )
        out: dict[str, _Shape] = {}
        for first, table, binary, types, cols, op in tx.fetchall():
            ts = out.setdefault(str(table), _Shape())
            truncate, plain = groups[int(first)]
            if op == TRUNCATE:
                ts.truncate = max(int(truncate), -1 if ts.truncate is None else ts.truncate)
            elif op == SCHEMA:
                ts.schema = True
            else:
                ts.plain = ts.plain and plain
                ts.variants.append((binary, types))
                if types is None and cols is not None:
                    ts.members.update(orjson.loads(cols))
        return out

    def _from_driver(
        self,
        tx: Any,
        pipeline: str,
        rows: _Staged,
        tables: list[str],
        on_refused: RefusalSink | None,
        result: ApplyResult,
    ) -> int:
        """The fresh changes of `tables` read into the driver and applied as `apply` does."""
        if not tables:
            return 0
        collapsed = rows.read(tx, tables)
        result.changes += collapsed.num_rows
        return self._apply_collapsed(tx, pipeline, collapsed, on_refused, result)

    def _sql_plan(
        self, tx: Any, rows: _Staged, table: str, shape: _Shape, history: list[Recorded]
    ) -> _Plan | str:
        """How to merge a table's staged changes in SQL, or why they go through the driver
        (see mysql_stage.py): the key `merges` counts."""
        m = self.mapping
        variants = shape.variants
        texts = [types for _, types in variants if types is not None]
        if self.schema_change_policy == "ignore" and any(not r.applied for r in history):
            return "schema-ignored"
        try:
            name = m.target_table(table)
        except MappingError:
            return "mapping"
        if self._needs_translation(tx, rows, table, history):
            return "translation"  # before any DDL: rows older than a table's drop must not make it again
        cols = self._load(tx, name)
        keys = self._keys.get(name) or []
        # the columns: as the source's types name them, and those rows without types hold
        named = set(merged_types(types_variants(texts))) | shape.members
        sources: dict[str, str] = {}
        for src in sorted(named):
            dst = _column_or_none(m, table, src)
            if dst is None and src not in m.for_table(table).drop:
                return "mapping"  # a column the mapping cannot name: refused row by row
            if dst is not None:
                if dst not in cols:
                    return "ddl"  # the table is made or widened first
                sources[dst] = src
        data = [c for c in cols if c != POS_COLUMN]
        if not keys or any(c.startswith("_sluice_") or "%" in c for c in data) or "%" in name + table:
            return "names"
        binary = binary_columns(b for b, _ in variants)
        values = _value_plan("v", data, cols, sources, binary)
        key_values = _value_plan("k", keys, cols, sources, binary)
        if values is None or key_values is None:
            return "column-types"
        exceptions = [
            cond
            for c, path, _ in values
            if (cond := exception_sql(f"JSON_EXTRACT(`after`, {path})", cols[c])) is not None
        ]
        return _Plan(name, keys, values, key_values, " OR ".join(exceptions))

    def _prepare_table(self, tx: Any, rows: _Staged, table: str, shape: _Shape) -> None:
        """Create the table, or add the columns the batch brings, as the driver path would
        (`_ensure_table`): from the source's types and one change's key, or, for a source that
        names no types, from every change of the batch (its types are inferred from them all)."""
        texts = [t for _, t in shape.variants if t is not None]
        untyped = len(texts) < len(shape.variants)
        changes = rows.read(tx, [table], rows_only=True, limit=None if untyped else 1)
        if changes.num_rows:
            events, _ = changes_by_table(changes)[table]
            self._ensure_table(tx, table, events, types_variants(texts))

    def _needs_translation(self, tx: Any, rows: _Staged, table: str, history: list[Recorded]) -> bool:
        """Whether rows of the batch are ones `evolution.translate_rows` would change: older than
        an applied rename, drop or table drop, or at or after a rename the target did not take."""
        moves = (RENAME_COLUMN, DROP_COLUMN, DROP_TABLE)
        older = [r.pos for r in history if r.applied and r.change.kind in moves]
        later = [r.pos for r in history if not r.applied and r.change.kind == RENAME_COLUMN]
        if not older and not later:
            return False
        tx.execute(
            f"SELECT 1 {rows.fresh} AND s.tbl = %(tbl)s AND (s.pos < %(older)s OR s.pos >= %(later)s) "
            "LIMIT 1",
            {**rows.params, "tbl": table, "older": max(older, default=-1),
             "later": min(later, default=MAX_POS + 1)},
        )  # fmt: skip
        return tx.fetchone() is not None

    def _merge_table(
        self, tx: Any, rows: _Staged, table: str, plan: _Plan, truncate: int | None, guard: bool,
        result: ApplyResult,
    ) -> int:  # fmt: skip
        """One table's staged changes merged in SQL: its truncate, the newest change per key,
        guarded upserts, guarded deletes and their tombstones. Returns rows written."""
        written = 0
        if truncate is not None:
            written += self._apply_truncates(tx, {table: int(truncate)}, guard)
            result.changes += 1
        tx.execute("DROP TEMPORARY TABLE IF EXISTS _sluice_newest")
        tx.execute(
            f"CREATE TEMPORARY TABLE _sluice_newest ENGINE=InnoDB SELECT {_STAGED_CHANGE}, r.kh FROM "
            f"(SELECT s.*, ROW_NUMBER() OVER (PARTITION BY s.kh ORDER BY s.pos DESC, s.`offset` DESC) "
            f"AS _sluice_rn {rows.fresh} AND s.tbl = %(tbl)s AND s.op NOT IN (%(truncate)s, %(schema)s)) r "
            "WHERE r._sluice_rn = 1",
            {**rows.params, "tbl": table, "truncate": TRUNCATE, "schema": SCHEMA},
        )
        tx.execute("SELECT COALESCE(SUM(op <> 'd'), 0), COALESCE(SUM(op = 'd'), 0) FROM _sluice_newest")
        upserts, deletes = (int(n) for n in tx.fetchone())
        result.changes += upserts + deletes
        if upserts and plan.exceptions:  # those changes through the driver, the others in SQL
            odd = f"op <> 'd' AND COALESCE({plan.exceptions}, FALSE)"
            tx.execute(f"SELECT {_STAGED_CHANGE} FROM _sluice_newest r WHERE {odd} ORDER BY pos")
            changes = changes_table(list(tx.fetchall()))
            if changes.num_rows:
                tx.execute(f"DELETE FROM _sluice_newest WHERE {odd}")
                upserts -= changes.num_rows
                written += self._apply_changes(tx, changes, guard)
                self.merges["driver-rows"] += changes.num_rows
        self.merges["sql-rows"] += upserts + deletes
        q = quote(plan.name)
        if upserts:
            extracts = _extracts("n.`after`", plan.values)
            unburied = ""
            args: dict[str, Any] = {"name": plan.name}
            if guard:
                tx.execute("SELECT pos FROM _sluice_truncates WHERE tbl = %s", (plan.name,))
                floor = tx.fetchone()
                args["floor"] = -1 if floor is None else int(floor[0])
                unburied = (
                    " AND n.pos > %(floor)s AND NOT EXISTS (SELECT 1 FROM _sluice_tombstones b "
                    "WHERE b.tbl = %(name)s AND b.kh = n.kh AND b.pos >= n.pos)"
                )
            tx.execute("DROP TEMPORARY TABLE IF EXISTS _sluice_values")
            tx.execute(
                f"CREATE TEMPORARY TABLE _sluice_values ENGINE=InnoDB SELECT n.pos AS _sluice_p, {extracts} "
                f"FROM _sluice_newest n WHERE n.op <> 'd'{unburied}",
                args,
            )
            data = [c for c, _, _ in plan.values]
            n = tx.execute(
                f"INSERT INTO {q} ({', '.join(quote(c) for c in data)}, {POS_COLUMN}) SELECT "
                f"{', '.join(expr for _, _, expr in plan.values)}, v._sluice_p FROM _sluice_values v "
                + _upsert_tail(data, plan.keys, guard)
            )
            written += _upserted(int(n), tx._result.message if tx._result is not None else b"")
            tx.execute("DROP TEMPORARY TABLE _sluice_values")
        if deletes:
            keys = ", ".join(quote(k) for k in plan.keys)
            tx.execute("DROP TEMPORARY TABLE IF EXISTS _sluice_deletes")
            tx.execute(
                f"CREATE TEMPORARY TABLE _sluice_deletes ENGINE=InnoDB SELECT {keys}, {POS_COLUMN} "
                f"FROM {q} WHERE 1 = 0"
            )
            extracts = _extracts("n.`key`", plan.key_values)
            tx.execute(
                f"INSERT INTO _sluice_deletes ({keys}, {POS_COLUMN}) SELECT "
                f"{', '.join(expr for _, _, expr in plan.key_values)}, k._sluice_p FROM "
                f"(SELECT n.pos AS _sluice_p, {extracts} FROM _sluice_newest n WHERE n.op = 'd') k"
            )
            match = " AND ".join(f"t.{quote(k)} = d.{quote(k)}" for k in plan.keys)
            older = f" WHERE t.{POS_COLUMN} < d.{POS_COLUMN}" if guard else ""
            written += tx.execute(f"DELETE t FROM {q} t JOIN _sluice_deletes d ON {match}{older}")
            tx.execute("DROP TEMPORARY TABLE _sluice_deletes")
            tx.execute(
                "INSERT INTO _sluice_tombstones (tbl, kh, `key`, pos) SELECT * FROM (SELECT %s AS _sluice_t, "
                "n.kh AS _sluice_h, n.`key` AS _sluice_k, n.pos AS _sluice_p FROM _sluice_newest n "
                "WHERE n.op = 'd') x "
                "ON DUPLICATE KEY UPDATE `key` = VALUES(`key`), pos = GREATEST(pos, VALUES(pos))",
                (plan.name,),
            )
        tx.execute("DROP TEMPORARY TABLE _sluice_newest")
        return written

    # --- reading back ----------------------------------------------------------------------------
    def select(self, name: str, columns: list[str], where: str, params: Any) -> list[tuple[Any, ...]]:
        """Rows of `columns` of a target table matching `where` (`%s` marks), each value as
        `read_rows` reads it; none when the table does not exist yet (verify's reads)."""
        with self._transaction() as tx:
            cols = self._load(tx, name)
            if not cols:
                return []
            exprs = ", ".join(_read_expr(c, cols.get(c, "")) for c in columns)
            tx.execute(f"SELECT {exprs} FROM {quote(name)} WHERE {where}", params)
            return list(tx.fetchall())

    def read_rows(self, table: str) -> dict[str, dict[str, Any]]:
        """Every row, each value as the server holds it: FLOAT widened to DOUBLE (the text
        protocol would round it), BIT as its n `0`/`1` characters."""
        name = self.mapping.target_table(table)
        with self._transaction() as tx:
            cols = self._load(tx, name)
            if not cols:
                return {}
            keys = self._keys.get(name) or []
            data = [c for c in cols if c != POS_COLUMN]
            tx.execute(f"SELECT {', '.join(_read_expr(c, cols[c]) for c in data)} FROM {quote(name)}")
            rows = tx.fetchall()
        out = {}
        for values in rows:
            row = dict(zip(data, values, strict=True))
            out[key_text({k: row[k] for k in keys})] = row
        return out


#: A staged row an earlier commit has not applied (`a`: the stored offsets, joined by partition).
_NOT_APPLIED = "s.`offset` >= COALESCE(a.next_offset, 0)"


#: A staged change's columns as `staging.changes_table` reads them (`r`: the staged row).
_STAGED_CHANGE = (
    "r.topic, r.`partition`, r.`offset`, r.ts, r.tbl, r.`key`, r.pos, r.op, r.`after`, r.records, "
    "r.`binary`, r.types"
)


class _Staged:
    """The SQL that selects one staged batch's rows: those of the summaries' tokens (`of_tokens`)
    and, of those, the ones not applied yet (`fresh`), with their parameters."""

    def __init__(self, stage: str, pipeline: str, tokens: list[int]) -> None:
        self.stage = stage
        self.params: dict[str, Any] = {"pipeline": pipeline}
        listed = ", ".join(str(int(t)) for t in tokens)
        self.of_tokens = (
            f"FROM {quote(stage)} s LEFT JOIN _sluice_offsets a ON a.pipeline = %(pipeline)s "
            f"AND a.topic = s.topic AND a.`partition` = s.`partition` WHERE s.token IN ({listed})"
        )
        self.fresh = f"{self.of_tokens} AND {_NOT_APPLIED}"

    def first(self, tx: Any, where: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """The batch's first fresh change matching `where` (for an error naming it)."""
        tx.execute(
            f"SELECT s.topic, s.`partition`, s.`offset`, s.tbl, s.`key` {self.fresh} AND {where} "
            "ORDER BY s.topic, s.`partition`, s.`offset` LIMIT 1",
            {**self.params, **params},
        )
        return dict(zip(("topic", "partition", "offset", "table", "key"), tx.fetchone(), strict=True))

    def read(self, tx: Any, tables: list[str], rows_only: bool = False, limit: int | None = None) -> pa.Table:
        """The fresh changes of `tables`, newest per row, in the driver (`changes.CHANGE_SCHEMA`);
        with `rows_only`, their row changes (no truncate or schema change), at most `limit`."""
        marks = ", ".join(f"%(t{i})s" for i in range(len(tables)))
        only = f" AND r.op NOT IN ('{TRUNCATE}', '{SCHEMA}')" if rows_only else ""
        tx.execute(
            f"SELECT {_STAGED_CHANGE} FROM (SELECT s.*, ROW_NUMBER() OVER (PARTITION BY s.kh, s.tbl "
            f"ORDER BY s.pos DESC, s.`offset` DESC) AS _sluice_rn {self.fresh} AND s.tbl IN ({marks})) r "
            f"WHERE r._sluice_rn = 1{only} ORDER BY r.topic, r.`partition`, r.`offset`"
            + ("" if limit is None else f" LIMIT {int(limit)}"),
            {**self.params, **{f"t{i}": t for i, t in enumerate(tables)}},
        )
        return changes_table(list(tx.fetchall()))


@dataclass
class _Shape:
    """One table's part of a staged batch: its truncate, whether it has schema changes, whether
    all its rows are `plain`, its rows' (binary, types) variants, and the members of its rows
    that name no types."""

    truncate: int | None = None
    schema: bool = False
    plain: bool = True
    variants: list[tuple[str | None, str | None]] = field(default_factory=list)
    members: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class _Plan:
    """How one table's staged changes are merged in SQL: the target table, its key, and per
    column (data, and key for deletes) its name, JSON path and value SQL (`mysql_stage.value_sql`);
    changes holding a value the SQL would not write as the driver does go through the driver."""

    name: str
    keys: list[str]
    values: list[tuple[str, str, str]]
    key_values: list[tuple[str, str, str]]
    #: A condition on a staged change's `after` for values the driver writes (`exception_sql`).
    exceptions: str = ""


def _upsert_tail(data: list[str], keys: list[str], guard: bool) -> str:
    """The ON DUPLICATE KEY UPDATE of an upsert: with the guard, each column (the position
    last, so each IF sees the row's old one) takes the new value only from a newer change."""
    if guard:
        newer = f"{POS_COLUMN} < VALUES({POS_COLUMN})"
        sets = [f"{quote(c)} = IF({newer}, VALUES({quote(c)}), {quote(c)})" for c in data if c not in keys]
        sets.append(f"{POS_COLUMN} = GREATEST({POS_COLUMN}, VALUES({POS_COLUMN}))")
    else:
        sets = [f"{quote(c)} = VALUES({quote(c)})" for c in data if c not in keys]
        sets.append(f"{POS_COLUMN} = VALUES({POS_COLUMN})")
    return " ON DUPLICATE KEY UPDATE " + ", ".join(sets)


def _value_plan(
    alias: str, columns: list[str], cols: Mapping[str, str], sources: Mapping[str, str], binary: set[str]
) -> list[tuple[str, str, str]] | None:
    """Each column's (name, JSON path of its source column, value SQL over `alias._sluice_j<i>`),
    or None when one has no exact SQL (`mysql_stage.value_sql`)."""
    out = []
    for i, c in enumerate(columns):
        src = sources.get(c, c)
        path = json_path(src)
        expr = None if path is None else value_sql(f"{alias}._sluice_j{i}", cols[c], src in binary)
        if path is None or expr is None:
            return None
        out.append((c, path, expr))
    return out


def _extracts(doc: str, plan: list[tuple[str, str, str]]) -> str:
    """The JSON_EXTRACTs `_value_plan`'s SQL reads, each member taken out of `doc` once."""
    return ", ".join(f"JSON_EXTRACT({doc}, {path}) AS _sluice_j{i}" for i, (_, path, _) in enumerate(plan))


def _upserted(affected: int, info: bytes | str | None) -> int:
    """Rows an `INSERT ... ON DUPLICATE KEY UPDATE` wrote, from its affected rows and its info
    ("Records: N  Duplicates: D"): an inserted row counts 1, an updated one 2, an unchanged 0."""
    records, dup = _info_number(info, b"Records"), _info_number(info, b"Duplicates")
    if records is None or dup is None:
        return affected
    inserted = records - dup
    return inserted + max(affected - inserted, 0) // 2


def _column_or_none(m: ColumnMapping, table: str, column: str) -> str | None:
    """The target column, or None for one the mapping cannot name (its rows are refused when
    written, one by one under `on_refused: dlq`; the table is made for the others)."""
    try:
        return m.target_column(table, column)
    except MappingError:
        return None


def _info_number(info: bytes | str | None, label: bytes) -> int | None:
    if not info:
        return None
    text = info if isinstance(info, bytes) else info.encode()
    at = text.find(label + b": ")
    if at < 0:
        return None
    digits = text[at + len(label) + 2 :].split(b" ", 1)[0]
    return int(digits) if digits.isdigit() else None


def _base(column_type: str) -> str:
    return column_type.lower().split("(", 1)[0].split(" ", 1)[0]


def _key_types(types: Mapping[str, str]) -> dict[str, str]:
    """Key columns' types, those that cannot be indexed whole (TEXT, BLOB, JSON) made VARCHAR /
    VARBINARY sharing what the index holds (a longer key is refused when written)."""
    unsized = [c for c, t in types.items() if _base(t) in _TEXT_TYPES | _BLOB_TYPES]
    if not unsized:
        return dict(types)
    budget = max((KEY_BYTES - 16 * (len(types) - len(unsized))) // len(unsized), 64)
    out = dict(types)
    for c in unsized:
        out[c] = f"varbinary({budget})" if _base(types[c]) in _BLOB_TYPES else f"varchar({budget // 4})"
    return out


def _converter(column_type: str) -> Any:
    """How an envelope value (JSON, bytes already decoded) is written to a column of this type."""
    base = _base(column_type)
    if base == "float":
        return _float32
    if base in ("datetime", "timestamp"):
        return _stamp
    if base == "bit":
        return _bits
    if base == "json":
        return _json_text
    if base in _BYTE_TYPES:
        return _bytes
    if base in INTEGER_TYPES:
        return _integer
    return _plain


def _plain(v: Any) -> Any:
    if isinstance(v, (dict, list)):
        return orjson.dumps(v).decode()
    return v


def _integer(v: Any) -> Any:
    """An integer column's value. A number with a fraction is refused, not rounded as the server
    rounds it (1.5 to 2, '0.25' to 0, even in strict mode): the row would hold another value
    than the source's. A whole float is the integer it is (1e3: 1000); a string must be an
    integer's text (`mysql_stage.INTEGER_TEXT`). The staged path's SQL does the same
    (`mysql_stage.value_sql`)."""
    if isinstance(v, float):
        if not v.is_integer():
            raise MappingError(f"{v!r} has a fraction; an integer column cannot hold it")
        return int(v)
    if isinstance(v, str) and not re.match(INTEGER_TEXT, v):
        raise MappingError(f"{v!r} is not an integer; an integer column cannot hold it")
    return _plain(v)


def _float32(v: Any) -> Any:
    """A FLOAT's value as the exact double of the float32 it names: the envelope's shortest text
    of FLT_MAX (3.4028235e38) is above FLT_MAX as a double, which the server refuses."""
    if isinstance(v, float) and math.isfinite(v):
        try:
            return struct.unpack("<f", struct.pack("<f", v))[0]
        except OverflowError:
            return v  # beyond float32: the server refuses it
    return v


def _stamp(v: Any) -> Any:
    if isinstance(v, str):
        v = v.replace("T", " ", 1)
        return v[:-1] if v.endswith("Z") else v
    return v


def _bits(v: Any) -> Any:
    if isinstance(v, str) and v and not v.strip("01"):
        return int(v, 2)
    return v


def _json_text(v: Any) -> Any:
    if v is None or isinstance(v, str):
        return v  # a source's JSON column: the document's text
    return orjson.dumps(v).decode()  # a value of a source without types


def _bytes(v: Any) -> Any:
    if isinstance(v, str):
        return v.encode()
    return v


def _read_expr(column: str, column_type: str) -> str:
    c = quote(column)
    base = _base(column_type)
    if base == "float":
        return f"CAST({c} AS DOUBLE)"
    if base == "bit":
        width = column_type[4:].strip("()") or "1"
        return f"LPAD(BIN({c}), {int(width)}, '0')"
    return c
