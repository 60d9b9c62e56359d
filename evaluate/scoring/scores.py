"""The anomaly score A(f, E, x) = mean_i d(z, z_i) / mean_{i<j} d(z_i, z_j), per image (SPEC "Anomaly score").

z = E(f, x) and z_i = E(g_i, x) are rendered visualisations; d works on cached ``Features``. The
reference-reference distances of each image are computed once (an (N, n, n) array) and reused for
every scored model. A reference g_k is scored against the other n-1 references, and its spread is
taken over the pairs that do not involve it (leave-one-out, as the paper's code does).

Degenerate images, where the references' visualisations do not differ (spread 0, e.g. identical
renders), get score NaN and flag ``zero_reference_spread`` instead of a crash or an infinite score.
"""
from __future__ import annotations

from itertools import combinations
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from counteraudit.evaluate.scoring.distances.base import Distance, Features

FLAG_OK = "ok"
FLAG_ZERO_REFERENCE_SPREAD = "zero_reference_spread"
FLAG_NONFINITE_DISTANCE = "nonfinite_distance"
# A spread at or below this counts as zero: identical renders can differ by float noise when
# their features came from different batch positions, and dividing by noise gives a huge,
# meaningless score. Perceptibly different images are orders of magnitude further apart.
ZERO_SPREAD_TOLERANCE = 1e-9

SCORE_COLUMNS = ["model", "image", "score", "numerator", "spread", "n_references", "is_reference", "flag"]


def check_references(features_by_model: Mapping[str, Features], references: Sequence[str],
                     models: Sequence[str]) -> None:
    references = list(references)
    if len(set(references)) != len(references):
        raise ValueError(f"reference names repeat: {references}")
    missing = [name for name in [*references, *models] if name not in features_by_model]
    if missing:
        raise KeyError(f"no features for {missing}; features exist for {sorted(features_by_model)}")
    scored_references = [m for m in models if m in references]
    needed = 3 if scored_references else 2  # leave-one-out still needs one reference pair
    if len(references) < needed:
        raise ValueError(f"{len(references)} references {references} are too few: the spread needs a pair"
                         + (f", and scoring reference {scored_references[0]!r} leaves it out, so at "
                            f"least 3 are needed" if scored_references else ""))
    sizes = {name: len(features_by_model[name]) for name in [*references, *models]}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"every model needs features of the same images; image counts differ: {sizes}")


def reference_distance_matrix(features_by_model: Mapping[str, Features], references: Sequence[str],
                              distance: Distance) -> np.ndarray:
    """(N, n, n) distances between the references' visualisations of each image; diagonal 0."""
    count = len(features_by_model[references[0]])
    matrix = np.zeros((count, len(references), len(references)), dtype=np.float64)
    for i, j in combinations(range(len(references)), 2):
        d = distance.paired(features_by_model[references[i]], features_by_model[references[j]])
        matrix[:, i, j] = matrix[:, j, i] = d
    return matrix


def mean_pair_distance(matrix: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Per image, mean of matrix[:, i, j] over pairs i < j with both i and j in ``keep`` (bool, (n,))."""
    kept = matrix[:, keep][:, :, keep]
    n = int(keep.sum())
    upper = np.triu_indices(n, k=1)
    return kept[:, upper[0], upper[1]].mean(axis=1)


def anomaly_scores(features_by_model: Mapping[str, Features], references: Sequence[str],
                   distance: Distance, *, models: Sequence[str] | None = None,
                   image_ids: Sequence | None = None, labels: Mapping[str, object] | None = None,
                   reference_matrix: np.ndarray | None = None,
                   zero_spread_tolerance: float = ZERO_SPREAD_TOLERANCE) -> pd.DataFrame:
    """Per-image anomaly scores of ``models`` (default: every model in the mapping, references too).

    ``features_by_model``: model name -> features of its visualisations of the same N images (one
    method, image set and layer). ``image_ids``: names of the N images (default 0..N-1). ``labels``:
    constant columns to add (method, layer, distance, abnormal, ...). ``reference_matrix``: a
    precomputed ``reference_distance_matrix`` to reuse.

    Returns one row per (model, image): score, numerator (mean distance to the references), spread
    (mean distance between references), n_references, is_reference, flag.
    """
    references = list(references)
    models = list(features_by_model) if models is None else list(models)
    check_references(features_by_model, references, models)
    count = len(features_by_model[references[0]])
    image_ids = list(range(count)) if image_ids is None else list(image_ids)
    if len(image_ids) != count:
        raise ValueError(f"{len(image_ids)} image_ids for features of {count} images")
    if reference_matrix is None:
        reference_matrix = reference_distance_matrix(features_by_model, references, distance)
    elif reference_matrix.shape != (count, len(references), len(references)):
        raise ValueError(f"reference_matrix has shape {reference_matrix.shape}, expected "
                         f"{(count, len(references), len(references))}")

    all_references = np.ones(len(references), dtype=bool)
    full_spread = mean_pair_distance(reference_matrix, all_references)
    frames = []
    for model in models:
        if model in references:
            position = references.index(model)
            others = all_references.copy()
            others[position] = False
            numerator = reference_matrix[:, position, others].mean(axis=1)
            spread = mean_pair_distance(reference_matrix, others)
            n_references = len(references) - 1
        else:
            features = features_by_model[model]
            to_references = np.stack([distance.paired(features, features_by_model[r]) for r in references],
                                     axis=1)
            numerator = to_references.mean(axis=1)
            spread = full_spread
            n_references = len(references)
        frames.append(score_frame(model, image_ids, numerator, spread, n_references,
                                  model in references, zero_spread_tolerance))
    result = pd.concat(frames, ignore_index=True)
    for column, value in reversed(list((labels or {}).items())):
        result.insert(0, column, [value] * len(result))
    return result


def score_frame(model: str, image_ids: list, numerator: np.ndarray, spread: np.ndarray,
                n_references: int, is_reference: bool, zero_spread_tolerance: float) -> pd.DataFrame:
    nonfinite = ~(np.isfinite(numerator) & np.isfinite(spread))
    zero_spread = ~nonfinite & (spread <= zero_spread_tolerance)
    with np.errstate(divide="ignore", invalid="ignore"):
        score = np.where(nonfinite | zero_spread, np.nan, numerator / np.where(zero_spread, 1.0, spread))
    flag = np.where(nonfinite, FLAG_NONFINITE_DISTANCE, np.where(zero_spread, FLAG_ZERO_REFERENCE_SPREAD, FLAG_OK))
    return pd.DataFrame({
        "model": model, "image": image_ids, "score": score, "numerator": numerator, "spread": spread,
        "n_references": n_references, "is_reference": is_reference, "flag": flag,
    })
