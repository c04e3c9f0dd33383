"""What the MySQL target merges in SQL and what it leaves to the driver (mysql_stage.py): the
rules that pick the path. Whether the SQL writes what the driver writes is checked on MariaDB
(test_mysql_staging.py, test_type_matrix.py)."""

from __future__ import annotations

import pyarrow as pa

from sluice.sync.targets.mysql_stage import STAGED_COLUMNS, exception_sql, json_path, staged_values, value_sql
from sluice.sync.types import mysql_type


def test_a_column_name_a_json_path_cannot_quote_plainly_goes_to_the_driver() -> None:
    assert json_path("plain name.with dots") == "'$.\"plain name.with dots\"'"
    for name in ['q"uote', "back\\slash", "it's", "100%", "tab\there"]:
        assert json_path(name) is None, name


def test_every_type_the_target_creates_has_sql_and_others_do_not() -> None:
    made = ["int(11)", "bigint(20) unsigned", "decimal(65,30)", "float", "double", "bit(64)", "date",
            "datetime(6)", "timestamp(3)", "time(6)", "year", "varchar(64)", "longtext", "enum('a','')",
            "set('a','b')", "json", "binary(4)", "longblob", "point", "geometry"]  # fmt: skip
    for source in made:
        assert value_sql("v.j", mysql_type(source), False) is not None, source
    assert value_sql("v.j", "vector(3)", False) is None
    assert value_sql("v.j", "inet6", False) is None


def test_values_the_sql_would_write_otherwise_are_named() -> None:
    assert exception_sql("x", "enum('a','b')") == "JSON_UNQUOTE(x) = ''"
    assert exception_sql("x", "enum('a','')") is None  # '' is a member: no error value
    assert exception_sql("x", "bit(5)") is not None
    assert exception_sql("x", "year") is not None
    assert exception_sql("x", "int(11)") is None  # a fraction: refused in the SQL (value_sql)
    assert "has a fraction" in (value_sql("x", "int(11)", False) or "")
    assert "FROM_BASE64" in (value_sql("x", "blob", True) or "")
    assert "FROM_BASE64" not in (value_sql("x", "blob", False) or "")


def test_a_staged_row_is_plain_unless_it_holds_an_object_or_an_array() -> None:
    rows = pa.table({
        "token": [1, 1, 1], "topic": ["t"] * 3, "partition": [0] * 3, "offset": [0, 1, 2], "ts": [0] * 3,
        "tbl": ["a"] * 3, "key": ['{"id":1}', '{"id":2}', '{"id":3}'], "pos": [1, 2, 3],
        "op": ["c", "c", "d"],
        "after": ['{"id":1,"v":true,"f":1.5,"s":null}', '{"id":2,"v":{"a":1}}', None],
        "records": [1] * 3, "binary": [None] * 3, "types": [None] * 3,
    })  # fmt: skip
    staged = [dict(zip(STAGED_COLUMNS, row, strict=True)) for row in staged_values(rows)]
    assert [r["plain"] for r in staged] == [1, 0, 1]
    assert len({r["kh"] for r in staged}) == 3 and all(len(r["kh"]) == 32 for r in staged)
    assert [r["cols"] for r in staged] == ['["f","id","s","v"]', '["id","v"]', None]
    # rows of one table with the same members, types and bytes share a shape
    assert staged[0]["shape"] != staged[1]["shape"] and len(staged[0]["shape"]) == 32
