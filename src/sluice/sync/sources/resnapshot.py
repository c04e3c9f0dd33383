"""Re-snapshots while streaming: a table (or some of its rows, or some keys) read again by the
running capture, in key-range chunks, between passes over the binlog (MySQL/MariaDB, below) or
between transactions of a PostgreSQL slot's stream (`Resnapshots` keeps the requests; each
source reads its chunks: `mysql_chunk` here, PgCapture._resnapshot_chunk for PostgreSQL).

Requests. `sluice task snapshot ID --table T [--where SQL]`, the manager's
`POST /api/v1/tasks/{id}/snapshot`, `sluice task update` adding a table, and
`sluice task verify --repair` put a request in the task's control znode (`Control.snapshots`):
{"id", "table", "where", "keys", "delete_absent", "requested"}. `where` is a SQL condition on
the source table, run inside the capture's SELECT with the task's source credentials. `keys`
(a list of key dicts) reads exactly those rows; with `delete_absent` each listed key that the
source does not hold becomes a delete. The capture asks for pending requests once per binlog
pass (at most every REQUEST_POLL_S while none is under way), serves them one chunk at a time,
at most `chunks_per_pass` chunks per pass, so the binlog goes on being read between chunks.
A request is removed once every row of it is acknowledged by the log; a capture that stops
half way serves it again from its start next time (the same rows again, at newer positions).

Chunks. A whole-table request is read by keyset pagination: `WHERE (k1, k2) > (last) ORDER BY
k1, k2 LIMIT n`, so composite and non-integer keys split as well as integers. Each chunk is
read in a consistent snapshot of its own, taken without any lock (mysql_snapshot's
`begin_chunk_snapshot`), and its rows go out as op `r` at that snapshot's binlog position,
grouped as one transaction whose resume position is the start of the binlog transaction the
stream would read next: a restart never mistakes them for a cut-short initial snapshot
(`recover_position`), and resumes no later than the chunk's rows.

Why this is correct without DBLog's watermark table. DBLog writes low and high watermarks into
the source so the stream can tell which binlog changes happened while a chunk was read, and
drops the chunk's copy of those rows. Here the chunk's consistent-snapshot position IS the
watermark, with low = high: everything committed before it is in the chunk's rows, everything
after it comes from the binlog with a higher `source.pos`. The target's version guard writes a
row only over a lower position, so whichever of a chunk row and a binlog change of the same
row is older loses, in whatever order they arrive. A row deleted after the chunk was read is
deleted by the binlog's delete (higher position); a row deleted before it is absent from the
chunk, and a delete leaves a tombstone at its position, so a chunk row from an older snapshot
(a request served again after a crash) cannot bring it back. On MySQL the label is a lower
bound of the snapshot (read just before it): a change between the two is both in the rows and
above the label, and is written again with the same or a later value.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sluice.sync.envelope import key_text
from sluice.sync.sources.mysql_base import (
    BinlogPosition,
    CaptureError,
    column_types,
    connect_snapshot,
    snapshot_row,
    types_fragment,
)
from sluice.sync.sources.mysql_snapshot import begin_chunk_snapshot
from sluice.sync.sources.mysql_values import row_converter, select_list

log = logging.getLogger("sluice.capture")

#: how often, at most, the capture asks for new requests while it serves none
REQUEST_POLL_S = 1.0
#: chunks read per binlog pass: the stream is never held up for longer than this many chunks
CHUNKS_PER_PASS = 1
#: keys read per chunk of a request that lists keys
KEYS_PER_CHUNK = 1000


def new_request(
    table: str,
    *,
    where: str | None = None,
    keys: list[dict[str, Any]] | None = None,
    delete_absent: bool = False,
) -> dict[str, Any]:
    """A re-snapshot request as the control znode holds it."""
    return {
        "id": uuid.uuid4().hex[:12], "table": table, "where": where or None, "keys": keys,
        "delete_absent": bool(delete_absent), "requested": int(time.time()),
    }  # fmt: skip


def quote(name: str) -> str:
    """A MySQL identifier (the default quoting of the builders below; PostgreSQL passes its own)."""
    return "`" + name.replace("`", "``") + "`"


Quote = Callable[[str], str]


def after(keys: list[str], last: tuple[Any, ...] | None, q: Quote = quote) -> tuple[str, list[Any]]:
    """The keyset condition `(k1, k2) > last` (empty before the first chunk). For a composite
    key the first column is also bounded on its own, so the server scans from there."""
    if last is None:
        return "", []
    if len(keys) == 1:
        return f"{q(keys[0])} > %s", [last[0]]
    cols = ", ".join(q(k) for k in keys)
    marks = ", ".join(["%s"] * len(keys))
    return f"{q(keys[0])} >= %s AND ({cols}) > ({marks})", [last[0], *last]


def among(keys: list[str], wanted: list[dict[str, Any]], q: Quote = quote) -> tuple[str, list[Any]]:
    """The condition `(k1, k2) IN ((...), ...)` for the listed key dicts."""
    cols = ", ".join(q(k) for k in keys)
    one = "(" + ", ".join(["%s"] * len(keys)) + ")"
    return f"({cols}) IN ({', '.join([one] * len(wanted))})", [w[k] for w in wanted for k in keys]


def chunk_query(
    table: str,
    keys: list[str],
    *,
    where: str | None,
    last: tuple[Any, ...] | None,
    limit: int,
    columns: str = "*",
    q: Quote = quote,
    quoted_table: str | None = None,
) -> tuple[str, list[Any]]:
    """The SELECT of `columns` in one keyset chunk of `table` (after `last`, at most `limit` rows,
    in key order)."""
    conds, params = [], []
    if where:
        conds.append(f"({where})")
    cond, values = after(keys, last, q)
    if cond:
        conds.append(cond)
        params.extend(values)
    text = f"SELECT {columns} FROM {quoted_table or q(table)}"
    if conds:
        text += " WHERE " + " AND ".join(conds)
    return text + f" ORDER BY {', '.join(q(k) for k in keys)} LIMIT {int(limit)}", params


class BadRequestError(ValueError):
    """A request the source refuses (its --where is not valid SQL for the table, a listed key
    lacks a key column): dropped with an error in the log, never retried."""


@dataclass
class _Progress:
    """Where the request being served has got to (in memory only: a restart starts it over)."""

    request: dict[str, Any]
    last: tuple[Any, ...] | None = None  # whole-table: the last key read
    index: int = 0  # keys: how many listed keys are read
    rows: int = 0
    chunks: int = 0


@dataclass
class ChunkRead:
    """What a source's chunk reader put into the log."""

    rows: int
    deletes: int
    last: tuple[Any, ...] | None  # the last key read (the server's own values of it)
    position: str  # the source position the chunk's rows carry, as text


