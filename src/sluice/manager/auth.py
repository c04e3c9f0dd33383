"""Users, roles and login tokens of the manager, kept in ZooKeeper so any manager accepts them.

ZooKeeper layout (under the cluster's chroot):

    /manager/users/{user}   {"user", "role", "password": "scrypt$n$r$p$salt$hash", "created"}
    /manager/token_key      32 random bytes: the HMAC key every manager signs and checks tokens with
    /manager/revoked_tokens/{expiry}-{token id}
                            a token ended by logout, until it would have expired anyway

A password is stored only as a salted scrypt hash (hashlib.scrypt, n=2**14, r=8, p=1). A token is
``base64url(claims).base64url(HMAC-SHA256(key, claims))`` with claims user, role, expiry, a
random token id and the user's znode version: changing a user's password or role, or deleting
the user, invalidates every token issued before, because each request checks the claims against
the user's znode; logout ends one token (`revoke_token`), on every manager.

A check costs the same whether the user exists or not: an unknown user's password is hashed
against a stored form of the same cost (`_UNKNOWN_USER_HASH`), so neither the answer nor its time
says who exists. At most `HASHING_MAX` scrypt computations (16 MiB each) run at once.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

import orjson

USERS = "/manager/users"
TOKEN_KEY = "/manager/token_key"
ROLES = ("viewer", "operator", "admin")
_USER = re.compile(r"^[A-Za-z0-9._@-]{1,64}$")
REVOKED = "/manager/revoked_tokens"
_SCRYPT_N, _SCRYPT_R, _SCRYPT_P = 2**14, 8, 1
MIN_PASSWORD = 8
#: scrypt computations at once (each takes 128 * r * n bytes, 16 MiB): a flood of logins from many
#: addresses queues here instead of taking the manager's memory
HASHING_MAX = 4
_HASHING = threading.BoundedSemaphore(HASHING_MAX)
#: What an unknown user's password is checked against: a stored form of the current cost whose
#: hash no password gives (all zeros), so the check fails after the same scrypt a known user costs.
_UNKNOWN_USER_HASH = (
    f"scrypt${_SCRYPT_N}${_SCRYPT_R}${_SCRYPT_P}${base64.b64encode(bytes(16)).decode()}$"
    f"{base64.b64encode(bytes(32)).decode()}"
)
_TOKEN_ID = re.compile(r"^[A-Za-z0-9_-]{16,64}$")


class AuthError(Exception):
    """Missing, wrong or expired credentials (401)."""


class UserError(ValueError):
    """A user or password the store refuses; the message names the field."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class Principal:
    user: str
    role: str

    def can(self, role: str) -> bool:
        return ROLES.index(self.role) >= ROLES.index(role)


def _scrypt(password: bytes, salt: bytes, n: int, r: int, p: int, dklen: int) -> bytes:
    with _HASHING:
        return hashlib.scrypt(password, salt=salt, n=n, r=r, p=p, dklen=dklen)


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    salt = salt if salt is not None else os.urandom(16)
    digest = _scrypt(password.encode(), salt, _SCRYPT_N, _SCRYPT_R, _SCRYPT_P, 32)
    b64 = base64.b64encode
    return f"scrypt${_SCRYPT_N}${_SCRYPT_R}${_SCRYPT_P}${b64(salt).decode()}${b64(digest).decode()}"


