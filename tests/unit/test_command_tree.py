"""The tests' helper for stopping a command they started (tests/support/processes.py) stops the
processes the command started too, those in sessions of their own included (the demo's brokers
and ZooKeeper run so), and leaves alone those the command stopped itself."""

from __future__ import annotations

import subprocess
import sys

from sluice.ops.processes import pid_alive
from tests.support.cluster import wait_until
from tests.support.processes import CommandTree, descendants, run_command

#: a command that starts a child in a session of its own, prints its pid, and ignores SIGTERM
STUBBORN = "import signal, subprocess, sys, time\n" + (
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "child = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(300)\n"
)


def test_a_command_that_does_not_stop_is_killed_with_what_it_started_in_other_sessions() -> None:
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    tree = CommandTree(proc)
    assert child in tree.seen and child in descendants(proc.pid)
    killed = tree.stop(grace_s=1, linger_s=1)
    assert {line.split()[0] for line in killed} == {str(proc.pid), str(child)}, killed
    wait_until(lambda: not pid_alive(child), 10, "the child to be gone")


def test_a_command_that_stops_what_it_started_leaves_nothing_to_kill() -> None:
    polite = (
        "import signal, subprocess, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
        "child = subprocess.Popen(['sleep', '300'])\ntry:\n    time.sleep(300)\nfinally:\n    child.kill()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", polite])
    wait_until(lambda: descendants(proc.pid), 10, "the command's child")
    assert CommandTree(proc).stop(grace_s=10) == []


def test_run_command_stops_the_command_and_its_processes_at_its_timeout() -> None:
    try:
        run_command([sys.executable, "-c", STUBBORN], 2, grace_s=1)
    except subprocess.TimeoutExpired as timed_out:
        child = int(str(timed_out.output).split()[0])
    else:
        raise AssertionError("the command ended before its timeout")
    wait_until(lambda: not pid_alive(child), 10, "the command's child to be gone")
