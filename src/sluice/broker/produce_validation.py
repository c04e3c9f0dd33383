"""What a producer's records must be before a partition's log sees them, with Kafka's answers:
``ProduceRequest.validateRecords`` (Produce v3+: exactly one record batch per partition, magic
2) and the rules Kafka's LogValidator keeps for a client's batches (a producer id needs a
sequence). Pure functions of the request's bytes; the handler answers what they refuse.

Why exactly one batch: a producer never sends more (every client builds one batch per partition
per request), and each batch is what the request's checks read. Kafka's authorizer decides from
each partition's first batch whether a request carries transactional records; before this rule,
Sluice's log appended whatever followed, so a plain batch followed by a transactional one from a
client with WRITE and no transactional-id ACL opened a transaction no coordinator knew of (issue
33, finding 2). With one batch per partition, the batch the checks read is the batch appended.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sluice.protocol.records import HEADER_SIZE, LOG_OVERHEAD, MAGIC, MAGIC_OFFSET, BatchHeader, parse_header

Body = dict[str, Any]

__all__ = [
    "any_transactional_first",
    "batches",
    "claims_refusal",
    "first_batch",
    "has_transactional_records",
    "records_refusal",
    "transactional_producers",
]


def batches(records: bytes | memoryview | None) -> list[BatchHeader]:
    """The headers of the whole batches in ``records``, in order (a trailing fragment is not a
    batch: the log refuses it as corrupt)."""
    if records is None:
        return []
    out: list[BatchHeader] = []
    pos, end = 0, len(records)
    while end - pos >= HEADER_SIZE:
        header = parse_header(records, pos)
        size = header.batch_length + LOG_OVERHEAD
        if header.batch_length <= 0 or pos + size > end:
            break
        out.append(header)
        pos += size
    return out


def first_batch(records: bytes | memoryview | None) -> BatchHeader | None:
    """The first whole batch's header (``batches(records)[0]``), reading no further."""
    if records is None or len(records) < HEADER_SIZE:
        return None
    header = parse_header(records, 0)
    if header.batch_length <= 0 or header.batch_length + LOG_OVERHEAD > len(records):
        return None
    return header


def records_refusal(records: bytes | memoryview | None, found: list[BatchHeader], version: int) -> str | None:
    """Kafka's words for records a Produce v3+ partition may not carry (INVALID_RECORD), or
    None; ``found``: ``batches(records)``. Kafka answers these with no error message; Sluice
    sends these words."""
    if records is not None and len(records) > MAGIC_OFFSET and records[MAGIC_OFFSET] != MAGIC:
        return (
            f"Produce requests with version {version} are only allowed to contain record batches with "
            f"magic version {MAGIC}"
        )
    if not found:
        return f"Produce requests with version {version} must have at least one record batch per partition"
    if len(found) > 1:
        return (
            f"Produce requests with version {version} are only allowed to contain exactly one record batch "
            f"per partition; this one has {len(found)}: nothing of it was appended"
        )
    return None


def claims_refusal(header: BatchHeader, topic: str, index: int) -> str | None:
    """A producer's batch that claims a producer id must carry a sequence (Kafka's
    LogValidator: INVALID_RECORD), else the idempotence checks would have nothing to check."""
    if header.producer_id >= 0 and header.base_sequence < 0:
        return (
            f"Invalid sequence number {header.base_sequence} in record batch with producerId "
            f"{header.producer_id} in topic partition {topic}-{index}"
        )
    return None


def has_transactional_records(req: Body) -> bool:
    """Does the request carry transactional records? Kafka's rule (RequestUtils.flag): any
    partition's first batch is transactional. With exactly one batch per partition
    (``records_refusal``) that batch is every batch that can be appended."""
    for t in req["topic_data"]:
        for p in t["partition_data"]:
            header = first_batch(p.get("records"))
            if header is not None and header.is_transactional:
                return True
    return False


def any_transactional_first(found: Iterable[list[BatchHeader]]) -> bool:
    """``has_transactional_records`` over the partitions' ``batches`` already read."""
    return any(headers and headers[0].is_transactional for headers in found)


def transactional_producers(found: Iterable[list[BatchHeader]]) -> set[tuple[int, int]]:
    """(producer id, epoch) of every transactional batch with a producer id among the
    partitions' ``found`` batches: more than one is INVALID_PRODUCER_ID_MAPPING, as in Kafka."""
    return {
        (h.producer_id, h.producer_epoch)
        for headers in found
        for h in headers
        if h.is_transactional and h.producer_id >= 0
    }
