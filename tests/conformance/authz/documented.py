"""The differences docs/COMPATIBILITY.md lists in its section "Authorization, API by API": a
table whose rows name an API, a case, the principals (variants) it concerns, Kafka's and
Sluice's answers as `answers.render` writes them, and why. A difference is documented when a
row names its API and case, lists its principal and shows exactly its two answers."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

COMPATIBILITY = Path(__file__).resolve().parents[3] / "docs" / "COMPATIBILITY.md"
SECTION = "## Authorization, API by API"
HEADER = ("API", "case", "principals", "Kafka", "Sluice", "why")


@dataclass(frozen=True, slots=True)
class Row:
    api: str
    case: str
    principals: frozenset[str]
    kafka: str
    sluice: str
    why: str


def _cell(text: str) -> str:
    text = text.strip()
    if text.startswith("`") and text.endswith("`"):
        text = text[1:-1]
    return re.sub(r"\s+", " ", text)


def rows(path: Path = COMPATIBILITY) -> list[Row]:
    """The section's table rows (an empty list when the section has none)."""
    text = path.read_text()
    start = text.find(SECTION)
    if start < 0:
        return []
    end = text.find("\n## ", start + len(SECTION))
    section = text[start : end if end >= 0 else len(text)]
    out = []
    in_table = False
    for line in section.splitlines():
        if not line.startswith("|"):
            in_table = False
            continue
        cells = [c for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if tuple(_cell(c) for c in cells) == HEADER:
            in_table = True
            continue
        if not in_table or set(line.replace("|", "").strip()) <= {"-", " ", ":"}:
            continue
        api, case, principals, kafka, sluice, why = (_cell(c.replace("\\|", "|")) for c in cells)
        out.append(
            Row(api, case, frozenset(p.strip().strip("`") for p in principals.split(",")), kafka, sluice, why)
        )
    return out


@dataclass(frozen=True, slots=True)
class Difference:
    """One principal's answers that differ: ``kafka`` and ``sluice`` as `answers.render` writes them."""

    api: str
    case: str
    principal: str
    kafka: str
    sluice: str


def judge(found: list[Difference], listed: list[Row]) -> tuple[list[Difference], list[str]]:
    """(the differences no row documents, a line for each listed principal whose difference no
    longer occurs). A row documents a difference when it names its API and case, lists its
    principal and shows exactly its two answers."""
    rows = {(r.api, r.case, r.kafka, r.sluice): r for r in listed}
    seen: dict[tuple[str, str, str, str], set[str]] = {}
    undocumented = []
    for d in found:
        key = (d.api, d.case, d.kafka, d.sluice)
        row = rows.get(key)
        if row is None or d.principal not in row.principals:
            undocumented.append(d)
        seen.setdefault(key, set()).add(d.principal)
    stale = [
        f"{r.api} {r.case} {sorted(gone)}: kafka={r.kafka!r} sluice={r.sluice!r}"
        for key, r in rows.items()
        if (gone := r.principals - seen.get(key, set()))
    ]
    return undocumented, stale
