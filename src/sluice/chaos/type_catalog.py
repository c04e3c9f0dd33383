"""Every MariaDB/MySQL column type Sluice maps (sync/types.py), each with its edge values as SQL
literals: what the type-matrix tests write into a source, the Debezium differential captures,
and the random workload of `sluice chaos sync` draws from.

Literals are for a MariaDB session with `SESSION_SQL_MODE` (not strict, invalid dates allowed),
so that zero dates, zero-in-date dates, invalid dates and ENUM's error value can be written at
all. TIMESTAMP literals are in the writing session's time zone; `TIMESTAMP_ZONE` is the server
time zone the tests start MariaDB with, so that a server off UTC is what the captures meet.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The writing session's sql_mode: zero dates, zero-in-date and invalid dates, ENUM's '' value.
SESSION_SQL_MODE = "ALLOW_INVALID_DATES"
#: The source server's time zone in the type-matrix tests (not UTC: TIMESTAMPs must come in UTC).
TIMESTAMP_ZONE = "+02:00"


@dataclass(frozen=True, slots=True)
class CatalogType:
    """A column type and its edge values (SQL literals, in `TIMESTAMP_ZONE` for TIMESTAMPs)."""

    column: str  # the column's name in tables made from the catalog
    ddl: str  # its type in CREATE TABLE
    values: tuple[str, ...]


_BLOB_ALL_BYTES = "x'" + bytes(range(256)).hex().upper() + "'"
_DEC65_MAX = "99999999999999999999999999999999999.999999999999999999999999999999"

# fmt: off
CATALOG: tuple[CatalogType, ...] = (
    CatalogType("c_tinyint", "TINYINT", ("-128", "127", "0")),
    CatalogType("c_tinyint_u", "TINYINT UNSIGNED", ("0", "255")),
    CatalogType("c_bool", "BOOL", ("0", "1", "-1")),
    CatalogType("c_smallint", "SMALLINT", ("-32768", "32767")),
    CatalogType("c_smallint_u", "SMALLINT UNSIGNED", ("65535", "0")),
    CatalogType("c_mediumint", "MEDIUMINT", ("-8388608", "8388607")),
    CatalogType("c_mediumint_u", "MEDIUMINT UNSIGNED", ("16777215", "0")),
    CatalogType("c_int", "INT", ("-2147483648", "2147483647", "0")),
    CatalogType("c_int_u", "INT UNSIGNED", ("4294967295", "0")),
    CatalogType("c_bigint", "BIGINT", ("-9223372036854775808", "9223372036854775807", "0")),
    CatalogType("c_bigint_u", "BIGINT UNSIGNED",
                ("18446744073709551615", "9223372036854775808", "9223372036854775807", "0")),
    CatalogType("c_dec65", "DECIMAL(65,30)",
                (f"'{_DEC65_MAX}'", f"'-{_DEC65_MAX}'", "'0.000000000000000000000000000001'",
                 "'-0.000000000000000000000000000001'", "'-0.0'")),
    CatalogType("c_dec10", "DECIMAL(10,2)", ("'-12345678.90'", "'0.05'", "'-0.00'", "'99999999.99'")),
    CatalogType("c_dec5", "DECIMAL(5,0)", ("99999", "-99999", "0")),
    CatalogType("c_float", "FLOAT",
                ("1.1", "-1.1", "3.4028234663852886e38", "-3.4028234663852886e38", "1.17549435e-38",
                 "1.401298464324817e-45", "16777217", "0.1", "0")),
    CatalogType("c_double", "DOUBLE",
                ("0.30000000000000004", "1.7976931348623157e308", "-1.7976931348623157e308",
                 "2.2250738585072014e-308", "4.9e-324", "123456789012345.67", "0")),
    CatalogType("c_bit1", "BIT(1)", ("b'0'", "b'1'")),
    CatalogType("c_bit5", "BIT(5)", ("b'00101'", "b'11111'", "b'0'")),
    CatalogType("c_bit64", "BIT(64)", ("b'" + "1" * 64 + "'", "b'1'", "b'1" + "0" * 63 + "'")),
    CatalogType("c_date", "DATE",
                ("'1000-01-01'", "'9999-12-31'", "'2024-02-29'", "'0000-00-00'", "'2024-00-15'",
                 "'2024-02-30'", "'0001-01-01'")),
    CatalogType("c_datetime", "DATETIME",
                ("'1000-01-01 00:00:00'", "'9999-12-31 23:59:59'", "'0000-00-00 00:00:00'",
                 "'2024-02-30 12:00:00'")),
    CatalogType("c_datetime3", "DATETIME(3)", ("'2024-06-30 12:00:00.5'", "'2024-06-30 23:59:59.999'")),
    CatalogType("c_datetime6", "DATETIME(6)",
                ("'2024-06-30 12:00:00.000001'", "'9999-12-31 23:59:59.999999'", "'1970-01-01 00:00:00'")),
    # in TIMESTAMP_ZONE (+02:00): 1970-01-01T00:00:01Z and 2038-01-19T03:14:07Z are the range's ends
    CatalogType("c_timestamp", "TIMESTAMP NULL",
                ("'1970-01-01 02:00:01'", "'2038-01-19 05:14:07'", "'2024-06-30 14:00:00'",
                 "'0000-00-00 00:00:00'")),
    CatalogType("c_timestamp6", "TIMESTAMP(6) NULL",
                ("'2024-06-30 14:00:00.000001'", "'2038-01-19 05:14:07.999999'")),
    CatalogType("c_time", "TIME", ("'-838:59:59'", "'838:59:59'", "'00:00:00'", "'-00:00:01'")),
    CatalogType("c_time1", "TIME(1)", ("'-00:00:01.1'", "'00:00:00.9'", "'-838:59:58.9'")),
    CatalogType("c_time6", "TIME(6)",
                ("'-12:34:56.000001'", "'838:59:58.999999'", "'-00:00:00.000001'", "'24:00:00.5'")),
    CatalogType("c_year", "YEAR", ("0", "1901", "2155", "2024")),
    CatalogType("c_char", "CHAR(10) CHARACTER SET utf8mb4",
                ("'a  '", "''", "'héllo'", "'😀'", "'  lead'")),
    CatalogType("c_varchar", "VARCHAR(32) CHARACTER SET utf8mb4",
                ("'b  '", "'😀𝄞'", "''", "'a\\tb\\nc\\\\d'", "'x\\0y'")),
    CatalogType("c_text", "TEXT CHARACTER SET utf8mb4",
                ("'long text 𝄞 ünïcödé'", "''", "REPEAT('ab', 3000)")),
    # MySQL's latin1 is cp1252: 0x80 is the euro sign, 0x81 and 0x9D stay C1 controls
    CatalogType("c_latin1", "VARCHAR(16) CHARACTER SET latin1",
                ("x'80819DFFE7'", "'çà'", "x'A4'", "''")),
    CatalogType("c_binary", "BINARY(4)", ("'ab'", "x'00000000'", "x'FF00FF00'", "''")),
    CatalogType("c_varbinary", "VARBINARY(16)", ("''", "x'00'", "x'FF80'")),
    CatalogType("c_blob", "BLOB", (_BLOB_ALL_BYTES, "''", "x'0000'")),
    CatalogType("c_enum", "ENUM('x','y','a,b')", ("'y'", "'a,b'", "''")),
    CatalogType("c_set", "SET('a','b','c')", ("'a,b'", "''", "'c,a'")),
    CatalogType("c_json", "JSON",
                ("'{\"a\": 1, \"b\": [true, null]}'", "'[]'", "'\"str\"'", "'1.5'", "'null'",
                 "'{\"k\": \"😀\", \"n\": 12345678901234567890}'")),
    CatalogType("c_geometry", "GEOMETRY",
                ("ST_GeomFromText('POINT(1 2)', 4326)", "ST_GeomFromText('POLYGON((0 0,1 0,1 1,0 0))')")),
    CatalogType("c_point", "POINT", ("ST_GeomFromText('POINT(-1.5 2.25)')",)),
)
# fmt: on


def create_table(name: str, types: tuple[CatalogType, ...] = CATALOG) -> str:
    """A table of `types` with an INT primary key `id`."""
    cols = ", ".join(f"`{t.column}` {t.ddl}" for t in types)
    return f"CREATE TABLE `{name}` (id INT NOT NULL PRIMARY KEY, {cols})"


def rows(types: tuple[CatalogType, ...] = CATALOG) -> list[dict[str, str]]:
    """Rows that between them hold every edge value of every type (row i has each type's value
    i, cycling through shorter lists), and a last row of NULLs: column -> SQL literal."""
    n = max(len(t.values) for t in types)
    out = [{t.column: t.values[i % len(t.values)] for t in types} for i in range(n)]
    out.append({t.column: "NULL" for t in types})
    return out


def insert(table: str, key: int, row: dict[str, str]) -> str:
    cols = ", ".join(f"`{c}`" for c in row)
    return f"INSERT INTO `{table}` (id, {cols}) VALUES ({key}, {', '.join(row.values())})"


def update(table: str, key: int, row: dict[str, str]) -> str:
    sets = ", ".join(f"`{c}` = {v}" for c, v in row.items())
    return f"UPDATE `{table}` SET {sets} WHERE id = {key}"
