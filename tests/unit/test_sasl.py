"""SCRAM credentials, the broker's SASL exchange (PLAIN, SCRAM-SHA-256/512) and listeners by name."""

from __future__ import annotations

import pytest
import scramp

from sluice.broker.config import BrokerConfig
from sluice.security.sasl import AuthenticationFailed, SaslExchange
from sluice.security.scram import (
    CredentialError,
    ScramCredential,
    make_credential,
    password_matches,
)

USERS = {
    "alice": {m: make_credential(m, "alice-secret") for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")},
    "bob": {"SCRAM-SHA-256": make_credential("SCRAM-SHA-256", "bob-secret")},
}
ALL = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def lookup(user: str, mechanism: str) -> ScramCredential | None:
    return USERS.get(user, {}).get(mechanism)


def test_a_credential_round_trips_in_kafkas_text_form_and_holds_no_password() -> None:
    c = make_credential("SCRAM-SHA-512", "pw", 8192)
    text = c.encode()
    assert text.startswith("salt=") and "iterations=8192" in text and "pw" not in text
    assert ScramCredential.decode(text) == c
    assert password_matches("SCRAM-SHA-512", c, "pw") and not password_matches("SCRAM-SHA-512", c, "pW")
    with pytest.raises(CredentialError, match="iterations"):
        make_credential("SCRAM-SHA-256", "pw", 100)
    with pytest.raises(CredentialError, match="unknown SCRAM mechanism"):
        make_credential("SCRAM-MD5", "pw")


def scram(mechanism: str, user: str, password: str) -> SaslExchange:
    server = SaslExchange(ALL, lookup)
    assert server.handshake(mechanism)
    client = scramp.ScramClient([mechanism], user, password)
    first = server.step(client.get_client_first().encode())
    client.set_server_first(first.response.decode())
    final = server.step(client.get_client_final().encode())
    client.set_server_final(final.response.decode())  # the client checks the server too
    return server


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_authenticates_the_right_password_only(mechanism: str) -> None:
    assert scram(mechanism, "alice", "alice-secret").user == "alice"
    with pytest.raises(AuthenticationFailed):
        scram(mechanism, "alice", "wrong")
    with pytest.raises(AuthenticationFailed):
        scram(mechanism, "nobody", "alice-secret")


def test_a_user_without_the_mechanism_cannot_use_it() -> None:
    assert scram("SCRAM-SHA-256", "bob", "bob-secret").user == "bob"
    with pytest.raises(AuthenticationFailed):
        scram("SCRAM-SHA-512", "bob", "bob-secret")


def test_plain_checks_the_password_against_the_scram_credential() -> None:
    server = SaslExchange(ALL, lookup)
    assert server.handshake("PLAIN")
    assert server.step(b"\0bob\0bob-secret").user == "bob"
    for message in (b"\0bob\0nope", b"\0nobody\0x", b"alice\0bob\0bob-secret", b"garbage", b"\xff\0a\0b"):
        s = SaslExchange(ALL, lookup)
        s.handshake("PLAIN")
        with pytest.raises(AuthenticationFailed):
            s.step(message)


def test_a_mechanism_the_listener_does_not_offer_is_refused() -> None:
    server = SaslExchange(("SCRAM-SHA-512",), lookup)
    assert not server.handshake("PLAIN")
    with pytest.raises(AuthenticationFailed, match="before SaslHandshake"):
        server.step(b"\0bob\0bob-secret")


def test_listeners_by_name_with_a_protocol_map_and_advertised_addresses(tmp_path: object) -> None:
    from pathlib import Path

    from sluice.security.tls import local_ca

    ca = local_ca(Path(str(tmp_path)), ["127.0.0.1"])
    config = BrokerConfig.from_properties(
        {
            "broker.id": "1",
            "log.dirs": str(Path(str(tmp_path)) / "data"),
            "zookeeper.connect": "127.0.0.1:2181",
            "listeners": "INTERNAL://127.0.0.1:9093,EXTERNAL://0.0.0.0:9094",
            "advertised.listeners": "EXTERNAL://broker1.example:9094",
            "listener.security.protocol.map": "INTERNAL:SASL_SSL,EXTERNAL:SSL",
            "inter.broker.listener.name": "INTERNAL",
            "ssl.keystore.location": str(ca.keystore),
            "inter.broker.sasl.username": "broker",
            "inter.broker.sasl.password": "broker-secret",
        }
    )
    assert [(lst.name, lst.protocol) for lst in config.bound_listeners] == [
        ("INTERNAL", "SASL_SSL"),
        ("EXTERNAL", "SSL"),
    ]
    assert config.inter_broker.name == "INTERNAL" and (config.host, config.port) == ("127.0.0.1", 9093)
    assert config.advertised_endpoints() == {
        "INTERNAL": ("SASL_SSL", "127.0.0.1", 9093),
        "EXTERNAL": ("SSL", "broker1.example", 9094),
    }
    assert "broker-secret" not in repr(config)
