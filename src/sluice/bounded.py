"""Waiting at most a bound for work that may never end.

Some calls a stopping process makes can wait without end, and where no signal or timeout reaches
them: librdkafka's close of a consumer whose broker was just killed (inside C), kazoo's stop of a
session whose connection thread is in a connection attempt to a server that does not answer,
a Spark query's stop waiting for a micro-batch, a LeaveGroup to a coordinator that does not
answer. Such work runs on a daemon thread of its own; the caller waits for it at most a bound and
goes on, and the thread never keeps the process from exiting.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


def in_background(work: Callable[[], object], *, name: str) -> threading.Event:
    """Start ``work`` on a daemon thread named ``name``; the event is set once it has ended.
    ``work`` should not raise: it logs its own failure (a raised exception would be printed with
    its traceback by the thread, and still sets the event)."""
    done = threading.Event()

    def run() -> None:
        try:
            work()
        finally:
            done.set()

    threading.Thread(target=run, name=name, daemon=True).start()
    return done


def run_within(work: Callable[[], object], timeout_s: float | None, *, name: str) -> bool:
    """Run ``work`` (see :func:`in_background`) and wait for it at most ``timeout_s`` (None: as
    long as it takes). Returns whether it ended; work that did not is left running on its
    thread."""
    return in_background(work, name=name).wait(timeout_s)
