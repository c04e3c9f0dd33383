"""The README's main command, shortened: `sluice demo` ends with the target equal to the truth,
and serves the manager's console while it runs, with the demo's cluster, topic and apply lag."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest


@pytest.mark.parametrize(
    # sasl_ssl: TLS, SCRAM and ACLs; the demo's topic creation, generator, apply query (its Spark
    # executors too), offset mirror and manager authenticate, and the cluster's brokers replicate
    # over authenticated connections
    "security",
    ["none", pytest.param("sasl_ssl", marks=pytest.mark.slow)],
)
def test_demo_ends_with_the_target_equal_to_the_source(tmp_path: Path, security: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sluice.ops.cli", "demo", "--dir", str(tmp_path / "demo"),
         "--duration", "14", "--rate", "1000", "--security", security],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    seen: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    printed: dict[str, str] = {}
    apply_lag_seen: list[int] = []
    demo_topic_seen = False
    try:
        deadline = time.monotonic() + 280
        while proc.poll() is None or not lines.empty():
            assert time.monotonic() < deadline, "".join(seen)[-4000:]
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                line = ""
            if line:
                seen.append(line)
                key, sep, value = line.strip().partition("=")
                if sep and key in ("manager", "manager_user", "manager_password"):
                    printed[key] = value
            if len(printed) == 3 and proc.poll() is None and not (demo_topic_seen and apply_lag_seen):
                # While the demo runs, its console shows the cluster, its topic and the apply lag.
                try:
                    c = httpx.Client(base_url=printed["manager"], auth=(printed["manager_user"],
                                     printed["manager_password"]), timeout=5)  # fmt: skip
                    overview = c.get("/api/v1/overview").json()
                    assert len(overview["cluster"]["brokers"]) == 3
                    topics = [t["name"] for t in c.get("/api/v1/topics").json()]
                    demo_topic_seen = demo_topic_seen or "demo.changes" in topics
                    history = c.get("/api/v1/groups/demo-apply/lag-history").json()["samples"]
                    if history:
                        apply_lag_seen.append(max(s["lag"] for s in history))
                except httpx.HTTPError:
                    pass  # the demo ended between two lines
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    text = "".join(seen)
    assert proc.returncode == 0, text[-4000:]
    assert "OK: the target equals the source" in text
    assert "kill -9 of broker" in text and "restarted" in text
    assert "missing" in text and "different" in text  # the comparison table was printed
    assert "cluster stopped" in text
    assert printed.get("manager", "").startswith("http://"), text[-2000:]
    assert demo_topic_seen, "the console never listed the demo's topic"
    warnings = [line for line in seen if "event=" in line]
    assert apply_lag_seen, f"the console never showed the demo's apply lag; the demo logged: {warnings[-20:]}"


@pytest.mark.timeout(480)  # under the full suite's load its steps took 146 s; its own waits are bounded
def test_demo_with_a_mariadb_source_ends_verified_with_the_refused_row_dead_lettered(tmp_path: Path) -> None:
    """`sluice demo --source mariadb`: two workers capture a MariaDB through an added, a dropped, a
    renamed and a widened column, a re-snapshot, an added table and a row the target refuses; it
    exits 0 only when `sluice task verify` finds source and target equal and the refused row is
    in the dead-letter topic."""
    done = subprocess.run(
        [sys.executable, "-m", "sluice.ops.cli", "demo", "--source", "mariadb",
         "--dir", str(tmp_path / "demo"), "--duration", "24"],
        capture_output=True, text=True, timeout=440,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    for step in ("a column added", "a column dropped", "a column renamed", "a column widened",
                 "sluice task snapshot shop --table orders", "refunds added to the task",
                 "refused by the target and dead-lettered"):  # fmt: skip
        assert step in out, f"{step!r} not in the demo's output:\n{out[-4000:]}"
    assert "verified=true" in out
    assert "refused_row_in_dlq=true" in out
    verified = {
        fields["table"]: fields
        for line in out.splitlines()
        if line.strip().startswith("verify table=")
        for fields in [dict(kv.split("=", 1) for kv in line.split()[1:])]
    }
    assert sorted(verified) == ["customers", "orders", "refunds"], out[-4000:]
    for table, fields in verified.items():
        assert int(fields["rows"]) > 0, table
        assert (fields["missing"], fields["extra"], fields["different"]) == ("0", "0", "0"), fields
