"""The configuration reference, docs/reference/configuration.md, written from the settings tables
the processes themselves read (:data:`~sluice.broker.config.BROKER_SETTINGS`,
:data:`~sluice.sync.worker_config.WORKER_SETTINGS`, :data:`~sluice.manager.config.MANAGER_SETTINGS`),
so the page cannot drift from the code: tests/unit/test_config_reference.py fails when the
committed page differs from :func:`page`. After changing a setting, write the page again:

    .venv/bin/python -m sluice.ops.config_reference docs/reference/configuration.md

A key's default is read from the field it fills in the process's configuration dataclass (or the
cleaner's and the topic log's settings it lands in); a key whose default is not a plain field
value (unset, or computed) shows none, and its description says what applies.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.broker.config import BROKER_REQUIRED, BROKER_SETTINGS, BrokerConfig
from sluice.broker.log_cleaner import CleanerSettings
from sluice.manager.config import MANAGER_REQUIRED, MANAGER_SETTINGS, ManagerConfig
from sluice.properties import Setting
from sluice.storage.config import LogConfig
from sluice.sync.worker_config import WORKER_REQUIRED, WORKER_SETTINGS, WorkerConfig

__all__ = ["page"]


@dataclass(frozen=True, slots=True)
class ConfigFile:
    """One process's configuration file: its settings table and the dataclass they fill."""

    title: str
    file: str
    command: str
    settings: tuple[Setting, ...]
    required: tuple[str, ...]
    config: type


FILES = (
    ConfigFile(
        "Broker",
        "broker.properties",
        "sluice broker start --config broker.properties [--override key=value ...]",
        BROKER_SETTINGS,
        BROKER_REQUIRED,
        BrokerConfig,
    ),
    ConfigFile(
        "Sync worker",
        "worker.properties",
        "sluice worker start --config worker.properties [--override key=value ...]",
        WORKER_SETTINGS,
        WORKER_REQUIRED,
        WorkerConfig,
    ),
    ConfigFile(
        "Manager",
        "manager.properties",
        "sluice manager start --config manager.properties [--override key=value ...]",
        MANAGER_SETTINGS,
        MANAGER_REQUIRED,
        ManagerConfig,
    ),
)

_NO_DEFAULT = object()


def _field_default(cls: type, name: str) -> Any:
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
    return _NO_DEFAULT


def default_of(setting: Setting, config: type) -> Any:
    """The value a process uses when its file leaves ``setting`` out, in the key's own unit;
    ``_NO_DEFAULT`` when that is not one field's default (the key is unset, or derived)."""
    if setting.attr == "_log_default":  # a broker default of a topic log setting
        topic_key = setting.doc.rsplit(" ", 1)[-1]
        return _field_default(LogConfig, topic_key.replace(".", "_"))
    if setting.attr.startswith("cleaner_"):
        return _field_default(CleanerSettings, setting.attr.removeprefix("cleaner_"))
    value = _field_default(config, setting.attr)
    if value is not _NO_DEFAULT:
        return value
    # the file's unit differs from the field's: `zookeeper.session.timeout.ms` fills `..._s`
    for suffix, scale in (("_ms", 1000), ("_minutes", 1 / 60)):
        stem = setting.attr.removesuffix(suffix)
        if stem != setting.attr:
            seconds = _field_default(config, stem + "_s")
            if isinstance(seconds, int | float) and not isinstance(seconds, bool):
                return round(seconds * scale)
            if suffix == "_minutes":
                ms = _field_default(config, stem + "_ms")
                if isinstance(ms, int) and not isinstance(ms, bool):
                    return ms // 60_000
    return _NO_DEFAULT


def _render(value: Any) -> str:
    if value is _NO_DEFAULT or value is None:
        return ""
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, tuple | list):
        value = ",".join(str(v) for v in value)
    elif isinstance(value, frozenset | set):
        value = ";".join(sorted(str(v) for v in value))
    elif isinstance(value, dict):
        value = ",".join(f"{k}:{v}" for k, v in value.items())
    text = str(value)
    return f"`{text}`" if text else "(empty)"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def table(file: ConfigFile) -> str:
    """The Markdown table of one file's keys: key, default (or *required*), meaning."""
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for s in file.settings:
        default = "*required*" if s.key in file.required else _render(default_of(s, file.config))
        lines.append(f"| `{s.key}` | {_cell(default)} | {_cell(s.doc)} |")
    return "\n".join(lines) + "\n"


def page() -> str:
    """The whole of docs/reference/configuration.md."""
    parts = [
        "# Configuration reference\n",
        "<!-- generated by sluice.ops.config_reference from the settings tables; do not edit by hand:\n"
        "     .venv/bin/python -m sluice.ops.config_reference docs/reference/configuration.md -->\n",
        "Brokers, sync workers and managers read Java `.properties` files with Kafka's key names where\n"
        "Kafka has them. Each process takes its file with `--config` and single keys with `--override\n"
        "key=value` (repeatable; a later layer wins). An unknown key or a bad value stops the process\n"
        "with one error naming it, before it touches its data, ZooKeeper or the brokers. Examples for\n"
        "three hosts are in `deploy/config/`. A default left blank means the key is unset unless its\n"
        "meaning says otherwise.\n",
    ]
    for file in FILES:
        parts.append(f"## {file.title}: `{file.file}`\n")
        parts.append(f"```sh\n{file.command}\n```\n")
        parts.append(table(file))
    return "\n".join(parts)


def main(argv: Sequence[str]) -> int:
    """With a path, write the page there; without, print it."""
    if argv:
        Path(argv[0]).write_text(page())
    else:
        sys.stdout.write(page())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
