"""The broker side of SASL (KIP-152): one ``SaslExchange`` per connection on a SASL listener.

A client first sends SaslHandshake naming a mechanism, then one or more SaslAuthenticate
requests carrying that mechanism's messages. Until the exchange has succeeded a connection may
send only ApiVersions, SaslHandshake and SaslAuthenticate (Kafka's rule); anything else closes
it. A failed exchange is answered with SASL_AUTHENTICATION_FAILED and then closed, after a
delay (``connection.failed.authentication.delay.ms``) that slows password guessing.

Mechanisms: PLAIN (RFC 4616) and SCRAM-SHA-256/512 (RFC 5802, RFC 7677; the exchange is
``scramp``'s). Both check the user's SCRAM credential in ZooKeeper (``security.credentials``):
``lookup(user, mechanism)`` is that read, blocking, so the exchange's steps run on a thread.
The error a client is told never says whether the user exists.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass

import scramp

from sluice.security.scram import MECHANISMS, ScramCredential, password_matches

_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}

#: What a broker offers when ``sasl.enabled.mechanisms`` is not set.
DEFAULT_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")
SUPPORTED_MECHANISMS = ("PLAIN", *MECHANISMS)
#: The APIs a connection may use before it has authenticated.
PRE_AUTH_APIS = frozenset({17, 18, 36})  # SaslHandshake, ApiVersions, SaslAuthenticate
FAILED = "Authentication failed: invalid user name or password"

Lookup = Callable[[str, str], ScramCredential | None]


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

    def __init__(self, enabled: tuple[str, ...], lookup: Lookup):
        self.enabled = enabled
        self.lookup = lookup
        self.mechanism: str | None = None
        self.user: str | None = None
        self._scram: scramp.core.ScramServer | None = None
        self._scram_user: str | None = None
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
        for mechanism in MECHANISMS:
            credential = self.lookup(authcid, mechanism)
            if credential is not None:
                if password_matches(mechanism, credential, password):
                    return self._done(authcid, b"")
                break
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
        return self._done(self._scram_user, final.encode())

    def _scram_first(self, mechanism: str, text: str) -> Step:
        found: list[ScramCredential] = []

        def credential_of(user: str) -> tuple[bytes, bytes, bytes, int]:
            credential = self.lookup(user, mechanism)
            if credential is None:
                raise scramp.ScramException("unknown user")
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
