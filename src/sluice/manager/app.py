"""The manager's HTTP face: the REST API under /api/v1 (documented at /docs and /openapi.json),
the web console's static files, and /metrics for Prometheus.

Every endpoint but login and health needs credentials (a bearer token from login, or HTTP
Basic), /metrics too (a viewer's: it names groups and topics): without them it answers 401
before reading the request's body, so a request without valid credentials changes nothing.
Every password check, at login or by Basic credentials, is throttled per user name and per
address (`manager/throttle.py`): past a few failures each guess must wait, and a guess that must
wait is answered 429 without a check. Logout ends the token it is sent with. Roles: viewer
reads, operator acts on tasks, topics, groups and alarms, admin manages users, alarm rules and
webhooks. Every change is written to the audit log with who, what, when, and the state before
and after.

Handlers are plain `def`s: FastAPI runs them on its thread pool, and they call the blocking
service layer (`sluice.service`), the same functions the CLI calls.
"""

from __future__ import annotations

import base64
import binascii
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field

from sluice.manager.audit import AuditLog
from sluice.manager.auth import AuthError, Principal, UserError, UserStore
from sluice.manager.history import LagHistory
from sluice.manager.throttle import LoginThrottle, Throttled
from sluice.service import cluster as cluster_service
from sluice.service import groups as group_service
from sluice.service import tasks as task_service
from sluice.service import topics as topic_service
from sluice.service.context import Services
from sluice.service.errors import InvalidError, NotFoundError, ServiceError

STATIC = Path(__file__).parent / "static"
API = "/api/v1"


@dataclass
class ManagerState:
    """What the app's handlers share; everything in it is either a connection or a cache."""

    services: Services
    users: UserStore
    audit: AuditLog
    history: LagHistory
    token_ttl_s: int = 12 * 3600
    #: sluice.manager.alarms.store.AlarmStore, when alarms are wired in
    alarms: Any = None
    #: the alarm evaluator of this manager (is_leader tells which manager evaluates)
    evaluator: Any = None
    name: str = "manager"
    started: float = field(default_factory=time.time)
    metrics_registry: Any = None
    #: failed password checks per user name and per address (this manager's own count)
    throttle: LoginThrottle = field(default_factory=LoginThrottle)


# -- errors ---------------------------------------------------------------------------------------


class ApiError(Exception):
    def __init__(
        self, status: int, detail: str, field: str | None = None, headers: dict[str, str] | None = None
    ):
        super().__init__(detail)
        self.status, self.detail, self.field, self.headers = status, detail, field, headers


def _error(
    status: int, detail: str, field: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    body: dict[str, Any] = {"detail": detail}
    if field is not None:
        body["field"] = field
    return JSONResponse(body, status_code=status, headers=headers)


# -- request bodies (documented in the OpenAPI page) ----------------------------------------------


class Login(BaseModel):
    user: str
    password: str


class TopicCreate(BaseModel):
    name: str
    partitions: int = 1
    replication_factor: int = -1
    configs: dict[str, str] = Field(default_factory=dict)
    allow_single_replica: bool = False


class OffsetReset(BaseModel):
    topic: str
    #: "earliest", "latest" or an offset >= 0 (checked by the service, which names the field)
    to: Any


class Restart(BaseModel):
    from_position: str | None = None


class Snapshot(BaseModel):
    table: str
    #: a SQL condition on the source table, run with the task's source credentials
    where: str | None = None


class UserCreate(BaseModel):
    user: str
    password: str
    role: Literal["viewer", "operator", "admin"]


class UserChange(BaseModel):
    password: str | None = None
    role: Literal["viewer", "operator", "admin"] | None = None


_TASK_BODY = {
    "requestBody": {
        "required": True,
        "description": "A task definition, as for `sluice task create --file`: JSON, or YAML "
        "with Content-Type application/yaml",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "application/yaml": {"schema": {"type": "string"}},
        },
    }
}


# -- authentication (module level: FastAPI resolves these annotations by name) ---------------------


