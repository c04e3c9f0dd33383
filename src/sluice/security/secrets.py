"""Secret references: a task definition says where a secret is, never what it is.

A definition names a password as `{env: SLUICE_SECRET_SHOP_DB}` (an environment variable of the
worker that runs the task) or `{file: /etc/sluice/secrets/shop}` (a file on the worker's host). The
definition, and so ZooKeeper, the API, the audit log and every status, holds only the reference;
the worker resolves it when it starts the task, into a `Secret`.

A `Secret` prints as `***` (str, repr, format): a log line or an f-string that quotes one by
accident shows `***`. `reveal()` is the one way to its value, called where a connection is made.
Every value resolved in this process is remembered (`revealed()`), so log handlers and error
texts can take it out of whatever a driver or a traceback quotes.

Definitions stored before references hold plain text; they are read as `SecretRef("plain", ...)`,
which prints as `***` too and resolves to its text (new definitions refuse plain text).

A reference has a scope (`SecretScope`): `{file:}` names only a file under the secrets directory
(`secrets.dir`, default /etc/sluice/secrets) and `{env:}` only a variable whose name starts with
the secrets prefix (`secrets.env.prefix`, default SLUICE_SECRET_). Without it, whoever may define
a task could have the worker read any file or variable of its host (its ZooKeeper credential,
its own configuration) and send it to a server of their choosing as a password. The manager and
the CLI check the cluster's scope when a task is defined (`SecretScope.check`, lexically: the
files are on the workers' hosts); the worker checks its own again when it resolves, after
following symbolic links (`resolve`), so neither `..` nor a link leads out of the directory.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

SHOWN = "***"
KINDS = ("env", "file")
#: the kind of a plain-text secret read from a definition stored before references
PLAIN = "plain"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,254}$")
#: resolved values remembered for scrubbing; bounded (a long-lived worker resolves at every start,
#: but the same few values again and again)
REVEALED_MAX = 1024
#: a file holding a secret is a few bytes; anything larger is not one
SECRET_FILE_MAX_BYTES = 64 * 1024
#: the directory a `{file:}` reference must name a file under, unless configured otherwise: Sluice's
#: own, so that nothing else of the host (its credentials, /run/secrets of other services) is in it
DEFAULT_SECRETS_DIR = "/etc/sluice/secrets"
#: the prefix of the variables an `{env:}` reference may name, unless configured otherwise
DEFAULT_ENV_PREFIX = "SLUICE_SECRET_"
_ENV_PREFIX = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
#: how a reference out of scope is put right, for error messages
_SCOPE_HOW = (
    "the scope is the cluster's (`sluice task secret-scope` shows and sets it) and each worker's "
    "(secrets.dir, secrets.env.prefix in its configuration)"
)


class SecretRefError(ValueError):
    """A secret written wrongly in a definition; `field` names it (`task.source.password`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class SecretError(RuntimeError):
    """A reference the worker cannot resolve (the message names the task, the field and the
    variable or file, never a value)."""


@dataclass(frozen=True, slots=True, repr=False)
class SecretRef:
    """Where a secret is: `env` NAME or `file` PATH (or, read from an old definition, `plain`)."""

    kind: str
    name: str

    def __post_init__(self) -> None:
        assert self.kind in (*KINDS, PLAIN), self.kind

    def __repr__(self) -> str:
        return SHOWN if self.kind == PLAIN else f"{{{self.kind}: {self.name}}}"

    __str__ = __repr__

    def stored(self) -> Any:
        """The form kept in the definition: `{"env": NAME}`, or an old definition's text."""
        return self.name if self.kind == PLAIN else {self.kind: self.name}

    def shown(self) -> Any:
        """The form shown by the API and the CLI: the reference, or *** for plain text."""
        return SHOWN if self.kind == PLAIN else {self.kind: self.name}


class Secret:
    """A resolved secret. Prints as ***; `reveal()` gives the value to the code that connects.
    Pickles with its value (a Spark task that connects to the source needs it)."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return SHOWN

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return SHOWN

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (Secret, (self._value,))


def example(field: str) -> str:
    """How to write the secret of `field`, for error messages."""
    key = field.rsplit(".", 1)[-1]
    return (
        f"`{key}: {{env: {DEFAULT_ENV_PREFIX}SHOP_DB}}` (an environment variable of the worker that runs "
        f"the task) or `{key}: {{file: {DEFAULT_SECRETS_DIR}/shop}}` (a file on the worker's host)"
    )


def check_secrets_dir(raw: str) -> str:
    """A scope's directory: absolute, written plainly (no `.`, `..` or repeated `/`), not `/`.
    ValueError says what is wrong."""
    directory = raw.strip()
    if not directory.startswith("/") or "\0" in directory:
        raise ValueError(f"must be an absolute directory such as {DEFAULT_SECRETS_DIR}, not {raw!r}")
    directory = directory.rstrip("/") or "/"
    if posixpath.normpath(directory) != directory:
        raise ValueError(f"write it without '.', '..' or repeated '/', not {raw!r}")
    if directory == "/":
        raise ValueError("/ would let a task read every file of the worker's host: name a directory "
                         f"that holds the tasks' secrets only, such as {DEFAULT_SECRETS_DIR}")  # fmt: skip
    return directory


def check_env_prefix(raw: str) -> str:
    """A scope's variable prefix: the start of a variable name, at least 4 characters (a prefix
    such as `S` or `_` would let a task read nearly every variable)."""
    prefix = raw.strip()
    if not _ENV_PREFIX.match(prefix) or len(prefix) < 4:
        raise ValueError(
            f"must be the start of an environment variable name, 4 characters or more, such as "
            f"{DEFAULT_ENV_PREFIX}, not {raw!r}"
        )
    return prefix


@dataclass(frozen=True, slots=True)
class SecretScope:
    """What a secret reference may name: a file under `directory`, or an environment variable
    whose name starts with `env_prefix` (and has more after it)."""

    directory: str = DEFAULT_SECRETS_DIR
    env_prefix: str = DEFAULT_ENV_PREFIX

    def __post_init__(self) -> None:
        object.__setattr__(self, "directory", check_secrets_dir(self.directory))
        object.__setattr__(self, "env_prefix", check_env_prefix(self.env_prefix))

    def to_doc(self) -> dict[str, str]:
        return {"dir": self.directory, "env_prefix": self.env_prefix}

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> SecretScope:
        return cls(str(doc.get("dir", DEFAULT_SECRETS_DIR)), str(doc.get("env_prefix", DEFAULT_ENV_PREFIX)))

    def refusal(self, ref: SecretRef, field: str) -> SecretRefError | None:
        """Why `ref` (the reference of `field`) is out of this scope, naming the rule; None when
        it is in it. Lexical: where a path leads (links) is for the worker to check (`resolve`)."""
        if ref.kind == "env":
            if ref.name.startswith(self.env_prefix) and len(ref.name) > len(self.env_prefix):
                return None
            suggested = self.env_prefix + (
                ref.name if not ref.name.startswith(self.env_prefix) else "SHOP_DB"
            )
            return SecretRefError(
                field,
                f"{field}.env: {ref.name} does not start with {self.env_prefix}, the secrets prefix "
                f"(secrets.env.prefix), or has nothing after it: a task may read only the worker's variables "
                f"named {self.env_prefix}..., so that no task reads the rest of its environment; set the "
                f"secret for the worker as {suggested} and name it (`{{env: {suggested}}}`); {_SCOPE_HOW}",
            )
        if ref.kind == "file":
            if posixpath.normpath(ref.name) != ref.name:
                return SecretRefError(
                    field,
                    f"{field}.file: {ref.name} holds '.', '..' or a repeated '/': name the file plainly "
                    f"under {self.directory}, the secrets directory (secrets.dir), such as "
                    f"`{{file: {self.directory}/shop}}`",
                )
            if not ref.name.startswith(self.directory + "/"):
                return SecretRefError(
                    field,
                    f"{field}.file: {ref.name} is not under {self.directory}, the secrets directory "
                    f"(secrets.dir): a task may read only the files there, so that no task reads the rest "
                    f"of the worker's host (its credentials, its configuration); put the secret there and "
                    f"name it (`{{file: {self.directory}/shop}}`); {_SCOPE_HOW}",
                )
        return None

    def check(self, ref: SecretRef | None, field: str) -> None:
        """SecretRefError naming the rule unless `ref` is in this scope (or no reference, or the
        plain text of a definition stored before references, which names nothing)."""
        if ref is None:
            return
        refused = self.refusal(ref, field)
        if refused is not None:
            raise refused


#: the scope of a worker, and of a cluster, that sets none (secrets.dir, secrets.env.prefix unset)
DEFAULT_SCOPE = SecretScope()


def parse_ref(value: Any, field: str, *, stored: bool = False) -> SecretRef | None:
    """The reference a definition gives for `field`; None when it gives no secret (absent or "").
    Plain text is refused unless `stored` (a definition written before references)."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        if stored:
            return SecretRef(PLAIN, value)
        if value == SHOWN:
            raise SecretRefError(
                field,
                f"{field}: *** is how a password stored in plain text is shown, not a password: name "
                f"where the worker finds it instead, {example(field)}",
            )
        raise SecretRefError(
            field,
            f"{field}: a plain-text secret is refused (it would be stored in ZooKeeper and copied "
            f"into every backup of it): write {example(field)}",
        )
    if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in KINDS:
        raise SecretRefError(field, f"{field}: must be a secret reference, {example(field)}")
    kind, name = next(iter(value.items()))
    if kind == "env" and not (isinstance(name, str) and _ENV_NAME.match(name)):
        raise SecretRefError(
            field, f"{field}.env: must be an environment variable name such as {DEFAULT_ENV_PREFIX}SHOP_DB"
        )
    if kind == "file" and not (isinstance(name, str) and name.startswith("/") and "\0" not in name):
        raise SecretRefError(
            field, f"{field}.file: must be an absolute path such as {DEFAULT_SECRETS_DIR}/shop"
        )
    return SecretRef(kind, name)


