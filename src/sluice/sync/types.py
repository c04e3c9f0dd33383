"""The type mapping: one table from a source column type to the envelope's value and to each
target's column type, used by the snapshot, the binlog decoder and every target alike.

A source (sync/sources/mysql.py) names each column's type in the envelope (`types`: column ->
the source's type text, as `information_schema.COLUMNS.COLUMN_TYPE` gives it, `json` for
MariaDB's JSON columns). Targets create and alter their columns from those names through this
table, never from the values of one batch: a column null throughout a batch still gets its
type, and the type does not depend on which rows came first. Envelopes without `types` (the
generator's, Debezium's) keep the targets' inference from the JSON values (`infer_type`).

`MAPPINGS` is the table; docs/TYPES.md prints it (`markdown_table`, checked by a test so the
two cannot drift). Each row says what the envelope holds for a source type (the canonical value:
the same from both capture paths, see sync/sources/mysql_values.py) and the column type each
target gives it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

# --- source types ------------------------------------------------------------------------------------
_INT_BYTES = {"tinyint": 1, "smallint": 2, "mediumint": 3, "int": 4, "integer": 4, "bigint": 8}
_TEXT_BYTES = {"tinytext": 255, "text": 65_535, "mediumtext": 16_777_215, "longtext": 4_294_967_295}
_BLOB_BYTES = {"tinyblob": 255, "blob": 65_535, "mediumblob": 16_777_215, "longblob": 4_294_967_295}
GEOMETRY_NAMES = frozenset(
    {"geometry", "point", "linestring", "polygon", "multipoint", "multilinestring", "multipolygon",
     "geometrycollection", "geomcollection"}
)  # fmt: skip
_TYPE = re.compile(
    r"^\s*([a-z]+(?:\s+precision)?)\s*(?:\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\))?\s*(.*)$",
    re.IGNORECASE | re.DOTALL,
)
#: an ENUM/SET member in COLUMN_TYPE: quoted, `'` doubled, backslash escapes as SHOW prints them
_MEMBER = re.compile(r"'((?:[^'\\]|''|\\.)*)'", re.DOTALL)
_MEMBER_ESCAPES = {"0": "\0", "n": "\n", "r": "\r", "Z": "\x1a", "t": "\t", "b": "\b"}


def _member(text: str) -> str:
    """A member's label from its quoted text (without the quotes)."""
    text = text.replace("''", "'")
    return re.sub(r"\\(.)", lambda m: _MEMBER_ESCAPES.get(m[1], m[1]), text, flags=re.DOTALL)


@dataclass(frozen=True, slots=True)
class SourceType:
    """A MySQL/MariaDB column type, parsed from its text (`int(10) unsigned`, `decimal(65,30)`).

    family: int, float, decimal, bit, string, binary, temporal, enum, set, json, geometry, other.
    size: bytes of an int; 4 or 8 for a float; precision of a decimal; width of a bit; characters
    of a string; bytes of a binary. scale: a decimal's scale, or a temporal's fractional digits."""

    family: str
    size: int = 0
    scale: int = 0
    unsigned: bool = False
    name: str = ""
    members: tuple[str, ...] = ()  # ENUM and SET labels, in definition order
    #: "mysql" (MySQL and MariaDB), or "pg": a PostgreSQL column type (`pg:` + format_type)
    dialect: str = "mysql"
    #: PostgreSQL: the column type as the source names it (format_type), without `pg:`
    text: str = ""


