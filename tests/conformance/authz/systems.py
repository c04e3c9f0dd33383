"""Both clusters set up alike, and each case sent to them.

`System` is one cluster as the suite reaches it: its bootstrap address, its admin (a super
user), and the transport without SASL (TLS for Sluice's SASL_SSL listener, none for Kafka's
SASL_PLAINTEXT one). `write_users` puts every principal's SCRAM credential into each
cluster's ZooKeeper (Kafka's before it starts); `set_up` makes, with the same requests on both,
through the admin: the cases' topics (CreateTopics), every ACL (CreateAcls), the groups a case
needs to exist (an OffsetCommit); then waits until the last user can log in. `answer` sends
one case as one principal on a connection of its own and returns its codes (``answers.codes``).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import scramp

from sluice.cluster.zkstore import ZkAuth, close, connect
from sluice.protocol.api import ApiKey, DecodeError
from sluice.security.client import ClientSecurity
from sluice.security.credentials import USERS, encode_user, user_path
from sluice.security.scram import ScramCredential, from_salted_password
from sluice.sync.wire_client import WireClient, WireError
from tests.conformance.authz.answers import DISCONNECTED, ERROR, Codes, codes, disconnected
from tests.conformance.authz.cases import CASES, Acl, Case, Ctx, Principal, owner, principals

ITERATIONS = 4096
#: Requests' batch sizes for the set-up (each is one request per batch)
BATCH = 150


def password_of(user: str) -> str:
    return f"pw-{user}"


def _salt(user: str) -> bytes:
    return hashlib.sha256(user.encode()).digest()[:16]


class SetUpError(AssertionError):
    pass


@dataclass(frozen=True)
class System:
    name: str
    bootstrap: str
    admin: ClientSecurity
    #: the listener's transport without SASL (TLS, or a plain socket)
    transport: ClientSecurity
    broker_id: int = 1

    def connect(self, security: ClientSecurity) -> WireClient:
        return WireClient.connect(self.bootstrap, security=security, timeout_s=30)

    def as_user(self, user: str, password: str | None = None) -> ClientSecurity:
        return replace(self.admin, username=user, password=password or password_of(user))

    def admin_request(self, api: ApiKey, version: int, body: dict[str, Any]) -> dict[str, Any]:
        with self.connect(self.admin) as w:
            return w.request(api, version, body)

    def api_versions(self) -> dict[int, tuple[int, int]]:
        r = self.admin_request(
            ApiKey.API_VERSIONS, 3, {"client_software_name": "authz", "client_software_version": "1"}
        )
        return {a["api_key"]: (a["min_version"], a["max_version"]) for a in r["api_keys"]}


@dataclass(frozen=True)
class Plan:
    """Everything the cases need to exist before they run, the same on both systems."""

    cases: list[Case]
    principals: dict[str, list[Principal]]  # case name -> its principals
    owners: dict[str, Principal]  # case name -> the owner of its `before` step
    topics: list[str]
    groups: list[tuple[str, str]]  # (group, topic it commits to)
    acls: list[Acl]

    @classmethod
    def of(cls, cases: list[Case]) -> Plan:
        by_case = {c.name: principals(c) for c in cases}
        owners = {c.name: owner(c) for c in cases if c.before is not None}
        topics: list[str] = []
        groups: list[tuple[str, str]] = []
        acls: list[Acl] = []
        for c in cases:
            everyone = by_case[c.name] + ([owners[c.name]] if c.name in owners else [])
            names = {p.names for p in everyone}
            for n in sorted(names, key=lambda n: (n.topic, n.group)):
                if c.topic_exists and n.topic not in topics:
                    topics.append(n.topic)
                if c.group_exists and (n.group, n.topic) not in groups:
                    groups.append((n.group, n.topic if c.topic_exists else SETUP_TOPIC))
                if c.setup_acls is not None:
                    acls.extend(a for a in c.setup_acls(n) if a not in acls)
            acls.extend(a for p in everyone for a in p.acls)
        return cls(cases, by_case, owners, [SETUP_TOPIC, *topics], groups, acls)

    def users(self) -> list[str]:
        everyone = [p for ps in self.principals.values() for p in ps] + list(self.owners.values())
        return [p.user for p in everyone if p.exists]


#: a topic the admin commits offsets to for groups whose case has no topic of its own
SETUP_TOPIC = "az.setup.t"


def _chunks(items: list[Any]) -> Iterator[list[Any]]:
    for i in range(0, len(items), BATCH):
        yield items[i : i + BATCH]


def _all_ok(what: str, system: System, results: list[dict[str, Any]], name_key: str | None) -> None:
    bad = [
        (r.get(name_key) if name_key else i, r["error_code"], r.get("error_message"))
        for i, r in enumerate(results)
        if r["error_code"] != 0
    ]
    if bad:
        raise SetUpError(f"{system.name}: {what} refused: {bad[:10]}")


def scram_credential(user: str) -> ScramCredential:
    """``user``'s SCRAM-SHA-512 credential, the one AlterUserScramCredentials makes from the
    salted password `set_up` sends."""
    salted = hashlib.pbkdf2_hmac("sha512", password_of(user).encode(), _salt(user), ITERATIONS)
    return from_salted_password("SCRAM-SHA-512", salted, _salt(user), ITERATIONS)


def write_users(zookeeper: str, users: list[str], *, chroot: str = "", auth: ZkAuth | None = None) -> None:
    """Every user's credential written straight into ``<chroot>/config/users`` on ``zookeeper``
    (which may name a chroot itself), Kafka's layout, all requests in flight at once: what
    ``kafka-configs --zookeeper ... --add-config SCRAM-SHA-512=[...]`` writes. Kafka loads them
    when it starts (so: before it starts); Sluice reads a user's znode at each login.

    Not through AlterUserScramCredentials (which has cases of its own): each user is a znode
    written and, on Kafka, a change notice the broker reads back, one after the other: 30-60 s
    for Kafka, 9-24 s for Sluice, the suite's 600 users on a busy 2-core machine."""
    client = connect(zookeeper, auth=auth)
    try:
        client.ensure_path(f"{chroot}{USERS}")
        pending = [
            client.create_async(
                f"{chroot}{user_path(u)}", encode_user({"SCRAM-SHA-512": scram_credential(u)})
            )
            for u in users
        ]
        for p in pending:
            p.get(timeout=60)
    finally:
        close(client)


