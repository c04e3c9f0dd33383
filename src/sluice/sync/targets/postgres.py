"""PostgreSQL target: COPY the batch into a staging table, then set-based SQL.

The collapsed changes go into a temporary table with one COPY whose payload is built in Arrow
(escaped and joined column-wise, never row by row in Python). Everything after that is SQL over
the whole batch, per table: one `INSERT ... SELECT ... ON CONFLICT DO UPDATE ... WHERE
target.pos < excluded.pos`, one `DELETE ... USING` and one tombstone upsert.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sluice.sync.envelope import key_text
from sluice.sync.targets.base import POS_COLUMN, ColumnMapping, Target, quote

META = """
CREATE TABLE IF NOT EXISTS _sluice_fence (
    pipeline text PRIMARY KEY, epoch bigint NOT NULL, updated_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS _sluice_offsets (
    pipeline text NOT NULL, topic text NOT NULL, partition int NOT NULL, next_offset bigint NOT NULL,
    epoch bigint NOT NULL, updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, topic, partition));
CREATE TABLE IF NOT EXISTS _sluice_tombstones (
    tbl text NOT NULL, key text NOT NULL, pos bigint NOT NULL, PRIMARY KEY (tbl, key));
"""

TEMP = """
CREATE TEMP TABLE IF NOT EXISTS _sluice_stage (
    key text, pos bigint, op text, after jsonb) ON COMMIT DELETE ROWS;
"""


#: JSON value kinds to column types for tables created from events.
_TYPES = {"string": "text", "boolean": "boolean", "object": "jsonb", "array": "jsonb"}


class PostgresTarget(Target):
    def __init__(self, url: str, mapping: ColumnMapping | None = None) -> None:
        import psycopg

        super().__init__(url, mapping)
        try:
            self.conn = psycopg.connect(url, autocommit=False)
        except psycopg.OperationalError as exc:
            raise ConnectionError(f"cannot connect to the PostgreSQL target {url}: {exc}") from None
        with self.conn.transaction():
            self.conn.execute("SELECT pg_advisory_xact_lock(7170420)")  # serialise first-time DDL
            self.conn.execute(META)
        self.conn.commit()
        self._columns: dict[str, dict[str, str]] = {}
        self._keys: dict[str, list[str]] = {}

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

    # --- rows ------------------------------------------------------------------------------------
    def _apply_changes(self, tx: Any, changes: pa.Table, guard: bool) -> int:
        written = 0
        for table in sorted(pc.unique(changes.column("table")).to_pylist()):
            rows = changes.filter(pc.equal(changes["table"], table))
            tx.execute("TRUNCATE _sluice_stage")
            with tx.cursor() as cur, cur.copy("COPY _sluice_stage (key, pos, op, after) FROM STDIN") as copy:
                copy.write(copy_text(rows, ["key", "pos", "op", "after"]))
            deletes = pc.sum(pc.equal(rows["op"], "d")).as_py() or 0
            written += self._write_table(tx, table, guard, upserts=rows.num_rows - deletes, deletes=deletes)
        return written

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

    def _ensure_table(self, tx: Any, table: str) -> str:
        """Create the target table, or add the columns this batch brings, from the staged rows."""
        m = self.mapping
        tm = m.for_table(table)
        name = m.target_table(table)
        existing = self._load_table(tx, name)
        known = set(_reverse(m, table, existing).values()) | set(tm.drop)
        seen = [k for (k,) in tx.execute(
            "SELECT DISTINCT k FROM _sluice_stage, jsonb_object_keys(coalesce(after, key::jsonb)) AS k"
        ).fetchall()]  # fmt: skip
        new = [k for k in seen if k not in known and m.target_column(table, k) is not None]
        if not new and existing:
            if POS_COLUMN not in existing:
                tx.execute(f"ALTER TABLE {quote(name)} ADD COLUMN {POS_COLUMN} bigint NOT NULL DEFAULT -1")
                self._columns.pop(name, None)
                self._load_table(tx, name)
            return name
        # Types come from a sample of the batch; a column null throughout it becomes text.
        kinds = tx.execute(
            "SELECT e.k, (array_agg(jsonb_typeof(e.v)) FILTER (WHERE jsonb_typeof(e.v) <> 'null'))[1], "
            "bool_and(jsonb_typeof(e.v) <> 'number' OR e.v::text ~ '^-?[0-9]+$') "
            "FROM (SELECT after, key FROM _sluice_stage LIMIT 10000) s, "
            "jsonb_each(coalesce(s.after, s.key::jsonb)) AS e(k, v) "
            "WHERE e.k = ANY(%s) GROUP BY e.k ORDER BY e.k",
            (new,),
        ).fetchall()
        defs = []
        for src, kind, integral in kinds:
            dst = m.target_column(table, src)
            if dst is None:
                continue
            if dst in tm.casts:
                typ = tm.casts[dst]
            elif kind == "number":
                typ = "bigint" if integral else "double precision"
            else:
                typ = _TYPES.get(kind or "", "text")
            defs.append((dst, typ))
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

    def _write_table(self, tx: Any, table: str, guard: bool, *, upserts: int, deletes: int) -> int:
        """Apply the staged changes of one table: guarded upserts, guarded deletes, tombstones."""
        m = self.mapping
        tm = m.for_table(table)
        name = self._ensure_table(tx, table)
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
            rec = ", ".join(f"{quote(reverse[c])} {'text' if c in tm.casts else cols[c]}" for c in data)
            sel = ", ".join(
                f"CAST(r.{quote(reverse[c])} AS {tm.casts[c]})" if c in tm.casts else f"r.{quote(reverse[c])}"
                for c in data
            )
            sets = [f"{quote(c)} = excluded.{quote(c)}" for c in data if c not in keys]
            sets.append(f"{POS_COLUMN} = excluded.{POS_COLUMN}")
            stones = (
                "LEFT JOIN _sluice_tombstones tb ON tb.tbl = %(name)s AND tb.key = s.key" if guard else ""
            )
            not_buried = "AND (tb.pos IS NULL OR tb.pos < s.pos)" if guard else ""
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
            krec = ", ".join(f"{quote(reverse.get(k, k))} {cols[k]}" for k in keys)
            kmatch = " AND ".join(f"{q}.{quote(k)} = k.{quote(reverse.get(k, k))}" for k in keys)
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


def _escape(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """COPY text format: backslash, newline, carriage return and tab escaped; nulls kept null."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not pa.types.is_string(arr.type) and not pa.types.is_large_string(arr.type):
        return pc.cast(arr, pa.string())
    for raw, esc in (("\\", "\\\\"), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t")):
        arr = pc.replace_substring(arr, raw, esc)
    return arr


def copy_text(table: pa.Table, columns: list[str]) -> memoryview:
    """The rows of `columns` as one COPY FROM STDIN (text format) payload, built in Arrow."""
    parts = [_escape(table.column(c)) for c in columns]
    lines = pc.binary_join_element_wise(
        *parts, pa.scalar("\t"), null_handling="replace", null_replacement="\\N"
    )
    lines = pc.binary_join_element_wise(lines, pa.scalar("\n"), pa.scalar(""))
    size = pc.sum(pc.binary_length(lines)).as_py() or 0
    return memoryview(lines.buffers()[2])[:size]
