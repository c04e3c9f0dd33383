"""The pure rules behind the admin APIs (issue 19): elections on request and the automatic
rebalance, adding partitions, merging reassignments, altering configs, deleting group offsets."""

from __future__ import annotations

import struct
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.broker import kafka_broker_configs as kb
from sluice.broker.admin_groups import offset_deletion, subscribed_topics
from sluice.broker.config import BROKER_SETTINGS, log_default_keys
from sluice.broker.config_alteration import (
    APPEND,
    DELETE,
    SET,
    SUBTRACT,
    ConfigOp,
    ConfigRefusal,
    apply_full,
    apply_incremental,
    broker_config_refusal,
)
from sluice.broker.group import Group, GroupState, Member
from sluice.cluster.election import (
    PREFERRED,
    UNCLEAN,
    PartitionLeadership,
    imbalanced_partitions,
    requested_election,
)
from sluice.cluster.layout import PartitionState, Reassignment, TopicAssignment
from sluice.cluster.partition_growth import growth_start_index, plan_growth
from sluice.cluster.reassignment import ReassignmentRequest, merge_reassignments, ongoing_reassignments
from sluice.protocol.errors import ErrorCode

# -- elections on request ----------------------------------------------------------------------


def test_a_preferred_election_moves_leadership_to_the_first_replica_keeping_the_isr() -> None:
    state = PartitionState(2, 4, (1, 2, 3), 7)
    answer = requested_election(state, (1, 2, 3), {1, 2, 3}, PREFERRED, controller_epoch=9)
    assert answer.error is ErrorCode.NONE and answer.decision is not None
    assert answer.decision.state == PartitionState(1, 5, (1, 2, 3), 9)
    assert not answer.decision.unclean


@pytest.mark.parametrize(
    ("state", "live", "error"),
    [
        (PartitionState(1, 4, (1, 2), 7), {1, 2}, ErrorCode.ELECTION_NOT_NEEDED),
        (PartitionState(2, 4, (2,), 7), {1, 2}, ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE),  # out of the ISR
        (PartitionState(2, 4, (1, 2), 7), {2}, ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE),  # dead
    ],
)
def test_a_preferred_election_is_refused_when_not_needed_or_not_possible(
    state: PartitionState, live: set[int], error: ErrorCode
) -> None:
    answer = requested_election(state, (1, 2), live, PREFERRED, controller_epoch=9)
    assert (answer.decision, answer.error) == (None, error)
    assert answer.message


def test_an_unclean_election_prefers_an_in_sync_replica_and_is_refused_while_a_leader_lives() -> None:
    offline = PartitionState(-1, 4, (1,), 7)
    clean = requested_election(offline, (1, 2, 3), {1, 3}, UNCLEAN, controller_epoch=9)
    assert clean.decision is not None and clean.decision.state.leader == 1 and not clean.decision.unclean
    unclean = requested_election(offline, (1, 2, 3), {3}, UNCLEAN, controller_epoch=9)
    assert unclean.decision is not None
    assert unclean.decision.state == PartitionState(3, 5, (3,), 9) and unclean.decision.unclean
    none = requested_election(offline, (1, 2), {3}, UNCLEAN, controller_epoch=9)
    assert none.error is ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE
    led = requested_election(PartitionState(2, 4, (2,), 7), (1, 2), {1, 2}, UNCLEAN, controller_epoch=9)
    assert led.error is ErrorCode.ELECTION_NOT_NEEDED


brokers = st.integers(1, 5)


@st.composite
def partitions(draw: st.DrawFn) -> tuple[PartitionState, tuple[int, ...], set[int]]:
    replicas = tuple(draw(st.lists(brokers, min_size=1, max_size=4, unique=True)))
    isr = tuple(draw(st.lists(st.sampled_from(replicas), min_size=1, unique=True)))
    leader = draw(st.sampled_from([-1, *isr]))
    live = set(draw(st.lists(brokers, unique=True)))
    return PartitionState(leader, draw(st.integers(0, 50)), isr, 3), replicas, live


