"""Real network faults between the hosts of a :class:`~sluice.ops.netns.HostNetwork`.

Every fault lives inside the hosts' namespaces, never in the root namespace, so removing the
network removes the faults with it, and test clients in the root namespace always see every
host (they observe; they are never cut off).

* :class:`Partition`: one host and a set of peers exchange no packets, both ways; the other
  hosts are unaffected (a broker cut off from the other brokers but not from ZooKeeper).
* :class:`Split`: a set of hosts against the rest (a ZooKeeper majority/minority split, with
  brokers on both sides).
* :class:`OneWayDrop`: packets from A to B are dropped; B to A pass.
* :class:`LinkImpairment`: delay (with jitter) and loss on the packets one host sends.

How packets are dropped, and why there. A drop is an iptables rule in the *receiving* host's
``SLUICE-IN`` chain (jumped to from ``INPUT``), matching the sender's address. It matches every
packet, whatever its connection-tracking state, so established TCP connections stall exactly
like new ones. Dropping in the sender's ``OUTPUT`` would not be a network fault: the kernel
turns a locally dropped packet into an immediate ``EPERM`` for the sending socket, where a real
network loses the packet silently and the sender times out.

How delay is made. With ``tc netem`` when the kernel has ``sch_netem``. Kernels without it
(this project's test VM has neither ``sch_netem`` nor loadable modules) get the same effect
from an iptables ``NFQUEUE`` rule in the host's ``SLUICE-OUT`` chain and a small delayer process
inside the host (``python -m sluice.chaos.netfaults delay``) that holds each packet's verdict
for the delay, and drops a share of packets for the loss. The rule uses ``--queue-bypass``:
should the delayer die, packets pass undelayed rather than being dropped. Unlike netem with
jitter, the delayer never reorders packets (each packet waits at least as long as the one
before it), which keeps TCP from reading jitter as loss.

Every fault has ``apply()`` and an idempotent ``heal()``. :class:`TimedFaults` applies faults
for a duration, heals each on its own when its time is up, and heals everything on exit, also
when the body raised. :func:`heal_all` removes every fault from a network, also those applied
by another process. iptables and tc come from Debian's ``iptables`` and ``iproute2`` packages
(scripts/bootstrap.sh installs them).
"""

from __future__ import annotations

import abc
import argparse
import collections
import contextlib
import errno
import heapq
import logging
import os
import random
import secrets
import select
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import ClassVar, Literal

from sluice.ops.netns import Host, HostNetwork
from sluice.ops.netns import unavailable_reason as netns_unavailable_reason

__all__ = [
    "CHAIN_IN",
    "CHAIN_OUT",
    "LinkImpairment",
    "NetFault",
    "NetFaultError",
    "OneWayDrop",
    "Partition",
    "Split",
    "TimedFaults",
    "heal_all",
    "netem_available",
    "unavailable_reason",
]

log = logging.getLogger("sluice.chaos.netfaults")

#: The chains, in every host's filter table, that hold Sluice's rules (jumped to first from
#: INPUT and OUTPUT). Nothing else writes to them, so healing everything is flushing them.
CHAIN_IN = "SLUICE-IN"
CHAIN_OUT = "SLUICE-OUT"

Backend = Literal["auto", "netem", "nfqueue"]

_COMMENT_PREFIX = "sluice:"
_DELAYER_MODULE = "sluice.chaos.netfaults"
_DELAYER_READY_TIMEOUT_S = 10.0
_DELAYER_STOP_TIMEOUT_S = 5.0
_CMD_TIMEOUT_S = 30.0


class NetFaultError(RuntimeError):
    """A fault could not be applied or healed; the message says what to do next."""


def unavailable_reason() -> str | None:
    """Return why network faults cannot be applied on this machine, or None when they can."""
    reason = netns_unavailable_reason()
    if reason is not None:
        return reason
    for tool, package in (("iptables", "iptables"), ("iptables-restore", "iptables"), ("tc", "iproute2")):
        if shutil.which(tool) is None:
            return f"`{tool}` is missing: run scripts/bootstrap.sh (apt-get install {package})"
    return None


# -- the faults ----------------------------------------------------------------------------------


