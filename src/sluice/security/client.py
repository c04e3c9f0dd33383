"""A client's security settings, Kafka's client properties: ``security.protocol``,
``sasl.mechanism``, ``sasl.username``, ``sasl.password``, ``ssl.ca.location``.

One object serves every client Sluice makes: confluent-kafka gets them as its config
(``confluent_config``), Sluice's own wire clients (the admin client, brokers fetching from each
other) use ``ssl_context`` and run the SASL exchange through ``sasl_exchange``, which is written
once as a generator of messages so the blocking and the asyncio clients share it.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import scramp

from sluice import properties as props
from sluice.security.tls import client_context

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class ClientAuthError(ConnectionError):
    """The broker refused this client's credentials (or the exchange went wrong)."""


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    protocol: str = "PLAINTEXT"
    mechanism: str = "SCRAM-SHA-512"
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_location: Path | None = None

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"security.protocol={self.protocol}: use one of {', '.join(PROTOCOLS)}")
        if self.sasl and self.mechanism not in MECHANISMS:
            raise ValueError(f"sasl.mechanism={self.mechanism}: use one of {', '.join(MECHANISMS)}")
        if self.sasl and not (self.username and self.password):
            raise ValueError(f"security.protocol={self.protocol} needs sasl.username and sasl.password")

    @classmethod
    def from_properties(cls, values: Mapping[str, str]) -> ClientSecurity:
        ca = values.get("ssl.ca.location")
        try:
            return cls(
                values.get("security.protocol", "PLAINTEXT").upper(),
                values.get("sasl.mechanism", values.get("sasl.mechanisms", "SCRAM-SHA-512")).upper(),
                values.get("sasl.username"),
                values.get("sasl.password"),
                Path(ca) if ca else None,
            )
        except ValueError as exc:
            raise props.ConfigError(f"client properties: {exc}") from None

    @classmethod
    def from_file(cls, path: Path) -> ClientSecurity:
        return cls.from_properties(props.read_properties(path))

    def properties(self) -> dict[str, str]:
        """Kafka client properties (what ``client.properties`` holds)."""
        out = {"security.protocol": self.protocol}
        if self.sasl:
            out.update({"sasl.mechanism": self.mechanism, "sasl.username": str(self.username),
                        "sasl.password": str(self.password)})  # fmt: skip
        if self.ca_location is not None:
            out["ssl.ca.location"] = str(self.ca_location)
        return out

    def confluent_config(self) -> dict[str, str]:
        """The same for confluent-kafka (librdkafka spells the mechanism key in the plural)."""
        out = self.properties()
        if "sasl.mechanism" in out:
            out["sasl.mechanisms"] = out.pop("sasl.mechanism")
        return out

    def write(self, path: Path) -> Path:
        """Write the client properties file, readable by its owner only (it holds a password)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text("".join(f"{k}={v}\n" for k, v in self.properties().items()))
        return path

    def ssl_context(self) -> ssl.SSLContext | None:
        return client_context(self.ca_location) if self.tls else None

    def sasl_exchange(self) -> Generator[bytes, bytes, None]:
        """The client's SASL messages: send what it yields, send back the broker's answer.
        Raises ClientAuthError if the broker's final message does not prove it knows the
        password (SCRAM authenticates the server too)."""
        assert self.username is not None and self.password is not None
        if self.mechanism == "PLAIN":
            yield f"\0{self.username}\0{self.password}".encode()
            return
        client = scramp.ScramClient([self.mechanism], self.username, self.password)
        first = yield client.get_client_first().encode()
        try:
            client.set_server_first(first.decode())
            final = yield client.get_client_final().encode()
            client.set_server_final(final.decode())
        except (UnicodeDecodeError, scramp.ScramException) as exc:
            raise ClientAuthError(
                f"SASL {self.mechanism}: the broker's answer is not valid ({exc})"
            ) from None


PLAINTEXT = ClientSecurity()

#: Kafka's client keys, as a process's configuration file (worker, manager) holds them, and the
#: field each sets; :func:`pop_client_security` turns the fields into one ClientSecurity.
CLIENT_KEYS = {
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.username": "sasl_username",
    "sasl.password": "sasl_password",
    "ssl.ca.location": "ssl_ca_location",
}
CLIENT_SETTINGS: tuple[props.Setting, ...] = (
    props.Setting("security.protocol", "security_protocol", props.non_empty,
                  f"how to reach the brokers: {', '.join(PROTOCOLS)} (default PLAINTEXT)"),
    props.Setting("sasl.mechanism", "sasl_mechanism", props.non_empty,
                  f"SASL mechanism: {', '.join(MECHANISMS)} (default SCRAM-SHA-512)"),
    props.Setting("sasl.username", "sasl_username", props.non_empty, "SASL user"),
    props.Setting("sasl.password", "sasl_password", props.non_empty, "SASL password"),
    props.Setting("ssl.ca.location", "ssl_ca_location", props.non_empty, "CA of the brokers' certificates"),
)  # fmt: skip


def pop_client_security(fields: dict[str, Any], source: str) -> ClientSecurity:
    """Take the client keys' fields out of ``fields`` (``props.resolve`` of CLIENT_SETTINGS) as
    one ClientSecurity; ConfigError (naming ``source``, never the password) if they disagree."""
    values = {key: fields.pop(attr) for key, attr in CLIENT_KEYS.items() if attr in fields}
    try:
        return ClientSecurity.from_properties(values)
    except props.ConfigError as exc:
        raise props.ConfigError(f"{source}: {exc}") from None


# ---------------------------------------------------------------- the exchange over a connection

Request = Callable[[int, int, dict[str, Any]], dict[str, Any]]
AsyncRequest = Callable[[int, int, dict[str, Any]], Awaitable[dict[str, Any]]]
_HANDSHAKE, _AUTHENTICATE = 17, 36


def _handshake_body(security: ClientSecurity) -> dict[str, Any]:
    return {"mechanism": security.mechanism}


def _check(response: dict[str, Any], what: str) -> None:
    if response.get("error_code", 0) != 0:
        from sluice.protocol.errors import ErrorCode

        code = ErrorCode(response["error_code"]).name
        detail = response.get("error_message") or ", ".join(response.get("mechanisms") or [])
        raise ClientAuthError(f"{what}: {code} ({detail})")


def authenticate(security: ClientSecurity, request: Request) -> None:
    """SaslHandshake v1 then SaslAuthenticate until the exchange is done (blocking clients)."""
    _check(request(_HANDSHAKE, 1, _handshake_body(security)), f"SASL handshake for {security.mechanism}")
    steps = security.sasl_exchange()
    message = next(steps)
    while True:
        response = request(_AUTHENTICATE, 1, {"auth_bytes": message})
        _check(response, f"SASL authentication of {security.username}")
        try:
            message = steps.send(bytes(response["auth_bytes"]))
        except StopIteration:
            return


async def authenticate_async(security: ClientSecurity, request: AsyncRequest) -> None:
    """The same for asyncio clients (brokers fetching from each other)."""
    _check(
        await request(_HANDSHAKE, 1, _handshake_body(security)), f"SASL handshake for {security.mechanism}"
    )
    steps = security.sasl_exchange()
    message = next(steps)
    while True:
        response = await request(_AUTHENTICATE, 1, {"auth_bytes": message})
        _check(response, f"SASL authentication of {security.username}")
        try:
            message = steps.send(bytes(response["auth_bytes"]))
        except StopIteration:
            return
