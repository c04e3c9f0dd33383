"""``__consumer_offsets`` after many commits: how much of it the cleaner leaves, and how long a
coordinator move takes to load (issue 19, acceptance 2).

What it does
------------
1. Starts a local cluster (``--brokers``, ``__consumer_offsets`` with replication factor
   min(3, brokers)) with the brokers' defaults unless told otherwise (``--segment-bytes`` sets
   ``offsets.topic.segment.bytes``, ``--no-cleaner`` sets ``log.cleaner.enable=false`` for the
   figures without compaction, ``--cleaner-backoff-ms`` sets ``log.cleaner.backoff.ms``).
2. ``--groups`` confluent-kafka consumers (one group each, outside the group protocol, as
   tools and assign() consumers commit) commit offsets of a ``--partitions``-partition topic,
   all its partitions in each commit, until ``--commits`` offsets are committed in all (each
   offset commit is one record in ``__consumer_offsets``). Asynchronous commits, at most
   ``--in-flight`` per consumer.
3. Waits until the cleaner has settled (the records left stop shrinking, or fall under 1 % of
   the commits) and reads the groups' ``__consumer_offsets`` partitions from the start with a
   confluent-kafka consumer: the records left, as a share of the commits.
4. Moves the first group's coordinator twice: kill -9 of its broker, then (once that broker is
   back) a controlled shutdown (SIGTERM) of the next one. For each: from the fault until an
   OffsetFetch (confluent-kafka ``committed()``) answers the group's last commit from the new
   coordinator, and the new coordinator's own load (``event=coordinator_loaded``: records
   replayed, took_ms). After kill -9 the first part is the ZooKeeper session timeout (the dead
   broker's registration must expire before a new leader is elected); the load is what
   compaction changes.

Prints figures and the command; asserts nothing.

    .venv/bin/python bench/offsets.py                       # 1,000,000 commits, 10 groups
    .venv/bin/python bench/offsets.py --commits 100000 --no-cleaner
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from sluice.broker.group_placement import OFFSETS_TOPIC, partition_for_group
from sluice.ops import launcher

TOPIC = "bench-offsets"
OFFSETS_PARTITIONS = 50


def progress(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def commit_sync(consumer: Consumer, offsets: list[TopicPartition], timeout_s: float = 60.0) -> None:
    """A synchronous commit, retried while the coordinator is being found or loaded."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            consumer.commit(offsets=offsets, asynchronous=False)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def commit_all(
    bootstrap: str, groups: list[str], commits: int, partitions: int, in_flight: int
) -> tuple[float, int]:
    """Commit ``commits`` offsets in all, spread over the groups; (seconds it took, commits that
    failed and were superseded by a later one). Each group's first commit (its coordinator
    found and loaded) comes before the clock starts, and its last is retried until it holds."""
    per_group = commits // partitions // len(groups)
    failed: list[str] = []
    consumers: dict[str, Consumer] = {}
    acked: dict[str, int] = dict.fromkeys(groups, 0)

    for group in groups:

        def on_commit(err: KafkaError | None, _parts: object, group: str = group) -> None:
            if err is not None:
                failed.append(f"{group}: {err}")
            acked[group] += 1

        consumers[group] = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": group, "on_commit": on_commit, "log_level": 0}
        )
        commit_sync(consumers[group], [TopicPartition(TOPIC, p, 0) for p in range(partitions)])

    def run(group: str) -> None:
        consumer = consumers[group]
        base = acked[group]
        for n in range(1, per_group + 1):
            consumer.commit(
                offsets=[TopicPartition(TOPIC, p, n) for p in range(partitions)], asynchronous=True
            )
            while n - (acked[group] - base) >= in_flight:
                consumer.poll(0.01)
        while acked[group] - base < per_group:
            consumer.poll(0.05)
        # The last offsets must hold: a failed last commit is made again.
        commit_sync(consumer, [TopicPartition(TOPIC, p, per_group) for p in range(partitions)])

    started = time.monotonic()
    threads = [threading.Thread(target=run, args=(g,), daemon=True) for g in groups]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - started
    for consumer in consumers.values():
        consumer.close()
    if failed:
        progress(f"{len(failed)} asynchronous commits failed (later ones superseded them), e.g. {failed[:2]}")
    return took, len(failed)