class NetFault(abc.ABC):
    """A network fault between hosts: :meth:`apply` puts it in place, :meth:`heal` removes it.

    ``heal`` is idempotent and may be called on a fault that was never applied, or after
    :func:`heal_all` or the network's removal.
    """

    kind: ClassVar[str]

    def __init__(self, network: HostNetwork) -> None:
        """Bind the fault to ``network`` and give it a unique id (used to tag its rules)."""
        self.network = network
        self.fault_id = f"{self.kind}-{secrets.token_hex(4)}"
        self._applied = False
        self._lock = threading.Lock()

    @property
    def applied(self) -> bool:
        """Whether the fault is in place (applied and not healed)."""
        return self._applied

    def apply(self) -> None:
        """Put the fault in place; on failure, whatever was put in place is removed.

        Raises:
            NetFaultError: when it is applied already, or a command fails.
        """
        with self._lock:
            if self._applied:
                raise NetFaultError(f"{self.describe()} is applied already; heal it first")
            self._applied = True
            try:
                self._apply()
            except BaseException:
                self._heal()
                self._applied = False
                raise
            with _ACTIVE_LOCK:
                _ACTIVE.add(self)
        log.info("event=net_fault_applied id=%s %s", self.fault_id, self.describe())

    def heal(self) -> None:
        """Remove the fault. Idempotent; parts already gone are skipped."""
        with self._lock:
            was_applied = self._applied
            self._heal()
            self._applied = False
            with _ACTIVE_LOCK:
                _ACTIVE.discard(self)
        if was_applied:
            log.info("event=net_fault_healed id=%s kind=%s", self.fault_id, self.kind)

    @abc.abstractmethod
    def describe(self) -> str:
        """Return the fault as ``kind=... key=value ...`` for logs and summaries."""

    @abc.abstractmethod
    def _apply(self) -> None:
        """Put the fault in place (called under the fault's lock)."""

    @abc.abstractmethod
    def _heal(self) -> None:
        """Remove whatever of the fault is in place (called under the fault's lock)."""

    def __repr__(self) -> str:
        """Show the id and what the fault does."""
        return f"<{type(self).__name__} {self.fault_id} {self.describe()}>"


#: Faults applied in this process and not healed yet, so heal_all() heals their in-process
#: state (a delayer process, the applied flag) before sweeping the namespaces.
_ACTIVE: weakref.WeakSet[NetFault] = weakref.WeakSet()
_ACTIVE_LOCK = threading.Lock()


class _DropFault(NetFault):
    """A fault made of (receiver, sender) pairs: the receiver drops every packet from the sender."""

    def _pairs(self) -> list[tuple[Host, Host]]:
        """Return the (receiver, sender) pairs."""
        raise NotImplementedError

    def _apply(self) -> None:
        by_receiver: dict[str, list[str]] = collections.defaultdict(list)
        receivers: dict[str, Host] = {}
        for receiver, sender in self._pairs():
            receivers[receiver.name] = receiver
            by_receiver[receiver.name].append(sender.ip)
        for name, senders in by_receiver.items():
            host = receivers[name]
            _ensure_chains(host)
            rules = [
                f"-A {CHAIN_IN} -s {ip}/32 -m comment --comment {self._comment} -j DROP" for ip in senders
            ]
            # One iptables-restore per host: all of a host's rules appear at once.
            _iptables_restore(host, rules)

    def _heal(self) -> None:
        for host in {receiver.name: receiver for receiver, _ in self._pairs()}.values():
            _delete_tagged_rules(host, CHAIN_IN, self._comment)

    @property
    def _comment(self) -> str:
        return f"{_COMMENT_PREFIX}{self.fault_id}"


class Partition(_DropFault):
    """``host`` and every one of ``peers`` exchange no packets, in either direction.

    Hosts not named, and the root namespace, still reach both sides. Example: isolate broker 1
    from the other brokers but not from ZooKeeper::

        Partition(net, "b1", ["b2", "b3"])
    """

    kind = "partition"

    def __init__(self, network: HostNetwork, host: str, peers: Iterable[str]) -> None:
        """Describe the partition (nothing changes until :meth:`apply`).

        Raises:
            KeyError: when a name is not a host of ``network``.
            ValueError: when ``peers`` is empty or holds ``host``.
        """
        super().__init__(network)
        self.host = network.host(host)
        self.peers = tuple(network.host(p) for p in dict.fromkeys(peers))
        if not self.peers:
            raise ValueError("a partition needs at least one peer")
        if self.host in self.peers:
            raise ValueError(f"host {host!r} cannot be partitioned from itself")

    def _pairs(self) -> list[tuple[Host, Host]]:
        pairs = [(self.host, p) for p in self.peers]
        return pairs + [(p, self.host) for p in self.peers]

    def describe(self) -> str:
        """``kind=partition host=b1 peers=b2,b3``."""
        return f"kind={self.kind} host={self.host.name} peers={','.join(p.name for p in self.peers)}"


