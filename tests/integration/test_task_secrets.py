"""Secrets out of ZooKeeper (issue 17), end to end: a MariaDB -> PostgreSQL task whose passwords
are references (`{env: ...}` for the source, `{file: ...}` for the target) runs on a real worker
process, and neither password is found in the worker's log, any CLI output, `task status`, the
manager's API answers and logs, the alarms, or anywhere in ZooKeeper. A definition with a
plain-text password is refused by the CLI and the API, naming the field and how to write it.
The references are in a secret scope of the cluster's choosing (issue 33): its secrets directory
set with `sluice task secret-scope --dir` and the worker's `secrets.dir`, alike."""

from __future__ import annotations

import logging
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sluice.cluster.zkstore import ZkStore
from sluice.manager.auth import UserStore
from sluice.manager.config import ManagerConfig
from sluice.manager.server import run_manager
from sluice.ops.mariadb import LocalMariaDB
from sluice.sync.tasks import TaskStore
from tests.integration.test_workers import (
    items_database,
    items_in_source,
    items_in_target,
    start_worker,
    stop_worker,
)
from tests.support.cluster import TestCluster, wait_until

TASK = """
id: {id}
source: {{kind: mariadb, host: 127.0.0.1, port: {port}, user: shopsync, password: {password}, database: {db}}}
tables: [items]
topic: "{id}.changes"
target: {target}
options: {{trigger: 500ms, partitions: 1, replication_factor: 1{more}}}
"""
#: ZooKeeper znodes read at most, walking a cluster's chroot for the secrets
ZNODES_MAX = 20_000


