"""What a compacted log must read as, independent of how the cleaner gets there: the checks the
hypothesis properties of tests/unit/test_compaction_rules.py (pure) and test_cleaner.py (files)
share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Rec = tuple[int, bytes | None, bool]  # (offset, key, tombstone)


def check_compacted(
    records: Sequence[Rec],
    history: Sequence[Rec],
    *,
    end: int,
    now_ms: int,
    first_cleaned_at: Mapping[int, int],
    delete_retention_ms: int,
) -> None:
    """``records``: what the log reads as after a clean at ``now_ms`` up to ``end``; ``history``:
    every record ever appended; ``first_cleaned_at``: for each tombstone, when the first clean
    whose clean point passed it ran."""
    offsets = [o for o, _k, _t in records]
    assert offsets == sorted(set(offsets)), "offsets ascend, each once"
    appended = {o: (k, t) for o, k, t in history}
    assert all(appended.get(o) == (k, t) for o, k, t in records), (
        "every record is one appended, at its offset"
    )
    above = [r for r in records if r[0] >= end]
    assert above == [r for r in history if r[0] >= end], "R6: nothing at or above the clean point changes"
    below = [r for r in records if r[0] < end]
    assert all(k is not None for _o, k, _t in below), "R1: no keyless record below the clean point"
    keys = [k for _o, k, _t in below]
    assert len(keys) == len(set(keys)), "below the clean point each key appears once"
    # Each key's last record below the clean point is the last one appended there, unless it is a
    # tombstone whose delete.retention.ms has passed since the first clean that passed it.
    last_below: dict[bytes, tuple[int, bool]] = {}
    for o, k, t in history:
        if o < end and k is not None:
            last_below[k] = (o, t)
    got = {k: (o, t) for o, k, t in below if k is not None}
    for k, (o, t) in last_below.items():
        if t and now_ms >= first_cleaned_at[o] + delete_retention_ms:
            assert k not in got, f"tombstone {k!r}@{o} kept past its horizon"
        else:
            assert got.get(k) == (o, t), f"{k!r}: last below {end} is {(o, t)}, the log has {got.get(k)}"
