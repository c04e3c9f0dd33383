"""What a request handler sees of the broker: the interface between ``broker.py`` and the modules
that answer Kafka APIs.

The handlers (``handlers.py``, ``admin_*.py``, ``acl_apis.py``, ``scram_apis.py``,
``txn_apis.py``), their authorization guards (``authz.py``, ``authz_admin.py``) and the network
layer that hands each request to its handler (``server.py``) take a :class:`BrokerContext`, never
:class:`sluice.broker.broker.Broker`. ``broker.py`` builds all of them, so importing it back made
the whole package one import circle, and a reader of any handler had to follow an arrow to the
broker's start-up, ISR batching and shutdown to learn what the handler may touch.

The real ``Broker`` satisfies :class:`BrokerContext` structurally: mypy checks it where
``broker.py`` hands itself to the server (``KafkaServer(self)``), so a part renamed or retyped on
one side fails the type check, not a request. Every member is a read-only property: a handler
reads the broker's parts and calls them, it never replaces one.

The parts the broker builds around itself and hands itself to (``TopicAdmin``, the group and
transaction coordinators, the transaction verifier and marker sender, the dynamic configs, the
connection's authentication) each name the narrower part of the broker they need next to their
class (``AdminHost``, ``CoordinatorHost`` ...), so this module can name them without a circle.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from sluice.broker.admin import TopicAdmin
from sluice.broker.authorizer import BrokerAuthorizer
from sluice.broker.config import BrokerConfig
from sluice.broker.coordinator import GroupCoordinator
from sluice.broker.dynamic_config import DynamicBrokerConfig
from sluice.broker.fetch_sessions import FetchSessionCache
from sluice.broker.metadata import MetadataCache
from sluice.broker.producer_ids import ProducerIdManager
from sluice.broker.replica_manager import ReplicaManager
from sluice.broker.txn_coordinator import TransactionCoordinator
from sluice.broker.txn_verification import TxnVerifier
from sluice.cluster.controller import Controller
from sluice.cluster.zkstore import ZkStore
from sluice.protocol.api import RequestHeader
from sluice.security.scram import ScramCredential

#: A decoded request or response: the protocol codec's dict.
Body = dict[str, Any]


class BrokerContext(Protocol):
    """The broker as a request's handler sees it."""

    # -- this broker and the cluster ---------------------------------------------------------------

    @property
    def config(self) -> BrokerConfig:
        """The broker's static configuration (``server.properties``)."""

    @property
    def store(self) -> ZkStore:
        """ZooKeeper: topics, configs, credentials, ACLs and reassignments are written here."""

    @property
    def metadata(self) -> MetadataCache:
        """The broker's view of the cluster (topics, partition states, live brokers)."""

    @property
    def stopping(self) -> bool:
        """True once the broker's stop has begun."""

    # -- the data path -----------------------------------------------------------------------------

    @property
    def replicas(self) -> ReplicaManager:
        """The partitions hosted here: appends, reads, offsets, follower state."""

    @property
    def fetch_sessions(self) -> FetchSessionCache:
        """Incremental fetch sessions (KIP-227)."""

    @property
    def producer_ids(self) -> ProducerIdManager:
        """Blocks of producer ids from ZooKeeper (InitProducerId)."""

    # -- administration --------------------------------------------------------------------------

    @property
    def admin(self) -> TopicAdmin:
        """Topic creation, deletion and description."""

    @property
    def controller(self) -> Controller:
        """This broker's controller candidacy: admin jobs run on it while it is active."""

    @property
    def dynamic_config(self) -> DynamicBrokerConfig:
        """``/config/brokers/...``, applied live (DescribeConfigs, AlterConfigs)."""

    # -- groups and transactions -------------------------------------------------------------------

    @property
    def coordinator(self) -> GroupCoordinator:
        """The group coordinator of the ``__consumer_offsets`` partitions led here."""

    @property
    def txn_coordinator(self) -> TransactionCoordinator:
        """The transaction coordinator of the ``__transaction_state`` partitions led here."""

    @property
    def txn_verifier(self) -> TxnVerifier:
        """KIP-890: this broker, as a partition's leader, asking a transactional id's coordinator."""

    # -- security ----------------------------------------------------------------------------------

    @property
    def authorizer(self) -> BrokerAuthorizer | None:
        """ACL authorization, or None when ``authorizer.class.name`` is empty."""

    @property
    def own_credentials(self) -> Mapping[str, ScramCredential]:
        """The brokers' own SASL user's credentials, from this broker's configuration."""


#: One Kafka API's handler: the broker, the request's header and body, and the response (None:
#: no response, as for Produce with acks=0).
Handler = Callable[[BrokerContext, RequestHeader, Body], Awaitable[Body | None]]