def check_password(password: str, stored: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        expected = base64.b64decode(digest)
        got = _scrypt(password.encode(), base64.b64decode(salt), int(n), int(r), int(p), len(expected))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(got, expected)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class UserStore:
    """Users in ZooKeeper (a kazoo client on the cluster's chroot)."""

    def __init__(self, client: Any) -> None:
        from kazoo.retry import KazooRetry

        self.zk = client
        self._retry = KazooRetry(max_tries=5, delay=0.1, max_delay=1.0, ignore_expire=True)
        self._call(self.zk.ensure_path, USERS)
        self._key: bytes | None = None

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return self._retry.copy()(fn, *args, **kwargs)

    # -- users --------------------------------------------------------------------------------
    @staticmethod
    def _validate(user: str, password: str | None, role: str | None) -> None:
        if not isinstance(user, str) or not _USER.match(user):
            raise UserError("user: 1-64 of letters, digits, '.', '_', '@' or '-'", "user")
        if password is not None and (not isinstance(password, str) or len(password) < MIN_PASSWORD):
            raise UserError(f"password: at least {MIN_PASSWORD} characters", "password")
        if role is not None and role not in ROLES:
            raise UserError(f"role: one of {', '.join(ROLES)}, not {role!r}", "role")

    def add(self, user: str, password: str, role: str) -> dict[str, Any]:
        from kazoo.exceptions import NodeExistsError

        self._validate(user, password, role)
        doc = {"user": user, "role": role, "password": hash_password(password), "created": time.time()}
        try:
            self._call(self.zk.create, f"{USERS}/{user}", orjson.dumps(doc))
        except NodeExistsError:
            raise UserError(f"user: {user!r} exists already", "user") from None
        return {"user": user, "role": role}

    def update(self, user: str, *, password: str | None = None, role: str | None = None) -> dict[str, Any]:
        from kazoo.exceptions import BadVersionError, NoNodeError

        self._validate(user, password, role)
        for _ in range(10):
            try:
                data, stat = self._call(self.zk.get, f"{USERS}/{user}")
            except NoNodeError:
                raise KeyError(user) from None
            doc = orjson.loads(data)
            if password is not None:
                doc["password"] = hash_password(password)
            if role is not None:
                doc["role"] = role
            try:
                self._call(self.zk.set, f"{USERS}/{user}", orjson.dumps(doc), version=stat.version)
                return {"user": user, "role": doc["role"]}
            except BadVersionError:
                continue
        raise RuntimeError(f"user {user!r} changed concurrently ten times; try again")

    def delete(self, user: str) -> None:
        from kazoo.exceptions import NoNodeError

        try:
            self._call(self.zk.delete, f"{USERS}/{user}")
        except NoNodeError:
            raise KeyError(user) from None

    def list(self) -> list[dict[str, Any]]:
        out = []
        for name in sorted(self._call(self.zk.get_children, USERS)):
            got = self._get(name)
            if got is not None:
                out.append({"user": name, "role": got[0]["role"]})
        return out

    def _get(self, user: str) -> tuple[dict[str, Any], int] | None:
        from kazoo.exceptions import NoNodeError

        if not isinstance(user, str) or not _USER.match(user):
            return None
        try:
            data, stat = self._call(self.zk.get, f"{USERS}/{user}")
        except NoNodeError:
            return None
        return orjson.loads(data), int(stat.version)

    def count(self) -> int:
        return len(self._call(self.zk.get_children, USERS))

    # -- credentials ---------------------------------------------------------------------------
    def authenticate(self, user: str, password: str) -> Principal:
        """The user, if `password` is theirs; AuthError otherwise, after the same work whether
        the user exists or not (an unknown user's password is hashed all the same)."""
        got = self._get(user)
        stored = got[0]["password"] if got is not None else _UNKNOWN_USER_HASH
        right = check_password(password if isinstance(password, str) else "", stored)
        if got is None or not isinstance(password, str) or not right:
            raise AuthError("wrong user name or password")
        return Principal(user, got[0]["role"])

    def _token_key(self) -> bytes:
        from kazoo.exceptions import NodeExistsError

        if self._key is None:
            try:
                self._call(self.zk.create, TOKEN_KEY, os.urandom(32), makepath=True)
            except NodeExistsError:
                pass
            self._key = bytes(self._call(self.zk.get, TOKEN_KEY)[0])
        return self._key

    def issue_token(self, principal: Principal, ttl_s: int) -> tuple[str, float]:
        got = self._get(principal.user)
        if got is None:
            raise AuthError("no such user")
        expires = time.time() + ttl_s
        claims = orjson.dumps(
            {
                "u": principal.user,
                "r": principal.role,
                "x": expires,
                "v": got[1],
                "j": secrets.token_urlsafe(16),
            }
        )
        sig = hmac.new(self._token_key(), claims, hashlib.sha256).digest()
        return f"{_b64(claims)}.{_b64(sig)}", expires

    def _claims(self, token: str) -> dict[str, Any]:
        """The claims of a token this cluster's managers signed, or AuthError."""
        try:
            body, sig = token.split(".", 1)
            claims_raw = _unb64(body)
            good = hmac.new(self._token_key(), claims_raw, hashlib.sha256).digest()
            if not hmac.compare_digest(good, _unb64(sig)):
                raise AuthError("invalid token")
            claims = orjson.loads(claims_raw)
        except (ValueError, orjson.JSONDecodeError):
            raise AuthError("invalid token") from None
        if not isinstance(claims, dict) or not _TOKEN_ID.match(str(claims.get("j", ""))):
            # signed by a manager from before logout (no token id): it could not be ended
            raise AuthError("token from an older manager: log in again")
        result: dict[str, Any] = claims
        return result

    @staticmethod
    def _revoked_path(claims: dict[str, Any]) -> str:
        return f"{REVOKED}/{int(float(claims['x']))}-{claims['j']}"

    def check_token(self, token: str) -> Principal:
        claims = self._claims(token)
        if float(claims["x"]) < time.time():
            raise AuthError("token expired: log in again")
        got = self._get(claims["u"])
        if got is None or got[1] != claims["v"] or got[0]["role"] != claims["r"]:
            raise AuthError("token no longer valid (the user was changed or removed): log in again")
        if self._call(self.zk.exists, self._revoked_path(claims)):
            raise AuthError("token no longer valid (logged out): log in again")
        return Principal(claims["u"], claims["r"])

    def revoke_token(self, token: str) -> Principal:
        """End `token` (logout) on every manager: its id is kept in ZooKeeper until it would
        have expired anyway, when the next logout removes it. AuthError if it is not valid."""
        from kazoo.exceptions import NodeExistsError, NoNodeError

        who = self.check_token(token)
        claims = self._claims(token)
        try:
            self._call(self.zk.create, self._revoked_path(claims), b"", makepath=True)
        except NodeExistsError:  # a second logout of the same token, at the same moment
            pass
        now = time.time()
        for name in self._call(self.zk.get_children, REVOKED):
            expiry, _, _ = name.partition("-")
            if expiry.isdigit() and int(expiry) + 1 < now:
                try:
                    self._call(self.zk.delete, f"{REVOKED}/{name}")
                except NoNodeError:  # another manager removed it
                    pass
        return who
