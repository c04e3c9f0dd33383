"""Run a manager: connect to the cluster, start the lag sampler and the alarm evaluator, and
serve the API, console and metrics with uvicorn on a socket bound before anything else starts
(a port in use is refused at once, with the port named).

A manager keeps nothing of its own: users, tokens' key, audit log, alarms and rules live in
ZooKeeper; the charts' samples are a cache. Several managers may run against one cluster; one
of them at a time evaluates alarms (a ZooKeeper election inside the evaluator).
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from sluice.manager.app import ManagerState, create_app
from sluice.manager.audit import AuditLog
from sluice.manager.auth import UserStore
from sluice.manager.config import ManagerConfig
from sluice.manager.history import LagHistory, Sampler
from sluice.service import groups as group_service
from sluice.service.context import open_services

log = logging.getLogger("sluice.manager")


class ManagerBindError(OSError):
    pass


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ManagerBindError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another manager.port "
            "(or stop what holds it)"
        ) from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _metrics_registry(history: LagHistory) -> Any:
    """The manager's own registry (not the default one: a manager must not export a broker's
    series): group lag per partition, from the sampler's last pass."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector

    class GroupLag(Collector):
        def collect(self) -> Any:
            g = GaugeMetricFamily(
                "sluice_group_lag_records",
                "Records between a consumer group's committed offset and the partition's end",
                labels=["group", "topic", "partition"],
            )
            for (group, topic, partition), lag in sorted(history.group_partition_lag.items()):
                g.add_metric([group, topic, str(partition)], lag)
            yield g

    registry = CollectorRegistry()
    registry.register(GroupLag())
    return registry


@dataclass
class ManagerHandle:
    url: str
    state: ManagerState
    server: Any
    thread: threading.Thread
    sampler: Sampler
    #: set when the manager created the first admin user itself
    initial_admin: tuple[str, str] | None = None
    metrics_url: str | None = None

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sampler.stop()
        if self.state.evaluator is not None:
            try:
                self.state.evaluator.stop()
            except Exception:
                log.exception("event=evaluator_stop_failed")
        self.state.services.close()


def _sample(state: ManagerState) -> None:
    svc = state.services
    now = time.time()
    ids = svc.tasks.ids()
    for task_id in ids:
        status = svc.tasks.status(task_id) or {}
        state.history.add_task(task_id, now, status.get("lag_records"), status.get("lag_seconds"))
    state.history.forget_tasks(set(ids))
    # The brokers may be away: the task lags (from ZooKeeper) are sampled by then, and the
    # Sampler logs this failure.
    state.history.add_groups(now, group_service.group_lags(svc))


def _start_evaluator(state: ManagerState, config: ManagerConfig, identity: str) -> None:
    """Alarms: the store for the API, and this manager's candidate evaluator."""
    try:
        from sluice.manager.alarms.evaluator import AlarmEvaluator
        from sluice.manager.alarms.store import AlarmStore
    except ImportError:  # alarms not built into this copy
        log.warning("event=alarms_unavailable")
        return
    svc = state.services
    state.alarms = AlarmStore(svc.client)
    state.evaluator = AlarmEvaluator(
        svc.zk, svc.tasks, svc.bootstrap, identity=identity,
        interval_s=config.alarm_interval_ms / 1000.0, worker_group=config.worker_group,
    )  # fmt: skip
    state.evaluator.start()


def run_manager(
    zookeeper: str,
    bootstrap: str,
    *,
    port: int = 0,
    host: str = "127.0.0.1",
    config: ManagerConfig | None = None,
    create_admin: bool = True,
    alarms: bool = True,
) -> ManagerHandle:
    """Start a manager in this process (threads) and return once it serves."""
    import uvicorn

    config = config or ManagerConfig(bootstrap=bootstrap, zookeeper=zookeeper, host=host, port=port)
    sock = bind_socket(config.host, config.port)
    bound_port = sock.getsockname()[1]
    identity = config.name or f"{socket.gethostname()}:{bound_port}"
    try:
        services = open_services(
            config.zookeeper, config.bootstrap, worker_group=config.worker_group, zk_auth=config.zk_auth,
            security=config.security,
        )  # fmt: skip
    except Exception:
        sock.close()
        raise
    users = UserStore(services.client)
    initial_admin = None
    if create_admin and users.count() == 0:
        password = secrets.token_urlsafe(12)
        try:
            users.add("admin", password, "admin")
            initial_admin = ("admin", password)
        except ValueError:  # another manager created it a moment ago
            pass
    history = LagHistory()
    state = ManagerState(
        services=services, users=users, audit=AuditLog(services.client), history=history,
        token_ttl_s=config.token_ttl_s, name=identity, metrics_registry=_metrics_registry(history),
    )  # fmt: skip
    if alarms:
        _start_evaluator(state, config, identity)
    sampler = Sampler(lambda: _sample(state), config.sample_interval_ms / 1000.0)
    sampler.start()
    app = create_app(state)
    server = uvicorn.Server(
        uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=5
        )
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="sluice-manager-http",
                              daemon=True)  # fmt: skip
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            sampler.stop()
            services.close()
            raise RuntimeError("the manager's HTTP server did not start")
        time.sleep(0.02)
    shown = config.host if config.host not in ("0.0.0.0", "::") else socket.gethostname()
    metrics_url = None
    if config.metrics_port is not None:
        # Without credentials, so on an address of its own (metrics.host, loopback by default):
        # the manager's own port serves /metrics to a viewer's credentials only.
        from prometheus_client import start_http_server

        msock = bind_socket(config.metrics_host, config.metrics_port)
        mport = msock.getsockname()[1]
        msock.close()
        start_http_server(mport, addr=config.metrics_host, registry=state.metrics_registry)
        mshown = config.metrics_host if config.metrics_host not in ("0.0.0.0", "::") else socket.gethostname()
        metrics_url = f"http://{mshown}:{mport}/metrics"
    url = f"http://{shown}:{bound_port}"
    log.info("event=manager_started url=%s identity=%s", url, identity)
    return ManagerHandle(url, state, server, thread, sampler, initial_admin, metrics_url)