@settings(max_examples=300)
@given(partitions(), st.sampled_from([PREFERRED, UNCLEAN]))
def test_an_elected_leader_is_a_live_replica_and_only_unclean_leaves_the_isr(
    drawn: tuple[PartitionState, tuple[int, ...], set[int]], election_type: int
) -> None:
    state, replicas, live = drawn
    answer = requested_election(state, replicas, live, election_type, controller_epoch=4)
    if answer.decision is None:
        assert answer.error is not ErrorCode.NONE
        return
    new = answer.decision.state
    assert new.leader in live and new.leader in replicas
    assert new.leader_epoch == state.leader_epoch + 1, "every election moves the epoch on (I2)"
    if new.leader not in state.isr:
        assert answer.decision.unclean and election_type == UNCLEAN, "only UNCLEAN elects outside the ISR"
    if election_type == PREFERRED:
        assert new.leader == replicas[0] and new.isr == state.isr


def _leadership(topic: str, p: int, replicas: tuple[int, ...], leader: int) -> PartitionLeadership:
    return PartitionLeadership(topic, p, replicas, PartitionState(leader, 1, replicas, 1))


def test_the_rebalance_gives_a_restarted_brokers_partitions_back() -> None:
    # Broker 1 is preferred for t-0 and t-1 but leads neither (it restarted); broker 2 leads its own.
    parts = [
        _leadership("t", 0, (1, 2, 3), 2),
        _leadership("t", 1, (1, 3, 2), 3),
        _leadership("t", 2, (2, 3, 1), 2),
    ]
    assert imbalanced_partitions(parts, {1, 2, 3}, 10) == [("t", 0), ("t", 1)]
    assert imbalanced_partitions(parts, {2, 3}, 10) == [], "a dead preferred replica gets nothing back"
    assert imbalanced_partitions(parts, {1, 2, 3}, 100) == [], "at most 100 % imbalance is tolerated"


@settings(max_examples=200)
@given(st.lists(partitions(), min_size=1, max_size=12), st.integers(0, 100))
def test_the_rebalance_moves_only_to_live_in_sync_preferred_replicas_of_imbalanced_brokers(
    drawn: list[tuple[PartitionState, tuple[int, ...], set[int]]], percentage: int
) -> None:
    live = {1, 2, 3}
    parts = [PartitionLeadership("t", i, replicas, state) for i, (state, replicas, _) in enumerate(drawn)]
    chosen = imbalanced_partitions(parts, live, percentage)
    by_key = {(p.topic, p.partition): p for p in parts}
    for key in chosen:
        p = by_key[key]
        preferred = p.replicas[0]
        assert preferred in live and preferred in p.state.isr and p.state.leader != preferred
        mine = [q for q in parts if q.replicas[0] == preferred]
        elsewhere = [q for q in mine if q.state.leader != preferred]
        assert len(elsewhere) * 100 > percentage * len(mine), "only a broker past the threshold"


# -- adding partitions -------------------------------------------------------------------------


CURRENT = {0: (1, 2), 1: (2, 3)}


@pytest.mark.parametrize("count", [1, 2])
def test_growth_to_fewer_or_as_many_partitions_is_refused(count: int) -> None:
    growth = plan_growth("t", CURRENT, count, None, {1, 2, 3}, start_index=0)
    assert (growth.added, growth.error) == ({}, ErrorCode.INVALID_PARTITIONS)
    assert "'t' has 2 partition(s)" in str(growth.message) and "nothing was changed" in str(growth.message)


@pytest.mark.parametrize(
    ("assignments", "why"),
    [
        ([(1, 3), (2, 1)], "replica list(s)"),  # two lists for one new partition
        ([(3, 3)], "twice"),
        ([(1, 2, 3)], "replication factor is 2"),
        ([(1, 9)], "not live"),
    ],
)
def test_an_explicit_assignment_is_refused_when_it_cannot_be_honoured(
    assignments: list[tuple[int, ...]], why: str
) -> None:
    growth = plan_growth("t", CURRENT, 3, assignments, {1, 2, 3}, start_index=0)
    assert growth.error is ErrorCode.INVALID_REPLICA_ASSIGNMENT and why in str(growth.message)
    assert growth.added == {}


