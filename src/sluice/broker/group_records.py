"""The records the group coordinator writes to ``__consumer_offsets``, and their codec.

Keys and values are JSON (sorted keys), versioned. A key names a group (``{"v":1,"k":"g",
"g":...}``) or a committed offset (``{"v":1,"k":"o","g":...,"t":...,"p":...}``); a null value
is a tombstone. Replaying a partition from its start and keeping the last value per key
rebuilds every group and offset of that partition (a transactional offset counts at its COMMIT
marker, and only if no newer record of its key came first: ``group.complete_txn``). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

VERSION = 1


@dataclass(frozen=True, slots=True)
class GroupKey:
    group_id: str


@dataclass(frozen=True, slots=True)
class OffsetKey:
    group_id: str
    topic: str
    partition: int


Key = GroupKey | OffsetKey


def encode_key(key: Key) -> bytes:
    if isinstance(key, GroupKey):
        obj: dict[str, Any] = {"v": VERSION, "k": "g", "g": key.group_id}
    else:
        obj = {"v": VERSION, "k": "o", "g": key.group_id, "t": key.topic, "p": key.partition}
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)


def decode_key(data: bytes) -> Key | None:
    """The key, or None for a record this version does not know (skipped, not fatal)."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or obj.get("v") != VERSION:
        return None
    if obj.get("k") == "g":
        return GroupKey(str(obj["g"]))
    if obj.get("k") == "o":
        return OffsetKey(str(obj["g"]), str(obj["t"]), int(obj["p"]))
    return None


def encode_value(value: dict[str, Any] | None) -> bytes | None:
    if value is None:
        return None
    return orjson.dumps({"v": VERSION, **value}, option=orjson.OPT_SORT_KEYS)


def decode_value(data: bytes | None) -> dict[str, Any] | None:
    if data is None:
        return None
    obj = orjson.loads(data)
    if not isinstance(obj, dict):
        raise ValueError("a __consumer_offsets value is not a JSON object")
    return obj


def offset_value(
    offset: int, leader_epoch: int, metadata: str | None, commit_timestamp_ms: int
) -> dict[str, Any]:
    return {
        "offset": offset,
        "leader_epoch": leader_epoch,
        "metadata": metadata,
        "commit_ts": commit_timestamp_ms,
    }
