"""Sync task definitions in ZooKeeper: validation, the CLI, fencing epochs, control, alarms."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from sluice.cluster.zkstore import ZkStore
from sluice.sync.tasks import TaskSpecError, TaskStore, parse_spec

GOOD = """
id: shop-to-pg
source: {kind: mariadb, host: 127.0.0.1, port: 3306, user: sluice, database: shop}
tables: [customers, orders]
topic: "shop.{table}"
target: postgresql://postgres@127.0.0.1:5432/shop
mapping: {orders: {rename: {amount_cents: amount}}}
options: {trigger: 1s, partitions: 3}
"""


@pytest.fixture
def zk_address(zookeeper: str) -> str:
    return f"{zookeeper.split('/')[0]}/t-{uuid.uuid4().hex[:8]}"


def sluice(*args: str, zk: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", *args, "--zookeeper", zk],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (("id: shop-to-pg", "id: Bad Id"), "task.id"),
        (("port: 3306", "port: 99999"), "task.source.port"),
        (("kind: mariadb", "kind: oracle"), "task.source.kind"),
        (("target: postgresql", "target: oracle"), "task.target"),
        (("tables: [customers, orders]", "tables: []"), "task.tables"),
        (("trigger: 1s", "trigger: 1s, colour: red"), "task.options.colour"),
        (("trigger: 1s", "trigger: soon"), "task.options.trigger"),
        (("trigger: 1s", "trigger: 1s, transaction_metadata: 'yes'"), "task.options.transaction_metadata"),
        (("trigger: 1s", "trigger: 1s, heartbeat_interval: often"), "task.options.heartbeat_interval"),
        (("rename: {amount_cents: amount}", "renames: {}"), "task.mapping.orders"),
        (("user: sluice,", "user: sluice, password: hunter2,"), "task.source.password"),
        (("user: sluice,", "user: sluice, password: {env: 9}, "), "task.source.password.env"),
        (("postgresql://postgres@", "postgresql://postgres:hunter2@"), "task.target"),
    ],
)
def test_validation_names_the_bad_field(change: tuple[str, str], field: str) -> None:
    import yaml

    with pytest.raises(TaskSpecError, match=field.replace(".", r"\.")):
        parse_spec(yaml.safe_load(GOOD.replace(*change)))


def test_task_cli_create_list_status_control_delete(zk_address: str, tmp_path: Path) -> None:
    good = tmp_path / "task.yaml"
    good.write_text(GOOD)
    out = sluice("task", "create", "--file", str(good), zk=zk_address)
    assert out.returncode == 0, out.stderr
    assert "shop.customers, shop.orders" in out.stdout
    again = sluice("task", "create", "--file", str(good), zk=zk_address)
    assert again.returncode == 2 and "exists already" in again.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("port: 3306", "port: nope"))
    out = sluice("task", "create", "--file", str(bad), zk=zk_address)
    assert out.returncode == 2 and "task.source.port" in out.stderr

    assert "waiting for a worker" in sluice("task", "list", zk=zk_address).stdout
    assert sluice("task", "pause", "shop-to-pg", zk=zk_address).returncode == 0
    assert "paused" in sluice("task", "list", zk=zk_address).stdout
    assert sluice("task", "resume", "shop-to-pg", zk=zk_address).returncode == 0
    out = sluice("task", "restart", "shop-to-pg", "--from-position", "mysql-bin.000003:4", zk=zk_address)
    assert out.returncode == 0
    status = sluice("task", "status", "shop-to-pg", zk=zk_address)
    assert status.returncode == 0 and "waiting for a worker" in status.stdout
    assert sluice("task", "status", "nope", zk=zk_address).returncode == 2
    assert sluice("task", "delete", "shop-to-pg", zk=zk_address).returncode == 0
    assert "shop-to-pg" not in sluice("task", "list", zk=zk_address).stdout

    zk = ZkStore(zk_address)
    zk.start()
    try:
        store = TaskStore(zk.client)
        assert store.ids() == []
    finally:
        zk.stop()


def test_epochs_are_unique_under_contention_and_status_is_ephemeral(zk_address: str) -> None:
    import yaml

    stores = []
    for _ in range(4):
        zk = ZkStore(zk_address)
        zk.start()
        stores.append(zk)
    try:
        first = TaskStore(stores[0].client)
        first.create(parse_spec(yaml.safe_load(GOOD)))
        taken: list[int] = []
        lock = threading.Lock()

        def take(s: ZkStore) -> None:
            store = TaskStore(s.client)
            for _ in range(25):
                e = store.next_epoch("shop-to-pg")
                with lock:
                    taken.append(e)

        threads = [threading.Thread(target=take, args=(s,)) for s in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(taken) == list(range(1, 101))  # no epoch handed out twice

        store = TaskStore(stores[1].client)
        store.publish_status("shop-to-pg", {"execution": "x1", "epoch": 100, "worker": "w1"})
        assert first.status("shop-to-pg") == {"execution": "x1", "epoch": 100, "worker": "w1"}
        stores[1].stop()  # the execution's session ends: its status goes with it
        stores.pop(1)
        assert first.status("shop-to-pg") is None
        first.raise_alarm(
            "shop-to-pg", "duplicate-execution",
            {"executions": ["x1", "x2"], "workers": ["w1", "w2"], "epochs": [99, 100]},
        )  # fmt: skip
        assert first.alarms("shop-to-pg")[0]["kind"] == "duplicate-execution"
        shown = sluice("task", "status", "shop-to-pg", zk=zk_address)
        assert shown.returncode == 0, shown.stderr
        assert "duplicate-execution; executions x1 -> x2; workers w1 -> w2; epochs 99 -> 100" in shown.stdout
    finally:
        for s in stores:
            s.stop()


def test_an_epoch_never_goes_back_for_a_task_deleted_and_created_again(
    zk_address: str, tmp_path: Path
) -> None:
    """The epoch counter used to live under /tasks/{id} and went with a delete: the task created
    again started at epoch 1 while its target held epoch 3, so it could never commit. Failing
    run before the fix: assert 1 == 4. The counter now outlives the task, and an execution also
    takes an epoch past the one its target holds (a counter lost with its ZooKeeper)."""
    import yaml

    from sluice.sync.targets import open_target

    zk = ZkStore(zk_address)
    zk.start()
    try:
        store = TaskStore(zk.client)
        spec = parse_spec(yaml.safe_load(GOOD.replace("postgresql://postgres@127.0.0.1:5432/shop",
                                                      f"sqlite:///{tmp_path / 't.db'}")))  # fmt: skip
        store.create(spec)
        with open_target(spec.target) as target:
            for _ in range(3):
                target.claim(spec.id, store.next_epoch(spec.id))
            store.delete(spec.id)
            store.create(spec)
            again = store.next_epoch(spec.id)
            assert again == 4
            target.claim(spec.id, again)  # accepted: not older than what the target holds
            # A counter that lost its history (a new ZooKeeper): the target's epoch is the floor.
            zk.client.set(f"/task_epochs/{spec.id}", b"0")
            floor = target.fence_epoch(spec.id)
            assert floor == 4
            assert store.next_epoch(spec.id, at_least=floor or 0) == 5
    finally:
        zk.stop()


def test_a_superseded_execution_cannot_overwrite_the_status_of_the_new_one(
    zk_address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old execution read the status (its own), the new one published its own, then the old
    one wrote over it unconditionally: `task status` showed a dead execution as the live one.
    Failing run before the fix: assert {'execution': 'old', 'epoch': 1, ...} == {... 'new' ...}.
    The write is now conditional on the version read and refused for an older epoch."""
    import yaml

    old_zk, new_zk = ZkStore(zk_address), ZkStore(zk_address)
    old_zk.start()
    new_zk.start()
    try:
        old, new = TaskStore(old_zk.client), TaskStore(new_zk.client)
        old.create(parse_spec(yaml.safe_load(GOOD)))
        old_status = {"execution": "old", "epoch": 1, "worker": "w1"}
        new_status = {"execution": "new", "epoch": 2, "worker": "w2"}
        assert old.publish_status("shop-to-pg", old_status)
        # The new execution publishes right after the old one read the znode.
        real_get = old_zk.client.get
        raced = []

        def get_then_race(path: str, *args: object, **kwargs: object) -> object:
            result = real_get(path, *args, **kwargs)
            if path.endswith("/status") and not raced:
                raced.append(True)
                assert new.publish_status("shop-to-pg", new_status)
            return result

        monkeypatch.setattr(old_zk.client, "get", get_then_race)
        assert old.publish_status("shop-to-pg", {**old_status, "lag_records": 7}) is False
        assert raced and new.status("shop-to-pg") == new_status
        assert new.publish_status("shop-to-pg", {**new_status, "lag_records": 0})
    finally:
        old_zk.stop()
        new_zk.stop()


