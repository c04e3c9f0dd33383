"""The broker's authorizer: the ACL cache, the decision for the session being served, and the
record of refusals.

:class:`BrokerAuthorizer` holds the ACL cache (``security.acl_store``) and decides for the
session of the connection being served (:func:`session`); :class:`Check` binds one request's
session and API name. The per-API guards that ask it are ``broker/authz.py``; the replication
door (``broker/replica_access.py``) and the ACL APIs ask it directly. It knows nothing of the
broker around it, so each of those can import it without importing the broker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from sluice import metrics
from sluice.security.acl import (
    AclAuthorizer,
    AclSnapshot,
    AuthorizerConfig,
    Operation,
    Resource,
    ResourceType,
)
from sluice.security.acl_store import AclCache, AclStore
from sluice.security.session import Session, current_client_host, current_session

if TYPE_CHECKING:
    from sluice.broker.config import BrokerConfig
    from sluice.cluster.zkstore import ZkStore

log = logging.getLogger("sluice.authz")

#: At most one INFO line per (principal, operation, resource) this often; DEBUG has every one.
DENIAL_INFO_INTERVAL_S = 60.0
DENIAL_LOG_KEYS_MAX = 1000


class BrokerAuthorizer:
    """The broker's authorizer: the ACL cache, the decision, and the record of refusals.

    ``authorize(session, op, resource)`` is what any request path calls (the replication door
    calls it for follower fetches with CLUSTER_ACTION on the cluster)."""

    def __init__(self, config: AuthorizerConfig, store: ZkStore) -> None:
        self.acls = AclStore(store)
        self.cache = AclCache(self.acls)
        self.acl = AclAuthorizer(config, self.cache.snapshot)
        self._last_info: dict[tuple[str, Operation, ResourceType, str], float] = {}

    def start(self) -> None:
        """Load the ACLs and follow their changes (blocking: before the listener serves)."""
        self.cache.start()

    def snapshot(self) -> AclSnapshot:
        return self.cache.snapshot()

    def authorize(
        self, session: Session, op: Operation, resource: Resource, *, api: str = "", quiet: bool = False
    ) -> bool:
        """May the session's principal do ``op`` on ``resource``? A refusal is logged and
        counted unless ``quiet`` (a listing leaving out what the principal may not see)."""
        decision = self.acl.decide(session, op, resource)
        if not decision.allowed and not quiet:
            self._denied(session, op, resource, decision.reason, api)
        return decision.allowed

    def authorize_by_resource_type(
        self, session: Session, op: Operation, rtype: ResourceType, *, api: str = ""
    ) -> bool:
        allowed = self.acl.authorize_by_resource_type(session, op, rtype)
        if not allowed:
            self._denied(session, op, Resource(rtype, "*any*"), "no_resource_of_type_allowed", api)
        return allowed

    def _denied(self, session: Session, op: Operation, resource: Resource, reason: str, api: str) -> None:
        metrics.AUTHORIZATION_DENIED.labels(api or "unknown", resource.type.name.lower()).inc()
        args = (session.principal, session.host, api, op.name, resource.type.name, resource.name, reason)
        template = (
            "event=authorization_denied principal=%s host=%s api=%s operation=%s resource_type=%s "
            "resource=%s reason=%s"
        )
        key = (session.principal, op, resource.type, resource.name)
        now = time.monotonic()
        last = self._last_info.get(key)
        if last is not None and now - last < DENIAL_INFO_INTERVAL_S:
            log.debug(template, *args)
            return
        if len(self._last_info) >= DENIAL_LOG_KEYS_MAX:
            self._last_info.clear()
        self._last_info[key] = now
        log.info(template, *args)


def make_authorizer(config: BrokerConfig, store: ZkStore) -> BrokerAuthorizer | None:
    """The broker's authorizer, or None when ``authorizer.class.name`` is empty."""
    if not config.authorizer:
        return None
    assert config.authorizer == AclAuthorizer.CLASS_NAME, config.authorizer
    return BrokerAuthorizer(
        AuthorizerConfig(frozenset(config.super_users), config.allow_everyone_if_no_acl_found), store
    )


def session() -> Session:
    """The session being served, with the client's address when the network layer gave none."""
    s = current_session.get()
    if s.host:
        return s
    host = current_client_host.get()
    if not host:
        return s
    return Session(s.principal, s.listener, s.protocol, host)


class Check:
    """The checks of one request: its session and API name bound once."""

    __slots__ = ("api", "authorizer", "session")

    def __init__(self, authorizer: BrokerAuthorizer, session: Session, api: str) -> None:
        self.authorizer = authorizer
        self.session = session
        self.api = api

    def __call__(self, op: Operation, rtype: ResourceType, name: str, *, quiet: bool = False) -> bool:
        return self.authorizer.authorize(self.session, op, Resource(rtype, name), api=self.api, quiet=quiet)

    def cluster(self, op: Operation, *, quiet: bool = False) -> bool:
        return self.authorizer.authorize(self.session, op, Resource.cluster(), api=self.api, quiet=quiet)

    def topic(self, op: Operation, name: str, *, quiet: bool = False) -> bool:
        return self(op, ResourceType.TOPIC, name, quiet=quiet)

    def group(self, op: Operation, name: str) -> bool:
        return self(op, ResourceType.GROUP, name)

    def denied_topics(self, op: Operation, names: Iterable[str]) -> set[str]:
        return {n for n in set(names) if not self.topic(op, n)}


async def wait_for_acls(authorizer: BrokerAuthorizer, version: int, timeout_s: float = 5.0) -> None:
    """Let this broker's cache catch up with an ACL write it just made (its answer then agrees
    with its next DescribeAcls)."""
    if version >= 0:
        await asyncio.to_thread(authorizer.cache.wait_for, version, timeout_s)
