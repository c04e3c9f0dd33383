"""The console page itself, against a stand-in API with canned data (stub_api.py): every route
draws without a script error, server text stays text, a viewer cannot act, an unreachable
manager is said so. The acceptance scenarios against the real manager are in test_console.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.browser.stub_api import HOSTILE, Stub, serve_stub
from tests.support.browser import Console, tid


@pytest.fixture(scope="module")
def stub() -> Iterator[tuple[str, Stub]]:
    with serve_stub() as served:
        yield served


@pytest.fixture
def console(driver: WebDriver, stub: tuple[str, Stub], test_name: str) -> Console:
    return Console(driver, stub[0], test_name)


def test_every_route_draws_and_server_text_stays_text(console: Console) -> None:
    console.login("alice", "alice-pw")
    console.wait_text("partition-problem", "its only replica, broker 2, is down")
    assert console.attr("overall-status", "level") == "critical"
    console.shot("overview")
    routes = {
        "topics": "topic-row",
        "topics/shop.changes": "topic-partition",
        "groups": "group-row",
        "groups/sluice-apply-shop-to-pg": "group-partition",
        "tasks": "task-row",
        "tasks/shop-to-pg": "execution-row",
        "alarms": "alarm-row",
        "audit": "view",
    }
    for route, testid in routes.items():
        console.go(route)
        console.wait_visible(testid)
        console.wait_updated()
        console.shot(route)
    console.go("tasks/shop-to-pg")
    chart = console.wait_read("task-lag-chart", lambda c: c.get("points") == "60", "60 points")
    assert chart["max"] == str(20 * 59), chart
    assert console.driver.find_elements(By.CSS_SELECTOR, f"{tid('task-lag-chart')} polyline")
    # A hostile topic name, task error and alarm summary show as the text they are.
    console.go("tasks")
    console.wait_text("task-row", HOSTILE)
    console.go("topics")
    console.wait_text("topic-row", HOSTILE)
    console.go("alarms")
    console.click("alarms-tab-all")
    console.wait_text("alarm-summary", HOSTILE)
    assert console.driver.execute_script("return window.__pwned") is None
    assert not console.driver.find_elements(By.CSS_SELECTOR, "#view img")
    assert console.js_errors() == []


def test_a_viewer_sees_no_enabled_action_and_a_refused_one_says_why(console: Console) -> None:
    console.login("victor", "victor-pw")
    console.go("tasks/shop-to-pg")
    console.wait_visible("task-state")
    for button in ("task-pause", "task-resume", "task-restart", "task-restart-from", "task-delete"):
        assert not console.find(button).is_enabled(), button
    assert "viewer" in console.find("role-note").text
    console.shot("viewer-task")
    # Were the button enabled anyway, the 403's detail is shown.
    console.driver.execute_script("document.querySelector('[data-testid=\"task-pause\"]').disabled = false")
    console.find("task-pause").click()
    flash = console.wait_read("flash", lambda f: f["shown"], "shown")
    assert "victor is a viewer" in flash["text"] and flash["kind"] == "error", flash
    console.shot("viewer-refused")
    console.logout()


def test_an_unreachable_manager_shows_a_banner_until_it_answers_again(
    console: Console, stub: tuple[str, Stub]
) -> None:
    console.login("alice", "alice-pw")
    console.wait_text("last-updated", "last updated")
    assert not console.find("error-banner").is_displayed()
    stub[1].data["down"] = True
    try:
        banner = console.wait_visible("error-banner")
        assert "unreachable" in banner.text
        console.shot("unreachable")
    finally:
        stub[1].data["down"] = False
    console.wait(lambda: not console.find("error-banner").is_displayed(), "the banner to go")
    console.js_errors()  # the 503s are logged by the browser: expected here


def test_pause_resume_and_acknowledge_are_in_the_audit_log(console: Console) -> None:
    console.login("alice", "alice-pw")
    console.go("tasks/shop-to-pg")
    console.click("task-pause")
    console.wait(lambda: console.find("task-state").text == "paused", "the task paused")
    console.click("task-resume")
    console.wait(lambda: console.find("task-state").text == "running", "the task running")
    console.click("task-delete")
    console.wait_visible("confirm-dialog")
    console.shot("confirm-delete")
    console.click("confirm-cancel")
    console.go("alarms")
    console.click("alarm-ack")
    console.click("alarms-tab-acknowledged")
    console.wait_text("alarm-row", "by alice")
    console.go("audit")
    rows = console.wait(lambda: len(r := console.read("audit-row")) >= 3 and r, "three audit rows")
    actions = [(r["user"], r["action"]) for r in rows[:3]]
    assert actions == [("alice", "alarm.acknowledge"), ("alice", "task.resume"), ("alice", "task.pause")]
    console.shot("audit")