def check_password_throttled(request: Request, user: str, password: str) -> Principal:
    """`UserStore.authenticate`, if the throttle lets this attempt go ahead (else 429 with
    Retry-After, and no check made); AuthError for wrong credentials."""
    state: ManagerState = request.app.state.sluice
    try:
        attempt = state.throttle.begin(user, request.client.host if request.client else None)
    except Throttled as exc:
        raise ApiError(
            429,
            f"too many failed logins for this user name or from this address: {exc} (each failure "
            "past the first few doubles the wait)",
            headers={"Retry-After": str(math.ceil(exc.retry_after_s))},
        ) from None
    who = state.users.authenticate(user, password)
    state.throttle.succeeded(attempt)
    return who


def principal(request: Request) -> Principal:
    """Who sends the request: a bearer token from /login, or HTTP Basic; else 401."""
    users: UserStore = request.app.state.sluice.users
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    try:
        if scheme.lower() == "bearer" and value:
            return users.check_token(value.strip())
        if scheme.lower() == "basic" and value:
            try:
                user, _, password = base64.b64decode(value.strip()).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                raise AuthError("malformed Basic credentials") from None
            return check_password_throttled(request, user, password)
    except AuthError as exc:
        raise ApiError(401, str(exc), headers={"WWW-Authenticate": "Bearer"}) from None
    raise ApiError(
        401,
        "credentials required: log in (POST /api/v1/login) and send the token",
        headers={"WWW-Authenticate": "Bearer"},
    )


def _require(needed: str) -> Any:
    def check(who: Annotated[Principal, Depends(principal)]) -> Principal:
        if not who.can(needed):
            raise ApiError(403, f"{who.user} is a {who.role}; this needs the {needed} role")
        return who

    return check


Viewer = Annotated[Principal, Depends(_require("viewer"))]
Operator = Annotated[Principal, Depends(_require("operator"))]
Admin = Annotated[Principal, Depends(_require("admin"))]


