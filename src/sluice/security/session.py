"""Who is asking: the authenticated principal of the connection whose request is being handled.

The network layer (`sluice.broker.server`) sets these per connection task once the connection
has authenticated (or at once on a PLAINTEXT or SSL listener without client certificates); the
handlers and the authorizer read them. A principal is Kafka's ``"User:<name>"``; a connection
that authenticated nothing is ``User:ANONYMOUS``, as in Kafka."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

ANONYMOUS = "User:ANONYMOUS"


@dataclass(frozen=True, slots=True)
class Session:
    #: ``User:<name>`` (SASL user name, or a client certificate's subject on mTLS).
    principal: str = ANONYMOUS
    #: The listener's name (``PLAINTEXT``, ``SASL_SSL``, ``INTERNAL`` ...).
    listener: str = "PLAINTEXT"
    #: The listener's security protocol: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.
    protocol: str = "PLAINTEXT"
    #: The client's address, ``/host`` as Kafka prints it.
    host: str = ""

    @property
    def authenticated(self) -> bool:
        return self.principal != ANONYMOUS


#: The session of the connection whose request this task is handling.
current_session: contextvars.ContextVar[Session] = contextvars.ContextVar(
    "current_session",
    default=Session(),  # noqa: B039 (frozen: a shared default cannot be changed)
)

#: The address of the client whose request this task is handling, ``/host`` as Kafka prints it
#: (empty when the transport has none): the group coordinator records it per member, and the
#: authorizer puts it into a session the authentication left without one.
current_client_host: contextvars.ContextVar[str] = contextvars.ContextVar("current_client_host", default="")
