"""Prometheus metrics of every Sluice process: each metric of the broker and of the sync worker is
defined once here, and :func:`serve` exposes them over HTTP (``/metrics``, the text format).

Configuration (broker and worker alike): ``metrics.port``. Absent or empty, the process serves no
metrics (a Kafka broker has no exporter until one is configured either); a port number serves
them there, on every address of the broker's listener host (the worker: ``metrics.host``,
default every address); ``0`` picks a free port, which the process logs. ``sluice cluster up``
always gives each broker and worker a port and prints the URLs (``metrics=``).

The broker's metrics (Kafka's names in brackets):

- ``sluice_partitions_offline`` (OfflinePartitionsCount): partitions with no live leader, reported
  by the active controller only, 0 on every other broker, so a sum over brokers counts each once;
- ``sluice_partitions_under_replicated`` (UnderReplicatedPartitions): partitions led here with a
  replica out of the ISR;
- ``sluice_controller_active`` (ActiveControllerCount): 1 on the active controller, else 0;
- ``sluice_leader_elections_total``, ``sluice_unclean_elections_total`` (LeaderElectionRate,
  UncleanLeaderElectionsPerSec): partition leaders the controller elected (a failover, a
  controlled shutdown, a reassignment; a new partition's first leader is not an election), and
  of those, the ones outside the ISR;
- ``sluice_isr_shrinks_total``, ``sluice_isr_expands_total`` (IsrShrinksPerSec,
  IsrExpandsPerSec): ISR changes of partitions led here, whoever wrote them (the leader's lag
  check and catch-up, or the controller dropping a dead follower);
- ``sluice_requests_total{api}``, ``sluice_request_seconds{api}`` (RequestsPerSec, TotalTimeMs):
  requests handled, by Kafka API name (``Produce``, ``Fetch``, ``Metadata``, ...), and the time
  from decoding a request to handing its response to the socket (a fetch's long poll included);
- ``sluice_bytes_in_total``, ``sluice_bytes_out_total`` (BytesInPerSec, BytesOutPerSec): record
  bytes producers appended here, and record bytes answered to consumers' fetches (replication
  traffic between brokers is in neither, as in Kafka).
- ``sluice_authorization_denied_total{api,resource_type}`` (Kafka logs these in its authorizer
  log): refusals of the ACL authorizer, each topic, group or resource of a request counted once.

The partition gauges are computed when Prometheus scrapes, on the HTTP server's thread, from the
broker's in-memory view (the one classifier, ``cluster.health.classify_partition``); a scrape
never reads ZooKeeper and never waits on the broker's event loop. Requests are counted on the
event loop without a lock (:class:`Traffic`: a dict lookup and a few increments per request).

The worker's metrics, per task (label ``task``), removed when the worker stops running the task:
``sluice_task_lag_records``, ``sluice_task_lag_seconds`` (what the execution publishes in its
ZooKeeper status), ``sluice_task_apply_batch_seconds`` (the target commit of each micro-batch),
``sluice_task_commits_refused_total`` (a stale commit the target's fence refused) and
``sluice_task_duplicate_executions_total`` (each ``duplicate-execution`` alarm this process
raised) and ``sluice_task_dead_letters_total`` (changes the target refused that went to the
task's dead-letter topic). The manager serves ``sluice_group_lag_records{group,topic,partition}`` itself.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = [
    "BrokerCollector",
    "BrokerGauges",
    "MetricsBindError",
    "Traffic",
    "enable_broker",
    "enable_worker",
    "forget_task",
    "parse_metrics_port",
    "serve",
]

log = logging.getLogger("sluice.metrics")


class MetricsBindError(OSError):
    """The metrics endpoint's address cannot be bound."""


