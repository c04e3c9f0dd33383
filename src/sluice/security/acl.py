"""Kafka's ACL model and the authorization decision, as plain data and pure functions.

An ACL binding is a resource pattern (resource type, name, LITERAL or PREFIXED) and an entry
(principal, host, operation, ALLOW or DENY). Whether a principal may do an operation on a
resource is decided by :func:`decide` over an :class:`AclSnapshot`, with Kafka's rules:

* a super user may do anything;
* the ACLs that apply to a resource are those of its literal name, of the literal wildcard
  ``*`` and of every PREFIXED pattern its name starts with;
* no ACL at all on the resource: allowed only when ``allow.everyone.if.no.acl.found`` is set;
* otherwise a DENY entry matching the principal (or ``User:*``), the host (or ``*``) and the
  operation (or ALL) refuses, whatever allows; else an ALLOW entry matching them grants, where
  READ, WRITE, DELETE and ALTER each also grant DESCRIBE, and ALTER_CONFIGS grants
  DESCRIBE_CONFIGS; else refused.

Every enum carries Kafka's wire codes, so the ACL APIs pass them through unchanged.
:class:`AclAuthorizer` holds the configuration and a source of snapshots and answers
``authorize(session, operation, resource)``; it does no I/O (``acl_store`` keeps the snapshot
fresh from ZooKeeper)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import IntEnum
from typing import TypeVar

from sluice.security.session import Session

__all__ = [
    "CLUSTER_NAME",
    "WILDCARD",
    "WILDCARD_PRINCIPAL",
    "AccessControlEntry",
    "AclAuthorizer",
    "AclBinding",
    "AclBindingFilter",
    "AclSnapshot",
    "AuthorizerConfig",
    "Decision",
    "Operation",
    "PatternType",
    "Permission",
    "Resource",
    "ResourcePattern",
    "ResourceType",
    "decide",
    "decide_by_resource_type",
    "inter_broker_acls",
    "parse_enum",
    "parse_super_users",
    "validate_binding",
    "worker_acls",
]


class ResourceType(IntEnum):
    """Kafka's ``ResourceType`` codes."""

    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(IntEnum):
    """Kafka's ``PatternType`` codes: LITERAL and PREFIXED are stored; ANY and MATCH filter."""

    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(IntEnum):
    """Kafka's ``AclOperation`` codes."""

    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class Permission(IntEnum):
    """Kafka's ``AclPermissionType`` codes."""

    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


#: The one name of the CLUSTER resource.
CLUSTER_NAME = "kafka-cluster"
#: A literal resource name, or an entry's host, that matches every name or host.
WILDCARD = "*"
#: An entry's principal that matches every user.
WILDCARD_PRINCIPAL = "User:*"

#: The operations whose ALLOW also grants the key's operation (besides itself and ALL).
_IMPLIED_BY: dict[Operation, frozenset[Operation]] = {
    Operation.DESCRIBE: frozenset({Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER}),
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.ALTER_CONFIGS}),
}

#: The operations an ACL may name on each resource type (ALL on any of them).
SUPPORTED_OPERATIONS: dict[ResourceType, frozenset[Operation]] = {
    ResourceType.TOPIC: frozenset({
        Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DESCRIBE, Operation.DELETE,
        Operation.ALTER, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS,
    }),
    ResourceType.GROUP: frozenset({Operation.READ, Operation.DESCRIBE, Operation.DELETE}),
    ResourceType.CLUSTER: frozenset({
        Operation.CREATE, Operation.CLUSTER_ACTION, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS,
        Operation.IDEMPOTENT_WRITE, Operation.ALTER, Operation.DESCRIBE,
    }),
    ResourceType.TRANSACTIONAL_ID: frozenset({Operation.DESCRIBE, Operation.WRITE}),
    ResourceType.DELEGATION_TOKEN: frozenset({Operation.DESCRIBE}),
    ResourceType.USER: frozenset({Operation.CREATE_TOKENS, Operation.DESCRIBE_TOKENS}),
}  # fmt: skip


def granting_operations(op: Operation) -> frozenset[Operation]:
    """The operations whose ALLOW grants ``op``: itself, ALL and those implying it."""
    return frozenset({op, Operation.ALL}) | _IMPLIED_BY.get(op, frozenset())


E = TypeVar("E", bound=IntEnum)


def parse_enum(kind: type[E], text: str) -> E:
    """An enum member from a name in any of Kafka's spellings (``Read``, ``READ``,
    ``describe-configs``, ``DescribeConfigs``, ``describe_configs``) or its wire code; ValueError
    names the accepted ones."""
    key = text.strip().replace("-", "").replace("_", "").upper()
    for member in kind:
        if member.name.replace("_", "") == key or (key.isdigit() and int(key) == member.value):
            return member
    names = ", ".join(m.name for m in kind if m.name not in ("UNKNOWN", "ANY", "MATCH"))
    raise ValueError(f"{text!r} is not a {kind.__name__}; one of {names}")