class Split(_DropFault):
    """Hosts in ``side`` exchange no packets with the hosts in ``other`` (default: all the rest).

    Hosts on the same side still talk, as does the root namespace with everyone. Example, a
    ZooKeeper minority with one broker against the majority with the other brokers::

        Split(net, ["zk1", "b1"])
    """

    kind = "split"

    def __init__(self, network: HostNetwork, side: Iterable[str], other: Iterable[str] | None = None) -> None:
        """Describe the split (nothing changes until :meth:`apply`).

        Raises:
            KeyError: when a name is not a host of ``network``.
            ValueError: when a side is empty or the sides overlap.
        """
        super().__init__(network)
        self.side = tuple(network.host(h) for h in dict.fromkeys(side))
        names = {h.name for h in self.side}
        if other is None:
            self.other = tuple(h for h in network.hosts if h.name not in names)
        else:
            self.other = tuple(network.host(h) for h in dict.fromkeys(other))
        if not self.side or not self.other:
            raise ValueError("both sides of a split need at least one host")
        overlap = names & {h.name for h in self.other}
        if overlap:
            raise ValueError(f"hosts on both sides of a split: {sorted(overlap)}")

    def _pairs(self) -> list[tuple[Host, Host]]:
        pairs = [(a, b) for a in self.side for b in self.other]
        return pairs + [(b, a) for a in self.side for b in self.other]

    def describe(self) -> str:
        """``kind=split side=zk1,b1 other=zk2,zk3,b2``."""
        side = ",".join(h.name for h in self.side)
        return f"kind={self.kind} side={side} other={','.join(h.name for h in self.other)}"


class OneWayDrop(_DropFault):
    """Packets from ``source`` to ``target`` are dropped; ``target`` to ``source`` pass.

    A TCP connection either way stalls (its acknowledgements cannot get through); datagrams
    from ``target`` to ``source`` arrive.
    """

    kind = "one-way"

    def __init__(self, network: HostNetwork, source: str, target: str) -> None:
        """Describe the drop (nothing changes until :meth:`apply`).

        Raises:
            KeyError: when a name is not a host of ``network``.
            ValueError: when source and target are the same host.
        """
        super().__init__(network)
        self.source = network.host(source)
        self.target = network.host(target)
        if self.source == self.target:
            raise ValueError(f"a one-way drop needs two hosts, got {source!r} twice")

    def _pairs(self) -> list[tuple[Host, Host]]:
        return [(self.target, self.source)]

    def describe(self) -> str:
        """``kind=one-way from=a to=b``."""
        return f"kind={self.kind} from={self.source.name} to={self.target.name}"


