"""What a drill returns: the checker's rows (acknowledged, read, lost, duplicated ... per
writer), the guarantees it checked, and its timeline. Below every drill (incidents.py,
incidents_kafka.py, zombie.py, random_run.py) and the CLI that prints them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Row:
    label: str
    acknowledged: int
    read: int
    lost: int
    duplicated: int
    out_of_order: int
    failed_sends: int
    errors: dict[str, int] = field(default_factory=dict)
    lost_examples: list[str] = field(default_factory=list)
    #: per writer (the ``{writer}`` of the values): a row may mix a workload and a drill's own client
    acknowledged_by_writer: dict[str, int] = field(default_factory=dict)
    lost_by_writer: dict[str, int] = field(default_factory=dict)


@dataclass
class Check:
    guarantee: str
    passed: bool
    detail: str


@dataclass
class IncidentResult:
    name: str
    rows: list[Row] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    timeline: list[tuple[float, str]] = field(default_factory=list)
    #: a drill that compares a target with its source: the last comparison's (missing, extra,
    #: different) rows
    target_rows_wrong: tuple[int, int, int] | None = None

    @property
    def ok(self) -> bool:
        return all(c.passed for c in self.checks)
