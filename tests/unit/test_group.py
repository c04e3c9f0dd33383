"""The group state machine and the pure rules of ``sluice.broker.group``."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.broker.group import TRANSITIONS, Group, GroupState, IllegalTransition, Member

S = GroupState
ALL_PAIRS = list(itertools.product(GroupState, GroupState))
ALLOWED = [(a, b) for a, b in ALL_PAIRS if b in TRANSITIONS[a]]
REJECTED = [(a, b) for a, b in ALL_PAIRS if b not in TRANSITIONS[a]]


def member(member_id: str, *protocols: str, protocol_type: str = "consumer") -> Member:
    return Member(
        member_id=member_id,
        group_instance_id=None,
        client_id=member_id,
        client_host="/127.0.0.1",
        session_timeout_ms=6000,
        rebalance_timeout_ms=6000,
        protocol_type=protocol_type,
        protocols=[(name, f"{member_id}:{name}".encode()) for name in protocols],
    )


def group_of(*members: Member) -> Group:
    g = Group("g", protocol_type=members[0].protocol_type if members else None)
    for m in members:
        g.members[m.member_id] = m
    return g


def test_every_state_has_a_row_in_the_transition_table() -> None:
    assert set(TRANSITIONS) == set(GroupState)


@pytest.mark.parametrize(("src", "dst"), ALLOWED, ids=[f"{a.value}->{b.value}" for a, b in ALLOWED])
def test_transition_in_the_table_is_taken(src: GroupState, dst: GroupState) -> None:
    g = Group("g", state=src)
    g.transition(dst)
    assert g.state is dst


@pytest.mark.parametrize(("src", "dst"), REJECTED, ids=[f"{a.value}->{b.value}" for a, b in REJECTED])
def test_transition_not_in_the_table_raises_and_leaves_the_state(src: GroupState, dst: GroupState) -> None:
    g = Group("g", state=src)
    with pytest.raises(IllegalTransition, match=f"{src.value} -> {dst.value}"):
        g.transition(dst)
    assert g.state is src


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        # Kafka's classic protocol never takes these; they would skip a phase of the rebalance.
        (S.EMPTY, S.COMPLETING_REBALANCE),
        (S.EMPTY, S.STABLE),
        (S.PREPARING_REBALANCE, S.STABLE),
        (S.STABLE, S.COMPLETING_REBALANCE),
        (S.DEAD, S.PREPARING_REBALANCE),
        (S.DEAD, S.COMPLETING_REBALANCE),
        (S.DEAD, S.STABLE),
        # No state moves to itself: a repeated transition is a coordinator bug, not a no-op.
        (S.EMPTY, S.EMPTY),
        (S.PREPARING_REBALANCE, S.PREPARING_REBALANCE),
        (S.COMPLETING_REBALANCE, S.COMPLETING_REBALANCE),
        (S.STABLE, S.STABLE),
    ],
    ids=lambda s: s.value,
)
def test_phase_skipping_and_self_transitions_are_illegal(src: GroupState, dst: GroupState) -> None:
    g = Group("g", state=src)
    with pytest.raises(IllegalTransition):
        g.transition(dst)
    assert g.state is src


def test_a_full_rebalance_cycle_is_legal() -> None:
    g = Group("g")
    for state in (
        S.PREPARING_REBALANCE,
        S.COMPLETING_REBALANCE,
        S.STABLE,
        S.PREPARING_REBALANCE,  # a member joined or left
        S.COMPLETING_REBALANCE,
        S.PREPARING_REBALANCE,  # another member joined before the leader synced
        S.EMPTY,  # and everyone left
        S.DEAD,  # deleted
    ):
        g.transition(state)
    assert g.state is S.DEAD


def test_illegal_transition_is_an_assertion_error() -> None:
    # A coordinator bug: it must not be caught by handlers' ordinary error paths.
    assert issubclass(IllegalTransition, AssertionError)


@given(st.lists(st.sampled_from(list(GroupState)), max_size=30))
def test_any_walk_only_ever_moves_along_the_table(walk: list[GroupState]) -> None:
    g = Group("g")
    for dst in walk:
        before = g.state
        try:
            g.transition(dst)
        except IllegalTransition:
            assert dst not in TRANSITIONS[before]
            assert g.state is before
        else:
            assert dst in TRANSITIONS[before]
            assert g.state is dst


# -- protocol selection -----------------------------------------------------------------------------


def test_select_protocol_unanimous_first_choice() -> None:
    g = group_of(member("a", "range", "roundrobin"), member("b", "range", "roundrobin"))
    assert g.select_protocol() == "range"


def test_select_protocol_majority_beats_the_first_members_preference() -> None:
    g = group_of(
        member("a", "range", "roundrobin"),
        member("b", "roundrobin", "range"),
        member("c", "roundrobin", "range"),
    )
    assert g.select_protocol() == "roundrobin"


def test_select_protocol_tie_goes_to_the_first_members_preference() -> None:
    g = group_of(member("a", "roundrobin", "range"), member("b", "range", "roundrobin"))
    assert g.select_protocol() == "roundrobin"
    g = group_of(member("b", "range", "roundrobin"), member("a", "roundrobin", "range"))
    assert g.select_protocol() == "range"


def test_select_protocol_votes_only_for_protocols_every_member_supports() -> None:
    # "sticky" is everyone-but-one's favourite, but "c" lacks it: each votes for its first
    # protocol that all members support.
    g = group_of(
        member("a", "sticky", "roundrobin", "range"),
        member("b", "sticky", "range", "roundrobin"),
        member("c", "range", "roundrobin"),
    )
    assert g.candidate_protocols() == {"range", "roundrobin"}
    assert g.select_protocol() == "range"  # b and c vote range, a votes roundrobin


def test_select_protocol_single_member_gets_its_first_choice() -> None:
    assert group_of(member("a", "beta", "alpha")).select_protocol() == "beta"


def test_select_protocol_with_nothing_in_common_is_a_bug() -> None:
    g = group_of(member("a", "alpha"), member("b", "beta"))
    assert g.candidate_protocols() == set()
    with pytest.raises(AssertionError):
        g.select_protocol()


@given(
    st.lists(
        st.permutations(["alpha", "beta", "gamma"]).map(list),
        min_size=1,
        max_size=9,
    )
)
def test_select_protocol_picks_a_protocol_with_the_most_first_choice_votes(prefs: list[list[str]]) -> None:
    g = group_of(*(member(f"m{i}", *p) for i, p in enumerate(prefs)))
    chosen = g.select_protocol()
    votes = {name: sum(1 for p in prefs if p[0] == name) for name in ("alpha", "beta", "gamma")}
    assert votes[chosen] == max(votes.values())
    tied = [name for name in prefs[0] if votes[name] == max(votes.values())]
    assert chosen == tied[0]


# -- who may join -------------------------------------------------------------------------------------


def test_supports_requires_the_same_protocol_type_and_a_common_protocol() -> None:
    g = group_of(member("a", "alpha", "beta", protocol_type="sluice-worker"))
    assert g.supports("sluice-worker", [("beta", b"")])
    assert not g.supports("consumer", [("beta", b"")])
    assert not g.supports("sluice-worker", [("gamma", b"")])
    assert not g.supports("sluice-worker", [])
    assert not g.supports("", [("alpha", b"")])


def test_new_group_accepts_any_protocol_type() -> None:
    assert Group("g").supports("sluice-worker", [("x", b"")])
    assert Group("g").supports("consumer", [("range", b"")])


def test_group_emptied_of_members_accepts_any_protocol_type() -> None:
    g = Group("g", protocol_type="consumer")  # its consumers have all left; offsets remain
    assert g.supports("sluice-worker", [("x", b"")])
