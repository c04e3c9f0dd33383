"""docs/reference/configuration.md is written from the settings tables the processes read, and the
committed page is the one the code writes today."""

from __future__ import annotations

from pathlib import Path

from sluice.broker.config import BROKER_SETTINGS
from sluice.ops import config_reference
from sluice.ops.config_reference import default_of, page
from sluice.sync.worker_config import WORKER_SETTINGS, WorkerConfig

PAGE = Path(__file__).parents[2] / "docs" / "reference" / "configuration.md"


def test_the_committed_configuration_reference_is_the_generated_one() -> None:
    assert PAGE.read_text() == page(), (
        "docs/reference/configuration.md differs from the settings tables: write it again with "
        "`.venv/bin/python -m sluice.ops.config_reference docs/reference/configuration.md`"
    )


def test_every_key_of_every_table_is_on_the_page() -> None:
    text = page()
    for file in config_reference.FILES:
        for setting in file.settings:
            assert f"| `{setting.key}` |" in text, setting.key


def test_defaults_come_from_the_fields_the_keys_fill_in_the_keys_unit() -> None:
    by_key = {s.key: s for s in BROKER_SETTINGS}
    broker = config_reference.FILES[0].config
    assert default_of(by_key["zookeeper.session.timeout.ms"], broker) == 6000  # field: 6.0 s
    assert default_of(by_key["offsets.retention.minutes"], broker) == 7 * 24 * 60
    assert default_of(by_key["log.cleaner.threads"], broker) == 1
    assert default_of(by_key["log.retention.ms"], broker) == 7 * 24 * 3600 * 1000  # topic default
    worker = {s.key: s for s in WORKER_SETTINGS}
    assert default_of(worker["group.id"], WorkerConfig) == "sluice-workers"
    assert default_of(worker["session.timeout.ms"], WorkerConfig) == 10_000


def test_a_required_key_says_so(tmp_path: Path) -> None:
    assert "| `broker.id` | *required* |" in page()
    config_reference.main([str(tmp_path / "configuration.md")])
    assert (tmp_path / "configuration.md").read_text() == page()
