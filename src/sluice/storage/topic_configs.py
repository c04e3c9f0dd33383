"""Kafka 3.9 topic configs that Sluice accepts without a setting of its own: the value means what
Sluice does anyway, or is refused naming what Sluice does not do.

Every other topic config Kafka defines is a ``LogConfig`` field (``config.py``) that Sluice
honours. Each entry here checks a value as Kafka's ``LogConfig`` would (a malformed one raises
ValueError: INVALID_CONFIG), then decides, as a pure function of the value, whether it describes
what Sluice does (accepted and stored with the topic, so DescribeConfigs shows it) or something
Sluice does not do (refused: ValueError saying what that is and what to do instead).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

__all__ = [
    "ACCEPTED_TOPIC_CONFIGS",
    "KAFKA_VERSIONS",
    "AcceptedConfig",
    "check_accepted",
    "kafka_version_known",
]

_LONG_MIN: Final = -(2**63)
_LONG_MAX: Final = 2**63 - 1


@dataclass(frozen=True, slots=True)
class AcceptedConfig:
    """A topic config Sluice takes without acting on it. ``refusal(raw)``: None when the value
    describes what Sluice does, else why Sluice cannot do it (raises ValueError when ``raw`` is
    not a valid value at all)."""

    key: str
    default: str
    refusal: Callable[[str], str | None]
    doc: str


def _bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise ValueError("must be true or false")
    return value == "true"


def _long_at_least(lo: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError("must be an integer") from None
        if not max(lo, _LONG_MIN) <= value <= _LONG_MAX:
            raise ValueError(f"must be >= {lo}")
        return value

    return parse


#: Kafka 3.9's versions (its MetadataVersion): each release with the number of its internal
#: versions (IV0 ...; 0 for the releases before 0.10, which have none).
_RELEASES: Final = {
    "0.8.0": 0, "0.8.1": 0, "0.8.2": 0, "0.9.0": 0, "0.10.0": 2, "0.10.1": 3, "0.10.2": 1, "0.11.0": 3,
    "1.0": 1, "1.1": 1, "2.0": 2, "2.1": 3, "2.2": 2, "2.3": 2, "2.4": 2, "2.5": 1, "2.6": 1, "2.7": 3,
    "2.8": 2, "3.0": 2, "3.1": 1, "3.2": 1, "3.3": 4, "3.4": 1, "3.5": 3, "3.6": 3, "3.7": 5, "3.8": 1,
    "3.9": 1,
}  # fmt: skip
#: Internal versions of a release Kafka 3.9 knows ahead of it: named only with their IV.
_AHEAD: Final = {"4.0": 2}
#: Every name Kafka 3.9 takes for a version: a release, or a release and one of its IVs.
KAFKA_VERSIONS: Final = frozenset(_RELEASES) | frozenset(
    f"{release}-IV{n}" for release, count in (_RELEASES | _AHEAD).items() for n in range(count)
)


def kafka_version_known(raw: str) -> bool:
    """Kafka's ``MetadataVersion.fromVersionString``: a name of ``KAFKA_VERSIONS``, where a
    longer dotted name counts by its first three parts (a 0.x release) or two (later ones), so
    0.10.0.0 is 0.10.0 and 2.8.1 is 2.8, after the spaces around it (Kafka trims a string
    config); what Kafka 3.9.1 takes, compared with the peer name by name."""
    raw = raw.strip()
    parts = raw.split(".")
    keep = 3 if raw.startswith("0.") else 2
    return (".".join(parts[:keep]) if len(parts) > keep else raw) in KAFKA_VERSIONS


#: Kafka's throttled-replica list: "*", or partition:broker pairs separated by commas.
_THROTTLED = re.compile(r"^\s*(\*|\d+:\d+(\s*,\s*\d+:\d+)*)?\s*$")


def _no_effect(parse: Callable[[str], object]) -> Callable[[str], str | None]:
    """A config every valid value of which means what Sluice does."""

    def refusal(raw: str) -> str | None:
        parse(raw)
        return None

    return refusal


def _preallocate(raw: str) -> str | None:
    if _bool(raw):
        return "Sluice does not preallocate segment files (a segment's file grows with its records)"
    return None


def _message_format_version(raw: str) -> str | None:
    if not kafka_version_known(raw):
        raise ValueError("must be a Kafka version such as 0.10.0, 2.8 or 3.0-IV1")
    # Kafka 3.x ignores it (KIP-724: deprecated, with a warning) and writes the v2 format
    # whatever it says, and so does Sluice (storage/config.py logs the warning)
    return None


def _throttled_replicas(raw: str) -> str | None:
    if not _THROTTLED.match(raw):
        raise ValueError("must be '*' or a list of partition:broker pairs, e.g. 0:1,1:2")
    if raw.strip():
        return "replication throttling is not supported (followers always fetch at full speed)"
    return None


def _remote_storage(raw: str) -> str | None:
    if _bool(raw):
        return "tiered storage is not supported (every segment stays on the brokers' disks)"
    return None


_ENTRIES: Final = (
    AcceptedConfig(
        "file.delete.delay.ms",
        "60000",
        _no_effect(_long_at_least(0)),
        "Accepted; Sluice deletes a segment's files at once: its reads copy bytes out of a segment on "
        "the thread that deletes it, so no reader can be inside a deleted file.",
    ),
    AcceptedConfig(
        "preallocate", "false", _preallocate, "false only: Sluice does not preallocate segment files."
    ),
    AcceptedConfig(
        "message.format.version",
        "3.0-IV1",
        _message_format_version,
        "Accepted and ignored, as Kafka 3.x does: records are always stored in the v2 format (magic 2).",
    ),
    AcceptedConfig(
        "message.downconversion.enable",
        "true",
        _no_effect(_bool),
        "Accepted; no down-conversion ever happens: Sluice serves only Fetch versions of the v2 format.",
    ),
    AcceptedConfig(
        "leader.replication.throttled.replicas",
        "",
        _throttled_replicas,
        "Empty only: replication throttling is not supported.",
    ),
    AcceptedConfig(
        "follower.replication.throttled.replicas",
        "",
        _throttled_replicas,
        "Empty only: replication throttling is not supported.",
    ),
    AcceptedConfig(
        "remote.storage.enable", "false", _remote_storage, "false only: tiered storage is not supported."
    ),
    AcceptedConfig(
        "local.retention.ms",
        "-2",
        _no_effect(_long_at_least(-2)),
        "Accepted; without tiered storage the local log is the whole log (retention.ms applies), as in "
        "Kafka with remote.storage.enable=false.",
    ),
    AcceptedConfig(
        "local.retention.bytes",
        "-2",
        _no_effect(_long_at_least(-2)),
        "Accepted; without tiered storage the local log is the whole log (retention.bytes applies).",
    ),
    AcceptedConfig(
        "remote.log.copy.disable",
        "false",
        _no_effect(_bool),
        "Accepted; nothing is copied to remote storage (tiered storage is not supported).",
    ),
    AcceptedConfig(
        "remote.log.delete.on.disable",
        "false",
        _no_effect(_bool),
        "Accepted; there is no remote storage to delete from.",
    ),
)

ACCEPTED_TOPIC_CONFIGS: Final[dict[str, AcceptedConfig]] = {e.key: e for e in _ENTRIES}


def check_accepted(key: str, raw: str) -> None:
    """Raise ValueError naming ``key`` if ``raw`` is malformed or asks for what Sluice does not do."""
    entry = ACCEPTED_TOPIC_CONFIGS[key]
    try:
        refusal = entry.refusal(raw)
    except ValueError as exc:
        raise ValueError(f"invalid value {raw!r} for topic config {key!r}: {exc}") from None
    if refusal is not None:
        raise ValueError(
            f"{key}={raw.strip()}: {refusal}; leave it out or set it to {entry.default!r}, what Sluice does"
        )
