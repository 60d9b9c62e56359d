"""Localization (SPEC "Localization"): is A higher on the inputs where the model misbehaves?

AUROC of the per-image anomaly score for abnormal (positive) vs normal images, equal to
``sklearn.metrics.roc_auc_score`` (ties count one half). With it: a seeded bootstrap interval
(abnormal and normal images resampled separately, so both set sizes stay fixed) and the chance band
for the set sizes used (percentiles of the AUROC when the abnormal/normal labels are permuted):
with p = 40 + 40 images an AUROC inside roughly [0.4, 0.6] cannot be told from chance.

Input is the tidy frame of ``evaluate.scores.anomaly_scores`` with a boolean ``abnormal`` column
(score the normal and the abnormal image sets with labels={'abnormal': False/True} and concatenate).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
from scipy.stats import rankdata

from counteraudit.evaluate.scoring.detection import NO_LAYER, check_columns, with_layer_column
from counteraudit.train.core.artifacts import derive_seed

DEFAULT_RESAMPLES = 2000
DEFAULT_LEVEL = 0.95
# What Table 2 and the zoo summary say of a method localization does not apply to (a model-level
# method: feature synthesis explains the model, not an input).
NOT_APPLICABLE = "not applicable"
# The AUROC Denain & Steinhardt (2023) count as a localization success (with their p = 40 images a
# side, [0.4, 0.6] cannot be told from chance); it holds only where the chance band lies below it.
PAPER_SUCCESS_AUROC = 0.7
# What an AUROC says of one (method, model), read against that model's own chance band
# (``localization_call``).
LOCALIZED, ABOVE_CHANCE, WITHIN_CHANCE, BELOW_CHANCE = (
    "localized", "above chance", "within chance", "below chance")
LOCALIZATION_CALLS = (LOCALIZED, ABOVE_CHANCE, WITHIN_CHANCE, BELOW_CHANCE)


def finite_scores(values, what: str) -> np.ndarray:
    """``values`` as a flat float64 array; an error naming ``what`` ("abnormal", "normal") when
    there are none or some are NaN/inf."""
    values = np.asarray(values, dtype=np.float64).ravel()
    if len(values) == 0:
        raise ValueError(f"AUROC needs at least one {what} score, got none")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{what} scores contain NaN/inf ({int((~np.isfinite(values)).sum())} of "
                         f"{len(values)}); drop flagged images first")
    return values


def auroc(abnormal_scores, normal_scores) -> float:
    """P(score of a random abnormal image > a random normal one), ties counted 1/2 (Mann-Whitney U)."""
    abnormal = finite_scores(abnormal_scores, "abnormal")
    normal = finite_scores(normal_scores, "normal")
    ranks = rankdata(np.concatenate([abnormal, normal]))  # average ranks handle ties
    n_abnormal, n_normal = len(abnormal), len(normal)
    u_statistic = ranks[:n_abnormal].sum() - n_abnormal * (n_abnormal + 1) / 2
    return float(u_statistic / (n_abnormal * n_normal))


def percentile_interval(values: np.ndarray, level: float) -> tuple[float, float]:
    """The central ``level`` interval of ``values`` (resampled or permuted statistics): their
    (1 - level)/2 and (1 + level)/2 percentiles."""
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def bootstrap_auroc_interval(abnormal_scores, normal_scores, *, n_resamples: int = DEFAULT_RESAMPLES,
                             level: float = DEFAULT_LEVEL, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the AUROC; the same seed gives the same interval.

    A resample's AUROC is counts_a^T W counts_n / (n_a n_n), with W[i, j] = 1 if a_i > n_j, 1/2 if
    equal: exact, and no re-ranking per resample.
    """
    abnormal = finite_scores(abnormal_scores, "abnormal")
    normal = finite_scores(normal_scores, "normal")
    resampled = _resampled_aurocs(abnormal, normal, n_resamples, np.random.default_rng(seed))
    return percentile_interval(resampled, level)


