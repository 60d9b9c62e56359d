"""The report's budgeted-search section: the selection functions' curves on each exhaustive
reference (coverage of the 10% worst subdomains, mean accuracy of the explored ones, each
surrogate's Spearman correlation on the subdomains not explored; mean and +-1 sd over the 10
search seeds) and every auditor's budget curve on each localizable anomalous model (rank of the
planted slice and precision@5 against images generated; mean over seeds with their range)."""
from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from counteraudit.evaluate.reporting.svg import Series, line_plot

HELD_OUT = "spearman_heldout_"


def selection_plots(curves: pd.DataFrame, line_plot, Series) -> list[str]:
    plots = []
    for model, frame in curves.groupby("model", sort=False):
        # one plot per surrogate whose held-out Spearman correlation the comparison recorded
        surrogates = [c.removeprefix(HELD_OUT).removesuffix("_mean") for c in frame.columns
                      if c.startswith(HELD_OUT) and c.endswith("_mean")]
        held_out = [(f"{HELD_OUT}{s}", f"held-out Spearman, {s}") for s in surrogates]
        for metric, label in [("coverage", "coverage of the 10% worst"),
                              ("mean_accuracy", "mean accuracy of explored"), *held_out]:
            series = []
            for selection, rows in frame.groupby("selection", sort=True):
                mean = rows[f"{metric}_mean" if metric != "mean_accuracy" else metric].to_numpy(float)
                sd = rows[f"{metric}_sd"].to_numpy(float)
                keep = np.isfinite(mean)
                x = rows["explored"].to_numpy()[keep]
                series.append(Series(selection, x, mean[keep], (mean - sd)[keep], (mean + sd)[keep]))
            plots.append(line_plot(series, title=f"{model}: {label}", x_label="subdomains explored",
                                   y_label=label, y_range=(0, 1) if metric == "coverage" else None))
    return plots


def budget_plots(curves: pd.DataFrame, line_plot, Series) -> list[str]:
    plots = []
    for model, frame in curves.groupby("model", sort=False):
        for metric, label, invert in (("rank", "rank of the planted slice", True),
                                      ("precision@5", "precision@5", False)):
            series = []
            for auditor, rows in frame.groupby("auditor", sort=True):
                stats = rows.groupby("images")[metric].agg(["mean", "min", "max"]).reset_index()
                series.append(Series(auditor, stats["images"], stats["mean"].astype(float),
                                     stats["min"].astype(float), stats["max"].astype(float)))
            worst = float(np.nanmax(frame["rank"].to_numpy(float))) if frame["rank"].notna().any() else 1
            plots.append(line_plot(series, title=f"{model}: {label}", x_label="images generated",
                                   y_label=label, invert_y=invert, width=520,
                                   y_range=(0.5, max(worst, 2) + 0.5) if metric == "rank"
                                   else (0, 1)))
    return plots


def search_section(tables: dict[str, pd.DataFrame], html_table: Callable[..., str]) -> str:
    curves = tables.get("search-selection-curves")
    budget = tables.get("search-budget-curves")
    if curves is None or not len(curves):
        return ""
    parts = ['<h3 id="search">Budgeted search and budget curves</h3>',
             '<p class="note">Selection functions compared by lookup in each exhaustive reference '
             "(every subdomain evaluated once); lines are means over 10 search seeds, bands +-1 sd."
             "</p>", html_table(tables["search-selection-comparison"], float_format="{:.3f}",
                                caption="Coverage of the 10% worst subdomains by share explored")]
    parts += [f'<div class="plot">{svg}</div>' for svg in selection_plots(curves, line_plot,
                                                                          Series)]
    if budget is not None and len(budget):
        parts.append('<p class="note">Budget curves on each localizable anomalous model: '
                     "surrogate_search over its 10 seeds (band: their range), the other auditors "
                     "at the discover seed; error_ratio is one point at its fixed cost.</p>")
        parts.append(html_table(tables["search-images-to-rank"], float_format="{:.0f}",
                                caption="Images each auditor needs to rank the planted slice first "
                                        "/ in the top 3"))
        parts += [f'<div class="plot">{svg}</div>' for svg in budget_plots(budget, line_plot, Series)]
    return "\n".join(parts)