#: the prefix of a PostgreSQL source's column types (sync/sources/pg_values.py)
PG_PREFIX = "pg:"
_PG_INT = {"smallint": 2, "integer": 4, "bigint": 8, "oid": 8}
_PG_STRING = {"text", "character varying", "character", "name", '"char"'}
_PG_TEMPORAL = {
    "date": "date", "time without time zone": "time", "time with time zone": "timetz",
    "timestamp without time zone": "timestamp", "timestamp with time zone": "timestamptz",
    "interval": "interval",
}  # fmt: skip
#: built-in types a PostgreSQL target gives the same type (its text output is their input)
_PG_NATIVE = frozenset(
    {"uuid", "inet", "cidr", "macaddr", "macaddr8", "bit", "bit varying", "int4range", "int8range",
     "numrange", "tsrange", "tstzrange", "daterange", "int4multirange", "int8multirange",
     "nummultirange", "tsmultirange", "tstzmultirange", "datemultirange", "point", "line", "lseg",
     "box", "path", "polygon", "circle", "xml", "tsvector", "tsquery", "pg_lsn"}
)  # fmt: skip
_PG_TYPMOD = re.compile(r"\((\d+)(?:,(\d+))?\)")


def parse_pg_type(text: str) -> SourceType:
    """The family of a PostgreSQL column type, as format_type() names it."""
    full = text.strip()
    if full.endswith("[]"):
        return SourceType("array", name="array", dialect="pg", text=full)
    m = _PG_TYPMOD.search(full)
    n = int(m.group(1)) if m else None
    d = int(m.group(2)) if m and m.group(2) else 0
    base = " ".join(_PG_TYPMOD.sub("", full).split())  # `timestamp(3) with time zone` -> without (3)
    if base in _PG_INT:
        return SourceType("int", _PG_INT[base], name=base, dialect="pg", text=full)
    if base in ("real", "double precision"):
        return SourceType("float", 4 if base == "real" else 8, name=base, dialect="pg", text=full)
    if base == "numeric":
        return SourceType("decimal", n or 0, d, name=base, dialect="pg", text=full)
    if base == "money":
        return SourceType("money", 19, 2, name=base, dialect="pg", text=full)
    if base == "boolean":
        return SourceType("bool", 1, name=base, dialect="pg", text=full)
    if base in _PG_STRING:
        return SourceType("string", n or 0, name=base, dialect="pg", text=full)
    if base == "bytea":
        return SourceType("binary", name=base, dialect="pg", text=full)
    if base in ("json", "jsonb"):
        return SourceType("json", name=base, dialect="pg", text=full)
    if base in _PG_TEMPORAL or base.startswith("interval"):
        name = _PG_TEMPORAL.get(base, "interval")
        return SourceType("temporal", scale=6 if n is None else n, name=name, dialect="pg", text=full)
    if base == "enum":
        return SourceType("enum", name=base, dialect="pg", text=full)
    if base in _PG_NATIVE:
        return SourceType("native", n or 0, name=base, dialect="pg", text=full)
    return SourceType("other", name=base, dialect="pg", text=full)


def parse_type(text: str) -> SourceType:
    """The family, size and details of a MySQL column type text (or, with the `pg:` prefix, a
    PostgreSQL one: `parse_pg_type`)."""
    if (text or "").startswith(PG_PREFIX):
        return parse_pg_type(text[len(PG_PREFIX) :])
    m = _TYPE.match(text or "")
    if not m:
        return SourceType("other", name=(text or "").lower())
    name = " ".join(m.group(1).lower().split())
    n = int(m.group(2)) if m.group(2) else None
    d = int(m.group(3)) if m.group(3) else 0
    rest = m.group(4)
    unsigned = "unsigned" in rest.lower()
    if name in ("bool", "boolean"):
        return SourceType("int", 1, name="tinyint")
    if name in _INT_BYTES:
        return SourceType("int", _INT_BYTES[name], unsigned=unsigned, name=name)
    if name in ("float", "real", "double", "double precision"):
        # FLOAT(p) with p > 24 is a DOUBLE (MySQL); REAL is DOUBLE unless REAL_AS_FLOAT
        return SourceType("float", 4 if name == "float" and (n is None or n <= 24 or d) else 8, name=name)
    if name in ("decimal", "numeric", "dec", "fixed"):
        return SourceType("decimal", n if n is not None else 10, d, unsigned=unsigned, name=name)
    if name == "bit":
        return SourceType("bit", n if n is not None else 1, name=name)
    if name in ("char", "varchar"):
        return SourceType("string", n if n is not None else 1, name=name)
    if name in _TEXT_BYTES:
        return SourceType("string", _TEXT_BYTES[name], name=name)
    if name in ("binary", "varbinary"):
        return SourceType("binary", n if n is not None else 1, name=name)
    if name in _BLOB_BYTES:
        return SourceType("binary", _BLOB_BYTES[name], name=name)
    if name in ("date", "datetime", "timestamp", "time", "year"):
        fsp = n if n is not None and name not in ("year", "date") else 0
        return SourceType("temporal", scale=fsp, name=name)
    if name in ("enum", "set"):
        members = tuple(_member(v) for v in _MEMBER.findall(rest))
        return SourceType(name, len(members), name=name, members=members)
    if name == "json":
        return SourceType("json", name=name)
    if name in GEOMETRY_NAMES:
        return SourceType("geometry", name=name)
    return SourceType("other", name=name)


