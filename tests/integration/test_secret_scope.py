"""Secret references have a scope (issue 33, finding 1): a task's `{file: PATH}` may name only a
file under the secrets directory and `{env: NAME}` only a variable with the secrets prefix. An
operator of the manager used to be able to point a task at any file of the worker's host.

Reproduced before the fix, on a secured cluster: an operator's task whose target password is
`{file: <cluster>/zookeeper-auth.properties}` (the ZooKeeper digest credential every process of
the cluster uses) was accepted, and a worker running it would have sent that file's text as the
target's password:

    assert r.status_code == 422, r.text
    AssertionError: {"id":"exfil","source":"generator","target":"postgresql://x@127.0.0.1:1/db",
    "state":"waiting",...}
    assert 201 == 422
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from sluice.manager.auth import UserStore
from sluice.manager.config import ManagerConfig
from sluice.manager.server import run_manager
from sluice.ops import launcher
from sluice.security.secrets import DEFAULT_ENV_PREFIX, DEFAULT_SECRETS_DIR
from tests.support.cluster import TestCluster


def _task(task_id: str, password: Any) -> dict[str, Any]:
    return {
        "id": task_id,
        "source": {"kind": "generator"},
        "target": {"url": "postgresql://x@127.0.0.1:1/db", "password": password},
    }


def test_an_operator_cannot_point_a_task_at_a_file_or_variable_outside_the_scope(
    make_cluster: Callable[..., TestCluster], tmp_path: Path
) -> None:
    c = make_cluster(1, security="sasl_ssl")
    zk_file = Path(c.cluster.directory) / launcher.ZOOKEEPER_AUTH_FILE
    assert zk_file.is_file()
    config = ManagerConfig(
        bootstrap=c.bootstrap, zookeeper=c.zookeeper, zk_auth=c.cluster.zk_auth(),
        security=c.client_security(), port=0,
    )  # fmt: skip
    manager = run_manager(config.zookeeper, config.bootstrap, config=config, alarms=False)
    try:
        UserStore(manager.state.services.client).add("olivia", "operator-pw-1", "operator")
        api = httpx.Client(base_url=manager.url, timeout=60)
        r = api.post("/api/v1/login", json={"user": "olivia", "password": "operator-pw-1"})
        api.headers["Authorization"] = f"Bearer {r.json()['token']}"
        escapes = [
            ({"file": str(zk_file)}, "task.target.password.file", "secrets.dir"),
            # `..` cannot climb out of the directory, written any way
            ({"file": f"{DEFAULT_SECRETS_DIR}/../../..{zk_file}"}, "task.target.password.file", ".."),
            ({"file": f"{DEFAULT_SECRETS_DIR}/./shop"}, "task.target.password.file", "."),
            ({"file": DEFAULT_SECRETS_DIR}, "task.target.password.file", "secrets.dir"),
            ({"file": DEFAULT_SECRETS_DIR + "-other/shop"}, "task.target.password.file", "secrets.dir"),
            ({"env": "HOME"}, "task.target.password.env", "secrets.env.prefix"),
            ({"env": DEFAULT_ENV_PREFIX}, "task.target.password.env", "secrets.env.prefix"),
        ]
        for i, (ref, field, rule) in enumerate(escapes):
            r = api.post("/api/v1/tasks", json=_task(f"exfil-{i}", ref))
            assert r.status_code == 422, (ref, r.text)
            assert r.json()["field"] == field and rule in r.json()["detail"], (ref, r.text)
        assert api.get("/api/v1/tasks").json() == [], "a refused definition was stored"
        # the update path refuses too, and the same references inside the scope are accepted
        inside = _task("shop", {"file": f"{DEFAULT_SECRETS_DIR}/shop-pg"})
        r = api.post("/api/v1/tasks", json=inside)
        assert r.status_code == 201, r.text
        r = api.put("/api/v1/tasks/shop", json=_task("shop", {"file": str(zk_file)}))
        assert r.status_code == 422 and "secrets.dir" in r.json()["detail"], r.text
        r = api.put("/api/v1/tasks/shop", json=_task("shop", {"env": f"{DEFAULT_ENV_PREFIX}SHOP_PG"}))
        assert r.status_code == 200, r.text

        # The cluster's scope, set with the CLI (the cluster's ZooKeeper credential), is what the
        # manager checks from then on; a scope that would open everything is refused.
        env = {**os.environ, "COLUMNS": "200", "SLUICE_ZOOKEEPER_AUTH_FILE": str(zk_file)}

        def scope(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "sluice.ops.cli", "task", "secret-scope", *args, "--zookeeper",
                 c.zookeeper],
                capture_output=True, text=True, timeout=60, env=env,
            )  # fmt: skip

        shown = scope()
        assert (
            shown.stdout.strip()
            == f"secrets.dir={DEFAULT_SECRETS_DIR} secrets.env.prefix={DEFAULT_ENV_PREFIX}"
        )
        refused = scope("--dir", "/")
        assert refused.returncode == 2 and "--dir" in refused.stderr and "every file" in refused.stderr, (
            refused
        )
        own = tmp_path / "secrets"
        changed = scope("--dir", str(own), "--env-prefix", "SHOP_")
        assert changed.stdout.strip() == f"secrets.dir={own} secrets.env.prefix=SHOP_", changed
        r = api.post("/api/v1/tasks", json=_task("own", {"file": f"{own}/pg"}))
        assert r.status_code == 201, r.text
        for ref, says in (
            ({"file": f"{DEFAULT_SECRETS_DIR}/pg"}, str(own)),
            ({"env": "SLUICE_SECRET_PG"}, "SHOP_"),
        ):
            r = api.post("/api/v1/tasks", json=_task("old-scope", ref))
            assert r.status_code == 422 and says in r.json()["detail"], r.text
        r = api.post("/api/v1/tasks", json=_task("own-env", {"env": "SHOP_PG"}))
        assert r.status_code == 201, r.text
    finally:
        manager.stop()

    # The CLI refuses the same definition, naming the rule; nothing is stored.
    definition = tmp_path / "exfil.yaml"
    definition.write_text(
        f"id: exfil\nsource: {{kind: generator}}\n"
        f"target: {{url: 'postgresql://x@127.0.0.1:1/db', password: {{file: {zk_file}}}}}\n"
    )
    env = {**os.environ, "COLUMNS": "200", "SLUICE_ZOOKEEPER_AUTH_FILE": str(zk_file)}
    done = subprocess.run(
        [sys.executable, "-m", "sluice.ops.cli", "task", "create", "--file", str(definition),
         "--zookeeper", c.zookeeper],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 2, done
    assert "task.target.password.file" in done.stderr and "secrets.dir" in done.stderr, done.stderr
    listed = subprocess.run(
        [sys.executable, "-m", "sluice.ops.cli", "task", "list", "--zookeeper", c.zookeeper],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert listed.returncode == 0 and "exfil" not in listed.stdout, listed
