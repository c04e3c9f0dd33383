"""Secret references: a task definition says where a secret is, never what it is.

A definition names a password as `{env: SHOP_DB_PASSWORD}` (an environment variable of the
worker that runs the task) or `{file: /run/secrets/shop}` (a file on the worker's host). The
definition, and so ZooKeeper, the API, the audit log and every status, holds only the reference;
the worker resolves it when it starts the task, into a `Secret`.

A `Secret` prints as `***` (str, repr, format): a log line or an f-string that quotes one by
accident shows `***`. `reveal()` is the one way to its value, called where a connection is made.
Every value resolved in this process is remembered (`revealed()`), so log handlers and error
texts can take it out of whatever a driver or a traceback quotes.

Definitions stored before references hold plain text; they are read as `SecretRef("plain", ...)`,
which prints as `***` too and resolves to its text (new definitions refuse plain text).
"""

from __future__ import annotations

import os
import re
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
        f"`{key}: {{env: SHOP_DB_PASSWORD}}` (an environment variable of the worker that runs the task) "
        f"or `{key}: {{file: /run/secrets/shop}}` (a file on the worker's host)"
    )


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
            field, f"{field}.env: must be an environment variable name such as SHOP_DB_PASSWORD"
        )
    if kind == "file" and not (isinstance(name, str) and name.startswith("/") and "\0" not in name):
        raise SecretRefError(field, f"{field}.file: must be an absolute path such as /run/secrets/shop")
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


def resolve(ref: SecretRef, *, task: str, field: str, environ: Mapping[str, str] | None = None) -> Secret:
    """The secret `ref` names, read here (on the worker that runs `task`), or SecretError naming
    the task, the field and the variable or file."""
    where = f"task {task}: {field}"
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
        value = _read_secret_file(Path(ref.name), where)
    if not value:
        raise SecretError(f"{where}: {ref} is empty on this worker: put the secret there")
    _remember(value)
    return Secret(value)


def _read_secret_file(path: Path, where: str) -> str:
    try:
        with path.open("rb") as f:
            data = f.read(SECRET_FILE_MAX_BYTES + 1)
    except OSError as exc:
        raise SecretError(
            f"{where} names the file {path}, which this worker cannot read ({exc.strerror}): put the "
            f"secret there, readable by the worker's user"
        ) from None
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