def permutation_aurocs(abnormal_scores, normal_scores, *, n_permutations: int = DEFAULT_RESAMPLES,
                       seed: int = 0) -> np.ndarray:
    """AUROCs of the pooled scores under random abnormal/normal relabelling (set sizes kept)."""
    abnormal = finite_scores(abnormal_scores, "abnormal")
    normal = finite_scores(normal_scores, "normal")
    ranks = rankdata(np.concatenate([abnormal, normal]))
    rng = np.random.default_rng(seed)
    shuffled = rng.permuted(np.broadcast_to(ranks, (n_permutations, len(ranks))), axis=1)
    n_abnormal, n_normal = len(abnormal), len(normal)
    return (shuffled[:, :n_abnormal].sum(axis=1) - n_abnormal * (n_abnormal + 1) / 2) / (n_abnormal * n_normal)


def chance_band(abnormal_scores, normal_scores, *, n_permutations: int = DEFAULT_RESAMPLES,
                level: float = DEFAULT_LEVEL, seed: int = 0) -> tuple[float, float, float]:
    """(low, high, p_value): the ``level`` band of AUROC under label permutation, and the one-sided
    permutation p-value (1 + #{perm AUROC >= observed}) / (n_permutations + 1)."""
    permuted = permutation_aurocs(abnormal_scores, normal_scores, n_permutations=n_permutations, seed=seed)
    observed = auroc(abnormal_scores, normal_scores)
    low, high = percentile_interval(permuted, level)
    p_value = (1 + int((permuted >= observed - 1e-12).sum())) / (n_permutations + 1)
    return low, high, p_value


def localization_call(auroc_value: float, chance_low: float, chance_high: float, *,
                      target: float = PAPER_SUCCESS_AUROC) -> str | None:
    """What one AUROC says, against the chance band of its own model (``chance_band``: the
    central 95% of its AUROCs under label permutation, for that model's set sizes and ties):
    ``LOCALIZED`` when it reaches the paper's ``target`` AND lies above the band; ``ABOVE_CHANCE``
    above the band but under ``target``; ``WITHIN_CHANCE`` inside the band (whatever ``target``
    says: e.g. 0.74 with a band of [0.24, 0.75] cannot be told from chance); ``BELOW_CHANCE``
    under it; None for a NaN (no AUROC).

    The AUROC itself, not its bootstrap interval's low end, is compared with the band: the band
    already is the null distribution of that very statistic, so "AUROC > chance_high" is the
    one-sided permutation test at 2.5% (the table's ``p_value`` reads the same test). Asking the
    interval's low end to clear the band would compare an interval with an interval: a test at a
    far smaller level than 2.5%, which contradicts the permutation p-value (0.89 with an interval
    of [0.72, 1.00] and a band ending at 0.76 has p = 0.002, yet would not count) and, at the
    p = 10 images of small suites, leaves almost nothing localizable."""
    values = np.array([auroc_value, chance_low, chance_high], dtype=np.float64)
    if not np.all(np.isfinite(values)):
        return None
    if auroc_value > chance_high:
        return LOCALIZED if auroc_value >= target else ABOVE_CHANCE
    return WITHIN_CHANCE if auroc_value >= chance_low else BELOW_CHANCE


