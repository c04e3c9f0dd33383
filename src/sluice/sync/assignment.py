"""Which worker runs which task: a pure, sticky and balanced assignment.

The group leader computes it from the task ids in ZooKeeper and what each member says it runs
now. Every task goes to exactly one member; loads differ by at most one; a task stays where it
runs unless its member must shed load or is gone, so a rebalance stops and starts only the
tasks that move.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def assign(tasks: Sequence[str], current: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """`current` maps member id -> tasks it runs now; returns member id -> tasks to run."""
    members = sorted(current)
    if not members:
        return {}
    wanted = set(tasks)
    n, m = len(wanted), len(members)
    base, extra = divmod(n, m)
    # Members that keep the most of their tasks get the +1 slots, so fewer tasks move.
    keep_counts = {mem: len([t for t in current[mem] if t in wanted]) for mem in members}
    by_keep = sorted(members, key=lambda mem: (-keep_counts[mem], mem))
    quota = {mem: base + (1 if i < extra else 0) for i, mem in enumerate(by_keep)}
    out: dict[str, list[str]] = {mem: [] for mem in members}
    taken: set[str] = set()
    for mem in members:
        for t in sorted(current[mem]):
            if t in wanted and t not in taken and len(out[mem]) < quota[mem]:
                out[mem].append(t)
                taken.add(t)
    for t in sorted(wanted - taken):
        mem = min(members, key=lambda x: (len(out[x]) - quota[x], len(out[x]), x))
        out[mem].append(t)
    return {mem: sorted(ts) for mem, ts in out.items()}
