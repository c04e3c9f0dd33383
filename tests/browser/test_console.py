"""The manager's console in a real browser against a real manager, cluster and ZooKeeper: the
acceptance scenarios of issue 16 (log in; an offline partition and its reason; a task's lag and
alarm while its target is locked; pause and resume in the audit log; a viewer cannot act)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from selenium.webdriver.remote.webdriver import WebDriver

from sluice.manager.auth import UserStore
from sluice.manager.config import ManagerConfig
from sluice.manager.server import ManagerHandle, run_manager
from tests.support.browser import Console
from tests.support.cluster import TestCluster

USERS = {
    "alice": ("alice-password", "operator"),
    "vera": ("vera-password", "viewer"),
    "root": ("root-password", "admin"),
}


@contextmanager
def manager_for(cluster: TestCluster) -> Iterator[ManagerHandle]:
    """A manager in this process sampling lag and evaluating alarms every half second, with the
    users above."""
    config = ManagerConfig(
        bootstrap=cluster.bootstrap, zookeeper=cluster.zookeeper, port=0,
        sample_interval_ms=500, alarm_interval_ms=500,
    )  # fmt: skip
    handle = run_manager(cluster.zookeeper, cluster.bootstrap, config=config, create_admin=False)
    stopped = False

    def stop() -> None:
        nonlocal stopped
        if not stopped:
            stopped = True
            handle.stop()

    handle.stop_once = stop  # type: ignore[attr-defined]
    try:
        users = UserStore(handle.state.services.client)
        for user, (password, role) in USERS.items():
            users.add(user, password, role)
        yield handle
    finally:
        stop()


def log_in(console: Console, user: str) -> None:
    console.login(user, USERS[user][0])
    console.wait_visible("overall-status")


def create_topic_on(bootstrap: str, topic: str, broker_id: int) -> None:
    """One partition whose only replica is on `broker_id` (an explicit assignment)."""
    from sluice.protocol.api import ApiKey
    from sluice.protocol.errors import ErrorCode
    from sluice.sync.wire_client import WireClient

    with WireClient.connect(bootstrap) as w:
        r = w.request(
            ApiKey.CREATE_TOPICS, 5,
            {"topics": [{"name": topic, "num_partitions": -1, "replication_factor": -1,
                         "assignments": [{"partition_index": 0, "broker_ids": [broker_id]}]}],
             "timeout_ms": 30000},
        )  # fmt: skip
    assert r["topics"][0]["error_code"] == ErrorCode.NONE, r


def test_log_in_then_see_a_partition_offline_with_its_reason_when_its_only_broker_dies(
    driver: WebDriver, make_cluster: Callable[..., TestCluster], test_name: str
) -> None:
    cluster = make_cluster(2)
    with manager_for(cluster) as manager:
        console = Console(driver, manager.url, test_name)
        console.login("alice", "not-her-password")
        error = console.wait_visible("login-error")
        assert "wrong user name or password" in error.text.lower(), error.text
        assert not console.find("view").is_displayed()
        console.shot("wrong-password")
        console.type("login-password", USERS["alice"][0])
        console.click("login-submit")
        console.wait_visible("overall-status")
        assert console.driver.current_url.endswith("#/overview")
        console.click("user-menu")
        assert console.wait_visible("user-name").text == "alice"
        console.click("user-menu")

        controller = manager.state.services.zk.controller_id()
        victim = 2 if controller == 1 else 1  # not the controller: the partition's fate alone
        create_topic_on(cluster.bootstrap, "orders", victim)
        console.wait(lambda: console.find("overall-status").get_attribute("data-level") == "ok", "all clear")
        console.shot("all-clear")

        cluster.kill(victim)
        row = console.wait_text("partition-problem", f"its only replica, broker {victim}, is down", 60)
        assert (row.get_attribute("data-topic"), row.get_attribute("data-partition")) == ("orders", "0")
        assert row.get_attribute("data-status") == "offline"
        assert console.find("overall-status").get_attribute("data-level") == "critical"
        console.wait_text("attention-item", "partition orders-0 is offline")
        assert console.find("card-brokers").get_attribute("data-level") == "critical"
        console.shot("offline")
        console.go("topics/orders")
        console.wait_text("topic-partition", f"broker {victim}")
        console.shot("topic-offline")
        assert console.js_errors() == []


TASK = """
id: {id}
source: {{kind: generator, rate: 20}}
target: sqlite:///{db}
options: {{trigger: 500ms, partitions: 1, replication_factor: 1}}
"""


def test_pause_and_resume_from_the_console_are_in_the_audit_log_and_a_viewer_cannot_act(
    driver: WebDriver, make_cluster: Callable[..., TestCluster], test_name: str, tmp_path: Path
) -> None:
    from sluice.service import tasks as task_service

    cluster = make_cluster(1)
    with manager_for(cluster) as manager:
        svc = manager.state.services
        task_service.create_task(
            svc, task_service.parse_definition_text(TASK.format(id="gen-a", db=tmp_path / "a.db"))
        )
        console = Console(driver, manager.url, test_name)
        log_in(console, "alice")
        console.go("tasks")
        console.wait_text("task-row", "gen-a").find_element("css selector", "a").click()
        console.wait(lambda: console.find("task-state").text == "waiting", "the task waiting for a worker")
        console.shot("task")
        console.click("task-pause")
        console.wait(lambda: console.find("task-state").text == "paused", "the task paused")
        console.wait_text("flash", "Pause gen-a: done")
        console.shot("paused")
        console.click("task-resume")
        console.wait(lambda: console.find("task-state").text == "waiting", "the task resumed")
        console.click("task-delete")
        console.wait_text("confirm-text", "definition is removed")
        console.click("confirm-cancel")
        assert not console.find("confirm-dialog").is_displayed()

        console.go("audit")
        rows = console.wait(lambda: len(r := console.find_all("audit-row")) >= 2 and r, "two audit rows")
        seen = [(r.get_attribute("data-user"), r.get_attribute("data-action"), r.get_attribute("data-target"))
                for r in rows[:2]]  # fmt: skip
        assert seen == [("alice", "task.resume", "task:gen-a"), ("alice", "task.pause", "task:gen-a")], seen
        assert '"paused"' in rows[1].text  # the state after the pause
        console.shot("audit")

        console.logout()
        log_in(console, "vera")
        console.go("tasks/gen-a")
        console.wait_visible("task-state")
        for button in ("task-pause", "task-resume", "task-restart", "task-restart-from", "task-delete"):
            assert not console.find(button).is_enabled(), button
        assert "viewer" in console.find("role-note").text
        console.driver.execute_script(
            "document.querySelector('[data-testid=\"task-pause\"]').disabled = false"
        )
        console.find("task-pause").click()
        flash = console.wait_text("flash", "vera is a viewer")
        assert flash.get_attribute("data-kind") == "error"
        console.shot("viewer-refused")
        assert svc.tasks.control("gen-a").paused is False

        manager.stop_once()  # type: ignore[attr-defined]
        banner = console.wait_visible("error-banner")
        assert "unreachable" in banner.text, banner.text
        console.shot("manager-gone")
