"""How a stop ends: the bound a broker's stop keeps, and the launcher's SIGKILL past it, said."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.broker.broker import stop_bound_s
from sluice.ops import launcher
from sluice.ops.launcher import BrokerProcess, LocalCluster


def test_the_documented_stop_bounds() -> None:
    """docs/guide/operating.md and docs/ARCHITECTURE.md quote these (the defaults: a 6 s session
    timeout)."""
    assert stop_bound_s(6.0) == 36.0
    assert stop_bound_s(6.0, controlled_shutdown_timeout_s=0.0) == 21.0
    guide = (Path(__file__).parents[2] / "docs" / "guide" / "operating.md").read_text()
    assert "36 s by default, 21 s with ZooKeeper already gone" in " ".join(guide.split())


def ignoring_sigterm() -> subprocess.Popen[str]:
    """A process that ignores SIGTERM (a hung stop), returned once it ignores it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
         "print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def test_stop_process_kills_at_the_timeout_and_says_it_did() -> None:
    proc = ignoring_sigterm()
    try:
        assert launcher.stop_process(proc.pid, timeout_s=0.3) == launcher.Stopped(True, killed=True)
        assert proc.wait(5) == -signal.SIGKILL
    finally:
        proc.kill()
    assert launcher.stop_process(proc.pid) == launcher.Stopped(False)


def test_cluster_down_names_a_broker_it_had_to_kill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc = ignoring_sigterm()
    try:
        log_file = str(tmp_path / "broker-1.log")
        broker = BrokerProcess(1, "127.0.0.1", 1, str(tmp_path / "broker-1"), log_file, pid=proc.pid)
        LocalCluster(str(tmp_path), "127.0.0.1:1/sluice", 1, False, [broker]).save()
        monkeypatch.setattr(launcher, "broker_stop_bound_s", lambda cluster: 0.3)
        (stopped,) = launcher.cluster_down(tmp_path)
        assert proc.wait(5) == -signal.SIGKILL
    finally:
        proc.kill()
    assert stopped.startswith(f"broker 1 (pid {proc.pid}, killed: still running"), stopped
    assert log_file in stopped, stopped
