"""Sluice beside Apache Kafka in one benchmark run (issue 20): which systems to run, in which
order each round, and how each figure is printed.

Pure helpers, shared by ``produce.py``, ``latency.py``, ``consume.py``, ``failover.py`` and
``scale.py``. Every compared figure prints as two lines, the format the issue fixes::

    client_mb_s sluice=131.2 kafka=117.0
    client_mb_s ratio sluice/kafka=1.12

For a latency or a duration a ratio below 1 means Sluice is faster. With several rounds each
value is the median of the rounds, and the ratio is the ratio of the medians.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

SYSTEMS = ("sluice", "kafka")


def parse_against(text: str) -> list[str]:
    """``"sluice,kafka"`` -> ``["sluice", "kafka"]``; ValueError naming what is accepted."""
    systems = [s.strip() for s in text.split(",") if s.strip()]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if not systems or unknown or len(set(systems)) != len(systems):
        raise ValueError(f"--against takes sluice and/or kafka, comma-separated, each once (got {text!r})")
    return systems


def parse_systems(ap: Any, args: Any) -> None:
    """A benchmark's ``--against`` into ``args.systems`` and its ``--rounds`` defaulted (2 with
    Kafka in the run, else 1); a bad value through ``ap.error`` (argparse's exit)."""
    try:
        args.systems = parse_against(args.against)
    except ValueError as exc:
        ap.error(str(exc))
    if args.rounds is None:
        args.rounds = 2 if "kafka" in args.systems else 1
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")


def round_orders(systems: list[str], rounds: int) -> list[list[str]]:
    """The order of the systems in each round: rotated by one each round, so that none is always
    first (first meets a machine that another system's run has not yet loaded or cooled)."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    n = len(systems)
    return [systems[r % n :] + systems[: r % n] for r in range(rounds)]


def median(values: Iterable[float]) -> float:
    """The median of the finite values; NaN when there is none (a figure not measured)."""
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else float("nan")


def ratio(ours: float, theirs: float) -> float:
    """Sluice's value over Kafka's; NaN when Kafka's is zero or either is missing."""
    if math.isnan(ours) or math.isnan(theirs) or theirs == 0:
        return float("nan")
    return ours / theirs


def figure_value(text: str | None) -> float:
    """A figure printed as text, as a number: ``"3.20"`` -> 3.2, ``"b1:1.0,b2:3.0"`` -> 2.0 (the
    mean over the brokers), ``"timeout"``, ``"-"`` or missing -> NaN."""
    if text is None:
        return float("nan")
    try:
        values = [float(part.split(":", 1)[-1]) for part in text.split(",")]
    except ValueError:
        return float("nan")
    return sum(values) / len(values)


def figure_lines(name: str, ours: float, theirs: float, digits: int = 1, peer: str = "kafka") -> list[str]:
    """The two lines of one compared figure (``peer``: the other system's name, e.g. debezium for
    the whole pipeline's stack)."""
    return [
        f"{name} sluice={ours:.{digits}f} {peer}={theirs:.{digits}f}",
        f"{name} ratio sluice/{peer}={ratio(ours, theirs):.2f}",
    ]


def median_figures(
    rounds: Iterable[Mapping[str, Mapping[str, float]]],
) -> list[tuple[str, float, float]]:
    """From each round's ``{figure: {"sluice": x, "kafka": y}}``: (figure, median of Sluice's
    values, median of Kafka's), in the order figures first appear, for figures both have."""
    seen: dict[str, dict[str, list[float]]] = {}
    for one in rounds:
        for name, by_system in one.items():
            slot = seen.setdefault(name, {s: [] for s in SYSTEMS})
            for system, value in by_system.items():
                slot[system].append(float(value))
    out = []
    for name, slot in seen.items():
        if slot["sluice"] and slot["kafka"]:
            out.append((name, median(slot["sluice"]), median(slot["kafka"])))
    return out


def add_figure(
    figures: list[tuple[str, float, float]], name: str, per_system: Mapping[str, float], systems: list[str]
) -> None:
    """One figure's per-system medians: kept to compare when both systems ran, printed alone
    when one did."""
    if len(systems) == 2:
        figures.append((name, per_system["sluice"], per_system["kafka"]))
    else:
        print(f"{name} {systems[0]}={per_system[systems[0]]:.2f}", flush=True)


def print_figures(figures: Iterable[tuple[str, float, float]], digits: int = 1, peer: str = "kafka") -> None:
    for name, ours, theirs in figures:
        for line in figure_lines(name, ours, theirs, digits, peer):
            print(line, flush=True)


def ratios_json(figures: Iterable[tuple[str, float, float]]) -> dict[str, float]:
    """``{figure: ratio}`` rounded for the JSON line, figures without a ratio left out."""
    out = {}
    for name, ours, theirs in figures:
        r = ratio(ours, theirs)
        if not math.isnan(r):
            out[name] = round(r, 3)
    return out


def finite(obj: Any) -> Any:
    """``obj`` with every NaN float (a figure not measured) and infinity (a figure that never
    came, e.g. a freshness whose marker was never seen) replaced by None, so that the JSON line
    is strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj
