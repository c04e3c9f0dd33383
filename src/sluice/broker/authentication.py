"""Who a connection is: the I/O shell around ``security.sasl.SaslExchange`` for one connection.

The network layer makes one ``ConnectionAuth`` per accepted connection with the listener it came
in on. On a PLAINTEXT or SSL listener the connection is authenticated at once (``User:ANONYMOUS``,
or the client certificate's subject under mTLS). On a SASL listener it must finish SaslHandshake
and SaslAuthenticate first: until then only ApiVersions and those two are allowed, and a
connection still unauthenticated after ``authentication.timeout.ms`` is closed. A failed attempt
is answered after ``connection.failed.authentication.delay.ms`` and the connection closed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from sluice import metrics
from sluice.protocol.api import ApiKey, RequestHeader
from sluice.protocol.errors import ErrorCode
from sluice.security.credentials import CredentialStore, Lookup, with_own_user
from sluice.security.sasl import FAILED, PRE_AUTH_APIS, AuthenticationFailed, SaslExchange
from sluice.security.session import ANONYMOUS, Session
from sluice.security.tls import peer_principal

if TYPE_CHECKING:
    from sluice.broker.broker import Broker
    from sluice.broker.listeners import Listener

log = logging.getLogger("sluice.auth")

Body = dict[str, Any]


class ConnectionAuth:
    def __init__(self, broker: Broker, listener: Listener, host: str, ssl_object: Any = None):
        self.broker = broker
        self.listener = listener
        self.host = host
        principal = peer_principal(ssl_object) if listener.tls else None
        self.session = Session(principal or ANONYMOUS, listener.name, listener.protocol, host)
        self.authenticated = not listener.sasl
        self.deadline = time.monotonic() + broker.config.authentication_timeout_ms / 1000.0
        self._exchange: SaslExchange | None = None
        if listener.sasl:
            store = CredentialStore(broker.store.client)
            lookup: Lookup = store.credential
            own = broker.config.inter_broker_username
            if own and broker.own_credentials:  # the brokers' user: from the configuration only
                lookup = with_own_user(lookup, own, broker.own_credentials)
            self._exchange = SaslExchange(broker.config.sasl_mechanisms, lookup, store.fake_credential)

    def allows(self, api_key: int) -> bool:
        """May this request be handled now? Before authentication only ApiVersions and SASL."""
        return self.authenticated or api_key in PRE_AUTH_APIS

    def expired(self) -> bool:
        return not self.authenticated and time.monotonic() > self.deadline

    async def handle(self, header: RequestHeader, body: Body) -> tuple[Body, bool]:
        """Answer SaslHandshake or SaslAuthenticate; the bool says "close after answering"."""
        if header.api_key == ApiKey.SASL_HANDSHAKE:
            return self._handshake(header, body)
        return await self._authenticate(body)

    def _handshake(self, header: RequestHeader, body: Body) -> tuple[Body, bool]:
        exchange = self._exchange
        offered = list(exchange.enabled) if exchange is not None else []
        if exchange is None or self.authenticated or exchange.mechanism is not None:
            return {"error_code": ErrorCode.ILLEGAL_SASL_STATE, "mechanisms": offered}, True
        if header.api_version < 1:
            # v0 sends the SASL tokens without Kafka framing; every client since Kafka 1.0
            # uses v1 and SaslAuthenticate.
            return {"error_code": ErrorCode.UNSUPPORTED_VERSION, "mechanisms": offered}, True
        if not exchange.handshake(str(body.get("mechanism", ""))):
            return {"error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM, "mechanisms": offered}, True
        return {"error_code": ErrorCode.NONE, "mechanisms": offered}, False

    async def _authenticate(self, body: Body) -> tuple[Body, bool]:
        exchange = self._exchange
        if exchange is None or self.authenticated or exchange.mechanism is None:
            return _auth_error(ErrorCode.ILLEGAL_SASL_STATE, "SaslAuthenticate out of order"), True
        try:
            step = await asyncio.to_thread(exchange.step, bytes(body.get("auth_bytes") or b""))
        except AuthenticationFailed as exc:
            metrics.AUTHENTICATIONS.labels(self.listener.name, "failed").inc()
            log.warning(
                "event=authentication_failed listener=%s peer=%s mechanism=%s reason=%r",
                self.listener.name, self.host, exchange.mechanism, str(exc),
            )  # fmt: skip
            await asyncio.sleep(self.broker.config.failed_authentication_delay_ms / 1000.0)
            return _auth_error(ErrorCode.SASL_AUTHENTICATION_FAILED, FAILED), True
        if step.user is not None:
            self.authenticated = True
            self.session = Session(f"User:{step.user}", self.listener.name, self.listener.protocol, self.host)
            metrics.AUTHENTICATIONS.labels(self.listener.name, "succeeded").inc()
            log.info(
                "event=authenticated listener=%s peer=%s principal=%s mechanism=%s",
                self.listener.name, self.host, self.session.principal, exchange.mechanism,
            )  # fmt: skip
        return {"error_code": ErrorCode.NONE, "error_message": None, "auth_bytes": step.response,
                "session_lifetime_ms": 0}, False  # fmt: skip


def _auth_error(code: ErrorCode, message: str) -> Body:
    return {"error_code": code, "error_message": message, "auth_bytes": b"", "session_lifetime_ms": 0}