def parse_metrics_port(raw: str) -> int | None:
    """``metrics.port``: empty means no metrics endpoint; 0 a free port; else the port."""
    value = raw.strip()
    if not value:
        return None
    try:
        port = int(value)
    except ValueError:
        raise ValueError("expected a port number (0: a free port; empty: no metrics endpoint)") from None
    if not 0 <= port < 65536:
        raise ValueError("must be a port in 0..65535 (0: a free port; empty: no metrics endpoint)")
    return port


METRICS_PORT_DOC = "port of the Prometheus /metrics endpoint (0: a free port; absent or empty: none)"


def serve(port: int, host: str = "0.0.0.0", *, registry: CollectorRegistry = REGISTRY) -> int:
    """Serve ``registry`` at ``http://host:port/metrics`` from a daemon thread; returns the port
    bound (``port`` 0: a free one). Raises MetricsBindError naming the address if it cannot bind."""
    from prometheus_client import disable_created_metrics, start_http_server

    # The *_created series double every counter's and histogram's output for a figure no
    # dashboard here uses.
    disable_created_metrics()
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        error = MetricsBindError(
            f"metrics endpoint http://{host}:{port}/metrics cannot be bound: {exc.strerror or exc}; "
            "fix metrics.port (0 picks a free port, empty turns the endpoint off)"
        )
        error.errno = exc.errno
        raise error from None
    bound = int(server.server_port)
    assert bound > 0 and (port == 0 or bound == port), (port, bound)
    return bound


# -- broker ---------------------------------------------------------------------------------------

#: Upper bounds (seconds) of the request-time histogram: sub-millisecond metadata answers up to
#: fetch long polls (a follower's lasts up to 3 s, a consumer's up to its fetch.max.wait.ms).
REQUEST_SECONDS_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, math.inf,
)  # fmt: skip

LEADER_ELECTIONS = Counter(
    "sluice_leader_elections_total",
    "Partition leaders elected by this broker's controller (failover, controlled shutdown, "
    "reassignment; not a new partition's first leader)",
    registry=None,
)
UNCLEAN_ELECTIONS = Counter(
    "sluice_unclean_elections_total",
    "Of the leader elections, those of a replica outside the ISR (the topic allows it; data may be lost)",
    registry=None,
)
ISR_SHRINKS = Counter(
    "sluice_isr_shrinks_total",
    "ISR shrinks of partitions led here (the leader's lag check, or the controller dropping a dead follower)",
    registry=None,
)
ISR_EXPANDS = Counter(
    "sluice_isr_expands_total", "ISR expansions of partitions led here (a follower caught up)", registry=None
)
CONNECTIONS_REFUSED = Counter(
    "sluice_connections_refused_total",
    "Connections refused at accept, by the limit they hit (max_connections, max_connections_per_ip)",
    ["reason"],
    registry=None,
)
CONNECTIONS_CLOSED = Counter(
    "sluice_connections_closed_total",
    "Connections the broker closed for idling (idle), for a request that never arrived whole "
    "(slow_request), for not authenticating in time (unauthenticated), or for a request after "
    "its SASL session's lifetime (session_expired, KIP-368)",
    ["reason"],
    registry=None,
)
AUTHORIZATION_DENIED = Counter(
    "sluice_authorization_denied_total",
    "Requests, or parts of them (a topic, a group), the authorizer refused, by API and resource type",
    ["api", "resource_type"],
    registry=None,
)
AUTHENTICATIONS = Counter(
    "sluice_authentications_total",
    "SASL authentications on the broker's listeners, by listener and result (succeeded, failed)",
    ["listener", "result"],
    registry=None,
)
CONNECTION_COUNTERS = (CONNECTIONS_REFUSED, CONNECTIONS_CLOSED, AUTHENTICATIONS)
FETCH_RECORD_BYTES = Counter(
    "sluice_fetch_record_bytes_sent_total",
    "Record bytes of Fetch answers (consumers' and followers'), by how they were sent: from the "
    "segment files with sendfile (zero_copy), or read and written through the connection (copied: "
    "TLS connections, answers under 64 KiB)",
    ["path"],
    registry=None,
)


