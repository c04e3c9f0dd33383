"""A root FORWARD chain that would drop bridged traffic is named before a network is made
(otherwise every host reaches the root namespace but no other host, and a cluster never forms)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from sluice.ops import netns


@pytest.mark.parametrize(
    ("bridge_nf", "policy", "blocked"),
    [("1", "-P FORWARD DROP", True), ("1", "-P FORWARD ACCEPT", False), ("0", "-P FORWARD DROP", False)],
)
def test_a_forward_drop_policy_that_bridged_packets_pass_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bridge_nf: str, policy: str, blocked: bool
) -> None:
    proc_file = tmp_path / "bridge-nf-call-iptables"
    proc_file.write_text(bridge_nf + "\n")
    monkeypatch.setattr(netns, "_BRIDGE_NF_CALL_IPTABLES", proc_file)

    def fake_run(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        assert argv == ["iptables", "-S", "FORWARD"]
        return subprocess.CompletedProcess(argv, 0, f"{policy}\n-A FORWARD -j DOCKER-USER\n", "")

    monkeypatch.setattr(netns.subprocess, "run", fake_run)
    monkeypatch.setattr(netns.shutil, "which", lambda _tool: "/usr/sbin/iptables")
    reason = netns._bridged_traffic_blocked()
    assert (reason is not None) is blocked
    if blocked:
        assert reason is not None and "FORWARD policy is DROP" in reason and "sysctl" in reason