def count_records(bootstrap: str, partitions: list[int]) -> int:
    """Records in these ``__consumer_offsets`` partitions, read from the start to the end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-count-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "log_level": 0,
        }
    )
    try:
        consumer.assign([TopicPartition(OFFSETS_TOPIC, p, OFFSET_BEGINNING) for p in partitions])
        left, count = set(partitions), 0
        deadline = time.monotonic() + 600
        while left and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 1.0):
                if msg.error() is None:
                    count += 1
                elif msg.error().code() == KafkaError._PARTITION_EOF:
                    left.discard(msg.partition())
                else:
                    raise SystemExit(f"reading {OFFSETS_TOPIC}: {msg.error()}")
        return count
    finally:
        consumer.close()


def leader_of(admin: AdminClient, partition: int) -> int:
    md = admin.list_topics(OFFSETS_TOPIC, timeout=10)
    return int(md.topics[OFFSETS_TOPIC].partitions[partition].leader)


def answered_by_another(admin: AdminClient, bootstrap: str, group: str, partition: int, victim: int,
                        expected: int, timeout_s: float) -> float:  # fmt: skip
    """Seconds until the group's coordinator partition is led by another broker than ``victim``
    and OffsetFetch (confluent-kafka ``committed()``, a fresh consumer each try) answers
    ``expected``: the old coordinator, still answering during a controlled shutdown, does not
    count."""
    started = time.monotonic()
    deadline = started + timeout_s
    while time.monotonic() < deadline:
        try:
            moved = leader_of(admin, partition) not in (victim, -1)
        except Exception:
            moved = False
        if moved:
            consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 0})
            try:
                (tp,) = consumer.committed([TopicPartition(TOPIC, 0)], timeout=1.0)
                if tp.offset == expected:
                    return time.monotonic() - started
            except Exception:
                pass
            finally:
                consumer.close()
        time.sleep(0.02)
    raise SystemExit(f"OffsetFetch of {group} did not answer {expected} within {timeout_s} s")


LOADED = re.compile(
    r"event=coordinator_loaded partition=__consumer_offsets-(\d+) groups=(\d+) records=(\d+) .*took_ms=(\d+)"
)


def last_load(log_file: str, partition: int) -> tuple[int, int]:
    """(records, took_ms) of the last load of the partition in a broker's log."""
    found = (-1, -1)
    for line in Path(log_file).read_text(errors="replace").splitlines():
        m = LOADED.search(line)
        if m and int(m.group(1)) == partition:
            found = (int(m.group(3)), int(m.group(4)))
    return found


