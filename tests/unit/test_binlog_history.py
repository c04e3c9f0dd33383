"""Binlog histories (sync/sources/binlog_history.py) and the recovery that keeps positions going
up across them (mysql.recover_history): pure parts, without a server."""

from __future__ import annotations

from typing import Any

import pytest

from sluice.sync.sources import binlog_history as bh
from sluice.sync.sources import mysql, mysql_base


def test_gtid_states_compare_whatever_their_order() -> None:
    assert bh.parse_state("1-2-9,0-1-5") == bh.parse_state("0-1-5,1-2-9")
    assert bh.parse_state("0-1-5") != bh.parse_state("0-1-6")
    assert bh.parse_state("") == {} and bh.parse_state(None) == {}
    mysql_state = bh.parse_state("3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5")
    assert bh.state_text(mysql_state) == "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5"


def test_a_position_is_in_the_history_only_where_the_servers_state_is_the_recorded_one() -> None:
    assert bh.same_history("0-1-5", "0-1-5")
    assert bh.same_history("0-1-5,1-1-2", "1-1-2,0-1-5")
    assert not bh.same_history("0-1-5", "0-1-1")  # RESET MASTER: the same file, another history
    assert not bh.same_history("0-1-5", None)  # the file is gone, or no event starts there
    assert not bh.same_history("", None)
    assert bh.same_history("", "0-1-3")  # nothing recorded: the file being there decides


def test_the_trail_holds_the_state_at_each_boundary_and_forgets_what_is_behind_the_resume() -> None:
    trail = bh.GtidTrail()
    trail.start("f.1:4", "0-1-5")
    trail.note_gtid("0-1-6")
    trail.commit("f.1:100")
    trail.note_gtid("0-1-7")  # a transaction whose end is not seen (another schema's DDL)...
    trail.note_gtid("1-2-1")  # ...is whole once the next begins
    trail.commit("f.1:300")
    assert [trail.at(p) for p in ("f.1:4", "f.1:100", "f.1:300")] == ["0-1-5", "0-1-6", "0-1-7,1-2-1"]
    trail.forget_before("f.1:100")
    assert trail.at("f.1:4") == "" and trail.at("f.1:100") == "0-1-6"
    trail.forget_before("f.9:9")  # not a recorded position: nothing is dropped
    assert trail.at("f.1:100") == "0-1-6"


def test_a_new_history_starts_above_every_position_emitted() -> None:
    high = mysql_base.encode_position(7, 123_456)
    assert bh.next_base(high) + mysql_base.encode_position(1, 4) > high


def envelopes(*sources: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"op": "c", "source": s} for s in sources]


def test_recovery_resumes_in_the_newest_history_whatever_its_positions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Partition 0's last record is from the history before RESET MASTER (a high file number),
    partition 1's from the new one (base above it, file 1): the new one is where to resume."""
    old = {
        "resume": "mysql-bin.000007:900",
        "resume_gtid": "0-1-500",
        "pos": 7 << 40 | 950,
        "high": 7 << 40 | 990,
    }
    new = {"resume": "mysql-bin.000001:500", "resume_gtid": "0-1-3", "pos": (7 << 40 | 991) + (1 << 40 | 520),
           "base": (7 << 40) + 991, "high": (7 << 40 | 991) + (1 << 40 | 520)}  # fmt: skip
    monkeypatch.setattr(mysql, "last_envelopes", lambda *a, **k: envelopes(old, new))
    got = mysql.recover_history("b", ["t"])
    assert (got.position, got.base, got.gtid, got.high) == (
        "mysql-bin.000001:500",
        new["base"],
        "0-1-3",
        new["high"],
    )
    # records written before source.high existed: their own positions count
    monkeypatch.setattr(mysql, "last_envelopes", lambda *a, **k: envelopes({"resume": "f.2:9", "pos": 77}))
    assert mysql.recover_history("b", ["t"]) == mysql.Recovered("f.2:9", 0, 77, "")


def test_a_task_raises_the_history_alarm_saying_what_to_do_when_changes_may_be_missing() -> None:
    from types import SimpleNamespace

    from sluice.sync.execution import TaskExecution

    raised: list[tuple[str, str, dict[str, Any]]] = []
    fake = SimpleNamespace(
        task_id="shop", execution="e1",
        store=SimpleNamespace(raise_alarm=lambda *a: raised.append(a)),
    )  # fmt: skip
    info = {"left_at": "mysql-bin.000007:900", "went_on_at": "mysql-bin.000001:4", "gtid": "0-1-500",
            "continuous": False, "base": 9, "old_base": 0, "detail": "not in the binlog"}  # fmt: skip
    TaskExecution._on_history_change(fake, info)  # type: ignore[arg-type]
    TaskExecution._on_history_change(fake, {**info, "continuous": True})  # type: ignore[arg-type]
    assert [(task, kind) for task, kind, _ in raised] == [("shop", bh.HISTORY_CHANGED)] * 2
    assert "sluice task verify shop --repair" in raised[0][2]["detail"]
    assert "no change was missed" in raised[1][2]["detail"] and raised[1][2]["execution"] == "e1"
