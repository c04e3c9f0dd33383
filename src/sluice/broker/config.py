"""Broker configuration: what one broker process needs to know about itself and its cluster."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: Kafka's default for ``socket.request.max.bytes``: frames above it close the connection.
SOCKET_REQUEST_MAX_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    broker_id: int
    data_dir: Path
    zookeeper: str
    host: str = "127.0.0.1"
    port: int = 9092
    advertised_host: str | None = None
    rack: str | None = None
    zk_session_timeout_s: float = 6.0
    socket_request_max_bytes: int = SOCKET_REQUEST_MAX_BYTES
    #: Partitions of a topic created without a count (Kafka's ``num.partitions``).
    num_partitions: int = 1
    #: ``-1``: min(3, live brokers), which is Kafka's behaviour for ``default.replication.factor``
    #: on a cluster of three or more and the only workable value on a smaller one.
    default_replication_factor: int = -1
    auto_create_topics: bool = False
    offsets_topic_partitions: int = 50
    #: How long the first rebalance of an empty group waits for more members (Kafka's
    #: ``group.initial.rebalance.delay.ms``, 3000 there; shorter here for quick starts).
    group_initial_rebalance_delay_ms: int = 500
    #: A follower that has not caught up for this long leaves the ISR (Kafka's
    #: ``replica.lag.time.max.ms``; 30 s there, tighter here so failover tests stay short).
    replica_lag_time_max_ms: int = 10_000
    isr_check_interval_ms: int = 500
    #: On SIGTERM, move leadership to other in-sync replicas before stopping.
    controlled_shutdown: bool = True
    controlled_shutdown_timeout_s: float = 15.0
    flush_check_interval_ms: int = 1000
    #: How often changed high watermarks are checkpointed (Kafka's default too).
    hw_checkpoint_interval_ms: int = 5000
    retention_check_interval_ms: int = 60_000
    #: Incremental fetch sessions the broker keeps (Kafka's
    #: ``max.incremental.fetch.session.cache.slots``), and how long one may go unused before it
    #: expires or, once that old, gives its slot to a more valuable one (Kafka's fixed 120 s).
    fetch_session_cache_slots: int = 1000
    fetch_session_eviction_ms: int = 120_000
    #: Period of the controller's leaderless-partition sweep (I5).
    controller_sweep_interval_s: float = 2.0

    @property
    def advertised(self) -> tuple[str, int]:
        return (self.advertised_host or self.host, self.port)

    def __post_init__(self) -> None:
        if self.broker_id < 0:
            raise ValueError(f"broker id must be >= 0, got {self.broker_id}")
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
