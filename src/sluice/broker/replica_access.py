"""Replication is a privileged door: who may act as follower R of a partition (I9, I1, I3).

A leader believes what a follower's Fetch says: the offset it fetches from is the follower's log
end, and a follower at the log end counts as caught up. That moves the high watermark, answers
acks=all, and brings the follower back into the ISR. So a request that claims a replica id must
be believed only from a broker that is allowed to replicate and is a live replica of the
partition; any other client asking as replica 2 could otherwise acknowledge acks=all records
that exist on one copy (lost at the next leader failure) and pull a dead broker back into the ISR.

Two gates, both before the request touches anything:

- the connection (``may_act_as_replica``): only the inter-broker listener, and there only a
  broker, may claim a replica id. A claim that fails is answered TOPIC_AUTHORIZATION_FAILED on
  every partition it names (Kafka's answer to a follower fetch without ClusterAction), before
  any topic is looked up, so the answer is the same for a topic that exists and one that does
  not;
- each partition (``replica_refusal``), used by the Fetch handler (a ``replica_id >= 0``) and by
  OffsetForLeaderEpoch from a follower, on every partition whose follower state such a request
  would touch. It reads plain data only: the claim (who asks, as which replica, and the
  broker's view of ``/brokers/ids`` when the request arrived) and the partition's assigned
  replicas.

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
    from sluice.broker.listeners import Listener


def may_act_as_replica(
    session: Session, authorizer: Authorizer | None, inter_broker: Listener, broker_principal: str | None
) -> bool:
    """Whether the connection's principal may replicate: follower fetches are believed only on
    the inter-broker listener, and there only from a broker.

    - Any other listener never (a client port never believes a replica id, whoever asks: Kafka
      believes one on every listener, and without an authorizer from anyone).
    - With an authorizer, the principal needs CLUSTER_ACTION on the cluster (Kafka's ClusterAction:
      the brokers' user gets it, or is a super user).
    - Without one, on a SASL inter-broker listener only ``broker_principal``, the user this broker
      itself authenticates as to the others (``inter.broker.sasl.username``), whose credential
      each broker checks against its own configuration, never ZooKeeper
      (``security.credentials.with_own_user``).
    - An inter-broker listener that authenticates nobody (PLAINTEXT, or SSL without
      ``ssl.client.auth=required``) believes any connection, as Kafka does; the broker warns at
      start (:func:`inter_broker_authenticates`), and ``cluster up`` never configures one."""
    if session.listener != inter_broker.name:
        return False
    if authorizer is not None:
        return authorizer.authorize(session, Operation.CLUSTER_ACTION, Resource.cluster())
    if inter_broker.sasl:
        return broker_principal is not None and session.principal == broker_principal
    return True


def inter_broker_authenticates(inter_broker: Listener, client_auth: str) -> bool:
    """Whether every connection to the inter-broker listener proves who it is: SASL, or TLS with
    a client certificate required (``ssl.client.auth=required``)."""
    return inter_broker.sasl or (inter_broker.tls and client_auth == "required")


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
