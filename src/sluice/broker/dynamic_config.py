"""A broker's dynamic configs: the cluster's defaults (``/config/brokers/<default>``) and its own
(``/config/brokers/<id>``), followed through one watch each and applied to the running broker.

What Sluice changes live are the broker-level defaults of topic log settings
(``broker.config.log_default_keys``): a new value becomes the default of every replica here
whose topic does not set that key itself, at once (``ReplicaManager.reconfigure``), and of every
replica created later. Precedence is Kafka's: the broker's own dynamic value, then the
cluster's, then the configuration file's, then Kafka's default.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from kazoo.protocol.states import ZnodeStat

from sluice.broker.config import log_default_keys
from sluice.broker.kafka_broker_configs import CONFIG_TYPES, INERT, INERT_DEFAULTS, KAFKA_DYNAMIC
from sluice.cluster import layout
from sluice.storage.config import LogConfig, known_topic_configs

if TYPE_CHECKING:
    from sluice.broker.config import BrokerConfig
    from sluice.broker.replica_manager import ReplicaManager
    from sluice.cluster.zkstore import ZkStore

log = logging.getLogger("sluice.config")

#: DescribeConfigs' ConfigSource codes (Kafka's).
SOURCE_DYNAMIC_TOPIC = 1
SOURCE_DYNAMIC_BROKER = 2
SOURCE_DYNAMIC_DEFAULT_BROKER = 3
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5


def effective_log_defaults(
    static: LogConfig, cluster: Mapping[str, str], own: Mapping[str, str]
) -> tuple[LogConfig, list[str]]:
    """The broker's log defaults: ``static`` (its configuration file's) overlaid with the
    cluster's dynamic values, then its own. A value that does not parse (a hand edit in
    ZooKeeper) is left out and named in the second element; keys that are no log default
    (kept without effect, as Kafka keeps them) are left out silently."""
    keys = log_default_keys()
    result = static
    ignored = []
    for source in (cluster, own):
        for key, value in sorted(source.items()):
            topic_key = keys.get(key)
            if topic_key is None:
                continue  # kept without effect (broker/kafka_broker_configs.py: INERT, or unknown)
            try:
                result = LogConfig.from_topic_config({topic_key: value}, base=result)
            except ValueError:
                ignored.append(key)
    return result, ignored


class DynamicConfigHost(Protocol):
    """What DynamicBrokerConfig needs of the broker: its static configuration, ZooKeeper to
    watch, and the replicas the log defaults are applied to."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def store(self) -> ZkStore: ...

    @property
    def replicas(self) -> ReplicaManager: ...


