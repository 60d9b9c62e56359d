"""Power: how many references (n), detection images (m) and abnormal images (p) a method needs to
see a defect, measured on a finished run by subsampling what it stored (issue 17).

Every figure is a fraction over random subsets (seeded): draw n of the suite's references, or m of
its detection images, or p of a model's abnormal images, recompute the verdict on that subset from
the stored per-image distances or scores, and count how often

- detection: the model's Abar exceeds every reference's (Table 1's rule, the references scored
  leave-one-out within the subset), and
- localization: the AUROC of abnormal against normal images reaches ``target`` (0.8).

A method "needs" the smallest size at which that fraction is at least ``level`` (0.8) at that size
and at every larger size measured; "more than N" when even the suite's full count falls short.
Nothing is trained or explained: n recomputes scores from stored renders (``distance_matrix``),
m and p subsample the stored score tables.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from counteraudit.evaluate.scoring.localization import auroc
from counteraudit.evaluate.scoring.scores import ZERO_SPREAD_TOLERANCE, mean_pair_distance

DEFAULT_LEVEL = 0.8          # the share of subsets in which a method must succeed
DEFAULT_AUROC_TARGET = 0.8   # a localization "succeeds" at this AUROC or above
MIN_DETECTION_REFERENCES = 3  # leave-one-out scoring of the references needs a pair left


def _scores(numerator: np.ndarray, spread: np.ndarray) -> np.ndarray:
    """numerator / spread per image, NaN where the spread vanishes (as ``scores.score_frame``)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(spread > ZERO_SPREAD_TOLERANCE, numerator / spread, np.nan)


