"""Per-topic log configuration, parsed from Kafka's topic config names."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Final

from sluice.storage.topic_configs import ACCEPTED_TOPIC_CONFIGS, check_accepted

__all__ = ["COMPRESSION_TYPES", "LONG_MAX", "LogConfig", "known_topic_configs"]

LONG_MAX: Final = 2**63 - 1
_DAY_MS: Final = 24 * 60 * 60 * 1000
_TIMESTAMP_TYPES: Final = ("CreateTime", "LogAppendTime")
#: cleanup.policy values, normalised by ``_parse_policy`` (Kafka takes the list in either order).
_CLEANUP_POLICIES: Final = ("delete", "compact", "compact,delete")


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Settings of one partition's log. Defaults are Kafka's.

    ``flush_messages``/``flush_ms`` of ``LONG_MAX`` mean "never force a flush" (Kafka's default:
    durability comes from replication). ``retention_ms``/``retention_bytes`` of -1 mean no limit.
    """

    segment_bytes: int = 1 << 30
    segment_ms: int = 7 * _DAY_MS
    retention_ms: int = 7 * _DAY_MS
    retention_bytes: int = -1
    flush_messages: int = LONG_MAX
    flush_ms: int = LONG_MAX
    index_interval_bytes: int = 4096
    max_message_bytes: int = 1048588
    #: the leader's codec for what it stores: "producer" (as sent) or a codec's name (KIP-390
    #: levels for gzip (-1: the codec's default), lz4 and zstd)
    compression_type: str = "producer"
    compression_gzip_level: int = -1
    compression_lz4_level: int = 9
    compression_zstd_level: int = 3
    #: CreateTime bounds: how far a record's timestamp may be before / after the broker's clock
    #: (LONG_MAX: unbounded); the deprecated difference applies where the other two are unset
    message_timestamp_difference_max_ms: int = LONG_MAX
    message_timestamp_before_max_ms: int = LONG_MAX
    message_timestamp_after_max_ms: int = LONG_MAX
    #: at most this much is taken, at random per segment, off segment.ms (rolls spread out)
    segment_jitter_ms: int = 0
    #: a segment rolls when its offset (8 bytes an entry) or time (12) index would pass this
    segment_index_bytes: int = 10 * 1024 * 1024
    message_timestamp_type: str = "CreateTime"
    cleanup_policy: str = "delete"
    min_insync_replicas: int = 1
    unclean_leader_election_enable: bool = False
    #: Log compaction (``cleanup.policy`` ``compact`` or ``compact,delete``; storage/compaction.py).
    #: A tombstone is kept this long after the first clean that kept it, then removed.
    delete_retention_ms: int = _DAY_MS
    #: A log is cleaned once its dirty (not yet cleaned) bytes are this share of its cleanable bytes.
    min_cleanable_dirty_ratio: float = 0.5
    #: Records younger than this are never cleaned (segment by segment, by largest timestamp).
    min_compaction_lag_ms: int = 0
    #: A log whose oldest dirty record is older than this is cleaned whatever its dirty ratio,
    #: and its active segment rolls at this age.
    max_compaction_lag_ms: int = LONG_MAX

    def __post_init__(self) -> None:
        self._check_compression_and_bounds()
        _check("segment.bytes", self.segment_bytes, self.segment_bytes >= 14, "must be >= 14")
        _check("segment.ms", self.segment_ms, self.segment_ms >= 1, "must be >= 1")
        _check("retention.ms", self.retention_ms, self.retention_ms >= -1, "must be >= -1")
        _check("retention.bytes", self.retention_bytes, self.retention_bytes >= -1, "must be >= -1")
        _check("flush.messages", self.flush_messages, self.flush_messages >= 1, "must be >= 1")
        _check("flush.ms", self.flush_ms, self.flush_ms >= 0, "must be >= 0")
        _check(
            "index.interval.bytes", self.index_interval_bytes, self.index_interval_bytes >= 0, "must be >= 0"
        )
        _check("max.message.bytes", self.max_message_bytes, self.max_message_bytes >= 0, "must be >= 0")
        _check(
            "message.timestamp.type",
            self.message_timestamp_type,
            self.message_timestamp_type in _TIMESTAMP_TYPES,
            "must be CreateTime or LogAppendTime",
        )
        _check(
            "cleanup.policy",
            self.cleanup_policy,
            self.cleanup_policy in _CLEANUP_POLICIES,
            "must be delete, compact or compact,delete",
        )
        _check("delete.retention.ms", self.delete_retention_ms, self.delete_retention_ms >= 0, "must be >= 0")
        _check(
            "min.cleanable.dirty.ratio",
            self.min_cleanable_dirty_ratio,
            0.0 <= self.min_cleanable_dirty_ratio <= 1.0,
            "must be between 0 and 1",
        )
        min_lag, max_lag = self.min_compaction_lag_ms, self.max_compaction_lag_ms
        _check("min.compaction.lag.ms", min_lag, min_lag >= 0, "must be >= 0")
        _check("max.compaction.lag.ms", max_lag, max_lag >= 1, "must be >= 1")
        if self.compact and self.min_compaction_lag_ms > self.max_compaction_lag_ms:
            raise ValueError(
                f"invalid value {self.max_compaction_lag_ms!r} for topic config 'max.compaction.lag.ms': "
                f"must be >= min.compaction.lag.ms ({self.min_compaction_lag_ms})"
            )
        _check("min.insync.replicas", self.min_insync_replicas, self.min_insync_replicas >= 1, "must be >= 1")

    def _check_compression_and_bounds(self) -> None:
        _check(
            "compression.type",
            self.compression_type,
            self.compression_type in COMPRESSION_TYPES,
            f"must be one of {', '.join(COMPRESSION_TYPES)}",
        )
        for key, level, (lo, hi) in (
            ("compression.gzip.level", self.compression_gzip_level, _GZIP_LEVELS),
            ("compression.lz4.level", self.compression_lz4_level, _LZ4_LEVELS),
            ("compression.zstd.level", self.compression_zstd_level, _ZSTD_LEVELS),
        ):
            ok = lo <= level <= hi or (key == "compression.gzip.level" and level == -1)
            _check(key, level, ok, f"must be between {lo} and {hi}" + (" or -1" if "gzip" in key else ""))
        for key, value in (
            ("message.timestamp.difference.max.ms", self.message_timestamp_difference_max_ms),
            ("message.timestamp.before.max.ms", self.message_timestamp_before_max_ms),
            ("message.timestamp.after.max.ms", self.message_timestamp_after_max_ms),
            ("segment.jitter.ms", self.segment_jitter_ms),
        ):
            _check(key, value, value >= 0, "must be >= 0")
        _check("segment.index.bytes", self.segment_index_bytes, self.segment_index_bytes >= 4, "must be >= 4")

    @property
    def timestamp_before_max_ms(self) -> int:
        """How far before the broker's clock a CreateTime record may be: before.max.ms, or the
        deprecated difference.max.ms while before.max.ms is unset (Kafka 3.9's rule)."""
        before = self.message_timestamp_before_max_ms
        return before if before != LONG_MAX else self.message_timestamp_difference_max_ms

    @property
    def timestamp_after_max_ms(self) -> int:
        """How far after the broker's clock a CreateTime record may be (as the above)."""
        after = self.message_timestamp_after_max_ms
        return after if after != LONG_MAX else self.message_timestamp_difference_max_ms

    @property
    def compact(self) -> bool:
        """The log is compacted: the cleaner keeps the last record per key (``compact``)."""
        return "compact" in self.cleanup_policy.split(",")

    @property
    def delete(self) -> bool:
        """Retention deletes old segments (``delete``; with ``compact`` alone it does not)."""
        return "delete" in self.cleanup_policy.split(",")

    @property
    def log_append_time(self) -> bool:
        """True when the broker stamps batches with its own clock (LogAppendTime)."""
        return self.message_timestamp_type == "LogAppendTime"

    @classmethod
    def from_topic_config(cls, config: Mapping[str, str], base: LogConfig | None = None) -> LogConfig:
        """Build from Kafka topic config names (``segment.bytes`` ...) over ``base`` (or defaults).

        Raises ValueError naming the key and value for unknown keys and invalid values.
        """
        values: dict[str, Any] = {} if base is None else {f.name: getattr(base, f.name) for f in fields(cls)}
        for key, raw in config.items():
            spec = _SPECS.get(key)
            if spec is None and key in ACCEPTED_TOPIC_CONFIGS:
                check_accepted(key, raw)  # a Kafka config whose value Sluice acts on anyway
                continue
            if spec is None:
                raise ValueError(f"unknown topic config {key!r} (value {raw!r})")
            try:
                values[spec.attr] = spec.parse(raw)
            except ValueError as exc:
                raise ValueError(f"invalid value {raw!r} for topic config {key!r}: {exc}") from None
        return cls(**values)

    def to_topic_config(self) -> dict[str, str]:
        """Kafka config names -> string values, for DescribeConfigs."""
        return {key: spec.render(getattr(self, spec.attr)) for key, spec in _SPECS.items()}


