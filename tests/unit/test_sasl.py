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
    # "!" is not a base64 character: the password cannot turn up in the encoded salt by chance
    c = make_credential("SCRAM-SHA-512", "pw!", 8192)
    text = c.encode()
    assert text.startswith("salt=") and "iterations=8192" in text and "pw!" not in text
    assert ScramCredential.decode(text) == c
    assert password_matches("SCRAM-SHA-512", c, "pw!") and not password_matches("SCRAM-SHA-512", c, "pW!")
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


def librdkafka_before_2_6_1(exchange: SaslExchange, mechanism: str, user: str, password: str) -> bytes:
    """The client side of SCRAM as librdkafka < 2.6.1 (Debian's kcat) does it: its client nonce
    goes in front of the whole nonce a second time in the final message (librdkafka#4895)."""
    import base64
    import hashlib
    import hmac

    digest = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
    c_nonce = "rdkafkaClientNonce"
    bare = f"n={user},r={c_nonce}"
    server_first = exchange.step(f"n,,{bare}".encode()).response.decode()
    fields = dict(part.split("=", 1) for part in server_first.split(","))
    salted = hashlib.pbkdf2_hmac(digest, password.encode(), base64.b64decode(fields["s"]), int(fields["i"]))
    without_proof = f"c=biws,r={c_nonce}{fields['r']}"
    auth_message = f"{bare},{server_first},{without_proof}".encode()
    client_key = hmac.digest(salted, b"Client Key", digest)
    signature = hmac.digest(hashlib.new(digest, client_key).digest(), auth_message, digest)
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    final = exchange.step(f"{without_proof},p={base64.b64encode(proof).decode()}".encode())
    server_signature = hmac.digest(hmac.digest(salted, b"Server Key", digest), auth_message, digest)
    assert final.response == b"v=" + base64.b64encode(server_signature), "the broker must prove the password"
    return final.response


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_librdkafka_before_2_6_1_authenticates_with_its_doubled_nonce(mechanism: str) -> None:
    exchange = SaslExchange(ALL, lookup)
    assert exchange.handshake(mechanism)
    librdkafka_before_2_6_1(exchange, mechanism, "alice", "alice-secret")
    assert exchange.user == "alice"

    wrong = SaslExchange(ALL, lookup)
    assert wrong.handshake(mechanism)
    with pytest.raises(AuthenticationFailed):
        librdkafka_before_2_6_1(wrong, mechanism, "alice", "not-alice-secret")
    assert wrong.user is None


def test_a_final_nonce_without_the_servers_part_is_refused() -> None:
    exchange = SaslExchange(ALL, lookup)
    assert exchange.handshake("SCRAM-SHA-256")
    exchange.step(b"n,,n=alice,r=clientnonce")
    with pytest.raises(AuthenticationFailed):
        exchange.step(b"c=biws,r=clientnonceclientnonce,p=AAAA")
    assert exchange.user is None


def test_mtls_makes_the_client_certificates_subject_the_principal(tmp_path: object) -> None:
    """A real TLS handshake with ssl.client.auth=required: the verified client certificate's
    subject is the connection's principal; a client without a certificate is refused."""
    import socket
    import ssl
    import threading
    from pathlib import Path
    from types import SimpleNamespace
    from typing import Any

    from sluice.broker.authentication import ConnectionAuth
    from sluice.broker.listeners import Listener
    from sluice.security.tls import ServerTls, client_certificate, client_context, local_ca

    ca = local_ca(Path(str(tmp_path)), ["127.0.0.1"])
    server_ctx = ServerTls(ca.keystore, truststore=ca.ca_file, client_auth="required").context()
    listener = Listener("SSL", "SSL", "127.0.0.1", 0)
    config = SimpleNamespace(authentication_timeout_ms=10_000, sasl_mechanisms=())
    broker: Any = SimpleNamespace(config=config)

    def handshake(client: ssl.SSLContext) -> str | Exception:
        accept = socket.create_server(("127.0.0.1", 0))
        seen: list[str | Exception] = []

        def serve() -> None:
            conn, _ = accept.accept()
            try:
                tls = server_ctx.wrap_socket(conn, server_side=True)
                seen.append(ConnectionAuth(broker, listener, "/127.0.0.1", tls).session.principal)
                tls.close()
            except (ssl.SSLError, OSError) as exc:
                seen.append(exc)
                conn.close()

        thread = threading.Thread(target=serve)
        thread.start()
        try:
            with client.wrap_socket(
                socket.create_connection(accept.getsockname()), server_hostname="127.0.0.1"
            ) as c:
                c.recv(1)
        except (ssl.SSLError, OSError):
            pass
        thread.join(10)
        accept.close()
        return seen[0]

    cert = client_certificate(ca, "billing-app")
    assert oct(cert.stat().st_mode & 0o777) == "0o600"
    assert handshake(client_context(ca.ca_file, cert)) == "User:CN=billing-app"
    assert isinstance(handshake(client_context(ca.ca_file)), ssl.SSLError)  # no certificate: refused