# --- the table ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TypeMapping:
    """One row of the mapping: the source types it covers, what the envelope holds, and each
    target's column type (a rule over the parsed type, and its text for the docs)."""

    source: str  # the source types, as the docs name them
    matches: Callable[[SourceType], bool]
    envelope: str
    postgresql: Callable[[SourceType], str]
    postgresql_doc: str
    sqlite: Callable[[SourceType], str]
    sqlite_doc: str
    note: str = ""
    #: the MySQL/MariaDB target's column type (targets/mysql.py); a key column whose type cannot
    #: be indexed whole (TEXT, BLOB) becomes VARCHAR / VARBINARY there (`mysql_key_type`)
    mysql: Callable[[SourceType], str] = field(default=lambda _t: "longtext")
    mysql_doc: str = "longtext"
    #: the Delta target's Spark SQL column type (targets/delta.py)
    spark: Callable[[SourceType], str] = field(default=lambda _t: "STRING")
    spark_doc: str = "STRING"


def _is(family: str, *names: str) -> Callable[[SourceType], bool]:
    return lambda t: t.family == family and (not names or t.name in names)


def _const(value: str) -> Callable[[SourceType], str]:
    return lambda _t: value


def _pg_int(t: SourceType) -> str:
    # the smallest PostgreSQL integer that holds the source's whole range
    bits = t.size * 8 + (1 if t.unsigned else 0)
    for name, most in (("smallint", 16), ("integer", 32), ("bigint", 64)):
        if bits <= most:
            return name
    return "numeric(20,0)"


def _pg_timestamp(zone: str) -> Callable[[SourceType], str]:
    return lambda t: f"timestamp({t.scale}) {zone} time zone"


def _pg(family: str, *names: str) -> Callable[[SourceType], bool]:
    return lambda t: t.dialect == "pg" and t.family == family and (not names or t.name in names)


def _pg_same(t: SourceType) -> str:
    return t.text


def _mysql(rule: Callable[[SourceType], bool]) -> Callable[[SourceType], bool]:
    return lambda t: t.dialect == "mysql" and rule(t)


def _my_int(t: SourceType) -> str:
    name = "int" if t.name == "integer" else t.name
    return name + (" unsigned" if t.unsigned else "")


def _my_decimal(t: SourceType) -> str:
    return f"decimal({t.size},{t.scale})" + (" unsigned" if t.unsigned else "")


def _my_float(t: SourceType) -> str:
    return "float" if t.size == 4 else "double"


def _my_string(t: SourceType) -> str:
    # rebuilt from the parsed type, never the text a record carries
    return f"{t.name}({t.size})" if t.name in ("char", "varchar", "binary", "varbinary") else t.name


def _my_members(t: SourceType) -> str:
    quoted = ",".join("'" + m.replace("\\", "\\\\").replace("'", "''") + "'" for m in t.members)
    return f"{t.name}({quoted})"


def _my_geometry(t: SourceType) -> str:
    return "geometrycollection" if t.name == "geomcollection" else t.name


def _my_pg_int(t: SourceType) -> str:
    return {2: "smallint", 4: "int"}.get(t.size, "bigint")


