"""`sluice peer`: run Apache Kafka locally beside Sluice, for side-by-side benchmarks and drills."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sluice.cli.common import fail
from sluice.peers.kafka import HEAP, SECURITY_MODES, PeerError, peer_down, peer_up

peer_app = typer.Typer(
    no_args_is_help=True,
    help="Run a peer (Apache Kafka, from the jars scripts/peers.sh fetches) to measure Sluice beside.",
)

PeerDir = Annotated[Path, typer.Option("--dir", help="Directory of the peer cluster")]
DEFAULT_DIR = Path(".sluice-peer")


@peer_app.command("up")
def up(
    kind: Annotated[str, typer.Argument(help="The peer: kafka")],
    brokers: Annotated[int, typer.Option("--brokers", help="Number of brokers")] = 1,
    kraft: Annotated[
        bool, typer.Option("--kraft", help="KRaft mode (Kafka 4.x) instead of ZooKeeper")
    ] = False,
    zookeeper: Annotated[
        str | None, typer.Option("--zookeeper", help="Use this ZooKeeper (HOST:PORT) instead of starting one")
    ] = None,
    heap: Annotated[
        str,
        typer.Option(
            "--heap",
            help="Each broker JVM's maximum heap (-Xmx), e.g. 512m, 2g; more for thousands of partitions",
        ),
    ] = HEAP,
    security: Annotated[
        str,
        typer.Option(
            "--security",
            help=f"{' or '.join(SECURITY_MODES)}: a SASL_PLAINTEXT (or SASL_SSL, with a local CA in DIR/tls) "
            "listener with SCRAM and Kafka's AclAuthorizer, the super user admin (its client properties "
            "in DIR/client.properties; ZooKeeper mode)",
        ),
    ] = "none",
    directory: PeerDir = DEFAULT_DIR,
) -> None:
    """Start a local peer cluster and print its bootstrap.servers, as `sluice cluster up` does."""
    if kind != "kafka":
        raise fail(f"unknown peer {kind!r}: the one peer is kafka")
    if kraft and zookeeper is not None:
        raise fail(
            "--kraft and --zookeeper exclude each other: KRaft mode (Kafka 4.x) runs without "
            "ZooKeeper; leave out --zookeeper, or leave out --kraft for ZooKeeper mode (Kafka 3.9)"
        )
    try:
        cluster = peer_up(directory, brokers, zookeeper=zookeeper, kraft=kraft, heap=heap, security=security)
    except PeerError as exc:
        raise fail(str(exc)) from None
    print(f"bootstrap.servers={cluster.bootstrap_servers}")
    if cluster.kraft:
        print(f"controller.quorum.voters={cluster.controller_quorum_voters}")
        print(f"cluster_id={cluster.cluster_id}")
    else:
        print(f"zookeeper={cluster.zookeeper}")
    print(f"kafka_version={cluster.version}")
    print(f"mode={cluster.mode}")
    print(f"heap={cluster.heap}")
    print(f"security={cluster.security}")
    if cluster.client_properties is not None:
        print(f"client_properties={cluster.client_properties}")
    print(f"dir={cluster.directory}")


@peer_app.command("down")
def down(directory: PeerDir = DEFAULT_DIR) -> None:
    """Stop the peer cluster in --dir (controlled shutdown, then SIGKILL after 30 s)."""
    try:
        cluster = peer_down(directory)
    except PeerError as exc:
        raise fail(str(exc)) from None
    print(f"stopped={len(cluster.brokers)} dir={cluster.directory}")
