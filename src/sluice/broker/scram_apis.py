"""DescribeUserScramCredentials and AlterUserScramCredentials (API keys 50, 51; KIP-554): SASL
users through the Kafka protocol, so Kafka's admin tools and confluent-kafka's AdminClient
manage the same ``/config/users`` credentials ``sluice user`` does.

Kafka's rules: describing needs DESCRIBE on the cluster, altering ALTER (with an authorizer; a
broker without one answers everyone, as Kafka does); an unknown user or mechanism is
RESOURCE_NOT_FOUND; a user named twice in one request DUPLICATE_RESOURCE; an iteration count
out of range UNACCEPTABLE_CREDENTIAL. Alter receives the salted password, never the password.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import TYPE_CHECKING, Any

from sluice.protocol.api import RequestHeader
from sluice.protocol.errors import ErrorCode
from sluice.security.acl import Operation, Resource
from sluice.security.credentials import CredentialStore
from sluice.security.scram import MECHANISM_NAMES, CredentialError, from_salted_password
from sluice.security.session import current_session

if TYPE_CHECKING:
    from sluice.broker.context import BrokerContext

log = logging.getLogger("sluice.auth")
Body = dict[str, Any]


def _allowed(broker: BrokerContext, op: Operation) -> bool:
    authorizer = getattr(broker, "authorizer", None)
    return authorizer is None or bool(authorizer.authorize(current_session.get(), op, Resource.cluster()))


def _store(broker: BrokerContext) -> CredentialStore:
    return CredentialStore(broker.store.client)


async def describe_user_scram_credentials(broker: BrokerContext, header: RequestHeader, req: Body) -> Body:
    if not _allowed(broker, Operation.DESCRIBE):
        return {"throttle_time_ms": 0, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                "error_message": "not authorized to describe users", "results": []}  # fmt: skip
    store = _store(broker)
    asked = req.get("users")
    names = None if asked is None else [u["name"] for u in asked]
    found = await asyncio.to_thread(_describe, store, names)
    return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "error_message": None, "results": found}


def _describe(store: CredentialStore, names: list[str] | None) -> list[Body]:
    if names is None:
        return [_result(u.user, u.scram) for u in store.users()]
    twice = {n for n, c in Counter(names).items() if c > 1}
    out = []
    for name in dict.fromkeys(names):
        if name in twice:
            out.append(_error(name, ErrorCode.DUPLICATE_RESOURCE, "the user is named twice"))
            continue
        try:
            creds = store.get(name).scram
        except CredentialError as exc:
            out.append(_error(name, ErrorCode.RESOURCE_NOT_FOUND, str(exc)))
            continue
        out.append(
            _result(name, creds) if creds else _error(name, ErrorCode.RESOURCE_NOT_FOUND, "no such user")
        )
    return out


def _result(user: str, creds: dict[str, Any]) -> Body:
    from sluice.security.scram import MECHANISMS

    infos = [{"mechanism": MECHANISMS[m], "iterations": c.iterations} for m, c in sorted(creds.items())]
    return {"user": user, "error_code": ErrorCode.NONE, "error_message": None, "credential_infos": infos}


def _error(user: str, code: ErrorCode, message: str) -> Body:
    return {"user": user, "error_code": code, "error_message": message, "credential_infos": []}


async def alter_user_scram_credentials(broker: BrokerContext, header: RequestHeader, req: Body) -> Body:
    changes = [("delete", d) for d in req.get("deletions") or []]
    changes += [("upsert", u) for u in req.get("upsertions") or []]
    if not _allowed(broker, Operation.ALTER):
        users = dict.fromkeys(c["name"] for _, c in changes)
        return {"throttle_time_ms": 0, "results": [
            {"user": u, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
             "error_message": "not authorized to alter users"} for u in users]}  # fmt: skip
    results = await asyncio.to_thread(_alter, _store(broker), changes)
    return {"throttle_time_ms": 0, "results": results}


def _alter(store: CredentialStore, changes: list[tuple[str, Body]]) -> list[Body]:
    per_user: dict[str, list[tuple[str, Body]]] = {}
    for kind, change in changes:
        per_user.setdefault(change["name"], []).append((kind, change))
    results = []
    for user, mine in per_user.items():
        mechanisms = [MECHANISM_NAMES.get(c["mechanism"]) for _, c in mine]
        if None in mechanisms:
            results.append(
                _alter_result(user, ErrorCode.UNSUPPORTED_SASL_MECHANISM, "unknown SCRAM mechanism")
            )
        elif len(set(mechanisms)) < len(mechanisms):
            results.append(_alter_result(user, ErrorCode.DUPLICATE_RESOURCE, "a mechanism is named twice"))
        else:
            results.append(_apply(store, user, mine))
    return results


def _apply(store: CredentialStore, user: str, changes: list[tuple[str, Body]]) -> Body:
    try:
        for kind, c in changes:  # checked all first: nothing is written for a bad request
            if kind == "upsert":
                from_salted_password(
                    MECHANISM_NAMES[c["mechanism"]],
                    bytes(c["salted_password"]),
                    bytes(c["salt"]),
                    c["iterations"],
                )
        for kind, c in changes:
            mechanism = MECHANISM_NAMES[c["mechanism"]]
            if kind == "delete":
                if not store.delete(user, (mechanism,)):
                    return _alter_result(user, ErrorCode.RESOURCE_NOT_FOUND, f"no {mechanism} credential")
            else:
                credential = from_salted_password(
                    mechanism, bytes(c["salted_password"]), bytes(c["salt"]), c["iterations"]
                )
                store.upsert(user, mechanism, credential)
    except CredentialError as exc:
        return _alter_result(user, ErrorCode.UNACCEPTABLE_CREDENTIAL, str(exc))
    log.info("event=user_credentials_altered user=%s changes=%d", user, len(changes))
    return _alter_result(user, ErrorCode.NONE, None)


def _alter_result(user: str, code: ErrorCode, message: str | None) -> Body:
    return {"user": user, "error_code": code, "error_message": message}