class LinkImpairment(NetFault):
    """A slow, lossy link: the packets ``host`` sends are delayed and a share of them lost.

    Like ``tc netem`` on the host's interface, it acts on what the host sends, so a round trip
    through the host takes ``delay_ms`` longer. One impairment per host at a time.

    Backends: ``netem`` (``tc qdisc ... netem``), ``nfqueue`` (the delayer process, for kernels
    without ``sch_netem``), or ``auto``: netem when the kernel has it, else nfqueue.
    """

    kind = "netem"

    def __init__(
        self,
        network: HostNetwork,
        host: str,
        *,
        delay_ms: float = 0.0,
        jitter_ms: float = 0.0,
        loss_percent: float = 0.0,
        backend: Backend = "auto",
        seed: int | None = None,
    ) -> None:
        """Describe the impairment (nothing changes until :meth:`apply`).

        Args:
            network: the hosts' network.
            host: the host whose outgoing packets are impaired.
            delay_ms: the mean added delay.
            jitter_ms: each packet's delay is drawn uniformly from ``delay_ms +/- jitter_ms``.
            loss_percent: the share of packets dropped, 0 to 100.
            backend: how: ``auto``, ``netem`` or ``nfqueue``.
            seed: the delayer's random seed (nfqueue), for repeatable runs.

        Raises:
            KeyError: when ``host`` is not a host of ``network``.
            ValueError: on out-of-range values, or when the impairment would do nothing.
        """
        super().__init__(network)
        if delay_ms < 0 or not 0 <= jitter_ms <= delay_ms:
            raise ValueError(
                f"need delay_ms >= 0 and 0 <= jitter_ms <= delay_ms, got {delay_ms}, {jitter_ms}"
            )
        if not 0 <= loss_percent <= 100:
            raise ValueError(f"loss_percent must be in 0..100, got {loss_percent}")
        if delay_ms == 0 and loss_percent == 0:
            raise ValueError("a link impairment needs a delay or a loss")
        if backend not in ("auto", "netem", "nfqueue"):
            raise ValueError(f"backend must be auto, netem or nfqueue, got {backend!r}")
        self.host = network.host(host)
        self.delay_ms = delay_ms
        self.jitter_ms = jitter_ms
        self.loss_percent = loss_percent
        self.backend: Backend = backend
        self.seed = secrets.randbits(32) if seed is None else seed
        self._used_backend: Literal["netem", "nfqueue"] | None = None
        self._delayer: subprocess.Popen[bytes] | None = None

    def describe(self) -> str:
        """``kind=netem host=b1 delay_ms=100 jitter_ms=10 loss_percent=1 backend=nfqueue``."""
        return (
            f"kind={self.kind} host={self.host.name} delay_ms={self.delay_ms:g} jitter_ms={self.jitter_ms:g} "
            f"loss_percent={self.loss_percent:g} backend={self._used_backend or self.backend}"
        )

    def _apply(self) -> None:
        backend = self.backend
        if backend == "auto":
            backend = "netem" if netem_available(self.host) else "nfqueue"
        self._used_backend = backend
        if backend == "netem":
            self._apply_netem()
        else:
            self._apply_nfqueue()

    def _apply_netem(self) -> None:
        args = ["qdisc", "add", "dev", self.host.veth_ns, "root", "netem"]
        if self.delay_ms:
            args += ["delay", f"{self.delay_ms:g}ms", f"{self.jitter_ms:g}ms"]
        if self.loss_percent:
            args += ["loss", f"{self.loss_percent:g}%"]
        proc = _tc(self.host, args)
        if proc.returncode != 0:
            if "File exists" in proc.stderr:
                raise NetFaultError(
                    f"host {self.host.name} has a queueing discipline already (another impairment?); "
                    "heal it first or run heal_all(network)"
                )
            raise NetFaultError(f"tc netem on host {self.host.name} failed: {proc.stderr.strip()}")

    def _apply_nfqueue(self) -> None:
        _ensure_chains(self.host)
        existing = _list_rules(self.host, CHAIN_OUT)
        if any("NFQUEUE" in rule for rule in existing):
            raise NetFaultError(
                f"host {self.host.name} has a link impairment already; heal it first or run heal_all(network)"
            )
        queue = int(self.fault_id.rsplit("-", 1)[1], 16) % 65535 + 1
        argv = [
            sys.executable,
            "-m",
            _DELAYER_MODULE,
            "delay",
            f"--queue={queue}",
            f"--delay-ms={self.delay_ms:g}",
            f"--jitter-ms={self.jitter_ms:g}",
            f"--loss-percent={self.loss_percent:g}",
            f"--seed={self.seed}",
        ]
        self._delayer = self.host.popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        _wait_ready(self._delayer, self.host)
        rule = (
            f"-A {CHAIN_OUT} -o {self.host.veth_ns} -m comment --comment {_COMMENT_PREFIX}{self.fault_id} "
            f"-j NFQUEUE --queue-num {queue} --queue-bypass"
        )
        _iptables_restore(self.host, [rule])

    def _heal(self) -> None:
        if self._used_backend == "netem":
            if self.host.exists():
                _tc(self.host, ["qdisc", "del", "dev", self.host.veth_ns, "root"])
        elif self._used_backend == "nfqueue":
            # The rule first, so no new packet is queued; then the delayer lets the held ones go.
            _delete_tagged_rules(self.host, CHAIN_OUT, f"{_COMMENT_PREFIX}{self.fault_id}")
            delayer, self._delayer = self._delayer, None
            if delayer is not None:
                _stop_process(delayer)
        self._used_backend = None


# -- applying faults for a while -----------------------------------------------------------------