def _check(key: str, value: object, ok: bool, why: str) -> None:
    if not ok:
        raise ValueError(f"invalid value {value!r} for topic config {key!r}: {why}")


def _parse_long(raw: str) -> int:
    value = int(raw.strip())
    if not -(2**63) <= value <= LONG_MAX:
        raise ValueError("out of int64 range")
    return value


def _parse_int(raw: str) -> int:
    value = int(raw.strip())
    if not -(2**31) <= value <= 2**31 - 1:
        raise ValueError("out of int32 range")
    return value


def _parse_bool(raw: str) -> bool:
    v = raw.strip().lower()
    if v not in ("true", "false"):
        raise ValueError("must be true or false")
    return v == "true"


def _parse_str(raw: str) -> str:
    return raw.strip()


def _parse_policy(raw: str) -> str:
    """``delete``, ``compact``, or both as a list in any order (normalised to ``compact,delete``)."""
    words = {w.strip().lower() for w in raw.split(",") if w.strip()}
    if not words or not words <= {"delete", "compact"}:
        raise ValueError("must be delete, compact or compact,delete")
    return ",".join(sorted(words))


def _parse_ratio(raw: str) -> float:
    value = float(raw.strip())
    if value != value:  # NaN
        raise ValueError("not a number")
    return value


