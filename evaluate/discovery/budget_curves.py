"""Budget curves: how many generated images each auditor needs to recover a planted slice.

For each localizable anomalous model (a planted slice made of the world's factors), the rank of
its slice (1 = top) and precision@k against the images the auditor used:

- twise, caption_lift: from the stored discover result, truncated (``findings_within``: a
  smaller budget evaluates a prefix of the same subgroups / tests a prefix of the same
  descriptions);
- error_ratio: one point, at its fixed cost (the annotated val images);
- surrogate_search with each selection function: by lookup in the model's exhaustive reference,
  over its 10 search seeds (``evaluate/discovery/exhaustive.py``), after every subdomain.

``images_to_rank`` summarises a curve: the fewest images from which on the slice ranks <= 1 (and
<= 3) at every larger budget of the curve, averaged over the seeds that reach it.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from counteraudit.evaluate.discovery.auditors import AuditResult, rank
from counteraudit.evaluate.discovery.auditors.base import conditions_key
from counteraudit.evaluate.discovery.auditors.surrogate_search import OBJECTIVE, wilson_finding
from counteraudit.evaluate.discovery.stage import suite_auditor
from counteraudit.evaluate.discovery.tables import PRECISION_AT, precision_at, slice_rank

SURROGATE = "surrogate_search"


def curve_point(findings, objective: str, planted: dict[str, str], images: int) -> dict[str, Any]:
    result = AuditResult(rank(findings), images, {})
    point = {"images": int(images), "rank": slice_rank(result, objective, planted)}
    for k in PRECISION_AT:
        point[f"precision@{k}"] = precision_at(result, objective, planted, k)
    return point


def stored_curve(auditor, result: AuditResult, planted, world, seed: int,
                 step: int) -> list[dict[str, Any]]:
    """Points every ``step`` images up to the images the stored result used."""
    points = []
    for images in sorted(set(range(step, result.images_used + 1, step)) | {result.images_used}):
        findings = auditor.findings_within(result, images, world, seed)
        if findings is not None:
            points.append(curve_point(findings, auditor.objective, planted, images))
    return points


def curve_step(auditor, world) -> int:
    params = auditor.params
    return int(getattr(params, "images_per_subgroup", 0)
               or getattr(params, "images_per_description", 0) or 1)


def lookup_curves(runs: list[dict[str, Any]], table: dict[str, Any], planted,
                  images_per_subdomain: int) -> list[dict[str, Any]]:
    """surrogate_search's curve for each (selection, seed) of a comparison, by lookup."""
    counts = {conditions_key(row): (k, n)
              for row, k, n in zip(table["rows"], table["failures"], table["n"])}
    points = []
    for run in runs:
        findings = []
        for step, row in enumerate(run["evaluated"], start=1):
            findings.append(wilson_finding(row, *counts[conditions_key(row)]))
            if step >= 10:
                point = curve_point(findings, OBJECTIVE, planted, step * images_per_subdomain)
                points.append({"auditor": f"{SURROGATE}:{run['selection']}",
                               "seed": run["seed"], **point})
    return points


def images_to_rank(curves: pd.DataFrame, within: int) -> pd.DataFrame:
    """Per (model, auditor): the fewest images from which on the slice ranks <= ``within`` at
    every larger budget of the curve (a slice that is first only while it is the one finding
    does not count), mean over the seeds that reach it, and how many seeds do."""
    rows = []
    for (model, auditor), group in curves.groupby(["model", "auditor"], sort=False):
        needed = []
        seeds = group["seed"].unique()
        for _, run in group.groupby("seed"):
            run = run.sort_values("images")
            held = (run["rank"] <= within).fillna(False).to_numpy(bool)
            # the first point of the run's final stretch of points that all hold
            stays = np.flatnonzero(~held)
            start = 0 if not len(stays) else stays[-1] + 1
            if start < len(run):
                needed.append(int(run["images"].iloc[start]))
        rows.append({"model": model, "auditor": auditor,
                     f"images_to_top{within}": float(np.mean(needed)) if needed else np.nan,
                     f"sd_top{within}": float(np.std(needed, ddof=1)) if len(needed) > 1 else np.nan,
                     f"seeds_reaching_top{within}": f"{len(needed)}/{len(seeds)}",
                     "max_images": int(group["images"].max())})
    return pd.DataFrame(rows)


def budget_curves(suite, results: dict[tuple[str, str], AuditResult], world, slices: dict,
                  comparisons: dict[str, tuple[list, dict]], seed: int) -> pd.DataFrame:
    """One row per (model, auditor, seed, budget): rank of the slice and precision@k."""
    factors = world.factors()
    rows = []
    for model, planted in slices.items():
        if not isinstance(planted, dict) or any(f not in factors for f in planted):
            continue  # not localizable in this world
        for name in sorted({a for a, m in results if m == model}):
            auditor = suite_auditor(suite, name)
            if name == SURROGATE and model in comparisons:
                continue  # its curves come from the lookups, over every selection function
            for point in stored_curve(auditor, results[(name, model)], planted, world, seed,
                                      curve_step(auditor, world)):
                label = (f"{name}:{auditor.params.selection}" if name == SURROGATE else name)
                rows.append({"model": model, "auditor": label, "seed": seed, **point})
        if model in comparisons:
            runs, table = comparisons[model]
            surrogate = suite_auditor(suite, SURROGATE)
            for point in lookup_curves(runs, table, planted,
                                       surrogate.params.images_per_subdomain):
                rows.append({"model": model, **point})
    frame = pd.DataFrame(rows)
    if len(frame):
        frame["rank"] = frame["rank"].astype("Float64")
    return frame