class TimedFaults:
    """Apply faults for a duration each; heal each on its own when its time is up.

    On :meth:`close` (and on leaving a ``with`` block, also on an error) every fault still in
    place is healed, then :func:`heal_all` sweeps the network. ``counts`` tells how many faults
    of each kind were applied, for a run's summary.

    Example::

        with TimedFaults(net) as faults:
            faults.apply_for(Partition(net, "b1", ["b2", "b3"]), duration_s=5)
            ...  # the workload runs; the partition heals itself after 5 s
    """

    def __init__(self, network: HostNetwork) -> None:
        """Start with no fault in place."""
        self.network = network
        self.counts: collections.Counter[str] = collections.Counter()
        self.heal_errors: list[str] = []
        self._timers: dict[str, threading.Timer] = {}
        self._faults: dict[str, NetFault] = {}
        self._lock = threading.Lock()
        self._closed = False

    def apply_for(self, fault: NetFault, duration_s: float) -> None:
        """Apply ``fault`` now and heal it after ``duration_s`` seconds (on a timer thread).

        Raises:
            NetFaultError: when the fault cannot be applied (nothing of it stays in place).
            RuntimeError: after :meth:`close`.
        """
        if duration_s <= 0:
            raise ValueError(f"duration_s must be positive, got {duration_s}")
        with self._lock:
            if self._closed:
                raise RuntimeError("TimedFaults is closed")
            fault.apply()
            self.counts[fault.kind] += 1
            timer = threading.Timer(duration_s, self._expire, args=(fault,))
            timer.daemon = True
            timer.name = f"heal-{fault.fault_id}"
            self._timers[fault.fault_id] = timer
            self._faults[fault.fault_id] = fault
            timer.start()

    def heal(self, fault: NetFault) -> None:
        """Heal ``fault`` now, before its time is up."""
        with self._lock:
            timer = self._timers.pop(fault.fault_id, None)
            self._faults.pop(fault.fault_id, None)
        if timer is not None:
            timer.cancel()
        fault.heal()

    @property
    def active(self) -> list[NetFault]:
        """The faults in place, applied here and not healed yet."""
        with self._lock:
            return list(self._faults.values())

    def close(self) -> None:
        """Cancel the timers, heal every fault still in place and sweep the network."""
        with self._lock:
            self._closed = True
            timers, self._timers = self._timers, {}
            faults, self._faults = self._faults, {}
        for timer in timers.values():
            timer.cancel()
        for fault in faults.values():
            self._heal_logged(fault)
        heal_all(self.network)

    def __enter__(self) -> TimedFaults:
        """Return self."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Heal everything, also when the body raised."""
        self.close()

    def _expire(self, fault: NetFault) -> None:
        """Heal a fault whose time is up (on its timer thread)."""
        with self._lock:
            if self._faults.pop(fault.fault_id, None) is None:
                return  # healed early or by close()
            self._timers.pop(fault.fault_id, None)
        self._heal_logged(fault)

    def _heal_logged(self, fault: NetFault) -> None:
        """Heal ``fault``; log and record a failure instead of raising (timer threads)."""
        try:
            fault.heal()
        except Exception as exc:
            log.exception("event=net_fault_heal_failed id=%s", fault.fault_id)
            self.heal_errors.append(f"{fault.fault_id}: {exc}")


