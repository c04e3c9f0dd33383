"""How long to wait before starting a failed thing again: a worker's task (sync.worker), or an
apply query in `sluice apply` and the demo (pipeline.restarting). One rule for all of them.

`attempts` counts the failures in a row: each failure adds one, and only progress (an apply
query committing a batch to its target) starts the count again. A start that succeeds is not
progress: a query whose Spark Python worker cannot connect back starts, fails a few seconds
later, and would otherwise be retried every second for ever (issue 32: `attempts=1` each
time, on a machine the retries themselves kept loaded). The delay before attempt n+1 is
RETRY_MIN_S * 2**(n-1), at most RETRY_MAX_S, with a little jitter.

A thing that never commits (an idle task's query that fails now and then) keeps its count, so
its delay stays near the cap until it commits a batch; the cap bounds what that costs.

Plain data and arithmetic, no I/O.
"""

from __future__ import annotations

import random

RETRY_MIN_S = 1.0
RETRY_MAX_S = 60.0


def retry_delay_s(attempts: int, rng: random.Random) -> float:
    """Doubling from RETRY_MIN_S up to RETRY_MAX_S, with a little jitter (x0.8 to x1.0) so that
    workers do not all retry a shared target at the same moment."""
    base = min(RETRY_MAX_S, RETRY_MIN_S * 2 ** max(0, attempts - 1))
    return float(base * rng.uniform(0.8, 1.0))


class Backoff:
    """The failures in a row of one thing started again after each (see the module docstring)."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self.attempts = 0
        self._rng = rng or random.Random()

    def failed(self) -> float:
        """Count one more failure; the delay before the next start, in seconds."""
        self.attempts += 1
        delay = retry_delay_s(self.attempts, self._rng)
        assert 0 < delay <= RETRY_MAX_S, delay
        return delay

    def progressed(self) -> None:
        """It made progress (committed a batch): the next failure is the first of a new run."""
        self.attempts = 0