class ApiStats:
    """One API's request count and time histogram. Written by the broker's event loop only, so
    without a lock; a scrape reads it from another thread (ints and floats are read whole)."""

    __slots__ = ("buckets", "name", "seconds_sum")

    def __init__(self, name: str) -> None:
        self.name = name
        #: non-cumulative counts per bucket of REQUEST_SECONDS_BUCKETS
        self.buckets = [0] * len(REQUEST_SECONDS_BUCKETS)
        self.seconds_sum = 0.0

    def observe(self, seconds: float) -> None:
        # bisect_left: the first bound >= seconds, i.e. Prometheus's "le" bucket
        self.buckets[bisect.bisect_left(REQUEST_SECONDS_BUCKETS, seconds)] += 1
        self.seconds_sum += seconds


def api_name(key: int) -> str:
    """Kafka's name of an API key: PRODUCE -> Produce, OFFSET_FOR_LEADER_EPOCH -> OffsetForLeaderEpoch."""
    from sluice.protocol.api import ApiKey

    try:
        return "".join(part.capitalize() for part in ApiKey(key).name.split("_"))
    except ValueError:
        return f"Unknown{key}"


class Traffic:
    """The broker's request and byte counters, on its hot path: ``api(key)`` is a dict lookup,
    ``observe`` two increments. One writer (the event loop)."""

    def __init__(self) -> None:
        self._by_key: dict[int, ApiStats] = {}
        #: record bytes appended from Produce requests (not replication)
        self.bytes_in = 0
        #: record bytes answered to consumers' Fetch requests (not to followers)
        self.bytes_out = 0

    def api(self, key: int) -> ApiStats:
        stats = self._by_key.get(key)
        if stats is None:
            stats = self._by_key[key] = ApiStats(api_name(key))
        return stats

    def apis(self) -> list[ApiStats]:
        return list(self._by_key.values())


#: The broker process's traffic (one broker per process).
TRAFFIC = Traffic()


@dataclass(frozen=True, slots=True)
class BrokerGauges:
    """The broker's state gauges, computed at scrape time (``Broker.health_gauges``)."""

    partitions_offline: int
    partitions_under_replicated: int
    controller_active: int


class BrokerCollector(Collector):
    """The broker's metrics that are not plain prometheus_client objects: the traffic counters
    and histograms, and the state gauges read from ``gauges()`` at each scrape."""

    def __init__(self, traffic: Traffic, gauges: Callable[[], BrokerGauges] | None = None) -> None:
        self.traffic = traffic
        self.gauges = gauges

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "sluice_requests", "Requests handled, by Kafka API name", labels=["api"]
        )
        seconds = HistogramMetricFamily(
            "sluice_request_seconds",
            "Time from a request's decoding to its response handed to the socket (long polls included)",
            labels=["api"],
        )
        for stats in sorted(self.traffic.apis(), key=lambda s: s.name):
            counts = list(stats.buckets)  # one copy: the count is the sum of what is exported
            cumulative, total = [], 0
            for bound, n in zip(REQUEST_SECONDS_BUCKETS, counts, strict=True):
                total += n
                cumulative.append(("+Inf" if math.isinf(bound) else repr(bound), total))
            requests.add_metric([stats.name], total)
            seconds.add_metric([stats.name], cumulative, stats.seconds_sum)
        yield requests
        yield seconds
        yield CounterMetricFamily(
            "sluice_bytes_in",
            "Record bytes appended from producers' Produce requests (replication excluded)",
            value=self.traffic.bytes_in,
        )
        yield CounterMetricFamily(
            "sluice_bytes_out",
            "Record bytes answered to consumers' Fetch requests (replication excluded)",
            value=self.traffic.bytes_out,
        )
        if self.gauges is None:
            return
        try:
            g = self.gauges()
        except Exception:  # a scrape must not fail for it: the other metrics still tell a lot
            log.warning("event=metrics_gauges_failed", exc_info=True)
            return
        yield GaugeMetricFamily(
            "sluice_partitions_offline",
            "Partitions without a live leader (active controller only; 0 on other brokers)",
            value=g.partitions_offline,
        )
        yield GaugeMetricFamily(
            "sluice_partitions_under_replicated",
            "Partitions led here with a replica out of the ISR",
            value=g.partitions_under_replicated,
        )
        yield GaugeMetricFamily(
            "sluice_controller_active", "1 on the active controller, else 0", value=g.controller_active
        )


