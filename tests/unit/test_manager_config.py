"""The manager's configuration and password hashing, without a cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.manager.auth import Principal, check_password, hash_password
from sluice.manager.config import ManagerConfig
from sluice.properties import ConfigError, read_properties

REPO = Path(__file__).resolve().parents[2]


def test_the_example_manager_properties_parse() -> None:
    c = ManagerConfig.from_properties(read_properties(REPO / "deploy/config/manager.properties"))
    assert c.host == "0.0.0.0" and c.port == 8090 and c.metrics_port == 9308
    assert c.zookeeper.endswith("/sluice") and c.token_ttl_s == 720 * 60


def test_a_bad_manager_key_or_value_is_refused_naming_it() -> None:
    base = {"bootstrap.servers": "h:9092", "zookeeper.connect": "z:2181"}
    with pytest.raises(ConfigError, match=r"did you mean .manager\.port."):
        ManagerConfig.from_properties({**base, "manager.prot": "1"})
    with pytest.raises(ConfigError, match=r"'manager\.port'"):
        ManagerConfig.from_properties({**base, "manager.port": "70000"})
    with pytest.raises(ConfigError, match=r"'zookeeper\.connect' is required"):
        ManagerConfig.from_properties({"bootstrap.servers": "h:9092"})


def test_passwords_are_stored_salted_and_checked_in_constant_time() -> None:
    a, b = hash_password("correct horse"), hash_password("correct horse")
    assert a != b and "correct horse" not in a and a.startswith("scrypt$")
    assert check_password("correct horse", a) and check_password("correct horse", b)
    assert not check_password("correct hors", a)
    assert not check_password("x", "not-a-hash") and not check_password("x", "md5$1$2$3$4$5")


def test_roles_are_ordered_viewer_operator_admin() -> None:
    assert Principal("a", "admin").can("operator") and Principal("o", "operator").can("viewer")
    assert not Principal("v", "viewer").can("operator") and not Principal("o", "operator").can("admin")
