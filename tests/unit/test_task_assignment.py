"""The task assignment: complete, balanced, sticky."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluice.sync.assignment import assign

names = st.text("abcdefgh", min_size=1, max_size=3)


@given(
    tasks=st.sets(names, max_size=20),
    current=st.dictionaries(st.text("wxyz", min_size=1, max_size=2), st.lists(names, max_size=8), max_size=5),
)
def test_every_task_once_and_balanced(tasks: set[str], current: dict[str, list[str]]) -> None:
    out = assign(sorted(tasks), current)
    if not current:
        assert out == {}
        return
    got = [t for ts in out.values() for t in ts]
    assert sorted(got) == sorted(tasks)
    loads = [len(ts) for ts in out.values()]
    assert max(loads) - min(loads) <= 1


@given(tasks=st.sets(names, min_size=1, max_size=20), members=st.integers(1, 5))
def test_a_stable_group_moves_nothing_and_a_new_member_takes_only_its_share(
    tasks: set[str], members: int
) -> None:
    first = assign(sorted(tasks), {f"m{i}": [] for i in range(members)})
    assert assign(sorted(tasks), first) == first  # nothing changed, nothing moves
    grown = assign(sorted(tasks), {**first, "new": []})
    moved = sum(1 for mem, ts in first.items() for t in ts if t not in grown[mem])
    assert moved == len(grown["new"])  # only what the newcomer takes moves


def test_a_dead_members_tasks_go_to_the_others() -> None:
    out = assign(["a", "b", "c", "d"], {"w1": ["a", "b"], "w2": []})
    assert out == {"w1": ["a", "b"], "w2": ["c", "d"]}
