"""No secret in any log line: the worker's log handler scrubs the passwords of the tasks it runs
and of any URL a message or a traceback quotes (issue 13, defect 9)."""

from __future__ import annotations

import io
import logging

from sluice.ops.logging_setup import Redactor
from sluice.sync.tasks import scrub


def test_scrub_takes_out_known_secrets_and_url_passwords() -> None:
    assert scrub("connect to postgresql://sync:hunter2@db:5432/t failed", []) == (
        "connect to postgresql://sync:***@db:5432/t failed"
    )
    assert scrub("mysql+pymysql://root:p@ss:w0rd@h/x and sqlite:///tmp/a.db", []) == (
        "mysql+pymysql://root:***@h/x and sqlite:///tmp/a.db"
    )
    assert (
        scrub("password is opensesame, again opensesame", ["opensesame", ""]) == "password is ***, again ***"
    )
    assert scrub("http://host:8080/path", []) == "http://host:8080/path"  # a port is not a password


def test_log_lines_and_tracebacks_are_scrubbed() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    redactor = Redactor()
    redactor.add(["opensesame"])
    handler.addFilter(redactor)
    log = logging.getLogger("test.redaction")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.error("task %s failed: %s", "t1", "cannot connect to postgresql://sync:hunter2@127.0.0.1:1/x")
        log.warning("source password %s", "opensesame")
        try:
            raise ConnectionError("refused by mysql://u:opensesame@h/db and pg://a:zzz@b/c")
        except ConnectionError:
            log.exception("capture failed")
    finally:
        log.removeHandler(handler)
    text = out.getvalue()
    assert "hunter2" not in text and "opensesame" not in text and "zzz" not in text, text
    assert "postgresql://sync:***@127.0.0.1:1/x" in text and "ConnectionError" in text
