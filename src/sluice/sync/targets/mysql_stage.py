"""Executors stage a micro-batch's changes in the MySQL/MariaDB target; the driver merges them in SQL.

The design is PostgreSQL's (staging.py): each execution of a pipeline has an InnoDB staging
table (`staging.staging_table`), each Spark task writes its collapsed changes into it under a
random token in one transaction of its own (`insert_staged`: multi-row INSERTs, a few MB each),
and returns only its summary; the driver's one commit (`StagingTarget.apply_staged`) merges the
rows of the summaries' tokens. What makes a failed attempt's, an earlier batch's or a zombie's
staged rows unread is the same: tokens, one table per execution, the fence.

What the driver merges in SQL, per table (`MySqlTarget._merge_table`): the newest change per key
of the batch's fresh rows (ROW_NUMBER over the key's hash), then one `INSERT ... SELECT ... ON
DUPLICATE KEY UPDATE` with the version guard, one delete by a join and one tombstone upsert, each
value taken out of the staged JSON by `value_sql`. That SQL gives exactly what the driver's
Python conversion (`mysql._converter`) gives for every column type the target creates
(`SQL_SAFE`). A table the batch must create or widen is made from the driver first, then merged
in SQL. A table with a column of another type, a batch with schema changes, rows a rename or
drop must translate, a row holding a JSON object or array (`plain`), or rows the target refuses
under `on_refused: dlq`: those tables' changes are read back into the driver and applied as
`apply` does; a value `exception_sql` names (an ENUM's error value, a BIT that is not its
`0`/`1` text, a YEAR that is not a number) goes through the driver row by row. Either way every
staged row is merged in the driver's one transaction.
"""

from __future__ import annotations

import hashlib
import urllib.parse
from collections.abc import Iterable
from typing import Any

import orjson
import pyarrow as pa

from sluice.sync.targets.base import BadTargetUrlError

#: The staged rows' columns: the change's, plus the key's SHA-256 (`kh`, as the tombstones'
#: index holds it), the after image's members (`cols`: a sorted JSON list; null for a delete),
#: whether every key and after value is a scalar (`plain`), and a hash of what decides how its
#: table is merged (`shape`: table, binary, types, cols, op kind), which the driver groups by.
STAGED_COLUMNS = ("token", "topic", "partition", "offset", "ts", "tbl", "key", "kh", "pos", "op",
                  "after", "records", "binary", "types", "cols", "plain", "shape")  # fmt: skip
STAGED_DDL = (
    "id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, token BIGINT NOT NULL, topic VARCHAR(255) NOT NULL, "
    "`partition` INT NOT NULL, `offset` BIGINT NOT NULL, ts BIGINT NULL, tbl LONGTEXT NOT NULL, "
    "`key` LONGTEXT NOT NULL, kh BINARY(32) NOT NULL, pos BIGINT NOT NULL, op VARCHAR(8) NOT NULL, "
    "`after` LONGTEXT NULL, records INT NOT NULL, `binary` LONGTEXT NULL, types LONGTEXT NULL, "
    "cols LONGTEXT NULL, plain TINYINT NOT NULL, shape BINARY(32) NOT NULL, KEY (token)"
)

#: Bytes of one multi-row INSERT a task sends (below every server's max_allowed_packet default).
CHUNK_BYTES = 4 << 20

#: Column types (their base name) whose values `value_sql` converts in SQL exactly as the
#: driver's Python does; a table with a column of any other type is merged from the driver.
_STAMPS = frozenset({"datetime", "timestamp"})
_BYTES = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "geometry", "point",
                    "linestring", "polygon", "multipoint", "multilinestring", "multipolygon",
                    "geometrycollection"})  # fmt: skip
