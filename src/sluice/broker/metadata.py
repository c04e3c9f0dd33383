"""The broker's view of the cluster: :class:`sluice.cluster.view.ClusterView`, shared with the
controller that runs in the same process (a standby controller's view is warm, so taking over
costs a catch-up, not a read of every partition).

ZooKeeper is the source of truth: nothing here is ever written back.
"""

from __future__ import annotations

from typing import Any

from sluice.cluster.view import ChangeListener, ClusterView, PartitionInfo

#: How often a broker re-reads every partition state to repair its view from a hand edit in
#: ZooKeeper (the state-change notices carry every change Sluice itself writes).
VERIFY_INTERVAL_S = 300.0


MetadataCache = ClusterView


def requested_topics(version: int, topics: list[Any] | None) -> list[Any] | None:
    """The topics a Metadata request names, or None for every topic: a null list from v1 on,
    and an empty one in v0, whose list cannot be null (Kafka's ``MetadataRequest.isAllTopics``;
    clients that fall back to Kafka 0.9's protocol, librdkafka's ``broker.version.fallback``,
    send it). The handler and the authorization guard both read the request through this."""
    if version == 0 and not topics:
        return None
    return topics


__all__ = ["VERIFY_INTERVAL_S", "ChangeListener", "MetadataCache", "PartitionInfo", "requested_topics"]
