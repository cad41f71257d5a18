"""The policy page's timeline, drawn on the server as SVG: no chart library, no script.

One x axis, the policy's steps (its versions); each series is a list of (step, value) points,
and markers are drawn at the steps where something happened (a promotion, a rejection, a
rollback, the version served now). Points whose value is None are gaps, not zeros.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

WIDTH, HEIGHT = 720, 220
LEFT, RIGHT, TOP, BOTTOM = 48, 16, 12, 28


@dataclass(frozen=True)
class Series:
    name: str
    points: list[tuple[int, float | None]]
    css: str  # the class that colours it (dashboard.css: .s-reward, .s-eval, ...)


@dataclass(frozen=True)
class Marker:
    step: int
    label: str  # what happened, shown on hover
    css: str  # m-promoted, m-rejected, m-rolled_back, m-serving


@dataclass
class Chart:
    title: str
    series: list[Series]
    markers: list[Marker] = field(default_factory=list)

    def bounds(self) -> tuple[int, int, float, float]:
        steps = [s for series in self.series for s, v in series.points if v is not None] + [m.step for m in self.markers]
        values = [v for series in self.series for _, v in series.points if v is not None and math.isfinite(v)]
        x0, x1 = (min(steps), max(steps)) if steps else (0, 1)
        y0, y1 = (min(values), max(values)) if values else (0.0, 1.0)
        if y0 == y1:  # a flat line sits in the middle
            y0, y1 = y0 - 0.5, y1 + 0.5
        return x0, max(x1, x0 + 1), y0, y1

    def svg(self) -> str:
        x0, x1, y0, y1 = self.bounds()
        plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

        def x(step: float) -> float:
            return LEFT + (step - x0) / (x1 - x0) * plot_w

        def y(value: float) -> float:
            return TOP + (1 - (value - y0) / (y1 - y0)) * plot_h

        out = [
            f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(self.title)}" xmlns="http://www.w3.org/2000/svg">',
            f"<title>{escape(self.title)}</title>",
        ]
        for value in (y0, (y0 + y1) / 2, y1):  # three horizontal guides, labelled
            out.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(value):.1f}" y2="{y(value):.1f}"/>')
            out.append(f'<text class="tick" x="{LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end">{value:.3g}</text>')
        for step in _ticks(x0, x1):
            out.append(f'<text class="tick" x="{x(step):.1f}" y="{HEIGHT - 8}" text-anchor="middle">{step}</text>')
        for marker in self.markers:
            out.append(
                f'<line class="marker {marker.css}" x1="{x(marker.step):.1f}" x2="{x(marker.step):.1f}" y1="{TOP}" y2="{TOP + plot_h}">'
                f"<title>step {marker.step}: {escape(marker.label)}</title></line>"
            )
        for series in self.series:
            for run in _runs(series.points):
                if len(run) > 1:
                    path = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in run)
                    out.append(f'<polyline class="line {series.css}" points="{path}"/>')
            for s, v in series.points:
                if v is not None and math.isfinite(v):
                    out.append(
                        f'<circle class="dot {series.css}" cx="{x(s):.1f}" cy="{y(v):.1f}" r="3"><title>{escape(series.name)} at step {s}: {v:.4g}</title></circle>'
                    )
        out.append("</svg>")
        return "".join(out)


def _runs(points: list[tuple[int, float | None]]) -> list[list[tuple[int, float]]]:
    """The points split at gaps (None, or not finite), each run drawn as one line."""
    runs: list[list[tuple[int, float]]] = [[]]
    for s, v in points:
        if v is None or not math.isfinite(v):
            runs.append([])
        else:
            runs[-1].append((s, v))
    return [r for r in runs if r]


def _ticks(x0: int, x1: int, most: int = 10) -> list[int]:
    every = max(1, math.ceil((x1 - x0) / most))
    return list(range(x0, x1 + 1, every))
