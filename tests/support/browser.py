"""Browser-test harness: headless Debian chromium driven by selenium, the console seen through
its data-testid attributes, and a local webhook receiver.

selenium-manager never runs: the driver and browser paths are given, and SE_OFFLINE is set so a
missing binary fails at once instead of downloading one."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WINDOW = (1400, 1000)
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "browser"
#: how often the console polls the API in tests (people get 2 s): changes show within a second
POLL_MS = 300


def chrome() -> WebDriver:
    """A headless chromium with a fixed window, its console log kept for `js_errors`."""
    os.environ["SE_OFFLINE"] = "true"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        "--no-first-run",
        "--disable-extensions",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    return driver


def tid(testid: str) -> str:
    """The CSS selector of a data-testid."""
    return f'[data-testid="{testid}"]'


class Console:
    """The manager's console in one browser: log in, go to a route, wait, take screenshots."""

    def __init__(self, driver: WebDriver, url: str, test_name: str):
        self.driver = driver
        self.url = url.rstrip("/")
        self.test_name = test_name
        self.steps = 0

    # -- navigation

    def open(self, route: str = "") -> None:
        """Load the console afresh (a new page: sessionStorage of this tab stays). A URL that
        differs from the current one only in its hash would not reload: it is reloaded."""
        url = f"{self.url}/?poll_ms={POLL_MS}#/{route.lstrip('#/')}"
        same_page = self.driver.current_url.partition("#")[0] == url.partition("#")[0]
        self.driver.get(url)
        if same_page:
            self.driver.refresh()

    def go(self, route: str) -> None:
        """Follow a hash route without reloading the page."""
        self.driver.execute_script("location.hash = arguments[0]", "#/" + route.lstrip("#/"))

    def login(self, user: str, password: str) -> None:
        self.open("overview")
        self.driver.execute_script("sessionStorage.clear()")
        self.driver.refresh()
        self.wait_visible("login-form")
        self.type("login-user", user)
        self.type("login-password", password)
        self.click("login-submit")

    def logout(self) -> None:
        self.click("user-menu")
        self.click("logout")
        self.wait_visible("login-form")

    # -- finding and acting

    def find(self, testid: str, within: WebElement | None = None) -> WebElement:
        return (within or self.driver).find_element(By.CSS_SELECTOR, tid(testid))

    def find_all(self, testid: str, within: WebElement | None = None) -> list[WebElement]:
        return (within or self.driver).find_elements(By.CSS_SELECTOR, tid(testid))

    def type(self, testid: str, text: str) -> None:
        el = self.wait_visible(testid)
        el.clear()
        el.send_keys(text)

    def click(self, testid: str) -> None:
        """Find, then click, in one try: the console re-renders as it polls, and an element
        found in one render is stale in the next (StaleElementReferenceException); a stale
        try is retried."""

        def clicked() -> bool:
            e = self.find(testid)
            if not (e.is_displayed() and e.is_enabled()):
                return False
            e.click()
            return True

        self.wait(clicked, f"{testid} enabled and clicked")

    def wait(self, condition: Callable[[], Any], what: str, timeout_s: float = 20) -> Any:
        """Poll `condition` (stale elements count as not yet) until it is truthy."""

        def check(_: WebDriver) -> Any:
            try:
                return condition()
            except (StaleElementReferenceException, WebDriverException):
                return False

        try:
            return WebDriverWait(self.driver, timeout_s, poll_frequency=0.1).until(check)
        except Exception as exc:
            path = self.shot(f"timeout-{_slug(what)}")
            raise AssertionError(
                f"timed out after {timeout_s} s waiting for {what} (screenshot {path})"
            ) from exc

    def wait_visible(self, testid: str, timeout_s: float = 20) -> WebElement:
        return self.wait(
            lambda: (e := self.find(testid)).is_displayed() and e, f"{testid} visible", timeout_s
        )

    # -- reading a page that redraws its rows on every poll
    #
    # A table row found by one WebDriver call may be replaced by the next poll before the next
    # call reads it (StaleElementReferenceException). Rows are therefore read in one script
    # call, as plain values: their data-* attributes, their text and whether they are shown.

    def read(self, testid: str) -> list[dict[str, Any]]:
        """Every element with this test id as {data-* attributes..., "text", "shown", "enabled"},
        read at one instant."""
        return self.driver.execute_script(_READ_SCRIPT, tid(testid))

    def wait_read(
        self, testid: str, match: Callable[[dict[str, Any]], bool], what: str, timeout_s: float = 20
    ) -> dict[str, Any]:
        """The first element (as `read` gives it) with this test id that satisfies `match`."""
        return self.wait(
            lambda: next((r for r in self.read(testid) if match(r)), None), f"{testid}: {what}", timeout_s
        )

    def wait_text(self, testid: str, text: str, timeout_s: float = 20) -> dict[str, Any]:
        """The first element (as `read` gives it) with this test id whose text holds `text`."""
        return self.wait_read(testid, lambda r: text in r["text"], f"showing {text!r}", timeout_s)

    def attr(self, testid: str, name: str) -> str | None:
        """A data-* attribute of the first element with this test id, None if there is none."""
        rows = self.read(testid)
        return rows[0].get(name) if rows else None

    def click_in(
        self, testid: str, match: Callable[[dict[str, Any]], bool], selector: str, what: str
    ) -> None:
        """Click `selector` inside the first element with this test id that satisfies `match`.
        Found and clicked in one wait step: a row replaced in between is looked up again (a click
        on a stale element raises before it reaches the page, so nothing is clicked twice)."""

        def attempt() -> bool:
            for row in self.find_all(testid):
                if match(self.driver.execute_script(_READ_ONE_SCRIPT, row)):  # stale: raises
                    row.find_element(By.CSS_SELECTOR, selector).click()
                    return True
            return False

        self.wait(attempt, f"{selector} in the {testid} {what}")

    def wait_updated(self) -> None:
        """One more successful poll than now (the page shows what the API says at this moment)."""
        before = self.find("last-updated").text
        self.wait(lambda: self.find("last-updated").text != before, "the next poll", 10)

    def shot(self, step: str) -> Path:
        """A screenshot as test-artifacts/browser/<test>-<nn>-<step>.png."""
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.steps += 1
        path = ARTIFACTS / f"{self.test_name}-{self.steps:02d}-{_slug(step)}.png"
        self.driver.save_screenshot(str(path))
        return path

    def js_errors(self) -> list[str]:
        """Script errors in the page's console since the last call. An API answer of 4xx/5xx is
        logged by the browser too ("Failed to load resource"): those are the tests' to provoke."""
        return [
            e["message"]
            for e in self.driver.get_log("browser")
            if e["level"] == "SEVERE" and "Failed to load resource" not in e["message"]
        ]