#: The integer column types (a value with a fraction is refused: `mysql._integer`), and the text
#: a string must be to go into one (the server would round '1.5' and read '8 ' as 8).
INTEGER_TYPES = frozenset({"tinyint", "smallint", "mediumint", "int", "integer", "bigint"})
INTEGER_TEXT = "^[-+]?[0-9]+$"
SQL_SAFE = _STAMPS | _BYTES | INTEGER_TYPES | frozenset(
    {"decimal", "numeric", "double", "real", "float", "bit", "char", "varchar", "tinytext", "text",
     "mediumtext", "longtext", "enum", "set", "date", "time", "year", "json"}
)  # fmt: skip
#: FLT_MAX as the double it is, and the least double that rounds past it to infinity as a float32:
#: a value between them (FLT_MAX's shortest text, 3.4028235e38, is one) is FLT_MAX in a FLOAT.
_FLT_MAX = "3.4028234663852886e38"
_FLT_OVER = "3.4028235677973366e38"


#: A MySQL/MariaDB target's URL schemes; `parse_url` reads the rest (here, below mysql.py, as
#: the executors' connections need it too).
SCHEMES = ("mysql://", "mariadb://")


def parse_url(url: str) -> dict[str, Any]:
    """PyMySQL's connect arguments from `mysql://user@host:port/db` (no password in it)."""
    if not url.startswith(SCHEMES):
        raise BadTargetUrlError(f"a MySQL target URL looks like mysql://user@host:3306/db, not {url!r}")
    parts = urllib.parse.urlsplit(url)
    db = urllib.parse.unquote(parts.path.lstrip("/"))
    if not parts.hostname or not db or "/" in db:
        raise BadTargetUrlError(
            f"a MySQL target URL names a host and a database: mysql://user@host:3306/db, not {url!r}"
        )
    args: dict[str, Any] = {
        "host": parts.hostname,
        "port": parts.port or 3306,
        "user": urllib.parse.unquote(parts.username or "root"),
        "database": db,
    }
    if parts.password is not None:
        args["password"] = urllib.parse.unquote(parts.password)
    return args


def connect(url: str, password: str | None) -> Any:
    """A task's connection to the target (PyMySQL), outside any transaction between tasks."""
    import pymysql

    args = parse_url(url)
    if password is not None:
        args["password"] = password
    return pymysql.connect(**args, charset="utf8mb4", autocommit=True, connect_timeout=30)


def _plain(doc: Any) -> bool:
    """Whether every member is a string, a number, a boolean or null (no object or array: the
    driver writes those as orjson's compact text, which SQL here does not give)."""
    return type(doc) is dict and all(v is None or type(v) in (str, int, float, bool) for v in doc.values())


def staged_values(rows: pa.Table) -> Iterable[tuple[Any, ...]]:
    """One task's rows (`staging.Task.add`) as the staging table's values, in STAGED_COLUMNS order."""
    from sluice.sync.envelope import SCHEMA, TRUNCATE

    cols = {c: rows[c].to_pylist() for c in STAGED_COLUMNS if c not in ("kh", "cols", "plain", "shape")}
    loads, dumps, sha = orjson.loads, orjson.dumps, hashlib.sha256
    for i in range(rows.num_rows):
        key, after, op = cols["key"][i], cols["after"][i], cols["op"][i]
        image = None if after is None else loads(after)
        plain = _plain(loads(key)) and (image is None or _plain(image))
        members = None if type(image) is not dict else dumps(sorted(image)).decode()
        table, binary, types = cols["tbl"][i], cols["binary"][i], cols["types"][i]
        kind = op if op in (TRUNCATE, SCHEMA) else "row"
        shape = dumps([table, binary, types, members, kind])
        yield (
            cols["token"][i], cols["topic"][i], cols["partition"][i], cols["offset"][i], cols["ts"][i],
            table, key, sha(key.encode()).digest(), cols["pos"][i], op, after, cols["records"][i], binary,
            types, members, int(plain), sha(shape).digest(),
        )  # fmt: skip


def insert_staged(conn: Any, table: str, task: Any, batches: Iterable[pa.RecordBatch]) -> None:
    """Write a task's rows (`staging.Task`) into the staging table, in one transaction."""
    head = f"INSERT INTO `{table}` ({', '.join(f'`{c}`' for c in STAGED_COLUMNS)}) VALUES "
    escape = conn.escape
    conn.begin()
    with conn.cursor() as cur:
        parts: list[str] = []
        size = 0
        for batch in batches:
            rows = task.add(batch)
            if rows is None:
                continue
            for values in staged_values(rows):
                text = escape(values)
                parts.append(text)
                size += len(text)
                if size >= CHUNK_BYTES:
                    cur.execute(head + ",".join(parts))
                    parts, size = [], 0
        if parts:
            cur.execute(head + ",".join(parts))
    conn.commit()


