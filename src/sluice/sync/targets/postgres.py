"""PostgreSQL target: COPY the batch into a staging table, then set-based SQL.

The collapsed changes go into a temporary table with one COPY whose payload is built in Arrow
(escaped and joined column-wise, never row by row in Python). Everything after that is SQL over
the whole batch, per table: one `INSERT ... SELECT ... ON CONFLICT DO UPDATE ... WHERE
target.pos < excluded.pos`, one `DELETE ... USING` and one tombstone upsert.

Bytes arrive as base64 text (the change's `binary` columns) and are stored in `bytea` columns,
decoded in SQL. PostgreSQL cannot store U+0000 in `text` or `jsonb`: that character is dropped
from the batch's values (counted, and logged with the table) rather than failing the batch on
every retry, which would stall the pipeline for good. In a primary key it is refused (the batch
fails with the record named): dropped, it would make two source rows one.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from sluice.security.secrets import Secret
from sluice.sync.changes import TypesVariants, types_variants
from sluice.sync.envelope import MAX_POS, SCHEMA, TRUNCATE, key_text
from sluice.sync.schema import DROP_COLUMN, DROP_TABLE, RENAME_COLUMN, Recorded
from sluice.sync.targets.base import (
    POS_COLUMN,
    ApplyResult,
    RefusalSink,
    quote,
)
from sluice.sync.targets.evolution import history_from_rows, merged_types, target_types
from sluice.sync.targets.mapping import ColumnMapping, MappingError
from sluice.sync.targets.pg_copy import NUL_ESCAPE, copy_payloads, nul_key_error, strip_nul
from sluice.sync.targets.staging import (
    STAGED_DDL,
    StagingTarget,
    binary_columns,
    changes_table,
)
from sluice.sync.types import postgres_type
from sluice.test_switches import OFF, Switches

log = logging.getLogger("sluice.target")

META = """
CREATE TABLE IF NOT EXISTS _sluice_fence (
    pipeline text PRIMARY KEY, epoch bigint NOT NULL, updated_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS _sluice_offsets (
    pipeline text NOT NULL, topic text NOT NULL, partition int NOT NULL, next_offset bigint NOT NULL,
    epoch bigint NOT NULL, updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, topic, partition));
CREATE TABLE IF NOT EXISTS _sluice_tombstones (
    tbl text NOT NULL, key text NOT NULL, pos bigint NOT NULL, PRIMARY KEY (tbl, key));
CREATE TABLE IF NOT EXISTS _sluice_truncates (tbl text PRIMARY KEY, pos bigint NOT NULL);
CREATE TABLE IF NOT EXISTS _sluice_schema (
    tbl text NOT NULL, pos bigint NOT NULL, change jsonb NOT NULL, applied boolean NOT NULL,
    PRIMARY KEY (tbl, pos));
"""

TEMP = """
CREATE TEMP TABLE IF NOT EXISTS _sluice_stage (
    key text, pos bigint, op text, after jsonb) ON COMMIT DELETE ROWS;
"""


#: JSON value kinds to column types for tables created from events.
_TYPES = {"string": "text", "boolean": "boolean", "object": "jsonb", "array": "jsonb"}


#: A staged row an earlier commit has not applied (`a`: the stored offsets, joined by partition).
_NOT_APPLIED = 's."offset" >= coalesce(a.next_offset, 0)'


class _BatchRows:
    """The SQL that selects one staged batch's rows: those of the summaries' tokens (`of_tokens`)
    and, of those, the ones not applied yet (`fresh`), with their parameters."""

    def __init__(self, stage: str, applied: Mapping[tuple[str, int], int], tokens: list[int]) -> None:
        self.stage = stage
        self.params: dict[str, Any] = {
            "topics": [t for t, _ in applied],
            "parts": [p for _, p in applied],
            "nexts": list(applied.values()),
            "tokens": tokens,
        }
        self.of_tokens = (
            f"FROM {quote(stage)} s LEFT JOIN unnest(%(topics)s::text[], %(parts)s::int[], "
            "%(nexts)s::bigint[]) AS a(topic, partition, next_offset) "
            "ON a.topic = s.topic AND a.partition = s.partition WHERE s.token = ANY(%(tokens)s)"
        )
        self.fresh = f"{self.of_tokens} AND {_NOT_APPLIED}"

    def first(self, tx: Any, where: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """The batch's first fresh change matching `where` (for an error naming it)."""
        row = tx.execute(
            f'SELECT s.topic, s.partition, s."offset", s.tbl, s.key {self.fresh} AND {where} '
            'ORDER BY s.topic, s.partition, s."offset" LIMIT 1',
            {**self.params, **params},
        ).fetchone()
        return dict(zip(("topic", "partition", "offset", "table", "key"), row, strict=True))

    def read(self, tx: Any) -> pa.Table:
        """The batch's fresh changes, newest per row, in the driver (`sync.changes.CHANGE_SCHEMA`)."""
        rows = tx.execute(
            'SELECT topic, partition, "offset", ts, tbl, key, pos, op, after, records, "binary", types FROM ('
            'SELECT DISTINCT ON (s.tbl, s.key) s.topic, s.partition, s."offset", s.ts, s.tbl, s.key, '
            f's.pos, s.op, s.after::text, s.records, s."binary", s.types {self.fresh} '
            'ORDER BY s.tbl, s.key, s.pos DESC, s."offset" DESC) b ORDER BY topic, partition, "offset"',
            self.params,
        ).fetchall()
        return changes_table(rows)


