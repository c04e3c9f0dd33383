"""The MySQL target's pure rules: column types from the one type table, ENUM/SET members read
from COLUMN_TYPE, key columns made indexable, values as the server takes them."""

from __future__ import annotations

import struct

import pytest

from sluice.sync.targets.base import BadTargetUrlError
from sluice.sync.targets.mysql import _converter, _key_types, parse_url
from sluice.sync.types import mysql_type, parse_type


@pytest.mark.parametrize(
    ("source", "target"),
    [
        ("int(10) unsigned", "int unsigned"),
        ("tinyint(1)", "tinyint"),
        ("bigint(20) unsigned", "bigint unsigned"),
        ("decimal(65,30)", "decimal(65,30)"),
        ("float", "float"),
        ("double", "double"),
        ("bit(5)", "bit(5)"),
        ("datetime(3)", "datetime(3)"),
        ("timestamp(6)", "timestamp(6)"),
        ("time", "time(0)"),
        ("year(4)", "year"),
        ("varchar(20)", "varchar(20)"),
        ("char(3)", "char(3)"),
        ("mediumtext", "mediumtext"),
        ("binary(4)", "binary(4)"),
        ("longblob", "longblob"),
        ("json", "json"),
        ("geomcollection", "geometrycollection"),
        ("inet6", "longtext"),
        ("pg:numeric(10,2)", "decimal(10,2)"),
        ("pg:numeric", "longtext"),
        ("pg:character varying(10)", "varchar(10)"),
        ("pg:text", "longtext"),
        ("pg:timestamp(3) with time zone", "datetime(3)"),
        ("pg:boolean", "tinyint(1)"),
        ("pg:integer[]", "longtext"),
    ],
)
def test_column_types_come_from_the_one_table(source: str, target: str) -> None:
    assert mysql_type(source) == target


def test_enum_members_are_read_with_columntypes_escapes_and_written_back_quoted() -> None:
    # COLUMN_TYPE as MariaDB prints ENUM('it''s', 'b\c', 'd"', 'x<newline>y')
    text = "enum('it''s','b\\\\c','d\"','x\\ny')"
    assert parse_type(text).members == ("it's", "b\\c", 'd"', "x\ny")
    assert mysql_type("enum('it''s','b\\\\c')") == "enum('it''s','b\\\\c')"


def test_a_type_from_a_record_never_reaches_the_ddl_as_text() -> None:
    """Types are rebuilt from their parsed parts: a hostile `types` text cannot add SQL."""
    assert mysql_type("int); DROP TABLE x; --") == "int"
    assert mysql_type("varchar(10) character set latin1; drop") == "varchar(10)"


def test_key_columns_share_what_an_index_holds() -> None:
    assert _key_types({"id": "bigint"}) == {"id": "bigint"}
    assert _key_types({"a": "longtext", "b": "LONGBLOB"}) == {"a": "varchar(384)", "b": "varbinary(1536)"}
    assert _key_types({"a": "text", "n": "int"}) == {"a": "varchar(764)", "n": "int"}


def test_values_as_the_server_takes_them() -> None:
    assert _converter("datetime(3)")("2024-01-02T03:04:05.500") == "2024-01-02 03:04:05.500"
    assert _converter("timestamp(6)")("2024-01-02T03:04:05Z") == "2024-01-02 03:04:05"
    assert _converter("bit(5)")("00101") == 5
    assert _converter("json")({"a": 1}) == '{"a":1}' and _converter("json")("[1, 2]") == "[1, 2]"
    # FLT_MAX's shortest text is above FLT_MAX as a double: the float32's exact double goes
    flt_max = _converter("float")(3.4028235e38)
    assert flt_max == struct.unpack("<f", struct.pack("<f", 3.4028235e38))[0] < 3.4028235e38


def test_urls() -> None:
    assert parse_url("mysql://sluice@db.example:3307/shop") == {
        "host": "db.example", "port": 3307, "user": "sluice", "database": "shop",
    }  # fmt: skip
    with pytest.raises(BadTargetUrlError, match="names a host and a database"):
        parse_url("mysql://sluice@db.example:3307/")
