"""The MySQL/MariaDB target's staged batches (sync/targets/mysql_stage.py) against its driver path,
on a real MariaDB: a seeded randomized workload of typed changes (every statement kind, every
column type the target creates, edge values, truncates, replays of earlier batches) ends with
the same rows either way, and the staged batches are merged in SQL, not read back into the
driver. The driver path itself is checked value by value against MariaDB's own answer in
test_type_matrix.py (which runs the staged path too).
"""

from __future__ import annotations

import base64
import random
import zlib
from typing import Any

import pytest

from sluice.sync.envelope import ChangeEvent, key_text
from sluice.sync.targets import open_target
from sluice.sync.targets.base import Refusal
from tests.support.changes import records
from tests.support.staging import apply_staged, batches_of, staged

TEXTS = ["plain", "tab\there", "line\nbreak", "back\\slash", "nul\x00inside", "é ü 漢 😀", "", "\\N", "'q\"",
         "trailing  ", "null", "true", "2024-01-02T03:04:05Z"]  # fmt: skip

#: Column -> (source type, values the envelope holds for it; None is added).
ACCT: dict[str, tuple[str, list[Any]]] = {
    "c_int": ("int(11)", [0, -1, 2147483647, -2147483648, 42]),
    "c_ubig": ("bigint(20) unsigned", [0, 18446744073709551615, 9223372036854775808, 7]),
    "c_dec": ("decimal(20,4)", ["0.0000", "-1234.5000", "9999999999999999.9999", "0.0001"]),
    "c_dbl": ("double", [0.0, -0.0, 1.7976931348623157e308, 5e-324, 0.1, -2.5e-10, 1e20, 3]),
    "c_flt": ("float", [3.4028235e38, -3.4028235e38, 1.1, 1e-45, 0.0, 16777217, -0.5]),
    "c_bit": ("bit(5)", ["00000", "00101", "11111", "10000"]),
    "c_flag": ("tinyint(1)", [0, 1, True, False]),
    "c_date": ("date", ["2024-02-29", "1000-01-01", "9999-12-31"]),
    "c_dt": ("datetime(6)", ["2024-01-02T03:04:05.123456", "1000-01-01T00:00:00.000000",
                             "9999-12-31T23:59:59.999999"]),
    "c_ts": ("timestamp(3)", ["2024-01-02T03:04:05.500Z", "1970-01-01T00:00:01.000Z",
                              "2038-01-19T03:14:07.999Z"]),
    "c_time": ("time(6)", ["-838:59:59.000000", "838:59:59.000000", "00:00:00.000001", "12:30:00.500000"]),
    "c_year": ("year(4)", [0, 1901, 2155, 2024]),
    "c_vc": ("varchar(64)", TEXTS),
    "c_text": ("longtext", [*TEXTS, "x" * 5000]),
    "c_enum": ("enum('x','y','a,b')", ["x", "y", "a,b", ""]),
    "c_set": ("set('a','b','c')", ["a", "a,c", "", "a,b,c"]),
    "c_json": ("json", ['{"a": [1, 2.50, null]}', "[]", '"s"', "3"]),
    "c_blob": ("blob", [b"", b"\x00\xff", bytes(range(256))]),
}  # fmt: skip
INV = {"qty": ("int(11)", [0, 10_000]), "note": ("varchar(64)", TEXTS)}
BLOB = {"data": ("longblob", [b"", b"\x00", b"\xde\xad\xbe\xef" * 64])}
TYPES = {
    "acct": {"id": "bigint(20)", **{c: t for c, (t, _) in ACCT.items()}},
    "inv": {"sku": "varchar(16)", "wh": "int(11)", **{c: t for c, (t, _) in INV.items()}},
    "blob": {"id": "varbinary(16)", **{c: t for c, (t, _) in BLOB.items()}},
}
COLUMNS = {"acct": ACCT, "inv": INV, "blob": BLOB}


