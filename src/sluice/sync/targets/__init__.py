"""Targets: where change events are applied, one transaction per batch, exactly once in effect.

`open_target(url)` picks the implementation from the URL scheme: `sqlite:///path`,
`postgresql://user@host:port/db`, `mysql://user@host:port/db` (`mariadb://` too) or
`delta:///path/to/lake` (Delta tables written by Spark, `delta:<Hadoop URI>` too); a database
target's password comes apart from the URL, as a resolved `Secret` (security/secrets.py), or for
PostgreSQL from libpq's PGPASSWORD or ~/.pgpass.
"""

from __future__ import annotations

from typing import Any

from sluice.security.secrets import Secret
from sluice.sync.targets.base import (
    ApplyResult,
    BadTargetUrlError,
    StaleEpochError,
    Target,
)
from sluice.sync.targets.mapping import ColumnMapping


def open_target(
    url: str, mapping: ColumnMapping | None = None, *, password: Secret | None = None, **options: Any
) -> Target:
    """The target `url` names; `password` (a resolved Secret, or None) not for SQLite."""
    if url.startswith("sqlite://"):
        assert password is None, "a sqlite target has no password"
        from sluice.sync.targets.sqlite import SqliteTarget

        return SqliteTarget(url, mapping, **options)
    if url.startswith(("postgresql://", "postgres://")):
        from sluice.sync.targets.postgres import PostgresTarget

        return PostgresTarget(url, mapping, password=password, **options)
    if url.startswith("delta:"):
        from sluice.sync.targets.delta import DeltaTarget

        return DeltaTarget(url, mapping, password=password, **options)
    if url.startswith(("mysql://", "mariadb://")):
        from sluice.sync.targets.mysql import MySqlTarget

        return MySqlTarget(url, mapping, password=password, **options)
    raise BadTargetUrlError(
        f"unsupported target {url!r}: use sqlite:///path/to/file.db, postgresql://user@host:port/db "
        "mysql://user@host:port/db or delta:///path/to/lake"
    )


__all__ = ["ApplyResult", "BadTargetUrlError", "ColumnMapping", "StaleEpochError", "Target", "open_target"]