_READ = """const read = (e) => Object.assign({}, e.dataset,
  {text: e.innerText, shown: e.getClientRects().length > 0, enabled: !e.disabled});
"""
_READ_SCRIPT = _READ + "return Array.from(document.querySelectorAll(arguments[0])).map(read);"
_READ_ONE_SCRIPT = _READ + "return read(arguments[0]);"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60]


# ---------------------------------------------------------------- webhook receiver


@dataclass
class WebhookReceiver:
    """An HTTP server on 127.0.0.1 (a free port) that records every POST's JSON body."""

    received: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200  # what it answers; a test may make it fail
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/hook"

    def __enter__(self) -> WebhookReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"null")
                except ValueError:
                    body = {"raw": raw.decode(errors="replace")}
                with receiver._lock:
                    receiver.received.append({"path": self.path, "body": body, "at": time.time()})
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, name="webhook-receiver", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def bodies(self) -> list[Any]:
        with self._lock:
            return [r["body"] for r in self.received]

    def wait_for(self, predicate: Callable[[Any], bool], timeout_s: float, what: str) -> Any:
        """The first body received that satisfies `predicate`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for body in self.bodies():
                if predicate(body):
                    return body
            time.sleep(0.1)
        raise AssertionError(
            f"timed out after {timeout_s} s waiting for a webhook {what}; got {self.bodies()}"
        )
