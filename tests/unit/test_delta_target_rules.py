"""The Delta target's pure rules: its URLs and the literals verify's key ranges become (the
statements themselves run in tests/integration/test_delta_target.py)."""

from __future__ import annotations

import datetime as dt
import decimal

import pytest

from sluice.sync.targets.base import BadTargetUrlError
from sluice.sync.targets.delta import _literal, delta_root


def test_a_delta_url_names_a_local_directory_or_any_hadoop_uri() -> None:
    assert delta_root("delta:///var/lib/lake/") == "file:///var/lib/lake"
    assert delta_root("delta:s3a://bucket/lake") == "s3a://bucket/lake"
    assert delta_root("delta:hdfs://nn:8020/lake") == "hdfs://nn:8020/lake"
    for bad in ("delta:lake", "delta://lake", "postgresql://x/y", "delta:/relative"):
        with pytest.raises(BadTargetUrlError, match="delta:///abs/path"):
            delta_root(bad)


@pytest.mark.parametrize(
    ("value", "literal"),
    [
        (None, "NULL"),
        (True, "TRUE"),
        (7, "7"),
        (-(2**63), str(-(2**63))),
        (2**64 - 1, f"{2**64 - 1}BD"),  # a BIGINT UNSIGNED key beyond BIGINT
        (decimal.Decimal("-1.50"), "-1.50BD"),
        (0.1, "CAST('0.1' AS DOUBLE)"),
        (b"\x00'\xff", "X'0027ff'"),
        ("it's \\ here", "'it\\'s \\\\ here'"),
        (dt.date(2024, 2, 29), "DATE '2024-02-29'"),
        (dt.datetime(2024, 2, 29, 1, 2, 3, 4), "TIMESTAMP '2024-02-29 01:02:03.000004'"),
    ],
)
def test_a_key_value_becomes_the_spark_sql_literal_of_its_type(value: object, literal: str) -> None:
    assert _literal(value) == literal


def test_the_zombie_drills_audit_finds_an_appended_offset_an_earlier_commit_went_past() -> None:
    from sluice.chaos.zombie import appended_out_of_order

    fine = [(1, "t", 0, 5, 1), (1, "t", 1, 3, 1), (2, "t", 0, 9, 2), (3, "t", 1, 4, 1)]
    # one commit may hold rows of two epochs (a compaction leaves each partition's newest)
    assert appended_out_of_order([*fine[:2], (2, "t", 1, 3, 2), (2, "t", 0, 9, 1)]) == []
    assert appended_out_of_order(fine[:3]) == []
    assert appended_out_of_order(fine) == [(3, "t", 1, 4, 1)]  # epoch 1 after epoch 2's commit
    assert appended_out_of_order([(1, "t", 0, 5, 1), (2, "t", 0, 4, 1)]) == [(2, "t", 0, 4, 1)]
