"""Structured, quiet-by-default logging: one event per line, ``key=value`` fields."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable


class Redactor(logging.Filter):
    """Takes secrets out of every line a handler writes: the passwords registered with `add`
    (a worker adds each task's before running it) and the password of any URL a message quotes,
    in the message and in an exception's traceback alike."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()

    def add(self, secrets: Iterable[str]) -> None:
        self.secrets.update(s for s in secrets if s)

    def filter(self, record: logging.LogRecord) -> bool:
        from sluice.sync.tasks import scrub

        message = record.getMessage()
        clean = scrub(message, self.secrets)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text, self.secrets)
        if record.stack_info:
            record.stack_info = scrub(record.stack_info, self.secrets)
        return True


#: the process's redactor, on the handler `configure` installs
REDACTOR = Redactor()


def configure(level: str = "INFO", stream: object = None) -> None:
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)  # type: ignore[arg-type]
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    handler.addFilter(REDACTOR)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # kazoo logs every reconnect attempt at INFO; its state changes reach us through listeners.
    logging.getLogger("kazoo").setLevel(logging.WARNING)