@dataclass(frozen=True, slots=True)
class Resource:
    """A concrete resource a request acts on."""

    type: ResourceType
    name: str

    @classmethod
    def cluster(cls) -> Resource:
        return cls(ResourceType.CLUSTER, CLUSTER_NAME)


@dataclass(frozen=True, slots=True, order=True)
class ResourcePattern:
    """What an ACL is on: a resource type and a LITERAL name (``*``: all) or a name PREFIX."""

    type: ResourceType
    name: str
    pattern_type: PatternType = PatternType.LITERAL

    def matches(self, resource: Resource) -> bool:
        if resource.type != self.type:
            return False
        if self.pattern_type == PatternType.LITERAL:
            return self.name in (resource.name, WILDCARD)
        if self.pattern_type == PatternType.PREFIXED:
            return resource.name.startswith(self.name)
        return False


@dataclass(frozen=True, slots=True, order=True)
class AccessControlEntry:
    """Who (``User:<name>`` or ``User:*``), from where (an address or ``*``), what, allowed or denied."""

    principal: str
    host: str
    operation: Operation
    permission: Permission

    def applies_to(self, principal: str, host: str) -> bool:
        return self.principal in (principal, WILDCARD_PRINCIPAL) and self.host in (host, WILDCARD)


@dataclass(frozen=True, slots=True, order=True)
class AclBinding:
    pattern: ResourcePattern
    entry: AccessControlEntry

    def describe(self) -> str:
        """One key=value line (logs, the CLI)."""
        p, e = self.pattern, self.entry
        return (
            f"resource_type={p.type.name} pattern_type={p.pattern_type.name} name={p.name} "
            f"principal={e.principal} host={e.host} operation={e.operation.name} "
            f"permission={e.permission.name}"
        )


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    """Which bindings a DescribeAcls or DeleteAcls names: None and ANY match everything; a MATCH
    pattern type matches every pattern that would apply to the named resource."""

    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: Operation = Operation.ANY
    permission: Permission = Permission.ANY

    def matches_pattern(self, pattern: ResourcePattern) -> bool:
        if self.resource_type not in (ResourceType.ANY, pattern.type):
            return False
        if self.pattern_type == PatternType.ANY:
            return self.name is None or self.name == pattern.name
        if self.pattern_type == PatternType.MATCH:
            return self.name is None or pattern.matches(Resource(pattern.type, self.name))
        return self.pattern_type == pattern.pattern_type and (self.name is None or self.name == pattern.name)

    def matches_entry(self, entry: AccessControlEntry) -> bool:
        return (
            (self.principal is None or self.principal == entry.principal)
            and (self.host is None or self.host == entry.host)
            and self.operation in (Operation.ANY, entry.operation)
            and self.permission in (Permission.ANY, entry.permission)
        )

    def matches(self, binding: AclBinding) -> bool:
        return self.matches_pattern(binding.pattern) and self.matches_entry(binding.entry)

    def invalid(self) -> str | None:
        """Why a filter can match nothing sensible (UNKNOWN values), or None."""
        if ResourceType.UNKNOWN in (self.resource_type,) or self.pattern_type == PatternType.UNKNOWN:
            return "the filter names an UNKNOWN resource or pattern type"
        if self.operation == Operation.UNKNOWN or self.permission == Permission.UNKNOWN:
            return "the filter names an UNKNOWN operation or permission"
        return None


def validate_binding(binding: AclBinding) -> str | None:
    """Why a binding cannot be stored (Kafka's INVALID_REQUEST), or None when it can."""
    p, e = binding.pattern, binding.entry
    if p.type in (ResourceType.ANY, ResourceType.UNKNOWN):
        return f"an ACL must name one resource type, not {p.type.name}"
    if p.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        return f"an ACL's pattern type is LITERAL or PREFIXED, not {p.pattern_type.name}"
    if not p.name:
        return "the resource name is empty"
    if p.type == ResourceType.CLUSTER and p.name != CLUSTER_NAME:
        # Kafka stores a PREFIXED kafka-cluster too (it matches the cluster), and nothing else
        return f"the only CLUSTER resource is {CLUSTER_NAME!r}"
    if e.operation in (Operation.ANY, Operation.UNKNOWN):
        return f"an ACL must name one operation, not {e.operation.name}"
    if e.permission not in (Permission.ALLOW, Permission.DENY):
        return f"an ACL's permission is ALLOW or DENY, not {e.permission.name}"
    if e.operation != Operation.ALL and e.operation not in SUPPORTED_OPERATIONS.get(p.type, frozenset()):
        allowed = ", ".join(sorted(o.name for o in SUPPORTED_OPERATIONS.get(p.type, frozenset())))
        return f"operation {e.operation.name} does not apply to a {p.type.name} (one of ALL, {allowed})"
    kind, colon, name = e.principal.partition(":")
    if not colon or not kind or not name:
        return f"principal {e.principal!r} is not <type>:<name> (e.g. User:alice, or User:* for everyone)"
    if not e.host:
        return "the host is empty (use * for every host)"
    return None


