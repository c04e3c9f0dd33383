"""Who a connection is: the I/O shell around ``security.sasl.SaslExchange`` for one connection.

The network layer makes one ``ConnectionAuth`` per accepted connection with the listener it came
in on. On a PLAINTEXT or SSL listener the connection is authenticated at once (``User:ANONYMOUS``,
or the client certificate's subject under mTLS). On a SASL listener it must finish SaslHandshake
and SaslAuthenticate first: until then only ApiVersions and those two are allowed, and a
connection still unauthenticated after ``authentication.timeout.ms`` is closed. A failed attempt
is answered after ``connection.failed.authentication.delay.ms`` and the connection closed.

Re-authentication (KIP-368), Kafka's rules: with ``connections.max.reauth.ms`` set, a SASL
session lasts that long (SaslAuthenticate v1+ tells the client, ``session_lifetime_ms``). A
SaslHandshake on an authenticated connection starts a re-authentication on it (at most once a
second; otherwise it is answered ILLEGAL_SASL_STATE, the session unchanged), which must succeed
for the same principal with the same mechanism and a credential valid now, or the connection is
closed; it then starts a new lifetime. Any other request after the lifetime closes the
connection instead of being answered. So a password changed or a user deleted ends its open
connections at their next re-authentication, or their first request after the lifetime.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from sluice import metrics
from sluice.protocol.api import ApiKey, RequestHeader
from sluice.protocol.errors import ErrorCode
from sluice.security.credentials import CredentialStore, Lookup, with_own_user
from sluice.security.sasl import FAILED, PRE_AUTH_APIS, AuthenticationFailed, SaslExchange
from sluice.security.session import ANONYMOUS, Session
from sluice.security.tls import peer_principal

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sluice.broker.config import BrokerConfig
    from sluice.broker.listeners import Listener
    from sluice.cluster.zkstore import ZkStore
    from sluice.security.scram import ScramCredential

log = logging.getLogger("sluice.auth")

Body = dict[str, Any]


#: Kafka's least interval between two re-authentications of one connection (a SaslHandshake
#: sooner is answered as on any authenticated connection: ILLEGAL_SASL_STATE).
MIN_REAUTH_INTERVAL_S = 1.0


class AuthenticationHost(Protocol):
    """What a connection's authentication needs of the broker: its SASL settings, ZooKeeper's
    credentials, and the brokers' own user's credentials (from the configuration only)."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def store(self) -> ZkStore: ...

    @property
    def own_credentials(self) -> Mapping[str, ScramCredential]: ...