class PostgresTarget(StagingTarget):
    def __init__(
        self,
        url: str,
        mapping: ColumnMapping | None = None,
        tables: Collection[str] | None = None,
        password: Secret | None = None,
        switches: Switches = OFF,
        schema_change_policy: str = "evolve",
    ) -> None:
        import psycopg

        from sluice.sync.tasks import redact

        super().__init__(url, mapping, tables, switches, schema_change_policy)
        # The password goes to libpq apart from the URL, so the URL stays printable.
        extra: dict[str, Any] = {} if password is None else {"password": password.reveal()}
        try:
            self.conn = psycopg.connect(url, autocommit=False, **extra)
        except psycopg.OperationalError as exc:
            raise ConnectionError(f"cannot connect to the PostgreSQL target {redact(url)}: {exc}") from None
        with self.conn.transaction():
            self.conn.execute("SELECT pg_advisory_xact_lock(7170420)")  # serialise first-time DDL
            self.conn.execute(META)
        self.conn.commit()
        self._columns: dict[str, dict[str, str]] = {}
        self._keys: dict[str, list[str]] = {}
        self._reported: set[tuple[str, str]] = set()  # columns whose type was reported wrong

    def close(self) -> None:
        self.conn.close()

    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        try:
            with self.conn.transaction():
                self.conn.execute(TEMP)
                yield self.conn
        except BaseException:
            self._columns.clear()
            self._keys.clear()
            raise
        finally:
            self.conn.commit()

    def _lock_epoch(self, tx: Any, pipeline: str) -> int | None:
        tx.execute(
            "INSERT INTO _sluice_fence (pipeline, epoch) VALUES (%s, 0) ON CONFLICT (pipeline) DO NOTHING",
            (pipeline,),
        )
        row = tx.execute(
            "SELECT epoch FROM _sluice_fence WHERE pipeline = %s FOR UPDATE", (pipeline,)
        ).fetchone()
        return None if row is None or row[0] == 0 else int(row[0])

    def _peek_epoch(self, tx: Any, pipeline: str) -> int | None:
        row = tx.execute("SELECT epoch FROM _sluice_fence WHERE pipeline = %s", (pipeline,)).fetchone()
        return None if row is None or row[0] == 0 else int(row[0])

    def _set_epoch(self, tx: Any, pipeline: str, epoch: int) -> None:
        tx.execute(
            "UPDATE _sluice_fence SET epoch = %s, updated_at = now() WHERE pipeline = %s", (epoch, pipeline)
        )

    def _read_offsets(self, tx: Any, pipeline: str) -> dict[tuple[str, int], int]:
        rows = tx.execute(
            "SELECT topic, partition, next_offset FROM _sluice_offsets WHERE pipeline = %s", (pipeline,)
        ).fetchall()
        return {(t, int(p)): int(o) for t, p, o in rows}

    def _write_offsets(
        self, tx: Any, pipeline: str, epoch: int, offsets: Mapping[tuple[str, int], int]
    ) -> None:
        with tx.cursor() as cur:
            cur.executemany(
                "INSERT INTO _sluice_offsets (pipeline, topic, partition, next_offset, epoch) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (pipeline, topic, partition) DO UPDATE SET "
                "next_offset = greatest(_sluice_offsets.next_offset, excluded.next_offset), "
                "epoch = excluded.epoch, updated_at = now()",
                [(pipeline, t, p, o, epoch) for (t, p), o in offsets.items()],
            )

    # --- refusal isolation -----------------------------------------------------------------------
    def _savepoint(self, tx: Any) -> None:
        tx.execute("SAVEPOINT _sluice_rows")

    def _rollback_to(self, tx: Any) -> None:
        tx.execute("ROLLBACK TO SAVEPOINT _sluice_rows")
        self._columns.clear()  # a rolled-back ALTER/CREATE must be looked up again
        self._keys.clear()

    def _release(self, tx: Any) -> None:
        tx.execute("RELEASE SAVEPOINT _sluice_rows")

    def _is_refusal(self, exc: BaseException) -> bool:
        # IntegrityError: NOT NULL, CHECK, UNIQUE, FOREIGN KEY, exclusion; DataError (class 22):
        # a value the column cannot hold (text into an integer, out of range, too long, a failed
        # cast); MappingError: a column name the mapping cannot use. A lost connection
        # (OperationalError), a serialisation failure or a programming error is not a refusal.
        import psycopg

        return isinstance(exc, (psycopg.errors.IntegrityError, psycopg.errors.DataError, MappingError))

    # --- rows ------------------------------------------------------------------------------------
    def _apply_changes(self, tx: Any, changes: pa.Table, guard: bool) -> int:
        written = 0
        for table in sorted(pc.unique(changes.column("table")).to_pylist()):
            rows = changes.filter(pc.equal(changes["table"], table))
            rows, stripped = strip_nul(rows)
            if stripped:
                log.warning(
                    "event=nul_characters_dropped table=%s rows=%d reason=%r", table, stripped,
                    "PostgreSQL text cannot hold U+0000",
                )  # fmt: skip
            binary: set[str] = set()
            for text in pc.unique(rows["binary"].drop_null()).to_pylist():
                binary.update(orjson.loads(text))
            tx.execute("TRUNCATE _sluice_stage")
            with tx.cursor() as cur, cur.copy("COPY _sluice_stage (key, pos, op, after) FROM STDIN") as copy:
                for payload in copy_payloads(rows, ["key", "pos", "op", "after"]):
                    copy.write(payload)
            deletes = pc.sum(pc.equal(rows["op"], "d")).as_py() or 0
            written += self._write_table(
                tx, table, guard, upserts=rows.num_rows - deletes, deletes=deletes, binary=binary,
                types=types_variants(pc.unique(rows["types"]).to_pylist()),
            )  # fmt: skip
        return written

    def _apply_truncates(self, tx: Any, truncates: Mapping[str, int], guard: bool) -> int:
        deleted = 0
        for table, pos in sorted(truncates.items()):
            name = self.mapping.target_table(table)
            if self._load_table(tx, name):
                older = f" WHERE {POS_COLUMN} < %(pos)s" if guard else ""
                cur = tx.execute(f"DELETE FROM {quote(name)}{older}", {"pos": pos})
                deleted += max(cur.rowcount, 0)
            if guard:
                tx.execute(
                    "INSERT INTO _sluice_truncates (tbl, pos) VALUES (%(name)s, %(pos)s) ON CONFLICT (tbl) "
                    "DO UPDATE SET pos = greatest(_sluice_truncates.pos, excluded.pos)",
                    {"name": name, "pos": pos},
                )
                tx.execute(
                    "DELETE FROM _sluice_tombstones WHERE tbl = %(name)s AND pos < %(pos)s",
                    {"name": name, "pos": pos},
                )
        return deleted

    # --- schema changes (targets/evolution.py) ------------------------------------------------------
    def _read_schema_history(self, tx: Any, tables: list[str]) -> dict[str, list[Recorded]]:
        rows = tx.execute(
            "SELECT tbl, pos, change, applied FROM _sluice_schema WHERE tbl = ANY(%s) ORDER BY pos", (tables,)
        ).fetchall()
        return history_from_rows(rows)

    def _record_schema_change(
        self, tx: Any, table: str, pos: int, doc: Mapping[str, Any], applied: bool
    ) -> bool:
        cur = tx.execute(
            "INSERT INTO _sluice_schema (tbl, pos, change, applied) VALUES (%s, %s, %s::jsonb, %s) "
            "ON CONFLICT (tbl, pos) DO NOTHING",
            (table, pos, orjson.dumps(doc).decode(), applied),
        )
        return bool(cur.rowcount == 1)

    def _existing_columns(self, tx: Any, name: str) -> list[str]:
        return list(self._load_table(tx, name))

    def _forget(self, name: str) -> None:
        self._columns.pop(name, None)
        self._keys.pop(name, None)

    def _drop_column(self, tx: Any, name: str, column: str) -> None:
        tx.execute(f"ALTER TABLE {quote(name)} DROP COLUMN IF EXISTS {quote(column)}")
        self._forget(name)

    def _rename_column(self, tx: Any, name: str, old: str, new: str) -> None:
        tx.execute(f"ALTER TABLE {quote(name)} RENAME COLUMN {quote(old)} TO {quote(new)}")
        self._forget(name)

    def _change_column_type(self, tx: Any, name: str, column: str, source_type: str) -> None:
        current = self._load_table(tx, name).get(column)
        want = postgres_type(source_type)
        if current is None or current == want:
            return
        tx.execute(
            f"ALTER TABLE {quote(name)} ALTER COLUMN {quote(column)} TYPE {want} "
            f"USING {_convert(quote(column), current, want)}"
        )
        self._forget(name)

    def _drop_table(self, tx: Any, name: str) -> None:
        tx.execute(f"DROP TABLE IF EXISTS {quote(name)}")
        self._forget(name)

    def _load_table(self, tx: Any, name: str) -> dict[str, str]:
        cols = self._columns.get(name)
        if cols is None:
            rows = tx.execute(
                "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped "
                "ORDER BY a.attnum",
                (quote(name),),
            ).fetchall()
            cols = {c: t for c, t in rows}
            if cols:
                self._columns[name] = cols
                keys = tx.execute(
                    "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                    "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = to_regclass(%s) AND i.indisprimary "
                    "ORDER BY array_position(i.indkey, a.attnum)",
                    (quote(name),),
                ).fetchall()
                self._keys[name] = [k for (k,) in keys]
        return cols

    def _ensure_table(
        self, tx: Any, table: str, binary: Collection[str] = (), types: TypesVariants = ()
    ) -> str:
        """Create the target table, or add the columns this batch brings.

        With the source's column `types` (sync/types.py), every column gets the type the mapping
        gives its source type, whatever the batch's values (a column null throughout a batch
        too); an existing column of another type is reported with the statement that fixes it.
        Without them (a source that names no types), types are inferred from the staged rows'
        JSON values: columns in `binary` hold bytes (base64 in the stage) and become bytea (a
        text column becomes bytea when bytes arrive), a column no row of the batch has a value
        for is not created yet (its first value decides its type)."""
        m = self.mapping
        tm = m.for_table(table)
        name = m.target_table(table)
        existing = self._load_table(tx, name)
        known = set(_reverse(m, table, existing).values()) | set(tm.drop)
        typed = {src: postgres_type(t) for src, t in merged_types(types).items()}
        if typed and (not existing or self._differs(table, existing, typed, known)):
            # a new table, a new column or a type to report: the same types, now through the
            # schema changes the target recorded (renames, drops, a type change made before
            # the table existed here)
            typed = {src: postgres_type(t) for src, t in target_types(self, tx, table, types).items()}
        if typed:
            self._report_types(tx, table, name, existing, typed)
            new = [c for c in typed if c not in known and m.target_column(table, c) is not None]
        else:
            # the columns no row had before (known ones removed first: a third of the work)
            seen = [k for (k,) in tx.execute(
                "SELECT DISTINCT k FROM _sluice_stage, "
                "jsonb_object_keys(coalesce(after, key::jsonb) - %s::text[]) AS k",
                (sorted(known),),
            ).fetchall()]  # fmt: skip
            new = [k for k in seen if k not in known and m.target_column(table, k) is not None]
            retype = [
                dst for src in binary
                if (dst := m.target_column(table, src)) is not None and existing.get(dst) == "text"
                and dst not in tm.casts
            ]  # fmt: skip
            for dst in retype:
                tx.execute(
                    f"ALTER TABLE {quote(name)} ALTER COLUMN {quote(dst)} TYPE bytea "
                    f"USING decode({quote(dst)}, 'base64')"
                )
            if retype:
                self._columns.pop(name, None)
                existing = self._load_table(tx, name)
        if not new and existing:
            if POS_COLUMN not in existing:
                tx.execute(f"ALTER TABLE {quote(name)} ADD COLUMN {POS_COLUMN} bigint NOT NULL DEFAULT -1")
                self._columns.pop(name, None)
                self._load_table(tx, name)
            return name
        defs = []
        for src, typ in self._inferred(tx, new, binary) if not typed else [(c, typed[c]) for c in new]:
            dst = m.target_column(table, src)
            if dst is not None:
                defs.append((dst, tm.casts.get(dst, typ)))
        if not existing:
            key_src = tx.execute(
                "SELECT k FROM (SELECT key FROM _sluice_stage LIMIT 1) s, jsonb_object_keys(s.key::jsonb) k"
            ).fetchall()
            pk = [m.target_column(table, k) for (k,) in key_src]
            if any(c is None for c in pk):
                raise ValueError(f"mapping for {table} drops a primary key column")
            cols = ", ".join(f"{quote(c)} {t}" for c, t in defs)
            tx.execute(
                f"CREATE TABLE IF NOT EXISTS {quote(name)} ({cols}, {POS_COLUMN} bigint NOT NULL, "
                f"PRIMARY KEY ({', '.join(quote(c) for c in pk if c is not None)}))"
            )
        else:
            for c, t in defs:
                tx.execute(f"ALTER TABLE {quote(name)} ADD COLUMN IF NOT EXISTS {quote(c)} {t}")
            if POS_COLUMN not in existing:
                tx.execute(f"ALTER TABLE {quote(name)} ADD COLUMN {POS_COLUMN} bigint NOT NULL DEFAULT -1")
        self._columns.pop(name, None)
        self._load_table(tx, name)
        return name

    def _inferred(self, tx: Any, columns: list[str], binary: Collection[str]) -> list[tuple[str, str]]:
        """Column types for source `columns` from a sample of the staged rows' JSON values, for a
        source that names no types; a column whose values are all null is left out."""
        kinds = tx.execute(
            "SELECT e.k, (array_agg(jsonb_typeof(e.v)) FILTER (WHERE jsonb_typeof(e.v) <> 'null'))[1], "
            "bool_and(jsonb_typeof(e.v) <> 'number' OR e.v::text ~ '^-?[0-9]+$') "
            "FROM (SELECT after, key FROM _sluice_stage LIMIT 10000) s, "
            "jsonb_each(coalesce(s.after, s.key::jsonb)) AS e(k, v) "
            "WHERE e.k = ANY(%s) GROUP BY e.k ORDER BY e.k",
            (columns,),
        ).fetchall()
        out = []
        for src, kind, integral in kinds:
            if src in binary:
                out.append((src, "bytea"))
            elif kind == "number":
                out.append((src, "bigint" if integral else "double precision"))
            elif kind is not None:
                out.append((src, _TYPES.get(kind, "text")))
        return out

    def _differs(
        self, table: str, existing: Mapping[str, str], typed: Mapping[str, str], known: Collection[str]
    ) -> bool:
        """Whether a column of `typed` is new to the target, or of another type there and not
        reported yet."""
        m = self.mapping
        name, casts = m.target_table(table), m.for_table(table).casts
        for src, want in typed.items():
            dst = m.target_column(table, src)
            if dst is None or dst in casts:
                continue
            if src not in known or (existing.get(dst, want) != want and (name, dst) not in self._reported):
                return True
        return False

    def _report_types(
        self, tx: Any, table: str, name: str, existing: Mapping[str, str], typed: Mapping[str, str]
    ) -> None:
        """Say (once per column) where an existing column's type is not the mapping's: made by an
        earlier version from one batch's values, or by hand. It is kept (values are cast to it),
        and the log line holds the statement that makes it right."""
        m = self.mapping
        casts = m.for_table(table).casts
        for src, want in typed.items():
            dst = m.target_column(table, src)
            have = existing.get(dst or "")
            if dst is None or have is None or have == want or dst in casts or (name, dst) in self._reported:
                continue
            self._reported.add((name, dst))
            fix = (f"ALTER TABLE {quote(name)} ALTER COLUMN {quote(dst)} TYPE {want} "
                   f"USING {quote(dst)}::text::{want}")  # fmt: skip
            log.warning("event=target_column_type_mismatch table=%s column=%s have=%r want=%r fix=%r "
                        "detail=%r", name, dst, have, want, fix,
                        "values are cast to the column's type; run the fix in a quiet moment (it "
                        "rewrites the table) or re-create the table with `sluice task restart ID "
                        "--from-position snapshot`")  # fmt: skip

    def _write_table(
        self,
        tx: Any,
        table: str,
        guard: bool,
        *,
        upserts: int,
        deletes: int,
        binary: Collection[str],
        types: TypesVariants = (),
    ) -> int:
        """Apply the staged changes of one table: guarded upserts, guarded deletes, tombstones."""
        m = self.mapping
        tm = m.for_table(table)
        name = self._ensure_table(tx, table, binary, types)
        cols = self._columns[name]
        keys = self._keys.get(name) or []
        if not keys:
            raise ValueError(f"target table {name} has no primary key: the apply step upserts by key")
        reverse = _reverse(m, table, cols)
        data = [c for c in cols if c != POS_COLUMN and c in reverse]
        q = quote(name)
        params = {"name": name}
        written = 0
        if upserts:
            rec = ", ".join(f"{quote(reverse[c])} {_staged_type(c, cols, tm.casts)}" for c in data)
            sel = ", ".join(_staged_value(f"r.{quote(reverse[c])}", c, cols, tm.casts) for c in data)
            sets = [f"{quote(c)} = excluded.{quote(c)}" for c in data if c not in keys]
            sets.append(f"{POS_COLUMN} = excluded.{POS_COLUMN}")
            stones = (
                "LEFT JOIN _sluice_tombstones tb ON tb.tbl = %(name)s AND tb.key = s.key "
                "LEFT JOIN _sluice_truncates tr ON tr.tbl = %(name)s"
                if guard
                else ""
            )
            not_buried = (
                "AND (tb.pos IS NULL OR tb.pos < s.pos) AND (tr.pos IS NULL OR tr.pos < s.pos)"
                if guard
                else ""
            )
            newer = f"WHERE {q}.{POS_COLUMN} < excluded.{POS_COLUMN}" if guard else ""
            cur = tx.execute(
                f"INSERT INTO {q} ({', '.join(quote(c) for c in data)}, {POS_COLUMN}) "
                f"SELECT {sel}, s.pos FROM _sluice_stage s "
                f"CROSS JOIN LATERAL jsonb_to_record(s.after) AS r({rec}) "
                f"{stones} WHERE s.op <> 'd' {not_buried} "
                f"ON CONFLICT ({', '.join(quote(k) for k in keys)}) DO UPDATE SET {', '.join(sets)} {newer}",
                params,
            )
            written += max(cur.rowcount, 0)
        if deletes:
            krec = ", ".join(f"{quote(reverse.get(k, k))} {_staged_type(k, cols, {})}" for k in keys)
            kmatch = " AND ".join(
                f"{q}.{quote(k)} = {_staged_value('k.' + quote(reverse.get(k, k)), k, cols, {})}"
                for k in keys
            )
            older = f"AND {q}.{POS_COLUMN} < s.pos" if guard else ""
            cur = tx.execute(
                f"DELETE FROM {q} USING _sluice_stage s "
                f"CROSS JOIN LATERAL jsonb_to_record(s.key::jsonb) AS k({krec}) "
                f"WHERE s.op = 'd' AND {kmatch} {older}",
                params,
            )
            written += max(cur.rowcount, 0)
            tx.execute(
                "INSERT INTO _sluice_tombstones (tbl, key, pos) SELECT %(name)s, key, pos FROM _sluice_stage "
                "WHERE op = 'd' ON CONFLICT (tbl, key) DO UPDATE SET pos = excluded.pos "
                "WHERE _sluice_tombstones.pos < excluded.pos",
                params,
            )
        return written

    # --- batches staged by the executors (staging.py) ---------------------------------------------
    def _create_staging_table(self, name: str) -> None:
        with self.conn.transaction():
            self.conn.execute("SET LOCAL lock_timeout = '30s'")
            self.conn.execute(f"DROP TABLE IF EXISTS {quote(name)}")
            self.conn.execute(f"CREATE UNLOGGED TABLE {quote(name)} ({STAGED_DDL})")
        self.conn.commit()

    def _staging_tables(self, pattern: str) -> list[str]:
        rows = self.conn.execute(
            "SELECT relname FROM pg_class WHERE relkind = 'r' AND relname LIKE %s", (pattern,)
        ).fetchall()
        self.conn.commit()
        return [str(name) for (name,) in rows]

    def _try_staging_ddl(self, verb: str, table: str) -> str | None:
        import psycopg

        try:
            with self.conn.transaction():
                self.conn.execute("SET LOCAL lock_timeout = '2s'")
                self.conn.execute(f"{verb} {quote(table)}")
            return None
        except (psycopg.errors.LockNotAvailable, psycopg.errors.UndefinedTable) as exc:
            return type(exc).__name__
        finally:
            self.conn.commit()

    def _staged_rows(
        self, stage: str, pipeline: str, applied: Mapping[tuple[str, int], int], tokens: list[int]
    ) -> _BatchRows:
        return _BatchRows(stage, applied, tokens)

    def _staged_per_token(self, tx: Any, rows: _BatchRows) -> dict[int, tuple[int, int]]:
        if tx.execute("SELECT to_regclass(%s)", (quote(rows.stage),)).fetchone()[0] is None:
            return {}
        return {
            int(token): (int(n), int(fresh))
            for token, n, fresh in tx.execute(
                "SELECT s.token, count(*), coalesce(sum(s.records) FILTER (WHERE "
                f"{_NOT_APPLIED}), 0) {rows.of_tokens} GROUP BY s.token",
                rows.params,
            ).fetchall()
        }

    def _after_staged_commit(self, pipeline: str, batch: int, summaries: pa.Table) -> None:
        stripped = int(pc.max(summaries["nul_stripped"]).as_py() or 0) if summaries.num_rows else 0
        if stripped:
            log.warning("event=nul_characters_dropped pipeline=%s batch=%d rows=%d reason=%r",
                        pipeline, batch, stripped, "PostgreSQL text cannot hold U+0000")  # fmt: skip

    def _merge_staged(
        self, tx: Any, pipeline: str, rows: _BatchRows, on_refused: RefusalSink | None, result: ApplyResult
    ) -> int:
        """Write the batch's staged changes not applied yet into the target."""
        # One pass over the staging table: per table, its truncate, whether it has schema
        # changes or keys holding U+0000, the columns holding bytes, and the column types of
        # its newest change that names them.
        shape = tx.execute(
            "SELECT s.tbl, max(s.pos) FILTER (WHERE s.op = %(truncate)s), bool_or(s.op = %(schema)s), "
            "bool_or(strpos(s.key, %(nul)s) > 0), "
            'array_agg(DISTINCT s."binary") FILTER (WHERE s."binary" IS NOT NULL), '
            "array_agg(DISTINCT s.types) FILTER (WHERE s.types IS NOT NULL) "
            f"{rows.fresh} GROUP BY s.tbl ORDER BY s.tbl",
            {**rows.params, "truncate": TRUNCATE, "schema": SCHEMA, "nul": NUL_ESCAPE},
        ).fetchall()
        tables = [table for table, *_ in shape]
        self._refuse_tables(tables, lambda table: rows.first(tx, "s.tbl = %(tbl)s", {"tbl": table}))
        if any(nul for _, _, _, nul, _, _ in shape):
            raise nul_key_error(rows.first(tx, "strpos(s.key, %(nul)s) > 0", {"nul": NUL_ESCAPE}))
        if any(schema for _, _, schema, _, _, _ in shape) or self._needs_translation(tx, rows, tables):
            return self._from_driver(tx, pipeline, rows, on_refused, result)
        guard = not self.switches.disable_version_guard
        truncates = {table: pos for table, pos, *_ in shape if pos is not None}
        tables_of = {
            table: (binary_columns(texts), types_variants(types or []))
            for table, _, _, _, texts, types in shape
        }
        if on_refused is None:
            return self._merge_in_sql(tx, rows, truncates, tables_of, guard, result)
        self._savepoint(tx)
        try:
            written = self._merge_in_sql(tx, rows, truncates, tables_of, guard, result)
        except Exception as exc:
            if not self._is_refusal(exc):
                raise
            self._rollback_to(tx)
            self._release(tx)
            log.info("event=staged_batch_refused pipeline=%s reason=%r action=%r", pipeline, str(exc)[:200],
                     "isolating the refused changes in the driver")  # fmt: skip
            return self._from_driver(tx, pipeline, rows, on_refused, result)
        self._release(tx)
        return written

    def _from_driver(
        self, tx: Any, pipeline: str, rows: _BatchRows, on_refused: RefusalSink | None, result: ApplyResult
    ) -> int:
        """The batch's collapsed changes read into the driver and applied as `apply` does."""
        collapsed = rows.read(tx)
        result.changes = collapsed.num_rows
        return self._apply_collapsed(tx, pipeline, collapsed, on_refused, result)

    def _merge_in_sql(
        self,
        tx: Any,
        rows: _BatchRows,
        truncates: Mapping[str, int],
        tables: Mapping[str, tuple[set[str], TypesVariants]],
        guard: bool,
        result: ApplyResult,
    ) -> int:
        """Merge each table's staged changes: `tables` gives its columns holding bytes and its
        column types (empty when its source names none)."""
        written = 0
        result.changes = len(truncates)
        if truncates:
            written += self._apply_truncates(tx, truncates, guard)
        for table, (binary, types) in sorted(tables.items()):
            tx.execute("TRUNCATE _sluice_stage")
            # the newest change per row of this table (tasks collapsed their own rows only)
            upserts, deletes = tx.execute(
                "WITH moved AS (INSERT INTO _sluice_stage (key, pos, op, after) "
                "SELECT DISTINCT ON (s.key) s.key, s.pos, s.op, s.after "
                f"{rows.fresh} AND s.tbl = %(tbl)s AND s.op <> %(truncate)s "
                'ORDER BY s.key, s.pos DESC, s."offset" DESC RETURNING op) '
                "SELECT count(*) FILTER (WHERE op <> 'd'), count(*) FILTER (WHERE op = 'd') FROM moved",
                {**rows.params, "tbl": table, "truncate": TRUNCATE},
            ).fetchone()
            result.changes += upserts + deletes
            if upserts or deletes:
                written += self._write_table(
                    tx, table, guard, upserts=upserts, deletes=deletes, binary=binary, types=types
                )
        return written

    def _needs_translation(self, tx: Any, rows: _BatchRows, tables: list[str]) -> bool:
        """Whether rows of the batch are ones `evolution.translate_rows` would change: older than
        an applied rename, drop or table drop, at or after a rename the target did not take, or
        any row under `ignore` with changes not applied. Those batches go through the driver."""
        history = self._read_schema_history(tx, tables)
        for table, recs in history.items():
            if self.schema_change_policy == "ignore" and any(not r.applied for r in recs):
                return True
            moves = (RENAME_COLUMN, DROP_COLUMN, DROP_TABLE)
            older = [r.pos for r in recs if r.applied and r.change.kind in moves]
            later = [r.pos for r in recs if not r.applied and r.change.kind == RENAME_COLUMN]
            hit = tx.execute(
                f"SELECT 1 {rows.fresh} AND s.tbl = %(tbl)s AND (s.pos < %(older)s OR s.pos >= %(later)s) "
                "LIMIT 1",
                {**rows.params, "tbl": table, "older": max(older, default=-1),
                 "later": min(later, default=MAX_POS + 1)},
            ).fetchone()  # fmt: skip
            if hit is not None:
                return True
        return False

    def read_rows(self, table: str) -> dict[str, dict[str, Any]]:
        name = self.mapping.target_table(table)
        with self.conn.transaction():
            cols = self._load_table(self.conn, name)
            if not cols:
                return {}
            keys = self._keys.get(name) or []
            data = [c for c in cols if c != POS_COLUMN]
            rows = self.conn.execute(
                f"SELECT {', '.join(quote(c) for c in data)} FROM {quote(name)}"
            ).fetchall()
        self.conn.commit()
        out = {}
        for values in rows:
            row = dict(zip(data, values, strict=True))
            out[key_text({k: row[k] for k in keys})] = row
        return out


