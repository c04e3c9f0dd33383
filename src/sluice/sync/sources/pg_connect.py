"""Connections to a PostgreSQL source (a plain session in the capture's fixed settings, the
server's own text of values) and its identifiers, for the capture (postgresql.py) and the
snapshot's Spark tasks (pg_snapshot.py)."""

from __future__ import annotations

from typing import Any

from sluice.security.secrets import reveal
from sluice.sync.sources.mysql_base import CaptureError
from sluice.sync.sources.pg_values import SESSION_OPTIONS
from sluice.sync.tasks import SourceSpec


def dsn(spec: SourceSpec, *, application: str = "sluice", settings: str = "") -> str:
    from psycopg2.extensions import make_dsn

    password = reveal(spec.password) if spec.password is not None else None
    return make_dsn(
        host=spec.host, port=spec.port, user=spec.user, dbname=spec.database, password=password,
        options=f"{SESSION_OPTIONS} {settings}".strip(), application_name=application, connect_timeout=15,
    )  # fmt: skip


def connect(spec: SourceSpec, *, application: str = "sluice") -> Any:
    import psycopg2

    try:
        conn = psycopg2.connect(dsn(spec, application=application))
    except psycopg2.OperationalError as exc:
        raise CaptureError(
            f"cannot connect to PostgreSQL at {spec.host}:{spec.port}: {str(exc).strip()}"
        ) from None
    conn.autocommit = True
    return conn


def text_cursor(conn: Any, name: str | None = None) -> Any:
    """A cursor whose values are the server's text output of them, as pgoutput sends them (not
    `col::text`: a few casts to text differ from the output function, e.g. boolean's `true` for
    `t`, inet's always-shown netmask, char(n)'s trimmed padding)."""
    import psycopg2.extensions as ext

    oids = getattr(conn, "_sluice_oids", None)
    if oids is None:
        with conn.cursor() as cur:
            cur.execute("SELECT oid FROM pg_type")
            oids = tuple(r[0] for r in cur.fetchall())
    cur = conn.cursor(name) if name else conn.cursor()
    ext.register_type(ext.new_type(oids, "SLUICE_TEXT", lambda value, _cur: value), cur)
    return cur


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