_REVEALED: dict[str, None] = {}  # insertion-ordered, so the oldest go first past REVEALED_MAX
_LOCK = threading.Lock()


def _remember(value: str) -> None:
    with _LOCK:
        _REVEALED.pop(value, None)
        _REVEALED[value] = None
        while len(_REVEALED) > REVEALED_MAX:
            del _REVEALED[next(iter(_REVEALED))]


def revealed() -> frozenset[str]:
    """Every secret value resolved in this process (the newest REVEALED_MAX), to scrub from text."""
    with _LOCK:
        return frozenset(_REVEALED)


def resolve(
    ref: SecretRef,
    *,
    task: str,
    field: str,
    scope: SecretScope,
    environ: Mapping[str, str] | None = None,
) -> Secret:
    """The secret `ref` names, read here (on the worker that runs `task`), or SecretError naming
    the task, the field and the variable or file. A reference out of `scope` (this worker's) is
    refused naming the rule, whatever the definition was checked against when it was stored: a
    definition may be older than the scope, or written to ZooKeeper by other means."""
    where = f"task {task}: {field}"
    refused = scope.refusal(ref, field)
    if refused is not None:
        raise SecretError(f"task {task}: {refused}; nothing was read")
    if ref.kind == PLAIN:
        value = ref.name
    elif ref.kind == "env":
        env = os.environ if environ is None else environ
        found = env.get(ref.name)
        if found is None:
            raise SecretError(
                f"{where} names the environment variable {ref.name}, which is not set in this worker's "
                f"environment: set it for the worker process (e.g. an EnvironmentFile= of its systemd "
                f"unit) and restart the worker"
            )
        value = found
    else:
        value = _read_secret_file(Path(ref.name), scope, where)
    if not value:
        raise SecretError(f"{where}: {ref} is empty on this worker: put the secret there")
    _remember(value)
    return Secret(value)


