"""`sluice peer up kafka --security sasl_plaintext|sasl_ssl` without a JVM: the brokers' settings
(a SASL_PLAINTEXT or SASL_SSL listener with SCRAM, replication on it as the admin, Kafka's
AclAuthorizer with the admin as super user, PEM key and trust stores for TLS), the admin's client
security, and the refusals of what it cannot do."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.peers.kafka import ADMIN_USER, PeerBroker, PeerCluster, PeerError, broker_properties, peer_up


def _props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines())


def test_a_secured_peer_broker_speaks_scram_on_its_one_listener_and_checks_acls() -> None:
    props = _props(broker_properties(PeerBroker(1, 9092, "/tmp/b1"), "zk:1", 1, admin_password="s3cret"))
    assert props["listeners"] == props["advertised.listeners"] == "SASL_PLAINTEXT://127.0.0.1:9092"
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-256,SCRAM-SHA-512"
    assert props["security.inter.broker.protocol"] == "SASL_PLAINTEXT"
    assert props["sasl.mechanism.inter.broker.protocol"] == "SCRAM-SHA-512"
    for mechanism in ("scram-sha-256", "scram-sha-512"):
        jaas = props[f"listener.name.sasl_plaintext.{mechanism}.sasl.jaas.config"]
        assert f'username="{ADMIN_USER}" password="s3cret";' in jaas
    assert props["authorizer.class.name"] == "kafka.security.authorizer.AclAuthorizer"
    assert props["super.users"] == f"User:{ADMIN_USER}"
    assert "allow.everyone.if.no.acl.found" not in props  # Kafka's default: false


def test_a_sasl_ssl_peer_broker_speaks_scram_over_tls_and_replicates_over_it() -> None:
    props = _props(
        broker_properties(
            PeerBroker(1, 9092, "/tmp/b1"),
            "zk:1",
            3,
            admin_password="s3cret",
            tls=("/t/server.pem", "/t/ca.pem"),
        )
    )
    assert props["listeners"] == props["advertised.listeners"] == "SASL_SSL://127.0.0.1:9092"
    assert props["security.inter.broker.protocol"] == "SASL_SSL"
    for mechanism in ("scram-sha-256", "scram-sha-512"):
        assert 'password="s3cret";' in props[f"listener.name.sasl_ssl.{mechanism}.sasl.jaas.config"]
    assert not any(k.startswith("listener.name.sasl_plaintext") for k in props)
    assert (props["ssl.keystore.type"], props["ssl.keystore.location"]) == ("PEM", "/t/server.pem")
    assert (props["ssl.truststore.type"], props["ssl.truststore.location"]) == ("PEM", "/t/ca.pem")
    assert props["authorizer.class.name"] == "kafka.security.authorizer.AclAuthorizer"
    with pytest.raises(PeerError, match="password"):
        broker_properties(PeerBroker(1, 9092, "/tmp/b1"), "zk:1", 1, tls=("/t/server.pem", "/t/ca.pem"))


def test_the_admins_client_security_over_sasl_ssl_trusts_the_peers_ca(tmp_path: Path) -> None:
    cluster = PeerCluster(
        str(tmp_path), "3.9.1", "zk:1", None, security="sasl_ssl", admin_password="pw", ca_file="/t/ca.pem"
    )
    security = cluster.client_security()
    assert (security.protocol, security.username, security.ca_location) == (
        "SASL_SSL",
        ADMIN_USER,
        Path("/t/ca.pem"),
    )


def test_a_plain_peer_broker_has_no_sasl_and_no_authorizer() -> None:
    props = _props(broker_properties(PeerBroker(1, 9092, "/tmp/b1"), "zk:1", 1))
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9092"
    assert not any(k.startswith(("sasl.", "authorizer.", "listener.name.")) for k in props)


def test_the_admins_client_security_is_scram_over_sasl_plaintext(tmp_path: Path) -> None:
    cluster = PeerCluster(
        str(tmp_path), "3.9.1", "zk:1", None, security="sasl_plaintext", admin_password="pw"
    )
    security = cluster.client_security()
    assert (security.protocol, security.mechanism, security.username, security.password) == (
        "SASL_PLAINTEXT", "SCRAM-SHA-512", ADMIN_USER, "pw",
    )  # fmt: skip
    assert cluster.client_properties == tmp_path / "client.properties"
    assert "pw" not in repr(cluster)
    assert PeerCluster(str(tmp_path), "3.9.1", "zk:1", None).client_properties is None


def test_security_is_refused_in_kraft_mode_and_an_unknown_mode_is_named(tmp_path: Path) -> None:
    with pytest.raises(PeerError, match="ZooKeeper mode"):
        peer_up(tmp_path / "p", 1, kraft=True, security="sasl_plaintext")
    with pytest.raises(PeerError, match="ZooKeeper mode"):
        peer_up(tmp_path / "p", 1, kraft=True, security="sasl_ssl")
    with pytest.raises(PeerError, match="none, sasl_plaintext, sasl_ssl"):
        peer_up(tmp_path / "p", 1, security="ssl")