class AclSnapshot:
    """Every ACL at one moment, indexed for :func:`decide`: per (resource type, pattern type), a
    map from name to its entries. Immutable once built; a change builds a new snapshot."""

    __slots__ = ("_by_kind", "_count")

    def __init__(self, bindings: Iterable[AclBinding] = ()) -> None:
        by_kind: dict[tuple[ResourceType, PatternType], dict[str, set[AccessControlEntry]]] = {}
        for b in bindings:
            by_kind.setdefault((b.pattern.type, b.pattern.pattern_type), {}).setdefault(
                b.pattern.name, set()
            ).add(b.entry)
        self._by_kind = {
            kind: {name: tuple(sorted(entries)) for name, entries in names.items()}
            for kind, names in by_kind.items()
        }
        self._count = sum(len(e) for names in self._by_kind.values() for e in names.values())

    def __len__(self) -> int:
        return self._count

    def bindings(self) -> Iterator[AclBinding]:
        for (rtype, ptype), names in sorted(self._by_kind.items()):
            for name, entries in sorted(names.items()):
                for entry in entries:
                    yield AclBinding(ResourcePattern(rtype, name, ptype), entry)

    def entries_for(self, resource: Resource) -> list[AccessControlEntry]:
        """The entries of every pattern that applies to ``resource`` (literal name, ``*``, and
        each prefix of the name: one lookup per prefix length, not one per stored prefix)."""
        found: list[AccessControlEntry] = []
        literal = self._by_kind.get((resource.type, PatternType.LITERAL))
        if literal:
            found.extend(literal.get(resource.name, ()))
            if resource.name != WILDCARD:
                found.extend(literal.get(WILDCARD, ()))
        prefixed = self._by_kind.get((resource.type, PatternType.PREFIXED))
        if prefixed:
            name = resource.name
            for end in range(1, len(name) + 1):
                found.extend(prefixed.get(name[:end], ()))
        return found

    def entries_of_type(self, rtype: ResourceType) -> Iterator[tuple[ResourcePattern, AccessControlEntry]]:
        for (kind, ptype), names in self._by_kind.items():
            if kind != rtype:
                continue
            for name, entries in names.items():
                for entry in entries:
                    yield ResourcePattern(kind, name, ptype), entry


@dataclass(frozen=True, slots=True)
class AuthorizerConfig:
    #: principals allowed everything (``super.users``)
    super_users: frozenset[str] = frozenset()
    #: a resource without any ACL is open to everyone (``allow.everyone.if.no.acl.found``)
    allow_if_no_acl: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    #: super_user | allowed_by_acl | denied_by_acl | no_acl_allow_everyone | no_acl | no_matching_allow
    reason: str


def decide(
    snapshot: AclSnapshot,
    config: AuthorizerConfig,
    principal: str,
    host: str,
    op: Operation,
    resource: Resource,
) -> Decision:
    """May ``principal`` connected from ``host`` do ``op`` on ``resource``? (module docstring)"""
    if principal in config.super_users:
        return Decision(True, "super_user")
    entries = snapshot.entries_for(resource)
    if not entries:
        allowed = config.allow_if_no_acl
        return Decision(allowed, "no_acl_allow_everyone" if allowed else "no_acl")
    applicable = [e for e in entries if e.applies_to(principal, host)]
    for e in applicable:
        if e.permission == Permission.DENY and e.operation in (op, Operation.ALL):
            return Decision(False, "denied_by_acl")
    granting = granting_operations(op)
    for e in applicable:
        if e.permission == Permission.ALLOW and e.operation in granting:
            return Decision(True, "allowed_by_acl")
    return Decision(False, "no_matching_allow")