class DynamicBrokerConfig:
    def __init__(self, broker: DynamicConfigHost) -> None:
        self.broker = broker
        self.static = broker.config.log_defaults
        self.cluster: dict[str, str] = {}
        self.own: dict[str, str] = {}
        self._entity = str(broker.config.broker_id)
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Watch both znodes (each watch first reads, so the configs are applied on return)."""
        self._loop = asyncio.get_running_loop()
        for entity in (layout.DEFAULT_BROKER_ENTITY, self._entity):
            self.broker.store.watch_data(layout.broker_config_path(entity), self._watch(entity))

    def _watch(self, entity: str) -> Any:
        def changed(data: bytes | None, stat: ZnodeStat | None) -> None:
            try:
                config = layout.decode_dynamic_config(data, layout.broker_config_path(entity))
            except ValueError as exc:
                log.warning("event=bad_dynamic_config entity=%s error=%s", entity, exc)
                return
            loop = self._loop
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(self._apply, entity, config)

        return changed

    def _apply(self, entity: str, config: dict[str, str]) -> None:
        if entity == layout.DEFAULT_BROKER_ENTITY:
            if config == self.cluster:
                return
            self.cluster = config
        else:
            if config == self.own:
                return
            self.own = config
        defaults, ignored = effective_log_defaults(self.static, self.cluster, self.own)
        for key in ignored:
            log.warning("event=dynamic_config_ignored entity=%s key=%s reason=invalid_value", entity, key)
        log.info("event=dynamic_broker_config_changed entity=%s config=%s", entity, config)
        self.broker.replicas.log_defaults = defaults
        self.broker.replicas.reconfigure()

    def holds(self, entity: str, config: Mapping[str, str]) -> bool:
        """Whether this broker applies ``config`` as ``entity``'s dynamic configs now."""
        return dict(config) == (self.cluster if entity == layout.DEFAULT_BROKER_ENTITY else self.own)

    def describe(self, entity: str) -> list[dict[str, Any]]:
        """DescribeConfigs' entries of the keys changed live, and of Kafka's dynamic keys Sluice
        takes without effect: this broker's values and where each comes from (``entity``
        ``""``: the cluster's dynamic defaults only, as Kafka); then the keys kept that neither
        Kafka nor Sluice knows, as Kafka shows them (read-only, value hidden)."""
        keys = log_default_keys()
        # topic configs Sluice takes without a field of its own (preallocate ...) have their
        # default only: a broker's file cannot set them to anything else
        kafka_defaults = {k: default for k, (default, _) in known_topic_configs().items()}
        static = {**kafka_defaults, **self.static.to_topic_config()}
        entries = []
        for key, topic_key in sorted(keys.items()):
            if entity == "":
                if key not in self.cluster:
                    continue
                value, source = self.cluster[key], SOURCE_DYNAMIC_DEFAULT_BROKER
            elif key in self.own:
                value, source = self.own[key], SOURCE_DYNAMIC_BROKER
            elif key in self.cluster:
                value, source = self.cluster[key], SOURCE_DYNAMIC_DEFAULT_BROKER
            elif static[topic_key] != kafka_defaults[topic_key]:
                value, source = static[topic_key], SOURCE_STATIC_BROKER
            else:
                value, source = kafka_defaults[topic_key], SOURCE_DEFAULT
            entries.append(
                {
                    "name": key,
                    "value": value,
                    "read_only": False,
                    "is_default": source == SOURCE_DEFAULT,
                    "config_source": source,
                    "is_sensitive": False,
                    "synonyms": [],
                    "config_type": 0,
                    "documentation": f"broker default of the topic config {topic_key}; changed live",
                }
            )
        return entries + self._describe_kept(entity)

    def _describe_kept(self, entity: str) -> list[dict[str, Any]]:
        stored = self.cluster if entity == "" else {**self.cluster, **self.own}
        entries: list[dict[str, Any]] = []
        for key in sorted(set(INERT) | set(stored)):
            if key in log_default_keys():
                continue
            value: str | None
            if entity == "":
                if key not in self.cluster:
                    continue
                value, source = self.cluster[key], SOURCE_DYNAMIC_DEFAULT_BROKER
            elif key in self.own:
                value, source = self.own[key], SOURCE_DYNAMIC_BROKER
            elif key in self.cluster:
                value, source = self.cluster[key], SOURCE_DYNAMIC_DEFAULT_BROKER
            else:
                value, source = INERT_DEFAULTS.get(key), SOURCE_DEFAULT
            known = KAFKA_DYNAMIC.get(key)
            entries.append(
                {
                    "name": key,
                    # a key neither knows may hold a secret: Kafka shows it without its value
                    "value": value if known is not None else None,
                    "read_only": known is None,
                    "is_default": source == SOURCE_DEFAULT,
                    "config_source": source,
                    "is_sensitive": known is None,
                    "synonyms": [],
                    "config_type": CONFIG_TYPES.get(known.type, 0) if known is not None else 0,
                    "documentation": (
                        f"accepted, without effect: {INERT[key]}"
                        if key in INERT
                        else "kept; Sluice does not read it"
                    ),
                }
            )
        return entries
