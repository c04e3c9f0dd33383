"""SASL users: `sluice user add|list|delete` and KIP-554's Describe/AlterUserScramCredentials
through confluent-kafka's AdminClient manage the same credentials the brokers check."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from sluice.protocol.api import ApiKey
from sluice.security.client import ClientAuthError, ClientSecurity
from sluice.sync.wire_client import WireClient
from tests.support.cluster import TestCluster


def cli(cluster: TestCluster, *args: str, password: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLUICE_USER_PASSWORD": password} if password else dict(os.environ)
    # the cluster's ZooKeeper credential: /config/users is readable and writable with it only
    env["SLUICE_ZOOKEEPER_AUTH_FILE"] = str(cluster.zookeeper_auth_file)
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", "user", *args, "--zookeeper", cluster.zookeeper],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip


def admin(cluster: TestCluster, security: ClientSecurity) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap, **security.confluent_config()})


def can_connect(cluster: TestCluster, security: ClientSecurity) -> bool:
    """Does the broker take these credentials (a SASL exchange over TLS, then Metadata)?"""
    host, _, port = cluster.bootstrap.split(",")[0].rpartition(":")
    try:
        with WireClient(host, int(port), security=security, timeout_s=10) as w:
            w.request(ApiKey.METADATA, 9, {"topics": [], "allow_auto_topic_creation": False})
    except ClientAuthError as exc:
        assert "SASL_AUTHENTICATION_FAILED" in str(exc), exc
        return False
    return True


def as_user(
    cluster: TestCluster, user: str, password: str, mechanism: str = "SCRAM-SHA-512"
) -> ClientSecurity:
    ca = cluster.client_security().ca_location
    return ClientSecurity("SASL_SSL", mechanism, user, password, ca)


def test_users_made_by_the_cli_and_by_the_admin_api_authenticate_and_deleted_ones_do_not(
    make_cluster: Callable[..., TestCluster],
) -> None:
    cluster = make_cluster(1, security="sasl_ssl")
    made = cli(cluster, "add", "bob", password="bob-password")
    assert made.returncode == 0, made.stderr
    assert "user=bob mechanisms=SCRAM-SHA-256,SCRAM-SHA-512" in made.stdout
    assert "bob-password" not in made.stdout + made.stderr
    listed = cli(cluster, "list")
    assert "user=bob mechanisms=SCRAM-SHA-256:4096,SCRAM-SHA-512:4096" in listed.stdout, listed.stdout
    assert can_connect(cluster, as_user(cluster, "bob", "bob-password", "SCRAM-SHA-256"))
    assert can_connect(cluster, as_user(cluster, "bob", "bob-password", "PLAIN"))
    assert not can_connect(cluster, as_user(cluster, "bob", "not-bobs"))

    root = admin(cluster, cluster.client_security())
    described = root.describe_user_scram_credentials(["bob"])["bob"].result()
    assert sorted((i.mechanism, i.iterations) for i in described.scram_credential_infos) == [
        (ScramMechanism.SCRAM_SHA_256, 4096),
        (ScramMechanism.SCRAM_SHA_512, 4096),
    ]
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)
    root.alter_user_scram_credentials([UserScramCredentialUpsertion("carol", info, b"carol-password")])[
        "carol"
    ].result()
    assert can_connect(cluster, as_user(cluster, "carol", "carol-password"))
    assert "user=carol mechanisms=SCRAM-SHA-512:8192" in cli(cluster, "list").stdout

    # bob is no super user: without ALTER on the cluster he cannot make users.
    bobs = admin(cluster, as_user(cluster, "bob", "bob-password"))
    upsert = UserScramCredentialUpsertion("mallory", info, b"mallory-password")
    with pytest.raises(KafkaException, match="CLUSTER_AUTHORIZATION_FAILED"):
        bobs.alter_user_scram_credentials([upsert])["mallory"].result()

    root.alter_user_scram_credentials([UserScramCredentialDeletion("carol", ScramMechanism.SCRAM_SHA_512)])[
        "carol"
    ].result()
    assert not can_connect(cluster, as_user(cluster, "carol", "carol-password"))
    gone = cli(cluster, "delete", "bob")
    assert gone.returncode == 0 and "user=bob deleted=true" in gone.stdout, gone.stderr
    assert not can_connect(cluster, as_user(cluster, "bob", "bob-password"))
    again = cli(cluster, "delete", "bob")
    assert again.returncode == 1 and "sluice user list" in again.stderr, again.stderr
