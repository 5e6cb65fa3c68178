"""Line charts as inline SVG, drawn on the server: no script library, nothing to fetch."""
from __future__ import annotations

import time
from html import escape

from fluvial.broker.metrics_history import Series

WIDTH, HEIGHT = 640, 180
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 64, 12, 12, 28
# Colour-blind-safe line colours (Okabe-Ito).
COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")


def human(value: float) -> str:
    """1234567 -> 1.23M: axis labels that fit."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"


def line_chart(title: str, series: list[Series], *, chart_id: str = "") -> str:
    """An SVG line chart of the series (shared time and value axes), with a legend."""
    points = [p for s in series for p in s.points]
    head = f'<figure class="chart" id="{escape(chart_id)}"><figcaption>{escape(title)}</figcaption>'
    if len(points) < 2:
        return head + '<p class="empty">Collecting samples: the chart fills in within a few sampling intervals.</p></figure>'
    t0 = min(t for t, _ in points)
    t1 = max(t for t, _ in points)
    top = max(v for _, v in points)
    top = top * 1.1 if top > 0 else 1.0
    span_t = max(t1 - t0, 1e-9)
    plot_w = WIDTH - PAD_LEFT - PAD_RIGHT
    plot_h = HEIGHT - PAD_TOP - PAD_BOTTOM

    def x(t: float) -> float:
        return PAD_LEFT + (t - t0) / span_t * plot_w

    def y(v: float) -> float:
        return PAD_TOP + plot_h - v / top * plot_h

    parts = [f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}" '
             f'xmlns="http://www.w3.org/2000/svg">']
    for i in range(5):  # horizontal grid lines with value labels
        v = top * i / 4
        yy = y(v)
        parts.append(f'<line class="grid" x1="{PAD_LEFT}" y1="{yy:.1f}" x2="{WIDTH - PAD_RIGHT}" y2="{yy:.1f}"/>')
        parts.append(f'<text class="axis" x="{PAD_LEFT - 6}" y="{yy + 4:.1f}" text-anchor="end">{human(v)}</text>')
    for t, anchor in ((t0, "start"), (t1, "end")):
        label = time.strftime("%H:%M:%S", time.localtime(t))
        parts.append(f'<text class="axis" x="{x(t):.1f}" y="{HEIGHT - 8}" text-anchor="{anchor}">{label}</text>')
    for i, s in enumerate(series):
        if not s.points:
            continue
        colour = COLOURS[i % len(COLOURS)]
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in s.points)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{path}">'
                     f'<title>{escape(s.name)}</title></polyline>')
    parts.append("</svg>")
    legend = "".join(f'<li><span class="swatch" style="background:{COLOURS[i % len(COLOURS)]}"></span>'
                     f'{escape(s.name)}: {human(s.points[-1][1]) if s.points else "-"}</li>'
                     for i, s in enumerate(series))
    return head + "".join(parts) + f'<ul class="legend">{legend}</ul></figure>'
