"""A stand-in for the manager's API with canned data, for the tests of the page itself
(escaping, roles, the unreachable banner, every route drawn): the contract of issue 16, served
with the real static files, in this process. The acceptance scenarios run against the real
manager (test_console.py)."""

from __future__ import annotations

import copy
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Header, HTTPException, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).resolve().parents[2] / "src" / "sluice" / "manager" / "static"
#: server text that must show as text: a topic name, a task error, an alarm summary
HOSTILE = '<img src=x onerror="window.__pwned=1">'

USERS = {"alice": ("alice-pw", "operator"), "victor": ("victor-pw", "viewer"), "root": ("root-pw", "admin")}


def _now() -> float:
    return time.time()


def canned() -> dict[str, Any]:
    now = _now()
    cluster = {
        "cluster_id": "c-7f3a",
        "controller": {"id": 1, "epoch": 4},
        "brokers": [
            {"id": 1, "host": "127.0.0.1", "port": 19092, "alive": True},
            {"id": 2, "host": "127.0.0.1", "port": 19093, "alive": False},
        ],
        "partitions": {"total": 12, "offline": 1, "under_replicated": 1},
        "problems": [
            {
                "topic": "orders",
                "partition": 3,
                "status": "offline",
                "leader": -1,
                "replicas": [2],
                "isr": [2],
                "reason": "its only replica, broker 2, is down; no data was lost on the other brokers "
                "because there are none: bring broker 2 back (drain single-replica partitions before "
                "stopping a broker)",
            },
            {
                "topic": "shop.changes",
                "partition": 0,
                "status": "under-replicated",
                "leader": 1,
                "replicas": [1, 2],
                "isr": [1],
                "reason": "replica(s) [2] out of sync; broker(s) [2] down",
            },
        ],
    }
    task = {
        "id": "shop-to-pg",
        "source": "mariadb 127.0.0.1:3306/shop",
        "target": "postgresql://sluice@127.0.0.1:5432/shop",
        "state": "running",
        "worker": "wa",
        "epoch": 7,
        "execution": "e-81c2",
        "lag_records": 1520,
        "lag_seconds": 42.5,
        "error": None,
        "open_alarms": 1,
    }
    hostile_task = {
        **task,
        "id": "gen-1",
        "state": "failing",
        "worker": None,
        "lag_records": None,
        "lag_seconds": None,
        "error": f"apply failed: {HOSTILE}",
        "open_alarms": 0,
    }
    alarm = {
        "id": "a-1",
        "rule": "task-lag",
        "subject": "task shop-to-pg",
        "severity": "warning",
        "state": "open",
        "summary": "task shop-to-pg is 1520 records behind (threshold 100)",
        "detail": "lag_records=1520 lag_seconds=42.5",
        "raised_at": now - 95,
        "updated_at": now - 5,
        "acknowledged_by": None,
        "acknowledged_at": None,
        "resolved_at": None,
        "notifications": [
            {
                "webhook": "http://127.0.0.1:9/hook",
                "event": "raised",
                "at": now - 94,
                "ok": True,
                "attempts": 1,
                "error": None,
            }
        ],
    }
    resolved = {
        **alarm,
        "id": "a-0",
        "state": "resolved",
        "severity": "critical",
        "rule": "partition-offline",
        "subject": "partition orders[1]",
        "summary": HOSTILE,
        "raised_at": now - 4000,
        "resolved_at": now - 3000,
    }
    return {
        "cluster": cluster,
        "tasks": {"shop-to-pg": task, "gen-1": hostile_task},
        "alarms": [alarm, resolved],
        "topics": [
            {
                "name": "orders",
                "partitions": 4,
                "replication_factor": 1,
                "internal": False,
                "offline": 1,
                "under_replicated": 0,
            },
            {
                "name": "shop.changes",
                "partitions": 3,
                "replication_factor": 2,
                "internal": False,
                "offline": 0,
                "under_replicated": 1,
            },
            {
                "name": HOSTILE,
                "partitions": 1,
                "replication_factor": 1,
                "internal": False,
                "offline": 0,
                "under_replicated": 0,
            },
            {
                "name": "__consumer_offsets",
                "partitions": 4,
                "replication_factor": 2,
                "internal": True,
                "offline": 0,
                "under_replicated": 0,
            },
        ],
        "audit": [],
        "down": False,
    }


