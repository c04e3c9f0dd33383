"""Static group membership (KIP-345): the pure rules of ``broker/static_membership.py`` and the
group's rename that replacing a member takes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.broker import static_membership as sm
from sluice.broker.group import Group, GroupState, Member
from sluice.broker.static_membership import JoinAction, RejoinOutcome
from sluice.protocol.api import SUPPORTED, ApiKey, request_codec, response_codec
from sluice.protocol.errors import ErrorCode
from sluice.protocol.primitives import Writer

S = GroupState
#: member id -> instance id: "m1" is instance "a", "m2" is dynamic
MEMBERS = {"m1": "a", "m2": None}
NO_PENDING: frozenset[str] = frozenset()


def test_a_join_without_an_instance_id_follows_the_classic_rules() -> None:
    assert sm.join_ruling(MEMBERS, NO_PENDING, "", None).action is JoinAction.DYNAMIC
    assert sm.join_ruling(MEMBERS, NO_PENDING, "m2", None).action is JoinAction.DYNAMIC


def test_an_unknown_member_id_for_a_known_instance_replaces_its_member() -> None:
    assert sm.join_ruling(MEMBERS, NO_PENDING, "", "a") == sm.JoinRuling(JoinAction.REPLACE, replaces="m1")


def test_an_unknown_member_id_for_a_new_instance_joins_at_once() -> None:
    assert sm.join_ruling(MEMBERS, NO_PENDING, "", "b").action is JoinAction.NEW_STATIC


def test_the_instances_current_member_rejoins_as_itself() -> None:
    assert sm.join_ruling(MEMBERS, NO_PENDING, "m1", "a").action is JoinAction.KNOWN


def test_an_older_member_id_of_an_instance_is_fenced() -> None:
    ruling = sm.join_ruling(MEMBERS, NO_PENDING, "m0", "a")
    assert ruling == sm.JoinRuling(JoinAction.REFUSED, ErrorCode.FENCED_INSTANCE_ID)


def test_a_member_id_for_an_instance_the_group_does_not_have_is_unknown() -> None:
    ruling = sm.join_ruling(MEMBERS, NO_PENDING, "m2", "b")
    assert ruling == sm.JoinRuling(JoinAction.REFUSED, ErrorCode.UNKNOWN_MEMBER_ID)


@pytest.mark.parametrize(
    ("member_id", "instance_id", "error"),
    [
        ("m1", "a", ErrorCode.NONE),
        ("m2", None, ErrorCode.NONE),
        ("m0", "a", ErrorCode.FENCED_INSTANCE_ID),  # replaced: a second process with instance a
        ("m0", None, ErrorCode.UNKNOWN_MEMBER_ID),
        ("m0", "b", ErrorCode.UNKNOWN_MEMBER_ID),  # an instance the group does not have
        ("m1", None, ErrorCode.NONE),  # an old request version carries no instance id
    ],
)
def test_member_error_for_sync_heartbeat_and_commit(
    member_id: str, instance_id: str | None, error: ErrorCode
) -> None:
    assert sm.member_error(MEMBERS, member_id, instance_id) is error


@pytest.mark.parametrize(
    ("state", "current", "following", "outcome"),
    [
        (S.STABLE, "range", "range", RejoinOutcome.KEEP_ASSIGNMENT),
        (S.STABLE, "range", "roundrobin", RejoinOutcome.REBALANCE),
        (S.COMPLETING_REBALANCE, "range", "range", RejoinOutcome.REBALANCE),
        (S.PREPARING_REBALANCE, "range", "range", RejoinOutcome.JOIN_REBALANCE),
    ],
)
def test_rejoin_outcome(state: GroupState, current: str, following: str, outcome: RejoinOutcome) -> None:
    assert sm.rejoin_outcome(state, current, following) is outcome


@pytest.mark.parametrize("state", [S.EMPTY, S.DEAD])
def test_a_group_without_members_has_nobody_to_replace(state: GroupState) -> None:
    with pytest.raises(AssertionError):
        sm.rejoin_outcome(state, None, "range")


@pytest.mark.parametrize(
    ("member_id", "instance_id", "ruling"),
    [
        ("", "a", sm.LeaveRuling(ErrorCode.NONE, remove="m1")),  # by instance id alone (v3+)
        ("", "b", sm.LeaveRuling(ErrorCode.UNKNOWN_MEMBER_ID)),
        ("", None, sm.LeaveRuling(ErrorCode.UNKNOWN_MEMBER_ID)),
        ("m1", "a", sm.LeaveRuling(ErrorCode.NONE, remove="m1")),
        ("m0", "a", sm.LeaveRuling(ErrorCode.FENCED_INSTANCE_ID)),
        ("m2", None, sm.LeaveRuling(ErrorCode.NONE, remove="m2")),
        ("p1", None, sm.LeaveRuling(ErrorCode.NONE, forget_pending="p1")),
        ("zz", None, sm.LeaveRuling(ErrorCode.UNKNOWN_MEMBER_ID)),
    ],
)
def test_leave_ruling(member_id: str, instance_id: str | None, ruling: sm.LeaveRuling) -> None:
    assert sm.leave_ruling(MEMBERS, frozenset({"p1"}), member_id, instance_id) == ruling


def one_member_per_instance(members: dict[str, str | None]) -> dict[str, str | None]:
    """The coordinator keeps one member per instance id: later claims are dropped."""
    out: dict[str, str | None] = {}
    for member_id, instance_id in members.items():
        if instance_id is None or instance_id not in out.values():
            out[member_id] = instance_id
    return out


@given(
    st.dictionaries(
        st.text("mn", min_size=1, max_size=3), st.one_of(st.none(), st.sampled_from("abc")), max_size=6
    ),
    st.text("mn", max_size=3),
    st.one_of(st.none(), st.sampled_from("abcd")),
)
def test_exactly_the_instances_current_member_passes_the_member_check(
    members: dict[str, str | None], member_id: str, instance_id: str | None
) -> None:
    members = one_member_per_instance(members)
    error = sm.member_error(members, member_id, instance_id)
    owner = sm.owner_of(members, instance_id) if instance_id is not None else None
    if instance_id is not None and owner is not None and owner != member_id:
        assert error is ErrorCode.FENCED_INSTANCE_ID
    elif member_id in members:
        assert error is ErrorCode.NONE
    else:
        assert error is ErrorCode.UNKNOWN_MEMBER_ID
    ruling = sm.join_ruling(members, NO_PENDING, member_id, instance_id)
    if instance_id is not None and member_id and ruling.action is JoinAction.KNOWN:
        assert error is ErrorCode.NONE  # a member the join lets in is one the other requests let in


def member(member_id: str, instance_id: str | None) -> Member:
    return Member(
        member_id, instance_id, "c", "/h", 6000, 6000, "consumer", [("range", b"")], assignment=b"A"
    )


def test_rename_keeps_the_place_the_assignment_and_the_leadership() -> None:
    g = Group("g", state=S.STABLE, protocol="range")
    for m in (member("m1", "a"), member("m2", None), member("m3", "c")):
        g.members[m.member_id] = m
    g.leader = "m1"
    renamed = g.rename_member("m1", "m9")
    assert list(g.members) == ["m9", "m2", "m3"]
    assert renamed.member_id == "m9" and renamed.assignment == b"A" and g.leader == "m9"
    assert g.instance_ids() == {"m9": "a", "m2": None, "m3": "c"}


#: The highest version of each group API the pinned clients send (librdkafka 2.x in confluent-kafka
#: 2.16; kafka-python 3, whose messages are generated from Kafka's specs, capped in its coordinator;
#: aiokafka 0.14, whose Heartbeat and LeaveGroup stop at v1, before the instance id). The version
#: used is the lower of the client's and Sluice's highest.
CLIENT_MAX_VERSIONS = {
    "librdkafka": {ApiKey.JOIN_GROUP: 5, ApiKey.SYNC_GROUP: 3, ApiKey.HEARTBEAT: 3, ApiKey.OFFSET_COMMIT: 7},
    "kafka-python": {
        ApiKey.JOIN_GROUP: 7, ApiKey.SYNC_GROUP: 5, ApiKey.HEARTBEAT: 4, ApiKey.LEAVE_GROUP: 5,
        ApiKey.OFFSET_COMMIT: 8,
    },
    "aiokafka": {ApiKey.JOIN_GROUP: 5, ApiKey.SYNC_GROUP: 3},
}  # fmt: skip
#: The first version of each request that carries group_instance_id (Kafka's message specs).
INSTANCE_ID_FROM = {
    ApiKey.JOIN_GROUP: 5,
    ApiKey.SYNC_GROUP: 3,
    ApiKey.HEARTBEAT: 3,
    ApiKey.LEAVE_GROUP: 3,
    ApiKey.OFFSET_COMMIT: 7,
}


@pytest.mark.parametrize("client", sorted(CLIENT_MAX_VERSIONS))
def test_the_versions_clients_negotiate_carry_the_instance_id(client: str) -> None:
    for api, client_max in CLIENT_MAX_VERSIONS[client].items():
        lo, hi = SUPPORTED[api]
        version = min(client_max, hi)
        assert lo <= version and version >= INSTANCE_ID_FROM[api], (client, api.name, version)
        assert carries_instance_id(api, version), (client, api.name, version)


def carries_instance_id(api: ApiKey, version: int) -> bool:
    """Whether a request of this version round-trips a group_instance_id (LeaveGroup v3+: per member)."""
    codec = request_codec(api, version)
    body = codec.default()
    if api is ApiKey.LEAVE_GROUP:
        if "members" not in body:
            return False
        body["members"] = [{"member_id": "", "group_instance_id": "a"}]
    elif "group_instance_id" not in body:
        return False
    else:
        body["group_instance_id"] = "a"
    w = Writer()
    codec.encode(w, body)
    decoded = codec.decode_bytes(w.getvalue())
    held = decoded["members"][0] if api is ApiKey.LEAVE_GROUP else decoded
    return bool(held["group_instance_id"] == "a")


def test_describe_groups_answers_each_members_instance_id() -> None:
    version = SUPPORTED[ApiKey.DESCRIBE_GROUPS][1]
    codec = response_codec(ApiKey.DESCRIBE_GROUPS, version)
    member = {"member_id": "m1", "group_instance_id": "a", "client_id": "c", "client_host": "/h",
              "member_metadata": b"", "member_assignment": b""}  # fmt: skip
    group = {"error_code": 0, "group_id": "g", "group_state": "Stable", "protocol_type": "consumer",
             "protocol_data": "range", "members": [member]}  # fmt: skip
    body = {"groups": [group]}
    w = Writer()
    codec.encode(w, body)
    (decoded,) = codec.decode_bytes(w.getvalue())["groups"][0]["members"]
    assert decoded["group_instance_id"] == "a"