def heal_all(network: HostNetwork) -> None:
    """Remove every fault from every host of ``network``, also those applied by other processes.

    Heals the faults this process applied, then flushes each host's Sluice chains, deletes its
    root queueing discipline and stops delayer processes left in it. Hosts whose namespace is
    gone are skipped.
    """
    with _ACTIVE_LOCK:
        active = list(_ACTIVE)
    for fault in active:
        if fault.network.tag == network.tag:
            fault.heal()
    for host in network.hosts:
        if not host.exists():
            continue
        for chain in (CHAIN_IN, CHAIN_OUT):
            _iptables(host, ["-F", chain])  # fails harmlessly when the chain was never made
        _tc(host, ["qdisc", "del", "dev", host.veth_ns, "root"])  # the same when there is none
        for pid in host.pids():
            if _is_delayer(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
    log.info("event=net_faults_healed_all tag=%s hosts=%d", network.tag, len(network.hosts))


_NETEM_AVAILABLE: bool | None = None


def netem_available(host: Host) -> bool:
    """Return whether this kernel has ``tc netem`` (probed once, on ``host``'s loopback)."""
    global _NETEM_AVAILABLE
    if _NETEM_AVAILABLE is None:
        probe = _tc(host, ["qdisc", "add", "dev", "lo", "root", "netem", "delay", "0ms"])
        _NETEM_AVAILABLE = probe.returncode == 0
        if _NETEM_AVAILABLE:
            _tc(host, ["qdisc", "del", "dev", "lo", "root"])
        else:
            log.info("event=netem_unavailable reason=%r backend=nfqueue", probe.stderr.strip())
    return _NETEM_AVAILABLE


# -- iptables and tc inside a host ---------------------------------------------------------------


def _command(host: Host, argv: Sequence[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` inside ``host`` and return the result (the caller checks the exit code)."""
    try:
        return subprocess.run(
            [*host.exec_prefix, *argv],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=_CMD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise NetFaultError(
            f"`{' '.join(argv)}` in host {host.name} did not finish in {_CMD_TIMEOUT_S:g} s"
        ) from exc


def _iptables(host: Host, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run ``iptables -w <args>`` inside ``host``."""
    return _command(host, ["iptables", "-w", *args])


def _tc(host: Host, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run ``tc <args>`` inside ``host``."""
    return _command(host, ["tc", *args])


def _iptables_restore(host: Host, rules: Sequence[str]) -> None:
    """Apply ``rules`` (``-A``/``-D``/``-I`` lines) to ``host``'s filter table in one transaction."""
    text = "*filter\n" + "".join(f"{r}\n" for r in rules) + "COMMIT\n"
    proc = _command(host, ["iptables-restore", "-w", "--noflush"], stdin=text)
    if proc.returncode != 0:
        if not host.exists():
            raise NetFaultError(
                f"host {host.name} is gone (namespace {host.namespace}); was its network removed?"
            )
        raise NetFaultError(f"iptables-restore in host {host.name} failed: {proc.stderr.strip()}\n{text}")


def _ensure_chains(host: Host) -> None:
    """Make ``SLUICE-IN`` and ``SLUICE-OUT`` in ``host`` and jump to them first, once."""
    # (iptables-nft reports a chain missing from a namespace that never had a filter table as
    # "incompatible, use 'nft' tool"; any failure here means "not made yet".)
    if _iptables(host, ["-S", CHAIN_IN]).returncode == 0:
        return
    chains = [f":{CHAIN_IN} - [0:0]", f":{CHAIN_OUT} - [0:0]"]
    jumps = [f"-I INPUT 1 -j {CHAIN_IN}", f"-I OUTPUT 1 -j {CHAIN_OUT}"]
    try:
        _iptables_restore(host, chains + jumps)
    except NetFaultError:
        if _iptables(host, ["-S", CHAIN_IN]).returncode != 0:
            raise
        # Another process made them in between; theirs serve as well.


def _list_rules(host: Host, chain: str) -> list[str]:
    """Return ``chain``'s rules in ``host`` as ``iptables -S`` prints them (empty if none)."""
    proc = _iptables(host, ["-S", chain])
    if proc.returncode != 0:
        return []
    return [line for line in proc.stdout.splitlines() if line.startswith("-A ")]


def _delete_tagged_rules(host: Host, chain: str, comment: str) -> None:
    """Delete the rules of ``chain`` in ``host`` that carry ``comment``; nothing if none or gone."""
    if not host.exists():
        return
    # iptables -S prints the comment in double quotes (it has a colon); restore reads them back.
    tagged = [rule for rule in _list_rules(host, chain) if _rule_comment(rule) == comment]
    if tagged:
        _iptables_restore(host, ["-D" + rule[2:] for rule in tagged])


def _rule_comment(rule: str) -> str | None:
    """Return the ``--comment`` of a rule as ``iptables -S`` prints it, or None."""
    try:
        words = shlex.split(rule)
    except ValueError:
        return None
    for i, word in enumerate(words[:-1]):
        if word == "--comment":
            return words[i + 1]
    return None


def _is_delayer(pid: int) -> bool:
    """Return whether ``pid`` is a delayer process started by a LinkImpairment."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return _DELAYER_MODULE.encode() in argv and b"delay" in argv


def _wait_ready(proc: subprocess.Popen[bytes], host: Host) -> None:
    """Wait until a delayer prints ``ready``; kill it and raise if it exits or takes too long."""
    assert proc.stdout is not None
    deadline = time.monotonic() + _DELAYER_READY_TIMEOUT_S
    line = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        line = proc.stdout.readline()
        if line.strip() == b"ready":
            return
        if not line:
            break
    _stop_process(proc)
    raise NetFaultError(
        f"the packet delayer in host {host.name} did not start (exit {proc.returncode}, said {line!r}); "
        "its error is on stderr"
    )


def _stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM a process we started, SIGKILL it if it lingers, and reap it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(_DELAYER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(_DELAYER_STOP_TIMEOUT_S)
    if proc.stdout is not None:
        proc.stdout.close()


# -- the delayer: NFQUEUE over a raw netlink socket ----------------------------------------------
#
# nfnetlink_queue (linux/netfilter/nfnetlink_queue.h): bind a queue number, ask for packet
# metadata only, receive one NFQNL_MSG_PACKET per queued packet, answer each with a verdict.
# Only the packet id is read; the packet's bytes are never copied to user space.

_NETLINK_NETFILTER = 12
_NFNL_SUBSYS_QUEUE = 3
_NFQNL_MSG_PACKET = 0
_NFQNL_MSG_VERDICT = 1
_NFQNL_MSG_CONFIG = 2
_NLMSG_ERROR = 2
_NLM_F_REQUEST = 1
_NLM_F_ACK = 4
_NFQA_PACKET_HDR = 1
_NFQA_VERDICT_HDR = 2
_NFQA_CFG_CMD = 1
_NFQA_CFG_PARAMS = 2
_NFQA_CFG_QUEUE_MAXLEN = 3
_NFQA_CFG_MASK = 4
_NFQA_CFG_FLAGS = 5
_NFQNL_CFG_CMD_BIND = 1
_NFQNL_COPY_META = 1
_NFQA_CFG_F_FAIL_OPEN = 1  # a full queue lets packets through instead of dropping them
_NFQA_CFG_F_GSO = 4  # no segmentation of large packets just to queue them
_NF_DROP = 0
_NF_ACCEPT = 1
_NETLINK_NO_ENOBUFS = 5
_QUEUE_MAXLEN = 8192
_RCVBUF_BYTES = 4 << 20
_IDLE_WAKE_S = 0.2
_RECV_BATCH_MAX = 256


def _nla(kind: int, payload: bytes) -> bytes:
    """Return one netlink attribute, padded to 4 bytes."""
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def _nfq_message(msg_type: int, flags: int, queue: int, attrs: Sequence[bytes]) -> bytes:
    """Return one nfnetlink_queue message for ``queue``."""
    body = struct.pack("!BBH", socket.AF_UNSPEC, 0, queue) + b"".join(attrs)
    header = struct.pack("=IHHII", 16 + len(body), (_NFNL_SUBSYS_QUEUE << 8) | msg_type, flags, 0, 0)
    return header + body


def _nfq_request(sock: socket.socket, queue: int, attrs: Sequence[bytes], what: str) -> None:
    """Send a config message and wait for its acknowledgement; raise on an error reply."""
    sock.send(_nfq_message(_NFQNL_MSG_CONFIG, _NLM_F_REQUEST | _NLM_F_ACK, queue, attrs))
    sock.settimeout(5.0)
    try:
        reply = sock.recv(65536)
    finally:
        sock.settimeout(None)
    _, msg_type = struct.unpack_from("=IH", reply, 0)
    if msg_type == _NLMSG_ERROR:
        (code,) = struct.unpack_from("=i", reply, 16)
        if code != 0:
            raise OSError(-code, f"nfqueue {what} for queue {queue}: {os.strerror(-code)}")


def _packet_ids(data: bytes) -> list[int]:
    """Return the packet ids of the NFQNL_MSG_PACKET messages in one netlink read."""
    ids: list[int] = []
    offset = 0
    while offset + 16 <= len(data):
        length, msg_type = struct.unpack_from("=IH", data, offset)
        if length < 16:
            break
        if msg_type == (_NFNL_SUBSYS_QUEUE << 8) | _NFQNL_MSG_PACKET:
            attr = offset + 20  # netlink header, then the 4-byte nfgenmsg
            while attr + 4 <= offset + length:
                attr_len, attr_type = struct.unpack_from("=HH", data, attr)
                if attr_len < 4:
                    break
                if attr_type & 0x7FFF == _NFQA_PACKET_HDR:
                    ids.append(struct.unpack_from("!I", data, attr + 4)[0])
                    break
                attr += (attr_len + 3) & ~3
        offset += (length + 3) & ~3
    return ids


def run_delayer(queue: int, delay_ms: float, jitter_ms: float, loss_percent: float, seed: int) -> int:
    """Hold each packet of NFQUEUE ``queue`` for its delay, then accept it; drop a share of them.

    Runs inside a host's namespace until SIGTERM or until its parent process exits; then every
    held packet is accepted at once. Prints ``ready`` when the queue is bound.
    """
    rng = random.Random(seed)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    parent = os.getppid()
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_NETFILTER)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, 33, _RCVBUF_BYTES)  # SO_RCVBUFFORCE, root only
    with contextlib.suppress(OSError):
        sock.setsockopt(270, _NETLINK_NO_ENOBUFS, 1)  # SOL_NETLINK
    sock.bind((0, 0))
    _nfq_request(sock, queue, [_nla(_NFQA_CFG_CMD, struct.pack("!BBH", _NFQNL_CFG_CMD_BIND, 0, 0))], "bind")
    _nfq_request(sock, queue, [_nla(_NFQA_CFG_PARAMS, struct.pack("!IB", 0, _NFQNL_COPY_META))], "params")
    _nfq_request(sock, queue, [_nla(_NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", _QUEUE_MAXLEN))], "maxlen")
    flags = _NFQA_CFG_F_FAIL_OPEN | _NFQA_CFG_F_GSO
    _nfq_request(
        sock,
        queue,
        [_nla(_NFQA_CFG_MASK, struct.pack("!I", flags)), _nla(_NFQA_CFG_FLAGS, struct.pack("!I", flags))],
        "flags",
    )
    sock.setblocking(False)
    print("ready", flush=True)

    def verdict(packet_id: int, value: int) -> None:
        attr = _nla(_NFQA_VERDICT_HDR, struct.pack("!II", value, packet_id))
        sock.send(_nfq_message(_NFQNL_MSG_VERDICT, _NLM_F_REQUEST, queue, [attr]))

    held: list[tuple[float, int]] = []  # (due, packet id), a heap
    last_due = 0.0
    delay_s, jitter_s, loss = delay_ms / 1000.0, jitter_ms / 1000.0, loss_percent / 100.0
    while not stop.is_set() and os.getppid() == parent:
        now = time.monotonic()
        wait_s = _IDLE_WAKE_S if not held else min(_IDLE_WAKE_S, max(0.0, held[0][0] - now))
        readable, _, _ = select.select([sock], [], [], wait_s)
        if readable:
            for _ in range(_RECV_BATCH_MAX):
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno == errno.ENOBUFS:
                        continue  # with FAIL_OPEN the kernel let those packets through
                    raise
                now = time.monotonic()
                for packet_id in _packet_ids(data):
                    if loss and rng.random() < loss:
                        verdict(packet_id, _NF_DROP)
                        continue
                    # Never before the packet ahead of it: delay with jitter, without reordering.
                    due = max(now + delay_s + rng.uniform(-jitter_s, jitter_s), last_due)
                    last_due = due
                    heapq.heappush(held, (due, packet_id))
        now = time.monotonic()
        while held and held[0][0] <= now:
            verdict(heapq.heappop(held)[1], _NF_ACCEPT)
    while held:
        verdict(heapq.heappop(held)[1], _NF_ACCEPT)
    sock.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sluice.chaos.netfaults delay --queue N --delay-ms D ...`` (started by LinkImpairment)."""
    parser = argparse.ArgumentParser(prog=f"python -m {_DELAYER_MODULE}")
    sub = parser.add_subparsers(dest="command", required=True)
    delay = sub.add_parser("delay", help="hold the packets of an NFQUEUE queue (run inside a host)")
    delay.add_argument("--queue", type=int, required=True)
    delay.add_argument("--delay-ms", type=float, default=0.0)
    delay.add_argument("--jitter-ms", type=float, default=0.0)
    delay.add_argument("--loss-percent", type=float, default=0.0)
    delay.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    return run_delayer(args.queue, args.delay_ms, args.jitter_ms, args.loss_percent, args.seed)


if __name__ == "__main__":
    sys.exit(main())
