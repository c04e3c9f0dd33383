"""The broker side of SASL (KIP-152): one ``SaslExchange`` per connection on a SASL listener.

A client first sends SaslHandshake naming a mechanism, then one or more SaslAuthenticate
requests carrying that mechanism's messages. Until the exchange has succeeded a connection may
send only ApiVersions, SaslHandshake and SaslAuthenticate (Kafka's rule); anything else closes
it. A failed exchange is answered with SASL_AUTHENTICATION_FAILED and then closed, after a
delay (``connection.failed.authentication.delay.ms``) that slows password guessing.

Mechanisms: PLAIN (RFC 4616) and SCRAM-SHA-256/512 (RFC 5802, RFC 7677; the exchange is
``scramp``'s). Both check the user's SCRAM credential in ZooKeeper (``security.credentials``):
``lookup(user, mechanism)`` is that read, blocking, so the exchange's steps run on a thread.

Nothing a client is told says whether a user exists. An unknown user (or one without the
mechanism) is answered with a challenge like anyone else's, as RFC 5802 section 5.1 advises:
a salt and an iteration count made from the name with a key the cluster's brokers share
(``FakeCredentials``), so the same name gets the same challenge from every broker at every try,
and the proof then fails as a wrong password's does. PLAIN hashes an unknown user's password
against such a credential too, so its answer takes as long. (Kafka answers an unknown SCRAM user
with an error at the first message.)
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Callable
from dataclasses import dataclass

import scramp

from sluice.security.scram import DEFAULT_ITERATIONS, MECHANISMS, ScramCredential, password_matches

_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}

#: What a broker offers when ``sasl.enabled.mechanisms`` is not set.
DEFAULT_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")
SUPPORTED_MECHANISMS = ("PLAIN", *MECHANISMS)
#: The APIs a connection may use before it has authenticated.
PRE_AUTH_APIS = frozenset({17, 18, 36})  # SaslHandshake, ApiVersions, SaslAuthenticate
FAILED = "Authentication failed: invalid user name or password"

Lookup = Callable[[str, str], ScramCredential | None]
Fake = Callable[[str, str], ScramCredential]
#: the length of the salts Sluice makes (``scram.make_credential``), which a fake one must have
SALT_BYTES = 32


class FakeCredentials:
    """The credential an unknown user is challenged with: the salt, StoredKey and ServerKey are
    HMACs of the user name and mechanism under ``key``, so they are the same at every try and,
    with one key per cluster, on every broker; the iteration count is the default one. No
    password gives that StoredKey, so the proof fails."""

    def __init__(self, key: bytes) -> None:
        assert len(key) >= 16, "a key of at least 128 bits"
        self._key = key

    def __call__(self, user: str, mechanism: str) -> ScramCredential:
        digest = _HASHES[mechanism]

        def derive(label: str, name: str) -> bytes:
            return hmac.digest(self._key, f"{label}\0{mechanism}\0{user}".encode(), name)

        return ScramCredential(
            derive("salt", "sha256")[:SALT_BYTES], derive("stored_key", digest), derive("server_key", digest),
            DEFAULT_ITERATIONS,
        )  # fmt: skip


#: for exchanges given no cluster key (tests, tools): one key for this process's life
_PROCESS_FAKES = FakeCredentials(os.urandom(32))


class AuthenticationFailed(Exception):
    """The client's credentials were wrong (or its messages were not the mechanism's)."""


@dataclass(frozen=True, slots=True)
class Step:
    """The answer to one SaslAuthenticate: bytes for the client, and the user once done."""

    response: bytes
    user: str | None = None


class SaslExchange:
    """The state of one connection's authentication: no mechanism yet, a mechanism chosen, or
    done. Pure apart from ``lookup``."""

    def __init__(self, enabled: tuple[str, ...], lookup: Lookup, fake: Fake | None = None):
        self.enabled = enabled
        self.lookup = lookup
        #: the credential of a user ``lookup`` does not know (a broker's: the cluster's key)
        self.fake = fake or _PROCESS_FAKES
        self.mechanism: str | None = None
        self.user: str | None = None
        self._scram: scramp.core.ScramServer | None = None
        self._scram_user: str | None = None
        #: whether the SCRAM exchange runs on a real credential (False: a fake one, which fails)
        self._scram_known = False
        #: (GS2 header, client-first-bare, server-first, nonce, credential): what
        #: ``_doubled_nonce_final`` checks a client-final message against
        self._scram_first_messages: tuple[str, str, str, str, ScramCredential] | None = None

    def handshake(self, mechanism: str) -> bool:
        """Choose the mechanism; False (UNSUPPORTED_SASL_MECHANISM) if this listener does not
        offer it. A second handshake on one connection is refused by the caller."""
        if mechanism not in self.enabled:
            return False
        self.mechanism = mechanism
        return True

    def step(self, message: bytes) -> Step:
        """One client message; raises AuthenticationFailed."""
        if self.mechanism is None:
            raise AuthenticationFailed("SaslAuthenticate before SaslHandshake")
        if self.mechanism == "PLAIN":
            return self._plain(message)
        return self._scram_step(self.mechanism, message)

    def _plain(self, message: bytes) -> Step:
        try:
            authzid, authcid, password = message.decode().split("\0")
        except (UnicodeDecodeError, ValueError):
            raise AuthenticationFailed("PLAIN expects authzid NUL user NUL password") from None
        if authzid and authzid != authcid:
            raise AuthenticationFailed("PLAIN: authorization id differs from the user")
        # Every mechanism looked up and one hash computed, whether the user exists or not: the
        # answer's time does not tell.
        found = [(m, c) for m in MECHANISMS if (c := self.lookup(authcid, m)) is not None]
        if found:
            mechanism, credential = found[0]
        else:
            mechanism = next(iter(MECHANISMS))
            credential = self.fake(authcid, mechanism)
        if password_matches(mechanism, credential, password) and found:
            return self._done(authcid, b"")
        raise AuthenticationFailed(FAILED)

    def _scram_step(self, mechanism: str, message: bytes) -> Step:
        try:
            text = message.decode()
            if self._scram is None:
                return self._scram_first(mechanism, text)
            legacy = self._doubled_nonce_final(mechanism, text)
            if legacy is not None:
                final = legacy
            else:
                self._scram.set_client_final(text)
                final = self._scram.get_server_final()
        except (UnicodeDecodeError, scramp.ScramException) as exc:
            raise AuthenticationFailed(FAILED) from exc
        assert self._scram_user is not None
        if not self._scram_known:  # a fake credential's proof cannot match; never let it through
            raise AuthenticationFailed(FAILED)
        return self._done(self._scram_user, final.encode())

    def _scram_first(self, mechanism: str, text: str) -> Step:
        found: list[ScramCredential] = []

        def credential_of(user: str) -> tuple[bytes, bytes, bytes, int]:
            credential = self.lookup(user, mechanism)
            self._scram_known = credential is not None
            if credential is None:
                credential = self.fake(user, mechanism)  # RFC 5802 section 5.1: a challenge all the same
            self._scram_user = user
            found.append(credential)
            return credential.scramp_info()

        server = scramp.ScramMechanism(mechanism).make_server(credential_of)
        server.set_client_first(text)
        self._scram = server
        server_first = server.get_server_first()
        gs2_header, bare = text[: len(text) - len(text.split(",", 2)[2])], text.split(",", 2)[2]
        self._scram_first_messages = (gs2_header, bare, server_first, _field(server_first, "r"), found[0])
        return Step(server_first.encode())

    def _doubled_nonce_final(self, mechanism: str, text: str) -> str | None:
        """librdkafka before 2.6.1 (kcat in most distributions) puts its client nonce in front
        of the whole nonce a second time in its client-final message (librdkafka#4895). Kafka
        3.8.1-3.9 accept a final nonce that ends with the server's nonce, and so does Sluice:
        the server's random part is still checked, so a replayed exchange still fails, and the
        proof is checked over the message as sent (RFC 5802 section 3). Returns the
        server-final message, or None when the nonce is not of that form (scramp decides)."""
        assert self._scram_first_messages is not None
        gs2_header, bare, server_first, nonce, credential = self._scram_first_messages
        without_proof, sep, proof_b64 = text.rpartition(",p=")
        sent_nonce = _field(without_proof, "r") if sep else ""
        if sent_nonce == nonce or not sent_nonce.endswith(nonce):
            return None
        if _field(without_proof, "c") != base64.b64encode(gs2_header.encode()).decode():
            raise AuthenticationFailed(FAILED)
        digest = _HASHES[mechanism]
        auth_message = f"{bare},{server_first},{without_proof}".encode()
        try:
            proof = base64.b64decode(proof_b64, validate=True)
        except ValueError:
            raise AuthenticationFailed(FAILED) from None
        signature = hmac.digest(credential.stored_key, auth_message, digest)
        if len(proof) != len(signature):
            raise AuthenticationFailed(FAILED)
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.new(digest, client_key).digest(), credential.stored_key):
            raise AuthenticationFailed(FAILED)
        server_signature = hmac.digest(credential.server_key, auth_message, digest)
        return "v=" + base64.b64encode(server_signature).decode()

    def _done(self, user: str, response: bytes) -> Step:
        self.user = user
        return Step(response, user)


def _field(message: str, name: str) -> str:
    """One attribute of a SCRAM message (``r=...,s=...``); "" when absent."""
    for part in message.split(","):
        if part.startswith(f"{name}="):
            return part[len(name) + 1 :]
    return ""