def _render(value: object) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


@dataclass(frozen=True, slots=True)
class _Spec:
    attr: str
    parse: Callable[[str], Any]
    doc: str
    render: Callable[[Any], str] = _render


COMPRESSION_TYPES: Final = ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")
_GZIP_LEVELS: Final = (1, 9)
_LZ4_LEVELS: Final = (1, 17)
_ZSTD_LEVELS: Final = (-131072, 22)

_SPECS: Final[dict[str, _Spec]] = {
    "segment.bytes": _Spec("segment_bytes", _parse_int, "Maximum size of a single log segment file."),
    "segment.ms": _Spec("segment_ms", _parse_long, "Time after which a segment is rolled even if not full."),
    "retention.ms": _Spec(
        "retention_ms", _parse_long, "Maximum age of a segment before deletion; -1 = forever."
    ),
    "retention.bytes": _Spec(
        "retention_bytes",
        _parse_long,
        "Maximum partition size before old segments are deleted; -1 = no limit.",
    ),
    "flush.messages": _Spec("flush_messages", _parse_long, "Force an fsync after this many messages."),
    "flush.ms": _Spec("flush_ms", _parse_long, "Force an fsync when data is older than this many ms."),
    "index.interval.bytes": _Spec("index_interval_bytes", _parse_int, "Bytes between offset index entries."),
    "max.message.bytes": _Spec("max_message_bytes", _parse_int, "Largest record batch size allowed."),
    "message.timestamp.type": _Spec("message_timestamp_type", _parse_str, "CreateTime or LogAppendTime."),
    "cleanup.policy": _Spec(
        "cleanup_policy",
        _parse_policy,
        "delete (retention deletes old segments), compact (the cleaner keeps the last record per key) "
        "or compact,delete (both).",
    ),
    "delete.retention.ms": _Spec(
        "delete_retention_ms",
        _parse_long,
        "How long a tombstone of a compacted topic is kept after the first clean that kept it.",
    ),
    "min.cleanable.dirty.ratio": _Spec(
        "min_cleanable_dirty_ratio",
        _parse_ratio,
        "Share of a compacted log's cleanable bytes that must be dirty before it is cleaned.",
    ),
    "min.compaction.lag.ms": _Spec(
        "min_compaction_lag_ms", _parse_long, "Records younger than this are never compacted."
    ),
    "max.compaction.lag.ms": _Spec(
        "max_compaction_lag_ms",
        _parse_long,
        "A record older than this is compacted whatever the dirty ratio (its segment rolls at this age).",
    ),
    "min.insync.replicas": _Spec("min_insync_replicas", _parse_int, "Minimum in-sync replicas for acks=all."),
    "unclean.leader.election.enable": _Spec(
        "unclean_leader_election_enable", _parse_bool, "Allow out-of-sync replicas to become leader."
    ),
}


