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
ANOMALOUS_COLOR = "#d62728"   # an abnormal input, an anomalous model's figure
FLAGGED_COLOR = "#2ca02c"     # an anomalous model the detection rule flags (the verdicts' green)
MISSED_COLOR = "#1f77b4"      # not flagged / a normal input
FONT_SIZE = 11
FONT = f'font-family="sans-serif" font-size="{FONT_SIZE}"'
# The widest a character of FONT is likely to be on average (DejaVu Sans, the widest common
# sans-serif, averages about 0.6 em): room for a label is computed with it, so labels fit.
CHARACTER_WIDTH = 0.62 * FONT_SIZE


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


def text_width(text: str) -> float:
    """An upper estimate of ``text``'s width in pixels in FONT."""
    return len(text) * CHARACTER_WIDTH


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

    Non-finite values are left out (and counted in the row's label). The label column (and the
    plot with it) widens where ``label_width`` is too narrow for a label."""
    labels = [_row_label(row) for row in rows]
    needed = max([text_width(label) + 10 for label in labels], default=0)
    if needed > label_width:
        width += math.ceil(needed - label_width)
        label_width = math.ceil(needed)
    if title:  # bold: a tenth wider
        width = max(width, label_width + math.ceil(1.1 * text_width(title)) + 4)
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
        label = labels[k]
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


def _row_label(row: StripRow) -> str:
    """A strip plot row's label as shown: long names shortened, missing values counted."""
    dropped = sum(not math.isfinite(float(v)) for v in row.values)
    label = row.label if len(row.label) <= 24 else row.label[:23] + "\u2026"
    return label + (f" ({dropped} n/a)" if dropped else "")


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


# One colour per series of a line plot (matplotlib's tab10 without the red and grey the strip
# plots use for anomalous models and references).
SERIES_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22",
                 "#17becf")
MAX_X_TICKS = 8  # more distinct x values than this get round ticks, not one tick per value


@dataclass
class Series:
    """One line of ``line_plot``: y per x (NaN: no point), with an optional band (low, high)
    around it (e.g. the spread over seeds, a bootstrap interval)."""
    label: str
    x: Sequence[float]
    y: Sequence[float]
    low: Sequence[float] | None = None
    high: Sequence[float] | None = None