class ConnectionAuth:
    def __init__(self, broker: AuthenticationHost, listener: Listener, host: str, ssl_object: Any = None):
        self.broker = broker
        self.listener = listener
        self.host = host
        principal = peer_principal(ssl_object) if listener.tls else None
        self.session = Session(principal or ANONYMOUS, listener.name, listener.protocol, host)
        self.authenticated = not listener.sasl
        self.deadline = time.monotonic() + broker.config.authentication_timeout_ms / 1000.0
        #: KIP-368: how long a SASL session lasts (0: for ever), and when this one ends (monotonic)
        self.lifetime_ms = broker.config.connections_max_reauth_ms if listener.sasl else 0
        self.session_expires_at: float | None = None
        self._exchange: SaslExchange | None = None
        #: the mechanism and user the session was authenticated with (a re-authentication keeps both)
        self._mechanism: str | None = None
        self._user: str | None = None
        self._reauthenticating = False
        self._reauth_started_at = 0.0
        self._mechanism_changed = False
        if listener.sasl:
            self._exchange = self._new_exchange()

    def _new_exchange(self) -> SaslExchange:
        """A SASL exchange for this connection (its first authentication or a re-authentication)."""
        broker = self.broker
        store = CredentialStore(broker.store.client)
        lookup: Lookup = store.credential
        own = broker.config.inter_broker_username
        if own and broker.own_credentials:  # the brokers' user: from the configuration only
            lookup = with_own_user(lookup, own, broker.own_credentials)
        return SaslExchange(broker.config.sasl_mechanisms, lookup, store.fake_credential)

    def allows(self, api_key: int) -> bool:
        """May this request be handled now? Before authentication only ApiVersions and SASL;
        during a re-authentication only its own SaslAuthenticate (handled before this is asked)."""
        if self._reauthenticating:
            return False
        return self.authenticated or api_key in PRE_AUTH_APIS

    def expired(self) -> bool:
        return not self.authenticated and time.monotonic() > self.deadline

    def session_expired(self, now: float) -> bool:
        """The session's lifetime has passed without a re-authentication (KIP-368): the request
        in hand must close the connection instead of being answered."""
        expires = self.session_expires_at
        return self.authenticated and not self._reauthenticating and expires is not None and now > expires

    def begin_reauthentication(self, now: float) -> bool:
        """A SaslHandshake on an authenticated connection (Kafka's
        KafkaChannel.maybeBeginServerReauthentication): True when it starts a re-authentication,
        which is possible only for a session with a lifetime and not sooner than a second after
        the previous one; False: the handshake is answered as on any authenticated connection."""
        if not self.authenticated or self.session_expires_at is None or self._reauthenticating:
            return False
        if self._reauth_started_at and now - self._reauth_started_at < MIN_REAUTH_INTERVAL_S:
            return False
        self._reauth_started_at = now
        self._reauthenticating = True
        self._mechanism_changed = False
        self._exchange = self._new_exchange()
        return True

    async def handle(self, header: RequestHeader, body: Body) -> tuple[Body | None, bool]:
        """Answer SaslHandshake or SaslAuthenticate: the answer (None: none, the connection
        closes) and "close after answering"."""
        if header.api_key == ApiKey.SASL_HANDSHAKE:
            return self._handshake(header, body)
        return await self._authenticate(header, body)

    def _handshake(self, header: RequestHeader, body: Body) -> tuple[Body, bool]:
        exchange = self._exchange
        offered = list(exchange.enabled) if exchange is not None else []
        if self.authenticated and not self._reauthenticating:
            # Kafka's KafkaApis answer on an authenticated connection: the session goes on
            return {"error_code": ErrorCode.ILLEGAL_SASL_STATE, "mechanisms": offered}, False
        if exchange is None or exchange.mechanism is not None:
            return {"error_code": ErrorCode.ILLEGAL_SASL_STATE, "mechanisms": offered}, True
        if header.api_version < 1:
            # v0 sends the SASL tokens without Kafka framing; every client since Kafka 1.0
            # uses v1 and SaslAuthenticate.
            return {"error_code": ErrorCode.UNSUPPORTED_VERSION, "mechanisms": offered}, True
        mechanism = str(body.get("mechanism", ""))
        if not exchange.handshake(mechanism):
            return {"error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM, "mechanisms": offered}, True
        # a re-authentication with another mechanism is answered here as Kafka answers it, and
        # ends at its first SaslAuthenticate
        self._mechanism_changed = self._reauthenticating and mechanism != self._mechanism
        return {"error_code": ErrorCode.NONE, "mechanisms": offered}, False

    async def _authenticate(self, header: RequestHeader, body: Body) -> tuple[Body | None, bool]:
        exchange = self._exchange
        if self.authenticated and not self._reauthenticating:
            # Kafka answers it on an authenticated connection and goes on
            return _auth_error(ErrorCode.ILLEGAL_SASL_STATE, "SaslAuthenticate after authentication"), False
        if exchange is None or exchange.mechanism is None:
            return _auth_error(ErrorCode.ILLEGAL_SASL_STATE, "SaslAuthenticate out of order"), True
        if self._mechanism_changed:
            log.warning(
                "event=reauthentication_refused listener=%s peer=%s principal=%s reason=mechanism_changed "
                "mechanism=%s new_mechanism=%s action=close",
                self.listener.name, self.host, self.session.principal, self._mechanism, exchange.mechanism,
            )  # fmt: skip
            return None, True
        try:
            step = await asyncio.to_thread(exchange.step, bytes(body.get("auth_bytes") or b""))
        except AuthenticationFailed as exc:
            metrics.AUTHENTICATIONS.labels(self.listener.name, "failed").inc()
            log.warning(
                "event=authentication_failed listener=%s peer=%s mechanism=%s reauthentication=%s reason=%r",
                self.listener.name, self.host, exchange.mechanism, str(self._reauthenticating).lower(),
                str(exc),
            )  # fmt: skip
            await asyncio.sleep(self.broker.config.failed_authentication_delay_ms / 1000.0)
            return _auth_error(ErrorCode.SASL_AUTHENTICATION_FAILED, FAILED), True
        if step.user is None:
            return _answer(step.response, 0), False
        now = time.monotonic()
        if self._reauthenticating and step.user != self._user:
            metrics.AUTHENTICATIONS.labels(self.listener.name, "failed").inc()
            log.warning(
                "event=reauthentication_refused listener=%s peer=%s principal=%s new_principal=User:%s "
                "reason=principal_changed action=close",
                self.listener.name, self.host, self.session.principal, step.user,
            )  # fmt: skip
            await asyncio.sleep(self.broker.config.failed_authentication_delay_ms / 1000.0)
            return _auth_error(ErrorCode.SASL_AUTHENTICATION_FAILED, FAILED), True
        metrics.AUTHENTICATIONS.labels(self.listener.name, "succeeded").inc()
        self.session_expires_at = now + self.lifetime_ms / 1000.0 if self.lifetime_ms > 0 else None
        if self._reauthenticating:
            self._reauthenticating = False
            log.info(
                "event=reauthenticated listener=%s peer=%s principal=%s session_lifetime_ms=%d",
                self.listener.name, self.host, self.session.principal, self.lifetime_ms,
            )  # fmt: skip
        else:
            self.authenticated = True
            self._mechanism, self._user = exchange.mechanism, step.user
            self.session = Session(f"User:{step.user}", self.listener.name, self.listener.protocol, self.host)
            log.info(
                "event=authenticated listener=%s peer=%s principal=%s mechanism=%s session_lifetime_ms=%d",
                self.listener.name, self.host, self.session.principal, exchange.mechanism, self.lifetime_ms,
            )  # fmt: skip
        return _answer(step.response, self.lifetime_ms), False


def _answer(auth_bytes: bytes, session_lifetime_ms: int) -> Body:
    return {"error_code": ErrorCode.NONE, "error_message": None, "auth_bytes": auth_bytes,
            "session_lifetime_ms": session_lifetime_ms}  # fmt: skip


def _auth_error(code: ErrorCode, message: str) -> Body:
    return {"error_code": code, "error_message": message, "auth_bytes": b"", "session_lifetime_ms": 0}
