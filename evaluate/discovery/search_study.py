"""The budgeted-search study of the discover stage: exhaustive references, the selection
functions compared by lookup, and every auditor's budget curves (tables and report data).

References are built for the first reference model (the seed's comparison on a healthy model)
and every localizable anomalous model (their budget curves); each is stored once.
"""
from __future__ import annotations

import time
import warnings
from typing import Any

import numpy as np
import pandas as pd

from counteraudit.evaluate.discovery.budget_curves import SURROGATE, budget_curves, images_to_rank
from counteraudit.evaluate.discovery.exhaustive import (compare_selections, comparison_summary, curve,
                                                        exhaustive_table)
from counteraudit.evaluate.discovery.selection import SURROGATE_MEANS
from counteraudit.evaluate.discovery.stage import suite_auditor
from counteraudit.evaluate.discovery.tables import localizable, planted_slices


def study_models(suite, slices: dict[str, Any], factors) -> list:
    chosen = [suite.references[0]] if suite.references else []
    return chosen + [suite.model(m) for m in localizable(slices, factors)]


def selection_curves(comparisons: dict[str, tuple[list, dict]]) -> pd.DataFrame:
    """Per (model, selection, subdomains explored): the mean and sd over seeds of coverage of the
    10% worst, mean accuracy of the explored, and (at its checkpoints) each surrogate's Spearman
    correlation on the subdomains not explored (``spearman_heldout_<surrogate>_mean``, ``_sd``)."""
    frames = []
    for model, (runs, _) in comparisons.items():
        for selection in sorted({r["selection"] for r in runs}):
            steps, coverage, coverage_sd = curve(runs, selection, "coverage")
            _, accuracy, accuracy_sd = curve(runs, selection, "mean_accuracy")
            mine = [r for r in runs if r["selection"] == selection]
            frame = pd.DataFrame({
                "model": model, "selection": selection, "explored": steps,
                "coverage_mean": coverage, "coverage_sd": coverage_sd,
                "mean_accuracy": accuracy, "mean_accuracy_sd": accuracy_sd})
            for surrogate in SURROGATE_MEANS:
                mean, sd = checkpoint_stats([r["spearman_heldout"][surrogate] for r in mine],
                                            len(steps))
                frame[f"spearman_heldout_{surrogate}_mean"] = mean
                frame[f"spearman_heldout_{surrogate}_sd"] = sd
            frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def checkpoint_stats(per_run: list[list], steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean and sd over runs of values recorded at some steps ((step, value) pairs; NaN
    elsewhere, and the sd NaN where fewer than two runs have a value)."""
    values = np.full((len(per_run), steps), np.nan)
    for k, pairs in enumerate(per_run):
        for step, value in pairs:
            values[k, step - 1] = np.nan if value is None else value
    counted = np.isfinite(values).sum(0)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the mean or sd of no value: NaN
        mean = np.where(counted > 0, np.nanmean(values, 0), np.nan)
        sd = np.where(counted > 1, np.nanstd(values, 0, ddof=1), np.nan)
    return mean, sd


def search_study(suite, results, world, runs_root, seed: int, device=None,
                 log=print) -> dict[str, Any]:
    """{"tables": {name: frame}, "comparisons": {model: runs}, "curves": frame}; empty when
    surrogate_search is not among the suite's auditors or the world has no generator."""
    if not world.has_generator or not any(a == SURROGATE for a, _ in results):
        return {}
    auditor = suite_auditor(suite, SURROGATE)
    slices = planted_slices(suite, world, runs_root)
    comparisons, summaries = {}, []
    for spec in study_models(suite, slices, world.factors()):
        started = time.perf_counter()
        table = exhaustive_table(suite, spec, world, auditor, runs_root, device)
        built = time.perf_counter() - started
        runs = compare_selections(table, world, auditor, runs_root)
        log(f"[search] {spec.name}: exhaustive reference of {len(table['rows'])} subdomains "
            f"({built:.0f}s), selection functions compared ({time.perf_counter() - started - built:.0f}s)")
        comparisons[spec.name] = (runs, table)
        summary = comparison_summary(runs, total=len(table["rows"]))
        summaries.append(summary.assign(model=spec.name))
    curves = budget_curves(suite, results, world, slices, comparisons, seed)
    needed = (images_to_rank(curves, 1).merge(images_to_rank(curves, 3)
                                              .drop(columns="max_images"), on=["model", "auditor"])
              if len(curves) else pd.DataFrame())
    comparison = pd.concat(summaries, ignore_index=True) if summaries else pd.DataFrame()
    if len(comparison):
        comparison = comparison[["model"] + [c for c in comparison.columns if c != "model"]]
    return {"tables": {"search-selection-comparison": comparison,
                       "search-selection-curves": selection_curves(comparisons),
                       "search-budget-curves": curves, "search-images-to-rank": needed},
            "comparisons": {m: runs for m, (runs, _) in comparisons.items()},
            "curves": curves}