class _Lines(logging.Handler):
    """Every log line of this process (the manager runs in it), tracebacks included."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def process_logs() -> Iterator[_Lines]:
    handler, root = _Lines(), logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def znode_texts(client: Any, root: str = "/") -> list[str]:
    """Every znode path and its data under `root` (a cluster's chroot), as text."""
    out: list[str] = []
    todo = [root]
    while todo:
        assert len(out) < ZNODES_MAX, "more znodes than a test cluster holds"
        path = todo.pop()
        try:
            data, _ = client.get(path)
            children = client.get_children(path)
        except Exception as exc:  # gone meanwhile (an ephemeral status, a trimmed execution)
            if "NoNode" in type(exc).__name__:
                continue
            raise
        out.append(f"{path} {data!r}")
        todo.extend(f"{path.rstrip('/')}/{c}" for c in children)
    return out


def files_text(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` (logs, checkpoints, the brokers' data), as bytes."""
    return {str(p): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def test_a_task_runs_with_secret_references_and_no_secret_is_shown_anywhere(
    mariadb: LocalMariaDB,
    postgres_url: str,
    make_cluster: Callable[..., TestCluster],
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    process_logs: _Lines,
) -> None:
    db_secret, pg_secret = f"db-{uuid.uuid4().hex}", f"pg-{uuid.uuid4().hex}"
    secrets_dir = tmp_path_factory.mktemp("secrets")
    pg_file = secrets_dir / "shop-pg"
    pg_file.write_text(pg_secret + "\n")
    cluster = make_cluster(1)
    bootstrap, zk_address = cluster.bootstrap, cluster.zookeeper
    items_database(mariadb, "sec1")
    # A source account that needs its password: a wrong or missing one cannot capture anything.
    mariadb.execute(
        "DROP USER IF EXISTS 'shopsync'@'127.0.0.1'",
        f"CREATE USER 'shopsync'@'127.0.0.1' IDENTIFIED BY '{db_secret}'",
        "GRANT SELECT, RELOAD, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'shopsync'@'127.0.0.1'",
    )
    good = TASK.format(
        id="sec", port=mariadb.port, db="sec1", password="{env: SLUICE_SECRET_SHOP_SYNC_DB}",
        target=f"{{url: '{postgres_url}', password: {{file: {pg_file}}}}}",
        # the snapshot as a Spark job: its tasks connect to the source in Spark's Python workers
        more=", snapshot_parallel_rows: 1, snapshot_chunk_rows: 1",
    )  # fmt: skip
    # Its reference names a variable the worker does not have: it fails, naming the variable.
    unset = TASK.format(
        id="sec-unset", port=mariadb.port, db="sec1", password="{env: SLUICE_SECRET_SHOP_SYNC_UNSET}",
        target=f"sqlite:///{tmp_path / 'unset.db'}", more="",
    )  # fmt: skip
    plain = TASK.format(
        id="sec-plain", port=mariadb.port, db="sec1", password=db_secret,
        target=f"sqlite:///{tmp_path / 'plain.db'}", more="",
    )  # fmt: skip
    plain_url = TASK.format(
        id="sec-plain-url", port=mariadb.port, db="sec1", password="{env: SLUICE_SECRET_SHOP_SYNC_DB}",
        target=postgres_url.replace("postgres@", f"postgres:{pg_secret}@"), more="",
    )  # fmt: skip
    outputs: dict[str, str] = {}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "sluice.ops.cli", *args, "--zookeeper", zk_address],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        outputs[" ".join(args) + f" #{len(outputs)}"] = done.stdout + done.stderr
        return done

    def define(name: str, text: str, directory: Path = tmp_path) -> Path:
        path = directory / f"{name}.yaml"
        path.write_text(text)
        return path

    # Plain text is refused by the CLI, naming the field and how to write it; nothing is stored.
    for name, text, field in [
        ("plain", plain, "task.source.password"),
        ("plain-url", plain_url, "task.target"),
    ]:
        refused = cli("task", "create", "--file", str(define(name, text, secrets_dir)))  # not in tmp_path
        assert refused.returncode == 2, refused
        assert field in refused.stderr and "{env: SLUICE_SECRET_SHOP" in refused.stderr, refused.stderr
    # The cluster's secrets directory is the test's own: the definition naming a file there is
    # accepted (with the default one it would be refused, naming secrets.dir).
    refused = cli("task", "create", "--file", str(define("good", good)))
    assert refused.returncode == 2 and "secrets.dir" in refused.stderr, refused
    scope = cli("task", "secret-scope", "--dir", str(secrets_dir))
    assert scope.stdout.strip() == f"secrets.dir={secrets_dir} secrets.env.prefix=SLUICE_SECRET_", outputs
    assert cli("task", "create", "--file", str(define("good", good))).returncode == 0, outputs
    assert cli("task", "create", "--file", str(define("unset", unset))).returncode == 0, outputs

    zk = ZkStore(zk_address)
    zk.start()
    store = TaskStore(zk.client)
    manager = run_manager(
        zk_address, bootstrap,
        config=ManagerConfig(bootstrap=bootstrap, zookeeper=zk_address, port=0, sample_interval_ms=300,
                             alarm_interval_ms=300),
    )  # fmt: skip
    UserStore(manager.state.services.client).add("olivia", "operator-pw-1", "operator")
    api = httpx.Client(base_url=manager.url, timeout=60, auth=("olivia", "operator-pw-1"))
    answers: dict[str, str] = {}

    def get(path: str) -> Any:
        r = api.get(f"/api/v1{path}")
        assert r.status_code == 200, (path, r.text)
        answers[f"GET {path} #{len(answers)}"] = r.text
        return r.json()

    worker = start_worker(
        "ws1", bootstrap, zk_address, tmp_path, env={"SLUICE_SECRET_SHOP_SYNC_DB": db_secret},
        overrides={"secrets.dir": str(secrets_dir)},
    )  # fmt: skip
    try:
        # Plain text is refused by the API too (JSON and YAML), naming the field.
        for name, text, field in [
            ("plain", plain, "task.source.password"),
            ("url", plain_url, "task.target"),
        ]:
            r = api.post("/api/v1/tasks", content=text, headers={"content-type": "application/yaml"})
            answers[f"POST plain {name}"] = r.text
            assert r.status_code == 422 and r.json()["field"] == field, r.text
            assert "{file: /etc/sluice/secrets/shop" in r.json()["detail"], r.text
        doc = get("/tasks/sec")["definition"]
        r = api.put("/api/v1/tasks/sec", json={**doc, "source": {**doc["source"], "password": db_secret}})
        answers["PUT plain"] = r.text
        assert r.status_code == 422 and r.json()["field"] == "task.source.password", r.text

        # The task runs: its snapshot and a change after it reach the target.
        def applied() -> bool:
            return items_in_target(postgres_url) == items_in_source(mariadb, "sec1")

        wait_until(applied, 180, "the snapshot", interval_s=0.5)
        mariadb.execute("UPDATE items SET v = 20 WHERE id = 2", database="sec1")
        wait_until(applied, 120, "a change", interval_s=0.5)
        failed = wait_until(
            lambda: [a for a in store.alarms("sec-unset") if a["kind"] == "task-failed"], 120,
            "the task whose variable is unset to fail",
        )  # fmt: skip
        error = failed[0]["error"]
        assert (
            "task sec-unset" in error and "SLUICE_SECRET_SHOP_SYNC_UNSET" in error and "not set" in error
        ), error
        wait_until(lambda: (store.status("sec") or {}).get("lag_records") == 0, 120, "the lag to settle")
        wait_until(lambda: get("/tasks/sec/lag-history")["samples"], 60, "a lag sample")

        # Everything a person can read about the task, by every way there is.
        detail = get("/tasks/sec")
        assert detail["definition"]["source"]["password"] == {"env": "SLUICE_SECRET_SHOP_SYNC_DB"}, detail
        assert detail["definition"]["target"]["password"] == {"file": str(pg_file)}, detail
        assert detail["executions"] and detail["state"] == "running", detail
        for path in ("/tasks", "/tasks/sec-unset", "/tasks/sec/lag-history", "/alarms", "/overview", "/audit",
                     "/workers"):  # fmt: skip
            get(path)
        assert (
            "SLUICE_SECRET_SHOP_SYNC_UNSET"
            in answers[next(k for k in answers if k.startswith("GET /tasks/sec-unset"))]
        )
        for args in (("task", "list"), ("task", "status", "sec"), ("task", "status", "sec-unset")):
            assert cli(*args).returncode == 0, outputs
        status = outputs[next(k for k in outputs if k.startswith("task status sec #"))]
        assert "execution" in status and "postgresql://postgres@" in status, status
        znodes = znode_texts(zk.client)
        assert any("SLUICE_SECRET_SHOP_SYNC_DB" in z for z in znodes), "the definition holds the reference"
    finally:
        stop_worker(worker)
        api.close()
        manager.stop()
        zk.stop()

    worker_log = (tmp_path / "ws1.log").read_text()
    assert "event=plain_text_secret" not in worker_log
    shown = {
        **{f"cli: {k}": v for k, v in outputs.items()},
        **{f"api: {k}": v for k, v in answers.items()},
        **{f"znode: {z[:80]}": z for z in znodes},
        "manager log": "\n".join(process_logs.lines),
        "worker log": worker_log,
    }
    files = files_text(tmp_path)  # the secret file and the refused definitions are elsewhere
    leaks = {
        name: [where for where, text in shown.items() if secret in text]
        + [path for path, data in files.items() if secret.encode() in data]
        for name, secret in (("source password", db_secret), ("target password", pg_secret))
    }
    assert leaks == {"source password": [], "target password": []}, f"secrets shown or written: {leaks}"