def _inside(path: str, directory: str) -> bool:
    return path.startswith(directory.rstrip("/") + "/")


def _read_secret_file(path: Path, scope: SecretScope, where: str) -> str:
    """The file's text, once it is known to be a regular file under the scope's directory with
    every symbolic link followed: the path is resolved first, opened without following a last
    link, and the file opened is checked again (/proc/self/fd), so a link swapped in between
    cannot lead out either."""
    root = os.path.realpath(scope.directory)
    real = os.path.realpath(path)
    out_of_scope = SecretError(
        f"{where}: {path} leads out of {scope.directory}, the secrets directory (secrets.dir), through a "
        f"symbolic link: a task may read only the files there; put the secret itself in {scope.directory} "
        "(a link may point only to another file under it); nothing was read"
    )
    if not _inside(real, root):
        raise out_of_scope
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise SecretError(
            f"{where} names the file {path}, which this worker cannot read ({exc.strerror}): put the "
            f"secret there, readable by the worker's user"
        ) from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SecretError(f"{where}: {path} is not a regular file: it must hold the secret only")
        try:
            opened = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # no /proc (not Linux): the check above stands alone
            opened = real
        if not _inside(opened, root):
            raise out_of_scope
        data = f.read(SECRET_FILE_MAX_BYTES + 1)
    if len(data) > SECRET_FILE_MAX_BYTES:
        raise SecretError(
            f"{where}: {path} is over {SECRET_FILE_MAX_BYTES} bytes: it must hold the secret only"
        )
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise SecretError(f"{where}: {path} is not UTF-8 text") from None
    # One trailing line end is the file's, not the secret's (`echo pw > file` writes one).
    return text.removesuffix("\n").removesuffix("\r")


def reveal(value: Secret | SecretRef | None) -> str:
    """The text a driver connects with: a resolved secret's value, or "" for none. A reference
    not resolved yet is a bug (the worker resolves every one when it starts the task)."""
    if value is None:
        return ""
    if isinstance(value, Secret):
        return value.reveal()
    raise SecretError(f"the secret {value} was not resolved: resolve the task's secrets before connecting")


def resolved_only(value: Secret | SecretRef | None) -> Secret | None:
    """`value` if resolved (or None); a reference not resolved yet is a bug, as for `reveal`."""
    if value is not None and not isinstance(value, Secret):
        raise SecretError(f"the secret {value} was not resolved: resolve the task's secrets first")
    return value


def url_has_password(url: str) -> bool:
    """Whether a connection URL carries a password (`scheme://user:pw@host`, or `?password=`)."""
    try:
        parts = urlsplit(url)
        return parts.password is not None or "password" in parse_qs(parts.query)
    except ValueError:  # a URL too broken to split: the connection refuses it anyway
        return "@" in url.partition("://")[2].split("/", 1)[0]
