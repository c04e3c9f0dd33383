"""The broker's view of the cluster: :class:`sluice.cluster.view.ClusterView`, shared with the
controller that runs in the same process (a standby controller's view is warm, so taking over
costs a catch-up, not a read of every partition).

ZooKeeper is the source of truth: nothing here is ever written back.
"""

from __future__ import annotations

from sluice.cluster.view import ChangeListener, ClusterView, PartitionInfo

#: How often a broker re-reads every partition state to repair its view from a hand edit in
#: ZooKeeper (the state-change notices carry every change Sluice itself writes).
VERIFY_INTERVAL_S = 300.0


MetadataCache = ClusterView


__all__ = ["VERIFY_INTERVAL_S", "ChangeListener", "MetadataCache", "PartitionInfo"]