def test_an_explicit_assignment_is_honoured_and_a_spread_continues_the_topics() -> None:
    assert plan_growth("t", CURRENT, 3, [(3, 1)], {1, 2, 3}, start_index=0).added == {2: (3, 1)}
    start = growth_start_index(CURRENT, {1, 2, 3}, fallback=0)
    assert start == 0  # partition 0's preferred replica is broker 1, the first live broker
    added = plan_growth("t", CURRENT, 5, None, {1, 2, 3}, start_index=start).added
    assert sorted(added) == [2, 3, 4]
    assert [r[0] for r in added.values()] == [3, 1, 2], "the round robin goes on from partition 2"
    assert all(len(set(r)) == 2 for r in added.values())


@settings(max_examples=200)
@given(
    st.integers(1, 6),
    st.integers(1, 3),
    st.integers(1, 12),
    st.lists(st.integers(1, 6), min_size=1, max_size=6, unique=True),
)
def test_added_partitions_keep_the_replication_factor_on_live_brokers(
    existing: int, factor: int, count: int, live: list[int]
) -> None:
    current = {p: tuple(range(1, factor + 1)) for p in range(existing)}
    growth = plan_growth("t", current, count, None, set(live), start_index=0)
    if count <= existing:
        assert growth.error is ErrorCode.INVALID_PARTITIONS
    elif factor > len(live):
        assert growth.error is ErrorCode.INVALID_REPLICATION_FACTOR
    else:
        assert sorted(growth.added) == list(range(existing, count))
        assert all(len(set(r)) == factor and set(r) <= set(live) for r in growth.added.values())


# -- reassignments ---------------------------------------------------------------------------------


TOPICS = {"t": TopicAssignment("t", uuid.uuid4(), {0: (1, 2), 1: (2, 3)})}


def test_a_move_is_added_retargeted_and_cancelled_back_to_where_it_started() -> None:
    first = merge_reassignments([], [ReassignmentRequest("t", 0, (2, 3))], TOPICS, {1, 2, 3})
    assert first.results == {("t", 0): (ErrorCode.NONE, None)}
    assert first.moves == [Reassignment("t", 0, (2, 3), (1, 2))]
    again = merge_reassignments(first.moves, [ReassignmentRequest("t", 0, (3, 1))], TOPICS, {1, 2, 3})
    assert again.moves == [Reassignment("t", 0, (3, 1), (1, 2))], "a new target keeps where it started"
    # Once the move has begun (the partition holds old and new replicas), a cancellation goes back.
    started = {"t": TopicAssignment("t", TOPICS["t"].topic_id, {0: (1, 2, 3), 1: (2, 3)})}
    cancel = merge_reassignments(again.moves, [ReassignmentRequest("t", 0, None)], started, {1, 2, 3})
    assert cancel.moves == [Reassignment("t", 0, (1, 2), (1, 2))]
    # Not begun: the cancellation only drops it.
    assert (
        merge_reassignments(again.moves, [ReassignmentRequest("t", 0, None)], TOPICS, {1, 2, 3}).moves == []
    )


