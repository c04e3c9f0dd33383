"""Test-only switches take effect only when a test harness armed them (test_switches.armed): a
bare variable, or an environment copied out of a test run, turns nothing off and says so."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sluice import test_switches
from sluice.sync.targets import StaleEpochError, open_target
from sluice.test_switches import OFF, SWITCHES_FILE, SWITCHES_TOKEN, Switches, armed, load
from tests.support.changes import event, records


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_bare_variable_turns_nothing_off_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = {name: "1" for name in test_switches.BARE_VARIABLES}
    env |= {"SLUICE_TEST_CRASH_AT": "before-commit:1", "SLUICE_TEST_PAUSE_DIR": str(tmp_path)}
    with caplog.at_level(logging.WARNING):
        assert load(env) == OFF
    said = warnings(caplog)
    for name in test_switches.BARE_VARIABLES:
        assert any(
            f"event=test_switch_ignored variable={name} " in w and "guarantees=all_on" in w for w in said
        )
    assert not any("event=test_switch_on" in w for w in said)


def test_a_target_keeps_its_guards_whatever_bare_variables_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_TEST_DISABLE_VERSION_GUARD", "1")
    monkeypatch.setenv("SLUICE_TEST_DISABLE_TARGET_FENCE", "1")
    with open_target(f"sqlite:///{tmp_path / 'target.db'}") as target:
        e = target.claim("p")
        target.apply("p", e, records([event("c", 1, v="S1"), event("u", 3, v="S3")]))
        target.apply("p", e, records([event("u", 2, v="S2")], start=2))
        assert target.read_rows("acct")['{"id":1}']["v"] == "S3"
        target.claim("p")
        with pytest.raises(StaleEpochError):
            target.apply("p", e, records([event("u", 9, v="zombie")], start=3))


def test_an_armed_switch_is_honoured_and_named_at_start(caplog: pytest.LogCaptureFixture) -> None:
    switches = Switches(unsafe_acks_all=True, crash_at="after-commit:2")
    with armed(switches) as env, caplog.at_level(logging.WARNING):
        assert load(env) == switches
    said = warnings(caplog)
    assert any(
        "event=test_switch_on name=unsafe_acks_all value=True" in w and 'guarantee="I1: acks=all' in w
        for w in said
    ), said
    assert any("event=test_switch_on name=crash_at value=after-commit:2" in w for w in said), said
    assert len([w for w in said if "event=test_switch_on" in w]) == 2


def test_a_child_process_the_harness_starts_honours_them_and_a_bare_variable_does_not() -> None:
    def child_switches(env: dict[str, str]) -> str:
        code = "from sluice import test_switches; print(test_switches.for_process().on())"
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip() + done.stderr

    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_TEST_SWITCHES")}
    with armed(Switches(disable_target_fence=True)) as env:
        out = child_switches({**clean, **env})
    assert out.startswith("{'disable_target_fence': True}") and "event=test_switch_on" in out, out
    out = child_switches({**clean, "SLUICE_TEST_DISABLE_TARGET_FENCE": "1"})
    assert out.startswith("{}") and "event=test_switch_ignored" in out, out


def test_an_environment_copied_after_the_run_arms_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with armed(Switches(disable_epoch_fence=True)) as env:
        pass
    with caplog.at_level(logging.WARNING):
        assert load(env) == OFF
    said = warnings(caplog)
    over = "the run that armed it is over"
    assert any("event=test_switches_ignored" in w and over in w for w in said), said


def write_switches(path: Path, token: str, started_delta: int = 0, mode: int = 0o600) -> None:
    """A switches file as `armed` writes one, naming this process as its harness."""
    started = test_switches._process_start(os.getpid())
    assert started is not None
    doc = {
        "token": token,
        "harness": {"pid": os.getpid(), "started": started + started_delta},
        "switches": {"disable_version_guard": True},
    }
    path.write_text(json.dumps(doc))
    path.chmod(mode)


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("another run's token", "not this run's"),
        ("no token in the environment", "set together"),
        ("a harness that ended (its pid reused)", "no longer running"),
        ("a file others may write", "writable by others"),
        ("a directory others may write", "writable by others"),
        ("a link to a switches file", "is not a file"),
        ("not a switches file", "unreadable switches file"),
    ],
)
def test_a_copied_variable_naming_a_foreign_file_arms_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str, reason: str
) -> None:
    directory = tmp_path / "switches"
    directory.mkdir(mode=0o700)
    path = directory / "switches.json"
    env = {SWITCHES_FILE: str(path), SWITCHES_TOKEN: "t" * 32}
    write_switches(path, env[SWITCHES_TOKEN])
    assert load(env) == Switches(disable_version_guard=True)  # as written, the file is honoured
    if case == "another run's token":
        write_switches(path, "u" * 32)
    elif case == "no token in the environment":
        del env[SWITCHES_TOKEN]
    elif case == "a harness that ended (its pid reused)":
        write_switches(path, env[SWITCHES_TOKEN], started_delta=1)
    elif case == "a file others may write":
        write_switches(path, env[SWITCHES_TOKEN], mode=0o622)
    elif case == "a directory others may write":
        directory.chmod(0o777)
    elif case == "a link to a switches file":
        (directory / "link.json").symlink_to(path)
        env[SWITCHES_FILE] = str(directory / "link.json")
    else:
        path.write_text("SLUICE_TEST_DISABLE_VERSION_GUARD=1\n")
    with caplog.at_level(logging.WARNING):
        assert load(env) == OFF
    assert any("event=test_switches_ignored" in w and reason in w for w in warnings(caplog)), warnings(caplog)


def test_a_switches_file_with_an_unknown_or_mistyped_switch_arms_nothing(tmp_path: Path) -> None:
    for switches in ({"disable_version_guard": 1}, {"disable_everything": True}, {"crash_at": "sometime"}):
        with armed(OFF) as env:
            path = Path(env[SWITCHES_FILE])
            doc = json.loads(path.read_text())
            path.write_text(json.dumps({**doc, "switches": switches}))
            with pytest.raises(test_switches.NotArmedError):
                test_switches.read_armed(env[SWITCHES_FILE], env[SWITCHES_TOKEN])
            assert load(env) == OFF


def test_armed_leaves_a_private_file_and_removes_it_at_the_end() -> None:
    with armed(Switches(shared_event_position=True)) as env:
        path = Path(env[SWITCHES_FILE])
        assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
        assert env[SWITCHES_TOKEN] in path.read_text()
    assert not path.parent.exists()
