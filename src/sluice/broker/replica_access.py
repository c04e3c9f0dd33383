"""Replication is a privileged door: who may act as follower R of a partition (I9, I1, I3).

A leader believes what a follower's Fetch says: the offset it fetches from is the follower's log
end, and a follower at the log end counts as caught up. That moves the high watermark, answers
acks=all, and brings the follower back into the ISR. So a request that claims a replica id must
be believed only from a broker that is allowed to replicate and is a live replica of the
partition; any other client asking as replica 2 could otherwise acknowledge acks=all records
that exist on one copy (lost at the next leader failure) and pull a dead broker back into the ISR.

``replica_refusal`` is the one decision, used by the Fetch handler (a ``replica_id >= 0``) and by
OffsetForLeaderEpoch from a follower, on every partition whose follower state such a request
would touch. It reads plain data only: the claim (who asks, as which replica, and the broker's
view of ``/brokers/ids`` when the request arrived) and the partition's assigned replicas.
A refused request touches no follower state and moves no high watermark.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sluice.protocol.errors import ErrorCode
from sluice.security.acl import Operation, Resource
from sluice.security.session import Session

if TYPE_CHECKING:
    from sluice.broker.authz import BrokerAuthorizer as Authorizer


def may_act_as_replica(session: Session, authorizer: Authorizer | None, inter_broker_sasl: bool) -> bool:
    """Whether the connection's principal may replicate (Kafka's ClusterAction on the cluster).

    When the inter-broker listener authenticates (SASL), a connection that did not authenticate
    never may, whichever listener it came in on; with an authorizer, the principal needs
    CLUSTER_ACTION on the cluster (the brokers' user gets it, or is a super user). A cluster
    without either lets every connection claim to be a follower, and the other checks of
    ``replica_refusal`` (a registered, live, assigned replica that is not this broker) are what
    stands between a plain client and the follower state."""
    if inter_broker_sasl and not session.authenticated:
        return False
    if authorizer is not None:
        return authorizer.authorize(session, Operation.CLUSTER_ACTION, Resource.cluster())
    return True


def claimed_replica_id(version: int, req: dict[str, Any]) -> int:
    """The follower a Fetch request claims to come from (-1: a consumer). Fetch v15 moved the
    id from ``ReplicaId`` into the tagged ``ReplicaState`` (KIP-903): both the authorization
    guard and the handler read it here, so neither can take a v15 follower for a consumer."""
    if version >= 15:
        return int((req.get("replica_state") or {}).get("replica_id", -1))
    return int(req.get("replica_id", -1))


@dataclass(frozen=True, slots=True)
class ReplicaClaim:
    """A request that says it comes from follower ``replica_id``, with what the broker knew when
    it arrived: who sent it and which brokers were registered in ``/brokers/ids``."""

    replica_id: int
    session: Session
    local_broker_id: int
    live_brokers: frozenset[int]
    #: may_act_as_replica's answer for the session
    may_replicate: bool = True


def replica_refusal(claim: ReplicaClaim, replicas: Collection[int], current_leader_epoch: int) -> ErrorCode:
    """``ErrorCode.NONE`` if ``claim`` may act as replica ``claim.replica_id`` of a partition
    assigned to ``replicas``; otherwise the error to answer that partition with.

    - The principal may not replicate: TOPIC_AUTHORIZATION_FAILED, as Kafka answers each
      partition of a follower Fetch without ClusterAction.
    - Not a live replica of the partition (not registered in ``/brokers/ids``, not among the
      assigned replicas, or this broker itself): what Kafka answers a fetch from a replica it
      does not recognise, UNKNOWN_LEADER_EPOCH when the request names a leader epoch (the
      follower retries once its metadata catches up), NOT_LEADER_OR_FOLLOWER otherwise. A
      broker whose ZooKeeper session expired must register again before it replicates, so a
      shrink of the ISR by the controller cannot be undone by its fetches.
    """
    if not claim.may_replicate:
        return ErrorCode.TOPIC_AUTHORIZATION_FAILED
    r = claim.replica_id
    if r == claim.local_broker_id or r not in claim.live_brokers or r not in replicas:
        if current_leader_epoch >= 0:
            return ErrorCode.UNKNOWN_LEADER_EPOCH
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    return ErrorCode.NONE