def json_path(column: str) -> str | None:
    """The JSON path of a top-level member as an SQL literal, or None for a name a path cannot
    quote plainly (its table is merged from the driver)."""
    if any(ch in column for ch in "\"\\'%") or any(ord(ch) < 0x20 for ch in column):
        return None
    return f"'$.\"{column}\"'"


def value_sql(extracted: str, column_type: str, base64: bool) -> str | None:
    """SQL giving what the driver writes (`mysql._converter`) into a column of `column_type`,
    from `extracted`: a column holding the member's JSON_EXTRACT (SQL NULL when absent). None
    when no SQL here is known to give exactly that (the table is merged from the driver)."""
    base = column_type.lower().split("(", 1)[0].split(" ", 1)[0]
    if base not in SQL_SAFE:
        return None
    raw = f"JSON_UNQUOTE({extracted})"
    # As `mysql._integer`: in an integer column a fraction or other text is made a value the
    # server refuses (strict mode), never rounded as it would round '1.5'; a refusal under dlq
    # isolates the row through the driver, which refuses it the same way.
    integer = (
        f"WHEN 'DOUBLE' THEN IF({raw} + 0 = FLOOR({raw} + 0), {raw}, CONCAT({raw}, ' has a fraction')) "
        f"WHEN 'STRING' THEN IF({raw} REGEXP '{INTEGER_TEXT}', {raw}, CONCAT({raw}, ' is not an integer')) "
        if base in INTEGER_TYPES
        else ""
    )
    # JSON null is NULL; true and false are 1 and 0, as PyMySQL writes Python's True and False
    text = (
        f"CASE JSON_TYPE({extracted}) WHEN 'NULL' THEN NULL WHEN 'BOOLEAN' THEN "
        f"IF({raw} = 'true', '1', '0') {integer}ELSE {raw} END"
    )
    if base in _STAMPS:  # the envelope's 2024-01-02T03:04:05.123456Z: first T a space, no Z
        spaced = f"IF(LOCATE('T', {text}) > 0, INSERT({text}, LOCATE('T', {text}), 1, ' '), {text})"
        return f"IF(RIGHT({spaced}, 1) = 'Z', LEFT({spaced}, CHAR_LENGTH({spaced}) - 1), {spaced})"
    if base in _BYTES and base64:
        return f"FROM_BASE64({text})"
    if base == "year":  # a number (`exception_sql`): 0 is the year 0000, where the text '0' is 2000
        return f"({text} + 0)"
    if base == "bit":  # `0101` (`exception_sql` sends any other value to the driver)
        return f"CAST(CONV({text}, 2, 10) AS UNSIGNED)"
    if base == "float":  # as `mysql._float32` rounds it: the server refuses a double past FLT_MAX
        return (
            f"IF(ABS({text}) > {_FLT_MAX} AND ABS({text}) < {_FLT_OVER}, "
            f"CONCAT(IF({text} < 0, '-', ''), '{_FLT_MAX}'), {text})"
        )
    return text


def exception_sql(extracted: str, column_type: str) -> str | None:
    """A condition on a member's JSON_EXTRACT that holds for a value `value_sql` would not write
    as the driver does (a batch with one merges the table from the driver), or None."""
    from sluice.sync.types import parse_type

    base = column_type.lower().split("(", 1)[0].split(" ", 1)[0]
    if base == "enum" and "" not in parse_type(column_type).members:
        return f"JSON_UNQUOTE({extracted}) = ''"  # ENUM's error value: `mysql._write_lax`
    if base == "year":
        return f"JSON_TYPE({extracted}) NOT IN ('NULL', 'INTEGER')"
    if base == "bit":
        return (
            f"(JSON_TYPE({extracted}) <> 'NULL' AND (JSON_TYPE({extracted}) <> 'STRING' "
            f"OR JSON_UNQUOTE({extracted}) NOT REGEXP '^[01]+$'))"
        )
    return None
