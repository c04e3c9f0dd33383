"""The command line's broker commands against a SASL_SSL cluster: with Kafka's
``--command-config client.properties`` they authenticate (topic, produce, consume, group), without
it the broker refuses them; no output shows the password."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.support.cluster import TestCluster


def sluice(*args: str, stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", *args],
        input=stdin, capture_output=True, text=True, timeout=90, cwd=cwd,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


def test_broker_commands_authenticate_with_the_command_config(
    make_cluster: Callable[..., TestCluster], tmp_path: Path
) -> None:
    c = make_cluster(1, security="sasl_ssl")
    assert c.client_properties is not None
    config = ["--command-config", str(c.client_properties)]
    b = ["-b", c.bootstrap]
    password = c.client_security().password
    assert password
    outputs: list[str] = []

    def ok(*args: str, stdin: str | None = None) -> str:
        done = sluice(*args, stdin=stdin, cwd=tmp_path)
        outputs.append(done.stdout + done.stderr)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return done.stdout

    ok("topic", "create", "secured", "-p", "2", "-r", "1", "--allow-single-replica", *b, *config)
    assert "secured" in ok("topic", "list", *b, *config).split()
    ok("topic", "describe", "secured", *b, *config)
    ok("produce", "secured", *b, *config, stdin="one\ntwo\nthree\n")
    got = ok("consume", "secured", "--from-beginning", "--max-messages", "3", "--timeout", "20", *b, *config)
    assert sorted(got.split()) == ["one", "three", "two"]
    ok("group", "list", *b, *config)
    # Without credentials the broker answers nothing but the SASL exchange.
    refused = sluice("group", "list", *b, cwd=tmp_path)
    outputs.append(refused.stdout + refused.stderr)
    assert refused.returncode != 0
    assert not any(password in text for text in outputs)