def line_plot(series: Sequence[Series], *, title: str, x_label: str, y_label: str,
              reference: float | None = None, reference_label: str = "", log_x: bool = False,
              y_range: tuple[float, float] | None = None, invert_y: bool = False,
              width: int = 420, height: int = 230) -> str:
    """Lines, each with a shaded band where it has one, a dashed horizontal ``reference`` line
    (e.g. margin 1, AUROC 0.5) and a legend. ``log_x``: log-spaced x; ``y_range``: fixed limits
    (e.g. (0, 1) for shares and AUROCs), else the data's; ``invert_y``: small values on top
    (ranks). Few distinct x values (a sweep's strengths) get a tick each."""
    # the legend widens (and the plot with it) where a series' label needs more room
    legend_width = max(150, math.ceil(max([text_width(line.label) for line in series], default=0))
                       + 34)
    width += legend_width - 150
    left, top, right, bottom = 48, 22, width - legend_width, height - 34
    to_x = (lambda v: np.log10(np.asarray(v, float))) if log_x else (lambda v: np.asarray(v, float))
    all_x = sorted({float(v) for line in series for v in line.x})
    everything = [float(v) for line in series
                  for part in (line.y, [] if line.low is None else line.low,
                               [] if line.high is None else line.high) for v in part]
    everything = [v for v in everything if math.isfinite(v)]
    if reference is not None:
        everything.append(float(reference))
    y_low, y_high = _range(everything) if y_range is None else _range(list(y_range))
    x_low, x_high = _range(list(to_x(all_x))) if all_x else (0.0, 1.0)
    px = lambda v: left + (v - x_low) / (x_high - x_low) * (right - left)  # noqa: E731

    def py(v: float) -> float:
        share = (v - y_low) / (y_high - y_low)
        return top + (share if invert_y else 1 - share) * (bottom - top)

    parts = [f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
             f'{FONT}>', f'<text x="{left}" y="14" font-weight="bold">{escape(title)}</text>',
             f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" '
             'fill="none" stroke="#333"/>']
    for tick in nice_ticks(y_low, y_high, 4):
        parts.append(f'<line x1="{left}" y1="{_n(py(tick))}" x2="{right}" y2="{_n(py(tick))}" '
                     'stroke="#eee"/>')
        parts.append(f'<text x="{left - 4}" y="{_n(py(tick) + 4)}" text-anchor="end">'
                     f'{escape(_tick_label(tick))}</text>')
    if len(all_x) <= MAX_X_TICKS:  # a tick at every value (a sweep's strengths)
        x_ticks = [(float(to_x([v])[0]), f"{v:.3g}") for v in all_x]
    else:
        x_ticks = [(tick, _tick_label(tick)) for tick in nice_ticks(x_low, x_high)]
    for position, label in x_ticks:
        parts.append(f'<text x="{_n(px(position))}" y="{bottom + 14}" text-anchor="middle">'
                     f'{escape(label)}</text>')
    parts.append(f'<text x="{_n((left + right) / 2)}" y="{bottom + 29}" text-anchor="middle">'
                 f'{escape(x_label + (" (log scale)" if log_x else ""))}</text>')
    parts.append(f'<text x="12" y="{_n((top + bottom) / 2)}" text-anchor="middle" '
                 f'transform="rotate(-90 12 {_n((top + bottom) / 2)})">{escape(y_label)}</text>')
    if reference is not None:
        parts.append(f'<line x1="{left}" y1="{_n(py(reference))}" x2="{right}" '
                     f'y2="{_n(py(reference))}" stroke="#000" stroke-dasharray="4 3">'
                     f'<title>{escape(reference_label)} {reference:g}</title></line>')
    for k, line in enumerate(series):
        color = SERIES_COLORS[k % len(SERIES_COLORS)]
        parts += _series_marks(line, color, to_x, px, py, (y_low, y_high))
        legend_y = top + 6 + 14 * k
        parts.append(f'<line x1="{right + 10}" y1="{legend_y}" x2="{right + 24}" y2="{legend_y}" '
                     f'stroke="{color}" stroke-width="2"/>')
        parts.append(f'<text x="{right + 28}" y="{legend_y + 4}">{escape(line.label)}</text>')
    parts.append("</svg>")
    return "".join(parts)

def _series_marks(line: Series, color: str, to_x, px, py, y_limits: tuple[float, float]) -> list[str]:
    """One series of ``line_plot``: its band (clipped to the y limits), its line, and its points
    with their values on hover where they are few."""
    parts = []
    xs, values = to_x(line.x), np.asarray(line.y, float)
    if line.low is not None and line.high is not None:
        low, high = np.asarray(line.low, float), np.asarray(line.high, float)
        keep = np.isfinite(low) & np.isfinite(high)
        if keep.sum() >= 2:
            def clip(v: float) -> float:
                return min(max(v, y_limits[0]), y_limits[1])
            outline = ([f"{_n(px(x))},{_n(py(clip(v)))}" for x, v in zip(xs[keep], high[keep])]
                       + [f"{_n(px(x))},{_n(py(clip(v)))}" for x, v in
                          zip(xs[keep][::-1], low[keep][::-1])])
            parts.append(f'<polygon points="{" ".join(outline)}" fill="{color}" '
                         'fill-opacity="0.12" stroke="none"/>')
    keep = np.isfinite(values)
    if keep.sum() >= 2:
        points = " ".join(f"{_n(px(x))},{_n(py(v))}" for x, v in zip(xs[keep], values[keep]))
        parts.append(f'<polyline points="{points}" fill="none" stroke="{color}" '
                     'stroke-width="1.5"/>')
    if keep.sum() <= MAX_X_TICKS * 2:  # points, with their values on hover, where few
        for x, value, raw in zip(xs[keep], values[keep], np.asarray(line.x, float)[keep]):
            parts.append(f'<circle cx="{_n(px(x))}" cy="{_n(py(value))}" r="3" fill="{color}">'
                         f'<title>{escape(f"{line.label}: {value:.3g} at {raw:.3g}")}</title>'
                         '</circle>')
    return parts

