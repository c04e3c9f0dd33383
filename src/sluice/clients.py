"""Closing Kafka clients within a bound.

librdkafka's close leaves the group, commits and destroys the handle, waiting on brokers as it
goes; with a broker that was just killed it can wait without end (librdkafka issue 4519, and
confluent-kafka-python issue 1667). It waits inside C, where no Python signal or timeout reaches
it, so a worker stopping a task, the Spark source ending a batch or a test's clean-up would hang
with it. Every consumer Sluice opens is closed through `close_within`: the close runs on its own
daemon thread, and after `timeout_s` the caller goes on and says so in the log.
"""

from __future__ import annotations

import logging
from typing import Any

from sluice.bounded import run_within

log = logging.getLogger("sluice.clients")

#: librdkafka's own bound on a request to a broker that does not answer is socket.timeout.ms
#: (60 s); a close that takes longer than that is not coming back.
DEFAULT_CLOSE_TIMEOUT_S = 30.0


def close_within(client: Any, timeout_s: float = DEFAULT_CLOSE_TIMEOUT_S, *, what: str = "consumer") -> bool:
    """Closes `client` (anything with a `close()`), waiting at most `timeout_s`. Returns whether
    the close finished; one that did not is left to finish on its thread."""

    def close() -> None:
        try:
            client.close()
        except Exception as exc:  # a close that fails has still released what it could
            log.warning("event=client_close_failed what=%s error=%r", what, exc)

    if run_within(close, timeout_s, name=f"close-{what}"):
        return True
    log.warning(
        "event=client_close_timed_out what=%s timeout_s=%.0f: the %s is left closing in the background "
        "(librdkafka waits on a broker that does not answer)",
        what,
        timeout_s,
        what,
    )
    return False
