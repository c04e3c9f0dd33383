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

ALL = (UNSAFE_ACKS_ALL, DISABLE_LEADERLESS_SWEEP, DISABLE_EPOCH_FENCE, DISABLE_REASSIGNMENT)


def enabled(name: str) -> bool:
    return os.environ.get(name, "") == "1"
