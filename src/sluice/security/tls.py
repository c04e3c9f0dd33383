"""TLS: the broker's server context, a client's context, and a local certificate authority.

Certificates and keys are PEM files. A broker's listener takes ``ssl.keystore.location`` (its
certificate chain and private key in one PEM file, Kafka's ``ssl.keystore.type=PEM``),
``ssl.key.password`` when the key is encrypted, ``ssl.truststore.location`` (PEM CAs that sign
client certificates) and ``ssl.client.auth`` = none | requested | required (mTLS: the
certificate's subject becomes the principal). ``local_ca`` writes a CA and a certificate for
``sluice cluster up --security ...`` (the ``cryptography`` library does the X.509 work).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


@dataclass(frozen=True, slots=True)
class ServerTls:
    keystore: Path
    key_password: str | None = field(default=None, repr=False)
    truststore: Path | None = None
    client_auth: str = "none"

    def context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.keystore, password=self.key_password)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"ssl.keystore.location {self.keystore}: cannot load a certificate and key from it ({exc}); "
                "give a PEM file holding the certificate chain and its private key"
            ) from None
        if self.client_auth != "none":
            if self.truststore is None:
                raise ValueError(f"ssl.client.auth={self.client_auth} needs ssl.truststore.location")
            ctx.load_verify_locations(cafile=str(self.truststore))
        ctx.verify_mode = CLIENT_AUTH[self.client_auth]
        return ctx


def client_context(
    ca_file: Path | None, cert_file: Path | None = None, key_file: Path | None = None
) -> ssl.SSLContext:
    """A client's context: the server's certificate is checked against ``ca_file`` (the system's
    CAs without one), host names included."""
    ctx = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file is not None:
        ctx.load_cert_chain(cert_file, keyfile=key_file)
    return ctx


def peer_principal(ssl_object: Any) -> str | None:
    """``User:<subject>`` of a verified client certificate (mTLS), Kafka's default principal
    builder's form (``CN=alice,OU=...``, `principal_of_certificate`); None without one."""
    if ssl_object is None:
        return None
    # The dict form is empty unless the handshake verified the certificate; the DER form is
    # given even when it did not, so it is read only once the dict says it was verified.
    if not ssl_object.getpeercert():
        return None
    der = ssl_object.getpeercert(binary_form=True)
    return principal_of_certificate(der) if der else None


def principal_of_certificate(der: bytes) -> str | None:
    """``User:`` and the certificate's subject as RFC 4514 (and RFC 2253) writes it, as Kafka's
    default principal builder names it (Java's ``X500Principal.getName()``): the RDNs last
    first, a value's ``, + " \\ < > ; =`` and a leading ``#`` or space or trailing space escaped
    with a backslash, so that a common name ``alice,O=Admins`` cannot pose as the subject
    ``O=Admins,CN=alice``. An attribute without a short name (CN, L, ST, O, OU, C, STREET, DC,
    UID) is its OID and its DER value in hex, ``1.2.840.113549.1.9.1=#1611...``. None for an
    empty subject."""
    from cryptography import x509

    subject = x509.load_der_x509_certificate(der).subject
    rdns = ["+".join(_attribute(a) for a in rdn) for rdn in reversed(subject.rdns)]
    return "User:" + ",".join(rdns) if rdns else None


#: the attribute types RFC 4514 (and Java's RFC 2253 form) write by name
_SHORT_NAMES = {
    "2.5.4.3": "CN", "2.5.4.7": "L", "2.5.4.8": "ST", "2.5.4.10": "O", "2.5.4.11": "OU", "2.5.4.6": "C",
    "2.5.4.9": "STREET", "0.9.2342.19200300.100.1.25": "DC", "0.9.2342.19200300.100.1.1": "UID",
}  # fmt: skip
#: how each ASN.1 string type's characters are encoded in its DER value
_STRING_CODECS = {12: "utf-8", 19: "ascii", 20: "latin-1", 22: "ascii", 26: "ascii", 28: "utf-32-be",
                  30: "utf-16-be"}  # fmt: skip


