"""SCRAM credentials (RFC 5802, RFC 7677) as Kafka stores them, and the checks made with them.

A user's credential for one mechanism is the salt, the iteration count, StoredKey and ServerKey,
never the password: ``salt=<b64>,stored_key=<b64>,server_key=<b64>,iterations=<n>`` in
``/config/users/<user>``, as Kafka writes it. The exchange itself is ``scramp``'s (a well-kept
SCRAM library); this module only derives, encodes and compares credentials. PLAIN is checked
against the same credential (the password is salted and hashed the same way and StoredKey
compared), so a cluster has one user store whichever mechanism a client picks.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass

#: Kafka's ScramMechanism wire codes (DescribeUserScramCredentials, AlterUserScramCredentials).
MECHANISMS: dict[str, int] = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}
MECHANISM_NAMES: dict[int, str] = {v: k for k, v in MECHANISMS.items()}
_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
#: Kafka's minimum and default iteration count.
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
DEFAULT_ITERATIONS = 4096


class CredentialError(ValueError):
    """A credential that cannot be made or read (unknown mechanism, bad iteration count, bad
    stored text)."""


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def encode(self) -> str:
        b64 = base64.b64encode
        return (
            f"salt={b64(self.salt).decode()},stored_key={b64(self.stored_key).decode()},"
            f"server_key={b64(self.server_key).decode()},iterations={self.iterations}"
        )

    @classmethod
    def decode(cls, text: str) -> ScramCredential:
        try:
            fields = dict(part.split("=", 1) for part in text.split(","))
            return cls(
                base64.b64decode(fields["salt"], validate=True),
                base64.b64decode(fields["stored_key"], validate=True),
                base64.b64decode(fields["server_key"], validate=True),
                int(fields["iterations"]),
            )
        except (KeyError, ValueError) as exc:
            raise CredentialError(f"not a SCRAM credential ({exc})") from None

    def scramp_info(self) -> tuple[bytes, bytes, bytes, int]:
        """What ``scramp``'s server asks its auth function for."""
        return self.salt, self.stored_key, self.server_key, self.iterations


def check_mechanism(mechanism: str) -> str:
    name = mechanism.upper()
    if name not in _HASHES:
        raise CredentialError(f"unknown SCRAM mechanism {mechanism!r}: use one of {', '.join(MECHANISMS)}")
    return name


def check_iterations(iterations: int) -> int:
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise CredentialError(f"iterations must be in {MIN_ITERATIONS}..{MAX_ITERATIONS}, got {iterations}")
    return iterations


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """RFC 5802's Hi(Normalize(password), salt, i). Passwords are used as UTF-8 (SASLprep leaves
    the ASCII passwords Kafka tools generate unchanged)."""
    return hashlib.pbkdf2_hmac(_HASHES[mechanism], password.encode(), salt, iterations)


def from_salted_password(mechanism: str, salted: bytes, salt: bytes, iterations: int) -> ScramCredential:
    """The stored form of a salted password (what AlterUserScramCredentials sends)."""
    name = _HASHES[check_mechanism(mechanism)]
    client_key = hmac.digest(salted, b"Client Key", name)
    return ScramCredential(
        salt,
        hashlib.new(name, client_key).digest(),
        hmac.digest(salted, b"Server Key", name),
        check_iterations(iterations),
    )


def make_credential(mechanism: str, password: str, iterations: int = DEFAULT_ITERATIONS) -> ScramCredential:
    """A new credential with a random 32-byte salt."""
    mechanism = check_mechanism(mechanism)
    if not password:
        raise CredentialError("the password is empty")
    salt = os.urandom(32)
    return from_salted_password(
        mechanism, salted_password(mechanism, password, salt, iterations), salt, iterations
    )


def password_matches(mechanism: str, credential: ScramCredential, password: str) -> bool:
    """PLAIN's check: the password salted and hashed as the credential was gives its StoredKey."""
    mechanism = check_mechanism(mechanism)
    salted = salted_password(mechanism, password, credential.salt, credential.iterations)
    again = from_salted_password(mechanism, salted, credential.salt, credential.iterations)
    return hmac.compare_digest(again.stored_key, credential.stored_key)