def _my_pg_decimal(t: SourceType) -> str:
    if 0 < t.size <= 65 and t.scale <= 30:
        return f"decimal({t.size},{t.scale})"
    return "longtext"


def _my_pg_string(t: SourceType) -> str:
    if t.name in ("character varying", "character") and 0 < t.size <= 255:
        return f"{'varchar' if t.name == 'character varying' else 'char'}({t.size})"
    return "longtext"


def _my_datetime(t: SourceType) -> str:
    return f"datetime({min(t.scale, 6)})"


def _my_pg_temporal(t: SourceType) -> str:
    if t.name == "date":
        return "date"
    if t.name == "time":
        return f"time({min(t.scale, 6)})"
    return "longtext"


def _spark_int(t: SourceType) -> str:
    bits = t.size * 8 + (1 if t.unsigned else 0)
    for name, most in (("TINYINT", 8), ("SMALLINT", 16), ("INT", 32), ("BIGINT", 64)):
        if bits <= most:
            return name
    return "DECIMAL(20,0)"


def _spark_pg_int(t: SourceType) -> str:
    return {2: "SMALLINT", 4: "INT"}.get(t.size, "BIGINT")


def _spark_float(t: SourceType) -> str:
    return "FLOAT" if t.size == 4 else "DOUBLE"


def _spark_decimal(t: SourceType) -> str:
    return f"DECIMAL({t.size},{t.scale})" if 0 < t.size <= 38 else "STRING"