_enable_lock = threading.Lock()
_broker_collector: BrokerCollector | None = None
_worker_enabled = False


def enable_broker(gauges: Callable[[], BrokerGauges]) -> None:
    """Put the broker's metrics in the process's default registry (once; a later call only
    replaces where the state gauges come from: one broker per process)."""
    global _broker_collector
    with _enable_lock:
        if _broker_collector is not None:
            _broker_collector.gauges = gauges
            return
        _broker_collector = BrokerCollector(TRAFFIC, gauges)
        elections = (LEADER_ELECTIONS, UNCLEAN_ELECTIONS)
        for metric in (
            *elections,
            ISR_SHRINKS,
            ISR_EXPANDS,
            AUTHORIZATION_DENIED,
            *CONNECTION_COUNTERS,
            FETCH_RECORD_BYTES,
            _broker_collector,
        ):
            REGISTRY.register(metric)


# -- worker ---------------------------------------------------------------------------------------

#: Upper bounds (seconds) of a micro-batch's target commit: one transaction, milliseconds to
#: tens of seconds for a large snapshot batch.
APPLY_BATCH_SECONDS_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, math.inf,
)  # fmt: skip

TASK_LAG_RECORDS = Gauge(
    "sluice_task_lag_records",
    "Records in the task's topics not yet applied to its target",
    ["task"],
    registry=None,
)
TASK_LAG_SECONDS = Gauge(
    "sluice_task_lag_seconds",
    "Age (source commit time) of the oldest change not yet applied; 0 when caught up",
    ["task"],
    registry=None,
)
TASK_APPLY_BATCH_SECONDS = Histogram(
    "sluice_task_apply_batch_seconds",
    "Time of each micro-batch's commit to the target (one transaction)",
    ["task"],
    buckets=APPLY_BATCH_SECONDS_BUCKETS,
    registry=None,
)
TASK_COMMITS_REFUSED = Counter(
    "sluice_task_commits_refused_total",
    "Commits the target refused because a newer execution holds its fence (stale-commit-refused)",
    ["task"],
    registry=None,
)
TASK_DUPLICATE_EXECUTIONS = Counter(
    "sluice_task_duplicate_executions_total",
    "duplicate-execution alarms this worker raised",
    ["task"],
    registry=None,
)
TASK_DEAD_LETTERS = Counter(
    "sluice_task_dead_letters_total",
    "Changes the target refused that went to the task's dead-letter topic (on_refused: dlq)",
    ["task"],
    registry=None,
)
TASK_METRICS = (
    TASK_LAG_RECORDS,
    TASK_LAG_SECONDS,
    TASK_APPLY_BATCH_SECONDS,
    TASK_COMMITS_REFUSED,
    TASK_DUPLICATE_EXECUTIONS,
    TASK_DEAD_LETTERS,
)


def enable_worker() -> None:
    """Put the worker's metrics in the process's default registry (once)."""
    global _worker_enabled
    with _enable_lock:
        if not _worker_enabled:
            for metric in TASK_METRICS:
                REGISTRY.register(metric)
            _worker_enabled = True


def forget_task(task_id: str) -> None:
    """Remove a task's series: the worker no longer runs it (another worker reports it now)."""
    for metric in TASK_METRICS:
        metric.remove(task_id)  # a no-op for a task without series