#: A source's reader of one chunk: (producer, table, key columns, request, the listed keys of
#: this chunk or None, the last key read before it, its row limit, where the stream reads on
#: from) -> what it emitted, grouped as one transaction resuming there.
ChunkReader = Callable[..., ChunkRead]


class Resnapshots:
    """Serves a capture's re-snapshot requests; `serve` is called once per binlog pass."""

    def __init__(
        self,
        capture: Any,
        requests: Callable[[], list[dict[str, Any]]],
        done: Callable[[str], Any],
        *,
        chunk_rows: int,
        chunks_per_pass: int = CHUNKS_PER_PASS,
        read: ChunkReader | None = None,
    ) -> None:
        self.capture = capture
        self.read: ChunkReader = read or (lambda *args: mysql_chunk(capture, *args))
        self.requests = requests
        self.done = done
        self.chunk_rows = chunk_rows
        self.chunks_per_pass = chunks_per_pass
        self.current: _Progress | None = None
        self._asked = 0.0
        self.served = 0  # requests finished by this capture
        self.chunks = 0  # chunks read by this capture

    def _next(self) -> _Progress | None:
        now = time.monotonic()
        if now - self._asked < REQUEST_POLL_S:
            return None
        self._asked = now
        try:
            pending = self.requests()
        except Exception as exc:  # ZooKeeper out of reach: ask again next pass
            log.warning("event=resnapshot_requests_unread task=%s error=%r", self.capture.name, exc)
            return None
        # A request for a table this capture does not capture waits for the execution that does:
        # a table just added to the task is asked for before the restart that captures it.
        ours = [r for r in pending if r.get("table") in self.capture.tables]
        return _Progress(ours[0]) if ours else None

    def serve(self, producer: Any, keys: dict[str, list[str]], stream_at: Any) -> None:
        """Read up to `chunks_per_pass` chunks of pending requests into the log, each a group
        resuming at `stream_at` (where the stream reads on from)."""
        for _ in range(self.chunks_per_pass):
            if self.current is None:
                self.current = self._next()
                if self.current is None:
                    return
            progress = self.current
            request = progress.request
            table = str(request["table"])
            if table not in keys:  # captured once it is created, and then read whole
                log.warning("event=resnapshot_skipped task=%s request=%s table=%s reason=table_missing",
                            self.capture.name, request["id"], table)  # fmt: skip
                self._finish(producer, progress)
                continue
            try:
                complete = self._chunk(producer, table, keys[table], progress, stream_at)
            except BadRequestError as exc:
                # Served again it would fail again, and stop the task each time: drop it.
                log.error("event=resnapshot_refused task=%s request=%s table=%s error=%r", self.capture.name,
                          request["id"], table, str(exc))  # fmt: skip
                self.done(str(request["id"]))
                self.current = None
                continue
            if complete:
                self._finish(producer, progress)
            if self.capture.stop.is_set():
                return

    def _finish(self, producer: Any, progress: _Progress) -> None:
        """Once every row of the request is acknowledged, remove it from the control znode."""
        if producer.flush(120) or self.capture.stats.errors:
            raise CaptureError(
                f"re-snapshot {progress.request['id']} of {progress.request['table']}: rows not acknowledged "
                "by the log; the request stays and is served again from its start"
            )
        self.done(str(progress.request["id"]))
        self.current = None
        self.served += 1
        request = progress.request
        log.info("event=resnapshot_done task=%s request=%s table=%s rows=%d chunks=%d", self.capture.name,
                 request["id"], request["table"], progress.rows, progress.chunks)  # fmt: skip

    def _chunk(
        self, producer: Any, table: str, key_cols: list[str], progress: _Progress, stream_at: Any
    ) -> bool:
        """Read and emit the next chunk of `progress`; True when the request is complete."""
        request = progress.request
        listed: list[dict[str, Any]] | None = request.get("keys")
        wanted: list[dict[str, Any]] | None = None
        if listed is not None:
            wanted = listed[progress.index : progress.index + min(self.chunk_rows, KEYS_PER_CHUNK)]
            if not wanted:
                return True
            if any(not isinstance(w, dict) or not set(key_cols) <= set(w) for w in wanted):
                raise BadRequestError(f"its keys must each name every key column of {table}: {key_cols}")
        got = self.read(producer, table, key_cols, request, wanted, progress.last, self.chunk_rows, stream_at)
        progress.rows += got.rows
        progress.chunks += 1
        self.chunks += 1
        self.capture.stats.snapshot_rows += got.rows
        log.info("event=resnapshot_chunk task=%s table=%s request=%s rows=%d deletes=%d position=%s",
                 self.capture.name, table, request["id"], got.rows, got.deletes, got.position)  # fmt: skip
        if listed is not None:
            assert wanted is not None
            progress.index += len(wanted)
            return progress.index >= len(listed)
        progress.last = got.last
        return got.rows < self.chunk_rows


