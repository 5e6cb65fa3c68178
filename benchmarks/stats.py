"""Summaries of repeated measurements: median and range per system, and Fluvial/Kafka ratios round by round."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Summary:
    """The counted (non-warm-up) values of one figure on one system."""

    median: float
    min: float
    max: float
    n: int

    def to_json(self) -> dict[str, float | int]:
        return asdict(self)


def summarize(values: Sequence[float]) -> Summary | None:
    """None when nothing was measured (every round failed)."""
    if not values:
        return None
    return Summary(median=statistics.median(values), min=min(values), max=max(values), n=len(values))


def paired_ratios(fluvial: Mapping[int, float], kafka: Mapping[int, float]) -> list[float]:
    """Fluvial/Kafka per round, only for rounds where both were measured: a round pairs two
    runs taken back to back, so drift of the machine between rounds cancels out."""
    return [fluvial[r] / kafka[r] for r in sorted(fluvial.keys() & kafka.keys()) if kafka[r] != 0]


def ratio_summary(fluvial: Mapping[int, float], kafka: Mapping[int, float]) -> Summary | None:
    return summarize(paired_ratios(fluvial, kafka))


def counted(values_by_round: Mapping[int, float], warmup_rounds: int) -> dict[int, float]:
    """Drops the warm-up rounds (numbered from 0)."""
    return {r: v for r, v in values_by_round.items() if r >= warmup_rounds}


def format_value(value: float) -> str:
    """Three significant figures, thousands separated: figures, not noise."""
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def format_summary(summary: Summary | None) -> str:
    if summary is None:
        return "failed"
    if summary.n == 1:
        return format_value(summary.median)
    return f"{format_value(summary.median)} ({format_value(summary.min)}–{format_value(summary.max)})"


def format_ratio(summary: Summary | None) -> str:
    if summary is None:
        return "–"
    if summary.n == 1:
        return f"{summary.median:.2f}×"
    return f"{summary.median:.2f}× ({summary.min:.2f}–{summary.max:.2f})"
