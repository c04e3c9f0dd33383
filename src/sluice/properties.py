"""Configuration files in Java's ``.properties`` format, as Kafka's ``server.properties``.

A process (a broker, a sync worker) declares its settings as a table of :class:`Setting`: the
key a user writes, the field it fills and a parser. :func:`resolve` turns a file plus
command-line overrides into field values, and refuses, naming the key, every key the table
does not hold and every value its parser rejects, before the process touches anything. The
file format itself (comments, ``key=value`` or ``key: value``, escapes, continuation lines) is
``jproperties``'s.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jproperties import Properties

__all__ = [
    "ConfigError",
    "Setting",
    "boolean",
    "integer",
    "non_empty",
    "parse_overrides",
    "read_properties",
    "resolve",
]


class ConfigError(ValueError):
    """A configuration the process refuses to start with; the message names the key."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One key of a configuration file: the field it sets, its parser and what it means."""

    key: str
    attr: str
    parse: Callable[[str], Any]
    doc: str


def read_properties(path: Path) -> dict[str, str]:
    """The key/value pairs of a ``.properties`` file (a key given twice: the last line wins, as
    in Java and Kafka)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    props = Properties()
    try:
        props.load(raw, "utf-8")
    except Exception as exc:  # jproperties raises its own ParseError and UnicodeDecodeError
        raise ConfigError(f"config file {path} is not a valid properties file: {exc}") from None
    return {str(k): str(v.data) for k, v in props.items()}


def parse_overrides(items: Iterable[str], flag: str = "--override") -> dict[str, str]:
    """``key=value`` strings (a command line's repeated option) as a dict."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{flag} takes key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def layered(
    config_file: Path | None, flags: Mapping[str, object], overrides: Iterable[str] = ()
) -> dict[str, str]:
    """A process's keys: the file's, then the command line's flags that were given (None: not
    given), then ``--override key=value``s, each layer winning over the one before."""
    values = read_properties(config_file) if config_file is not None else {}
    values.update({k: str(v) for k, v in flags.items() if v is not None})
    values.update(parse_overrides(overrides))
    return values


def resolve(
    table: Iterable[Setting], values: Mapping[str, str], *, source: str, required: Iterable[str] = ()
) -> dict[str, Any]:
    """Field values for ``values`` (file and overrides merged, later winning) by ``table``.

    Raises ConfigError for a key not in the table, a value its parser refuses, or a required
    key that is missing; the message names the key and ``source`` (the file)."""
    by_key = {s.key: s for s in table}
    out: dict[str, Any] = {}
    for key, raw in values.items():
        setting = by_key.get(key)
        if setting is None:
            close = difflib.get_close_matches(key, by_key, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(sorted(by_key))}"
            raise ConfigError(f"{source}: unknown key {key!r}; {hint}")
        try:
            out[setting.attr] = setting.parse(raw)
        except ValueError as exc:
            raise ConfigError(f"{source}: bad value {raw!r} for {key!r}: {exc}") from None
    for key in required:
        if key not in values:
            raise ConfigError(f"{source}: {key!r} is required ({by_key[key].doc})")
    return out


# -- parsers: each raises ValueError saying what it expected -------------------------------------


def integer(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError("expected an integer") from None
        if lo is not None and value < lo:
            raise ValueError(f"must be >= {lo}")
        if hi is not None and value > hi:
            raise ValueError(f"must be <= {hi}")
        return value

    return parse


def boolean(raw: str) -> bool:
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise ValueError("expected true or false")
    return value == "true"


def non_empty(raw: str) -> str:
    value = raw.strip()
    if not value:
        raise ValueError("must not be empty")
    return value
