"""Structured, quiet-by-default logging: one event per line, ``key=value`` fields."""

from __future__ import annotations

import logging
import sys


def configure(level: str = "INFO", stream: object = None) -> None:
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)  # type: ignore[arg-type]
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # kazoo logs every reconnect attempt at INFO; its state changes reach us through listeners.
    logging.getLogger("kazoo").setLevel(logging.WARNING)
