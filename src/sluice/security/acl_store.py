"""ACLs in ZooKeeper, and the broker's cache of them, refreshed by a watch.

Layout (under the cluster's chroot):

    /acls/literal/{ResourceType}/{name}    {"version": 1, "acls": [{principal, host, operation, permission}]}
    /acls/prefixed/{ResourceType}/{name}   the same, for a PREFIXED pattern
    /acls/changes                          empty; its znode version counts ACL changes

``{ResourceType}`` is ``topic``, ``group``, ``cluster`` or ``transactional_id``; ``{name}`` is the
resource name percent-encoded (a group may be named ``a/b`` or ``..``). Every write of a
resource's ACLs is a compare-and-set on that resource's znode together with a touch of
``/acls/changes``, in one multi-op (``zkstore.compare_and_set_noted``): two operators adding ACLs
to one resource at once both keep theirs, and no change is made without the note.

A broker keeps every ACL in memory (:class:`AclCache`) and watches ``/acls/changes`` only, not
one znode per resource: on each new version it reads every ACL znode again (pipelined), which
is cheap because ACLs change rarely (an operator's command), and it cannot miss a change
however watch events coalesce, since it always reads everything written up to the version it
saw. After a lost session kazoo's watch fires again and the same comparison reloads."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, unquote

import orjson

from sluice.cluster.zkstore import ZkStore, compare_and_set_noted
from sluice.security.acl import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclSnapshot,
    Operation,
    PatternType,
    Permission,
    ResourcePattern,
    ResourceType,
    validate_binding,
)

log = logging.getLogger("sluice.acl")

ACLS = "/acls"
CHANGES = f"{ACLS}/changes"
_PATTERN_DIRS = {PatternType.LITERAL: "literal", PatternType.PREFIXED: "prefixed"}
#: The resource types an ACL can be stored for.
STORED_TYPES = (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID)


class AclError(ValueError):
    """A binding that cannot be stored; the message says why."""


def type_dir(pattern_type: PatternType, rtype: ResourceType) -> str:
    return f"{ACLS}/{_PATTERN_DIRS[pattern_type]}/{rtype.name.lower()}"


def encode_name(name: str) -> str:
    """A resource name as a znode name: percent-encoded, dots too (``.`` and ``..`` are not
    znode names)."""
    return quote(name, safe="").replace(".", "%2E")


def pattern_path(pattern: ResourcePattern) -> str:
    return f"{type_dir(pattern.pattern_type, pattern.type)}/{encode_name(pattern.name)}"


def encode_entries(entries: Iterable[AccessControlEntry]) -> bytes:
    acls = [
        {"principal": e.principal, "host": e.host, "operation": e.operation.name, "permission": p.name}
        for e in sorted(set(entries))
        for p in (e.permission,)
    ]
    return orjson.dumps({"version": 1, "acls": acls})


def decode_entries(data: bytes, what: str) -> list[AccessControlEntry]:
    try:
        obj = orjson.loads(data)
        return [
            AccessControlEntry(
                str(a["principal"]), str(a["host"]), Operation[a["operation"]], Permission[a["permission"]]
            )
            for a in obj["acls"]
        ]
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"znode {what} does not hold ACLs: {exc!r}") from None


class AclStore:
    """Reads and writes ACLs in ZooKeeper through one ``ZkStore`` session."""

    def __init__(self, store: ZkStore) -> None:
        self.store = store
        self._ready = False

    def _ensure_layout(self) -> None:
        if self._ready:
            return
        client = self.store.client
        for ptype in _PATTERN_DIRS:
            for rtype in STORED_TYPES:
                client.ensure_path(type_dir(ptype, rtype))
        client.ensure_path(CHANGES)
        self._ready = True

    def add(self, bindings: Iterable[AclBinding]) -> tuple[list[AclBinding], int]:
        """Store ``bindings``; returns those that were not stored yet and the change version
        after the writes (-1 when nothing changed). Raises AclError before writing anything
        when any binding is invalid."""
        wanted: dict[ResourcePattern, set[AccessControlEntry]] = {}
        for b in bindings:
            problem = validate_binding(b)
            if problem:
                raise AclError(f"{b.describe()}: {problem}")
            wanted.setdefault(b.pattern, set()).add(b.entry)
        self._ensure_layout()
        added: list[AclBinding] = []
        version = -1
        for pattern, entries in sorted(wanted.items()):
            new_entries, written = self._merge(pattern, entries)
            version = max(version, written)
            added.extend(AclBinding(pattern, e) for e in new_entries)
        return added, version

    def _merge(
        self, pattern: ResourcePattern, entries: set[AccessControlEntry]
    ) -> tuple[list[AccessControlEntry], int]:
        path = pattern_path(pattern)
        new_entries: list[AccessControlEntry] = []

        def merge(data: bytes | None) -> bytes | None:
            have = set(decode_entries(data, path)) if data is not None else set()
            new_entries[:] = sorted(entries - have)
            return encode_entries(have | entries) if new_entries else None

        _, written = compare_and_set_noted(self.store.client, path, merge, CHANGES)
        return new_entries, written

    def remove(self, filters: Iterable[AclBindingFilter]) -> tuple[list[AclBinding], int]:
        """Delete every stored binding matching any of ``filters``; returns the deleted ones and
        the change version after the writes (-1 when nothing changed)."""
        filters = list(filters)
        self._ensure_layout()
        patterns = {b.pattern for b in self.all() if any(f.matches(b) for f in filters)}
        removed: list[AclBinding] = []
        version = -1
        for pattern in sorted(patterns):
            gone, written = self._drop(pattern, filters)
            version = max(version, written)
            removed.extend(AclBinding(pattern, e) for e in gone)
        return removed, version

    def _drop(
        self, pattern: ResourcePattern, filters: list[AclBindingFilter]
    ) -> tuple[list[AccessControlEntry], int]:
        path = pattern_path(pattern)
        gone: list[AccessControlEntry] = []

        def drop(data: bytes | None) -> bytes | None:
            have = decode_entries(data, path) if data is not None else []
            gone[:] = [e for e in have if any(f.matches(AclBinding(pattern, e)) for f in filters)]
            if not gone:
                return None
            keep = [e for e in have if e not in gone]
            return encode_entries(keep) if keep else b""

        _, written = compare_and_set_noted(self.store.client, path, drop, CHANGES)
        return gone, written

    def all(self) -> list[AclBinding]:
        return list(self.load()[1].bindings())

    def list(self, flt: AclBindingFilter | None = None) -> list[AclBinding]:
        return [b for b in self.all() if flt is None or flt.matches(b)]

    def change_version(self) -> int:
        found = self.store.read(CHANGES)
        return int(found[1].version) if found is not None else -1

    def load(self) -> tuple[int, AclSnapshot]:
        """(change version, every ACL). The version is read first: a change made while the rest
        is read has a higher version, so its watch event reloads again."""
        version = self.change_version()
        paths: list[tuple[str, ResourcePattern]] = []
        for ptype in _PATTERN_DIRS:
            for rtype in STORED_TYPES:
                for child in self.store.children(type_dir(ptype, rtype)) or []:
                    paths.append(
                        (f"{type_dir(ptype, rtype)}/{child}", ResourcePattern(rtype, unquote(child), ptype))
                    )
        found = self.store.read_many(p for p, _ in paths)
        bindings: list[AclBinding] = []
        for path, pattern in paths:
            got = found.get(path)
            if got is None:
                continue
            try:
                bindings.extend(AclBinding(pattern, e) for e in decode_entries(got[0], path))
            except ValueError as exc:
                log.warning("event=bad_acl_znode path=%s error=%s", path, exc)
        return version, AclSnapshot(bindings)


class AclCache:
    """The broker's in-memory ACLs: loaded at start, reloaded when ``/acls/changes`` moves."""

    def __init__(self, store: AclStore) -> None:
        self.store = store
        self._snapshot = AclSnapshot()
        self._version = -2  # nothing loaded yet
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)

    def snapshot(self) -> AclSnapshot:
        """The ACLs as last loaded (any thread; a plain attribute read)."""
        return self._snapshot

    @property
    def version(self) -> int:
        return self._version

    def start(self) -> None:
        """Load every ACL, then follow changes (blocking; call off the event loop)."""
        self.store._ensure_layout()
        self._reload()
        self.store.store.watch_data(CHANGES, self._on_change)

    def _on_change(self, data: Any, stat: Any) -> None:  # kazoo's thread
        if stat is not None and int(stat.version) == self._version:
            return
        try:
            self._reload()
        except Exception as exc:  # the next change or session event tries again
            log.warning("event=acl_reload_failed error=%r", exc)

    def _reload(self) -> None:
        started = time.monotonic()
        version, snapshot = self.store.load()
        with self._lock:
            if version < self._version:
                return  # an older read finished after a newer one
            self._snapshot, self._version = snapshot, version
            self._changed.notify_all()
        log.info(
            "event=acls_loaded count=%d change_version=%d took_ms=%d",
            len(snapshot),
            version,
            (time.monotonic() - started) * 1000,
        )

    def wait_for(self, version: int, timeout_s: float) -> bool:
        """Wait (blocking) until the cache holds change ``version`` or later; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._version < version:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True