def _server_first(exchange: SaslExchange, mechanism: str, user: str) -> dict[str, str]:
    assert exchange.handshake(mechanism)
    client = scramp.ScramClient([mechanism], user, "any-password")
    first = exchange.step(client.get_client_first().encode()).response.decode()
    return dict(part.split("=", 1) for part in first.split(","))


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_an_unknown_user_gets_a_challenge_like_a_known_one(mechanism: str) -> None:
    """RFC 5802 section 5.1: a server SHOULD answer an unknown user with a challenge (a salt and
    an iteration count, the same each time), so a probe cannot tell who exists. Failing run
    before: the client-first message of an unknown user raised AuthenticationFailed at once
    (error 58 before any proof), while a known user got its challenge."""
    import base64

    known = _server_first(SaslExchange(ALL, lookup), mechanism, "alice")
    unknown = _server_first(SaslExchange(ALL, lookup), mechanism, "nobody")
    again = _server_first(SaslExchange(ALL, lookup), mechanism, "nobody")
    other = _server_first(SaslExchange(ALL, lookup), mechanism, "nobody-else")
    assert set(unknown) == set(known) == {"r", "s", "i"}
    assert unknown["i"] == known["i"] == "4096"
    assert len(base64.b64decode(unknown["s"])) == len(base64.b64decode(known["s"]))
    assert unknown["s"] == again["s"] and unknown["s"] != other["s"], "the fake salt is the user's own"
    assert unknown["r"] != again["r"], "the nonce stays fresh"
    # bob has SCRAM-SHA-256 only: for SCRAM-SHA-512 he is unknown, and challenged the same way
    if mechanism == "SCRAM-SHA-512":
        assert set(_server_first(SaslExchange(ALL, lookup), mechanism, "bob")) == {"r", "s", "i"}
    # the proof then fails exactly as a wrong password does
    with pytest.raises(AuthenticationFailed) as unknown_failed:
        scram(mechanism, "nobody", "alice-secret")
    with pytest.raises(AuthenticationFailed) as wrong_failed:
        scram(mechanism, "alice", "wrong")
    assert str(unknown_failed.value) == str(wrong_failed.value)


def test_a_fake_challenge_is_the_same_on_every_broker_of_a_cluster() -> None:
    """The fake salt comes from a key the brokers share (in ZooKeeper), so two brokers answer an
    unknown user alike, as they answer a known one alike."""
    from sluice.security.sasl import FakeCredentials

    key = b"k" * 32
    a = SaslExchange(ALL, lookup, fake=FakeCredentials(key))
    b = SaslExchange(ALL, lookup, fake=FakeCredentials(key))
    c = SaslExchange(ALL, lookup, fake=FakeCredentials(b"x" * 32))
    salts = [_server_first(e, "SCRAM-SHA-256", "nobody")["s"] for e in (a, b, c)]
    assert salts[0] == salts[1] != salts[2]


def test_plain_costs_an_unknown_user_the_same_hashing_as_a_known_one() -> None:
    """PLAIN salts and hashes the password against the credential; for an unknown user it hashes
    against a fake one, so the answer's timing does not say whether the user exists. The cost is
    the thread's CPU time, the work done: wall time on a starved machine (two busy loops beside
    the suite) also counts the time the thread waited for a core, and once made the known user's
    best of five tries twice the unknown one's."""
    import time

    def cost(message: bytes) -> float:
        best = float("inf")
        for _ in range(5):
            s = SaslExchange(ALL, lookup)
            s.handshake("PLAIN")
            started = time.thread_time()
            with pytest.raises(AuthenticationFailed):
                s.step(message)
            best = min(best, time.thread_time() - started)
        return best

    known, unknown = cost(b"\0alice\0wrong"), cost(b"\0nobody\0wrong")
    assert unknown > 0.5 * known, (known, unknown)
