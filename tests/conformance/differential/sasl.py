"""Raw SASL connections for comparing authentication answers (issue 33, item 7): a connection
whose SaslHandshake and SaslAuthenticate the test sends itself, so that it can re-authenticate
(KIP-368), let a session run past its lifetime, or change the user or mechanism mid-connection;
and the admin requests that set a user's SCRAM credential and ACLs, over whatever connection
the cluster's administrator has."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from sluice.protocol.api import ApiKey
from sluice.security.client import ClientSecurity
from sluice.security.scram import salted_password
from sluice.sync.wire_client import WireClient, WireError

CLOSED = "closed"
#: Kafka's wire codes used here
RESOURCE_TOPIC, RESOURCE_CLUSTER = 2, 4
PATTERN_LITERAL, PERMISSION_ALLOW = 3, 3
CLUSTER_NAME = "kafka-cluster"


@dataclass(frozen=True)
class Side:
    """How to reach one cluster: its SASL listener (``ca``: TLS with this CA, else plaintext) and
    its administrator's connection (``admin``: the security to use, None: an anonymous super
    user's plaintext listener)."""

    sasl_address: str
    admin_address: str
    ca: str | None = None
    admin: ClientSecurity | None = None

    def client_conf(self, user: str, password: str, mechanism: str = "SCRAM-SHA-256") -> dict[str, Any]:
        """A librdkafka configuration authenticating as ``user`` on the SASL listener."""
        conf = {
            "bootstrap.servers": self.sasl_address,
            "security.protocol": "SASL_SSL" if self.ca else "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism,
            "sasl.username": user,
            "sasl.password": password,
        }
        if self.ca:
            conf["ssl.ca.location"] = self.ca
        return conf

    def admin_request(self, api: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
        with WireClient.connect(self.admin_address, timeout_s=15, security=self.admin) as w:
            return w.request(api, version, body)

    def set_password(self, user: str, password: str, mechanism: str = "SCRAM-SHA-256") -> int:
        """AlterUserScramCredentials: ``user``'s credential for ``mechanism``; the error code."""
        salt = os.urandom(16)
        r = self.admin_request(
            ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
            0,
            {
                "deletions": [],
                "upsertions": [
                    {
                        "name": user,
                        "mechanism": 1 if mechanism == "SCRAM-SHA-256" else 2,
                        "iterations": 4096,
                        "salt": salt,
                        "salted_password": salted_password(mechanism, password, salt, 4096),
                    }
                ],
            },
        )
        return int(r["results"][0]["error_code"])

    def acl(self, principal: str, operation: int, *, delete: bool = False,
            resource: tuple[int, str] = (RESOURCE_CLUSTER, CLUSTER_NAME)) -> int:  # fmt: skip
        """CreateAcls (or DeleteAcls) of one ALLOW ACL: the error code."""
        rtype, name = resource
        if delete:
            r = self.admin_request(
                ApiKey.DELETE_ACLS,
                1,
                {
                    "filters": [
                        {
                            "resource_type_filter": rtype,
                            "resource_name_filter": name,
                            "pattern_type_filter": PATTERN_LITERAL,
                            "principal_filter": principal,
                            "host_filter": "*",
                            "operation": operation,
                            "permission_type": PERMISSION_ALLOW,
                        }
                    ]
                },
            )
            return int(r["filter_results"][0]["error_code"])
        r = self.admin_request(
            ApiKey.CREATE_ACLS,
            1,
            {
                "creations": [
                    {
                        "resource_type": rtype,
                        "resource_name": name,
                        "resource_pattern_type": PATTERN_LITERAL,
                        "principal": principal,
                        "host": "*",
                        "operation": operation,
                        "permission_type": PERMISSION_ALLOW,
                    }
                ]
            },
        )
        return int(r["results"][0]["error_code"])

    def connect(self) -> SaslConnection:
        return SaslConnection(self)


class SaslConnection:
    """One connection to a SASL listener, its authentication driven by hand."""

    def __init__(self, side: Side) -> None:
        tls = ClientSecurity("SSL", ca_location=side.ca) if side.ca else None  # type: ignore[arg-type]
        self.wire = WireClient.connect(side.sasl_address, timeout_s=15, security=tls)

    def close(self) -> None:
        self.wire.close()

    def authenticate(
        self, user: str, password: str, *, mechanism: str = "SCRAM-SHA-256", version: int = 2
    ) -> dict[str, Any]:
        """SaslHandshake v1, then SaslAuthenticate ``version`` until done: what each answered
        (the handshake's error; each step's error and session lifetime), or that the broker
        closed the connection."""
        seen: dict[str, Any] = {}
        try:
            handshake = self.wire.request(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": mechanism})
            seen["handshake"] = handshake["error_code"]
            if handshake["error_code"]:
                return seen
            steps = ClientSecurity("SASL_PLAINTEXT", mechanism, user, password).sasl_exchange()
            message = next(steps)
            while True:
                r = self.wire.request(ApiKey.SASL_AUTHENTICATE, version, {"auth_bytes": message})
                seen.setdefault("steps", []).append([r["error_code"], r.get("session_lifetime_ms")])
                if r["error_code"]:
                    return seen
                try:
                    message = steps.send(bytes(r["auth_bytes"]))
                except StopIteration:
                    return seen
        except (WireError, OSError):
            seen[CLOSED] = True
            return seen

    def request(self, api: int, version: int, body: dict[str, Any]) -> dict[str, Any] | str:
        """A request's answer, or ``CLOSED`` when the broker closed the connection instead."""
        try:
            return self.wire.request(api, version, body)
        except (WireError, OSError):
            return CLOSED

    def metadata(self) -> str:
        """ "ok" when a Metadata request is answered, ``CLOSED`` when the connection was closed."""
        r = self.request(ApiKey.METADATA, 4, {"topics": [], "allow_auto_topic_creation": False})
        return CLOSED if r == CLOSED else "ok"

    def cluster_operations(self, version: int) -> Any:
        r = self.request(
            ApiKey.METADATA,
            version,
            {
                "topics": [],
                "allow_auto_topic_creation": False,
                "include_cluster_authorized_operations": True,
                "include_topic_authorized_operations": True,
            },
        )
        return r if isinstance(r, str) else r["cluster_authorized_operations"]

    def describe_cluster(self) -> Any:
        r = self.request(ApiKey.DESCRIBE_CLUSTER, 0, {"include_cluster_authorized_operations": True})
        return r if isinstance(r, str) else [r["error_code"], r["cluster_authorized_operations"]]