def set_up(system: System, plan: Plan) -> dict[str, float]:
    """Make topics, ACLs and groups on ``system`` with the admin's requests (the users are
    there already: `write_users`); the seconds each step took."""
    took: dict[str, float] = {}
    started = time.monotonic()

    def step(name: str) -> None:
        nonlocal started
        took[name] = round(time.monotonic() - started, 1)
        started = time.monotonic()

    _warm_coordinators(system)
    step("coordinators")
    users = plan.users()
    for chunk in _chunks(plan.topics):
        r = system.admin_request(
            ApiKey.CREATE_TOPICS,
            5,
            {
                "topics": [{"name": t, "num_partitions": 1, "replication_factor": 1} for t in chunk],
                "timeout_ms": 30000,
                "validate_only": False,
            },
        )
        _all_ok("CreateTopics", system, r["topics"], "name")
    step("topics")
    for chunk in _chunks(plan.acls):
        r = system.admin_request(ApiKey.CREATE_ACLS, 3, {"creations": [a.creation() for a in chunk]})
        _all_ok("CreateAcls", system, r["results"], None)
    step("acls")
    for group, topic in plan.groups:
        _wait_ok(
            system,
            f"an offset of {group}",
            ApiKey.OFFSET_COMMIT,
            8,
            {
                "group_id": group,
                "generation_id_or_member_epoch": -1,
                "member_id": "",
                "topics": [
                    {
                        "name": topic,
                        "partitions": [
                            {"partition_index": 0, "committed_offset": 0, "committed_leader_epoch": -1}
                        ],
                    }
                ],
            },
            lambda r: [p["error_code"] for t in r["topics"] for p in t["partitions"]] == [0],
        )
    # the last user written logs in: the credentials are the ones the principals log in with
    step("groups")
    last = users[-1]
    _wait(lambda: _can_log_in(system, last), f"{system.name}: user {last} to log in")
    step("logins")
    return took


