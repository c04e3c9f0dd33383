"""Webhook delivery against a local HTTP receiver: the JSON and Slack bodies, retries with
backoff, a dead webhook recorded as failed, validation naming the field."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
import pytest

from sluice.manager.alarms.webhooks import Dispatcher, WebhookConfigError, deliver, parse_webhooks

ALARM = {
    "id": "20240101-000000-abc123", "rule": "task-lag", "subject": "task:orders", "severity": "warning",
    "state": "open", "summary": "task orders is 12,345 records (75 s) behind; threshold 10,000 records",
    "detail": {"lag_records": 12345}, "raised_at": 1.0, "updated_at": 1.0, "acknowledged_by": None,
    "acknowledged_at": None, "resolved_at": None, "notifications": [{"webhook": "x"}],
}  # fmt: skip


class Receiver:
    """An HTTP server on 127.0.0.1 that answers each POST with the next status of `statuses`
    (then 200) and keeps what it was sent."""

    def __init__(self, statuses: list[int] | None = None) -> None:
        self.statuses = list(statuses or [])
        self.bodies: list[dict[str, Any]] = []
        self.times: list[float] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.times.append(time.monotonic())
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                if status == 200:
                    receiver.bodies.append(orjson.loads(data))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook/secret-token"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def dead_url() -> str:
    """A port nobody listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/hook"


def test_a_json_webhook_receives_the_event_and_the_alarm(receiver: Receiver) -> None:
    record = deliver({"url": receiver.url, "format": "json", "name": "ops"}, "raised", ALARM)
    assert record["ok"] and record["attempts"] == 1 and record["error"] is None
    assert record["webhook"] == "ops" and record["event"] == "raised"
    [body] = receiver.bodies
    assert body["event"] == "raised"
    assert body["alarm"]["id"] == ALARM["id"] and body["alarm"]["summary"] == ALARM["summary"]
    assert "notifications" not in body["alarm"]


def test_a_slack_webhook_receives_text_and_blocks(receiver: Receiver) -> None:
    alarm = {**ALARM, "summary": "task <orders> & co is behind"}
    assert deliver({"url": receiver.url, "format": "slack"}, "resolved", alarm)["ok"]
    [body] = receiver.bodies
    assert body["text"] == "[RESOLVED] resolved: task &lt;orders&gt; &amp; co is behind"
    assert body["blocks"][0]["text"]["text"] == body["text"]
    assert "alarm 20240101-000000-abc123" in body["blocks"][1]["elements"][0]["text"]


def test_a_receiver_failing_twice_gets_one_delivery_after_retries() -> None:
    flaky = Receiver([500, 503])
    try:
        record = deliver({"url": flaky.url, "format": "json"}, "raised", ALARM, backoff_s=0.1)
    finally:
        flaky.close()
    assert record["ok"] and record["attempts"] == 3
    assert len(flaky.bodies) == 1
    gaps = [b - a for a, b in zip(flaky.times, flaky.times[1:], strict=False)]
    assert gaps[0] >= 0.1 and gaps[1] >= 0.2  # exponential backoff


def test_a_refused_body_is_not_retried() -> None:
    refusing = Receiver([400])
    try:
        record = deliver({"url": refusing.url, "format": "json"}, "raised", ALARM, backoff_s=0.01)
    finally:
        refusing.close()
    assert not record["ok"] and record["attempts"] == 1 and "HTTP 400" in record["error"]


def test_a_dead_webhook_is_recorded_as_failed_without_raising() -> None:
    started = time.monotonic()
    record = deliver({"url": dead_url(), "format": "json"}, "raised", ALARM, timeout_s=1, backoff_s=0.05)
    assert time.monotonic() - started < 5
    assert not record["ok"] and record["attempts"] == 3 and "cannot reach it" in record["error"]
    assert record["webhook"].startswith("http://127.0.0.1:") and "/hook" not in record["webhook"]


def test_the_dispatcher_delivers_off_the_callers_thread_and_records_each_outcome(receiver: Receiver) -> None:
    records: list[tuple[str, dict[str, Any]]] = []
    dispatcher = Dispatcher(
        lambda alarm_id, rec: records.append((alarm_id, rec)), timeout_s=1, backoff_s=0.05
    )
    hooks = [{"url": dead_url(), "format": "json", "name": "dead"}, {"url": receiver.url, "format": "slack"}]
    try:
        started = time.monotonic()
        dispatcher.submit(hooks, "raised", ALARM)
        dispatcher.submit(hooks, "resolved", ALARM)
        assert time.monotonic() - started < 0.5  # the caller never waits for a webhook
        assert dispatcher.wait_idle(20)
    finally:
        dispatcher.stop()
    assert [b["text"].split("]")[0] for b in receiver.bodies] == ["[WARNING", "[RESOLVED"]  # in order
    outcomes = sorted((r["webhook"], r["event"], r["ok"]) for _, r in records)
    assert outcomes == sorted([("dead", "raised", False), ("dead", "resolved", False)] + [
        (f"http://127.0.0.1:{receiver.server.server_address[1]}", e, True) for e in ("raised", "resolved")
    ])  # fmt: skip
    assert {alarm_id for alarm_id, _ in records} == {ALARM["id"]}


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        (
            [{"url": "https://example.com/h", "format": "json"}, {"url": "ftp://x/y", "format": "json"}],
            "webhooks[1].url",
        ),
        ([{"url": "https://example.com/h", "format": "xml"}], "webhooks[0].format"),
        ([{"url": "https://example.com/h", "colour": "red"}], "webhooks[0].colour"),
        ([{"url": "https://example.com/h", "name": ""}], "webhooks[0].name"),
        ([{"url": "http://:80/h"}], "webhooks[0].url"),
        ({"url": "https://example.com/h"}, "webhooks"),
    ],
)
def test_webhooks_validation_names_the_field(doc: Any, field: str) -> None:
    with pytest.raises(WebhookConfigError) as err:
        parse_webhooks(doc)
    assert err.value.field == field


def test_valid_webhooks_default_to_the_json_format() -> None:
    assert parse_webhooks([{"url": "https://hooks.example.com/x", "name": "ops"}]) == [
        {"url": "https://hooks.example.com/x", "format": "json", "name": "ops"}
    ]
