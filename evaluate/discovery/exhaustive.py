"""The exhaustive reference of the budgeted subdomain search (every subdomain evaluated), and the
selection functions compared by lookup in it.

The reference evaluates every feasible subdomain of surrogate_search's grid once on a model
(``images_per_subdomain`` images each, generated with the fixed ``IMAGE_SEED``, exactly as a
search evaluates it) and is stored once in ``store/exhaustive/<key hash>/table.json``, keyed by
what determines it: the model key, the world, the grid, the images per subdomain and the image
seed. A search is then a table lookup, so each selection function runs over ``SEEDS`` search
seeds in a second. Per step (subdomains explored) the seed's three metrics:

- coverage: the share of the 10% worst subdomains (the ceil(10%) highest failure rates, and any
  tied with the last of them) found so far;
- mean accuracy of the subdomains explored so far;
- the surrogates' held-out Spearman correlation: each surrogate of ``SURROGATE_MEANS`` (the
  seed's single Lasso, alpha ``LASSO_ALPHA``, and bo's Bayesian ridge) fitted to the explored
  subdomains, against the reference's failure rates of the subdomains NOT explored (every
  ``SPEARMAN_EVERY`` steps): how well it predicts what it has not seen, as the seed measures its
  predictors on test subdomains (scoring the training subdomains too would reward memorising).

The comparison is stored too (``store/selection-comparison/<key hash>.json``).
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from counteraudit.evaluate.discovery.auditors.surrogate_search import IMAGE_SEED
from counteraudit.evaluate.discovery.covering_arrays import cached_covering_array
from counteraudit.evaluate.discovery.selection import (SELECTIONS, SURROGATE_MEANS, NwiseSelection,
                                                       Subdomains, describe_selections, search,
                                                       surrogate_spearman)
from counteraudit.evaluate.discovery.stage import FINDINGS_STORE
from counteraudit.train.checkpoint import model_dir
from counteraudit.train.core.artifacts import (atomic_write_json, read_json, stable_hash,
                                               store_dir)
from counteraudit.train.core.keyed_store import as_stored
from counteraudit.train.core.payloads import json_fields, read_json_object
from counteraudit.train.core.threads import compute_threads
from counteraudit.train.trainer import load_trained_model, pick_device
from counteraudit.train.worlds.synthetic_images import map_in_processes

EXHAUSTIVE = "exhaustive"
TABLE_FILE = "table.json"
COMPARISON = "selection-comparison"
COMPARISON_FILE = "comparison.json"
VERSION = 1              # the exhaustive reference's
# 2: the Spearman correlations are on the held-out subdomains, per surrogate; bo is the Bayesian
# ridge and bo_lasso_bootstrap the seed's Lasso
COMPARISON_VERSION = 2
SEEDS = 10
COMPARE_FRACTION = 0.6   # each search explores this share of the subdomains
SPEARMAN_EVERY = 5
WORST_SHARE = 0.1
# One model's reference: its table, stored as the discover stage stores findings.
EXHAUSTIVE_TABLE = dataclasses.replace(FINDINGS_STORE, payload=TABLE_FILE, what=TABLE_FILE,
                                       check=json_fields(rows=list, failures=list, n=list))


def exhaustive_key(auditor, spec, world_config: dict[str, Any], world) -> dict[str, Any]:
    return {"kind": EXHAUSTIVE, "version": VERSION, "model_id": spec.key,
            "world": dict(world_config), "grid": auditor.grid(world),
            "images_per_subdomain": auditor.params.images_per_subdomain, "seed": IMAGE_SEED}


def exhaustive_dir(runs_root, key: dict[str, Any]) -> Path:
    return store_dir(runs_root) / EXHAUSTIVE / stable_hash(key, length=16)


def evaluate_every_subdomain(auditor, model, world) -> dict[str, Any]:
    """{"rows": subdomains, "failures": [...], "n": [...]} on every subdomain of the grid."""
    subdomains = auditor.subdomains(world)
    auditor._used, auditor._budget = 0, len(subdomains) * auditor.params.images_per_subdomain
    model.eval()
    with torch.no_grad():
        counts = [auditor.failures(model, world, row) for row in subdomains.rows]
    return {"rows": subdomains.rows, "failures": [k for k, _ in counts],
            "n": [n for _, n in counts]}


def exhaustive_table(suite, spec, world, auditor, runs_root, device=None) -> dict[str, Any]:
    """The stored reference of one model (evaluated now when missing, on the suite's
    ``recipe.cpu_threads``, as a work item would be: train/core/threads.py)."""
    key = exhaustive_key(auditor, spec, suite.world, world)
    directory = exhaustive_dir(runs_root, key)
    if not EXHAUSTIVE_TABLE.is_stored(directory, key):
        model = load_trained_model(model_dir(runs_root, spec), spec, world, pick_device(device))
        with compute_threads(suite.recipe.cpu_threads):
            table = evaluate_every_subdomain(auditor, model, world)
        EXHAUSTIVE_TABLE.save(directory, key, lambda path: atomic_write_json(path, table))
    return {**read_json(EXHAUSTIVE_TABLE.payload_path(directory)), "key": key}


def worst_subdomains(rates: np.ndarray, share: float = WORST_SHARE) -> np.ndarray:
    """Indices of the ceil(share * N) highest rates, and any tied with the last of them."""
    count = max(1, math.ceil(share * len(rates)))
    threshold = np.sort(rates)[::-1][count - 1]
    return np.flatnonzero(rates >= threshold)


def _one_search(job) -> dict[str, Any]:
    """Worker: one (selection, seed) search by lookup, with the metrics at every step."""
    grid, rows, rates, covering, selection, seed, count = job
    allowed = {tuple(row[f] for f in grid) for row in rows}
    subdomains = Subdomains(grid, lambda row: tuple(row[f] for f in grid) in allowed,
                            lambda t, s: covering)
    order = [subdomains.index(row) for row in rows]  # the table's rows in the grid's order
    truth = np.empty(len(rows))
    truth[order] = rates
    state = search(subdomains, lambda i: truth[i], selection, count, seed)
    worst = set(worst_subdomains(truth).tolist())
    found, coverage, accuracy = 0, [], []
    spearman: dict[str, list] = {surrogate: [] for surrogate in SURROGATE_MEANS}
    for step, position in enumerate(state.evaluated, start=1):
        found += position in worst
        coverage.append(found / len(worst))
        accuracy.append(1 - float(np.mean(truth[state.evaluated[:step]])))
        if step >= 2 and step % SPEARMAN_EVERY == 0:
            for surrogate, values in spearman.items():
                values.append((step, surrogate_spearman(surrogate, subdomains,
                                                        state.evaluated[:step],
                                                        state.scores[:step], truth)))
    return {"selection": selection, "seed": seed,
            "evaluated": [subdomains.rows[p] for p in state.evaluated],
            "coverage": coverage, "mean_accuracy": accuracy, "spearman_heldout": spearman}


def compare_selections(table: dict[str, Any], world, auditor, runs_root,
                       seeds: int = SEEDS) -> list[dict[str, Any]]:
    """Every selection function over ``seeds`` search seeds on one reference (stored)."""
    key = {"table": table["key"], "selections": describe_selections(), "seeds": seeds,
           "fraction": COMPARE_FRACTION, "spearman_every": SPEARMAN_EVERY,
           "version": COMPARISON_VERSION}
    path = store_dir(runs_root) / COMPARISON / f"{stable_hash(key, length=16)}.json"
    stored = read_json_object(path, "selection comparison", runs=list)
    if stored is not None and stored.get("key") == as_stored(key):
        return stored["runs"]
    grid = auditor.grid(world)
    rates = (np.asarray(table["failures"]) / np.asarray(table["n"])).tolist()
    count = max(auditor.params.initial, math.ceil(COMPARE_FRACTION * len(rates)))
    jobs = []
    for selection in SELECTIONS.names():
        for seed in range(seeds):
            covering = (cached_covering_array(world, grid, NwiseSelection.t, seed)
                        if selection == "nwise" else [])
            jobs.append((grid, table["rows"], rates, covering, selection, seed, count))
    runs = map_in_processes(_one_search, jobs)
    atomic_write_json(path, {"key": key, "runs": runs})
    return runs


def comparison_summary(runs: list[dict[str, Any]], fractions=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6),
                       total: int | None = None) -> "Any":
    """Per selection: coverage of the 10% worst (mean and sd over seeds) at each share of the
    subdomains explored, mean accuracy there, and each surrogate's Spearman correlation on the
    subdomains not explored (``spearman_heldout_<surrogate>``)."""
    rows = []
    for selection in sorted({r["selection"] for r in runs}):
        mine = [r for r in runs if r["selection"] == selection]
        for fraction in fractions:
            step = max(1, round(fraction * total))
            if step > len(mine[0]["coverage"]):
                continue
            coverage = np.array([r["coverage"][step - 1] for r in mine])
            accuracy = np.array([r["mean_accuracy"][step - 1] for r in mine])
            checkpoint = SPEARMAN_EVERY * max(1, step // SPEARMAN_EVERY)  # the last one <= step
            row = {"selection": selection, "explored": step, "explored_share": step / total,
                   "coverage_mean": coverage.mean(), "coverage_sd": coverage.std(ddof=1),
                   "mean_accuracy": accuracy.mean()}
            for surrogate in SURROGATE_MEANS:
                spearman = np.array([dict((s, v) for s, v in r["spearman_heldout"][surrogate])
                                     .get(checkpoint, np.nan) for r in mine], dtype=float)
                row[f"spearman_heldout_{surrogate}"] = (np.nanmean(spearman)
                                                        if np.isfinite(spearman).any() else np.nan)
            rows.append({**row, "seeds": len(mine)})
    return pd.DataFrame(rows)


def curve(runs: list[dict[str, Any]], selection: str, metric: str) -> tuple[np.ndarray, ...]:
    """(steps, mean, sd) over seeds of a per-step metric (coverage, mean_accuracy)."""
    values = np.array([r[metric] for r in runs if r["selection"] == selection])
    steps = np.arange(1, values.shape[1] + 1)
    return steps, values.mean(0), values.std(0, ddof=1) if len(values) > 1 else 0 * steps
