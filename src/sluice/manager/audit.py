"""The audit log: every change made through the manager, who made it, when, and the state
before and after. Kept in ZooKeeper (persistent sequential znodes under /manager/audit), so it
outlives any manager and every manager shows the same log. Bounded: past MAX_ENTRIES the oldest
are removed."""

from __future__ import annotations

import time
from typing import Any

import orjson

AUDIT = "/manager/audit"
MAX_ENTRIES = 10_000
_TRIM_EVERY = 100


class AuditLog:
    def __init__(self, client: Any) -> None:
        from kazoo.retry import KazooRetry

        self.zk = client
        self._retry = KazooRetry(max_tries=5, delay=0.1, max_delay=1.0, ignore_expire=True)
        self._call(self.zk.ensure_path, AUDIT)

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return self._retry.copy()(fn, *args, **kwargs)

    def record(self, user: str, action: str, target: str, before: Any = None, after: Any = None) -> str:
        entry = {"at": time.time(), "user": user, "action": action, "target": target,
                 "before": before, "after": after}  # fmt: skip
        path = self._call(self.zk.create, f"{AUDIT}/entry-", orjson.dumps(entry, default=str), sequence=True)
        if int(path.rsplit("-", 1)[1]) % _TRIM_EVERY == 0:
            self._trim()
        return str(path.rsplit("/", 1)[1])

    def _trim(self) -> None:
        from kazoo.exceptions import NoNodeError

        children = sorted(self._call(self.zk.get_children, AUDIT))
        for child in children[: max(0, len(children) - MAX_ENTRIES)]:
            try:
                self._call(self.zk.delete, f"{AUDIT}/{child}")
            except NoNodeError:
                pass

    def entries(self, limit: int = 200) -> list[dict[str, Any]]:
        from kazoo.exceptions import NoNodeError

        children = sorted(self._call(self.zk.get_children, AUDIT))[-max(1, limit) :]
        out = []
        for child in reversed(children):
            try:
                data, _ = self._call(self.zk.get, f"{AUDIT}/{child}")
            except NoNodeError:
                continue
            out.append({"id": child, **orjson.loads(data)})
        return out
