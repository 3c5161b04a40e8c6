"""Summaries and the report table."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


@dataclass
class Series:
    name: str
    unit: str
    values: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    @property
    def p90(self) -> float:
        return percentile(self.values, 90)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "median": self.median, "p90": self.p90, "n": len(self.values)}


@dataclass
class Figure:
    """One measured figure and its baseline from the same run."""

    title: str
    subject: Series
    baseline: Series
    target: str
    higher_is_better: bool = False
    notes: str = ""

    @property
    def ratio(self) -> float:
        """subject / baseline on the medians."""
        return self.subject.median / self.baseline.median if self.baseline.median else float("nan")

    def to_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "subject": self.subject.to_json(),
            "baseline": self.baseline.to_json(),
            "ratio": self.ratio,
            "target": self.target,
            "higher_is_better": self.higher_is_better,
            "notes": self.notes,
        }


def table(figures: list[Figure]) -> str:
    rows = [("figure", "subject median / p90", "baseline median / p90", "ratio", "target")]
    for f in figures:
        s, b = f.subject, f.baseline
        rows.append(
            (
                f.title,
                f"{s.median:.4g} / {s.p90:.4g} {s.unit} ({s.name}, n={len(s.values)})",
                f"{b.median:.4g} / {b.p90:.4g} {b.unit} ({b.name}, n={len(b.values)})",
                f"{f.ratio:.3f}",
                f.target,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += [f"{f.title}: {f.notes}" for f in figures if f.notes]
    return "\n".join(lines)
