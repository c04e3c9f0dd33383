"""SASL users: SCRAM credentials in ``/config/users/<user>``, Kafka's layout and format.

``{"version": 1, "config": {"SCRAM-SHA-256": "salt=...,stored_key=...,server_key=...,iterations=4096"}}``.
Writes go through zkstore's compare-and-set, so two administrators changing one user's two
mechanisms at once both land. Readers (a broker authenticating a client) read the znode each
time: one small read per connection, never a stale credential after a password change.
"""

from __future__ import annotations

import os
import re
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import orjson
from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from sluice.cluster.zkstore import compare_and_set
from sluice.security.scram import (
    DEFAULT_ITERATIONS,
    MECHANISMS,
    CredentialError,
    ScramCredential,
    check_mechanism,
    make_credential,
)

Lookup = Callable[[str, str], ScramCredential | None]

USERS = "/config/users"
#: 32 random bytes, made by the first broker that needs them: the key of the challenges unknown
#: users get (``sasl.FakeCredentials``), one per cluster so that every broker answers a name alike
FAKE_SALT_KEY = "/security/scram_fake_salt_key"
_FAKE_KEYS: weakref.WeakKeyDictionary[KazooClient, bytes] = weakref.WeakKeyDictionary()
_FAKE_KEYS_LOCK = threading.Lock()
#: Kafka's user names are free text; Sluice keeps them to what a znode name and a principal
#: (``User:<name>``) carry without escaping.
_USER_NAME = re.compile(r"^[A-Za-z0-9._@-]{1,255}$")


def user_path(user: str) -> str:
    return f"{USERS}/{check_user_name(user)}"


def check_user_name(user: str) -> str:
    if not _USER_NAME.match(user or ""):
        raise CredentialError(
            f"user name {user!r} is not allowed: use 1-255 letters, digits, '.', '_', '@' or '-'"
        )
    return user


@dataclass(frozen=True, slots=True)
class UserCredentials:
    user: str
    #: mechanism -> credential
    scram: dict[str, ScramCredential]


def _decode(user: str, data: bytes | None) -> UserCredentials:
    if not data:
        return UserCredentials(user, {})
    try:
        config = orjson.loads(data).get("config") or {}
    except (orjson.JSONDecodeError, AttributeError):
        raise CredentialError(f"{user_path(user)} does not hold a user's credentials") from None
    return UserCredentials(
        user, {m: ScramCredential.decode(v) for m, v in config.items() if m.startswith("SCRAM-")}
    )


def _encode(creds: dict[str, ScramCredential]) -> bytes:
    return orjson.dumps(
        {"version": 1, "config": {m: c.encode() for m, c in sorted(creds.items())}},
        option=orjson.OPT_INDENT_2,
    )


class CredentialStore:
    """Users and their SCRAM credentials, read and written in ZooKeeper."""

    def __init__(self, client: KazooClient):
        self.client = client

    def get(self, user: str) -> UserCredentials:
        try:
            data, _ = self.client.get(user_path(user))
        except NoNodeError:
            data = None
        return _decode(user, data)

    def fake_credential(self, user: str, mechanism: str) -> ScramCredential:
        """The credential an unknown user is challenged with (RFC 5802 section 5.1), from the
        cluster's key (read once per ZooKeeper client, made if the cluster has none yet)."""
        from sluice.security.sasl import FakeCredentials

        return FakeCredentials(self._fake_salt_key())(user, mechanism)

    def _fake_salt_key(self) -> bytes:
        with _FAKE_KEYS_LOCK:
            key = _FAKE_KEYS.get(self.client)
            if key is None:
                try:
                    self.client.create(FAKE_SALT_KEY, os.urandom(32), makepath=True)
                except NodeExistsError:  # made by another broker
                    pass
                key = bytes(self.client.get(FAKE_SALT_KEY)[0])
                _FAKE_KEYS[self.client] = key
        return key

    def credential(self, user: str, mechanism: str) -> ScramCredential | None:
        """What a broker checks a client's proof against; None for an unknown user or a user
        without that mechanism (or a user name no user can have)."""
        try:
            return self.get(user).scram.get(mechanism)
        except CredentialError:
            return None

    def users(self) -> list[UserCredentials]:
        try:
            names = sorted(self.client.get_children(USERS))
        except NoNodeError:
            return []
        out = [self.get(n) for n in names if _USER_NAME.match(n)]
        return [u for u in out if u.scram]

    def upsert(self, user: str, mechanism: str, credential: ScramCredential) -> None:
        mechanism = check_mechanism(mechanism)

        def change(data: bytes | None) -> bytes:
            creds = dict(_decode(user, data).scram)
            creds[mechanism] = credential
            return _encode(creds)

        compare_and_set(self.client, user_path(user), change)

    def set_password(
        self, user: str, password: str, mechanisms: tuple[str, ...], iterations: int = DEFAULT_ITERATIONS
    ) -> None:
        """Create the user or change its password, for each mechanism given (and only those)."""
        for mechanism in mechanisms:
            self.upsert(user, mechanism, make_credential(mechanism, password, iterations))

    def delete(self, user: str, mechanisms: tuple[str, ...] | None = None) -> bool:
        """Remove the user's credentials for these mechanisms (None: all). False if it had none."""
        removed = False

        def change(data: bytes | None) -> bytes | None:
            nonlocal removed
            creds = dict(_decode(user, data).scram)
            gone = [m for m in creds if mechanisms is None or m in mechanisms]
            if not gone:
                return None
            removed = True
            for m in gone:
                del creds[m]
            return _encode(creds)

        compare_and_set(self.client, user_path(user), change)
        return removed


def own_credentials(password: str) -> dict[str, ScramCredential]:
    """A broker's credentials for its own inter-broker user, one per SCRAM mechanism, from the
    password in its configuration (each broker salts its own; derived once, at start)."""
    return {m: make_credential(m, password) for m in MECHANISMS}


def with_own_user(lookup: Lookup, user: str, credentials: Mapping[str, ScramCredential]) -> Lookup:
    """``lookup``, except that ``user`` (the brokers' own, ``inter.broker.sasl.username``) is
    checked against ``credentials`` (:func:`own_credentials`) and never read from ZooKeeper.

    Who may replicate is decided by who can authenticate as that user (replica_access): were its
    credential read from ``/config/users``, anyone able to write ZooKeeper (an open ensemble, the
    default) could mint a broker identity and fake a follower. A credential for the same name in
    ZooKeeper is ignored."""

    def credential(name: str, mechanism: str) -> ScramCredential | None:
        if name == user:
            return credentials.get(mechanism)
        return lookup(name, mechanism)

    return credential