def create_app(state: ManagerState) -> FastAPI:
    app = FastAPI(
        title="Sluice manager",
        version="1",
        description="Operate a Sluice cluster: brokers and partitions, topics, consumer groups, sync "
        "tasks and workers, alarms, users and the audit log. Authenticate with POST /api/v1/login "
        "and send `Authorization: Bearer <token>` (or HTTP Basic).",
    )
    app.state.sluice = state
    svc = state.services

    # -- error mapping ------------------------------------------------------------------------
    @app.exception_handler(ApiError)
    def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.detail, exc.field, exc.headers)

    @app.exception_handler(ServiceError)
    def _service_error(_: Request, exc: ServiceError) -> JSONResponse:
        return _error(exc.status, str(exc), exc.field)

    @app.exception_handler(RequestValidationError)
    def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(x) for x in first.get("loc", ()) if x not in ("body", "query", "path")]
        name = ".".join(loc) or "request"
        return _error(422, f"{name}: {first.get('msg', 'invalid')}", name)

    @app.exception_handler(Exception)
    def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        from kazoo.exceptions import ConnectionLoss, SessionExpiredError

        if isinstance(exc, (ConnectionLoss, SessionExpiredError, ConnectionError, TimeoutError)):
            return _error(503, f"the cluster did not answer ({type(exc).__name__}); try again shortly")
        return _error(500, f"internal error: {type(exc).__name__}: {exc}")

    def audit(who: Principal, action: str, target: str, before: Any = None, after: Any = None) -> None:
        state.audit.record(who.user, action, target, before, after)

    @app.post(f"{API}/login", tags=["auth"])
    def login(request: Request, body: Login) -> dict[str, Any]:
        """A bearer token for the user. Past a few failed checks of a user name or from an address,
        each attempt must wait (429 with Retry-After until then), the wait doubling per failure."""
        try:
            who = check_password_throttled(request, body.user, body.password)
        except AuthError as exc:
            raise ApiError(401, str(exc)) from None
        token, expires = state.users.issue_token(who, state.token_ttl_s)
        return {"token": token, "user": who.user, "role": who.role, "expires_at": expires}

    @app.post(f"{API}/logout", tags=["auth"])
    def logout(request: Request, who: Viewer) -> dict[str, Any]:
        """End the bearer token this request carries, on every manager of the cluster."""
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            raise ApiError(
                400,
                "logout ends a bearer token, and this request has none (HTTP Basic credentials are sent "
                "with every request: stop sending them instead)",
                field="authorization",
            )
        try:
            state.users.revoke_token(value.strip())
        except AuthError as exc:
            raise ApiError(401, str(exc), headers={"WWW-Authenticate": "Bearer"}) from None
        return {"user": who.user, "logged_out": True}

    @app.get(f"{API}/me", tags=["auth"])
    def me(who: Viewer) -> dict[str, Any]:
        return {"user": who.user, "role": who.role}

    @app.get(f"{API}/health", tags=["manager"])
    def health() -> dict[str, Any]:
        """Liveness without credentials: the manager serves and reaches ZooKeeper."""
        return {"status": "ok" if svc.zk.connected else "zookeeper-unreachable", "manager": state.name}

    # -- cluster ------------------------------------------------------------------------------
    def _alarms(states: tuple[str, ...]) -> list[dict[str, Any]]:
        if state.alarms is None:
            return []
        return [a for a in state.alarms.list() if a.get("state") in states]

    def _open_alarms_by_task(active: list[dict[str, Any]] | None = None) -> dict[str, int]:
        counts: dict[str, int] = {}
        for a in _alarms(("open", "acknowledged")) if active is None else active:
            subject = str(a.get("subject", ""))
            if subject.startswith("task:"):
                task_id = subject[5:].split(":", 1)[0]
                counts[task_id] = counts.get(task_id, 0) + 1
        return counts

    def _tasks(active_alarms: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        counts = _open_alarms_by_task(active_alarms)
        rows = task_service.list_tasks(svc)
        for row in rows:
            row["open_alarms"] = counts.get(row["id"], 0)
        return rows

    @app.get(f"{API}/cluster", tags=["cluster"])
    def cluster(_: Viewer) -> dict[str, Any]:
        """Brokers, the controller and its epoch, and every partition that is offline or
        under-replicated with the reason."""
        return cluster_service.cluster_view(svc)

    @app.get(f"{API}/overview", tags=["cluster"])
    def overview(_: Viewer) -> dict[str, Any]:
        """Everything the console's overview shows, in one call: the cluster, the tasks, open
        alarms, and one line for each thing that needs attention."""
        view = cluster_service.cluster_view(svc)
        alarms = _alarms(("open", "acknowledged"))
        tasks = _tasks(alarms)
        attention = []
        if view["controller"]["id"] < 0:
            attention.append("no active controller: leadership cannot change until one is elected")
        for b in view["brokers"]:
            if not b["alive"]:
                attention.append(f"broker {b['id']} is down (it holds replicas)")
        for p in view["problems"]:
            attention.append(f"partition {p['topic']}-{p['partition']} is {p['status']}: {p['reason']}")
        for t in tasks:
            if t["state"] in ("failing", "waiting"):
                attention.append(
                    f"task {t['id']} is {t['state']}" + (f": {t['error']}" if t["error"] else "")
                )
        for a in alarms:
            if a.get("state") == "open":
                attention.append(f"alarm: {a.get('summary')}")
        return {"cluster": view, "tasks": tasks, "alarms": alarms, "attention": attention,
                "updated_at": time.time()}  # fmt: skip

    # -- topics -------------------------------------------------------------------------------
    @app.get(f"{API}/topics", tags=["topics"])
    def topics(_: Viewer) -> list[dict[str, Any]]:
        return topic_service.list_topics(svc)

    @app.get(f"{API}/topics/{{name}}", tags=["topics"])
    def topic(name: str, _: Viewer) -> dict[str, Any]:
        return topic_service.describe_topic(svc, name)

    @app.get(f"{API}/topics/{{name}}/configs", tags=["topics"])
    def topic_configs(name: str, _: Viewer) -> dict[str, Any]:
        return {"name": name, "configs": topic_service.topic_configs(svc, name)}

    @app.post(f"{API}/topics", tags=["topics"], status_code=201)
    def create_topic(who: Operator, body: TopicCreate) -> dict[str, Any]:
        created = topic_service.create_topic(
            svc, body.name, body.partitions, body.replication_factor, body.configs,
            allow_single_replica=body.allow_single_replica,
        )  # fmt: skip
        audit(who, "topic.create", f"topic:{body.name}", None, created)
        return created

    @app.delete(f"{API}/topics/{{name}}", tags=["topics"])
    def delete_topic(name: str, who: Operator) -> dict[str, Any]:
        topic_service.refuse_internal(name)
        before = topic_service.topic_settings(svc, name)
        result = topic_service.delete_topic(svc, name)
        audit(who, "topic.delete", f"topic:{name}", before, None)
        return result

    # -- groups -------------------------------------------------------------------------------
    @app.get(f"{API}/groups", tags=["groups"])
    def groups(_: Viewer) -> list[dict[str, Any]]:
        return group_service.list_groups(svc)

    @app.get(f"{API}/groups/{{group}}", tags=["groups"])
    def group(group: str, _: Viewer) -> dict[str, Any]:
        return group_service.group_view(svc, group)

    @app.get(f"{API}/groups/{{group}}/lag-history", tags=["groups"])
    def group_lag_history(group: str, _: Viewer) -> dict[str, Any]:
        return {"group": group, "samples": state.history.group(group)}

    @app.post(f"{API}/groups/{{group}}/reset-offsets", tags=["groups"])
    def reset_offsets(group: str, who: Operator, body: OffsetReset) -> dict[str, Any]:
        before = group_service.group_view(svc, group)
        result = group_service.reset_group_offsets(svc, group, body.topic, body.to)
        audit(
            who, "group.reset-offsets", f"group:{group}",
            {str(p["partition"]): p["committed"] for p in before["partitions"] if p["topic"] == body.topic},
            result["offsets"],
        )  # fmt: skip
        return result

    # -- tasks --------------------------------------------------------------------------------
    async def _definition(request: Request) -> Any:
        raw = await request.body()
        if not raw.strip():
            raise InvalidError("task: the request has no task definition", field="task")
        text = raw.decode("utf-8", errors="replace")
        return task_service.parse_definition_text(text)

    @app.get(f"{API}/tasks", tags=["tasks"])
    def tasks(_: Viewer) -> list[dict[str, Any]]:
        return _tasks()

    @app.post(f"{API}/tasks", tags=["tasks"], status_code=201, openapi_extra=_TASK_BODY)
    async def create_task(request: Request, who: Operator) -> Any:
        spec = await _definition(request)
        from starlette.concurrency import run_in_threadpool

        created = await run_in_threadpool(task_service.create_task, svc, spec)
        await run_in_threadpool(
            audit, who, "task.create", f"task:{spec.id}", None, task_service.redacted_definition(spec)
        )
        return JSONResponse(created, status_code=201)

    @app.put(f"{API}/tasks/{{task_id}}", tags=["tasks"], openapi_extra=_TASK_BODY)
    async def update_task(task_id: str, request: Request, who: Operator) -> Any:
        spec = await _definition(request)
        from starlette.concurrency import run_in_threadpool

        def change() -> dict[str, Any]:
            task_service.check_same_id(spec, task_id)
            try:
                before = task_service.redacted_definition(svc.tasks.get(task_id))
            except KeyError:
                raise NotFoundError(f"no task {task_id!r}: create it first") from None
            updated = task_service.update_task(svc, spec, task_id)
            audit(who, "task.update", f"task:{task_id}", before, task_service.redacted_definition(spec))
            return updated

        return await run_in_threadpool(change)

    @app.get(f"{API}/tasks/{{task_id}}", tags=["tasks"])
    def task(task_id: str, _: Viewer) -> dict[str, Any]:
        detail = task_service.task_detail(svc, task_id)
        detail["open_alarms"] = _open_alarms_by_task().get(task_id, 0)
        return detail

    @app.get(f"{API}/tasks/{{task_id}}/lag-history", tags=["tasks"])
    def task_lag_history(task_id: str, _: Viewer) -> dict[str, Any]:
        return {"task": task_id, "samples": state.history.task(task_id)}

    def _control(who: Principal, task_id: str, action: str, **kw: Any) -> dict[str, Any]:
        before = task_service.task_summary(svc, task_id)
        fn = {"pause": task_service.pause_task, "resume": task_service.resume_task,
              "restart": task_service.restart_task}[action]  # fmt: skip
        after = fn(svc, task_id, **kw)
        keep = ("state", "epoch", "restarts")
        audit(who, f"task.{action}", f"task:{task_id}", {k: before[k] for k in keep},
              {**{k: after[k] for k in keep}, **kw})  # fmt: skip
        return after

    @app.post(f"{API}/tasks/{{task_id}}/pause", tags=["tasks"])
    def pause(task_id: str, who: Operator) -> dict[str, Any]:
        return _control(who, task_id, "pause")

    @app.post(f"{API}/tasks/{{task_id}}/resume", tags=["tasks"])
    def resume(task_id: str, who: Operator) -> dict[str, Any]:
        return _control(who, task_id, "resume")

    @app.post(f"{API}/tasks/{{task_id}}/restart", tags=["tasks"])
    def restart(task_id: str, who: Operator, body: Restart | None = None) -> dict[str, Any]:
        """Restart the execution under a new epoch; `from_position` restarts capture there."""
        return _control(who, task_id, "restart", from_position=body.from_position if body else None)

    @app.post(f"{API}/tasks/{{task_id}}/snapshot", tags=["tasks"])
    def snapshot(task_id: str, who: Operator, body: Snapshot) -> dict[str, Any]:
        """Re-snapshot one table of a running mysql/mariadb task while it streams; `where` (a SQL
        condition on the source table, run with the task's source credentials) limits the rows."""
        result = task_service.request_snapshot(svc, task_id, body.table, body.where)
        audit(who, "task.snapshot", f"task:{task_id}", None, result["snapshot"])
        return result

    @app.delete(f"{API}/tasks/{{task_id}}", tags=["tasks"])
    def delete_task(task_id: str, who: Operator) -> dict[str, Any]:
        try:
            before = task_service.redacted_definition(svc.tasks.get(task_id))
        except KeyError:
            raise NotFoundError(f"no task {task_id!r}") from None
        result = task_service.delete_task(svc, task_id)
        audit(who, "task.delete", f"task:{task_id}", before, None)
        return result

    # -- workers ------------------------------------------------------------------------------
    @app.get(f"{API}/workers", tags=["workers"])
    def workers(_: Viewer) -> dict[str, Any]:
        return group_service.workers(svc)

    # -- alarms -------------------------------------------------------------------------------
    def _alarm_store() -> Any:
        if state.alarms is None:
            raise ApiError(503, "alarms are not available on this manager")
        return state.alarms

    @app.get(f"{API}/alarms", tags=["alarms"])
    def alarms(
        _: Viewer,
        alarm_state: Annotated[
            Literal["open", "acknowledged", "resolved"] | None, Query(alias="state")
        ] = None,
    ) -> list[dict[str, Any]]:
        return list(_alarm_store().list(alarm_state))

    @app.post(f"{API}/alarms/{{alarm_id}}/acknowledge", tags=["alarms"])
    def acknowledge(alarm_id: str, who: Operator) -> dict[str, Any]:
        store = _alarm_store()
        try:
            before = store.get(alarm_id)
            after = store.acknowledge(alarm_id, who.user)
        except KeyError:
            raise NotFoundError(f"no alarm {alarm_id!r}") from None
        audit(who, "alarm.acknowledge", f"alarm:{alarm_id}", {"state": before.get("state")},
              {"state": after.get("state")})  # fmt: skip
        return dict(after)

    @app.get(f"{API}/alarms/rules", tags=["alarms"])
    def alarm_rules(_: Viewer) -> dict[str, Any]:
        from sluice.manager.alarms.rules import rules_to_doc

        return rules_to_doc(_alarm_store().rules())

    @app.put(f"{API}/alarms/rules", tags=["alarms"])
    def set_alarm_rules(who: Admin, body: dict[str, Any]) -> dict[str, Any]:
        from sluice.manager.alarms.rules import RulesError, rules_to_doc

        store = _alarm_store()
        before = rules_to_doc(store.rules())
        try:
            after = rules_to_doc(store.set_rules(body))
        except RulesError as exc:
            raise InvalidError(str(exc), field=getattr(exc, "field", None)) from None
        audit(who, "alarm.rules", "alarm-rules", before, after)
        return after

    @app.get(f"{API}/alarms/webhooks", tags=["alarms"])
    def webhooks(_: Admin) -> list[dict[str, Any]]:
        return list(_alarm_store().webhooks())

    @app.put(f"{API}/alarms/webhooks", tags=["alarms"])
    def set_webhooks(who: Admin, body: list[dict[str, Any]]) -> list[dict[str, Any]]:
        store = _alarm_store()
        before = store.webhooks()
        try:
            after = store.set_webhooks(body)
        except ValueError as exc:
            raise InvalidError(str(exc), field=getattr(exc, "field", None)) from None
        audit(who, "alarm.webhooks", "alarm-webhooks", before, after)
        return list(after)

    # -- users and audit ----------------------------------------------------------------------
    @app.get(f"{API}/users", tags=["users"])
    def users(_: Admin) -> list[dict[str, Any]]:
        return state.users.list()

    @app.post(f"{API}/users", tags=["users"], status_code=201)
    def add_user(who: Admin, body: UserCreate) -> dict[str, Any]:
        try:
            created = state.users.add(body.user, body.password, body.role)
        except UserError as exc:
            raise InvalidError(str(exc), field=exc.field) from None
        audit(who, "user.add", f"user:{body.user}", None, created)
        return created

    @app.patch(f"{API}/users/{{user}}", tags=["users"])
    def change_user(user: str, who: Admin, body: UserChange) -> dict[str, Any]:
        before = {u["user"]: u for u in state.users.list()}.get(user)
        if before is None:
            raise NotFoundError(f"no user {user!r}")
        try:
            after = state.users.update(user, password=body.password, role=body.role)
        except UserError as exc:
            raise InvalidError(str(exc), field=exc.field) from None
        audit(who, "user.change", f"user:{user}", before,
              {**after, "password_changed": body.password is not None})  # fmt: skip
        return after

    @app.delete(f"{API}/users/{{user}}", tags=["users"])
    def delete_user(user: str, who: Admin) -> dict[str, Any]:
        before = {u["user"]: u for u in state.users.list()}.get(user)
        if before is None:
            raise NotFoundError(f"no user {user!r}")
        if user == who.user:
            raise InvalidError("user: you cannot delete yourself; ask another admin", field="user")
        state.users.delete(user)
        audit(who, "user.delete", f"user:{user}", before, None)
        return {"deleted": user}

    @app.get(f"{API}/audit", tags=["audit"])
    def audit_log(_: Viewer, limit: Annotated[int, Query(ge=1, le=10_000)] = 200) -> list[dict[str, Any]]:
        return state.audit.entries(limit)

    # -- metrics and the console --------------------------------------------------------------
    @app.get("/metrics", include_in_schema=False)
    def metrics(_: Viewer) -> Response:
        """Prometheus's scrape, with a viewer's credentials (Basic, or a token); `metrics.port`
        serves it without, on `metrics.host` only."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(state.metrics_registry), media_type=CONTENT_TYPE_LATEST)

    if STATIC.is_dir():
        app.mount("/static", StaticFiles(directory=STATIC), name="static")

        @app.get("/", include_in_schema=False)
        def console() -> FileResponse:
            return FileResponse(STATIC / "index.html")

    return app
