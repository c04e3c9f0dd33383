"""Thousands of partitions (issue 14): creation, idle cost and failover on a local 3-broker cluster.

For each size (a fresh cluster in a temp dir: 3 brokers, replication factor 3, topics of
--partitions-per-topic partitions) we print:

- create_s: from the first CreateTopics request until metadata shows a leader for every
  partition (metadata polled every ~0.5 s); isr_full_s: until every ISR holds all 3 replicas;
- idle_cpu_pct: CPU of each broker over --idle-s seconds with no client connected, in percent
  of one core (utime + stime from /proc/<pid>/stat); rss_mb: each broker's VmRSS afterwards;
- kill9_to_leaders_s: kill -9 of the broker leading the most partitions until the last
  partition it led has a live leader (metadata from the surviving brokers);
  kill9_back_in_isr_s: its restart (same id, same data dir) until it is in every ISR again;
- controlled_shutdown_s: SIGTERM (a controlled shutdown) of the broker then leading the most
  partitions until its process exits (leadership_moved_s: the part of it the broker logged
  for moving leadership away); leaderless_after_shutdown: partitions without a live
  leader in the first metadata after the exit; still_leading_at_exit: partitions the broker
  itself logged as still led when its controlled shutdown ended;
- back_in_isr_s: restart of that broker until it is back in every ISR;
- fs_dir_file_us: right before the cluster starts, what creating a directory with one empty file
  costs on the file system holding the cluster (microseconds each, mean of 2,000). Creating
  partitions is bound by it (every replica is a directory and a file), and on a shared virtual
  machine it moves several-fold from one minute to the next: read create_s beside it.

Every wait is bounded by --timeout; a figure that ran out prints ``timeout`` and the figures
that depend on it print ``-``. A markdown table row per size follows, for bench/RESULTS.md.

Targets at 10,000 partitions: create < 20 s; idle CPU < 5 % of a core per broker;
kill -9 to the last new leader < session timeout + 3 s; controlled shutdown < 5 s; back in
every ISR within 60 s.

``--against sluice,kafka`` runs every size on a local Apache Kafka 3.9.1 cluster too
(``sluice.peers.kafka``: 3 ZooKeeper-mode brokers with the same ``--session-timeout``, and
``--kafka-heap`` per broker, 384m by default: give 1g or more at 10,000 partitions), one cluster
at a time, the first system alternating from size to size, and prints each figure as
``create_s@1000 sluice=X kafka=Y`` then ``create_s@1000 ratio sluice/kafka=R`` (per-broker figures
averaged over the brokers). Kafka is skipped, saying why, when ``scripts/peers.sh`` has not
fetched its jars. Kafka's brokers log no ``controlled_shutdown_done`` line: its
leadership_moved_s and still_leading_at_exit print ``?``.

Usage: .venv/bin/python bench/scale.py [--partitions 1000,3000,10000] [--session-timeout 6]
           [--idle-s 30] [--partitions-per-topic 100] [--timeout 600] [--keep-dir]
           [--against sluice,kafka] [--kafka-heap 384m]
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient, NewTopic

import systems as sysmod
import versus
from sluice.ops import launcher

REPLICATION_FACTOR = 3
BROKERS = 3
TOPIC_PREFIX = "scale-"
POLL_S = 0.5
TOPICS_PER_REQUEST = 10
CLK_TCK = os.sysconf("SC_CLK_TCK")

#: one partition's metadata as the bench needs it: (leader, replicas, isr)
Parts = dict[tuple[str, int], tuple[int, tuple[int, ...], tuple[int, ...]]]


class Timeout(Exception):
    """A bounded wait ran out."""


def progress(msg: str) -> None:
    print(f"# {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def admin_for(servers: str) -> AdminClient:
    # A broker answers the CreateTopics requests of one connection in order, so the last of a
    # large creation waits for all before it: librdkafka's 60 s socket timeout would give up on
    # it while the broker still works through the others.
    return AdminClient({"bootstrap.servers": servers, "log_level": 0, "socket.timeout.ms": 300_000})


def metadata(admin: AdminClient, topics: dict[str, int], timeout_s: float = 30.0) -> Parts | None:
    """The bench's topics' partitions from one full metadata request, or None if it failed."""
    try:
        md = admin.list_topics(timeout=timeout_s)
    except Exception:
        return None
    parts: Parts = {}
    for name in topics:
        t = md.topics.get(name)
        if t is None or t.error is not None:
            continue
        for p in t.partitions.values():
            parts[(name, p.id)] = (int(p.leader), tuple(p.replicas), tuple(p.isrs))
    return parts


def wait_for(
    admin: AdminClient,
    topics: dict[str, int],
    done: Callable[[Parts], bool],
    started: float,
    timeout_s: float,
) -> tuple[float, Parts]:
    """Poll metadata until done(parts); seconds since `started` and the last metadata seen."""
    deadline = started + timeout_s
    while True:
        parts = metadata(admin, topics, timeout_s=max(1.0, min(30.0, deadline - time.monotonic())))
        if parts is not None and done(parts):
            return time.monotonic() - started, parts
        if time.monotonic() >= deadline:
            raise Timeout
        time.sleep(POLL_S)


def complete(topics: dict[str, int], parts: Parts) -> bool:
    return len(parts) == sum(topics.values())


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / 1e6
    return float("nan")


def leader_counts(parts: Parts) -> collections.Counter[int]:
    return collections.Counter(leader for leader, _, _ in parts.values() if leader >= 0)


def in_every_isr(broker_id: int, total: int) -> Callable[[Parts], bool]:
    def done(parts: Parts) -> bool:
        # every partition must be listed: a broker still loading may answer with none at all
        return len(parts) == total and all(
            broker_id in isr for _, replicas, isr in parts.values() if broker_id in replicas
        )

    return done


def controlled_shutdown_log(log_file: str) -> tuple[str, str]:
    """From the broker's last controlled_shutdown_done line: seconds it took to move leadership
    away, and how many partitions it still led when it gave up ("?" if not logged)."""
    took, left = "?", "?"
    try:
        with open(log_file, errors="replace") as f:
            for line in f:
                if "event=controlled_shutdown_done" in line:
                    if m := re.search(r"took_ms=(\d+)", line):
                        took = f"{int(m.group(1)) / 1000:.2f}"
                    if m := re.search(r"still_leading=\[(.*?)\]", line):
                        left = str(len([x for x in m.group(1).split(",") if x.strip()]))
    except OSError:
        pass
    return took, left


def restart_until_in_isr(
    cluster: sysmod.System, b: sysmod.Broker, topics: dict[str, int], timeout_s: float
) -> float:
    started = time.monotonic()
    cluster.restart(b.broker_id, timeout_s=timeout_s)
    admin = admin_for(cluster.bootstrap_servers)
    elapsed, _ = wait_for(admin, topics, in_every_isr(b.broker_id, sum(topics.values())), started, timeout_s)
    return elapsed


def plan_topics(size: int, per_topic: int) -> dict[str, int]:
    counts = [per_topic] * (size // per_topic)
    if size % per_topic:
        counts.append(size % per_topic)
    return {f"{TOPIC_PREFIX}{i:05d}": n for i, n in enumerate(counts)}


def create(cluster: sysmod.System, topics: dict[str, int], timeout_s: float, r: dict[str, str]) -> None:
    admin = admin_for(cluster.bootstrap_servers)
    names = list(topics)
    op_timeout = min(timeout_s, 60.0)
    started = time.monotonic()
    futures: dict[str, Future[None]] = {}
    for i in range(0, len(names), TOPICS_PER_REQUEST):
        batch = [NewTopic(n, topics[n], REPLICATION_FACTOR) for n in names[i : i + TOPICS_PER_REQUEST]]
        futures.update(
            admin.create_topics(batch, operation_timeout=op_timeout, request_timeout=op_timeout + 30)
        )

    def failures() -> list[str]:
        # A CreateTopics that ran out of time while waiting for leaders is no failure here
        # (metadata decides); any other error is.
        found = []
        for name, fut in futures.items():
            exc = fut.exception(timeout=0) if fut.done() else None
            if exc is not None:
                err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                if err is None or err.code() != KafkaError.REQUEST_TIMED_OUT:
                    found.append(f"{name}: {exc}")
        return found

    def all_led(parts: Parts) -> bool:
        if failed := failures():
            r["create_errors"] = str(len(failed))
            raise RuntimeError(f"CreateTopics failed for {len(failed)} topics, first: {failed[0]}")
        return complete(topics, parts) and all(leader >= 0 for leader, _, _ in parts.values())

    def all_in_sync(parts: Parts) -> bool:
        return complete(topics, parts) and all(len(isr) == len(rep) for _, rep, isr in parts.values())

    r["create_s"] = "timeout"
    elapsed, _ = wait_for(admin, topics, all_led, started, timeout_s)
    r["create_s"] = f"{elapsed:.2f}"
    progress(f"every partition has a leader after {elapsed:.2f} s")
    r["isr_full_s"] = "timeout"
    elapsed, _ = wait_for(admin, topics, all_in_sync, started, timeout_s)
    r["isr_full_s"] = f"{elapsed:.2f}"


def idle(cluster: sysmod.System, idle_s: float, r: dict[str, str]) -> None:
    pids = {b.broker_id: b.pid for b in cluster.brokers()}
    before = {bid: cpu_ticks(pid) for bid, pid in pids.items()}
    t0 = time.monotonic()
    time.sleep(idle_s)
    wall = time.monotonic() - t0
    after = {bid: cpu_ticks(pid) for bid, pid in pids.items()}
    r["idle_cpu_pct"] = ",".join(
        f"b{bid}:{100.0 * (after[bid] - before[bid]) / CLK_TCK / wall:.1f}" for bid in sorted(pids)
    )
    r["rss_mb"] = ",".join(f"b{bid}:{rss_mb(pid):.0f}" for bid, pid in sorted(pids.items()))


def busiest_broker(
    cluster: sysmod.System, topics: dict[str, int], before: str
) -> tuple[Parts, int, int, sysmod.Broker, AdminClient]:
    """The broker leading the most partitions: (metadata, its id, how many it leads, its process,
    an admin client on the other brokers)."""
    parts = metadata(admin_for(cluster.bootstrap_servers), topics)
    if not parts:
        raise RuntimeError(f"no metadata before {before}")
    counts = leader_counts(parts).most_common(1)
    if not counts:
        raise RuntimeError(f"no partition has a leader before {before}")
    victim, led = counts[0]
    survivors = admin_for(",".join(x.address for x in cluster.brokers() if x.broker_id != victim))
    return parts, victim, led, cluster.broker(victim), survivors


def kill9(cluster: sysmod.System, topics: dict[str, int], timeout_s: float, r: dict[str, str]) -> None:
    parts, victim, led, b, survivors = busiest_broker(cluster, topics, "kill -9")
    mine = [tp for tp, (leader, _, _) in parts.items() if leader == victim]
    r["kill9_broker"] = f"b{victim}:{led}"
    progress(f"kill -9 of broker {victim} (leads {led} partitions)")
    started = time.monotonic()
    os.kill(b.pid, signal.SIGKILL)

    def moved(parts: Parts) -> bool:
        return all(tp in parts and parts[tp][0] >= 0 and parts[tp][0] != victim for tp in mine)

    r["kill9_to_leaders_s"] = "timeout"
    elapsed, _ = wait_for(survivors, topics, moved, started, timeout_s)
    r["kill9_to_leaders_s"] = f"{elapsed:.2f}"
    progress(f"every partition broker {victim} led has a live leader after {elapsed:.2f} s; restarting it")
    r["kill9_back_in_isr_s"] = "timeout"
    r["kill9_back_in_isr_s"] = f"{restart_until_in_isr(cluster, b, topics, timeout_s):.2f}"


def controlled_shutdown(
    cluster: sysmod.System, topics: dict[str, int], timeout_s: float, r: dict[str, str]
) -> None:
    parts, victim, led, b, survivors = busiest_broker(cluster, topics, "the controlled shutdown")
    r["shutdown_broker"] = f"b{victim}:{led}"
    metadata(survivors, topics)  # connect before the fault, so the first look after it is quick
    progress(f"controlled shutdown of broker {victim} (leads {led} partitions)")
    started = time.monotonic()
    launcher.stop_pid(b.pid, timeout_s=timeout_s)  # SIGTERM; SIGKILL once timeout_s ran out
    elapsed = time.monotonic() - started
    r["controlled_shutdown_s"] = "timeout" if elapsed >= timeout_s else f"{elapsed:.2f}"
    after = None
    deadline = time.monotonic() + 30
    while after is None and time.monotonic() < deadline:
        after = metadata(survivors, topics)
    if after is not None:
        leaderless = sum(1 for tp in parts if tp not in after or after[tp][0] < 0 or after[tp][0] == victim)
        r["leaderless_after_shutdown"] = str(leaderless)
    r["leadership_moved_s"], r["still_leading_at_exit"] = controlled_shutdown_log(b.log_file)
    progress(f"broker {victim} exited after {elapsed:.2f} s; restarting it")
    r["back_in_isr_s"] = "timeout"
    r["back_in_isr_s"] = f"{restart_until_in_isr(cluster, b, topics, timeout_s):.2f}"


KEYS = [
    "partitions",
    "topics",
    "fs_dir_file_us",
    "create_s",
    "isr_full_s",
    "idle_cpu_pct",
    "rss_mb",
    "kill9_broker",
    "kill9_to_leaders_s",
    "kill9_back_in_isr_s",
    "shutdown_broker",
    "controlled_shutdown_s",
    "leadership_moved_s",
    "leaderless_after_shutdown",
    "still_leading_at_exit",
    "back_in_isr_s",
    "create_errors",
    "error",
    "wall_s",
]
OPTIONAL_KEYS = {"create_errors", "error", "system"}
#: The figures compared with ``--against sluice,kafka``: name -> key of a result (per-broker
#: values such as ``b1:1.2,b2:0.8`` are averaged over the brokers)
COMPARED = {
    "create_s": "create_s",
    "isr_full_s": "isr_full_s",
    "idle_cpu_pct": "idle_cpu_pct",
    "rss_mb": "rss_mb",
    "kill9_to_leaders_s": "kill9_to_leaders_s",
    "kill9_back_in_isr_s": "kill9_back_in_isr_s",
    "controlled_shutdown_s": "controlled_shutdown_s",
    "back_in_isr_s": "back_in_isr_s",
}


def compared_figures(results: list[dict[str, str]]) -> list[tuple[str, float, float]]:
    """(``create_s@1000``, Sluice's value, Kafka's value) for each size both ran."""
    by = {(r.get("system", "sluice"), r["partitions"]): r for r in results}
    out = []
    for size in dict.fromkeys(r["partitions"] for r in results):
        ours, theirs = by.get(("sluice", size)), by.get(("kafka", size))
        if ours is None or theirs is None:
            continue
        for name, key in COMPARED.items():
            out.append(
                (f"{name}@{size}", versus.figure_value(ours.get(key)), versus.figure_value(theirs.get(key)))
            )
    return out


def fs_dir_file_us(parent: Path, n: int = 2000) -> float:
    """Mean microseconds to create a directory holding one empty file, under ``parent``."""
    probe = Path(tempfile.mkdtemp(prefix="fs-probe-", dir=parent))
    try:
        began = time.perf_counter()
        for i in range(n):
            d = probe / f"d{i}"
            d.mkdir()
            os.close(os.open(d / "f", os.O_WRONLY | os.O_CREAT, 0o644))
        return (time.perf_counter() - began) / n * 1e6
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def run_size(size: int, args: argparse.Namespace, system: str = "sluice") -> dict[str, str]:
    topics = plan_topics(size, args.partitions_per_topic)
    r: dict[str, str] = {"system": system, "partitions": str(size), "topics": str(len(topics))}
    directory = Path(tempfile.mkdtemp(prefix=f"sluice-scale-{system}-{size}-"))
    r["fs_dir_file_us"] = f"{fs_dir_file_us(directory):.0f}"
    began = time.monotonic()
    progress(f"{system}: {size} partitions in {len(topics)} topics; cluster in {directory}")
    cluster = None
    try:
        cluster = sysmod.start(
            system, directory / "cluster", BROKERS, args.session_timeout, kafka_heap=args.kafka_heap
        )
        create(cluster, topics, args.timeout, r)
        time.sleep(args.settle_s)
        progress(f"idle for {args.idle_s:g} s")
        idle(cluster, args.idle_s, r)
        kill9(cluster, topics, args.timeout, r)
        controlled_shutdown(cluster, topics, args.timeout, r)
    except Timeout:
        pass  # the figure that ran out already says "timeout"; later ones stay "-"
    except Exception as exc:
        r["error"] = repr(exc).replace(" ", "_")[:200]
        progress(f"error: {exc!r}")
    finally:
        # Nothing is measured past this point: kill the brokers rather than have each one do a
        # controlled shutdown of thousands of partitions, then stop ZooKeeper.
        if cluster is not None:
            cluster.down(fast=True)
        if args.keep_dir:
            progress(f"kept {directory}")
        else:
            shutil.rmtree(directory, ignore_errors=True)
    r["wall_s"] = f"{time.monotonic() - began:.0f}"
    return r


def table(results: list[dict[str, str]], session_timeout: float) -> str:
    today = datetime.date.today().isoformat()
    compare = {r.get("system", "sluice") for r in results} != {"sluice"}
    lines = [
        "| date | partitions | fs dir+file (us) | create (s) | all ISRs full (s) "
        "| idle CPU % of a core | RSS MB "
        "| kill -9 to last new leader (s) | back in every ISR after kill -9 (s) "
        "| controlled shutdown (s) | leaderless at exit | back in every ISR (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:

        def g(key: str, r: dict[str, str] = r) -> str:
            return r.get(key, "-").replace(",", " / ")

        who = f" ({sysmod.LABELS[r['system']]})" if compare else ""
        lines.append(
            f"| {today} | {int(r['partitions']):,}{who} | {g('fs_dir_file_us')} | {g('create_s')} "
            f"| {g('isr_full_s')} "
            f"| {g('idle_cpu_pct')} | {g('rss_mb')} | {g('kill9_to_leaders_s')} "
            f"| {g('kill9_back_in_isr_s')} | {g('controlled_shutdown_s')} "
            f"| {g('leaderless_after_shutdown')} | {g('back_in_isr_s')} |"
        )
    lines.append(
        f"| target at 10,000 | | | < 20 | | < 5 each | | < {session_timeout + 3:g} | | < 5 | 0 | < 60 |"
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", default="1000,3000,10000", help="comma-separated sizes")
    ap.add_argument("--session-timeout", type=float, default=6.0, help="ZooKeeper session timeout (s)")
    ap.add_argument("--idle-s", type=float, default=30.0, help="seconds of idle CPU sampling")
    ap.add_argument("--partitions-per-topic", type=int, default=100)
    ap.add_argument("--settle-s", type=float, default=5.0, help="pause after every ISR is full")
    ap.add_argument("--timeout", type=float, default=600.0, help="bound on each wait (s)")
    ap.add_argument("--keep-dir", action="store_true", help="keep each cluster's directory")
    ap.add_argument(
        "--against",
        default="sluice",
        help="systems to run, comma-separated: sluice, kafka (Apache Kafka from scripts/peers.sh, "
        "with the same ZooKeeper session timeout)",
    )
    ap.add_argument(
        "--kafka-heap",
        default=sysmod.HEAP,
        help="each Kafka broker's -Xmx (Kafka needs about 1g per broker at 10,000 partitions)",
    )
    args = ap.parse_args()
    sizes = [int(s) for s in args.partitions.split(",") if s.strip()]
    try:
        wanted = versus.parse_against(args.against)
    except ValueError as exc:
        ap.error(str(exc))
    names, skipped = sysmod.usable(wanted)
    if skipped:
        print(skipped, flush=True)
    if not names:
        sys.exit(1)

    def on_sigterm(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)  # tear down as on Ctrl-C
    print(f"command: {' '.join(sys.argv)}", flush=True)
    print(
        f"cluster: {BROKERS} brokers, RF={REPLICATION_FACTOR}, {args.partitions_per_topic} partitions "
        f"per topic, zk session timeout {args.session_timeout:g} s, idle {args.idle_s:g} s",
        flush=True,
    )
    if "kafka" in names:
        print(
            f"Apache Kafka settings: {sysmod.kafka_settings(args.session_timeout, args.kafka_heap)}",
            flush=True,
        )
    results = []
    try:
        # One system after the other for each size (one cluster at a time), the first alternating
        # from size to size.
        for size, order in zip(sizes, versus.round_orders(names, len(sizes)), strict=True):
            for name in order:
                r = run_size(size, args, name)  # tears its cluster down, also on Ctrl-C
                if names == ["sluice"]:
                    del r["system"]  # the line as before
                results.append(r)
                shown = [k for k in ["system", *KEYS] if k in r or k not in OPTIONAL_KEYS]
                print("scale " + " ".join(f"{k}={r.get(k, '-')}" for k in shown), flush=True)
    except KeyboardInterrupt:
        progress("interrupted; the cluster was torn down")
        if not results:
            sys.exit(130)
    print()
    print(table(results, args.session_timeout))
    versus.print_figures(compared_figures(results), digits=2)


if __name__ == "__main__":
    main()
