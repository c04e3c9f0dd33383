"""Test-only switches that turn one guarantee off, so the drills' tests can show each drill
is able to fail (a drill that passes whatever the code does proves nothing).

Each switch is an environment variable read by the broker processes at start. Never set them
outside tests: with any of them on, Sluice loses or strands data on purpose.
"""

from __future__ import annotations

import os

#: acks=all is acknowledged as soon as the leader appended (as acks=1 is): incident A's loss.
UNSAFE_ACKS_ALL = "SLUICE_TEST_UNSAFE_ACKS_ALL"
#: The controller elects only for partitions whose leader it just saw die, never for partitions
#: already leaderless (Kafka's behaviour that left incident B's partition without a leader).
DISABLE_LEADERLESS_SWEEP = "SLUICE_TEST_DISABLE_LEADERLESS_SWEEP"
#: Controller writes skip the /controller_epoch version check (I4 off).
DISABLE_EPOCH_FENCE = "SLUICE_TEST_DISABLE_EPOCH_FENCE"
#: The controller ignores /admin/reassign_partitions, so a drain never moves anything.
DISABLE_REASSIGNMENT = "SLUICE_TEST_DISABLE_REASSIGNMENT"
#: Targets accept a commit under any fencing epoch (the stale-epoch check is off).
DISABLE_TARGET_FENCE = "SLUICE_TEST_DISABLE_TARGET_FENCE"
#: Targets write rows without comparing source positions (the version guard is off).
DISABLE_VERSION_GUARD = "SLUICE_TEST_DISABLE_VERSION_GUARD"
#: Every row change of a binlog rows event gets the event's end position, as before each change
#: had its own: changes of one row in one statement then tie, and the target keeps an older image.
SHARED_EVENT_POSITION = "SLUICE_TEST_SHARED_EVENT_POSITION"
#: "before-commit:N" or "after-commit:N": the process kills itself with SIGKILL right before or
#: right after its N-th target commit (counting from 1), to test restarts at those points.
CRASH_AT = "SLUICE_TEST_CRASH_AT"
#: A directory: at a pause point named by a file in it, the process deletes the file and stops
#: itself with SIGSTOP (a GC pause landing exactly there), until someone sends SIGCONT. Drills
#: arm a point by creating the file. Points: "capture-produce" (a captured change is about to be
#: produced to the log), "apply-commit" (a micro-batch was read and is about to be committed to
#: the target).
PAUSE_DIR = "SLUICE_TEST_PAUSE_DIR"
PAUSE_POINTS = ("capture-produce", "apply-commit")

ALL = (
    UNSAFE_ACKS_ALL,
    DISABLE_LEADERLESS_SWEEP,
    DISABLE_EPOCH_FENCE,
    DISABLE_REASSIGNMENT,
    DISABLE_TARGET_FENCE,
    DISABLE_VERSION_GUARD,
    SHARED_EVENT_POSITION,
    CRASH_AT,
    PAUSE_DIR,
)


def enabled(name: str) -> bool:
    return os.environ.get(name, "") == "1"


_commits = 0


def crash_point(where: str, *, count: bool = False) -> None:
    """Die with SIGKILL here if CRASH_AT names this point and commit number.

    `count` advances the commit counter (call it once per commit, at "before-commit")."""
    global _commits
    if count:
        _commits += 1
    spec = os.environ.get(CRASH_AT, "")
    if not spec:
        return
    point, _, number = spec.partition(":")
    if point == where and number.isdigit() and int(number) == _commits:
        _signal_this_thread("SIGKILL")


def pause_point(where: str) -> None:
    """Stop this process with SIGSTOP here if PAUSE_DIR holds an armed file for this point."""
    directory = os.environ.get(PAUSE_DIR)
    if not directory:
        return
    assert where in PAUSE_POINTS, where
    armed = os.path.join(directory, where)
    try:
        os.unlink(armed)  # one pause per arming; unlink is atomic, so two threads never both stop
    except FileNotFoundError:
        return
    _signal_this_thread("SIGSTOP")


def _signal_this_thread(name: str) -> None:
    """Send the signal to the calling thread itself (tgkill), not to the process: the kernel
    then acts on it as this thread leaves the call, so the thread is stopped or killed exactly
    here. Sent to the process, it may be taken by another thread while this one runs on for
    milliseconds (into the transaction it was meant to stop in front of)."""
    import signal
    import threading

    signal.pthread_kill(threading.get_ident(), getattr(signal, name))