# fmt: off
#: PostgreSQL sources (sync/sources/pg_values.py): a PostgreSQL target gets the source's own type
#: wherever PostgreSQL has it built in, and the value as PostgreSQL prints it, so PostgreSQL to
#: PostgreSQL keeps every value.
PG_MAPPINGS: tuple[TypeMapping, ...] = (
    TypeMapping(
        "PostgreSQL smallint, integer, bigint, oid", _pg("int"), "JSON integer",
        _pg_same, "the same type", _const("INTEGER"), "INTEGER",
        mysql=_my_pg_int, mysql_doc='smallint, int or bigint (oid: bigint)',
        spark=_spark_pg_int, spark_doc='SMALLINT, INT or BIGINT',
    ),
    TypeMapping(
        "PostgreSQL real, double precision", _pg("float"),
        "JSON number (shortest exact: extra_float_digits=3); `NaN`, `Infinity`, `-Infinity` and "
        "`-0` as JSON strings (JSON has no such numbers; a target reading JSON numbers as numeric "
        "would make -0 zero)",
        _pg_same, "the same type", _const("REAL"), "REAL (the three specials as TEXT)",
        mysql=_my_float, mysql_doc='float or double (`NaN`, `Infinity`: refused, MySQL has none)',
        spark=_spark_float, spark_doc='FLOAT or DOUBLE (NaN, the infinities and -0 too)',
    ),
    TypeMapping(
        "PostgreSQL numeric(p,s), numeric", _pg("decimal"),
        "JSON string: the exact value as PostgreSQL prints it, `NaN`, `Infinity`, `-Infinity` included",
        _pg_same, "the same type", _const("TEXT"), "TEXT (the exact text)",
        mysql=_my_pg_decimal,
        mysql_doc="decimal(p,s) up to decimal(65,30); wider or unconstrained: longtext (the exact text)",
        spark=_spark_decimal, spark_doc='DECIMAL(p,s) up to precision 38; wider or unconstrained: STRING',
    ),
    TypeMapping(
        "PostgreSQL money", _pg("money"),
        "JSON string: the amount with 2 decimals, no currency sign or separators (`-1234.56`; "
        "read with lc_monetary=C)",
        _const("numeric(19,2)"), "numeric(19,2) (money's range, free of the target's locale)",
        _const("TEXT"), "TEXT",
        mysql=_const("decimal(19,2)"), mysql_doc='decimal(19,2)',
        spark=_const("DECIMAL(19,2)"), spark_doc='DECIMAL(19,2)',
    ),
    TypeMapping(
        "PostgreSQL boolean", _pg("bool"), "JSON true / false",
        _const("boolean"), "boolean", _const("INTEGER"), "INTEGER (1 / 0)",
        mysql=_const("tinyint(1)"), mysql_doc='tinyint(1) (1 / 0)',
        spark=_const("BOOLEAN"), spark_doc='BOOLEAN',
    ),
    TypeMapping(
        "PostgreSQL text, varchar(n), char(n), name", _pg("string"),
        "JSON string (char(n) padded to n, as PostgreSQL prints it)",
        _pg_same, "the same type", _const("TEXT"), "TEXT",
        mysql=_my_pg_string, mysql_doc='varchar(n), char(n) (n up to 255), else longtext',
        spark=_const("STRING"), spark_doc='STRING',
    ),
    TypeMapping(
        "PostgreSQL bytea", _pg("binary"), "base64 JSON string of every byte (listed in `binary`)",
        _const("bytea"), "bytea", _const("BLOB"), "BLOB",
        mysql=_const("longblob"), mysql_doc='longblob',
        spark=_const("BINARY"), spark_doc='BINARY',
    ),
    TypeMapping(
        "PostgreSQL json, jsonb", _pg("json"),
        "JSON string: the document's text (json: as written; jsonb: normalised)",
        _pg_same, "the same type", _const("TEXT"), "TEXT",
        mysql=_const("json"), mysql_doc='json',
        spark=_const("STRING"), spark_doc='STRING',
    ),
    TypeMapping(
        "PostgreSQL timestamp(p)", _pg("temporal", "timestamp"),
        "JSON string `YYYY-MM-DDTHH:MM:SS[.ffffff]` (` BC` after a year before 1), or `infinity`, "
        "`-infinity`",
        _pg_same, "the same type", _const("TEXT"), "TEXT",
        mysql=_my_datetime, mysql_doc='datetime(p) (years 1000..9999; BC and infinity refused)',
        spark=_const("STRING"), spark_doc='STRING',
    ),
    TypeMapping(
        "PostgreSQL timestamptz(p)", _pg("temporal", "timestamptz"),
        "JSON string in UTC `YYYY-MM-DDTHH:MM:SS[.ffffff]Z`, or `infinity`, `-infinity`",
        _pg_same, "the same type", _const("TEXT"), "TEXT",
        mysql=_my_datetime, mysql_doc='datetime(p) in UTC (TIMESTAMP would end in 2038)',
        spark=_const("STRING"), spark_doc='STRING',
    ),
    TypeMapping(
        "PostgreSQL date, time, timetz, interval", _pg("temporal"),
        "JSON string as PostgreSQL prints it (DateStyle ISO, IntervalStyle postgres: `1 year 2 mons "
        "3 days 04:05:06`), date `infinity` included",
        _pg_same, "the same type", _const("TEXT"), "TEXT",
        mysql=_my_pg_temporal, mysql_doc='date, time(p); timetz and interval: longtext',
        spark=_const("STRING"), spark_doc='STRING',
    ),
    TypeMapping(
        "PostgreSQL enum types", _pg("enum"), "JSON string: the label",
        _const("text"), "text", _const("TEXT"), "TEXT",
        mysql=_const("longtext"), mysql_doc='longtext',
        spark=_const("STRING"), spark_doc='STRING',
    ),
    TypeMapping(
        "PostgreSQL arrays", _pg("array"),
        "JSON string: PostgreSQL's array literal (`{1,2,NULL}`, `{{1,2},{3,4}}`)",
        lambda t: "text[]" if t.text == "enum[]" else t.text, "the same array type (an enum's: text[])",
        _const("TEXT"), "TEXT",
        mysql=_const("longtext"), mysql_doc='longtext',
        spark=_const("STRING"), spark_doc='STRING',
    ),
    TypeMapping(
        "PostgreSQL uuid, inet, cidr, macaddr(8), bit(n), varbit, ranges and multiranges, point, "
        "line, lseg, box, path, polygon, circle, xml, tsvector, tsquery, pg_lsn",
        _pg("native"), "JSON string as PostgreSQL prints it",
        _pg_same, "the same type", _const("TEXT"), "TEXT",
        mysql=_const("longtext"), mysql_doc='longtext',
        spark=_const("STRING"), spark_doc='STRING',
    ),
    TypeMapping(
        "PostgreSQL: anything else (hstore, citext, an extension's or a composite type)",
        lambda t: t.dialect == "pg", "JSON string as PostgreSQL prints it",
        _const("text"), "text", _const("TEXT"), "TEXT",
        mysql=_const("longtext"), mysql_doc='longtext',
        spark=_const("STRING"), spark_doc='STRING',
    ),
)