def _attribute(attribute: Any) -> str:
    oid = attribute.oid.dotted_string
    value = attribute.value
    name = _SHORT_NAMES.get(oid)
    if name is None or not isinstance(value, str):
        return f"{oid}=#{_der_value(attribute).hex()}"
    return f"{name}={_escape(value)}"


def _escape(value: str) -> str:
    """RFC 4514 section 2.4: the characters a value may not hold as they are, backslash-escaped."""
    out = "".join(f"\\{c}" if c in ',+"\\<>;=' else c for c in value)  # '=' too, as Java does
    if out.startswith(("#", " ")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


def _der_value(attribute: Any) -> bytes:
    """The DER encoding of an attribute's value (its tag, length and bytes)."""
    value = attribute.value
    if isinstance(value, bytes):  # a bit string (x500UniqueIdentifier): unused-bits octet first
        tag, body = 3, b"\0" + value
    else:
        tag = int(attribute._type.value)
        body = value.encode(_STRING_CODECS.get(tag, "utf-8"))
    length = len(body)
    if length < 0x80:
        encoded_length = bytes([length])
    else:
        size = length.to_bytes((length.bit_length() + 7) // 8, "big")
        encoded_length = bytes([0x80 | len(size)]) + size
    return bytes([tag]) + encoded_length + body


# ---------------------------------------------------------------- a local certificate authority


@dataclass(frozen=True, slots=True)
class LocalCa:
    ca_file: Path  # the CA certificate (clients' ssl.ca.location, brokers' ssl.truststore.location)
    keystore: Path  # a server certificate + key for the given host names (brokers' keystore)
    ca_key: Path  # the CA's private key (owner-only), to issue client certificates


def local_ca(directory: Path, hosts: list[str], *, days: int = 365) -> LocalCa:
    """A new CA and one server certificate for ``hosts`` (names and IP addresses), signed by
    it, written to ``directory`` (ca.pem, ca-key.pem, server.pem with its key; keys readable by
    the owner only). For local clusters and tests; production brings its own certificates."""
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Sluice local CA")])
    signs_certificates = x509.KeyUsage(False, False, False, False, False, True, True, False, False)
    ca_cert = _sign(
        _builder(ca_name, ca_key.public_key(), days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(signs_certificates, critical=True),
        ca_name, ca_key,
    )  # fmt: skip
    ca_file = directory / "ca.pem"
    ca_file.write_bytes(_pem(ca_cert))
    ca_key_file = _write_private(directory / "ca-key.pem", b"", ca_key)
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _sign(
        _builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]), key.public_key(), days)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False),
        ca_name, ca_key,
    )  # fmt: skip
    keystore = _write_private(directory / "server.pem", _pem(cert) + _pem(ca_cert), key)
    return LocalCa(ca_file, keystore, ca_key_file)


def client_certificate(ca: LocalCa, common_name: str, *, days: int = 365) -> Path:
    """A client certificate (mTLS) for ``common_name``, signed by the local CA: one owner-only
    PEM file with the certificate and its key, next to the CA. Its principal is
    ``User:CN=<common_name>``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    ca_cert = x509.load_pem_x509_certificate(ca.ca_file.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = _sign(
        _builder(subject, key.public_key(), days).add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        ),
        ca_cert.subject, ca_key,
    )  # fmt: skip
    return _write_private(ca.ca_file.parent / f"client-{common_name}.pem", _pem(cert), key)


def _builder(subject: Any, public_key: Any, days: int) -> Any:
    from cryptography import x509

    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def _sign(builder: Any, issuer: Any, key: Any) -> Any:
    from cryptography.hazmat.primitives import hashes

    return builder.issuer_name(issuer).sign(key, hashes.SHA256())


def _pem(cert: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(cert.public_bytes(serialization.Encoding.PEM))


def _write_private(path: Path, certificates: bytes, key: Any) -> Path:
    """Certificates then the private key, in a file only its owner can read (made so before
    anything is written)."""
    from cryptography.hazmat.primitives import serialization

    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(certificates + pem)
    return path