def _warm_coordinators(system: System) -> None:
    """Until the group and transaction coordinators answer (each internal topic is made on the
    first FindCoordinator) and the transaction coordinator has loaded its partitions (Kafka
    answers COORDINATOR_LOAD_IN_PROGRESS a while after FindCoordinator found it)."""
    for key_type in (0, 1):
        _wait_ok(
            system,
            f"a coordinator of key type {key_type}",
            ApiKey.FIND_COORDINATOR,
            3,
            {"key": "az.warm-up", "key_type": key_type},
            lambda r: r["error_code"] == 0,
        )
    _wait_ok(
        system,
        "the transaction coordinator to load",
        ApiKey.INIT_PRODUCER_ID,
        4,
        {
            "transactional_id": "az.warm-up",
            "transaction_timeout_ms": 60000,
            "producer_id": -1,
            "producer_epoch": -1,
        },
        lambda r: r["error_code"] == 0,
    )


def _wait_ok(system: System, what: str, api: ApiKey, version: int, body: dict[str, Any], ok: Any) -> None:
    _wait(lambda: ok(system.admin_request(api, version, body)), f"{system.name}: {what}")


def _wait(condition: Any, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except Exception as exc:  # not yet
            last = exc
        time.sleep(0.3)
    raise SetUpError(f"timed out waiting for {what} (last error: {last!r})")


def _can_log_in(system: System, user: str) -> bool:
    with system.connect(system.as_user(user)):
        return True


def answer(system: System, case: Case, principal: Principal) -> Codes:
    """The codes of ``case`` sent by ``principal`` to ``system``."""
    scope = f"az.{case.name}."
    ctx = Ctx(principal.names, principal.user, principal.variant, system.broker_id)
    if case.before is not None:
        api, version, body, keep = case.before(
            Ctx(principal.names, principal.user, "owner", system.broker_id)
        )
        with system.connect(system.as_user(f"az.{case.name}.owner")) as w:
            ctx = replace(ctx, before=keep(w.request(api, version, body)))
    if case.flow is not None:
        return _FLOWS[case.flow](system, case, principal)
    assert case.request is not None
    with system.connect(system.as_user(principal.user)) as w:
        try:
            response = w.request(case.api, case.version, case.request(ctx))
        except (OSError, WireError, DecodeError, IndexError):
            return disconnected()
    return codes(response, scope, case.fields)


def _api_versions(system: System, case: Case, principal: Principal) -> Codes:
    security = system.transport if principal.variant == "unauthenticated" else system.as_user(principal.user)
    with system.connect(security) as w:
        r = w.request(
            ApiKey.API_VERSIONS,
            case.version,
            {"client_software_name": "authz", "client_software_version": "1"},
        )
    return (("", ERROR, int(r["error_code"])),)


def _sasl_handshake(system: System, case: Case, principal: Principal) -> Codes:
    mechanism = {"scram-sha-512": "SCRAM-SHA-512", "scram-sha-256": "SCRAM-SHA-256"}.get(
        principal.variant, "GSSAPI"
    )
    with system.connect(system.transport) as w:
        r = w.request(ApiKey.SASL_HANDSHAKE, case.version, {"mechanism": mechanism})
    return (("", ERROR, int(r["error_code"])),)


def _sasl_authenticate(system: System, case: Case, principal: Principal) -> Codes:
    """The SCRAM-SHA-512 exchange, each SaslAuthenticate's code (``first``, ``final``) until the
    first refusal."""
    password = "not-the-password" if principal.variant == "wrong-password" else password_of(principal.user)
    client = scramp.ScramClient(["SCRAM-SHA-512"], principal.user, password)
    out: list[tuple[str, str, int | str]] = []
    with system.connect(system.transport) as w:
        r = w.request(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "SCRAM-SHA-512"})
        assert r["error_code"] == 0, r
        for step in ("first", "final"):
            message = client.get_client_first() if step == "first" else client.get_client_final()
            try:
                r = w.request(ApiKey.SASL_AUTHENTICATE, case.version, {"auth_bytes": message.encode()})
            except (OSError, WireError, DecodeError):
                out.append((step, ERROR, DISCONNECTED))
                break
            out.append((step, ERROR, int(r["error_code"])))
            if r["error_code"] != 0:
                break
            if step == "first":
                client.set_server_first(bytes(r["auth_bytes"]).decode())
    return tuple(out)


_FLOWS = {
    "api-versions": _api_versions,
    "sasl-handshake": _sasl_handshake,
    "sasl-authenticate": _sasl_authenticate,
}
assert {c.flow for c in CASES if c.flow} <= set(_FLOWS)
