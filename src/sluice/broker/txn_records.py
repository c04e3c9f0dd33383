"""The records the transaction coordinator writes to ``__transaction_state``, and their codec.

One record per change of a transactional id's metadata: the key names the id
(``{"v":1,"t":...}``), the value is the whole ``TxnMetadata`` (JSON, sorted keys, versioned),
and a null value is a tombstone (the id expired). Replaying a partition from its start and
keeping the last value per key rebuilds every transactional id of that partition, which is also
why the topic is meant to be compacted: only the last record per key matters. Pure.
"""

from __future__ import annotations

from typing import Any

import orjson

from sluice.broker.txn_state import TxnMetadata, TxnState

VERSION = 1


def encode_key(transactional_id: str) -> bytes:
    return orjson.dumps({"v": VERSION, "t": transactional_id}, option=orjson.OPT_SORT_KEYS)


def decode_key(data: bytes) -> str | None:
    """The transactional id, or None for a record this version does not know (skipped)."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or obj.get("v") != VERSION or not isinstance(obj.get("t"), str):
        return None
    return str(obj["t"])


def encode_value(meta: TxnMetadata | None) -> bytes | None:
    if meta is None:
        return None
    value: dict[str, Any] = {
        "v": VERSION,
        "pid": meta.producer_id,
        "last_pid": meta.last_producer_id,
        "epoch": meta.producer_epoch,
        "last_epoch": meta.last_producer_epoch,
        "timeout_ms": meta.timeout_ms,
        "state": meta.state.value,
        "partitions": sorted([t, p] for t, p in meta.partitions),
        "start_ms": meta.start_ms,
        "update_ms": meta.update_ms,
    }
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def decode_value(transactional_id: str, data: bytes | None) -> TxnMetadata | None:
    """The metadata, or None for a tombstone. Raises ValueError for a value that is not one."""
    if data is None:
        return None
    obj = orjson.loads(data)
    if not isinstance(obj, dict) or obj.get("v") != VERSION:
        raise ValueError(f"a __transaction_state value for {transactional_id!r} of an unknown version")
    return TxnMetadata(
        transactional_id=transactional_id,
        producer_id=int(obj["pid"]),
        last_producer_id=int(obj["last_pid"]),
        producer_epoch=int(obj["epoch"]),
        last_producer_epoch=int(obj["last_epoch"]),
        timeout_ms=int(obj["timeout_ms"]),
        state=TxnState(obj["state"]),
        partitions=frozenset((str(t), int(p)) for t, p in obj["partitions"]),
        start_ms=int(obj["start_ms"]),
        update_ms=int(obj["update_ms"]),
    )
