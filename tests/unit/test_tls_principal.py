"""The principal of a client certificate (mTLS) is its subject as RFC 4514 writes it, escapes
included, as Kafka's default principal builder names it (``X500Principal.getName()``, RFC 2253).

Failing run before the fix (issue 33, finding 6): the subject's parts were joined with a bare
comma, so a certificate whose common name is ``alice,O=Admins`` was the principal of
``O=Admins,CN=alice``, over a real handshake:

    test_the_principal_of_a_verified_client_certificate_over_a_real_handshake
    AssertionError: assert ['User:CN=alice,O=Admins'] == ['User:CN=alice\\,O\\=Admins']

Kafka's own answer for each subject is Java's, asked in `test_principals_are_what_kafkas_...`:
it escapes ``=`` as well, and writes attributes without a short name as OID=#hex.
"""

from __future__ import annotations

import base64
import datetime
import shutil
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sluice.security.tls import ServerTls, client_context, local_ca, peer_principal, principal_of_certificate

KEY = ec.generate_private_key(ec.SECP256R1())


def certificate(subject: x509.Name, issuer: x509.Name | None = None, key: Any = KEY) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer or subject)
        .public_key(KEY.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )


def der(subject: x509.Name) -> bytes:
    return certificate(subject).public_bytes(serialization.Encoding.DER)


def name(*attributes: tuple[x509.ObjectIdentifier, str]) -> x509.Name:
    """One attribute per RDN, in the order given (the certificate's order, most general first)."""
    return x509.Name([x509.RelativeDistinguishedName([x509.NameAttribute(oid, v)]) for oid, v in attributes])


CN, ORG, OU, C = (
    NameOID.COMMON_NAME,
    NameOID.ORGANIZATION_NAME,
    NameOID.ORGANIZATIONAL_UNIT_NAME,
    NameOID.COUNTRY_NAME,
)

SUBJECTS = {
    "plain": name((C, "NL"), (ORG, "Shop"), (OU, "Sync"), (CN, "alice")),
    "comma in CN": name((CN, "alice,O=Admins")),
    "O then CN": name((ORG, "Admins"), (CN, "alice")),
    "plus": name((CN, "a+b")),
    "quote and backslash": name((CN, 'say "hi" \\ bye')),
    "semicolon and angles": name((CN, "a;b<c>d")),
    "equals": name((CN, "a=b")),
    "leading hash": name((CN, "#admin")),
    "leading and trailing space": name((CN, " alice ")),
    "unicode": name((CN, "zoë")),
    "locality and state": name(
        (NameOID.LOCALITY_NAME, "Delft"), (NameOID.STATE_OR_PROVINCE_NAME, "ZH"), (CN, "bob")
    ),
    "domain components": name(
        (NameOID.DOMAIN_COMPONENT, "example"), (NameOID.DOMAIN_COMPONENT, "com"), (NameOID.USER_ID, "carol")
    ),
    "email and serial number (no short name)": name(
        (NameOID.SERIAL_NUMBER, "0042"), (CN, "erin"), (NameOID.EMAIL_ADDRESS, "erin@example.com")
    ),
    "multi-valued RDN": x509.Name(
        [
            x509.RelativeDistinguishedName([x509.NameAttribute(ORG, "Shop")]),
            x509.RelativeDistinguishedName([x509.NameAttribute(CN, "dave"), x509.NameAttribute(OU, "Ops")]),
        ]
    ),
}


def test_a_comma_in_a_common_name_is_escaped_so_it_names_no_other_subject() -> None:
    forged = principal_of_certificate(der(SUBJECTS["comma in CN"]))
    real = principal_of_certificate(der(SUBJECTS["O then CN"]))
    assert real == "User:CN=alice,O=Admins"
    assert forged == "User:CN=alice\\,O\\=Admins" and forged != real


_JAVA = """
import java.io.ByteArrayInputStream;
import java.security.cert.CertificateFactory;
import java.security.cert.X509Certificate;
import java.util.Base64;

public class X500Names {
    public static void main(String[] args) throws Exception {
        CertificateFactory f = CertificateFactory.getInstance("X.509");
        for (String arg : args) {
            byte[] der = Base64.getDecoder().decode(arg);
            X509Certificate c = (X509Certificate) f.generateCertificate(new ByteArrayInputStream(der));
            // Kafka's DefaultKafkaPrincipalBuilder: the peer principal's getName() (RFC 2253)
            System.out.println(Base64.getEncoder().encodeToString(
                c.getSubjectX500Principal().getName().getBytes("UTF-8")));
        }
    }
}
"""


@pytest.mark.skipif(shutil.which("java") is None, reason="needs a JDK (ZooKeeper's tests have one)")
def test_principals_are_what_kafkas_principal_builder_names_them(tmp_path: Path) -> None:
    """Java's X500Principal.getName() is what Kafka's default principal builder makes of a
    client certificate (with the default ssl.principal.mapping.rules): the same subjects must
    give the same principals, or an ACL written for Kafka would not match in Sluice."""
    source = tmp_path / "X500Names.java"
    source.write_text(_JAVA)
    certs = {label: der(subject) for label, subject in SUBJECTS.items()}
    out = subprocess.run(
        ["java", str(source), *(base64.b64encode(c).decode() for c in certs.values())],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    kafka = [base64.b64decode(line).decode() for line in out.stdout.split()]
    ours = {label: principal_of_certificate(c) for label, c in certs.items()}
    differences = {
        label: (ours[label], f"User:{java}")
        for label, java in zip(certs, kafka, strict=True)
        if ours[label] != f"User:{java}"
    }
    assert differences == {}, differences


def test_the_principal_of_a_verified_client_certificate_over_a_real_handshake(tmp_path: Path) -> None:
    ca = local_ca(tmp_path, ["127.0.0.1"])
    ca_cert = x509.load_pem_x509_certificate(ca.ca_file.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.ca_key.read_bytes(), password=None)
    client_pem = tmp_path / "client.pem"
    cert = certificate(SUBJECTS["comma in CN"], ca_cert.subject, ca_key)
    client_pem.write_bytes(
        cert.public_bytes(serialization.Encoding.PEM)
        + KEY.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    server_ctx = ServerTls(ca.keystore, truststore=ca.ca_file, client_auth="required").context()
    client_ctx = client_context(ca.ca_file, client_pem)
    a, b = socket.socketpair()
    principal: list[str | None] = []

    def serve() -> None:
        with server_ctx.wrap_socket(a, server_side=True) as s:
            principal.append(peer_principal(s))
            s.sendall(b"ok")

    t = threading.Thread(target=serve)
    t.start()
    with client_ctx.wrap_socket(b, server_hostname="127.0.0.1") as c:
        assert c.recv(2) == b"ok"
    t.join(10)
    assert principal == ["User:CN=alice\\,O\\=Admins"]
    assert principal[0] != "User:CN=alice,O=Admins"


def test_no_principal_without_a_verified_certificate() -> None:
    class Unverified:
        def getpeercert(self, binary_form: bool = False) -> Any:
            return der(SUBJECTS["plain"]) if binary_form else {}

    assert peer_principal(None) is None
    assert peer_principal(Unverified()) is None
