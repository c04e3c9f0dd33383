"""PostgreSQL values and column types, as the PostgreSQL source puts them in the envelope.

Both capture paths get each value as PostgreSQL's own text output of it: pgoutput sends text
(the type's output function, run in the walsender), and the snapshot and the reads of unchanged
TOASTed values select `col::text`. Both sessions run with the same settings (`SESSION_OPTIONS`:
ISO dates, the `postgres` interval style, shortest-exact floats, UTC, hex bytea, C money), so
one value has one text, and `value()` turns that text into the envelope's canonical value the
same way on both paths (sync/types.py's table says what each type's value is).

Column types are named in the envelope's `types` as `pg:` + `format_type()` of the column's
type (`pg:numeric(12,2)`, `pg:timestamp(3) with time zone`, `pg:integer[]`), a domain by its
base type, an enum as `pg:enum`, an array of one as `pg:enum[]`, and a type no built-in row
covers (an extension's, a composite) as `pg:` + its name: text in every target.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from typing import Any

#: the settings of every session that reads values (the walsender's and the snapshot's)
SESSION_OPTIONS = (
    "-c datestyle=ISO -c intervalstyle=postgres -c extra_float_digits=3 -c TimeZone=UTC "
    "-c bytea_output=hex -c lc_monetary=C -c client_encoding=UTF8"
)
#: the prefix of a PostgreSQL column type in the envelope's `types`
PREFIX = "pg:"
#: OIDs below this are PostgreSQL's built-in objects
FIRST_NORMAL_OID = 16384

# The column's type text as the envelope names it, from the catalog: domains followed down to
# their base type (with the domain's typmod when the column has none), enums and arrays of
# enums named as such. One query serves a table (by name) and pgoutput's Relation columns (by
# type OID and typmod).
TYPE_SQL = """
WITH RECURSIVE base(col, oid, typmod, depth) AS (
    SELECT c.col, c.oid::oid, c.typmod::int, 0
    FROM unnest(%(cols)s::text[], %(oids)s::int8[], %(mods)s::int[]) AS c(col, oid, typmod)
  UNION ALL
    SELECT b.col, t.typbasetype, CASE WHEN b.typmod = -1 THEN t.typtypmod ELSE b.typmod END, b.depth + 1
    FROM base b JOIN pg_type t ON t.oid = b.oid WHERE t.typtype = 'd'
)
SELECT b.col, t.typtype, t.typcategory, e.typtype AS elemtype, format_type(b.oid, b.typmod), t.oid < %(first)s
FROM base b JOIN pg_type t ON t.oid = b.oid LEFT JOIN pg_type e ON e.oid = t.typelem AND t.typcategory = 'A'
WHERE t.typtype <> 'd'
"""


def type_text(typtype: str, category: str, elemtype: str | None, formatted: str, builtin: bool) -> str:
    """The envelope's type text of a column from its (domain-resolved) catalog entry."""
    if typtype == "e":
        return PREFIX + "enum"
    if category == "A" and elemtype == "e":
        return PREFIX + "enum[]"
    return PREFIX + formatted if builtin or category == "A" else PREFIX + formatted.rsplit(".", 1)[-1]


def describe(cur: Any, columns: Sequence[tuple[str, int, int]]) -> dict[str, str]:
    """The envelope's type text of each (name, type OID, typmod)."""
    if not columns:
        return {}
    cur.execute(
        TYPE_SQL,
        {"cols": [c[0] for c in columns], "oids": [c[1] for c in columns], "mods": [c[2] for c in columns],
         "first": FIRST_NORMAL_OID},
    )  # fmt: skip
    out = {str(col): type_text(tt, cat, elem, fmt, bool(builtin)) for col, tt, cat, elem, fmt, builtin in cur}
    return {name: out.get(name, PREFIX + "text") for name, _, _ in columns}


def table_columns(cur: Any, schema: str, table: str) -> list[tuple[str, int, int]]:
    """(name, type OID, typmod) of a table's columns, in order."""
    cur.execute(
        "SELECT a.attname, a.atttypid::int8, a.atttypmod FROM pg_attribute a "
        "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (schema, table),
    )
    return [(str(n), int(o), int(m)) for n, o, m in cur.fetchall()]


# --- values -----------------------------------------------------------------------------------


def _int(text: str) -> int:
    return int(text)


def _float(text: str) -> float | str:
    # NaN and the infinities have no JSON number: they stay text, as PostgreSQL spells them; so
    # does negative zero, which a target reading JSON through numeric (jsonb) would make 0
    if text in ("NaN", "Infinity", "-Infinity", "-0"):
        return text
    return float(text)


def _bool(text: str) -> bool:
    return text == "t"


def _bytea(text: str) -> bytes:
    if not text.startswith("\\x"):
        raise ValueError(f"bytea not in hex output: {text[:20]!r} (the session sets bytea_output=hex)")
    return bytes.fromhex(text[2:])


def _money(text: str) -> str:
    # lc_monetary=C: `$1,234.56`, `-$1,234.56`
    negative = text.startswith("-")
    digits = text.lstrip("-").lstrip("$").replace(",", "")
    return ("-" if negative and digits.strip("0.") else "") + digits


def _timestamp(text: str) -> str:
    # `2020-01-02 03:04:05.5` -> `2020-01-02T03:04:05.5`; ` BC` and `infinity` kept as they are
    return text.replace(" ", "T", 1) if text[:1].isdigit() else text


def _timestamptz(text: str) -> str:
    # TimeZone=UTC: `2020-01-02 03:04:05.5+00` -> `2020-01-02T03:04:05.5Z`
    if not text[:1].isdigit():
        return text
    stamp = text.replace(" ", "T", 1)
    era = ""
    if stamp.endswith(" BC"):
        stamp, era = stamp[:-3], " BC"
    if stamp.endswith("+00"):
        stamp = stamp[:-3] + "Z"
    return stamp + era


def _text(text: str) -> str:
    return text


def converter(type_text_: str) -> Callable[[str], Any]:
    """The function from a value's PostgreSQL text to its envelope value, for one column type."""
    from sluice.sync.types import parse_type

    t = parse_type(type_text_)
    if t.family == "int":
        return _int
    if t.family == "float":
        return _float
    if t.family == "bool":
        return _bool
    if t.family == "binary":
        return _bytea
    if t.family == "money":
        return _money
    if t.family == "temporal" and t.name == "timestamp":
        return _timestamp
    if t.family == "temporal" and t.name == "timestamptz":
        return _timestamptz
    return _text


class RowReader:
    """Turns rows of text values (None for NULL) into envelope images, for fixed columns."""

    def __init__(self, types: dict[str, str]) -> None:
        self.types = dict(types)
        self.columns = list(types)
        #: each column's converter, in the columns' order
        self.converters = [converter(types[c]) for c in self.columns]

    def image(self, texts: Sequence[str | None], columns: Sequence[str] | None = None) -> dict[str, Any]:
        names = self.columns if columns is None else columns
        convert = self.converters if columns is None else [converter(self.types[c]) for c in names]
        return {n: (None if v is None else f(v)) for n, f, v in zip(names, convert, texts, strict=True)}


def binary_text(value: bytes) -> str:
    return base64.b64encode(value).decode()