def known_topic_configs() -> dict[str, tuple[str, str]]:
    """Kafka config name -> (default value as a string, documentation), for DescribeConfigs."""
    defaults = LogConfig()
    known = {key: (spec.render(getattr(defaults, spec.attr)), spec.doc) for key, spec in _SPECS.items()}
    for key, accepted in ACCEPTED_TOPIC_CONFIGS.items():
        known.setdefault(key, (accepted.default, accepted.doc))
    return known


# Kafka 3.9 topic configs honoured beyond the first ones (the topic_configs module holds those
# accepted for what Sluice does anyway, and those refused).
_SPECS.update(
    {
        "compression.type": _Spec(
            "compression_type",
            _parse_str,
            "The codec the leader stores batches with: producer (as sent), uncompressed, gzip, snappy, "
            "lz4 or zstd; a batch sent with another codec is re-encoded before it is appended.",
        ),
        "compression.gzip.level": _Spec(
            "compression_gzip_level", _parse_int, "gzip level (1-9, -1: default) when compression.type=gzip."
        ),
        "compression.lz4.level": _Spec(
            "compression_lz4_level", _parse_int, "lz4 level (1-17) when compression.type=lz4."
        ),
        "compression.zstd.level": _Spec(
            "compression_zstd_level", _parse_int, "zstd level (-131072-22) when compression.type=zstd."
        ),
        "message.timestamp.difference.max.ms": _Spec(
            "message_timestamp_difference_max_ms",
            _parse_long,
            "Deprecated: the bound before and after the broker's clock where before/after.max.ms are unset.",
        ),
        "message.timestamp.before.max.ms": _Spec(
            "message_timestamp_before_max_ms",
            _parse_long,
            "CreateTime: a record older than the broker's clock by more is refused (INVALID_TIMESTAMP).",
        ),
        "message.timestamp.after.max.ms": _Spec(
            "message_timestamp_after_max_ms",
            _parse_long,
            "CreateTime: a record ahead of the broker's clock by more is refused (INVALID_TIMESTAMP).",
        ),
        "segment.jitter.ms": _Spec(
            "segment_jitter_ms", _parse_long, "Random time taken off segment.ms per segment."
        ),
        "segment.index.bytes": _Spec(
            "segment_index_bytes", _parse_int, "A segment rolls when either of its indexes would pass this."
        ),
    }
)
