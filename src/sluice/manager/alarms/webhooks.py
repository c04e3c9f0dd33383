"""Alarm notifications over HTTP: a generic JSON body or a Slack-compatible one, posted with a
timeout and a bounded number of tries (exponential backoff), each delivery's outcome recorded.

Bodies:

    json    {"event": "raised" | "updated" | "resolved", "alarm": {...the stored alarm...}}
    slack   {"text": "[CRITICAL] raised: <summary>", "blocks": [...]}  (Slack incoming webhooks,
            and Mattermost/Rocket.Chat, which read the same "text")

A delivery makes at most `tries` attempts of at most `timeout_s` each, `backoff_s`, 2x, 4x ...
apart; it retries a connection failure, a timeout, 408, 429 and 5xx, never another 4xx (a
refused body stays refused). `Dispatcher` runs deliveries off the evaluation thread, one thread
and one bounded queue per webhook, so a dead webhook delays only its own notices.

The standard library's urllib only: the manager must not depend on a test-only HTTP client.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import orjson

from sluice.manager.alarms.rules import AlarmConfigError

log = logging.getLogger("sluice.manager.alarms")

FORMATS = ("json", "slack")
WEBHOOKS_MAX = 20
NAME_MAX = 100
QUEUE_MAX = 1000
#: a dispatcher thread with nothing to send for this long ends (a webhook removed meanwhile)
IDLE_EXIT_S = 60.0
_RETRIED_STATUS = {408, 429}


class WebhookConfigError(AlarmConfigError):
    pass


def parse_webhooks(doc: Any) -> list[dict[str, Any]]:
    """Validate the webhooks document: a list of {"url": http(s) URL, "format": "json"|"slack"
    (default json), "name": optional label}. Errors name the field: `webhooks[1].url: ...`."""
    if not isinstance(doc, list):
        raise WebhookConfigError("webhooks", "must be a list of {url, format, name}")
    if len(doc) > WEBHOOKS_MAX:
        raise WebhookConfigError("webhooks", f"at most {WEBHOOKS_MAX} webhooks, not {len(doc)}")
    out = []
    for i, item in enumerate(doc):
        where = f"webhooks[{i}]"
        if not isinstance(item, dict):
            raise WebhookConfigError(where, "must be a mapping with url and format")
        for name in item:
            if name not in ("url", "format", "name"):
                raise WebhookConfigError(f"{where}.{name}", "unknown field (known: url, format, name)")
        url = item.get("url")
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise WebhookConfigError(f"{where}.url", "must be an http:// or https:// URL with a host")
        try:
            parts.port  # noqa: B018 (raises on a bad port)
        except ValueError:
            raise WebhookConfigError(f"{where}.url", "has a bad port") from None
        fmt = item.get("format", "json")
        if fmt not in FORMATS:
            raise WebhookConfigError(f"{where}.format", f"must be one of {', '.join(FORMATS)}, not {fmt!r}")
        entry: dict[str, Any] = {"url": url, "format": fmt}
        if item.get("name") is not None:
            label = item["name"]
            if not isinstance(label, str) or not label.strip() or len(label) > NAME_MAX:
                raise WebhookConfigError(f"{where}.name", f"must be a non-empty string of at most {NAME_MAX}")
            entry["name"] = label
        out.append(entry)
    return out


def label(webhook: dict[str, Any]) -> str:
    """How a webhook is named in records and logs: its name, or its scheme and host only (a
    webhook URL's path is often its secret, as Slack's are)."""
    if webhook.get("name"):
        return str(webhook["name"])
    parts = urlsplit(str(webhook.get("url", "")))
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


# --- bodies -----------------------------------------------------------------------------------------
def _public(alarm: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in alarm.items() if k != "notifications"}


def json_body(event: str, alarm: dict[str, Any]) -> dict[str, Any]:
    return {"event": event, "alarm": _public(alarm)}


def _slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_text(event: str, alarm: dict[str, Any]) -> str:
    head = "RESOLVED" if event == "resolved" else str(alarm.get("severity", "")).upper()
    return f"[{head}] {event}: {alarm.get('summary', '')}"


def slack_body(event: str, alarm: dict[str, Any]) -> dict[str, Any]:
    text = _slack_escape(slack_text(event, alarm))
    context = " · ".join(
        (
            f"rule {alarm.get('rule')}",
            str(alarm.get("subject")),
            f"alarm {alarm.get('id')}",
            f"state {alarm.get('state')}",
        )
    )
    return {
        "text": text,
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": text}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": _slack_escape(context)}]},
        ],
    }


def body(webhook: dict[str, Any], event: str, alarm: dict[str, Any]) -> bytes:
    doc = slack_body(event, alarm) if webhook.get("format") == "slack" else json_body(event, alarm)
    return orjson.dumps(doc)


# --- delivery ---------------------------------------------------------------------------------------
def _post(url: str, data: bytes, timeout_s: float) -> None:
    request = urllib.request.Request(
        url,
        data=data,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "sluice-manager-alarms"},
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:  # http(s) only: validated
        response.read(65536)  # bounded: only the status matters


def deliver(
    webhook: dict[str, Any],
    event: str,
    alarm: dict[str, Any],
    *,
    timeout_s: float = 5.0,
    tries: int = 3,
    backoff_s: float = 0.5,
    sleep: Callable[[float], object] = time.sleep,
) -> dict[str, Any]:
    """Post one notice; never raises. The record for the alarm's notifications list:
    {"webhook", "event", "at", "ok", "attempts", "error"}."""
    assert tries >= 1 and timeout_s > 0 and backoff_s >= 0
    data = body(webhook, event, alarm)
    error: str | None = None
    attempts = 0
    for attempts in range(1, tries + 1):
        retry = True
        try:
            _post(str(webhook["url"]), data, timeout_s)
            error = None
            break
        except urllib.error.HTTPError as exc:
            retry = exc.code >= 500 or exc.code in _RETRIED_STATUS
            error = f"HTTP {exc.code} {exc.reason}" + ("" if retry else "; not retried")
        except urllib.error.URLError as exc:
            error = f"cannot reach it: {exc.reason}"
        except (OSError, ValueError) as exc:  # timeouts, resets, a malformed answer
            error = f"{type(exc).__name__}: {exc}"
        if not retry:
            break
        if attempts < tries:
            sleep(backoff_s * 2 ** (attempts - 1))
    record = {
        "webhook": label(webhook), "event": event, "at": time.time(), "ok": error is None,
        "attempts": attempts, "error": error,
    }  # fmt: skip
    if error is None:
        log.info("event=alarm_notified alarm=%s webhook=%s notice=%s attempts=%d",
                 alarm.get("id"), record["webhook"], event, attempts)  # fmt: skip
    else:
        log.warning("event=alarm_notice_failed alarm=%s webhook=%s notice=%s attempts=%d error=%s",
                    alarm.get("id"), record["webhook"], event, attempts, error)  # fmt: skip
    return record


#: record(alarm_id, notification record) stores the outcome (AlarmStore.add_notification)
Recorder = Callable[[str, dict[str, Any]], None]


class Dispatcher:
    """Deliveries off the caller's thread: one daemon thread and one bounded queue per webhook
    (by URL and format), so notices reach each webhook in order and a dead one delays no other.
    A full queue drops the notice and records it as failed."""

    def __init__(
        self,
        record: Recorder,
        *,
        timeout_s: float = 5.0,
        tries: int = 3,
        backoff_s: float = 0.5,
        queue_max: int = QUEUE_MAX,
    ) -> None:
        self.record = record
        self.timeout_s = timeout_s
        self.tries = tries
        self.backoff_s = backoff_s
        self.queue_max = queue_max
        self._lock = threading.Lock()
        self._queues: dict[tuple[str, str], queue.Queue[tuple[dict[str, Any], str, dict[str, Any]]]] = {}
        self._stopped = threading.Event()
        self._pending = 0
        self._idle = threading.Condition(self._lock)

    def submit(self, webhooks: list[dict[str, Any]], event: str, alarm: dict[str, Any]) -> None:
        """Queue `event` for `alarm` to every webhook; returns at once."""
        for webhook in webhooks:
            key = (str(webhook["url"]), str(webhook.get("format", "json")))
            with self._lock:
                if self._stopped.is_set():
                    return
                q = self._queues.get(key)
                if q is None:
                    q = self._queues[key] = queue.Queue(self.queue_max)
                    threading.Thread(
                        target=self._run, args=(key, q), name=f"alarm-webhook-{label(webhook)}", daemon=True
                    ).start()
                try:
                    q.put_nowait((webhook, event, alarm))
                    self._pending += 1
                    continue
                except queue.Full:
                    pass
            self._record(str(alarm["id"]), {
                "webhook": label(webhook), "event": event, "at": time.time(), "ok": False, "attempts": 0,
                "error": f"dropped: {self.queue_max} notices already waiting for this webhook",
            })  # fmt: skip

    def _run(self, key: tuple[str, str], q: queue.Queue[tuple[dict[str, Any], str, dict[str, Any]]]) -> None:
        while not self._stopped.is_set():
            try:
                webhook, event, alarm = q.get(timeout=IDLE_EXIT_S)
            except queue.Empty:
                with self._lock:
                    if q.empty():  # nothing came meanwhile: end; the next submit starts a thread
                        self._queues.pop(key, None)
                        return
                continue
            try:
                outcome = deliver(
                    webhook, event, alarm, timeout_s=self.timeout_s, tries=self.tries,
                    backoff_s=self.backoff_s, sleep=self._stopped.wait,
                )  # fmt: skip
                self._record(str(alarm["id"]), outcome)
            finally:
                with self._lock:
                    self._pending -= 1
                    self._idle.notify_all()

    def _record(self, alarm_id: str, outcome: dict[str, Any]) -> None:
        try:
            self.record(alarm_id, outcome)
        except Exception as exc:  # ZooKeeper out of reach: the log line above is what remains
            log.warning("event=alarm_notice_unrecorded alarm=%s error=%s", alarm_id, exc)

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until every queued notice was delivered or given up (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def stop(self) -> None:
        """Deliver nothing more (threads end after their current attempt's timeout at most)."""
        self._stopped.set()
