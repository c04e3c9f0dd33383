"""Which DDL statements make the capture read a table again: ALTER TABLE ... ADD of columns."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sluice.sync.sources.mysql import _table_with_added_columns


@pytest.mark.parametrize(
    ("query", "schema", "table"),
    [
        ("ALTER TABLE customers ADD COLUMN tier VARCHAR(8)", b"shop", "customers"),
        ("alter table `shop`.`orders` add `x` int not null default 0", b"other", "orders"),
        ("ALTER ONLINE TABLE t MODIFY a INT, ADD COLUMN b INT DEFAULT 1", b"shop", "t"),
        ("ALTER TABLE t ADD KEY k (a), ADD COLUMN c INT", b"shop", "t"),
        ("ALTER TABLE t ADD (c INT, d INT)", b"shop", "t"),
        ("ALTER TABLE t ADD INDEX idx (a)", b"shop", None),
        ("ALTER TABLE t ADD UNIQUE (a)", b"shop", None),
        ("ALTER TABLE t ADD CONSTRAINT c CHECK (a > 0)", b"shop", None),
        ("ALTER TABLE t DROP COLUMN a", b"shop", None),
        ("ALTER TABLE other.t ADD COLUMN a INT", b"shop", None),
        ("ALTER TABLE t ADD COLUMN a INT", b"other", None),
        ("CREATE TABLE t (a INT)", b"shop", None),
    ],
)
def test_alter_table_add_column_names_the_table(query: str, schema: bytes, table: str | None) -> None:
    event = SimpleNamespace(query=query, schema=schema)
    assert _table_with_added_columns(event, "shop") == table