@pytest.mark.parametrize(
    ("request_", "error"),
    [
        (ReassignmentRequest("t", 1, None), ErrorCode.NO_REASSIGNMENT_IN_PROGRESS),
        (ReassignmentRequest("t", 7, (1,)), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        (ReassignmentRequest("u", 0, (1,)), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        (ReassignmentRequest("t", 0, (1, 9)), ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        (ReassignmentRequest("t", 0, (1, 1)), ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        (ReassignmentRequest("t", 0, ()), ErrorCode.INVALID_REPLICA_ASSIGNMENT),
    ],
)
def test_a_refused_reassignment_changes_nothing(request_: ReassignmentRequest, error: ErrorCode) -> None:
    pending = [Reassignment("t", 0, (2, 3), (1, 2))]
    merged = merge_reassignments(pending, [request_], TOPICS, {1, 2, 3})
    assert merged.results[(request_.topic, request_.partition)][0] is error
    assert merged.moves == pending


def test_a_replication_factor_change_is_refused_when_not_allowed() -> None:
    merged = merge_reassignments(
        [], [ReassignmentRequest("t", 0, (1, 2, 3))], TOPICS, {1, 2, 3}, allow_replication_factor_change=False
    )
    assert merged.results[("t", 0)][0] is ErrorCode.INVALID_REPLICATION_FACTOR and merged.moves == []


def test_an_ongoing_reassignment_lists_the_replicas_it_adds_and_removes() -> None:
    started = {"t": TopicAssignment("t", uuid.uuid4(), {0: (1, 2, 3), 1: (2, 3)})}
    (ongoing,) = ongoing_reassignments([Reassignment("t", 0, (2, 3), (1, 2))], started)
    assert (ongoing.replicas, ongoing.adding, ongoing.removing) == ((1, 2, 3), (3,), (1,))


# -- configs -----------------------------------------------------------------------------------


def test_incremental_operations_set_delete_append_and_subtract() -> None:
    current = {"retention.ms": "1000", "cleanup.policy": "delete"}
    ops = [
        ConfigOp("retention.ms", DELETE, None),
        ConfigOp("max.message.bytes", SET, "2000"),
        ConfigOp("cleanup.policy", APPEND, "compact"),
    ]
    assert apply_incremental(current, ops, {}) == {
        "max.message.bytes": "2000",
        "cleanup.policy": "delete,compact",
    }
    sub = apply_incremental(
        {"cleanup.policy": "delete,compact"}, [ConfigOp("cleanup.policy", SUBTRACT, "delete")], {}
    )
    assert sub == {"cleanup.policy": "compact"}
    unset = apply_incremental(
        {}, [ConfigOp("cleanup.policy", APPEND, "compact")], {"cleanup.policy": "delete"}
    )
    assert unset == {"cleanup.policy": "delete,compact"}, "APPEND to an unset list starts from its default"


@pytest.mark.parametrize(
    ("ops", "named"),
    [
        ([ConfigOp("retention.ms", APPEND, "5")], "'retention.ms'"),
        ([ConfigOp("retention.ms", SET, "5"), ConfigOp("retention.ms", DELETE, None)], "'retention.ms'"),
        ([ConfigOp("retention.ms", SET, None)], "'retention.ms'"),
        ([ConfigOp("retention.ms", 9, "5")], "'retention.ms'"),
    ],
)
def test_an_impossible_operation_is_refused_naming_the_key(ops: list[ConfigOp], named: str) -> None:
    with pytest.raises(ConfigRefusal, match=named):
        apply_incremental({}, ops, {})


def test_alter_configs_replaces_the_whole_set() -> None:
    assert apply_full([ConfigOp("a", SET, "1"), ConfigOp("b", SET, None)]) == {"a": "1"}
    with pytest.raises(ConfigRefusal, match="'a'"):
        apply_full([ConfigOp("a", SET, "1"), ConfigOp("a", SET, "2")])


def test_broker_configs_changed_live_are_the_log_defaults_and_others_are_refused_by_name() -> None:
    dynamic = log_default_keys()
    static = frozenset({"num.partitions", "broker.id", "max.connections"})

    def refusal(config: dict[str, str], cluster_default: bool = False) -> str | None:
        return broker_config_refusal(config, dynamic, static, cluster_default=cluster_default)

    assert refusal({"log.retention.ms": "60000", "message.max.bytes": "2000"}) is None
    assert "Cannot update these configs dynamically: num.partitions" in str(refusal({"num.partitions": "3"}))
    assert "read from the brokers' configuration files" in str(refusal({"max.connections": "3"}))
    bad = refusal({"log.retention.ms": "soon"})
    assert bad is not None and "log.retention.ms" in bad and "soon" in bad


def test_broker_keys_are_answered_as_kafka_3_9_answers_them() -> None:
    """librdkafka's and confluent-kafka's own integration tests alter
    sasl.kerberos.min.time.before.relogin on a broker: Kafka 3.9.1 takes it (NONE) and Sluice
    refused it (INVALID_CONFIG, "unknown broker config"); a key neither knows Kafka keeps too.
    tests/conformance (wire scenario broker_configs) compares every key with the peer."""
    dynamic = log_default_keys()
    static = frozenset(s.key for s in BROKER_SETTINGS) - frozenset(dynamic)

    def refusal(config: dict[str, str], cluster_default: bool = False) -> str | None:
        return broker_config_refusal(config, dynamic, static, cluster_default=cluster_default)

    assert refusal({"sasl.kerberos.min.time.before.relogin": "58000"}) is None
    assert refusal({"no.such.key": "1"}) is None  # kept for plugins, as Kafka keeps it
    assert refusal({"compression.type": "zstd", "log.roll.jitter.ms": "10"}) is None  # live log defaults
    # Kafka's own refusals, in Kafka's words
    assert "broker id must be specified: sasl.kerberos.min.time.before.relogin" in str(
        refusal({"sasl.kerberos.min.time.before.relogin": "58000"}, cluster_default=True)
    )
    assert "Not a number of type LONG" in str(refusal({"sasl.kerberos.min.time.before.relogin": "soon"}))
    assert "only per-listener" in str(refusal({"ssl.keystore.location": "/k.pem"}))
    assert "Cannot update these configs dynamically: log.dirs" in str(refusal({"log.dirs": "/d"}))
    # Kafka takes these; Sluice cannot do what they ask, and says so
    assert "not supported" in str(refusal({"max.connection.creation.rate": "10"}))
    assert "read from the brokers' configuration files" in str(refusal({"listeners": "PLAINTEXT://:9"}))


def test_every_kafka_dynamic_broker_key_has_one_answer_in_sluice() -> None:
    live = set(log_default_keys())
    start = {s.key for s in BROKER_SETTINGS} - live
    listener = {k for k, e in kb.KAFKA_DYNAMIC.items() if e.scope == kb.LISTENER}
    groups = [
        live & set(kb.KAFKA_DYNAMIC),
        start & set(kb.KAFKA_DYNAMIC),
        set(kb.INERT),
        set(kb.SLUICE_REFUSED),
    ]
    groups.append(listener - start)
    assert sum(len(g) for g in groups) == len(kb.KAFKA_DYNAMIC), "each key in exactly one group"
    assert set().union(*groups) == set(kb.KAFKA_DYNAMIC)
    assert not set(kb.KAFKA_DYNAMIC) & kb.KAFKA_STATIC


# -- OffsetDelete --------------------------------------------------------------------------------


def _subscription(*topics: str) -> bytes:
    body = struct.pack(">hi", 1, len(topics))
    for t in topics:
        body += struct.pack(">h", len(t)) + t.encode()
    return body + struct.pack(">i", -1)  # user data: null


def _member(member_id: str, metadata: bytes) -> Member:
    return Member(member_id, None, "c", "h", 10_000, 10_000, "consumer", [("range", metadata)])


def test_a_consumer_groups_offsets_are_deleted_only_for_topics_no_member_subscribes_to() -> None:
    assert subscribed_topics(_subscription("a", "b")) == {"a", "b"}
    group = Group("g")
    group.state, group.protocol_type, group.protocol = GroupState.STABLE, "consumer", "range"
    group.members = {"m": _member("m", _subscription("a"))}
    decision = offset_deletion(group, [("a", 0), ("b", 0), ("b", 1)])
    assert decision.error is ErrorCode.NONE
    assert decision.partitions == {
        ("a", 0): ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC,
        ("b", 0): ErrorCode.NONE,
        ("b", 1): ErrorCode.NONE,
    }
    assert decision.delete == (("b", 0), ("b", 1))
    group.members = {"m": _member("m", b"\x00")}  # unreadable: counts as subscribed to everything
    assert offset_deletion(group, [("b", 0)]).delete == ()


def test_offset_delete_of_an_unknown_or_busy_foreign_group_is_refused() -> None:
    assert offset_deletion(None, [("a", 0)]).error is ErrorCode.GROUP_ID_NOT_FOUND
    group = Group("w")
    group.state, group.protocol_type, group.protocol = GroupState.STABLE, "sluice-worker", "x"
    group.members = {"m": _member("m", b"")}
    assert offset_deletion(group, [("a", 0)]).error is ErrorCode.NON_EMPTY_GROUP
    group.members, group.state = {}, GroupState.EMPTY
    assert offset_deletion(group, [("a", 0)]).delete == (("a", 0),)


def test_inert_keys_have_kafkas_defaults_and_types() -> None:
    assert set(kb.INERT_DEFAULTS) == set(kb.INERT)
    for key, default in kb.INERT_DEFAULTS.items():
        if default is not None:
            assert kb.type_refusal(key, default, kb.KAFKA_DYNAMIC[key].type) is None, key
