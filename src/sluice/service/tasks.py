"""Sync tasks: define (the same validation as `sluice task create`, errors naming the field),
pause, resume, restart (optionally from a source position), re-snapshot a table, delete, and
their status: epoch, execution, worker, captured position, applied offsets, lag, execution
history and events."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from sluice.service.context import Services
from sluice.service.errors import ConflictError, InvalidError, NotFoundError
from sluice.sync.tasks import (
    DATABASE_SOURCES,
    Control,
    TaskNotFoundError,
    TaskSpec,
    TaskSpecError,
    check_scope,
    parse_spec,
    redact,
)

#: a task whose last failure is this recent, and that has no running execution, is "failing"
FAILING_WINDOW_S = 120.0


def _field_of(message: str) -> str:
    head = message.split(":", 1)[0]
    return head if head.startswith("task") and " " not in head else "task"


def parse_definition(doc: Any) -> TaskSpec:
    """A validated task definition from a mapping (JSON or YAML parsed), or InvalidError whose
    `field` names the bad field (`task.source.port`)."""
    try:
        return parse_spec(doc)
    except TaskSpecError as exc:
        raise InvalidError(str(exc), field=_field_of(str(exc))) from None
    except TypeError as exc:  # a field of the wrong shape that the dataclass itself refused
        raise InvalidError(f"task: {exc}", field="task") from None


def parse_definition_text(text: str, what: str = "task definition") -> TaskSpec:
    """A definition from YAML (JSON is YAML too)."""
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidError(f"{what} is not valid YAML or JSON: {exc}", field="task") from None
    return parse_definition(doc)


def redacted_definition(spec: TaskSpec) -> dict[str, Any]:
    """The definition as the API and the CLI show it: secrets as their references
    (`{"env": "SLUICE_SECRET_SHOP_DB"}`), plain text of a definition stored before references as ***.
    Saved back as it is, it is accepted, unless it holds *** (refused, naming the field)."""
    return spec.to_doc(shown=True)


def _spec(svc: Services, task_id: str) -> TaskSpec:
    try:
        return svc.tasks.get(task_id)
    except TaskNotFoundError:
        raise NotFoundError(f"no task {task_id!r}") from None


def check_secret_scope(svc: Services, spec: TaskSpec) -> None:
    """InvalidError naming the field and the rule unless every secret reference of `spec` is in
    the cluster's secret scope (`TaskStore.secret_scope`): a `{file:}` under its directory, an
    `{env:}` with its prefix. Each worker checks its own scope again when it resolves them."""
    try:
        check_scope(spec, svc.tasks.secret_scope())
    except TaskSpecError as exc:
        raise InvalidError(str(exc), field=_field_of(str(exc))) from None


def create_task(svc: Services, spec: TaskSpec) -> dict[str, Any]:
    check_secret_scope(svc, spec)
    try:
        svc.tasks.create(spec)
    except TaskSpecError as exc:
        raise ConflictError(str(exc), field=_field_of(str(exc))) from None
    return task_summary(svc, spec.id)


def check_same_id(spec: TaskSpec, task_id: str | None) -> None:
    if task_id is not None and spec.id != task_id:
        raise InvalidError(f"task.id: {spec.id!r} does not match the task being updated ({task_id!r})",
                           field="task.id")  # fmt: skip


def update_task(svc: Services, spec: TaskSpec, task_id: str | None = None) -> dict[str, Any]:
    """Replace a task's definition; its execution restarts with it under a new epoch. A definition
    holds references, never secrets, so one read back from the API can be saved as it is.

    Tables it adds to a mysql/mariadb task are snapshotted while the task streams: a re-snapshot
    request for each goes into the same control update as the restart."""
    from sluice.sync.sources.resnapshot import new_request

    check_same_id(spec, task_id)
    check_secret_scope(svc, spec)
    try:
        before = svc.tasks.get(spec.id)
        added = [t for t in spec.tables if t not in before.tables] if _resnapshots(spec) else []
        svc.tasks.update(spec, [new_request(t) for t in added])
    except TaskNotFoundError:
        raise NotFoundError(f"no task {spec.id!r}: create it first") from None
    return task_summary(svc, spec.id)


def _resnapshots(spec: TaskSpec) -> bool:
    """Whether the task's capture serves re-snapshot requests (a database source's does)."""
    return spec.source.kind in DATABASE_SOURCES


def request_snapshot(
    svc: Services,
    task_id: str,
    table: str,
    where: str | None = None,
    *,
    keys: list[dict[str, Any]] | None = None,
    delete_absent: bool = False,
) -> dict[str, Any]:
    """Ask the task's running capture to read `table` again (only its rows matching `where`, a
    SQL condition on the source table run with the task's source credentials, or only `keys`)
    while it goes on streaming; returns the request (its id names it in the capture's log)."""
    from sluice.sync.sources.resnapshot import new_request

    spec = _spec(svc, task_id)
    if not _resnapshots(spec):
        raise InvalidError(f"task {task_id!r} has a {spec.source.kind} source: only mysql, mariadb and "
                           "postgresql tasks can re-snapshot a table", field="table")  # fmt: skip
    if table not in spec.tables:
        raise InvalidError(
            f"table: {table!r} is not one of task {task_id!r}'s tables ({', '.join(spec.tables)}); "
            "to capture it, add it to the task's tables with `sluice task update --file` (an added table is "
            "snapshotted while the task streams)",
            field="table",
        )
    if where is not None and (not isinstance(where, str) or not where.strip() or ";" in where):
        raise InvalidError("where: must be one SQL condition on the source table, e.g. \"id > 100\"",
                           field="where")  # fmt: skip
    request = new_request(table, where=where, keys=keys, delete_absent=delete_absent)
    try:
        svc.tasks.add_snapshots(task_id, [request])
    except TaskNotFoundError:
        raise NotFoundError(f"no task {task_id!r}") from None
    return {"task": task_id, "snapshot": request}


def _state(status: dict[str, Any] | None, paused: bool, events: list[dict[str, Any]], now: float) -> str:
    if paused:
        return "paused"
    if status and status.get("error"):
        return "failing"
    if status:
        return "running"
    failed = [e for e in events if e.get("kind") == "task-failed"]
    if failed and now - float(failed[-1].get("at") or 0) < FAILING_WINDOW_S:
        return "failing"
    return "waiting"


def failures_in_a_row(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The newest run of `task-failed` alarms, oldest first: attempts 1, 2, ... n. A worker counts
    a task's failures in a row, each retry waiting about twice as long as the one before, and
    counts from 1 again once an execution commits a batch (sync/backoff.py), or when the task
    moves to another worker; [] when the task never failed."""
    failed = [e for e in events if e.get("kind") == "task-failed" and isinstance(e.get("attempts"), int)]
    run: list[dict[str, Any]] = []
    for alarm in reversed(failed):
        if run and alarm["attempts"] != run[-1]["attempts"] - 1:
            break
        run.append(alarm)
        if alarm["attempts"] <= 1:
            break
    return run[::-1]


@dataclass(frozen=True, slots=True)
class _TaskRead:
    """What ZooKeeper holds for one task, read once per call."""

    spec: TaskSpec
    status: dict[str, Any]
    control: Control
    events: list[dict[str, Any]]
    latest_epoch: int


def _read(svc: Services, task_id: str) -> _TaskRead:
    spec = _spec(svc, task_id)
    try:
        status = svc.tasks.status(task_id)
        control = svc.tasks.control(task_id)
        events = svc.tasks.alarms(task_id)
    except TaskNotFoundError:
        raise NotFoundError(f"no task {task_id!r}") from None
    except Exception as exc:
        if "NoNode" in type(exc).__name__:  # deleted while we read it
            raise NotFoundError(f"no task {task_id!r}") from None
        raise
    return _TaskRead(spec, status or {}, control, events, svc.tasks.epoch(task_id))


def _summary(t: _TaskRead, open_alarms: int = 0) -> dict[str, Any]:
    status = t.status
    last_error = status.get("error")
    if not last_error:
        failed = [e for e in t.events if e.get("kind") == "task-failed"]
        last_error = failed[-1].get("error") if failed and not status else None
    return {
        "id": t.spec.id,
        "source": t.spec.source.kind,
        "target": redact(t.spec.target),
        "topics": t.spec.topics(),
        "state": _state(status or None, t.control.paused, t.events, time.time()),
        "worker": status.get("worker"),
        "epoch": status.get("epoch") or t.latest_epoch,
        "latest_epoch": t.latest_epoch,
        "execution": status.get("execution"),
        "lag_records": status.get("lag_records"),
        "lag_seconds": status.get("lag_seconds"),
        "error": last_error,
        "restarts": t.control.restarts,
        "open_alarms": open_alarms,
    }


def task_summary(svc: Services, task_id: str, *, open_alarms: int = 0) -> dict[str, Any]:
    return _summary(_read(svc, task_id), open_alarms)


def list_tasks(svc: Services) -> list[dict[str, Any]]:
    out = []
    for task_id in svc.tasks.ids():
        try:
            out.append(task_summary(svc, task_id))
        except NotFoundError:  # deleted while listing
            continue
    return out


def task_detail(svc: Services, task_id: str) -> dict[str, Any]:
    t = _read(svc, task_id)
    return {
        **_summary(t),
        "definition": redacted_definition(t.spec),
        # a definition stored before references, still run as it is: update it with references
        "plain_text_secrets": t.spec.plain_text_secrets(),
        "captured_position": t.status.get("captured_position"),
        # MySQL/MariaDB: the binlog file a restart needs, and the oldest the server still has
        "needed_binlog": t.status.get("needed_binlog"),
        "oldest_binlog": t.status.get("oldest_binlog"),
        # PostgreSQL: the WAL the task's slot holds on the source, and the server's word on it
        "pg_wal_retained_bytes": t.status.get("pg_wal_retained_bytes"),
        "slot_wal_status": t.status.get("slot_wal_status"),
        "applied_offsets": t.status.get("applied_offsets"),
        "started": t.status.get("started"),
        "updated": t.status.get("updated"),
        "control": asdict(t.control),
        "executions": svc.tasks.executions(task_id),
        "events": t.events[-50:],
        "failures_in_a_row": failures_in_a_row(t.events),
    }


def set_control(svc: Services, task_id: str, **changes: Any) -> dict[str, Any]:
    _spec(svc, task_id)
    try:
        if changes.pop("restart", False):
            changes["restarts"] = svc.tasks.control(task_id).restarts + 1
        svc.tasks.set_control(task_id, **changes)
    except TaskNotFoundError:
        raise NotFoundError(f"no task {task_id!r}") from None
    return task_summary(svc, task_id)


def pause_task(svc: Services, task_id: str) -> dict[str, Any]:
    return set_control(svc, task_id, paused=True)


def resume_task(svc: Services, task_id: str) -> dict[str, Any]:
    return set_control(svc, task_id, paused=False)


def restart_task(svc: Services, task_id: str, from_position: str | None = None) -> dict[str, Any]:
    """Restart the execution under a new epoch; with a position, capture from there."""
    if from_position is not None and (not isinstance(from_position, str) or not from_position.strip()):
        raise InvalidError("from_position: must be a source position such as mysql-bin.000003:4",
                           field="from_position")  # fmt: skip
    return set_control(svc, task_id, restart=True, from_position=from_position)


def delete_task(svc: Services, task_id: str) -> dict[str, Any]:
    """Remove the task; a PostgreSQL source's slot and publication go with it when the task
    created them (`source_objects`), never ones it did not."""
    try:
        spec = svc.tasks.get(task_id)
        created = svc.tasks.source_objects(task_id) if spec.source.kind == "postgresql" else {}
        svc.tasks.delete(task_id)
    except TaskNotFoundError:
        raise NotFoundError(f"no task {task_id!r}") from None
    out: dict[str, Any] = {"deleted": task_id}
    if spec.source.kind == "postgresql":
        out["source_objects"] = _drop_source_objects(svc, spec, created)
    return out


def _drop_source_objects(svc: Services, spec: TaskSpec, created: dict[str, str]) -> list[str]:
    from sluice.security.secrets import SecretError
    from sluice.sync.sources.mysql_base import CaptureError
    from sluice.sync.sources.postgresql import drop_objects
    from sluice.sync.tasks import resolved

    try:
        source = resolved(spec, svc.tasks.secret_scope()).source
        return drop_objects(source, spec.id, created)
    except (SecretError, CaptureError) as exc:
        names = ", ".join(f"{k} {v}" for k, v in sorted(created.items())) or "none"
        return [f"action=left error={exc!r} created={names!r} (drop them on the source by hand)"]