def move(
    cluster: launcher.LocalCluster, admin: AdminClient, group: str, expected: int, fault: str
) -> dict[str, Any]:
    p = partition_for_group(group, OFFSETS_PARTITIONS)
    victim = leader_of(admin, p)
    b = cluster.broker(victim)
    if fault == "kill -9":
        os.kill(b.pid, signal.SIGKILL)
    else:
        threading.Thread(target=launcher.stop_pid, args=(b.pid,), daemon=True).start()
    seconds = answered_by_another(admin, cluster.bootstrap_servers, group, p, victim, expected, 120)
    new = leader_of(admin, p)
    records, took_ms = last_load(cluster.broker(new).log_file, p)
    progress(
        f"{fault}: {victim} -> {new}: OffsetFetch after {seconds:.2f} s, load {records} records {took_ms} ms"
    )
    launcher.stop_pid(b.pid)
    launcher.restart_broker(cluster, b)
    return {
        "fault": fault,
        "from": victim,
        "to": new,
        "fetch_s": seconds,
        "load_records": records,
        "load_ms": took_ms,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commits", type=int, default=1_000_000, help="offsets committed in all")
    ap.add_argument("--groups", type=int, default=10)
    ap.add_argument("--partitions", type=int, default=10, help="of the committed topic: offsets per commit")
    ap.add_argument("--brokers", type=int, default=3)
    ap.add_argument("--in-flight", type=int, default=100, help="asynchronous commits per consumer")
    ap.add_argument("--segment-bytes", type=int, default=None, help="offsets.topic.segment.bytes")
    ap.add_argument("--cleaner-backoff-ms", type=int, default=None, help="log.cleaner.backoff.ms")
    ap.add_argument("--no-cleaner", action="store_true", help="log.cleaner.enable=false")
    ap.add_argument("--settle-timeout", type=float, default=300.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    settings: dict[str, str] = {}
    if args.segment_bytes is not None:
        settings["offsets.topic.segment.bytes"] = str(args.segment_bytes)
    if args.cleaner_backoff_ms is not None:
        settings["log.cleaner.backoff.ms"] = str(args.cleaner_backoff_ms)
    if args.no_cleaner:
        settings["log.cleaner.enable"] = "false"
    directory = Path(tempfile.mkdtemp(prefix="sluice-offsets-bench-"))
    cluster = launcher.cluster_up(directory, args.brokers, broker_settings=settings)
    result: dict[str, Any] = {"argv": sys.argv[1:], "settings": settings}
    try:
        bootstrap = cluster.bootstrap_servers
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
        admin.create_topics([NewTopic(TOPIC, args.partitions, 1)], operation_timeout=30)[TOPIC].result(60)
        groups = [f"bench-group-{i}" for i in range(args.groups)]
        offsets_parts = sorted({partition_for_group(g, OFFSETS_PARTITIONS) for g in groups})
        committed_offsets = args.commits // args.partitions // args.groups * args.partitions * args.groups
        progress(f"committing {committed_offsets:,} offsets of {args.groups} groups")
        took, failed = commit_all(bootstrap, groups, args.commits, args.partitions, args.in_flight)
        result.update(
            commits=committed_offsets,
            commit_s=round(took, 1),
            commits_failed=failed,
            offsets_partitions=offsets_parts,
        )
        progress(f"committed in {took:.1f} s ({committed_offsets / took:,.0f} offsets/s)")

        started = time.monotonic()
        counts: list[int] = []
        while True:
            counts.append(count_records(bootstrap, offsets_parts))
            share = 100 * counts[-1] / committed_offsets
            progress(f"{OFFSETS_TOPIC}: {counts[-1]:,} records ({share:.2f} % of the commits)")
            # Settled: no change for 15 s, a whole log.cleaner.backoff.ms (default) included.
            settled = len(counts) >= 4 and len(set(counts[-4:])) == 1
            if args.no_cleaner or settled or time.monotonic() - started > args.settle_timeout:
                break
            time.sleep(5)
        result.update(records_left=counts[-1], share_left_pct=round(100 * counts[-1] / committed_offsets, 3),
                      settle_s=round(time.monotonic() - started, 1))  # fmt: skip

        expected = args.commits // args.partitions // args.groups
        result["moves"] = [
            move(cluster, admin, groups[0], expected, "kill -9"),
            move(cluster, admin, groups[0], expected, "controlled shutdown"),
        ]
    finally:
        launcher.cluster_down(directory)
    print(f"command: .venv/bin/python bench/offsets.py {shlex.join(sys.argv[1:])}")
    print(f"settings: {settings or 'broker defaults'}; {args.brokers} brokers; "
          f"{result.get('offsets_partitions')} partitions of {OFFSETS_TOPIC} hold the groups")  # fmt: skip
    print(f"commits: {result['commits']:,} offsets in {result['commit_s']} s")
    print(f"left after cleaning: {result['records_left']:,} records = {result['share_left_pct']} % "
          f"of the commits (settled after {result['settle_s']} s)")  # fmt: skip
    for m in result["moves"]:
        print(f"coordinator move by {m['fault']}: OffsetFetch answered after {m['fetch_s']:.2f} s; "
              f"the new coordinator loaded {m['load_records']:,} records in {m['load_ms']} ms")  # fmt: skip
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
