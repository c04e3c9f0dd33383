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
#: "before-commit:N" or "after-commit:N": the process kills itself with SIGKILL right before or
#: right after its N-th target commit (counting from 1), to test restarts at those points.
CRASH_AT = "SLUICE_TEST_CRASH_AT"

ALL = (
    UNSAFE_ACKS_ALL,
    DISABLE_LEADERLESS_SWEEP,
    DISABLE_EPOCH_FENCE,
    DISABLE_REASSIGNMENT,
    DISABLE_TARGET_FENCE,
    DISABLE_VERSION_GUARD,
    CRASH_AT,
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
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