_NUMERIC_TYPES = ("bigint", "integer", "smallint", "double precision", "real", "numeric")
_NUMBER_TEXT = {
    "bigint": r"^\s*[-+]?[0-9]{1,18}\s*$",
    "double precision": r"^\s*[-+]?[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?\s*$",
}


def _convert(column: str, current: str, want: str) -> str:
    """A USING expression that never fails: values that do not convert become null (the source
    table is read again after a type change, and its rows bring the converted values)."""
    if want == "text":
        return f"{column}::text"
    if current in _NUMERIC_TYPES and want in _NUMERIC_TYPES:
        return f"{column}::{want}"
    if current == "text" and want in _NUMBER_TEXT:
        return f"CASE WHEN {column} ~ '{_NUMBER_TEXT[want]}' THEN {column}::{want} END"
    return f"NULL::{want}"


def _reverse(m: ColumnMapping, table: str, cols: Mapping[str, str]) -> dict[str, str]:
    """Target column -> source column, for the target's columns that some source column maps to."""
    tm = m.for_table(table)
    back = {dst: src for src, dst in tm.rename.items()}
    out = {}
    for c in cols:
        if c == POS_COLUMN:
            continue
        src = back.get(c, c)
        if src in tm.drop or (src in tm.rename and tm.rename[src] != c):
            continue
        out[c] = src
    return out


def _staged_type(column: str, cols: Mapping[str, str], casts: Mapping[str, str]) -> str:
    """The type a target column's value has in the stage's JSON (before any cast)."""
    if column in casts or cols[column] in ("bytea", "jsonb", "json"):
        return "text"  # cast in SQL; bytes are base64 text there, a JSON document its text
    return cols[column]


def _staged_value(expr: str, column: str, cols: Mapping[str, str], casts: Mapping[str, str]) -> str:
    if column in casts:
        return f"CAST({expr} AS {casts[column]})"
    if cols[column] == "bytea":
        return f"decode({expr}, 'base64')"
    if cols[column] in ("jsonb", "json"):
        # a source's JSON column arrives as the document's text (a JSON string); an object or
        # array value (a source without types) as its own JSON text: either reads as the document
        # (json keeps that text as it is: spacing, key order, duplicate keys)
        return f"CAST({expr} AS {cols[column]})"
    return expr
