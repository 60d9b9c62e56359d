"""Small inline-SVG plots for the HTML report (evaluate/report.py): strip plots and ROC curves.

No plotting library: each function returns one ``<svg>`` element as a string, every text escaped,
every number written with fixed precision, so the same data always gives the same bytes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import Sequence

import numpy as np

REFERENCE_COLOR = "#7f7f7f"
ANOMALOUS_COLOR = "#d62728"   # detected / abnormal
MISSED_COLOR = "#1f77b4"      # not detected / normal
FONT = 'font-family="sans-serif" font-size="11"'


@dataclass
class StripRow:
    """One row of a strip plot: a label and its points (hover text per point optional)."""
    label: str
    values: Sequence[float]
    color: str
    titles: Sequence[str] | None = None


def _n(x: float) -> str:
    """A coordinate: two decimals, no negative zero."""
    text = f"{x:.2f}"
    return "0.00" if text == "-0.00" else text


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values covering [low, high]."""
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        return [low] if math.isfinite(low) else []
    raw = (high - low) / max(1, count - 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step - 1e-9) * step
    ticks = []
    value = first
    while value <= high + 1e-9 * step:
        ticks.append(round(value, 12))
        value += step
    return ticks


def _tick_label(value: float) -> str:
    return f"{value:.3g}"


def _range(values: Sequence[float]) -> tuple[float, float]:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return 0.0, 1.0
    low, high = min(finite), max(finite)
    if high - low < 1e-12:
        pad = abs(low) * 0.1 or 0.5
        return low - pad, high + pad
    pad = (high - low) * 0.06
    return low - pad, high + pad


def strip_plot(rows: Sequence[StripRow], *, x_label: str, threshold: float | None = None,
               threshold_label: str | None = None, title: str | None = None, width: int = 460,
               label_width: int = 150, row_height: int = 24) -> str:
    """Points on a horizontal value axis, one row per ``StripRow``; optional dashed vertical line.

    Non-finite values are left out (and counted in the row's label)."""
    top = 22 if title else 8
    bottom = 34
    height = top + row_height * len(rows) + bottom
    plot_left, plot_right = label_width, width - 12
    everything = [float(v) for r in rows for v in r.values]
    if threshold is not None and math.isfinite(threshold):
        everything.append(float(threshold))
    low, high = _range(everything)
    x = lambda v: plot_left + (v - low) / (high - low) * (plot_right - plot_left)  # noqa: E731
    parts = [f'<svg width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" {FONT}>']
    if title:
        parts.append(f'<text x="{plot_left}" y="14" font-weight="bold">{escape(title)}</text>')
    axis_y = top + row_height * len(rows)
    for tick in nice_ticks(low, high):
        tx = _n(x(tick))
        parts.append(f'<line x1="{tx}" y1="{top}" x2="{tx}" y2="{axis_y}" stroke="#eee"/>')
        parts.append(f'<line x1="{tx}" y1="{axis_y}" x2="{tx}" y2="{axis_y + 4}" stroke="#333"/>')
        parts.append(f'<text x="{tx}" y="{axis_y + 15}" text-anchor="middle">{escape(_tick_label(tick))}</text>')
    parts.append(f'<line x1="{plot_left}" y1="{axis_y}" x2="{plot_right}" y2="{axis_y}" stroke="#333"/>')
    parts.append(f'<text x="{_n((plot_left + plot_right) / 2)}" y="{axis_y + 29}" '
                 f'text-anchor="middle">{escape(x_label)}</text>')
    for k, row in enumerate(rows):
        centre = top + row_height * k + row_height / 2
        values = [float(v) for v in row.values]
        dropped = sum(not math.isfinite(v) for v in values)
        label = row.label if len(row.label) <= 24 else row.label[:23] + "\u2026"
        label += f" ({dropped} n/a)" if dropped else ""
        parts.append(f'<text x="{label_width - 6}" y="{_n(centre + 4)}" text-anchor="end">'
                     f'<title>{escape(row.label)}</title>{escape(label)}</text>')
        for i, value in enumerate(values):
            if not math.isfinite(value):
                continue
            jitter = ((i % 5) - 2) * 2.0 if len(values) > 1 else 0.0  # deterministic spread
            hover = row.titles[i] if row.titles is not None else f"{row.label}: {value:.4g}"
            parts.append(f'<circle cx="{_n(x(value))}" cy="{_n(centre + jitter)}" r="4" fill="{row.color}" '
                         f'fill-opacity="0.75"><title>{escape(hover)}</title></circle>')
    if threshold is not None and math.isfinite(threshold):
        tx = _n(x(threshold))
        parts.append(f'<line x1="{tx}" y1="{top - 4}" x2="{tx}" y2="{axis_y}" stroke="#000" '
                     f'stroke-dasharray="4 3"><title>{escape(threshold_label or "")} '
                     f'{threshold:.4g}</title></line>')
    parts.append("</svg>")
    return "".join(parts)


