"""What a DDL statement from the binlog does to the captured tables' rows, as plain data.

The capture reads row events for data; a DDL statement arrives as query text. Only what changes
the rows of a captured table matters here (other schema changes reach the target through the
columns of later row events):

- TRUNCATE t, DROP TABLE t, CREATE OR REPLACE TABLE t: every row of t is gone;
- RENAME TABLE a TO b (and ALTER TABLE a RENAME TO b): a's rows are gone from a and are b's
  now, without a row event for either;
- ALTER TABLE t ... ADD [COLUMN]: the server filled the new column in for every row without
  a row event;
- CREATE TABLE t: t exists (again); its key columns must be read;
- ALTER TABLE t MODIFY/CHANGE a column's type: the server converted every value without a row
  event.

Beside the rows, a statement's schema changes are data too (`changes`, see sync/schema.py):
each ALTER TABLE clause that adds, drops, renames or retypes a column, and CREATE and DROP
TABLE. `ddl_effect` returns which tables to truncate at the statement's position, which to read
again (a snapshot after the statement), whose key columns to read again and the schema changes,
in statement order, restricted to `database`. A type change's `widening` needs the column's old
type, which the statement does not hold: the capture fills it in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sluice.sync.schema import (
    ADD_COLUMN,
    CHANGE_TYPE,
    CREATE_TABLE,
    DROP_COLUMN,
    DROP_TABLE,
    RENAME_COLUMN,
    SchemaChange,
)

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


# ALTER TABLE clauses that change columns (each clause of a statement, commas at depth 0).
_TYPE_TEXT = r"([A-Za-z]+(?:\s+precision)?(?:\s*\([^)]*\))?(?:\s+(?:unsigned|signed|zerofill)\b)*)"
_NOT_A_COLUMN = (
    r"(?!(?:INDEX|KEY|UNIQUE|PRIMARY|CONSTRAINT|FOREIGN|FULLTEXT|SPATIAL|PARTITION|PERIOD|SYSTEM|CHECK)\b)"
)
_CLAUSE_ADD = re.compile(
    rf"^ADD\s+{_NOT_A_COLUMN}(?:COLUMN\s+)?(?:IF\s+NOT\s+EXISTS\s+)?(\(.*\)|{_NAME}\s+{_TYPE_TEXT})",
    re.IGNORECASE | re.DOTALL,
)
_CLAUSE_DROP = re.compile(
    rf"^DROP\s+{_NOT_A_COLUMN}(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?({_NAME})\s*$", re.IGNORECASE
)
_CLAUSE_CHANGE = re.compile(
    rf"^CHANGE\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?({_NAME})\s+({_NAME})\s+{_TYPE_TEXT}", re.IGNORECASE
)
_CLAUSE_MODIFY = re.compile(
    rf"^MODIFY\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?({_NAME})\s+{_TYPE_TEXT}", re.IGNORECASE
)
_CLAUSE_RENAME_COLUMN = re.compile(
    rf"^RENAME\s+COLUMN\s+(?:IF\s+EXISTS\s+)?({_NAME})\s+TO\s+({_NAME})", re.IGNORECASE
)
_COLUMN_DEF = re.compile(rf"^({_NAME})\s+{_TYPE_TEXT}", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class DdlEffect:
    truncate: frozenset[str] = frozenset()  # rows gone, at the statement's position
    resnapshot: frozenset[str] = frozenset()  # rows changed without row events: read them again
    reload_keys: frozenset[str] = frozenset()  # the table may have appeared or gone
    changes: tuple[tuple[str, SchemaChange], ...] = ()  # (table, change), in statement order

    def __bool__(self) -> bool:
        return bool(self.truncate or self.resnapshot or self.reload_keys or self.changes)


def split_clauses(text: str) -> list[str]:
    """`text` split at the commas outside parentheses and quotes, each part stripped."""
    out, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"`":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    out.append(text[start:].strip())
    return [c for c in out if c]


def _type(text: str) -> str:
    return " ".join(text.lower().split())


def column_changes(clauses: str) -> tuple[list[SchemaChange], bool]:
    """The column changes of an ALTER TABLE's clauses, and whether any rewrote values without
    row events (an added column, a changed type)."""
    out: list[SchemaChange] = []
    rewritten = False
    for clause in split_clauses(clauses):
        if m := _CLAUSE_ADD.match(clause):
            body = m.group(1)
            defs = split_clauses(body[1:-1]) if body.startswith("(") else [body]
            for d in defs:
                if c := _COLUMN_DEF.match(d):
                    out.append(SchemaChange(ADD_COLUMN, _unquote(c.group(1)), type=_type(c.group(2))))
                    rewritten = True
        elif m := _CLAUSE_DROP.match(clause):
            out.append(SchemaChange(DROP_COLUMN, _unquote(m.group(1))))
        elif m := _CLAUSE_CHANGE.match(clause):
            old, new = _unquote(m.group(1)), _unquote(m.group(2))
            if old != new:
                out.append(SchemaChange(RENAME_COLUMN, old, new_name=new))
            out.append(SchemaChange(CHANGE_TYPE, new, type=_type(m.group(3))))
            rewritten = True
        elif m := _CLAUSE_MODIFY.match(clause):
            out.append(SchemaChange(CHANGE_TYPE, _unquote(m.group(1)), type=_type(m.group(2))))
            rewritten = True
        elif m := _CLAUSE_RENAME_COLUMN.match(clause):
            out.append(SchemaChange(RENAME_COLUMN, _unquote(m.group(1)), new_name=_unquote(m.group(2))))
    return out, rewritten


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
        listed = [t for q in re.findall(_QNAME, m.group(1)) if (t := ours(q)) is not None]
        dropped = frozenset(listed)
        gone = tuple((t, SchemaChange(DROP_TABLE)) for t in dict.fromkeys(listed))
        return DdlEffect(truncate=dropped, reload_keys=dropped, changes=gone)
    if m := _RENAME.match(text):
        touched = names(*(q for pair in _RENAME_PAIR.findall(m.group(1)) for q in pair))
        return DdlEffect(truncate=touched, resnapshot=touched, reload_keys=touched)
    if m := _CREATE.match(text):
        created = names(m.group(2))
        new = tuple((t, SchemaChange(CREATE_TABLE)) for t in sorted(created))
        if m.group(1):  # CREATE OR REPLACE: the old table's rows are gone
            gone = tuple((t, SchemaChange(DROP_TABLE)) for t in sorted(created))
            return DdlEffect(truncate=created, reload_keys=created, changes=gone + new)
        return DdlEffect(reload_keys=created, changes=new)
    if m := _ALTER.match(text):
        table, rest = m.group(1), m.group(2)
        if r := _ALTER_RENAME.search(rest):
            touched = names(table, r.group(1))
            return DdlEffect(truncate=touched, resnapshot=touched, reload_keys=touched)
        ours_table = ours(table)
        if ours_table is None:
            return DdlEffect()
        changes, rewritten = column_changes(rest)
        return DdlEffect(
            resnapshot=frozenset({ours_table}) if rewritten else frozenset(),
            changes=tuple((ours_table, c) for c in changes),
        )
    return DdlEffect()