def subset_abars(matrix: np.ndarray, n_references: int, chosen: np.ndarray,
                 images: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(scored models' Abars, chosen references' leave-one-out Abars) with only the references
    ``chosen`` (indices < n_references) and the images ``images`` (None: all).

    ``matrix``: (N, n_references + k, n_references + k) distances between renders on each image,
    the references first, then the k scored models."""
    if images is not None:
        matrix = matrix[images]
    total = matrix.shape[1]
    keep = np.zeros(total, dtype=bool)
    keep[chosen] = True
    spread = mean_pair_distance(matrix, keep)
    scored = [_scores(matrix[:, model, keep].mean(axis=1), spread)
              for model in range(n_references, total)]
    references = []
    for reference in chosen:
        others = keep.copy()
        others[reference] = False
        references.append(_scores(matrix[:, reference, others].mean(axis=1),
                                  mean_pair_distance(matrix, others)))
    return (np.nanmean(np.stack(scored, axis=1), axis=0) if scored else np.zeros(0),
            np.nanmean(np.stack(references, axis=1), axis=0))


def detection_verdicts(model_abars: np.ndarray, reference_abars: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(detected, margin) per model: Table 1's rule, Abar strictly above every reference's."""
    highest = np.max(reference_abars)
    return model_abars > highest, model_abars / highest


def _draws(total: int, size: int, subsets: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``subsets`` random size-subsets of range(total); the one full set when size == total."""
    if size >= total:
        return [np.arange(total)]
    return [np.sort(rng.choice(total, size, replace=False)) for _ in range(subsets)]


def detection_by_reference_count(matrix: np.ndarray, n_references: int, models: Sequence[str],
                                 subsets: int, rng: np.random.Generator) -> pd.DataFrame:
    """Per (model, n), n = 3 .. all: fraction_detected over random n-subsets of the references,
    mean_margin, and the number of subsets."""
    rows = []
    for n in range(MIN_DETECTION_REFERENCES, n_references + 1):
        draws = _draws(n_references, n, subsets, rng)
        verdicts = [detection_verdicts(*subset_abars(matrix, n_references, chosen))
                    for chosen in draws]
        detected = np.stack([v[0] for v in verdicts])
        margins = np.stack([v[1] for v in verdicts])
        rows += [{"model": model, "n": n, "fraction_detected": float(detected[:, k].mean()),
                  "mean_margin": float(np.nanmean(margins[:, k])), "subsets": len(draws)}
                 for k, model in enumerate(models)]
    return pd.DataFrame(rows)


def image_sizes(total: int, steps: int = 6) -> list[int]:
    """About ``steps`` subset sizes from total / steps to total (e.g. 36 -> 6, 12, ..., 36)."""
    return sorted({max(2, int(round(total * k / steps))) for k in range(1, steps + 1)} | {total})


def detection_by_image_count(scores: pd.DataFrame, references: Sequence[str], models: Sequence[str],
                             sizes: Sequence[int], subsets: int,
                             rng: np.random.Generator) -> pd.DataFrame:
    """Per (model, m): fraction_detected over random m-subsets of the detection images, from the
    per-image scores of one method (``scores``: model, image, score; layered methods' rows are
    averaged over layers per image first, references' rows are their leave-one-out scores)."""
    table = scores.groupby(["model", "image"])["score"].mean().unstack("image")
    references, models = list(references), list(models)
    values = table.loc[[*references, *models]].to_numpy(float)
    rows = []
    for m in sizes:
        detected, margins = [], []
        for images in _draws(values.shape[1], m, subsets, rng):
            abars = np.nanmean(values[:, images], axis=1)
            hit, margin = detection_verdicts(abars[len(references):], abars[:len(references)])
            detected.append(hit)
            margins.append(margin)
        detected, margins = np.stack(detected), np.stack(margins)
        rows += [{"model": model, "m": int(m),
                  "fraction_detected": float(detected[:, k].mean()),
                  "mean_margin": float(np.nanmean(margins[:, k])), "subsets": len(detected)}
                 for k, model in enumerate(models)]
    return pd.DataFrame(rows)


def localization_by_image_count(abnormal: np.ndarray, normal: np.ndarray, sizes: Sequence[int],
                                subsets: int, rng: np.random.Generator,
                                target: float = DEFAULT_AUROC_TARGET) -> pd.DataFrame:
    """Per p: the fraction of random draws of p abnormal and min(p, all) normal images whose AUROC
    reaches ``target``, and the mean AUROC (scores: one per image, NaN-free). Sizes above the
    abnormal images there are must not be asked for."""
    rows = []
    for p in sizes:
        if p > len(abnormal):
            raise ValueError(f"p = {p} abnormal images asked for, {len(abnormal)} scored")
        aurocs = []
        abnormal_draws = _draws(len(abnormal), p, subsets, rng)
        normal_draws = _draws(len(normal), p, len(abnormal_draws), rng)
        if len(normal_draws) < len(abnormal_draws):  # every normal image, each time
            normal_draws = normal_draws * len(abnormal_draws)
        for a, b in zip(abnormal_draws, normal_draws):
            aurocs.append(auroc(abnormal[a], normal[b]))
        aurocs = np.asarray(aurocs)
        rows.append({"p": int(p), "fraction_reaching": float((aurocs >= target).mean()),
                     "mean_auroc": float(aurocs.mean()), "subsets": len(aurocs)})
    return pd.DataFrame(rows)


def smallest_sufficient(sizes: Sequence[int], fractions: Sequence[float],
                        level: float = DEFAULT_LEVEL) -> float:
    """The smallest size whose fraction, and every larger size's, is >= ``level``; inf if none
    (not even the largest size measured)."""
    order = np.argsort(sizes)
    sizes, fractions = np.asarray(sizes)[order], np.asarray(fractions, float)[order]
    good = fractions >= level
    if not good[-1]:
        return np.inf
    failing = np.flatnonzero(~good)
    return float(sizes[failing[-1] + 1] if len(failing) else sizes[0])


def needed_text(value: float, largest: int) -> str:
    return f"> {largest}" if not np.isfinite(value) else f"{int(value)}"