def mysql_chunk(
    cap: Any,
    producer: Any,
    table: str,
    key_cols: list[str],
    request: dict[str, Any],
    wanted: list[dict[str, Any]] | None,
    last: tuple[Any, ...] | None,
    limit: int,
    stream_at: BinlogPosition,
) -> ChunkRead:
    """A MySQL/MariaDB capture's chunk: read in a consistent snapshot of its own, its rows at
    that snapshot's binlog position (a lower bound of it, see the module's docstring)."""
    import pymysql

    types = column_types(cap.spec, [table]).get(table, {})
    columns = select_list(types) or "*"
    convert = row_converter(types, cap.zero_dates)
    fragment = types_fragment(types)
    where = request.get("where")
    if wanted is not None:
        cond, params = among(key_cols, wanted)
        text = f"SELECT {columns} FROM {quote(table)} WHERE {cond}" + (f" AND ({where})" if where else "")
    else:
        text, params = chunk_query(table, key_cols, where=where, last=last, limit=limit, columns=columns)
    conn = connect_snapshot(cap.spec)
    tx = cap._begin_tx(stream_at.text())
    rows, last = 0, None
    seen: set[str] = set()
    deletes = 0
    try:
        with conn.cursor() as cur:
            position = begin_chunk_snapshot(cur, cap.is_mariadb)
            pos = cap.encoded(position)
            now = int(time.time() * 1000)
            try:
                cur.execute(text, params)
            except pymysql.err.MySQLError as exc:
                # a server error about the statement (1xxx), not a lost connection (2xxx)
                if not (exc.args and isinstance(exc.args[0], int) and exc.args[0] < 2000):
                    raise
                raise BadRequestError(
                    f"the source refused its query ({exc.args[-1]}): check its --where condition "
                    f"{where!r} and ask again with `sluice task snapshot`"
                ) from None
            for raw in cur:
                # the next chunk starts after the server's own text of the key, not its
                # canonical value (a BIT's 0/1 text or a TIMESTAMP's Z would not compare)
                last = tuple(raw[k] for k in key_cols)
                row = snapshot_row(convert, raw, table)
                key = {k: row[k] for k in key_cols}
                cap._emit(producer, table, cap._envelope("r", table, key, None, row, pos, now,
                                                         position.text(), fragment), tx)  # fmt: skip
                if wanted is not None:
                    seen.add(key_text(key))
                rows += 1
                if rows % 5000 == 0:
                    producer.poll(0)
            cur.execute("COMMIT")
        if wanted is not None and request.get("delete_absent"):
            for key in wanted:
                if key_text({k: key[k] for k in key_cols}) not in seen:
                    gone = {k: key[k] for k in key_cols}
                    cap._emit(producer, table, cap._envelope("d", table, gone, None, None, pos, now,
                                                             position.text()), tx)  # fmt: skip
                    deletes += 1
    finally:
        conn.close()
        cap._end_tx(tx, stream_at.text())
    return ChunkRead(rows, deletes, last, position.text())