MAPPINGS: tuple[TypeMapping, ...] = (
    TypeMapping(
        "TINYINT, SMALLINT, MEDIUMINT, INT, BIGINT (signed); BOOL (TINYINT(1))",
        lambda t: t.family == "int" and not (t.unsigned and t.size == 8),
        "JSON integer",
        _pg_int, "smallint, integer or bigint: the smallest that holds the type's range "
        "(INT UNSIGNED -> bigint)",
        _const("INTEGER"), "INTEGER",
        "UNSIGNED variants included; BOOL is TINYINT(1): an integer, as stored (-128..127)",
        mysql=_my_int, mysql_doc='the same type',
        spark=_spark_int, spark_doc='TINYINT .. BIGINT: the smallest that holds the range',
    ),
    TypeMapping(
        "BIGINT UNSIGNED",
        lambda t: t.family == "int" and t.unsigned and t.size == 8,
        "JSON integer (0 .. 18446744073709551615)",
        _const("numeric(20,0)"), "numeric(20,0)",
        _const("TEXT"), "TEXT (decimal digits)",
        "SQLite's integers are signed 64-bit: above 2^63 - 1 it could hold only a lossy REAL",
        mysql=_my_int, mysql_doc='bigint unsigned',
        spark=_const("DECIMAL(20,0)"), spark_doc='DECIMAL(20,0)',
    ),
    TypeMapping(
        "DECIMAL(p,s), NUMERIC",
        _is("decimal"),
        "JSON string: the exact value with s digits after the point, as MariaDB prints it "
        "(`-1.50`; negative zero is `0.00`)",
        lambda t: f"numeric({t.size},{t.scale})", "numeric(p,s)",
        _const("TEXT"), "TEXT (the exact text)",
        "SQLite's NUMERIC affinity would round to a 64-bit float",
        mysql=_my_decimal, mysql_doc='decimal(p,s)',
        spark=_spark_decimal, spark_doc='DECIMAL(p,s) up to precision 38; wider: STRING (the exact text)',
    ),
    TypeMapping(
        "FLOAT",
        lambda t: t.family == "float" and t.size == 4,
        "JSON number: the shortest decimal that reads back as the same float32 (`1.1`, not "
        "`1.100000023841858`)",
        _const("real"), "real (float4)",
        _const("REAL"), "REAL",
        mysql=_const("float"), mysql_doc='float',
        spark=_const("FLOAT"), spark_doc='FLOAT',
    ),
    TypeMapping(
        "DOUBLE, REAL",
        lambda t: t.family == "float" and t.size == 8,
        "JSON number (the shortest decimal that reads back as the same double)",
        _const("double precision"), "double precision",
        _const("REAL"), "REAL",
        mysql=_const("double"), mysql_doc='double',
        spark=_const("DOUBLE"), spark_doc='DOUBLE',
    ),
    TypeMapping(
        "BIT(n)",
        _is("bit"),
        "JSON string of n `0`/`1` characters, most significant first (`b'101'` in BIT(5) is `00101`)",
        lambda t: f"bit({t.size})", "bit(n)",
        _const("TEXT"), "TEXT (the n characters)",
        mysql=lambda t: f"bit({t.size})", mysql_doc='bit(n)',
        spark=_const("STRING"), spark_doc='STRING',
    ),
    TypeMapping(
        "DATE",
        _is("temporal", "date"),
        "JSON string `YYYY-MM-DD`; zero and invalid dates by the task's `zero_dates` option",
        _const("date"), "date",
        _const("TEXT"), "TEXT (`YYYY-MM-DD`)",
        mysql=_const("date"), mysql_doc='date',
        spark=_const("DATE"), spark_doc='DATE',
    ),
    TypeMapping(
        "DATETIME(fsp)",
        _is("temporal", "datetime"),
        "JSON string `YYYY-MM-DDTHH:MM:SS` with fsp fractional digits (`.500` in DATETIME(3)), "
        "no time zone (the server's wall clock, as stored); zero and invalid dates by `zero_dates`",
        _pg_timestamp("without"), "timestamp(fsp) without time zone",
        _const("TEXT"), "TEXT (ISO 8601)",
        mysql=lambda t: f"datetime({t.scale})", mysql_doc='datetime(fsp)',
        spark=_const("TIMESTAMP_NTZ"), spark_doc='TIMESTAMP_NTZ',
    ),
    TypeMapping(
        "TIMESTAMP(fsp)",
        _is("temporal", "timestamp"),
        "JSON string in UTC, `YYYY-MM-DDTHH:MM:SS[.fff]Z`, whatever the server's or session's "
        "time zone; the zero timestamp by `zero_dates`",
        _pg_timestamp("with"), "timestamp(fsp) with time zone",
        _const("TEXT"), "TEXT (ISO 8601, UTC, with Z)",
        mysql=lambda t: f"timestamp({t.scale})", mysql_doc='timestamp(fsp) (written and read in UTC)',
        spark=_const("TIMESTAMP"), spark_doc='TIMESTAMP (UTC)',
    ),
    TypeMapping(
        "TIME(fsp)",
        _is("temporal", "time"),
        "JSON string as MariaDB prints it: `[-]HH:MM:SS` and fsp fractional digits, "
        "-838:59:59 .. 838:59:59 (a duration, not a time of day)",
        _const("interval"), "interval",
        _const("TEXT"), "TEXT (`-838:59:59.000000`)",
        mysql=lambda t: f"time({t.scale})", mysql_doc='time(fsp)',
        spark=_const("STRING"), spark_doc='STRING',
    ),
    TypeMapping(
        "YEAR",
        _is("temporal", "year"),
        "JSON integer: 0 (the zero year `0000`) or 1901..2155",
        _const("smallint"), "smallint",
        _const("INTEGER"), "INTEGER",
        mysql=_const("year"), mysql_doc='year',
        spark=_const("SMALLINT"), spark_doc='SMALLINT',
    ),
    TypeMapping(
        "CHAR, VARCHAR, TINYTEXT .. LONGTEXT (a character set)",
        _is("string"),
        "JSON string (Unicode, decoded from the column's character set; latin1 is MySQL's "
        "cp1252). CHAR loses its trailing spaces, as MySQL returns it (PAD_CHAR_TO_FULL_LENGTH "
        "off); VARCHAR and TEXT keep them",
        _const("text"), "text (U+0000 cannot be stored: dropped, counted and logged)",
        _const("TEXT"), "TEXT",
        mysql=_my_string, mysql_doc='the same type, in utf8mb4 with a binary no-pad collation',
        spark=_const("STRING"), spark_doc='STRING',
    ),
    TypeMapping(
        "BINARY(n), VARBINARY, TINYBLOB .. LONGBLOB",
        _is("binary"),
        "base64 JSON string of every byte (listed in the envelope's `binary`); BINARY(n) "
        "padded with 0x00 to n bytes, as stored",
        _const("bytea"), "bytea",
        _const("BLOB"), "BLOB",
        mysql=_my_string, mysql_doc='the same type',
        spark=_const("BINARY"), spark_doc='BINARY',
    ),
    TypeMapping(
        "ENUM",
        _is("enum"),
        "JSON string: the label (`''` for the error value 0)",
        _const("text"), "text",
        _const("TEXT"), "TEXT",
        mysql=_my_members, mysql_doc='the same ENUM',
        spark=_const("STRING"), spark_doc='STRING',
    ),
    TypeMapping(
        "SET",
        _is("set"),
        "JSON string: the members, comma-separated in definition order, as MariaDB prints them "
        "(`a,b`; `''` for the empty set)",
        _const("text"), "text",
        _const("TEXT"), "TEXT",
        mysql=_my_members, mysql_doc='the same SET',
        spark=_const("STRING"), spark_doc='STRING',
    ),
    TypeMapping(
        "JSON (MySQL); MariaDB's JSON (LONGTEXT with CHECK (json_valid(col)))",
        _is("json"),
        "JSON string: the document's text (MariaDB: as stored; MySQL: as MySQL prints it). "
        "MariaDB's JSON is LONGTEXT: a column with a `json_valid(col)` check constraint "
        "(information_schema.CHECK_CONSTRAINTS) is JSON",
        _const("jsonb"), "jsonb (the same document; key order, spacing and duplicate keys "
        "are jsonb's)",
        _const("TEXT"), "TEXT (the document's text)",
        mysql=_const("json"), mysql_doc='json',
        spark=_const("STRING"), spark_doc='STRING',
    ),
    TypeMapping(
        "GEOMETRY, POINT, LINESTRING, POLYGON, MULTI*, GEOMETRYCOLLECTION",
        _is("geometry"),
        "base64 of MySQL's own value: the SRID (4 bytes, little-endian), then the OGC WKB "
        "(`ST_GeomFromWKB(SUBSTRING(v, 5), srid)` reads it back)",
        _const("bytea"), "bytea",
        _const("BLOB"), "BLOB",
        mysql=_my_geometry, mysql_doc='the same type',
        spark=_const("BINARY"), spark_doc='BINARY',
    ),
)
# fmt: on
MAPPINGS = (
    tuple(
        TypeMapping(
            m.source,
            _mysql(m.matches),
            m.envelope,
            m.postgresql,
            m.postgresql_doc,
            m.sqlite,
            m.sqlite_doc,
            m.note,
            m.mysql,
            m.mysql_doc,
            m.spark,
            m.spark_doc,
        )
        for m in MAPPINGS
    )
    + PG_MAPPINGS
)  # fmt: skip