def localization_table(scores: pd.DataFrame, *, abnormal_column: str = "abnormal",
                       by: Sequence[str] = ("method",), per_layer: bool = False,
                       models: Sequence[str] | None = None, n_resamples: int = DEFAULT_RESAMPLES,
                       level: float = DEFAULT_LEVEL, seed: int = 0) -> pd.DataFrame:
    """Per (by..., [layer,] model): auroc, ci_low, ci_high, chance_low, chance_high, p_value,
    n_abnormal, n_normal, n_flagged, flag.

    Layered methods: with ``per_layer`` False an image's score is first averaged over the layers
    (the overall Caricature score), then ranked. Flagged (NaN) scores are skipped and counted. Each
    group's random draws use ``derive_seed(seed, group key)``, so adding a model changes no other row.
    """
    by = list(by)
    check_columns(scores, [*by, "model", "image", "score", abnormal_column], "scores")
    frame = with_layer_column(scores)
    if models is not None:
        frame = frame[frame["model"].isin(list(models))]
    if not per_layer:
        frame = (frame.groupby([*by, "model", "image", abnormal_column], sort=False, dropna=False)
                 .agg(score=("score", "mean")).reset_index().assign(layer=NO_LAYER))
    keys = [*by, *(["layer"] if per_layer else []), "model"]
    rows = []
    for key, group in frame.groupby(keys, sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        usable = group[np.isfinite(group["score"].to_numpy(dtype=float))]
        is_abnormal = usable[abnormal_column].astype(bool).to_numpy()
        abnormal, normal = usable["score"].to_numpy()[is_abnormal], usable["score"].to_numpy()[~is_abnormal]
        row = dict(zip(keys, key), n_abnormal=len(abnormal), n_normal=len(normal),
                   n_flagged=len(group) - len(usable))
        if len(abnormal) == 0 or len(normal) == 0:
            rows.append({**row, "auroc": np.nan, "ci_low": np.nan, "ci_high": np.nan, "chance_low": np.nan,
                         "chance_high": np.nan, "p_value": np.nan,
                         "flag": ("all_scores_flagged" if usable.empty  # e.g. a model-blind method
                                  else "no_abnormal_images" if len(abnormal) == 0
                                  else "no_normal_images")})
            continue
        group_seed = derive_seed(seed, "localization", *map(str, key))
        ci_low, ci_high = bootstrap_auroc_interval(abnormal, normal, n_resamples=n_resamples, level=level,
                                                   seed=derive_seed(group_seed, "bootstrap"))
        chance_low, chance_high, p_value = chance_band(abnormal, normal, n_permutations=n_resamples,
                                                       level=level, seed=derive_seed(group_seed, "permutation"))
        rows.append({**row, "auroc": auroc(abnormal, normal), "ci_low": ci_low, "ci_high": ci_high,
                     "chance_low": chance_low, "chance_high": chance_high, "p_value": p_value, "flag": "ok"})
    columns = [*keys, "auroc", "ci_low", "ci_high", "chance_low", "chance_high", "p_value",
               "n_abnormal", "n_normal", "n_flagged", "flag"]
    return pd.DataFrame(rows, columns=columns)


LAYER_AVERAGE = "layer average"


def paper_layout(per_model: pd.DataFrame, per_layer: pd.DataFrame, *,
                 by: Sequence[str] = ("method",)) -> pd.DataFrame:
    """Table 2's rows as the paper lays them out: a layered method (Caricatures) one row per layer,
    then its layer average as an extra row; other methods one row. ``per_model`` and ``per_layer``
    are ``localization_table``'s two forms; the result goes to ``table2``."""
    by = list(by)
    layered = (per_layer[per_layer["layer"] != NO_LAYER] if "layer" in per_layer.columns
               else per_layer.iloc[:0].assign(layer=NO_LAYER))
    layered_keys = set(map(tuple, layered[by].astype(str).to_numpy()))
    parts = []
    for key, group in per_model.groupby(by, sort=False):
        key = tuple(map(str, key if isinstance(key, tuple) else (key,)))
        if key in layered_keys:
            mask = (layered[by].astype(str) == list(key)).all(axis=1)
            parts += [layered[mask], group.assign(layer=LAYER_AVERAGE)]
        else:
            parts.append(group.assign(layer=NO_LAYER))
    return pd.concat(parts, ignore_index=True) if parts else per_model.assign(layer=NO_LAYER)


def table2_rows(localizations: pd.DataFrame, by: Sequence[str] = ("method",)) -> pd.Series:
    """Each row's name in Table 2: its ``by`` values and layer, joined by spaces."""
    row_keys = [*by, *(["layer"] if "layer" in localizations.columns else [])]
    return localizations[row_keys].astype(str).agg(lambda parts: " ".join(p for p in parts if p),
                                                   axis=1)


def table2_bands(per_model: pd.DataFrame, per_layer: pd.DataFrame, *,
                 by: Sequence[str] = ("method",)) -> pd.DataFrame:
    """Each cell of Table 2 (``table2(paper_layout(...))``) with its own chance band: method (the
    row's name, ``table2_rows``), model, chance_low, chance_high."""
    layout = paper_layout(per_model, per_layer, by=by)
    return pd.DataFrame({"method": table2_rows(layout, by), "model": layout["model"],
                         "chance_low": layout["chance_low"],
                         "chance_high": layout["chance_high"]}).reset_index(drop=True)


def table2(localizations: pd.DataFrame, *, by: Sequence[str] = ("method",), value: str = "auroc",
           with_interval: bool = False, digits: int = 2) -> pd.DataFrame:
    """Table 2: rows = method (method/layer), columns = model, values = AUROC (or "0.94 [0.88, 0.99]"
    strings with ``with_interval``)."""
    frame = localizations.assign(row=table2_rows(localizations, by))
    if with_interval:
        frame = frame.assign(cell=[f"{a:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]" if np.isfinite(a) else "n/a"
                                   for a, lo, hi in zip(frame[value], frame["ci_low"], frame["ci_high"])])
        wide = frame.pivot(index="row", columns="model", values="cell")
    else:
        wide = frame.pivot_table(index="row", columns="model", values=value, sort=False, dropna=False)
    wide = wide.reindex(index=list(dict.fromkeys(frame["row"])), columns=list(dict.fromkeys(frame["model"])))
    wide.columns.name = None
    wide.index.name = "method"
    return wide.reset_index()


def _resampled_aurocs(abnormal: np.ndarray, normal: np.ndarray, n_resamples: int,
                      rng: np.random.Generator) -> np.ndarray:
    """``n_resamples`` AUROCs of one model's images resampled with replacement, abnormal and normal
    apart (set sizes kept), as ``bootstrap_auroc_interval`` draws them."""
    wins = (abnormal[:, None] > normal[None, :]) + 0.5 * (abnormal[:, None] == normal[None, :])
    counts_abnormal = rng.multinomial(len(abnormal), np.full(len(abnormal), 1 / len(abnormal)),
                                      size=n_resamples)
    counts_normal = rng.multinomial(len(normal), np.full(len(normal), 1 / len(normal)),
                                    size=n_resamples)
    return (np.einsum("bi,ij,bj->b", counts_abnormal, wins, counts_normal)
            / (len(abnormal) * len(normal)))


def replicate_auroc_interval(per_model_scores: Sequence[tuple[np.ndarray, np.ndarray]], *,
                             n_resamples: int = DEFAULT_RESAMPLES, level: float = DEFAULT_LEVEL,
                             seed: int = 0) -> tuple[float, float, float]:
    """(mean AUROC over the replicates, low, high): a two-stage bootstrap that resamples models,
    then each drawn model's images. ``per_model_scores``: one (abnormal, normal) pair of score
    arrays per replicate. Each resample draws k of the k models with replacement and, for each,
    that resample's image draw of that model; so the interval holds the spread between seeds as
    well as between images."""
    pairs = [(finite_scores(a, "abnormal"), finite_scores(n, "normal")) for a, n in per_model_scores]
    if not pairs:
        raise ValueError("a replicated AUROC needs at least one model's scores")
    rng = np.random.default_rng(seed)
    resampled = np.stack([_resampled_aurocs(a, n, n_resamples, rng) for a, n in pairs])  # (k, B)
    drawn = rng.integers(0, len(pairs), size=(n_resamples, len(pairs)))
    means = resampled[drawn, np.arange(n_resamples)[:, None]].mean(axis=1)
    low, high = percentile_interval(means, level)
    return float(np.mean([auroc(a, n) for a, n in pairs])), low, high


def replicate_localization_table(scores: pd.DataFrame, configurations: dict[str, str], *,
                                 abnormal_column: str = "abnormal", by: Sequence[str] = ("method",),
                                 n_resamples: int = DEFAULT_RESAMPLES, level: float = DEFAULT_LEVEL,
                                 seed: int = 0) -> pd.DataFrame:
    """Per (by..., configuration): n_models, mean_auroc over its replicates, the two-stage
    bootstrap interval (``replicate_auroc_interval``) and the band of that mean under chance
    (``replicate_chance_band``: chance_low, chance_high; layered methods' scores averaged over
    layers per image first, flagged images skipped). ``configurations``: model -> its
    configuration (a model missing from it is its own)."""
    by = list(by)
    check_columns(scores, [*by, "model", "image", "score", abnormal_column], "scores")
    frame = (with_layer_column(scores)
             .groupby([*by, "model", "image", abnormal_column], sort=False, dropna=False)
             .agg(score=("score", "mean")).reset_index())
    frame = frame[np.isfinite(frame["score"].to_numpy(dtype=float))]
    frame = frame.assign(configuration=[configurations.get(m, m) for m in frame["model"]])
    rows = []
    for key, group in frame.groupby([*by, "configuration"], sort=False):
        pairs = []
        for _, model_rows in group.groupby("model", sort=False):
            is_abnormal = model_rows[abnormal_column].astype(bool).to_numpy()
            values = model_rows["score"].to_numpy(float)
            if is_abnormal.any() and (~is_abnormal).any():
                pairs.append((values[is_abnormal], values[~is_abnormal]))
        row = dict(zip([*by, "configuration"], key), n_models=len(pairs))
        if not pairs:
            rows.append({**row, "mean_auroc": np.nan, "ci_low": np.nan, "ci_high": np.nan,
                         "chance_low": np.nan, "chance_high": np.nan})
            continue
        mean, low, high = replicate_auroc_interval(
            pairs, n_resamples=n_resamples, level=level,
            seed=derive_seed(seed, "replicates", *map(str, key)))
        chance_low, chance_high = replicate_chance_band(
            pairs, n_permutations=n_resamples, level=level,
            seed=derive_seed(seed, "replicates-chance", *map(str, key)))
        rows.append({**row, "mean_auroc": mean, "ci_low": low, "ci_high": high,
                     "chance_low": chance_low, "chance_high": chance_high})
    return pd.DataFrame(rows, columns=[*by, "configuration", "n_models", "mean_auroc", "ci_low",
                                       "ci_high", "chance_low", "chance_high"])


def replicate_chance_band(per_model_scores: Sequence[tuple[np.ndarray, np.ndarray]], *,
                          n_permutations: int = DEFAULT_RESAMPLES, level: float = DEFAULT_LEVEL,
                          seed: int = 0) -> tuple[float, float]:
    """The ``level`` band of the mean AUROC over replicates when no model's scores tell abnormal
    from normal: each model's labels permuted apart (``permutation_aurocs``, set sizes kept), the
    permuted AUROCs averaged over the models, permutation by permutation. A mean of several
    models' AUROCs has a narrower band than any one of them; above its upper end, the
    configuration is localized beyond chance."""
    if not per_model_scores:
        raise ValueError("a replicated chance band needs at least one model's scores")
    permuted = np.stack([permutation_aurocs(a, n, n_permutations=n_permutations,
                                            seed=derive_seed(seed, "replicate-chance", position))
                         for position, (a, n) in enumerate(per_model_scores)])
    return percentile_interval(permuted.mean(axis=0), level)
