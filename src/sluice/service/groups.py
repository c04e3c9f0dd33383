"""Consumer groups (members, assignment, committed offsets, lag; reset) and the sync workers'
group (members and the tasks each runs), over the brokers' group APIs."""

from __future__ import annotations

from typing import Any

import orjson

from sluice.service.admin_client import AdminClient, AdminError
from sluice.service.context import Services
from sluice.service.errors import ConflictError, InvalidError, NotFoundError, UnavailableError
from sluice.service.group_view import GroupView, describe_group, reset_offsets


def _view_dict(view: GroupView) -> dict[str, Any]:
    return {
        "group": view.group_id,
        "state": view.state,
        "protocol_type": view.protocol_type,
        "protocol": view.protocol,
        "coordinator": view.coordinator,
        "members": [
            {
                "member_id": m.member_id,
                "client_id": m.client_id,
                "host": m.client_host,
                "assignment": [[t, p] for t, p in m.assignment],
            }
            for m in view.members
        ],
        "partitions": [
            {
                "topic": r.topic,
                "partition": r.partition,
                "committed": r.committed if r.committed >= 0 else None,
                "end": r.end if r.end >= 0 else None,
                "lag": r.lag,
                "member": r.member,
            }
            for r in view.partitions
        ],
        "total_lag": view.total_lag,
    }


def group_view(svc: Services, group: str) -> dict[str, Any]:
    try:
        view = describe_group(svc.bootstrap, group, svc.security)
    except AdminError as exc:
        if "does not exist" in str(exc):
            raise NotFoundError(str(exc)) from None
        raise UnavailableError(str(exc)) from None
    except (OSError, TimeoutError) as exc:
        raise UnavailableError(f"cannot describe group {group!r}: {exc}") from None
    return _view_dict(view)


def list_groups(svc: Services, *, with_lag: bool = True) -> list[dict[str, Any]]:
    """Every group any broker coordinates; with each one's member count and total lag
    (one describe per group: fine for the tens of groups a cluster has)."""
    try:
        # The admin client's own patience: a broker that is killed refuses the connection at once
        # (skipped, see AdminClient.list_groups), but one starved of CPU for a few seconds is alive,
        # and with 5 s its groups were left out of the list (seen under the test suite's load).
        with AdminClient(svc.bootstrap, security=svc.security) as admin:
            groups = admin.list_groups()
    except (AdminError, OSError, TimeoutError) as exc:
        raise UnavailableError(f"cannot list groups: {exc}") from None
    out = []
    for g in groups:
        row: dict[str, Any] = {
            "group": g["group_id"], "state": g["group_state"], "protocol_type": g["protocol_type"],
            "coordinator": g["coordinator"], "members": None, "total_lag": None,
        }  # fmt: skip
        if with_lag:
            try:
                view = describe_group(svc.bootstrap, g["group_id"], svc.security)
                row["members"] = len(view.members)
                row["total_lag"] = view.total_lag if view.protocol_type in ("consumer", "") else None
                row["state"] = view.state
            except Exception:  # gone or its coordinator moving: listed without figures
                pass
        out.append(row)
    return out


def group_lags(svc: Services) -> dict[tuple[str, str, int], int]:
    """(group, topic, partition) -> lag in records, for every consumer group: what the manager
    samples for its charts and exports as `sluice_group_lag_records`."""
    out: dict[tuple[str, str, int], int] = {}
    for g in list_groups(svc, with_lag=False):
        if g["protocol_type"] not in ("consumer", ""):
            continue
        try:
            view = describe_group(svc.bootstrap, g["group"], svc.security)
        except Exception:
            continue
        for p in view.partitions:
            if p.lag is not None:
                out[(g["group"], p.topic, p.partition)] = p.lag
    return out


def reset_group_offsets(svc: Services, group: str, topic: str, to: Any) -> dict[str, Any]:
    """Set the group's committed offsets for `topic` to "earliest", "latest" or an offset
    (clamped into the log). Refused while the group has members."""
    if isinstance(to, bool) or not (to in ("earliest", "latest") or (isinstance(to, int) and to >= 0)):
        raise InvalidError(f'to: must be "earliest", "latest" or an offset >= 0, not {to!r}', field="to")
    if not isinstance(topic, str) or not topic:
        raise InvalidError("topic: required", field="topic")
    try:
        result = reset_offsets(svc.bootstrap, group, topic, to, svc.security)
    except AdminError as exc:
        text = str(exc)
        if "active member" in text:
            raise ConflictError(text) from None
        if "does not exist" in text:
            raise NotFoundError(text) from None
        raise UnavailableError(text) from None
    return {"group": group, "topic": topic, "offsets": {str(p): o for p, o in sorted(result.items())}}


def workers(svc: Services) -> dict[str, Any]:
    """The worker group's members and the tasks each runs now (from their JoinGroup metadata)
    and was assigned (from the leader's assignment)."""
    from sluice.service.group_view import _describe

    group = svc.worker_group
    try:
        with AdminClient(svc.bootstrap, timeout_s=5.0, security=svc.security) as admin:
            g = _describe(admin, group)
    except (AdminError, OSError, TimeoutError) as exc:
        raise UnavailableError(f"cannot describe the worker group {group!r}: {exc}") from None
    members = []
    for m in g["members"]:
        try:
            meta = orjson.loads(bytes(m["member_metadata"])) if m["member_metadata"] else {}
        except orjson.JSONDecodeError:
            meta = {}
        try:
            assigned = orjson.loads(bytes(m["member_assignment"])) if m["member_assignment"] else []
        except orjson.JSONDecodeError:
            assigned = []
        members.append(
            {
                "worker": meta.get("worker") or m["client_id"],
                "member_id": m["member_id"],
                "host": m["client_host"],
                "tasks": sorted(assigned) if isinstance(assigned, list) else [],
                "running": sorted(meta.get("tasks") or []),
            }
        )
    return {"group": group, "state": g["group_state"], "members": sorted(members, key=lambda x: x["worker"])}