class Stub:
    def __init__(self) -> None:
        self.data = canned()
        self.tokens: dict[str, tuple[str, str]] = {}
        self.lock = threading.Lock()

    def who(self, authorization: str | None) -> tuple[str, str]:
        token = (authorization or "").removeprefix("Bearer ")
        if token not in self.tokens:
            raise HTTPException(401, "log in first")
        return self.tokens[token]

    def operator(self, authorization: str | None) -> str:
        user, role = self.who(authorization)
        if role == "viewer":
            raise HTTPException(403, f"{user} is a viewer; this needs the operator role")
        return user

    def audit(self, user: str, action: str, target: str, before: Any, after: Any) -> None:
        self.data["audit"].insert(
            0,
            {
                "id": len(self.data["audit"]) + 1,
                "at": _now(),
                "user": user,
                "action": action,
                "target": target,
                "before": before,
                "after": after,
            },
        )


def make_app(stub: Stub) -> FastAPI:
    app = FastAPI()
    d = stub.data

    @app.middleware("http")
    async def down(request: Request, call_next: Any) -> Any:
        if d["down"] and request.url.path.startswith("/api/"):
            return JSONResponse({"detail": "stub is down"}, status_code=503)
        return await call_next(request)

    @app.exception_handler(HTTPException)
    async def detail(_: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)

    @app.get("/")
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.post("/api/v1/login")
    def login(body: dict[str, str]) -> dict[str, Any]:
        user = body.get("user", "")
        if USERS.get(user, ("",))[0] != body.get("password") or not user:
            raise HTTPException(401, "wrong user or password")
        token = secrets.token_hex(8)
        stub.tokens[token] = (user, USERS[user][1])
        return {"token": token, "user": user, "role": USERS[user][1], "expires_at": _now() + 3600}

    @app.post("/api/v1/logout")
    def logout(authorization: str | None = Header(None)) -> dict[str, Any]:
        user, _ = stub.who(authorization)
        stub.tokens.pop((authorization or "").partition(" ")[2], None)
        return {"user": user, "logged_out": True}

    @app.get("/api/v1/me")
    def me(authorization: str | None = Header(None)) -> dict[str, str]:
        user, role = stub.who(authorization)
        return {"user": user, "role": role}

    def summaries() -> list[dict[str, Any]]:
        return list(d["tasks"].values())

    def active_alarms() -> list[dict[str, Any]]:
        return [a for a in d["alarms"] if a["state"] != "resolved"]

    @app.get("/api/v1/overview")
    def overview(authorization: str | None = Header(None)) -> dict[str, Any]:
        stub.who(authorization)
        c = d["cluster"]
        attention = [
            f"partition {p['topic']}[{p['partition']}] is {p['status']}: {p['reason']}" for p in c["problems"]
        ]
        attention += [f"broker {b['id']} is down" for b in c["brokers"] if not b["alive"]]
        attention += [
            f"task {t['id']} is failing: {t['error']}" for t in summaries() if t["state"] == "failing"
        ]
        attention += [f"alarm: {a['summary']}" for a in active_alarms()]
        return {
            "cluster": c,
            "tasks": summaries(),
            "alarms": active_alarms(),
            "attention": attention,
            "updated_at": _now(),
        }

    @app.get("/api/v1/cluster")
    def cluster(authorization: str | None = Header(None)) -> dict[str, Any]:
        stub.who(authorization)
        return dict(d["cluster"])

    @app.get("/api/v1/topics")
    def topics(authorization: str | None = Header(None)) -> list[dict[str, Any]]:
        stub.who(authorization)
        return list(d["topics"])

    @app.get("/api/v1/topics/{name}")
    def topic(name: str, authorization: str | None = Header(None)) -> dict[str, Any]:
        stub.who(authorization)
        t = next((t for t in d["topics"] if t["name"] == name), None)
        if t is None:
            raise HTTPException(404, f"topic {name} does not exist")
        parts = [
            {
                "partition": p,
                "leader": 1,
                "replicas": [1],
                "isr": [1],
                "log_start": 0,
                "log_end": 100 * p,
                "status": "ok",
                "reason": "",
            }
            for p in range(t["partitions"])
        ]
        return {
            "name": name,
            "internal": t["internal"],
            "partitions": parts,
            "configs": {"retention.ms": "604800000"},
        }

    @app.get("/api/v1/groups")
    def groups(authorization: str | None = Header(None)) -> list[dict[str, Any]]:
        stub.who(authorization)
        return [
            {
                "group": "sluice-apply-shop-to-pg",
                "state": "Stable",
                "protocol_type": "consumer",
                "coordinator": 1,
                "members": 1,
                "total_lag": 1520,
            }
        ]

    @app.get("/api/v1/groups/{group}")
    def group(group: str, authorization: str | None = Header(None)) -> dict[str, Any]:
        stub.who(authorization)
        return {
            "group": group,
            "state": "Stable",
            "protocol_type": "consumer",
            "protocol": "range",
            "coordinator": 1,
            "members": [
                {
                    "member_id": "m-1",
                    "client_id": "apply",
                    "host": "/127.0.0.1",
                    "assignment": [["shop.changes", 0], ["shop.changes", 1]],
                }
            ],
            "partitions": [
                {
                    "topic": "shop.changes",
                    "partition": p,
                    "committed": 100,
                    "end": 600 + p,
                    "lag": 500 + p,
                    "member": "m-1",
                }
                for p in range(3)
            ],
            "total_lag": 1503,
        }

    @app.get("/api/v1/groups/{group}/lag-history")
    def group_lag(group: str, authorization: str | None = Header(None)) -> dict[str, Any]:
        stub.who(authorization)
        now = _now()
        return {"samples": [{"t": now - 300 + 5 * i, "lag": (i * 37) % 900} for i in range(60)]}

    @app.post("/api/v1/groups/{group}/reset-offsets")
    def reset(group: str, body: dict[str, Any], authorization: str | None = Header(None)) -> dict[str, Any]:
        stub.audit(stub.operator(authorization), "group.reset-offsets", group, None, body)
        return {"offsets": {"0": 0, "1": 0, "2": 0}}

    @app.get("/api/v1/tasks")
    def tasks(authorization: str | None = Header(None)) -> list[dict[str, Any]]:
        stub.who(authorization)
        return summaries()

    def task_or_404(task_id: str) -> dict[str, Any]:
        if task_id not in d["tasks"]:
            raise HTTPException(404, f"task {task_id} does not exist")
        return dict(d["tasks"][task_id])

    @app.get("/api/v1/tasks/{task_id}")
    def task(task_id: str, authorization: str | None = Header(None)) -> dict[str, Any]:
        stub.who(authorization)
        now = _now()
        return {
            **task_or_404(task_id),
            "definition": {
                "id": task_id,
                "source": {"kind": "mariadb", "password": {"env": "SHOP_DB_PASSWORD"}, "note": HOSTILE},
                "target": {
                    "url": "postgresql://sluice@127.0.0.1:5432/shop",
                    "password": {"file": "/run/secrets/shop-pg"},
                },
                "tables": ["orders"],
            },
            "captured_position": "mysql-bin.000003:1234",
            "applied_offsets": {"shop.changes[0]": 88},
            "updated": now - 1,
            "executions": [
                {
                    "execution": "e-81c2",
                    "epoch": 7,
                    "worker": "wa",
                    "started": now - 600,
                    "ended": None,
                    "outcome": None,
                    "error": None,
                },
                {
                    "execution": "e-11aa",
                    "epoch": 6,
                    "worker": "wb",
                    "started": now - 900,
                    "ended": now - 600,
                    "outcome": "failed",
                    "error": HOSTILE,
                },
            ],
            "events": [{"kind": "paused", "at": now - 700, "by": "alice"}],
        }

    @app.get("/api/v1/tasks/{task_id}/lag-history")
    def task_lag(task_id: str, authorization: str | None = Header(None)) -> dict[str, Any]:
        stub.who(authorization)
        now = _now()
        return {
            "samples": [
                {"t": now - 300 + 5 * i, "lag_records": 20 * i, "lag_seconds": i / 2} for i in range(60)
            ]
        }

    def control(task_id: str, authorization: str | None, action: str, new_state: str) -> dict[str, Any]:
        user = stub.operator(authorization)
        with stub.lock:
            before = task_or_404(task_id)
            d["tasks"][task_id]["state"] = new_state
            stub.audit(user, f"task.{action}", task_id, {"state": before["state"]}, {"state": new_state})
        return task_or_404(task_id)

    @app.post("/api/v1/tasks/{task_id}/pause")
    def pause(task_id: str, authorization: str | None = Header(None)) -> dict[str, Any]:
        return control(task_id, authorization, "pause", "paused")

    @app.post("/api/v1/tasks/{task_id}/resume")
    def resume(task_id: str, authorization: str | None = Header(None)) -> dict[str, Any]:
        return control(task_id, authorization, "resume", "running")

    @app.post("/api/v1/tasks/{task_id}/restart")
    def restart(task_id: str, authorization: str | None = Header(None)) -> dict[str, Any]:
        return control(task_id, authorization, "restart", "running")

    @app.delete("/api/v1/tasks/{task_id}")
    def delete_task(task_id: str, authorization: str | None = Header(None)) -> dict[str, Any]:
        user = stub.operator(authorization)
        stub.audit(user, "task.delete", task_id, task_or_404(task_id), None)
        del d["tasks"][task_id]
        return {"deleted": task_id}

    @app.get("/api/v1/workers")
    def workers(authorization: str | None = Header(None)) -> dict[str, Any]:
        stub.who(authorization)
        return {
            "group": "sluice-workers",
            "members": [{"worker": "wa", "member_id": "wa-1", "host": "/127.0.0.1", "tasks": ["shop-to-pg"]}],
        }

    @app.get("/api/v1/alarms")
    def alarms(state: str | None = None, authorization: str | None = Header(None)) -> list[dict[str, Any]]:
        stub.who(authorization)
        return [a for a in d["alarms"] if state is None or a["state"] == state]

    @app.post("/api/v1/alarms/{alarm_id}/acknowledge")
    def acknowledge(alarm_id: str, authorization: str | None = Header(None)) -> dict[str, Any]:
        user = stub.operator(authorization)
        alarm = next((a for a in d["alarms"] if a["id"] == alarm_id), None)
        if alarm is None:
            raise HTTPException(404, f"alarm {alarm_id} does not exist")
        before = copy.deepcopy(alarm)
        alarm.update(state="acknowledged", acknowledged_by=user, acknowledged_at=_now())
        stub.audit(user, "alarm.acknowledge", alarm_id, {"state": before["state"]}, {"state": "acknowledged"})
        return alarm

    @app.get("/api/v1/audit")
    def audit(limit: int = 50, authorization: str | None = Header(None)) -> list[dict[str, Any]]:
        stub.who(authorization)
        return d["audit"][:limit]

    return app


@contextmanager
def serve_stub() -> Iterator[tuple[str, Stub]]:
    """The stub on 127.0.0.1 (a free port), in a thread; yields its URL and its state."""
    stub = Stub()
    server = uvicorn.Server(uvicorn.Config(make_app(stub), host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, name="stub-api", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not (server.started and server.servers):
        assert time.monotonic() < deadline and thread.is_alive(), "the stub API did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", stub
    finally:
        server.should_exit = True
        thread.join(10)
