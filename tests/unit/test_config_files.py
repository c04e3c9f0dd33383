"""Broker and worker configuration files: every key they accept, and a clear refusal, naming the
key, of everything else (issue 15, acceptance 5: the process must stop before it touches
anything)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from sluice.broker.config import BrokerConfig
from sluice.broker.partition import Partition
from sluice.ops.cli.cluster import broker_properties
from sluice.properties import ConfigError, read_properties
from sluice.storage.config import LogConfig
from sluice.sync.worker_config import WorkerConfig

BROKER_FILE = """\
# a broker on a second host
broker.id = 2
listeners=PLAINTEXT://0.0.0.0:9093
advertised.listeners=PLAINTEXT://10.1.2.3:9093
log.dirs=/var/lib/sluice/data
zookeeper.connect=zk1:2181,zk2:2181,zk3:2181/prod
zookeeper.session.timeout.ms=18000
broker.rack: r2
num.partitions=6
default.replication.factor=3
min.insync.replicas=2
log.retention.ms=3600000
log.segment.bytes=1048576
auto.create.topics.enable=true
offsets.topic.replication.factor=3
"""

REQUIRED = {"broker.id": "1", "log.dirs": "/tmp/d", "zookeeper.connect": "127.0.0.1:2181"}


def write(tmp_path: Path, text: str, name: str = "broker.properties") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_broker_file_sets_every_documented_key(tmp_path: Path) -> None:
    c = BrokerConfig.from_properties(read_properties(write(tmp_path, BROKER_FILE)))
    assert (c.broker_id, c.host, c.port, c.advertised) == (2, "0.0.0.0", 9093, ("10.1.2.3", 9093))
    assert c.data_dir == Path("/var/lib/sluice/data")
    assert c.zookeeper == "zk1:2181,zk2:2181,zk3:2181/prod"
    assert (c.zk_session_timeout_s, c.rack, c.num_partitions) == (18.0, "r2", 6)
    assert (c.default_replication_factor, c.auto_create_topics, c.offsets_topic_replication_factor) == (
        3,
        True,
        3,
    )
    assert c.log_defaults == LogConfig(min_insync_replicas=2, retention_ms=3_600_000, segment_bytes=1 << 20)


def test_the_chroot_defaults_to_sluice_and_the_listener_to_loopback() -> None:
    c = BrokerConfig.from_properties(REQUIRED)
    assert c.zookeeper == "127.0.0.1:2181/sluice"
    assert c.advertised == ("127.0.0.1", 9092)


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("broker.idd", "1", "unknown key 'broker.idd'; did you mean 'broker.id'?"),
        ("broker.id", "one", "bad value 'one' for 'broker.id': expected an integer"),
        ("broker.id", "-3", "bad value '-3' for 'broker.id': must be >= 0"),
        ("listeners", "PLAINTEXT://host", "bad value 'PLAINTEXT://host' for 'listeners'"),
        ("listeners", "SSL://h:1", "an SSL or SASL_SSL listener needs ssl.keystore.location"),
        ("listeners", "INTERNAL://h:1", "listener INTERNAL has no security protocol"),
        ("listeners", "A://h:1,A://h:2", "listener name A is given twice"),
        ("inter.broker.listener.name", "OTHER", "names no listener of listeners"),
        ("sasl.enabled.mechanisms", "GSSAPI", "use some of PLAIN"),
        ("listeners", "PLAINTEXT://h:70000", "port 70000 is out of 1..65535"),
        ("log.dirs", "/a,/b", "a broker keeps one data directory"),
        ("zookeeper.connect", "zk1,zk2:2181", "'zk1' is not host:port"),
        ("min.insync.replicas", "0", "bad value '0' for 'min.insync.replicas'"),
        ("log.retention.ms", "forever", "bad value 'forever' for 'log.retention.ms'"),
        ("auto.create.topics.enable", "yes", "expected true or false"),
        ("zookeeper.session.timeout.ms", "10", "must be >= 1000"),
    ],
)
def test_an_unknown_key_or_a_bad_value_is_refused_naming_it(key: str, value: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        BrokerConfig.from_properties({**REQUIRED, key: value}, source="b.properties")
    assert str(caught.value).startswith("b.properties: ")
    assert says in str(caught.value)


@pytest.mark.parametrize("missing", sorted(REQUIRED))
def test_a_missing_required_key_is_named(missing: str) -> None:
    values = {k: v for k, v in REQUIRED.items() if k != missing}
    with pytest.raises(ConfigError, match=f"'{missing}' is required"):
        BrokerConfig.from_properties(values)


def test_binding_every_address_needs_an_advertised_listener() -> None:
    with pytest.raises(ConfigError, match=r"set advertised\.listeners"):
        BrokerConfig.from_properties({**REQUIRED, "listeners": "PLAINTEXT://:9092"})


def test_a_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read config file .*nope\.properties"):
        read_properties(tmp_path / "nope.properties")


def test_flags_win_over_the_file_and_overrides_over_both(tmp_path: Path) -> None:
    path = write(tmp_path, BROKER_FILE)
    values = broker_properties(path, ["num.partitions=9", "broker.id=7"], broker_id=5, port=9999)
    c = BrokerConfig.from_properties(values)
    assert (c.broker_id, c.port, c.host, c.num_partitions) == (7, 9999, "0.0.0.0", 9)
    with pytest.raises(ConfigError, match="--override takes key=value"):
        broker_properties(path, ["num.partitions"])


def test_a_replica_takes_the_brokers_log_defaults_unless_its_topic_sets_them(tmp_path: Path) -> None:
    """Without the defaults passed to Partition.open, min.insync.replicas stays 1 and acks=all
    would be acknowledged by one replica on a broker configured for two."""
    defaults = LogConfig(min_insync_replicas=2, retention_ms=60_000)
    plain = Partition.open(tmp_path, "a", 0, uuid.uuid4(), {}, 1, defaults=defaults)
    assert plain.min_insync_replicas == 2 and plain.log.config.retention_ms == 60_000
    own = Partition.open(tmp_path, "b", 0, uuid.uuid4(), {"min.insync.replicas": "1"}, 1, defaults=defaults)
    assert own.min_insync_replicas == 1 and own.log.config.retention_ms == 60_000
    plain.log.close()
    own.log.close()


def test_a_worker_file_sets_every_key_and_refuses_unknown_ones(tmp_path: Path) -> None:
    text = (
        "bootstrap.servers=10.1.2.3:9092,10.1.2.4:9092\nzookeeper.connect=zk1:2181/prod\n"
        "group.id=etl\nworker.name=w1\nwork.dir=/var/lib/sluice/worker\n"
        "spark.master=spark://10.1.2.9:7077\nsession.timeout.ms=15000\n"
    )
    c = WorkerConfig.from_properties(read_properties(write(tmp_path, text, "worker.properties")))
    assert c == WorkerConfig(
        bootstrap="10.1.2.3:9092,10.1.2.4:9092", zookeeper="zk1:2181/prod", group="etl", name="w1",
        work_dir=Path("/var/lib/sluice/worker"), spark_master="spark://10.1.2.9:7077", session_timeout_s=15.0,
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"unknown key 'group'; did you mean 'group\.id'"):
        WorkerConfig.from_properties({"bootstrap.servers": "h:1", "group": "x"})
    with pytest.raises(ConfigError, match=r"bad value 'mesos://x' for 'spark\.master'"):
        WorkerConfig.from_properties({"bootstrap.servers": "h:1", "spark.master": "mesos://x"})
    with pytest.raises(ConfigError, match="'h' is not host:port"):
        WorkerConfig.from_properties({"bootstrap.servers": "h"})


def test_the_deploy_guides_example_files_are_valid() -> None:
    deploy = Path(__file__).resolve().parents[2] / "deploy" / "config"
    # the guide appends the brokers' password (deploy/README.md, section 3); without it, no start
    values = read_properties(deploy / "broker.properties")
    with pytest.raises(ConfigError, match=r"inter\.broker\.sasl\.password"):
        BrokerConfig.from_properties(values)
    broker = BrokerConfig.from_properties({**values, "inter.broker.sasl.password": "pw"})
    assert broker.advertised_endpoints()["PLAINTEXT"] == ("PLAINTEXT", "h2.example.internal", 9092)
    assert broker.log_defaults.min_insync_replicas == 2
    # the brokers replicate on a listener of their own that authenticates (issue 33)
    assert (broker.inter_broker.name, broker.inter_broker.protocol) == ("INTERNAL", "SASL_PLAINTEXT")
    assert broker.advertised == ("h2.example.internal", 9093)
    worker = WorkerConfig.from_properties(read_properties(deploy / "worker.properties"))
    assert worker.spark_master == "spark://h1.example.internal:7077"


def test_worker_and_manager_files_take_kafkas_client_keys_and_never_show_the_password(tmp_path: Path) -> None:
    from sluice.manager.config import ManagerConfig

    keys = (
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-256\nsasl.username=sluice-worker\n"
        "sasl.password=s3cret-pw\nssl.ca.location=/etc/sluice/ca.pem\n"
    )
    worker = WorkerConfig.from_properties(
        read_properties(write(tmp_path, "bootstrap.servers=h1:9092\n" + keys, "worker.properties"))
    )
    manager = ManagerConfig.from_properties(
        read_properties(write(tmp_path, "bootstrap.servers=h1:9092\nzookeeper.connect=z:2181\n" + keys, "m"))
    )
    for c in (worker, manager):
        s = c.security
        assert (s.protocol, s.mechanism, s.username, s.password) == (
            "SASL_SSL", "SCRAM-SHA-256", "sluice-worker", "s3cret-pw"
        )  # fmt: skip
        assert s.ca_location == Path("/etc/sluice/ca.pem")
        assert "s3cret-pw" not in repr(c)
    assert WorkerConfig.from_properties({"bootstrap.servers": "h1:9092"}).security.protocol == "PLAINTEXT"
    with pytest.raises(ConfigError, match=r"needs sasl\.username and sasl\.password") as refused:
        WorkerConfig.from_properties({"bootstrap.servers": "h1:9092", "security.protocol": "SASL_SSL",
                                      "sasl.password": "s3cret-pw"})  # fmt: skip
    assert "s3cret-pw" not in str(refused.value)
