"""How a stop ends: the bounds a broker's and a worker's stop keep, and the launcher's SIGKILL
past them, said."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.broker.broker import stop_bound_s
from sluice.ops import launcher
from sluice.ops.launcher import BrokerProcess, LocalCluster, WorkerProcess
from sluice.pipeline import worker


def test_the_documented_stop_bounds() -> None:
    """docs/guide/operating.md and docs/ARCHITECTURE.md quote these (the defaults: a 6 s session
    timeout)."""
    assert stop_bound_s(6.0) == 36.0
    assert stop_bound_s(6.0, controlled_shutdown_timeout_s=0.0) == 21.0
    guide = (Path(__file__).parents[2] / "docs" / "guide" / "operating.md").read_text()
    assert "36 s by default, 21 s with ZooKeeper already gone" in " ".join(guide.split())
    assert worker.stop_bound_s() == 43.0  # a worker's ZooKeeper session: ZkStore's 6 s


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


def test_cluster_down_stops_the_workers_at_once_and_names_one_it_had_to_kill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers: one stops on SIGTERM, one ignores it; both get SIGTERM at once and one
    deadline (the worker's stop bound), and only the one that ignored it is killed, and named."""
    stuck = ignoring_sigterm()
    stopping = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        workers = [
            WorkerProcess("worker-1", str(tmp_path / "worker-1.log"), pid=stuck.pid),
            WorkerProcess("worker-2", str(tmp_path / "worker-2.log"), pid=stopping.pid),
        ]
        LocalCluster(str(tmp_path), "127.0.0.1:1/sluice", 1, False, workers=workers).save()
        monkeypatch.setattr(launcher, "worker_stop_bound_s", lambda cluster: 0.5)
        killed, stopped = launcher.cluster_down(tmp_path)
        assert stuck.wait(5) == -signal.SIGKILL and stopping.wait(5) == -signal.SIGTERM
    finally:
        stuck.kill()
        stopping.kill()
    assert killed.startswith(f"worker worker-1 (pid {stuck.pid}, killed: still running"), killed
    assert workers[0].log_file in killed, killed
    assert stopped == f"worker worker-2 (pid {stopping.pid})"


def test_a_started_process_exit_status_is_left_for_the_launcher_to_read(tmp_path: Path) -> None:
    """A broker that exits at once on a taken port is told from any other failure by its exit
    status: no later Popen in this process (another thread's start) may reap it first."""
    import time

    from sluice.ops.processes import pid_alive, spawn_detached

    with open(tmp_path / "log", "w") as log:
        pid = spawn_detached([sys.executable, "-c", "import sys; sys.exit(7)"], log, 0o077)
    deadline = time.monotonic() + 30
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not pid_alive(pid)  # exited, not reaped yet
    subprocess.run([sys.executable, "-c", "pass"], check=True)  # a later Popen reaps subprocess's orphans
    assert launcher._exit_status(pid) == 7


def test_a_stopped_process_is_reaped_not_left_a_zombie(tmp_path: Path) -> None:
    """Nothing else reaps a process `spawn_detached` started: the stop does, whether it ended
    on SIGTERM or had to be killed."""
    import os

    from sluice.ops.processes import spawn_detached

    with open(tmp_path / "log", "w") as log:
        gentle = spawn_detached([sys.executable, "-c", "import time; time.sleep(60)"], log, 0o077)
        stubborn = spawn_detached(
            [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
             "time.sleep(60)"], log, 0o077,
        )  # fmt: skip
    import time

    time.sleep(0.5)  # the second has its handler
    outcome = launcher.stop_processes([gentle, stubborn], timeout_s=2)
    assert outcome[gentle].was_running and not outcome[gentle].killed
    assert outcome[stubborn].killed
    for pid in (gentle, stubborn):
        with pytest.raises(ProcessLookupError):  # gone from the process table: reaped
            os.kill(pid, 0)


#: A process whose first thread ends (it reads as a zombie) a second before its last thread
#: exits 98: exit_group under load, seen at a broker's start-up exit in a suite run.
FIRST_THREAD_ENDS_FIRST = (
    "import ctypes, os, threading, time\n"
    "threading.Thread(target=lambda: (time.sleep(1.0), os._exit(98))).start()\n"
    "ctypes.CDLL(None).pthread_exit(None)\n"
)


def test_the_exit_status_is_read_once_the_last_thread_of_an_exiting_process_ends(tmp_path: Path) -> None:
    """pid_alive says gone when the first thread is a zombie; the status can be collected only
    when every thread has ended. The launcher waits for it: a broker's taken port is then told
    from any other failure (its restart picks new ports only on ADDRESS_IN_USE_EXIT)."""
    import time

    from sluice.ops.processes import pid_alive, spawn_detached

    with open(tmp_path / "log", "w") as log:
        pid = spawn_detached([sys.executable, "-c", FIRST_THREAD_ENDS_FIRST], log, 0o077)
    deadline = time.monotonic() + 30
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not pid_alive(pid)
    assert launcher._exit_status(pid) == 98, (tmp_path / "log").read_text()