def test_a_deleted_tasks_running_execution_cannot_bring_it_back_by_publishing_its_status(
    zk_address: str,
) -> None:
    """`task delete` removes the task's znodes while its worker still runs the execution until
    the group's rebalance stops it; a status published in between created the status znode with
    its parents, so the task came back as an empty znode: listed, assigned and run by the worker,
    never stopped (a default-suite run under two busy loops: `good to stop` timed out). Failing
    run before the fix: 'shop-to-pg' in ids() after the publish."""
    import yaml

    zk = ZkStore(zk_address)
    zk.start()
    try:
        store = TaskStore(zk.client)
        store.create(parse_spec(yaml.safe_load(GOOD)))
        status = {"execution": "x1", "epoch": 1, "worker": "w1"}
        assert store.publish_status("shop-to-pg", status)
        store.delete("shop-to-pg")
        assert store.publish_status("shop-to-pg", {**status, "lag_records": 3}) is False
        assert "shop-to-pg" not in store.ids()
        assert store.status("shop-to-pg") is None
        assert not zk.client.exists("/tasks/shop-to-pg")
    finally:
        zk.stop()


def test_task_update_replaces_the_definition_and_restarts_the_execution(
    zk_address: str, tmp_path: Path
) -> None:
    good = tmp_path / "task.yaml"
    good.write_text(GOOD)
    assert sluice("task", "create", "--file", str(good), zk=zk_address).returncode == 0
    changed = tmp_path / "changed.yaml"
    changed.write_text(GOOD.replace("trigger: 1s", "trigger: 2s"))
    out = sluice("task", "update", "--file", str(changed), zk=zk_address)
    assert out.returncode == 0, out.stderr
    assert "updated" in out.stdout and "postgres@127.0.0.1" in out.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("trigger: 1s", "trigger: soon"))
    out = sluice("task", "update", "--file", str(bad), zk=zk_address)
    assert out.returncode == 2 and "task.options.trigger" in out.stderr
    missing = tmp_path / "missing.yaml"
    missing.write_text(GOOD.replace("id: shop-to-pg", "id: nope"))
    out = sluice("task", "update", "--file", str(missing), zk=zk_address)
    assert out.returncode == 2 and "no task 'nope'" in out.stderr
    zk = ZkStore(zk_address)
    zk.start()
    try:
        store = TaskStore(zk.client)
        assert store.get("shop-to-pg").options["trigger"] == "2s"
        assert store.control("shop-to-pg").restarts == 1
    finally:
        zk.stop()


