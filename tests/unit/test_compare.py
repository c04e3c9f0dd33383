"""The comparison of source and target values (sync/compare.py): exact per the type mapping, a
target's form of each kind read back, and rows counted missing, extra and different."""

from __future__ import annotations

import datetime as dt
import decimal

from sluice.sync.compare import (
    Check,
    Kind,
    column_check,
    compare_table,
    table_schema,
    target_value,
    values_equal,
)

ITEMS = table_schema(
    "items",
    {"id": "int(11)", "name": "varchar(64)", "price": "decimal(12,3)", "ratio": "double", "f": "float",
     "at": "datetime(6)", "ts": "timestamp(3)", "tod": "time(6)", "doc": "json", "raw": "blob",
     "b": "bit(5)", "y": "year(4)"},
    ["id"],
)  # fmt: skip


def _source(i: int, **changes: object) -> dict[str, object]:
    """A row as the source's reference reading gives it (compare.reference_select)."""
    row: dict[str, object] = {
        "id": str(i), "name": f"n{i}", "price": "12.500", "ratio": 0.1 + i, "f": 1.100000023841858,
        "at": "2024-05-06 07:08:09.120000", "ts": decimal.Decimal("1719748800.500"),
        "tod": "-30:05:00.000001", "doc": '{"a": [1, 2], "b": null}', "raw": "00FF616263", "b": "101",
        "y": "0000",
    }  # fmt: skip
    row.update(changes)
    return row


def _pg(i: int, **changes: object) -> dict[str, object]:
    """The same row as PostgreSQL's driver returns it from the mapping's column types."""
    row: dict[str, object] = {
        "id": i, "name": f"n{i}", "price": decimal.Decimal("12.500"), "ratio": 0.1 + i, "f": 1.1,
        "at": dt.datetime(2024, 5, 6, 7, 8, 9, 120000),
        "ts": dt.datetime(2024, 6, 30, 12, 0, 0, 500000, tzinfo=dt.UTC),
        "tod": -dt.timedelta(hours=30, minutes=5, microseconds=1), "doc": {"b": None, "a": [1, 2.0]},
        "raw": memoryview(b"\x00\xffabc"), "b": "00101", "y": 0,
    }  # fmt: skip
    row.update(changes)
    return row


def _sqlite(i: int, **changes: object) -> dict[str, object]:
    """The same row as SQLite holds it: the envelope's canonical text for the rest."""
    row: dict[str, object] = {
        "id": i, "name": f"n{i}", "price": "12.500", "ratio": 0.1 + i, "f": 1.1,
        "at": "2024-05-06T07:08:09.120000", "ts": "2024-06-30T12:00:00.500Z", "tod": "-30:05:00.000001",
        "doc": '{"a":[1,2],"b":null}', "raw": b"\x00\xffabc", "b": "00101", "y": 0,
    }  # fmt: skip
    row.update(changes)
    return row


def test_a_row_reads_the_same_from_the_source_postgresql_and_sqlite() -> None:
    for dialect, row in (("postgresql", _pg(1)), ("sqlite", _sqlite(1))):
        got = compare_table(ITEMS, [_source(1)], [row], dialect)
        assert (got.equal, got.different) == (1, []), (dialect, got.different)


def test_comparison_counts_missing_extra_and_different_rows() -> None:
    source = [_source(i) for i in range(1, 7)]
    target = [_pg(i) for i in (1, 2, 3, 5)] + [_pg(9)]  # 4 and 6 missing, 9 extra
    target[1] = _pg(2, price=decimal.Decimal("12.50"))  # the scale is part of the value
    target[2] = _pg(3, raw="AP9hYmM=")  # base64 of the bytes: not the bytes
    got = compare_table(ITEMS, source, target, "postgresql")
    assert (got.compared, got.equal) == (6, 2)
    assert got.missing == ['{"id": 4}', '{"id": 6}']
    assert got.extra == ['{"id": 9}']
    assert [(k, [c for c, _, _ in cols]) for k, cols in got.different] == [
        ('{"id": 2}', ["price"]),
        ('{"id": 3}', ["raw"]),
    ]


def test_every_kind_is_exact() -> None:
    f32 = Check(Kind.FLOAT32)
    assert not values_equal(f32, target_value(f32, 1.100000023841858), target_value(f32, 1.1000001))
    assert values_equal(f32, target_value(f32, 1.100000023841858), target_value(f32, "1.1"))
    dbl = Check(Kind.DOUBLE)
    assert not values_equal(dbl, 0.3, target_value(dbl, 0.30000000000000004))
    assert not values_equal(Check(Kind.INT), 1, target_value(Check(Kind.INT), "x"))
    js = Check(Kind.JSON)
    assert not values_equal(js, {"a": True}, target_value(js, '{"a": 1}'))
    assert target_value(Check(Kind.TIME), dt.timedelta(days=-1, seconds=86399)) == "-00:00:01.000000"
    assert target_value(Check(Kind.DATE), "0000-00-00") is None  # zero_dates: null
    assert target_value(Check(Kind.DECIMAL), "-0.00") == "0.00"
    assert [column_check(t).kind for t in ("bigint(20) unsigned", "set('a','b')", "geometry", "year")] == [
        Kind.INT, Kind.TEXT, Kind.BINARY, Kind.INT,
    ]  # fmt: skip


def test_postgresql_cannot_hold_nul_and_sqlite_can() -> None:
    schema = table_schema("t", {"id": "int", "name": "text"}, ["id"])
    nul = [{"id": "1", "name": "a\x00b"}]
    assert compare_table(schema, nul, [{"id": 1, "name": "ab"}], "postgresql").equal == 1
    assert compare_table(schema, nul, [{"id": 1, "name": "ab"}], "sqlite").equal == 0


def test_the_docs_show_the_mapping_table_as_the_code_has_it() -> None:
    from pathlib import Path

    from sluice.sync.types import markdown_table

    docs = (Path(__file__).parents[2] / "docs" / "TYPES.md").read_text()
    start = docs.index("<!-- generated: sluice.sync.types.markdown_table() -->\n") + len(
        "<!-- generated: sluice.sync.types.markdown_table() -->\n"
    )
    assert docs[start : docs.index("<!-- end generated -->")] == markdown_table()