def roc_plot(fpr: Sequence[float], tpr: Sequence[float], *, title: str, subtitle: str = "",
             size: int = 230) -> str:
    """An ROC curve (points from ``sklearn.metrics.roc_curve``) with the chance diagonal;
    ``subtitle`` (e.g. the AUROC) is a second line under the title."""
    left, top, right, bottom = 40, 36 if subtitle else 22, 10, 34
    side = size - left - right
    height = top + side + bottom
    px = lambda v: left + float(v) * side  # noqa: E731
    py = lambda v: top + (1 - float(v)) * side  # noqa: E731
    parts = [f'<svg width="{size}" height="{height}" '
             f'viewBox="0 0 {size} {height}" role="img" {FONT}>',
             f'<text x="{left}" y="14" font-weight="bold">{escape(title)}</text>',
             f'<rect x="{left}" y="{top}" width="{side}" height="{side}" fill="none" stroke="#333"/>',
             f'<line x1="{px(0)}" y1="{py(0)}" x2="{px(1)}" y2="{py(1)}" stroke="#999" stroke-dasharray="4 3"/>']
    for tick in (0.0, 0.5, 1.0):
        parts.append(f'<text x="{_n(px(tick))}" y="{top + side + 14}" text-anchor="middle">{tick:g}</text>')
        parts.append(f'<text x="{left - 4}" y="{_n(py(tick) + 4)}" text-anchor="end">{tick:g}</text>')
    parts.append(f'<text x="{_n(left + side / 2)}" y="{top + side + 29}" text-anchor="middle">'
                 'false positive rate</text>')
    parts.append(f'<text x="12" y="{_n(top + side / 2)}" text-anchor="middle" '
                 f'transform="rotate(-90 12 {_n(top + side / 2)})">true positive rate</text>')
    fpr, tpr = np.asarray(fpr, dtype=float), np.asarray(tpr, dtype=float)
    if len(fpr):
        points = " ".join(f"{_n(px(a))},{_n(py(b))}" for a, b in zip(fpr, tpr))
        parts.append(f'<polyline points="{points}" fill="none" stroke="{ANOMALOUS_COLOR}" stroke-width="2"/>')
    if subtitle:
        parts.append(f'<text x="{left}" y="28">{escape(subtitle)}</text>')
    parts.append("</svg>")
    return "".join(parts)


SERIES_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                 "#17becf")


@dataclass
class Series:
    """One line of a line plot: x, the mean y, and a band (low, high) around it (the spread over
    seeds; None: a single run)."""
    label: str
    x: Sequence[float]
    y: Sequence[float]
    low: Sequence[float] | None = None
    high: Sequence[float] | None = None


def line_plot(series: Sequence[Series], *, title: str, x_label: str, y_label: str,
              width: int = 420, height: int = 240, y_range: tuple[float, float] | None = None,
              invert_y: bool = False) -> str:
    """Lines with shaded bands and a legend; ``invert_y`` puts small values on top (ranks)."""
    left, top, right, bottom, legend = 46, 22, 10, 34, 16 * len(series) + 6
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = [float(v) for s in series for v in s.x]
    ys = [float(v) for s in series for v in (*s.y, *(() if s.low is None else s.low),
                                             *(() if s.high is None else s.high))
          if math.isfinite(float(v))]
    x_low, x_high = (min(xs), max(xs)) if xs else (0.0, 1.0)
    x_high = x_high if x_high > x_low else x_low + 1
    y_low, y_high = y_range or _range(ys)
    px = lambda v: left + (float(v) - x_low) / (x_high - x_low) * plot_w  # noqa: E731

    def py(v: float) -> float:
        share = (float(v) - y_low) / (y_high - y_low)
        return top + (share if invert_y else 1 - share) * plot_h

    total = height + legend
    parts = [f'<svg width="{width}" height="{total}" viewBox="0 0 {width} {total}" role="img" '
             f'{FONT}>', f'<text x="{left}" y="14" font-weight="bold">{escape(title)}</text>',
             f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" '
             'stroke="#333"/>']
    for tick in nice_ticks(x_low, x_high):
        parts.append(f'<text x="{_n(px(tick))}" y="{top + plot_h + 14}" text-anchor="middle">'
                     f"{_tick_label(tick)}</text>")
    for tick in nice_ticks(y_low, y_high):
        parts.append(f'<text x="{left - 4}" y="{_n(py(tick) + 4)}" text-anchor="end">'
                     f"{_tick_label(tick)}</text>")
    parts.append(f'<text x="{_n(left + plot_w / 2)}" y="{top + plot_h + 29}" '
                 f'text-anchor="middle">{escape(x_label)}</text>')
    parts.append(f'<text x="12" y="{_n(top + plot_h / 2)}" text-anchor="middle" '
                 f'transform="rotate(-90 12 {_n(top + plot_h / 2)})">{escape(y_label)}</text>')
    for k, s in enumerate(series):
        color = SERIES_COLORS[k % len(SERIES_COLORS)]
        finite = [(x, y) for x, y in zip(s.x, s.y) if math.isfinite(float(y))]
        if s.low is not None and s.high is not None:
            band = [(x, lo, hi) for x, lo, hi in zip(s.x, s.low, s.high)
                    if math.isfinite(float(lo)) and math.isfinite(float(hi))]
            if band:
                outline = ([f"{_n(px(x))},{_n(py(min(max(hi, y_low), y_high)))}" for x, _, hi in band]
                           + [f"{_n(px(x))},{_n(py(min(max(lo, y_low), y_high)))}"
                              for x, lo, _ in reversed(band)])
                parts.append(f'<polygon points="{" ".join(outline)}" fill="{color}" '
                             'fill-opacity="0.15" stroke="none"/>')
        if finite:
            points = " ".join(f"{_n(px(x))},{_n(py(y))}" for x, y in finite)
            parts.append(f'<polyline points="{points}" fill="none" stroke="{color}" '
                         'stroke-width="1.6"/>')
            if len(finite) == 1:
                x, y = finite[0]
                parts.append(f'<circle cx="{_n(px(x))}" cy="{_n(py(y))}" r="3" fill="{color}"/>')
        y_legend = height + 12 + 16 * k
        parts.append(f'<line x1="{left}" y1="{y_legend - 4}" x2="{left + 18}" y2="{y_legend - 4}" '
                     f'stroke="{color}" stroke-width="2"/><text x="{left + 24}" y="{y_legend}">'
                     f"{escape(s.label)}</text>")
    parts.append("</svg>")
    return "".join(parts)
