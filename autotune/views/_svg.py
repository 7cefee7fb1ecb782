"""Small inline-SVG charts for the HTML report: axes with ticks, marks, lines, bars.

No plotting library and no script: each chart is a ``<svg>`` string a browser draws
without any network. Marks carry a ``<title>`` (the browser's tooltip) and a class the
tests look for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

FONT = "font-family:system-ui,sans-serif;font-size:12px"


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high] (1, 2 or 5 times a power of ten apart)."""
    if high <= low:
        high = low + 1.0
    raw = (high - low) / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(low / step) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        if value >= low - step * 1e-9:
            ticks.append(round(value, 10))
        value += step
    return ticks


def label(value: float) -> str:
    return f"{value:g}" if abs(value) < 1e5 else f"{value:.2g}"


@dataclass
class Axes:
    """A plot area: data ranges mapped onto a ``width`` x ``height`` pixel box."""

    x_low: float
    x_high: float
    y_low: float
    y_high: float
    width: int = 560
    height: int = 320
    left: int = 64
    right: int = 16
    top: int = 16
    bottom: int = 48

    def x(self, value: float) -> float:
        span = (self.x_high - self.x_low) or 1.0
        return self.left + (value - self.x_low) / span * (self.width - self.left - self.right)

    def y(self, value: float) -> float:
        span = (self.y_high - self.y_low) or 1.0
        inner = self.height - self.top - self.bottom
        return self.top + inner - (value - self.y_low) / span * inner

    def frame(self, x_title: str, y_title: str, *, y_ticks: bool = True) -> list[str]:
        """Axis lines, grid, ticks and titles (rows of named items have no y ticks)."""
        parts = []
        bottom, right = self.height - self.bottom, self.width - self.right
        for tick in nice_ticks(self.x_low, self.x_high):
            px = self.x(tick)
            parts.append(line(px, self.top, px, bottom, "#e5e5e5", 1))
            parts.append(text(px, bottom + 16, label(tick), anchor="middle"))
        for tick in nice_ticks(self.y_low, self.y_high) if y_ticks else []:
            py = self.y(tick)
            parts.append(line(self.left, py, right, py, "#e5e5e5", 1))
            parts.append(text(self.left - 6, py + 4, label(tick), anchor="end"))
        parts.append(line(self.left, bottom, right, bottom, "#333333", 1))
        parts.append(line(self.left, self.top, self.left, bottom, "#333333", 1))
        parts.append(text((self.left + right) / 2, self.height - 8, x_title, anchor="middle"))
        parts.append(
            f'<text x="14" y="{(self.top + bottom) / 2:.1f}" text-anchor="middle" '
            f'transform="rotate(-90 14 {(self.top + bottom) / 2:.1f})" style="{FONT}">'
            f"{escape(y_title)}</text>"
        )
        return parts


def chart(axes: Axes, parts: list[str], *, chart_id: str, title: str) -> str:
    return (
        f'<svg id="{chart_id}" class="chart" xmlns="http://www.w3.org/2000/svg" '
        f'width="{axes.width}" height="{axes.height}" viewBox="0 0 {axes.width} {axes.height}" '
        f'role="img" aria-label="{escape(title)}">' + "".join(parts) + "</svg>"
    )


def line(
    x1: float, y1: float, x2: float, y2: float, color: str, width: float, dash: str = ""
) -> str:
    dashed = f' stroke-dasharray="{dash}"' if dash else ""
    return (
        f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{color}" '
        f'stroke-width="{width}"{dashed}/>'
    )


def text(x: float, y: float, words: str, *, anchor: str = "start", color: str = "#333") -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" fill="{color}" '
        f'style="{FONT}">{escape(words)}</text>'
    )


def _title(tip: str) -> str:
    return f"<title>{escape(tip)}</title>" if tip else ""


def dot(x: float, y: float, color: str, *, tip: str, css: str, r: float = 6, hollow=False) -> str:
    fill = "white" if hollow else color
    return (
        f'<circle class="{css}" cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{fill}" '
        f'stroke="{color}" stroke-width="2">{_title(tip)}</circle>'
    )


def cross(x: float, y: float, color: str, *, tip: str, css: str, r: float = 6) -> str:
    left, right, up, down = x - r, x + r, y - r, y + r
    d = f"M{left:.1f},{up:.1f}L{right:.1f},{down:.1f}M{left:.1f},{down:.1f}L{right:.1f},{up:.1f}"
    return (
        f'<path class="{css}" d="{d}" stroke="{color}" stroke-width="3" fill="none">'
        f"{_title(tip)}</path>"
    )


def triangle(x: float, y: float, color: str, *, tip: str, css: str, r: float = 7) -> str:
    d = f"M{x:.1f},{y - r:.1f}L{x + r:.1f},{y + r * 0.8:.1f}L{x - r:.1f},{y + r * 0.8:.1f}Z"
    return f'<path class="{css}" d="{d}" fill="{color}">{_title(tip)}</path>'


def star(x: float, y: float, color: str, *, tip: str, css: str, r: float = 13) -> str:
    points = []
    for i in range(10):
        radius = r if i % 2 == 0 else r * 0.45
        angle = math.pi / 2 + i * math.pi / 5
        points.append(f"{x + radius * math.cos(angle):.1f},{y - radius * math.sin(angle):.1f}")
    return (
        f'<polygon class="{css}" points="{" ".join(points)}" fill="{color}" stroke="#7a5a00" '
        f'stroke-width="1">{_title(tip)}</polygon>'
    )


def polyline(points: list[tuple[float, float]], color: str, *, css: str, width: float = 2) -> str:
    coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    return (
        f'<polyline class="{css}" points="{coords}" fill="none" stroke="{color}" '
        f'stroke-width="{width}"/>'
    )


def rect(x: float, y: float, w: float, h: float, color: str, *, tip: str, css: str) -> str:
    return (
        f'<rect class="{css}" x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.1f}" '
        f'height="{max(h, 0):.1f}" fill="{color}">{_title(tip)}</rect>'
    )


def legend(items: list[tuple[str, str]], x: float, y: float) -> list[str]:
    """A row of colour swatches with their names."""
    parts = []
    for color, name in items:
        parts.append(f'<rect x="{x:.1f}" y="{y - 9:.1f}" width="10" height="10" fill="{color}"/>')
        parts.append(text(x + 14, y, name))
        x += 24 + 7 * len(name)
    return parts
