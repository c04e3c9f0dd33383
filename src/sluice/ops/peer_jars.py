"""Where the peers' jars are (fetched and pinned by scripts/peers.sh): Apache Kafka's, for the
peer clusters (sluice.peers) and for the Java clients the chaos runs drive (chaos.workload).
"""

from __future__ import annotations

import os
from pathlib import Path

#: The pinned Kafka version (``bench/peers/pom.xml``'s ``kafka.version``).
KAFKA_VERSION = "3.9.1"
#: The pinned Kafka for KRaft mode (``bench/peers/kafka4/pom.xml``'s ``kafka.version``; Java 17+).
KRAFT_VERSION = "4.1.1"


class PeerError(Exception):
    """A peer cluster cannot be started or stopped; the message says what to do next."""


def _project_root() -> Path:
    return Path(__file__).resolve().parents[3]


def kafka_libs(version: str = KAFKA_VERSION) -> Path:
    """The directory of Kafka ``version``'s jars. ``SLUICE_PEERS_DIR`` overrides where peers are
    kept (default: ``.peers`` in the project). Raises PeerError naming the set-up step."""
    base = Path(os.environ.get("SLUICE_PEERS_DIR") or _project_root() / ".peers")
    libs = base / f"kafka-{version}" / "libs"
    if not (libs.parent / ".complete").is_file():
        raise PeerError(
            f"Kafka {version} is not fetched (no {libs}): run scripts/peers.sh (needs Maven and "
            "Maven Central)"
        )
    return libs
