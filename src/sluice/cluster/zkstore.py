"""Access to a Sluice cluster's state in ZooKeeper (kazoo), used by brokers, the controller
and the CLI. Reads return decoded records from ``cluster.layout``; writes that change cluster
state on behalf of the controller go through :meth:`ZkStore.commit_fenced`.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from kazoo.client import KazooClient, TransactionRequest
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState, ZnodeStat
from kazoo.security import ACL, Permissions, make_acl, make_digest_acl

from sluice import properties as props
from sluice import test_switches
from sluice.bounded import in_background
from sluice.cluster import layout
from sluice.cluster.layout import (
    BrokerRegistration,
    PartitionState,
    ProducerIdBlock,
    StateChanges,
    StateWrite,
    TopicAssignment,
)

log = logging.getLogger(__name__)

DEFAULT_CHROOT = "/sluice"
PRODUCER_ID_BLOCK_SIZE = 1000
#: A ZkStore's session timeout unless it is given one (a broker's is zookeeper.session.timeout.ms;
#: a worker's and the CLI's are this).
SESSION_TIMEOUT_S = 6.0
#: A stopping process waits at least this long for its session's close, even once the ZooKeeper
#: share of its stop is spent (:meth:`ZkStore.stop_by`).
ZOOKEEPER_CLOSE_MIN_S = 1.0

#: What a call raises when ZooKeeper does not answer: the connection dropped with the call in
#: flight (its outcome unknown), the session expired or was closed (ConnectionClosedError is a
#: SessionExpiredError), or a bounded wait ran out. Expected whenever ZooKeeper goes away, so a
#: caller logs one line for it, never a traceback.
ZOOKEEPER_UNREACHABLE: tuple[type[Exception], ...] = (ConnectionLoss, SessionExpiredError, KazooTimeoutError)


#: Znodes no one but Sluice's own processes may read, once ACLs are on: SCRAM credentials,
#: sync task definitions (they hold database passwords), the manager's users and token key,
#: Kafka ACLs, and the brokers' key for unknown users' SCRAM challenges. Every other znode is
#: world-readable (as Kafka's ``zookeeper.set.acl=true`` does), and only Sluice's digest user may
#: change anything.
SENSITIVE_PATHS = ("/config/users", "/tasks", "/manager", "/acls", "/security")


def is_sensitive(path: str) -> bool:
    """True for a path (relative to the chroot) at or under one of :data:`SENSITIVE_PATHS`."""
    return any(path == p or path.startswith(p + "/") for p in SENSITIVE_PATHS)


@dataclass(frozen=True, slots=True)
class ZkAuth:
    """The ZooKeeper digest credentials of Sluice's processes (brokers, workers, the manager and
    the CLI all use the same user). ``set_acl`` (Kafka's ``zookeeper.set.acl``): znodes this
    client creates get ACLs (:meth:`acl_for`); without it, it only authenticates, which is how a
    cluster created without ACLs is moved to them."""

    username: str
    password: str = field(repr=False)
    set_acl: bool = True
    _own: list[ACL] = field(init=False, repr=False, compare=False)
    _shared: list[ACL] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.username or ":" in self.username:
            raise ValueError("zookeeper.auth.username must be non-empty and hold no ':'")
        if not self.password:
            raise ValueError("zookeeper.auth.password must not be empty")
        own = make_digest_acl(self.username, self.password, all=True)
        object.__setattr__(self, "_own", [own])
        object.__setattr__(self, "_shared", [own, make_acl("world", "anyone", read=True)])

    @property
    def auth_data(self) -> list[tuple[str, str]]:
        """kazoo's ``auth_data``: sent on every (re)connection of the session."""
        return [("digest", f"{self.username}:{self.password}")]

    def acl_for(self, path: str) -> list[ACL]:
        """The ACL of a znode created at ``path`` (relative to the chroot): only this user for a
        sensitive one, this user and world READ for the rest. The same list objects each time
        (:class:`_AclClient` recognises them)."""
        return self._own if is_sensitive(path) else self._shared

    def properties(self) -> dict[str, str]:
        """The keys of a configuration file that give these credentials."""
        return {
            "zookeeper.set.acl": "true" if self.set_acl else "false",
            "zookeeper.auth.username": self.username,
            "zookeeper.auth.password": self.password,
        }


def _auth_file(raw: str) -> Path:
    return Path(props.non_empty(raw)).expanduser()


#: The ZooKeeper authentication keys of the broker, worker and manager configurations.
ZK_AUTH_SETTINGS: tuple[props.Setting, ...] = (
    props.Setting(
        "zookeeper.set.acl", "zk_set_acl", props.boolean, "create znodes with ACLs (needs zookeeper.auth.*)"
    ),
    props.Setting("zookeeper.auth.username", "zk_auth_username", props.non_empty, "ZooKeeper digest user"),
    props.Setting("zookeeper.auth.password", "zk_auth_password", props.non_empty, "its password"),
    props.Setting(
        "zookeeper.auth.file",
        "zk_auth_file",
        _auth_file,
        "a properties file holding zookeeper.auth.username and .password (and zookeeper.set.acl)",
    ),
)


def zk_auth_from_fields(fields: dict[str, Any]) -> ZkAuth | None:
    """Pop the fields of :data:`ZK_AUTH_SETTINGS` from a resolved configuration and return the
    credentials they give (None: connect without any, as before). ValueError names what is
    missing; the password is never part of a message."""
    set_acl = fields.pop("zk_set_acl", None)
    username = fields.pop("zk_auth_username", None)
    password = fields.pop("zk_auth_password", None)
    path = fields.pop("zk_auth_file", None)
    if path is not None:
        from_file = load_zk_auth_file(path)
        username, password = username or from_file.username, password or from_file.password
        set_acl = from_file.set_acl if set_acl is None else set_acl
    if username is None and password is None:
        if set_acl:
            raise ValueError(
                "zookeeper.set.acl=true needs zookeeper.auth.username and zookeeper.auth.password"
            )
        return None
    if username is None or password is None:
        raise ValueError("zookeeper.auth.username and zookeeper.auth.password go together")
    return ZkAuth(username, password, set_acl=True if set_acl is None else set_acl)


def pop_zk_auth(fields: dict[str, Any], source: str) -> ZkAuth | None:
    """:func:`zk_auth_from_fields` for a process's configuration: a ConfigError naming ``source``."""
    try:
        return zk_auth_from_fields(fields)
    except ValueError as exc:
        raise props.ConfigError(f"{source}: {exc}") from None


def load_zk_auth_file(path: Path) -> ZkAuth:
    """Credentials from a properties file (``zookeeper.auth.file``, ``$SLUICE_ZOOKEEPER_AUTH_FILE``)."""
    values = props.read_properties(path)
    fields = props.resolve(
        [s for s in ZK_AUTH_SETTINGS if s.key != "zookeeper.auth.file"], values, source=str(path)
    )
    auth = zk_auth_from_fields(fields)
    if auth is None:
        raise props.ConfigError(f"{path}: names no zookeeper.auth.username and zookeeper.auth.password")
    return auth


class _AclTransaction(TransactionRequest):
    def create(
        self, path: str, value: bytes = b"", acl: Any = None, ephemeral: bool = False, sequence: bool = False
    ) -> None:
        client = self.client
        assert isinstance(client, _AclClient)
        super().create(path, value, client._policy_acl(path, acl), ephemeral, sequence)


class _AclClient(KazooClient):
    """A kazoo client whose creates (plain, ``makepath`` parents, ``ensure_path``, multi-ops)
    give each znode the ACL its path calls for (:meth:`ZkAuth.acl_for`) unless the caller names
    one. kazoo's ``default_acl`` alone is one ACL for every path."""

    def __init__(self, auth: ZkAuth, **kwargs: Any) -> None:
        self._zk_auth = auth
        self._policy_acls = (auth.acl_for("/"), auth.acl_for(SENSITIVE_PATHS[0]))
        super().__init__(default_acl=self._policy_acls[0], auth_data=auth.auth_data, **kwargs)

    def _policy_acl(self, path: str, acl: Any) -> Any:
        # kazoo passes default_acl, or for makepath parents the child's ACL, down as `acl`: any
        # of our own lists means "the policy's", so each parent gets its own path's ACL.
        if acl is None or any(acl is p for p in self._policy_acls):
            return self._zk_auth.acl_for(path)
        return acl

    def create_async(self, path: str, value: bytes = b"", acl: Any = None, *args: Any, **kwargs: Any) -> Any:
        return super().create_async(path, value, self._policy_acl(path, acl), *args, **kwargs)

    def transaction(self) -> TransactionRequest:
        return _AclTransaction(self)


def make_client(
    address: str,
    *,
    auth: ZkAuth | None,
    session_timeout_s: float = 10.0,
    connection_retry: dict[str, Any] | None = None,
) -> KazooClient:
    """The one way Sluice makes a kazoo client (not started): on ``host:port[,...][/chroot]``,
    authenticated with ``auth``'s digest and creating znodes with its ACLs when it has any;
    ``auth=None`` is a client without credentials (a cluster without ACLs)."""
    kwargs: dict[str, Any] = {"hosts": address, "timeout": session_timeout_s}
    if connection_retry is not None:
        kwargs["connection_retry"] = connection_retry
    if auth is None:
        return KazooClient(**kwargs)
    if not auth.set_acl:
        return KazooClient(auth_data=auth.auth_data, **kwargs)
    return _AclClient(auth, **kwargs)


def connect(
    address: str,
    *,
    auth: ZkAuth | None,
    session_timeout_s: float = 10.0,
    connect_timeout_s: float = 15.0,
) -> KazooClient:
    """:func:`make_client`, started; ConnectionError says ZooKeeper cannot be reached."""
    client = make_client(address, auth=auth, session_timeout_s=session_timeout_s)
    try:
        client.start(timeout=connect_timeout_s)
    except Exception as exc:
        client.close()
        raise ConnectionError(
            f"cannot reach ZooKeeper at {address}: {exc}; is it running? "
            "(`sluice cluster up` starts a local one)"
        ) from exc
    return client


def close(client: KazooClient) -> None:
    """Stop and close a client from :func:`connect`."""
    try:
        client.stop()
    finally:
        client.close()


class ChrootAclError(ValueError):
    """The cluster's chroot exists with an ACL that is not the cluster's own."""


_PERM_LETTERS = (("c", Permissions.CREATE), ("d", Permissions.DELETE), ("r", Permissions.READ),
                 ("w", Permissions.WRITE), ("a", Permissions.ADMIN))  # fmt: skip
#: what a process needs on the chroot to create, change and delete the cluster's znodes in it
_NEEDED = Permissions.READ | Permissions.WRITE | Permissions.CREATE | Permissions.DELETE


def _shown(acl: ACL) -> str:
    """An ACL entry as zkCli shows it (``world:anyone:cdrwa``); a digest's hash left out."""
    ident = acl.id.id.split(":")[0] if acl.id.scheme == "digest" else acl.id.id
    return f"{acl.id.scheme}:{ident}:{''.join(c for c, p in _PERM_LETTERS if acl.perms & p)}"


def chroot_acl_problem(acls: Iterable[ACL], auth: ZkAuth | None) -> str | None:
    """Why a chroot with ACL ``acls`` is not the cluster's own, for processes with ``auth``; None
    when it is. With ACLs on (``auth.set_acl``) nobody but ``auth``'s digest user may do more than
    read it, or anyone could add znodes beside the cluster's (a task, an ACL, a user) and read
    them back; in every case this process must be able to create, change and delete in it."""
    acls = list(acls)
    ours = [
        a for a in acls if auth is not None and a.id.scheme == "digest" and a.id == auth.acl_for("/")[0].id
    ]
    everyone = [a for a in acls if a.id.scheme == "world" and a.id.id == "anyone"]
    granted = 0
    for a in ours + everyone:
        granted |= a.perms
    if granted & _NEEDED != _NEEDED:
        who = (
            f"zookeeper.auth.username={auth.username}"
            if auth is not None
            else "a process without credentials"
        )
        return f"{who} cannot create, change and delete znodes in it"
    if auth is not None and auth.set_acl:
        others = [a for a in acls if a not in ours and a.perms & ~Permissions.READ]
        if others:
            return (f"{', '.join(_shown(a) for a in others)} may change it, not only "
                    f"zookeeper.auth.username={auth.username}")  # fmt: skip
    return None


def ensure_chroot(zookeeper: str, *, auth: ZkAuth | None, connect_timeout_s: float = 15.0) -> None:
    """Create the cluster's chroot (with ``auth``'s ACL: world READ, writable by Sluice only),
    so that chrooted sessions can use it; ChrootAclError if it exists with an ACL that is not
    this cluster's (`chroot_acl_problem`: someone else created it first), before anything is
    written into it."""
    hosts, chroot = split_zookeeper_address(zookeeper)
    root = connect(hosts, auth=auth, connect_timeout_s=connect_timeout_s)
    try:
        root.ensure_path(chroot)
        try:
            acls, _ = root.get_acls(chroot)
        except NoAuthError:  # ZooKeeper shows an ACL only to who may read the znode or administer it
            acls = []
    finally:
        close(root)
    problem = chroot_acl_problem(acls, auth)
    if problem is not None:
        shown = ",".join(_shown(a) for a in acls) or "not shown to this process"
        raise ChrootAclError(
            f"ZooKeeper chroot {chroot} is not this cluster's: its ACL is {shown}, and {problem}. Someone "
            f"else created it, or it was made without ACLs; nothing was written into it. Use a chroot of "
            f"your own (zookeeper.connect={hosts}/another), or, if {chroot} and everything under it are "
            f"this cluster's, give it the cluster's ACL (zkCli.sh: addauth digest USER:PASSWORD, then "
            f"setAcl {chroot} auth::cdrwa,world:anyone:r)"
        )


class BrokerIdInUseError(RuntimeError):
    """Another live broker already registered this id."""


class TopicExistsError(ValueError):
    pass


class ControllerDeposedError(RuntimeError):
    """A fenced write failed its controller-epoch check: someone else is controller now."""


class ZnodeContentionError(RuntimeError):
    """A compare-and-set lost to other writers more times than its bound allows."""


def registered_broker(client: KazooClient, broker_id: int) -> layout.BrokerRegistration | None:
    """The registration at ``/brokers/ids/{broker_id}`` on ``client``'s chroot, None when absent
    (a launcher's readiness check: it names the pid of the broker that wrote it)."""
    try:
        data, _ = client.get(layout.broker_path(broker_id))
    except NoNodeError:
        return None
    return layout.BrokerRegistration.decode(broker_id, data)


def compare_and_set(
    client: KazooClient,
    path: str,
    change: Callable[[bytes | None], bytes | None],
    *,
    ephemeral: bool = False,
    max_tries: int = 100,
    makepath: bool = True,
) -> tuple[bytes | None, int]:
    """The one compare-and-set recipe: read `path` (None when absent), ask `change` for the new
    data (None: leave it as it is), write it conditionally on the version read (or create it),
    and on a conflict read again, at most `max_tries` times. Returns what is stored afterwards
    and its znode version (-1 when absent). ``makepath=False`` creates `path` only under a
    parent that exists, and raises NoNodeError when it is gone (a task's status must never bring
    a deleted task back as an empty znode).

    Counters (fencing epochs, producer-id blocks), control records and status records all use
    it, so a writer that read an old version can never overwrite a newer one."""
    for _ in range(max_tries):
        try:
            current, stat = client.get(path)
        except NoNodeError:
            current, stat = None, None
        new = change(current)
        if new is None:
            return current, (int(stat.version) if stat is not None else -1)
        try:
            if stat is None:
                client.create(path, new, ephemeral=ephemeral, makepath=makepath)
                return new, 0
            written = client.set(path, new, version=stat.version)
            return new, int(written.version)
        except NoNodeError:
            if stat is None and not makepath:
                raise  # the parent is gone
            continue
        except (BadVersionError, NodeExistsError):
            continue
    raise ZnodeContentionError(f"{path}: gave up after {max_tries} conflicting writes")


def update_znode(
    client: KazooClient,
    path: str,
    change: Callable[[bytes | None], bytes | None],
    *,
    ephemeral: bool = False,
    max_tries: int = 100,
    makepath: bool = True,
) -> bytes | None:
    """:func:`compare_and_set`, returning only what is stored afterwards."""
    stored, _ = compare_and_set(
        client, path, change, ephemeral=ephemeral, max_tries=max_tries, makepath=makepath
    )
    return stored


def compare_and_set_noted(
    client: KazooClient,
    path: str,
    change: Callable[[bytes | None], bytes | None],
    note_path: str,
    *,
    max_tries: int = 100,
) -> tuple[bytes | None, int]:
    """:func:`compare_and_set` for a family of znodes that readers follow through one note znode
    (ACLs: a reader watches ``note_path`` instead of every znode of the family). The write and a
    touch of ``note_path`` go in one multi-op, so no change can be made without its note, and a
    reader that loaded everything after seeing the note's version N has every change up to N.

    ``change`` returns the new data, None to leave the znode as it is, or ``b""`` to delete it.
    ``path``'s parent and ``note_path`` must exist. Returns what is stored afterwards (None when
    absent) and the note's znode version after the write (-1 when nothing was written)."""
    for _ in range(max_tries):
        try:
            current, stat = client.get(path)
        except NoNodeError:
            current, stat = None, None
        new = change(current)
        if new is None or (new == b"" and stat is None):
            return current, -1
        txn = client.transaction()
        if stat is None:
            txn.create(path, new)
        elif new == b"":
            txn.delete(path, version=stat.version)
        else:
            txn.set_data(path, new, version=stat.version)
        txn.set_data(note_path, b"")
        results = txn.commit()
        if not any(isinstance(r, Exception) for r in results):
            return (new or None), int(results[-1].version)
        if isinstance(results[0], (BadVersionError, NodeExistsError, NoNodeError)):
            continue
        raise next(r for r in results if isinstance(r, Exception) and type(r).__name__ != "RolledBackError")
    raise ZnodeContentionError(f"{path}: gave up after {max_tries} conflicting writes")


class FencingCounter:
    """A counter znode that only grows, taken by compare-and-set: the controller epoch and each
    task's epoch. Taking the next value also returns the znode version, which a holder's later
    writes check (a multi-op's version check) to prove it still holds the newest value."""

    def __init__(self, client: KazooClient, path: str, *, max_tries: int = 1000):
        self.client = client
        self.path = path
        self.max_tries = max_tries

    def take(self, at_least: int = 0) -> tuple[int, int]:
        """One more than both the stored value and `at_least`: (value, znode version)."""

        def bump(data: bytes | None) -> bytes:
            return layout.encode_int(max(layout.decode_int(data or b"0", self.path), at_least) + 1)

        data, version = compare_and_set(self.client, self.path, bump, max_tries=self.max_tries)
        assert data is not None
        return layout.decode_int(data, self.path), version

    def current(self) -> tuple[int, int]:
        """(value, znode version); (0, -1) when it was never taken."""
        try:
            data, stat = self.client.get(self.path)
        except NoNodeError:
            return 0, -1
        return layout.decode_int(data, self.path), int(stat.version)


def parse_zookeeper_connect(raw: str) -> str:
    """A checked ``zookeeper.connect`` value, with the chroot made explicit; ValueError names
    the part that is not ``host:port``."""
    hosts, chroot = split_zookeeper_address(raw.strip())
    host_ports(hosts)
    return f"{hosts}{chroot}"


def host_ports(raw: str) -> str:
    """Check a ``host:port[,host:port...]`` list (a connect string or bootstrap.servers)."""
    for hp in raw.split(","):
        host, colon, port = hp.strip().rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{hp!r} is not host:port (expected host:port[,host:port...])")
    return raw.strip()


def split_zookeeper_address(address: str) -> tuple[str, str]:
    """``host:port[,host:port]/chroot`` -> (hosts, chroot). The chroot defaults to /sluice."""
    if "/" in address:
        hosts, _, chroot = address.partition("/")
        chroot = "/" + chroot.strip("/")
    else:
        hosts, chroot = address, DEFAULT_CHROOT
    if not hosts:
        raise ValueError(f"ZooKeeper address {address!r} names no host:port")
    return hosts, chroot


@dataclass(frozen=True, slots=True)
class ControllerTerm:
    """The controller epoch a broker won and the version of ``/controller_epoch`` it wrote: every
    fenced write checks that version (``commit_fenced``)."""

    epoch: int
    epoch_zk_version: int


@dataclass(frozen=True, slots=True)
class FencedOp:
    """One operation of a controller's fenced multi-op."""

    kind: str  # "create" | "set" | "delete"
    path: str
    data: bytes = b""
    version: int = -1
    sequence: bool = False


#: reads in flight at once in :meth:`ZkStore.read_many`
READ_WINDOW = 1000


@dataclass(slots=True)
class ChunkResult:
    """How one multi-op of :meth:`ZkStore.commit_fenced_many` ended."""

    writes: list[StateWrite]
    error: Exception | None = None
    notice: str | None = None


class ZkStore:
    """A kazoo session on the cluster's chroot."""

    def __init__(
        self,
        address: str,
        *,
        session_timeout_s: float = SESSION_TIMEOUT_S,
        connect_timeout_s: float = 15.0,
        switches: test_switches.Switches = test_switches.OFF,
        auth: ZkAuth | None = None,
    ):
        hosts, chroot = split_zookeeper_address(address)
        self.session_timeout_s = session_timeout_s
        self.address = f"{hosts}{chroot}"
        self.hosts = hosts
        self.chroot = chroot
        self._connect_timeout_s = connect_timeout_s
        self._epoch_fence_disabled = switches.disable_epoch_fence
        self.auth = auth
        self.client = make_client(
            self.address,
            auth=auth,
            session_timeout_s=session_timeout_s,
            connection_retry={"max_tries": -1, "max_delay": 1},
        )
        self._close_lock = threading.Lock()
        #: set once the session's close (:meth:`stop`) has ended; None until one began
        self._closed: threading.Event | None = None

    # -- session -----------------------------------------------------------------------------

    def start(self) -> None:
        # The chroot must exist before a chrooted session can use it.
        ensure_chroot(self.address, auth=self.auth, connect_timeout_s=self._connect_timeout_s)
        self.client.start(timeout=self._connect_timeout_s)
        for path in layout.PERSISTENT_PATHS:
            self.client.ensure_path(path)

    def stop(self, timeout_s: float | None = None) -> bool:
        """Close the session (its ephemeral znodes go at once while ZooKeeper answers). With
        ``timeout_s``, wait at most that long, and return whether the close finished: kazoo's
        stop waits for its connection thread, which may be in a connection attempt to a server
        that does not answer. The close runs once, on a daemon thread, so a close left running
        never keeps the process, and a later call waits for the same close. Calls still waiting
        on ZooKeeper end (ConnectionLoss) once the close is done, and later ones fail at once
        (ConnectionClosedError)."""
        with self._close_lock:
            if self._closed is None:
                self._closed = in_background(self._close, name="zookeeper-close")
            closed = self._closed
        return closed.wait(timeout_s)

    def _close(self) -> None:
        try:
            self.client.stop()
            self.client.close()
        except Exception as exc:  # the session is gone either way: this process is leaving
            log.warning("event=zookeeper_close_failed error=%r", exc)

    def stop_by(self, deadline: float) -> bool:
        """:meth:`stop`, waiting until ``deadline`` (``time.monotonic()``), and at least
        ZOOKEEPER_CLOSE_MIN_S: the end of a stop's ZooKeeper share. A close not finished by then
        is logged and left to finish on its thread: the process may exit, and ZooKeeper expires
        the session (its ephemeral znodes go then)."""
        waited_s = max(ZOOKEEPER_CLOSE_MIN_S, deadline - time.monotonic())
        if self.stop(waited_s):
            return True
        log.warning(
            "event=zookeeper_close_timed_out zookeeper=%s waited_s=%.1f action=%r",
            self.address, waited_s, "exiting; the session expires on ZooKeeper's side",
        )  # fmt: skip
        return False

    def close_when_unreachable(self, on_close: Callable[[], None] | None = None) -> None:
        """For a process that is stopping: close the session now if ZooKeeper is unreachable,
        else as soon as it becomes so (a dropped connection); ``on_close`` is called once then,
        on whichever thread noticed (kazoo's event thread, or the caller's). While ZooKeeper
        answers, nothing changes.

        kazoo holds a call made while it reconnects until the connection is back, and this
        session retries the connection forever, so without ZooKeeper a call waits for good,
        whichever thread made it. The close (:meth:`stop`, not waited for here) ends every call
        waiting on the session and fails every later one at once, so no thread of a stop waits
        on a ZooKeeper that is gone; the session's ephemeral znodes go when ZooKeeper expires
        it."""
        once = threading.Lock()

        def close() -> None:
            if not once.acquire(blocking=False):
                return
            self.stop(timeout_s=0)
            if on_close is not None:
                on_close()

        def on_state(state: KazooState) -> bool:
            if state == KazooState.CONNECTED:
                return False
            close()
            return True  # (kazoo then removes the listener)

        self.client.add_listener(on_state)
        if not self.connected:  # after adding the listener: a drop in between is seen by one of the two
            close()

    @property
    def session_id(self) -> int:
        sid = self.client.client_id
        return int(sid[0]) if sid else 0

    # -- brokers -----------------------------------------------------------------------------

    def register_broker(self, reg: BrokerRegistration) -> int:
        """Create the broker's ephemeral znode; returns the broker epoch (the znode's czxid).

        A znode left by this same session (a retried create) is ours; one held by any other
        live session means a second broker with this id, which is refused.
        """
        path = layout.broker_path(reg.broker_id)
        try:
            real = self.client.create(path, reg.encode(), ephemeral=True)
            _, stat = self.client.get(real)
            return int(stat.czxid)
        except NodeExistsError:
            try:
                data, stat = self.client.get(path)
            except NoNodeError:
                return self.register_broker(reg)
            if stat.ephemeralOwner == self.session_id:
                return int(stat.czxid)
            other = BrokerRegistration.decode(reg.broker_id, data)
            raise BrokerIdInUseError(
                f"broker id {reg.broker_id} is already registered by a live broker at "
                f"{other.host}:{other.port} (pid {other.pid}); refusing to start a second broker "
                f"with the same id. Stop that broker or pick another --id."
            ) from None

    def registration(self, broker_id: int) -> tuple[BrokerRegistration, int] | None:
        """The broker's registration and the session that owns it, or None when absent."""
        try:
            data, stat = self.client.get(layout.broker_path(broker_id))
        except NoNodeError:
            return None
        return BrokerRegistration.decode(broker_id, data), int(stat.ephemeralOwner)

    def request_reassignment(self, moves: list[layout.Reassignment]) -> bool:
        """Ask the controller to move partitions (``/admin/reassign_partitions``); False when
        another reassignment is still in progress."""
        try:
            self.client.create(layout.REASSIGN_PARTITIONS, layout.encode_reassignments(moves))
        except NodeExistsError:
            return False
        return True

    def request_controlled_shutdown(self, broker_id: int, timeout_s: float | None = None) -> None:
        """Ask the controller to move leadership off this broker (an ephemeral znode: the
        request ends with the broker's session). With ``timeout_s``, KazooTimeoutError when
        ZooKeeper has not answered by then (kazoo holds a call while it reconnects, forever)."""
        path = f"{layout.CONTROLLED_SHUTDOWN}/{broker_id}"
        try:
            self.client.create_async(path, b"", ephemeral=True).get(timeout=timeout_s)
        except NodeExistsError:
            pass

    def live_brokers(self) -> dict[int, BrokerRegistration]:
        result: dict[int, BrokerRegistration] = {}
        for child in self.client.get_children(layout.BROKER_IDS):
            try:
                data, _ = self.client.get(f"{layout.BROKER_IDS}/{child}")
            except NoNodeError:
                continue
            result[int(child)] = BrokerRegistration.decode(int(child), data)
        return result

    # -- cluster id, controller ----------------------------------------------------------------

    def cluster_id(self) -> str:
        try:
            return self.client.get(layout.CLUSTER_ID)[0].decode()
        except NoNodeError:
            try:
                self.client.create(layout.CLUSTER_ID, str(uuid.uuid4()).encode(), makepath=True)
            except NodeExistsError:
                pass
            return self.client.get(layout.CLUSTER_ID)[0].decode()

    def controller_id(self) -> int:
        try:
            data, _ = self.client.get(layout.CONTROLLER)
        except NoNodeError:
            return -1
        try:
            return int(layout._loads(data, layout.CONTROLLER)["brokerid"])
        except (ValueError, KeyError):
            return -1

    def controller_epoch(self) -> tuple[int, int]:
        """(epoch, znode version); (0, -1) before the first election."""
        return self.controller_epoch_counter.current()

    @property
    def controller_epoch_counter(self) -> FencingCounter:
        return FencingCounter(self.client, layout.CONTROLLER_EPOCH)

    def claim_controller(self, broker_id: int) -> bool:
        """Create the ephemeral ``/controller`` znode for this broker; False if another holds it."""
        payload = orjson.dumps({"version": 1, "brokerid": broker_id, "timestamp": int(time.time() * 1000)})
        try:
            self.client.create(layout.CONTROLLER, payload, ephemeral=True)
        except NodeExistsError:
            return False
        return True

    def release_controller(self, broker_id: int, timeout_s: float | None = None) -> bool:
        """Delete ``/controller`` only while this session holds it (checked by the znode's owner
        and version in one conditional delete): a resigning controller never deletes the znode
        of the controller that replaced it. With ``timeout_s``, KazooTimeoutError when
        ZooKeeper has not answered both calls by then."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        try:
            data, stat = self.client.get_async(layout.CONTROLLER).get(timeout=left())
        except NoNodeError:
            return False
        try:
            holder = int(layout._loads(data, layout.CONTROLLER)["brokerid"])
        except (ValueError, KeyError):
            return False
        if holder != broker_id or stat.ephemeralOwner != self.session_id:
            return False
        try:
            self.client.delete_async(layout.CONTROLLER, version=stat.version).get(timeout=left())
        except (NoNodeError, BadVersionError):
            return False
        return True

    def _transaction(self, epoch_zk_version: int, ops: Iterable[FencedOp]) -> Any:
        txn = self.client.transaction()
        if not self._epoch_fence_disabled:
            txn.check(layout.CONTROLLER_EPOCH, epoch_zk_version)
        for op in ops:
            if op.kind == "create":
                txn.create(op.path, op.data, sequence=op.sequence)
            elif op.kind == "set":
                txn.set_data(op.path, op.data, op.version)
            elif op.kind == "delete":
                txn.delete(op.path, op.version)
            else:
                raise ValueError(f"unknown fenced op {op.kind!r}")
        return txn

    def _fenced_failure(self, epoch_zk_version: int, results: list[Any]) -> Exception | None:
        """None when every op went through; ControllerDeposedError when the epoch check failed;
        otherwise the first op's own error (BadVersionError, NodeExistsError, ...)."""
        failures = [r for r in results if isinstance(r, Exception)]
        if not failures:
            return None
        if self._epoch_fence_disabled:
            return failures[0]
        first = results[0]
        if isinstance(first, (BadVersionError, NoNodeError)):
            return ControllerDeposedError(
                f"controller epoch znode is no longer at version {epoch_zk_version}: deposed"
            )
        real = [r for r in results[1:] if isinstance(r, Exception) and type(r).__name__ != "RolledBackError"]
        return real[0] if real else failures[0]

    def commit_fenced(self, epoch_zk_version: int, ops: Iterable[FencedOp]) -> None:
        """Apply ``ops`` atomically, only if ``/controller_epoch`` still has the given version.

        This is the fence of I4: a controller that was deposed (the epoch moved on) cannot
        change anything, because its check fails and ZooKeeper rejects the whole multi-op.
        """
        results = self._transaction(epoch_zk_version, list(ops)).commit()
        failure = self._fenced_failure(epoch_zk_version, results)
        if failure is not None:
            raise failure

    def commit_fenced_many(
        self, epoch_zk_version: int, groups: list[tuple[list[FencedOp], list[StateWrite]]], writer: str
    ) -> list[ChunkResult]:
        """Commit many partitions' changes as few fenced multi-ops as ZooKeeper's request limit
        allows, all in flight at once. Each group (one partition's ops and the state writes they
        make) stays within one multi-op; each multi-op also creates the state-change notice that
        lists its writes. Raises ControllerDeposedError if any multi-op failed its epoch check;
        otherwise returns each multi-op's outcome (a failed one changed nothing)."""

        def size(item: FencedOp | StateWrite) -> int:
            if isinstance(item, FencedOp):
                return len(item.path) + len(item.data) + 32
            return len(item.topic) + 120

        chunks = layout.chunk_by_size([ops + writes for ops, writes in groups], size)
        pending = []
        for chunk in chunks:
            ops = [i for i in chunk if isinstance(i, FencedOp)]
            writes = [i for i in chunk if isinstance(i, StateWrite)]
            if writes:
                ops.append(self._notice_op(writes, writer))
            pending.append((writes, self._transaction(epoch_zk_version, ops).commit_async()))
        outcomes: list[ChunkResult] = []
        deposed: Exception | None = None
        for writes, result in pending:
            results = result.get()
            failure = self._fenced_failure(epoch_zk_version, results)
            if isinstance(failure, ControllerDeposedError):
                deposed = failure
            notice = results[-1] if failure is None and writes and isinstance(results[-1], str) else None
            outcomes.append(ChunkResult(writes, failure, notice))
        if deposed is not None:
            raise deposed
        return outcomes

    @staticmethod
    def _notice_op(writes: list[StateWrite], writer: str) -> FencedOp:
        notice = StateChanges(writer, int(time.time() * 1000), tuple(writes))
        return FencedOp("create", layout.state_change_path(), notice.encode(), sequence=True)

    def write_partition_state(self, write: StateWrite, expected_version: int, writer: str) -> str:
        """A partition state written outside the controller (a leader's ISR change), conditional
        on the version the writer read, together with its state-change notice. Raises
        BadVersionError when someone changed the state meanwhile. Returns the notice's path."""
        txn = self.client.transaction()
        txn.set_data(
            layout.partition_state_path(write.topic, write.partition), write.state.encode(), expected_version
        )
        op = self._notice_op([write], writer)
        txn.create(op.path, op.data, sequence=True)
        results = txn.commit()
        if isinstance(results[0], Exception):
            raise results[0]
        if isinstance(results[1], Exception):
            raise results[1]
        return str(results[1])

    def write_partition_states(
        self, items: list[tuple[StateWrite, int]], writer: str
    ) -> list[str | Exception]:
        """Many leaders' ISR changes at once: as few multi-ops as the request limit allows (each
        with one notice), each state conditional on its expected version. A multi-op that one
        stale version refuses is retried one state at a time, so one conflict costs only its
        own write. Returns, per item, the notice's path or the error that refused it."""
        out: list[str | Exception] = [Exception("not written")] * len(items)
        indexed = list(enumerate(items))
        chunks = layout.chunk_by_size([[x] for x in indexed], lambda x: len(x[1][0].topic) + 200)
        pending = []
        for chunk in chunks:
            txn = self.client.transaction()
            for _, (write, expected) in chunk:
                path = layout.partition_state_path(write.topic, write.partition)
                txn.set_data(path, write.state.encode(), expected)
            op = self._notice_op([w for _, (w, _) in chunk], writer)
            txn.create(op.path, op.data, sequence=True)
            pending.append((chunk, txn.commit_async()))
        for chunk, result in pending:
            results = result.get()
            if not any(isinstance(r, Exception) for r in results):
                for i, _ in chunk:
                    out[i] = str(results[-1])
                continue
            for i, (write, expected) in chunk:
                try:
                    out[i] = self.write_partition_state(write, expected, writer)
                except Exception as exc:
                    out[i] = exc
        return out

    # -- bulk reads ----------------------------------------------------------------------------

    def read_many(self, paths: Iterable[str]) -> dict[str, tuple[bytes, ZnodeStat] | None]:
        """Read many znodes with their requests pipelined (kazoo's asynchronous API), at most
        READ_WINDOW in flight: one round trip's latency for the lot instead of one each."""
        out: dict[str, tuple[bytes, ZnodeStat] | None] = {}
        window: deque[tuple[str, Any]] = deque()

        def drain(keep: int) -> None:
            while len(window) > keep:
                path, result = window.popleft()
                try:
                    out[path] = result.get()
                except NoNodeError:
                    out[path] = None

        for path in paths:
            window.append((path, self.client.get_async(path)))
            drain(READ_WINDOW)
        drain(0)
        return out

    # -- topics ------------------------------------------------------------------------------

    def topics(self) -> list[str]:
        return sorted(self.client.get_children(layout.TOPICS))

    def topic(self, name: str) -> TopicAssignment | None:
        try:
            data, _ = self.client.get(layout.topic_path(name))
        except NoNodeError:
            return None
        return TopicAssignment.decode(name, data)

    def topic_with_version(self, name: str) -> tuple[TopicAssignment, int] | None:
        try:
            data, stat = self.client.get(layout.topic_path(name))
        except NoNodeError:
            return None
        return TopicAssignment.decode(name, data), int(stat.version)

    def all_topics(self) -> dict[str, TopicAssignment]:
        """Every topic's assignment, read in one pipelined batch."""
        found = self.read_many(layout.topic_path(n) for n in self.topics())
        return {
            path.rsplit("/", 1)[1]: TopicAssignment.decode(path.rsplit("/", 1)[1], got[0])
            for path, got in found.items()
            if got is not None
        }

    def complete_unclean_audit(self, topic: str, partition: int, leader_epoch: int, leo: int) -> bool:
        """Fill in where the possible loss of an unclean election starts (the new leader's log
        end when it took over); False when there is no such audit record or it is filled in."""
        path = layout.unclean_election_path(topic, partition, leader_epoch)

        def fill(data: bytes | None) -> bytes | None:
            if data is None:
                return None
            record = orjson.loads(data)
            if record.get("lost_from_offset") is not None:
                return None
            record["lost_from_offset"] = leo
            return orjson.dumps(record)

        before = self.client.exists(path)
        if before is None:
            return False
        after, version = compare_and_set(self.client, path, fill)
        return after is not None and version > before.version

    def update_topic_config(
        self, name: str, change: Callable[[TopicAssignment], dict[str, str] | None]
    ) -> TopicAssignment | None:
        """Replace a topic's config with ``change(assignment)`` (None: leave it) by
        compare-and-set of the topic znode, so a concurrent write by the controller (a move, added
        partitions) is never lost, nor this one. Returns the topic as stored afterwards (None:
        no such topic). Brokers apply the new config to their replicas from their watch."""
        path = layout.topic_path(name)

        def rewrite(data: bytes | None) -> bytes | None:
            if data is None:
                return None
            current = TopicAssignment.decode(name, data)
            config = change(current)
            if config is None or config == current.config:
                return None
            return TopicAssignment(name, current.topic_id, current.replicas, config).encode()

        if self.client.exists(path) is None:
            return None
        stored, _ = compare_and_set(self.client, path, rewrite)
        return TopicAssignment.decode(name, stored) if stored is not None else None

    def dynamic_broker_config(self, entity: str) -> dict[str, str]:
        """The dynamic configs of a broker id or of ``<default>`` ({} when none are set)."""
        found = self.read(layout.broker_config_path(entity))
        return layout.decode_dynamic_config(found[0] if found else None, layout.broker_config_path(entity))

    def update_dynamic_broker_config(
        self, entity: str, change: Callable[[dict[str, str]], dict[str, str] | None]
    ) -> dict[str, str]:
        """Replace a broker's (or ``<default>``'s) dynamic configs with ``change(current)`` (None:
        leave them) by compare-and-set; returns what is stored afterwards."""
        path = layout.broker_config_path(entity)

        def rewrite(data: bytes | None) -> bytes | None:
            current = layout.decode_dynamic_config(data, path)
            config = change(current)
            if config is None or (config == current and data is not None):
                return None
            return layout.encode_dynamic_config(config)

        stored, _ = compare_and_set(self.client, path, rewrite)
        return layout.decode_dynamic_config(stored, path)

    def create_topic(self, assignment: TopicAssignment) -> None:
        try:
            self.client.create(layout.topic_path(assignment.name), assignment.encode())
        except NodeExistsError:
            raise TopicExistsError(f"topic {assignment.name!r} already exists") from None

    @property
    def connected(self) -> bool:
        return bool(self.client.connected)

    def add_session_listener(self, listener: Callable[[Any], Any]) -> None:
        """Call ``listener`` with each session state change (kazoo's KazooState); it runs on
        kazoo's event thread and must not block."""
        self.client.add_listener(listener)

    def children(self, path: str) -> list[str] | None:
        """The names of a znode's children; None if the znode does not exist."""
        try:
            return list(self.client.get_children(path))
        except NoNodeError:
            return None

    def read(self, path: str) -> tuple[bytes, ZnodeStat] | None:
        """A znode's data and stat; None if it does not exist."""
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            return None
        return data, stat

    def exists(self, path: str) -> bool:
        return self.client.exists(path) is not None

    def reassignment_request(self) -> tuple[list[layout.Reassignment], int] | None:
        """The pending ``/admin/reassign_partitions`` request and its znode version, if any."""
        try:
            data, stat = self.client.get(layout.REASSIGN_PARTITIONS)
        except NoNodeError:
            return None
        return layout.decode_reassignments(data), int(stat.version)

    def topic_deletion_ops(self, name: str) -> list[FencedOp]:
        """Fenced deletes of a topic's znodes, children before parents (partition states,
        partitions, the topic), then of its deletion request."""
        ops: list[FencedOp] = []
        if self.client.exists(layout.topic_path(name)):
            partitions = layout.partitions_path(name)
            if self.client.exists(partitions):
                for p in self.client.get_children(partitions):
                    base = f"{partitions}/{p}"
                    for child in self.client.get_children(base):
                        ops.append(FencedOp("delete", f"{base}/{child}"))
                    ops.append(FencedOp("delete", base))
                ops.append(FencedOp("delete", partitions))
            ops.append(FencedOp("delete", layout.topic_path(name)))
        ops.append(FencedOp("delete", layout.delete_topic_path(name)))
        return ops

    def topics_marked_for_deletion(self) -> list[str]:
        return sorted(self.client.get_children(layout.DELETE_TOPICS))

    def mark_topic_for_deletion(self, name: str) -> None:
        try:
            self.client.create(layout.delete_topic_path(name), b"")
        except NodeExistsError:
            pass

    def partition_state(self, topic: str, partition: int) -> tuple[PartitionState, int] | None:
        path = layout.partition_state_path(topic, partition)
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            return None
        return PartitionState.decode(data, path), int(stat.version)

    def delete_recursive_unfenced(self, path: str) -> None:
        """For tools and tests only; the controller deletes through fenced ops."""
        try:
            self.client.delete(path, recursive=True)
        except (NoNodeError, NotEmptyError):
            pass

    # -- producer ids --------------------------------------------------------------------------

    def allocate_producer_id_block(
        self, broker_id: int, size: int = PRODUCER_ID_BLOCK_SIZE
    ) -> ProducerIdBlock:
        """Claim the next block of producer ids with a conditional write (unique cluster-wide)."""

        def next_block(data: bytes | None) -> bytes:
            first = ProducerIdBlock.decode(data).next_first if data is not None else 0
            return ProducerIdBlock(broker_id, first, size).encode()

        stored = update_znode(self.client, layout.PRODUCER_ID_BLOCK, next_block, max_tries=1000)
        assert stored is not None
        return ProducerIdBlock.decode(stored)

    # -- watches -----------------------------------------------------------------------------

    def watch_children(self, path: str, callback: Callable[[list[str]], Any]) -> None:
        self.client.ChildrenWatch(path, callback)

    def watch_data(self, path: str, callback: Callable[[bytes | None, ZnodeStat | None], Any]) -> None:
        self.client.DataWatch(path, callback)


class LeaderElection:
    """One leader at a time among processes, without blocking (kazoo's Election recipe, polled).

    Each contender keeps an ephemeral sequential znode under `path`, its name starting with a
    nonce of its own (so a create whose reply was lost is found again rather than doubled); the
    lowest sequence number leads. A contender whose session expired finds its znode gone and
    queues again at the back. On becoming leader it takes the next value of the fencing counter
    at `epoch_path` (:class:`FencingCounter`), and its writes check that znode's version in the
    same multi-op: a leader that was paused past its session cannot write once its successor
    has taken the counter (the controller's rule, I4).

    :meth:`lead` costs at most five ZooKeeper calls; a failed call raises kazoo's error and the
    caller counts itself as not leading until its next call succeeds."""

    def __init__(self, client: KazooClient, path: str, identity: str, epoch_path: str):
        self.client = client
        self.path = path.rstrip("/")
        self.identity = identity
        self.epoch_path = epoch_path
        self._prefix = f"{uuid.uuid4().hex}__c-"
        self._fence: tuple[int, int] | None = None  # (epoch, znode version) while leading

    @staticmethod
    def _sequence(name: str) -> int:
        return int(name[-10:])

    def _contenders(self) -> list[str]:
        try:
            return sorted(self.client.get_children(self.path), key=self._sequence)
        except NoNodeError:
            return []

    def lead(self) -> tuple[int, int] | None:
        """Contend (again, after a lost session) and answer: the fencing (epoch, znode version)
        while this contender leads, None while another does."""
        children = self._contenders()
        mine = [c for c in children if c.startswith(self._prefix)]
        if not mine:
            self._fence = None
            self.client.create(
                f"{self.path}/{self._prefix}", self.identity.encode(), ephemeral=True, sequence=True,
                makepath=True,
            )  # fmt: skip
            children = self._contenders()
            mine = [c for c in children if c.startswith(self._prefix)]
        for extra in mine[1:]:  # a retried create: keep the first
            try:
                self.client.delete(f"{self.path}/{extra}")
            except NoNodeError:
                pass
        if not mine or children[0] != mine[0]:
            if self._fence is not None:
                log.info("event=leadership_lost path=%s identity=%s", self.path, self.identity)
            self._fence = None
            return None
        if self._fence is None:
            self._fence = FencingCounter(self.client, self.epoch_path).take()
            log.info(
                "event=leader_elected path=%s identity=%s epoch=%d", self.path, self.identity, self._fence[0]
            )
        return self._fence

    def leader(self) -> str | None:
        """The identity of the contender leading now (None when nobody contends)."""
        for name in self._contenders():
            try:
                data, _ = self.client.get(f"{self.path}/{name}")
            except NoNodeError:
                continue
            return bytes(data).decode()
        return None

    def resign(self) -> None:
        """Leave the election (best effort: a znode left behind goes with the session)."""
        self._fence = None
        try:
            for name in self._contenders():
                if name.startswith(self._prefix):
                    self.client.delete(f"{self.path}/{name}")
        except Exception as exc:
            log.info("event=resign_incomplete path=%s identity=%s error=%s", self.path, self.identity, exc)