def image(rng: random.Random, table: str, key: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    after = dict(key)
    binary = ["id"] if table == "blob" else []
    for column, (_, values) in COLUMNS[table].items():
        v = None if rng.random() < 0.1 else rng.choice(values)
        if isinstance(v, bytes):
            v = base64.b64encode(v).decode()
            binary.append(column)
        after[column] = v
    return after, tuple(binary)


def typed_log(seed: int, count: int) -> list[list[ChangeEvent]]:
    """Changes of three typed tables (inserts, updates, deletes, snapshot reads, truncates) in
    two partitions by key, as a capture produces them; positions grow with every change."""
    rng = random.Random(seed)
    parts: list[list[ChangeEvent]] = [[], []]
    keys = {
        "acct": [{"id": i} for i in range(1, 40)],
        "inv": [{"sku": f"s-{i % 7}", "wh": i % 3} for i in range(30)],
        "blob": [{"id": base64.b64encode(bytes([i, 0, 255])).decode()} for i in range(1, 10)],
    }
    live: dict[tuple[str, str], bool] = {}
    for pos in range(1, count + 1):
        table = rng.choice(["acct", "acct", "inv", "blob"])
        if rng.random() < 0.01:
            parts[rng.randrange(2)].append(
                ChangeEvent("t", table, {}, None, None, pos, 1_700_000_000_000 + pos)
            )
            for k in [k for k in live if k[0] == table]:
                del live[k]
            continue
        key = rng.choice(keys[table])
        there = live.get((table, key_text(key)), False)
        op = rng.choice(["u", "u", "d"]) if there else rng.choice(["c", "r"])
        after, binary = (None, ("id",) if table == "blob" else ()) if op == "d" else image(rng, table, key)
        ev = ChangeEvent(op, table, key, None, after, pos, 1_700_000_000_000 + pos, binary=binary,
                         types=TYPES[table])  # fmt: skip
        live[(table, key_text(key))] = op != "d"
        parts[zlib.crc32(key_text(key).encode()) % 2].append(ev)
    return parts


@pytest.mark.parametrize("seed", [1, 2])
def test_staged_typed_batches_end_equal_to_the_driver_path_and_merge_in_sql(mariadb: Any, seed: int) -> None:
    rng = random.Random(seed)
    batches = batches_of(typed_log(seed, 3_000), rng)
    urls = []
    for name in (f"mstaged_driver_{seed}", f"mstaged_exec_{seed}"):
        mariadb.execute(f"DROP DATABASE IF EXISTS {name}", f"CREATE DATABASE {name}")
        urls.append(f"mysql://root@127.0.0.1:{mariadb.port}/{name}")
    with open_target(urls[0]) as by_driver, open_target(urls[1]) as by_executors:
        e1, e2 = by_driver.claim("p"), by_executors.claim("p")
        replays = 0
        for i, batch in enumerate(batches):
            want = by_driver.apply("p", e1, batch)
            got = apply_staged(by_executors, "p", e2, batch)
            assert (got.records, got.skipped, got.offsets) == (want.records, want.skipped, want.offsets)
            assert (got.written, got.changes) == (want.written, want.changes), i
            if i == len(batches) // 2 or rng.random() < 0.2:  # run again after a crash: no change
                again = apply_staged(by_executors, "p", e2, batches[rng.randint(0, i)])
                assert again.skipped == again.records and again.written == 0
                replays += 1
        assert replays > 0
        for table in ("acct", "inv", "blob"):
            rows = by_executors.read_rows(table)
            assert rows == by_driver.read_rows(table), table
            assert rows, table
        merges = by_executors.merges  # type: ignore[attr-defined]
    # every batch's tables merge in SQL, a table's first too (made from the driver first), but
    # ENUM's '' row by row from the driver
    assert set(merges) <= {"sql", "sql-rows", "driver-rows"}, merges
    assert merges["sql-rows"] > 5 * merges["driver-rows"] > 0, merges
    assert staged(urls[1]) == {next(iter(staged(urls[1]))): 0}


def test_a_refused_staged_change_goes_to_the_sink_and_the_rest_merges_in_sql(mysql_url: str) -> None:
    def ev(op: str, pos: int, key: int, v: Any) -> ChangeEvent:
        return ChangeEvent(op, "acct", {"id": key}, None, {"id": key, "v": v}, pos, 1_700_000_000_000 + pos,
                           types={"id": "bigint(20)", "v": "tinyint(4)"})  # fmt: skip

    with open_target(mysql_url) as target:
        epoch = target.claim("p")
        apply_staged(target, "p", epoch, records([ev("c", 1, 1, 1)]))  # the table made, the row in SQL
        refused: list[Refusal] = []
        result = apply_staged(
            target, "p", epoch, records([ev("c", 2, 2, 2), ev("c", 3, 3, 300)], start=1), refused.extend
        )
        assert [r.change["key"] for r in refused] == ['{"id":3}']
        rows = target.read_rows("acct")
        assert (result.refused, rows['{"id":2}']["v"], '{"id":3}' in rows) == (1, 2, False)
        assert target.applied_offsets("p") == {("t", 0): 3}
        # without a sink the batch fails whole: nothing of it lands
        with pytest.raises(Exception, match="Out of range"):
            apply_staged(target, "p", epoch, records([ev("u", 4, 2, 5), ev("c", 5, 4, 999)], start=3))
        assert target.read_rows("acct")['{"id":2}']["v"] == 2
        assert target.applied_offsets("p") == {("t", 0): 3}
        merges = dict(target.merges)  # type: ignore[attr-defined]
        # the failed batch's table too was refused in SQL and applied again from the driver, whose
        # error names the change
        assert merges.pop("sql-rows") and merges == {"sql": 3, "refused": 2}


def test_a_staged_batch_of_only_a_truncate_merges_in_sql(mysql_url: str) -> None:
    def ev(op: str, pos: int, key: int) -> ChangeEvent:
        after = None if op in ("d", "t") else {"id": key, "v": f"v{pos}"}
        types = {"id": "bigint(20)", "v": "varchar(8)"}
        key_ = {} if op == "t" else {"id": key}
        return ChangeEvent(op, "acct", key_, None, after, pos, 1_700_000_000_000 + pos, types=types)

    with open_target(mysql_url) as target:
        epoch = target.claim("p")
        apply_staged(target, "p", epoch, records([ev("c", 1, 1), ev("c", 2, 2)]))
        result = apply_staged(target, "p", epoch, records([ev("t", 3, 0)], start=2))
        assert (result.changes, result.written, target.read_rows("acct")) == (1, 2, {})
        # an older change replayed after it stays out (the table's truncate watermark)
        apply_staged(target, "p", epoch, records([ev("u", 2, 2)], start=3))
        assert target.read_rows("acct") == {}
        assert dict(target.merges)["sql"] == 3  # type: ignore[attr-defined]


def test_a_fraction_for_an_integer_column_is_refused_on_both_paths_never_rounded(mariadb: Any) -> None:
    """A number with a fraction sent to an INT column (as a JSON float or text) is refused, not
    rounded into the row as MariaDB rounds it even in strict mode (1.5 to 2, '0.25' to 0, from a
    literal or text alike); a whole float is the integer. The staged path sends such a table
    through the driver (`mysql_stage.exception_sql`), so both paths end alike; without a sink
    the batch fails on both."""
    values = [1.5, 2.0, -0.5, 7, "8", 1e3, 2.5e9, "0.25", "-3"]

    def ev(pos: int, v: Any) -> ChangeEvent:
        return ChangeEvent("c", "acct", {"id": pos}, None, {"id": pos, "v": v}, pos, 1_700_000_000_000 + pos,
                           types={"id": "bigint(20)", "v": "int(11)"})  # fmt: skip

    outcomes = []
    for name, staged_path in (("mfrac_driver", False), ("mfrac_exec", True)):
        mariadb.execute(f"DROP DATABASE IF EXISTS {name}", f"CREATE DATABASE {name}")
        with open_target(f"mysql://root@127.0.0.1:{mariadb.port}/{name}") as target:
            epoch = target.claim("p")
            refused: list[Refusal] = []
            # the table made by a first batch, so the second merges its own way (SQL when staged)
            second = records([ev(i + 1, v) for i, v in enumerate(values)], start=1)
            for batch in (records([ev(100, 0)]), second):
                if staged_path:
                    apply_staged(target, "p", epoch, batch, refused.extend)
                else:
                    target.apply("p", epoch, batch, on_refused=refused.extend)
            rows = {k: r["v"] for k, r in target.read_rows("acct").items()}
            outcomes.append((sorted(r.change["key"] for r in refused), rows))
            third = records([ev(50, 0.25)], start=1 + len(values))
            with pytest.raises(Exception, match="has a fraction"):
                if staged_path:
                    apply_staged(target, "p", epoch, third)
                else:
                    target.apply("p", epoch, third)
    assert outcomes[0] == outcomes[1]
    refused_keys, rows = outcomes[0]
    assert refused_keys == ['{"id":1}', '{"id":3}', '{"id":7}', '{"id":8}'], outcomes  # 2.5e9: beyond INT
    assert {k: v for k, v in rows.items() if k != '{"id":100}'} == {
        '{"id":2}': 2, '{"id":4}': 7, '{"id":5}': 8, '{"id":6}': 1000, '{"id":9}': -3
    }, rows  # fmt: skip