#: Types no row covers (MariaDB's UUID, INET4, INET6 among them): text in both targets.
_OTHER = TypeMapping(
    "anything else", lambda t: True, "JSON string as the source gives it",
    _const("text"), "text", _const("TEXT"), "TEXT",
)  # fmt: skip


def mapping_for(t: SourceType) -> TypeMapping:
    for row in MAPPINGS:
        if row.matches(t):
            return row
    return _OTHER


def postgres_type(source_type: str) -> str:
    """The PostgreSQL column type of a source type (as `format_type` names it)."""
    t = parse_type(source_type)
    return mapping_for(t).postgresql(t)


def mysql_type(source_type: str) -> str:
    """The MySQL/MariaDB target's column type of a source type (targets/mysql.py)."""
    t = parse_type(source_type)
    return mapping_for(t).mysql(t)


def spark_type(source_type: str) -> str:
    """The Delta target's Spark SQL column type of a source type (targets/delta.py)."""
    t = parse_type(source_type)
    return mapping_for(t).spark(t)


def sqlite_type(source_type: str) -> str:
    t = parse_type(source_type)
    return mapping_for(t).sqlite(t)


def markdown_table() -> str:
    """The mapping as the Markdown table docs/TYPES.md shows."""
    lines = [
        "| source type | envelope value | PostgreSQL | SQLite | MySQL/MariaDB | Delta (Spark) | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in MAPPINGS:
        cells = (row.source, row.envelope, row.postgresql_doc, row.sqlite_doc, row.mysql_doc, row.spark_doc,
                 row.note)  # fmt: skip
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"
