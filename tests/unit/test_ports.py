"""Ports for local servers come from below the kernel's ephemeral range, where no outgoing
connection can take one between the pick and the server's bind (or a restart)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from sluice.ops import ports


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    low, _ = ports.ephemeral_range()
    picked = ports.free_ports(50)
    assert len(set(picked)) == 50
    assert all(ports.LOWEST_PORT <= p < low for p in picked)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.free_port()))


def test_the_range_is_read_from_the_kernel_and_defaults_to_linuxs(tmp_path: Path) -> None:
    f = tmp_path / "range"
    f.write_text("40000\t60999\n")
    assert ports.ephemeral_range(str(f)) == (40000, 60999)
    assert ports.ephemeral_range(str(tmp_path / "missing")) == (32768, 60999)


def test_a_range_starting_too_low_falls_back_to_a_kernel_chosen_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (ports.LOWEST_PORT + 10, 60999))
    assert ports.free_port() >= ports.LOWEST_PORT + 10  # bound by the kernel, in its own range
