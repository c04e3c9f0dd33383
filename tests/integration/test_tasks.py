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
        [sys.executable, "-m", "sluice.ops.cli", *args, "--zookeeper", zk],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (("id: shop-to-pg", "id: Bad Id"), "task.id"),
        (("port: 3306", "port: 99999"), "task.source.port"),
        (("kind: mariadb", "kind: oracle"), "task.source.kind"),
        (("target: postgresql", "target: mysql"), "task.target"),
        (("tables: [customers, orders]", "tables: []"), "task.tables"),
        (("trigger: 1s", "trigger: 1s, colour: red"), "task.options.colour"),
        (("trigger: 1s", "trigger: soon"), "task.options.trigger"),
        (("rename: {amount_cents: amount}", "renames: {}"), "task.mapping.orders"),
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
