"""What a DDL statement from the binlog does to the captured tables' rows, as plain data.

The capture reads row events for data; a DDL statement arrives as query text. Only what changes
the rows of a captured table matters here (other schema changes reach the target through the
columns of later row events):

- TRUNCATE t, DROP TABLE t, CREATE OR REPLACE TABLE t: every row of t is gone;
- RENAME TABLE a TO b (and ALTER TABLE a RENAME TO b): a's rows are gone from a and are b's
  now, without a row event for either;
- ALTER TABLE t ... ADD [COLUMN]: the server filled the new column in for every row without
  a row event;
- CREATE TABLE t: t exists (again); its key columns must be read.

`ddl_effect` returns which tables to truncate at the statement's position, which to read again
(a snapshot after the statement) and whose key columns to read again, restricted to `database`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NAME = r"(?:`(?:[^`]|``)+`|[A-Za-z0-9_$]+)"
_QNAME = rf"{_NAME}(?:\s*\.\s*{_NAME})?"
_COMMENTS = re.compile(r"/\*.*?\*/|--[^\n]*|#[^\n]*", re.DOTALL)

_TRUNCATE = re.compile(rf"^TRUNCATE\s+(?:TABLE\s+)?({_QNAME})", re.IGNORECASE)
_DROP = re.compile(
    r"^DROP\s+(?:TEMPORARY\s+)?TABLES?\s+(?:IF\s+EXISTS\s+)?(.*?)(?:\s+(?:WAIT\s+\d+|NOWAIT|RESTRICT|CASCADE))*\s*$",
    re.IGNORECASE | re.DOTALL,
)
_RENAME = re.compile(r"^RENAME\s+TABLES?\s+(?:IF\s+EXISTS\s+)?(.*)$", re.IGNORECASE | re.DOTALL)
_RENAME_PAIR = re.compile(rf"({_QNAME})\s+(?:WAIT\s+\d+\s+|NOWAIT\s+)?TO\s+({_QNAME})", re.IGNORECASE)
_CREATE = re.compile(
    rf"^CREATE\s+(OR\s+REPLACE\s+)?(?:TEMPORARY\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?({_QNAME})",
    re.IGNORECASE,
)
_ALTER = re.compile(
    rf"^ALTER\s+(?:ONLINE\s+)?(?:IGNORE\s+)?TABLE\s+(?:IF\s+EXISTS\s+)?({_QNAME})\s*(.*)$",
    re.IGNORECASE | re.DOTALL,
)
_ALTER_RENAME = re.compile(rf"\bRENAME\s+(?:TO\s+|AS\s+)?(?!COLUMN\b|INDEX\b|KEY\b)({_QNAME})", re.IGNORECASE)
_ALTER_ADD_COLUMN = re.compile(
    r"\bADD\b(?!\s+(?:INDEX|KEY|UNIQUE|PRIMARY|CONSTRAINT|FOREIGN|FULLTEXT|SPATIAL|PARTITION|PERIOD|SYSTEM)\b)",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class DdlEffect:
    truncate: frozenset[str] = frozenset()  # rows gone, at the statement's position
    resnapshot: frozenset[str] = frozenset()  # rows changed without row events: read them again
    reload_keys: frozenset[str] = frozenset()  # the table may have appeared or gone

    def __bool__(self) -> bool:
        return bool(self.truncate or self.resnapshot or self.reload_keys)


def _unquote(name: str) -> str:
    name = name.strip()
    if name.startswith("`") and name.endswith("`"):
        return name[1:-1].replace("``", "`")
    return name


def _split(qname: str, default_schema: str) -> tuple[str, str]:
    parts = re.findall(_NAME, qname)
    if len(parts) == 2:
        return _unquote(parts[0]), _unquote(parts[1])
    return default_schema, _unquote(parts[0])


def ddl_effect(query: str, default_schema: str, database: str) -> DdlEffect:
    """The effect of one DDL statement on the tables of `database` (`default_schema` is the
    session's current database, which unqualified names belong to)."""
    text = _COMMENTS.sub(" ", query).strip().rstrip(";").strip()

    def ours(qname: str) -> str | None:
        schema, table = _split(qname, default_schema)
        return table if schema == database else None

    def names(*qnames: str) -> frozenset[str]:
        return frozenset(t for q in qnames if (t := ours(q)) is not None)

    if m := _TRUNCATE.match(text):
        return DdlEffect(truncate=names(m.group(1)))
    if m := _DROP.match(text):
        dropped = names(*re.findall(_QNAME, m.group(1)))
        return DdlEffect(truncate=dropped, reload_keys=dropped)
    if m := _RENAME.match(text):
        touched = names(*(q for pair in _RENAME_PAIR.findall(m.group(1)) for q in pair))
        return DdlEffect(truncate=touched, resnapshot=touched, reload_keys=touched)
    if m := _CREATE.match(text):
        created = names(m.group(2))
        if m.group(1):  # CREATE OR REPLACE: the old table's rows are gone
            return DdlEffect(truncate=created, reload_keys=created)
        return DdlEffect(reload_keys=created)
    if m := _ALTER.match(text):
        table, rest = m.group(1), m.group(2)
        if r := _ALTER_RENAME.search(rest):
            touched = names(table, r.group(1))
            return DdlEffect(truncate=touched, resnapshot=touched, reload_keys=touched)
        if _ALTER_ADD_COLUMN.search(rest):
            return DdlEffect(resnapshot=names(table))
    return DdlEffect()