def test_a_definition_stored_with_plain_text_passwords_is_shown_redacted_and_flagged(
    zk_address: str, tmp_path: Path
) -> None:
    """A definition stored before secret references (plain-text passwords, written straight into
    ZooKeeper as older releases did) still reads and runs; `task list`, `task status` and the
    service layer show *** and name its plain-text fields; saving it back as shown is refused."""
    import orjson
    import yaml

    from sluice.service.context import Services
    from sluice.service.errors import InvalidError
    from sluice.service.tasks import parse_definition, task_detail

    good = tmp_path / "task.yaml"
    good.write_text(GOOD)
    assert sluice("task", "create", "--file", str(good), zk=zk_address).returncode == 0
    old = yaml.safe_load(GOOD)
    old["source"]["password"] = "legacy-opensesame"
    old["target"] = "postgresql://postgres:legacy-hunter2@127.0.0.1:5432/shop"
    zk = ZkStore(zk_address)
    zk.start()
    try:
        zk.client.set("/tasks/shop-to-pg", orjson.dumps(old))
        spec = TaskStore(zk.client).get("shop-to-pg")
        assert spec.plain_text_secrets() == ["task.source.password", "task.target"]
        svc = Services(zk_address, bootstrap="127.0.0.1:1")
        try:
            detail = task_detail(svc, "shop-to-pg")
        finally:
            svc.close()
        assert detail["plain_text_secrets"] == ["task.source.password", "task.target"]
        assert detail["definition"]["source"]["password"] == "***"
        assert "legacy-" not in str(detail)
        with pytest.raises(InvalidError) as refused:
            parse_definition(detail["definition"])
        assert refused.value.field == "task.target" and "legacy-" not in str(refused.value)
    finally:
        zk.stop()
    status = sluice("task", "status", "shop-to-pg", zk=zk_address)
    listed = sluice("task", "list", zk=zk_address)
    assert status.returncode == 0 and listed.returncode == 0, status.stderr + listed.stderr
    assert "task.source.password is stored in plain text" in status.stdout, status.stdout
    assert "legacy-" not in status.stdout + status.stderr + listed.stdout + listed.stderr
