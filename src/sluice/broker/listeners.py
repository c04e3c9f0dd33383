"""A broker's listeners by name, Kafka's way: ``listeners``, ``advertised.listeners``,
``listener.security.protocol.map`` and ``inter.broker.listener.name``.

``listeners=PLAINTEXT://127.0.0.1:9092,SASL_SSL://127.0.0.1:9093`` binds two sockets; a name
that is not itself a security protocol (``INTERNAL://...``) takes its protocol from the map
(``INTERNAL:SASL_SSL``). Clients are told, in Metadata, the advertised address of the listener
they connected to; brokers fetch from each other on the inter-broker listener.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


@dataclass(frozen=True, slots=True)
class Listener:
    name: str
    protocol: str
    host: str
    port: int

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def __str__(self) -> str:
        return f"{self.name}://{self.host}:{self.port}"


def parse_endpoints(raw: str) -> tuple[tuple[str, str, int], ...]:
    """``NAME://host:port[,NAME://host:port...]`` -> ((NAME, host, port), ...); names are
    upper-cased and unique, an empty host binds every address."""
    out: list[tuple[str, str, int]] = []
    for item in (i.strip() for i in raw.split(",")):
        if not item:
            continue
        name, sep, rest = item.partition("://")
        if not sep or not name:
            raise ValueError(f"{item!r}: expected NAME://host:port, e.g. PLAINTEXT://127.0.0.1:9092")
        host, colon, port_s = rest.rpartition(":")
        if not colon:
            raise ValueError(f"{item!r}: no port given (expected NAME://host:port)")
        try:
            port = int(port_s)
        except ValueError:
            raise ValueError(f"{item!r}: port {port_s!r} is not a number") from None
        if not 0 < port < 65536:
            raise ValueError(f"{item!r}: port {port} is out of 1..65535")
        name = name.strip().upper()
        if any(n == name for n, _, _ in out):
            raise ValueError(f"listener name {name} is given twice: each listener needs its own name")
        out.append((name, host.strip("[]") or "0.0.0.0", port))
    if not out:
        raise ValueError("names no listener")
    return tuple(out)


def parse_protocol_map(raw: str) -> dict[str, str]:
    """``INTERNAL:SASL_SSL,EXTERNAL:SSL`` -> {"INTERNAL": "SASL_SSL", "EXTERNAL": "SSL"}."""
    out: dict[str, str] = {}
    for item in (i.strip() for i in raw.split(",")):
        if not item:
            continue
        name, sep, protocol = item.partition(":")
        protocol = protocol.strip().upper()
        if not sep or protocol not in PROTOCOLS:
            raise ValueError(f"{item!r}: expected NAME:PROTOCOL with PROTOCOL one of {', '.join(PROTOCOLS)}")
        out[name.strip().upper()] = protocol
    return out


def resolve_listeners(
    endpoints: tuple[tuple[str, str, int], ...], protocol_map: Mapping[str, str]
) -> tuple[Listener, ...]:
    """Listeners with their protocols: the map's, or the name's own when it is a protocol."""
    out = []
    for name, host, port in endpoints:
        protocol = protocol_map.get(name) or (name if name in PROTOCOLS else None)
        if protocol is None:
            raise ValueError(
                f"listener {name} has no security protocol: add {name}:<PROTOCOL> to "
                f"listener.security.protocol.map (PROTOCOL one of {', '.join(PROTOCOLS)})"
            )
        out.append(Listener(name, protocol, host, port))
    return tuple(out)


def advertised_for(
    listeners: tuple[Listener, ...], advertised: tuple[tuple[str, str, int], ...] | None
) -> dict[str, tuple[str, int]]:
    """Each listener's advertised host and port: ``advertised.listeners``' entry of that name,
    else the listener's own address. An advertised name no listener has is refused."""
    given = {name: (host, port) for name, host, port in advertised or ()}
    names = {lst.name for lst in listeners}
    unknown = sorted(set(given) - names)
    if unknown:
        raise ValueError(f"advertised.listeners names {', '.join(unknown)}, which listeners does not bind")
    out = {lst.name: given.get(lst.name, (lst.host, lst.port)) for lst in listeners}
    for name, (host, _) in out.items():
        if host in ("", "0.0.0.0", "::"):
            raise ValueError(
                f"listener {name} binds every address, which clients cannot connect to: set "
                f"advertised.listeners={name}://<host clients use>:<port>"
            )
    return out