def decide_by_resource_type(
    snapshot: AclSnapshot,
    config: AuthorizerConfig,
    principal: str,
    host: str,
    op: Operation,
    rtype: ResourceType,
) -> Decision:
    """May ``principal`` do ``op`` on at least one resource of ``rtype``? (Kafka's
    authorizeByResourceType, KIP-679: an idempotent producer needs WRITE on some topic.)

    Allowed when an ALLOW for ``op`` (or ALL) on some literal name or prefix applies to the
    principal and no DENY covers that whole name or prefix (a DENY on the same literal name, on
    a prefix of it, or on ``*``). A resource named so that no ACL applies to it counts as well,
    under ``allow.everyone.if.no.acl.found``."""
    if decide(snapshot, config, principal, host, op, Resource(rtype, "\x00no-acl-probe")).allowed:
        return Decision(True, "super_user" if principal in config.super_users else "no_acl_allow_everyone")
    deny_literal: set[str] = set()
    deny_prefixed: set[str] = set()
    allows: list[ResourcePattern] = []
    for pattern, e in snapshot.entries_of_type(rtype):
        if not e.applies_to(principal, host) or e.operation not in (op, Operation.ALL):
            continue
        if e.permission == Permission.DENY:
            if pattern.pattern_type == PatternType.LITERAL and pattern.name == WILDCARD:
                return Decision(False, "denied_by_acl")
            (deny_literal if pattern.pattern_type == PatternType.LITERAL else deny_prefixed).add(pattern.name)
        elif e.permission == Permission.ALLOW:
            allows.append(pattern)
    for pattern in allows:
        if pattern.pattern_type == PatternType.LITERAL and pattern.name == WILDCARD:
            return Decision(True, "allowed_by_acl")
    for pattern in allows:
        if pattern.pattern_type == PatternType.LITERAL and pattern.name in deny_literal:
            continue
        if any(pattern.name[:end] in deny_prefixed for end in range(1, len(pattern.name) + 1)):
            continue
        return Decision(True, "allowed_by_acl")
    return Decision(False, "no_matching_allow")


def parse_super_users(text: str) -> frozenset[str]:
    """``super.users``: ``User:alice;User:bob`` (Kafka's separator is the semicolon)."""
    users = [u.strip() for u in text.split(";") if u.strip()]
    for u in users:
        kind, colon, name = u.partition(":")
        if not colon or not kind or not name:
            raise ValueError(f"{u!r} is not <type>:<name>, e.g. User:admin (separate several with ';')")
    return frozenset(users)


class AclAuthorizer:
    """The broker's authorizer (``authorizer.class.name=sluice.security.acl.AclAuthorizer``):
    the configuration, and ``snapshot()``, which returns the ACLs as they are now."""

    CLASS_NAME = "sluice.security.acl.AclAuthorizer"

    def __init__(self, config: AuthorizerConfig, snapshot: Callable[[], AclSnapshot]) -> None:
        self.config = config
        self.snapshot = snapshot

    def decide(self, session: Session, op: Operation, resource: Resource) -> Decision:
        return decide(self.snapshot(), self.config, session.principal, _host(session), op, resource)

    def authorize(self, session: Session, op: Operation, resource: Resource) -> bool:
        return self.decide(session, op, resource).allowed

    def authorize_by_resource_type(self, session: Session, op: Operation, rtype: ResourceType) -> bool:
        return decide_by_resource_type(
            self.snapshot(), self.config, session.principal, _host(session), op, rtype
        ).allowed


def _host(session: Session) -> str:
    """The session's address as ACLs name it: Kafka prints ``/127.0.0.1``, an ACL says ``127.0.0.1``."""
    return session.host.lstrip("/")


# -- the ACLs Sluice's own processes need ---------------------------------------------------------

DEFAULT_WORKER_GROUP = "sluice-workers"


def _allow(pattern: ResourcePattern, principal: str, *ops: Operation) -> list[AclBinding]:
    return [AclBinding(pattern, AccessControlEntry(principal, WILDCARD, op, Permission.ALLOW)) for op in ops]


def worker_acls(
    principal: str, *, worker_group: str = DEFAULT_WORKER_GROUP, topic_prefix: str | None = None
) -> list[AclBinding]:
    """What a sync worker's principal needs: READ on the workers' group (only principals with it
    may join: a group without any ACL is closed unless ``allow.everyone.if.no.acl.found``), and
    on its tasks' topics (all topics, or those starting with ``topic_prefix``) WRITE and CREATE
    for the capture, READ for the apply query and DESCRIBE for metadata, plus IDEMPOTENT_WRITE on
    the cluster for its idempotent producer."""
    topics = (
        ResourcePattern(ResourceType.TOPIC, WILDCARD)
        if topic_prefix is None
        else ResourcePattern(ResourceType.TOPIC, topic_prefix, PatternType.PREFIXED)
    )
    return [
        *_allow(ResourcePattern(ResourceType.GROUP, worker_group), principal, Operation.READ),
        *_allow(topics, principal, Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DESCRIBE),
        *_allow(ResourcePattern(ResourceType.CLUSTER, CLUSTER_NAME), principal, Operation.IDEMPOTENT_WRITE),
    ]


def inter_broker_acls(principal: str) -> list[AclBinding]:
    """What brokers' own principal needs of each other: CLUSTER_ACTION on the cluster (follower
    fetches and OffsetForLeaderEpoch)."""
    return _allow(ResourcePattern(ResourceType.CLUSTER, CLUSTER_NAME), principal, Operation.CLUSTER_ACTION)
