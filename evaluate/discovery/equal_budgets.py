"""Auditors compared at equal image budgets, over many models: from the budget curves (one row per
model, auditor, seed and budget with the planted slice's rank), the share of models whose slice
is within the top k once each auditor has spent B images, for a grid of budgets B shared by all
auditors, with a 95% interval over models.

An auditor's state at budget B is its curve's last point at or below B (none yet: a miss). Each
model's hit is the mean over its seeds (surrogate_search has ten, the others one), and the
interval is Student-t over models' hits (models are the independent units; seeds of one model
are not), or Wilson where every model's hit is 0 or 1 (a proportion of models)."""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import t as student_t
from statsmodels.stats.proportion import proportion_confint

BUDGET_POINTS = 8  # budgets on the shared grid, evenly spaced up to the largest any curve reaches


def budget_grid(curves: pd.DataFrame, points: int = BUDGET_POINTS) -> list[int]:
    top = int(curves["images"].max())
    return sorted({int(round(top * (k + 1) / points)) for k in range(points)})


def hit_at(run: pd.DataFrame, budget: int, within: int) -> float:
    """1.0 if the run's slice rank at ``budget`` images is <= ``within`` (its last point at or
    below the budget; a run with no point yet, or the slice not found, is a miss)."""
    reached = run[run["images"] <= budget]
    if not len(reached):
        return 0.0
    rank = reached.sort_values("images")["rank"].iloc[-1]
    return float(pd.notna(rank) and rank <= within)


def equal_budget_table(curves: pd.DataFrame, within: int = 1,
                       budgets: list[int] | None = None) -> pd.DataFrame:
    """Per (auditor, budget): models, their mean hit rate (slice rank <= ``within``) and its 95%
    interval over models."""
    if not len(curves):
        return pd.DataFrame()
    budgets = budgets or budget_grid(curves)
    rows = []
    for auditor, mine in curves.groupby("auditor", sort=True):
        for budget in budgets:
            per_model = np.array([
                np.mean([hit_at(run, budget, within) for _, run in model_runs.groupby("seed")])
                for _, model_runs in mine.groupby("model", sort=True)])
            rows.append({"auditor": auditor, "images": budget, "models": len(per_model),
                         f"top{within}_rate": float(per_model.mean()),
                         **dict(zip(("low", "high"), interval(per_model)))})
    return pd.DataFrame(rows)


def interval(per_model: np.ndarray) -> tuple[float, float]:
    """95% interval of the mean of per-model hit rates (module docstring)."""
    count = len(per_model)
    if np.isin(per_model, (0.0, 1.0)).all():
        low, high = proportion_confint(int(per_model.sum()), count, alpha=0.05, method="wilson")
        return float(low), float(high)
    if count < 2:
        return float("nan"), float("nan")
    half = student_t.ppf(0.975, count - 1) * per_model.std(ddof=1) / np.sqrt(count)
    return float(max(0.0, per_model.mean() - half)), float(min(1.0, per_model.mean() + half))


SHARES = (0.2, 0.4, 0.5)  # the seed's checkpoints: a fifth, two fifths, half of the grid explored


def selections_over_models(comparison: pd.DataFrame, shares=SHARES) -> pd.DataFrame:
    """The seed's comparison over many models: per selection function and share explored, the
    mean over models of each model's coverage of its 10% worst subdomains (itself a mean over
    search seeds), the sd over models and their count."""
    if not len(comparison):
        return pd.DataFrame()
    rows = []
    for share in shares:
        # each (model, selection)'s checkpoint closest to the share (steps are whole subdomains)
        distance = (comparison["explored_share"] - share).abs()
        at = comparison.loc[distance.groupby([comparison["model"],
                                              comparison["selection"]]).idxmin()]
        for selection, group in at.groupby("selection", sort=True):
            rows.append({"selection": selection, "explored_share": share,
                         "models": group["model"].nunique(),
                         "coverage_mean": group["coverage_mean"].mean(),
                         "coverage_sd_over_models": group["coverage_mean"].std(ddof=1)})
    return pd.DataFrame(rows)
