"""Any method against any other, paired: on the same images and the same models.

A pair (method, against) compares two explanation methods as ``baseline.py`` compares each one
with the outputs-only control, which is one ``against`` among others here:

- **Detection, per model** (``detection_pairs``): margin(method) / margin(against), Table 1's
  margins recomputed on the detection images both scored finitely for the model and every
  reference, with a paired bootstrap interval (the images resampled once for both methods). The
  verdict is ``adds`` when the interval lies above 1, ``less`` below, ``same`` when it holds 1 and
  ``neither`` when neither method detects the model (two margins below 1 say where the highest
  reference sits, not how far the model is: they compare nothing).
- **Localization, per model** (``localization_pairs``): dAUROC = AUROC(method) - AUROC(against)
  on the images both scored, with its paired bootstrap interval; ``adds`` above 0, ``less`` below.
- **Detection over models** (``detection_mcnemar``): McNemar's exact test of the two methods'
  detections of the anomalous models (the discordant models alone count), Holm-adjusted over the
  pairs shown.
- **Detection rates per family** (``family_rate_differences``, a suite with null models and
  replicates): the difference of the two methods' rates of "detected" verdicts over the family's
  models, with Newcombe's paired interval at the Bonferroni level 1 - alpha/m and McNemar's exact
  p-value Holm-adjusted over the m rows shown.

The bootstrap seed of a pair is symmetric in it, so (a, b) and (b, a) draw the same resamples and
mirror each other exactly; a pair with the outputs-only control draws what ``baseline.py`` always
drew for it, so its tables keep their numbers.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

from counteraudit.evaluate.scoring.detection import (ROLE_ANOMALOUS, ROLE_NULL, ROLE_REFERENCE, check_columns,
                                                     with_layer_column)
from counteraudit.evaluate.scoring.localization import (DEFAULT_LEVEL, DEFAULT_RESAMPLES, finite_scores,
                                                        percentile_interval)
from counteraudit.evaluate.scoring.verdicts import DETECTED, IMPLANT_FAILED
from counteraudit.train.core.artifacts import derive_seed

BASELINE = "outputs_only"
ADDS, SAME, LESS = "adds", "same", "less"
NEITHER = "neither"  # neither method detects the model: its margins compare nothing
HOLM = "holm"  # statsmodels' multipletests method

Pair = tuple[str, str]


def pairs_for(method: str | Sequence[str], against: str | Sequence[str]) -> list[Pair]:
    """Every (method, against) pair of the names given, in their order, none of a method with
    itself: ``pairs_for("mine", ["gradcam", "guided_backprop"])``."""
    methods = [method] if isinstance(method, str) else list(method)
    others = [against] if isinstance(against, str) else list(against)
    pairs = list(dict.fromkeys((m, a) for m in methods for a in others if m != a))
    if not pairs:
        raise ValueError(f"methods {methods} against {others} make no pair: name at least one "
                         "method to compare that is not among those it is compared against")
    return pairs


def pair_seed(seed: int, purpose: str, method: str, against: str, model: str) -> int:
    """The bootstrap seed of one pair on one model: symmetric in the pair (so (a, b) mirrors
    (b, a)); a pair with the control keeps the seed of ``baseline.py``'s comparison."""
    if BASELINE in (method, against) and method != against:
        other = against if method == BASELINE else method
        return derive_seed(seed, f"{purpose}versus-baseline", other, model)
    first, second = sorted((method, against))
    return derive_seed(seed, f"{purpose}versus", first, second, model)


def _wins(abnormal: np.ndarray, normal: np.ndarray) -> np.ndarray:
    """W[i, j] = 1 if abnormal i outscores normal j, 1/2 on a tie: AUROC = mean of W."""
    return (abnormal[:, None] > normal[None, :]) + 0.5 * (abnormal[:, None] == normal[None, :])


def paired_delta_interval(abnormal_a, normal_a, abnormal_b, normal_b, *,
                          n_resamples: int = DEFAULT_RESAMPLES, level: float = DEFAULT_LEVEL,
                          seed: int = 0) -> tuple[float, float, float]:
    """(AUROC_a - AUROC_b, low, high): the difference of two methods' AUROCs on the same images
    (row i of ``abnormal_a`` and of ``abnormal_b`` is one image, likewise the normal ones) and
    its paired percentile bootstrap interval: each resample draws abnormal and normal images
    (with replacement, set sizes kept) and scores both methods on the very same draw, so what
    the two share cancels out of the difference. Exact per resample: counts^T (W_a - W_b) counts."""
    abnormal_a, normal_a = finite_scores(abnormal_a, "abnormal"), finite_scores(normal_a, "normal")
    abnormal_b, normal_b = finite_scores(abnormal_b, "abnormal"), finite_scores(normal_b, "normal")
    if abnormal_a.shape != abnormal_b.shape or normal_a.shape != normal_b.shape:
        raise ValueError(f"paired scores need the same images for both methods; got "
                         f"{len(abnormal_a)} + {len(normal_a)} against "
                         f"{len(abnormal_b)} + {len(normal_b)} abnormal + normal images")
    n_abnormal, n_normal = len(abnormal_a), len(normal_a)
    difference = _wins(abnormal_a, normal_a) - _wins(abnormal_b, normal_b)
    rng = np.random.default_rng(seed)
    counts_abnormal = rng.multinomial(n_abnormal, np.full(n_abnormal, 1 / n_abnormal),
                                      size=n_resamples)
    counts_normal = rng.multinomial(n_normal, np.full(n_normal, 1 / n_normal), size=n_resamples)
    resampled = np.einsum("bi,ij,bj->b", counts_abnormal, difference, counts_normal) \
        / (n_abnormal * n_normal)
    low, high = percentile_interval(resampled, level)
    return float(difference.mean()), low, high


def verdict(low: float, high: float) -> str:
    return ADDS if low > 0 else LESS if high < 0 else SAME


def image_scores(scores: pd.DataFrame, keys: Sequence[str] = ()) -> pd.DataFrame:
    """One score per (method, model, image, *keys): layered methods averaged over their layers,
    as Table 2 ranks them; flagged (NaN) images dropped."""
    # the image set is part of an image's name: a model-level method's or detector's rows (its
    # classes, the model itself) are never paired with a detection image of the same position
    by = ["method", "model", *(["image_set"] if "image_set" in scores.columns else []), "image", *keys]
    frame = with_layer_column(scores)
    frame = frame.groupby(by, sort=False).agg(score=("score", "mean")).reset_index()
    return frame[np.isfinite(frame["score"].to_numpy(dtype=float))]


def scored_methods(scores: pd.DataFrame) -> list[str]:
    """The methods with at least one finite score, in their order in ``scores``."""
    check_columns(scores, ["method", "score"], "scores")
    finite = np.isfinite(scores["score"].to_numpy(dtype=float))
    return list(dict.fromkeys(scores.loc[finite, "method"]))


def _require_methods(pairs: Sequence[Pair], methods: Sequence[str], what: str) -> None:
    missing = [name for name in dict.fromkeys(n for pair in pairs for n in pair)
               if name not in methods]
    if missing:
        raise ValueError(f"the comparison needs the scores of {missing}; the {what} hold "
                         f"{list(methods)}: add {missing} to the suite's [explain] methods "
                         "(or name them with --method)")


LOCALIZATION_PAIR_COLUMNS = ["method", "against", "model", "auroc", "against_auroc",
                             "delta_auroc", "delta_low", "delta_high", "verdict", "n_abnormal",
                             "n_normal"]


def localization_pairs(scores: pd.DataFrame, pairs: Sequence[Pair], *,
                       abnormal_column: str = "abnormal", models: Sequence[str] | None = None,
                       n_resamples: int = DEFAULT_RESAMPLES, level: float = DEFAULT_LEVEL,
                       seed: int = 0) -> pd.DataFrame:
    """Per (pair, localizable model): auroc, against_auroc, delta_auroc with its paired interval
    (delta_low, delta_high), verdict, and n_abnormal / n_normal, the images both methods scored.

    ``scores`` is the tidy frame Table 2 comes from (``localization_scores``); images flagged for
    either method are left out of both, so the two AUROCs are on the same images."""
    check_columns(scores, ["method", "model", "image", "score", abnormal_column], "scores")
    frame = image_scores(scores, [abnormal_column])
    if models is not None:
        frame = frame[frame["model"].isin(list(models))]
    _require_methods(pairs, list(dict.fromkeys(frame["method"])), "localization scores")
    keys = ["model", "image", abnormal_column]
    rows = []
    for method, against in pairs:
        theirs = frame[frame["method"] == against]
        for model, group in frame[frame["method"] == method].groupby("model", sort=False):
            paired = group.merge(theirs[theirs["model"] == model][[*keys, "score"]], on=keys,
                                 suffixes=("", "_against"))
            is_abnormal = paired[abnormal_column].astype(bool).to_numpy()
            a, b = paired["score"].to_numpy(float), paired["score_against"].to_numpy(float)
            row = {"method": method, "against": against, "model": model,
                   "n_abnormal": int(is_abnormal.sum()), "n_normal": int((~is_abnormal).sum())}
            if row["n_abnormal"] == 0 or row["n_normal"] == 0:
                rows.append({**row, "auroc": np.nan, "against_auroc": np.nan,
                             "delta_auroc": np.nan, "delta_low": np.nan, "delta_high": np.nan,
                             "verdict": "n/a"})
                continue
            delta, low, high = paired_delta_interval(
                a[is_abnormal], a[~is_abnormal], b[is_abnormal], b[~is_abnormal],
                n_resamples=n_resamples, level=level,
                seed=pair_seed(seed, "", method, against, model))
            auroc_a = float(_wins(a[is_abnormal], a[~is_abnormal]).mean())
            rows.append({**row, "auroc": auroc_a, "against_auroc": auroc_a - delta,
                         "delta_auroc": delta, "delta_low": low, "delta_high": high,
                         "verdict": verdict(low, high)})
    return pd.DataFrame(rows, columns=LOCALIZATION_PAIR_COLUMNS)


def _margins(abars: np.ndarray) -> np.ndarray:
    """Margins Abar(f) / max_i Abar(g_i) from rows [model, reference_1, ...] (last axis)."""
    highest = abars[..., 1:].max(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(highest > 0, abars[..., 0] / highest, np.nan)


def paired_margin_ratio_interval(method_scores, against_scores, *,
                                 n_resamples: int = DEFAULT_RESAMPLES,
                                 level: float = DEFAULT_LEVEL,
                                 seed: int = 0) -> tuple[float, float, float, float, float]:
    """(margin, the other's margin, their ratio, low, high) for one model: each argument is an
    (1 + n, N) array of per-image anomaly scores, row 0 the model's, rows 1.. the references'
    leave-one-out ones, column i one detection image for both methods. Each bootstrap resample
    draws N images with replacement and recomputes both margins on that draw; the interval is the
    percentile interval of their ratio."""
    a = np.asarray(method_scores, dtype=np.float64)
    b = np.asarray(against_scores, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2 or a.shape[0] < 2 or a.shape[1] == 0:
        raise ValueError(f"paired margins need (1 + n references, N images) scores of the same "
                         f"images for both methods; got {a.shape} and {b.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("paired margins need finite scores; drop flagged images first")
    n_images = a.shape[1]
    margin, against_margin = _margins(a.mean(axis=1)), _margins(b.mean(axis=1))
    counts = np.random.default_rng(seed).multinomial(
        n_images, np.full(n_images, 1 / n_images), size=n_resamples) / n_images
    with np.errstate(divide="ignore", invalid="ignore"):
        log_ratios = np.log(_margins(counts @ a.T)) - np.log(_margins(counts @ b.T))
        ratio = float(margin / against_margin)
    log_ratios = log_ratios[np.isfinite(log_ratios)]
    if not np.isfinite(ratio) or len(log_ratios) == 0:
        return float(margin), float(against_margin), np.nan, np.nan, np.nan
    low, high = percentile_interval(log_ratios, level)
    return float(margin), float(against_margin), ratio, float(np.exp(low)), float(np.exp(high))


DETECTION_PAIR_COLUMNS = ["method", "against", "model", "role", "detected", "against_detected",
                          "margin", "against_margin", "margin_ratio", "ratio_low", "ratio_high",
                          "verdict", "n_images"]


def detection_pairs(scores: pd.DataFrame, per_model: pd.DataFrame, pairs: Sequence[Pair], *,
                    n_resamples: int = DEFAULT_RESAMPLES, level: float = DEFAULT_LEVEL,
                    seed: int = 0) -> pd.DataFrame:
    """Per (pair, anomalous or held-out model): both margins, their ratio with its paired
    bootstrap interval (``paired_margin_ratio_interval``) and verdict (``adds``: above 1;
    ``neither`` where neither method detects the model), both detections, and n_images, the
    detection images every model scored finitely under both methods (images flagged for either
    are left out of both, and the margins are recomputed on those). Layered methods are averaged
    over their layers per image, as Table 2 does.

    ``scores``: the tidy frame Table 1 comes from; ``per_model``: Table 1's per-model rows (role,
    detected), which say which models are the references and which are scored."""
    check_columns(scores, ["method", "model", "image", "score"], "scores")
    check_columns(per_model, ["method", "model", "role", "detected"], "detection table")
    frame = image_scores(scores)  # flagged images dropped: missing (NaN) in the pivot below
    _require_methods(pairs, list(dict.fromkeys(frame["method"])), "detection scores")
    references = list(dict.fromkeys(per_model[per_model["role"] == ROLE_REFERENCE]["model"]))
    scored = per_model[per_model["role"].isin([ROLE_ANOMALOUS, ROLE_NULL])]
    detected = scored.set_index(["method", "model"])["detected"]
    wide = frame.pivot_table(index=["method", "model"],
                             columns=[c for c in ("image_set", "image") if c in frame.columns],
                             values="score", sort=False, dropna=False)
    rows = []
    for method, against in pairs:
        mine = scored[scored["method"] == method]
        for model, role in dict.fromkeys(zip(mine["model"], mine["role"])):
            names = [model, *references]
            a = wide.reindex([(method, name) for name in names]).to_numpy(float)
            b = wide.reindex([(against, name) for name in names]).to_numpy(float)
            finite = np.isfinite(a).all(axis=0) & np.isfinite(b).all(axis=0)
            row = {"method": method, "against": against, "model": model, "role": role,
                   "detected": bool(detected.get((method, model), False)),
                   "against_detected": bool(detected.get((against, model), False)),
                   "n_images": int(finite.sum())}
            if not finite.any():
                rows.append({**row, "margin": np.nan, "against_margin": np.nan,
                             "margin_ratio": np.nan, "ratio_low": np.nan, "ratio_high": np.nan,
                             "verdict": "n/a"})
                continue
            margin, against_margin, ratio, low, high = paired_margin_ratio_interval(
                a[:, finite], b[:, finite], n_resamples=n_resamples, level=level,
                seed=pair_seed(seed, "detection-", method, against, model))
            said = ("n/a" if not np.isfinite(ratio)
                    else NEITHER if not (row["detected"] or row["against_detected"])
                    else verdict(np.log(low), np.log(high)))
            rows.append({**row, "margin": margin, "against_margin": against_margin,
                         "margin_ratio": ratio, "ratio_low": low, "ratio_high": high,
                         "verdict": said})
    return pd.DataFrame(rows, columns=DETECTION_PAIR_COLUMNS)


def mcnemar_exact_p(detected: Sequence[bool], against_detected: Sequence[bool]) -> float:
    """McNemar's exact p-value (statsmodels) for paired detections of the same models: whether
    the models only the method detects and those only the other detects differ in number by
    more than chance (1.0 when no model is discordant)."""
    a = np.asarray(detected, dtype=bool)
    b = np.asarray(against_detected, dtype=bool)
    table = [[int((a & b).sum()), int((a & ~b).sum())], [int((~a & b).sum()), int((~a & ~b).sum())]]
    return float(mcnemar(table, exact=True).pvalue)


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (statsmodels) of the finite entries; NaN stay NaN."""
    p_values = np.asarray(p_values, dtype=float)
    adjusted = np.full(len(p_values), np.nan)
    finite = np.isfinite(p_values)
    if finite.any():
        adjusted[finite] = multipletests(p_values[finite], method=HOLM)[1]
    return adjusted


def _paired_detections(table: pd.DataFrame, method: str, against: str,
                       column: str) -> tuple[np.ndarray, np.ndarray]:
    """Both methods' detections (``column`` true) of the models ``table`` holds for both, in the
    method's order of models."""
    mine = table[table["method"] == method].drop_duplicates("model").set_index("model")[column]
    theirs = table[table["method"] == against].drop_duplicates("model").set_index("model")[column]
    models = [model for model in mine.index if model in theirs.index]
    return (mine.reindex(models).astype(bool).to_numpy(),
            theirs.reindex(models).astype(bool).to_numpy())


DETECTION_MCNEMAR_COLUMNS = ["method", "against", "n_models", "n_only_method", "n_only_against",
                             "p", "p_holm"]


def detection_mcnemar(per_model: pd.DataFrame, pairs: Sequence[Pair]) -> pd.DataFrame:
    """Per pair, over the anomalous models Table 1 holds for both methods: n_models, the models
    only the method detects (n_only_method) and only the other (n_only_against) by the paper's
    rule, McNemar's exact p and p_holm, Holm-adjusted over the pairs shown."""
    check_columns(per_model, ["method", "model", "role", "detected"], "detection table")
    _require_methods(pairs, list(dict.fromkeys(per_model["method"])), "detection table")
    anomalous = per_model[per_model["role"] == ROLE_ANOMALOUS]
    rows = []
    for method, against in pairs:
        a, b = _paired_detections(anomalous, method, against, "detected")
        rows.append({"method": method, "against": against, "n_models": len(a),
                     "n_only_method": int((a & ~b).sum()), "n_only_against": int((~a & b).sum()),
                     "p": mcnemar_exact_p(a, b) if len(a) else np.nan})
    table = pd.DataFrame(rows, columns=DETECTION_MCNEMAR_COLUMNS[:-1])
    return table.assign(p_holm=holm(table["p"].to_numpy(float)))


def wilson_interval(successes: int, trials: int, level: float) -> tuple[float, float]:
    """Wilson's score interval of a proportion (statsmodels), without continuity correction."""
    low, high = proportion_confint(int(successes), int(trials), alpha=1 - level, method="wilson")
    return float(low), float(high)


def paired_difference_interval(n_both: int, n_only_method: int, n_only_against: int,
                               n_neither: int, *, level: float = DEFAULT_LEVEL
                               ) -> tuple[float, float, float]:
    """(p1 - p2, low, high) for two correlated proportions measured on the same n subjects:
    p1 = (n_both + n_only_method) / n, p2 = (n_both + n_only_against) / n. Newcombe's hybrid
    score interval for paired data (Newcombe 1998, Stat Med 17:2635, method 10): the Wilson
    intervals (l1, u1), (l2, u2) of the two margins combined square-and-add, with phi, the
    correlation of the two margins, corrected for continuity, so the interval stays inside
    [-1, 1] and behaves at small n where the Wald interval collapses."""
    n = n_both + n_only_method + n_only_against + n_neither
    if n == 0:
        return np.nan, np.nan, np.nan
    k1, k2 = n_both + n_only_method, n_both + n_only_against
    p1, p2 = k1 / n, k2 / n
    l1, u1 = wilson_interval(k1, n, level)
    l2, u2 = wilson_interval(k2, n, level)
    margins = k1 * (n - k1) * k2 * (n - k2)
    cross = n_both * n_neither - n_only_method * n_only_against
    if margins == 0 or 0 <= cross <= n / 2:
        phi = 0.0
    else:
        phi = (cross - n / 2 if cross > n / 2 else cross) / np.sqrt(float(margins))
    lower = np.sqrt((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2)
    upper = np.sqrt((p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2)
    difference = p1 - p2
    return difference, float(difference - lower), float(difference + upper)


FAMILY_DIFFERENCE_COLUMNS = ["family", "method", "against", "n_models", "rate", "against_rate",
                             "difference", "low", "high", "level", "n_only_method",
                             "n_only_against", "p", "p_holm", "significant"]


def family_difference_caption(alpha: float, m: int) -> str:
    """How ``family_rate_differences`` controls multiplicity, in words for a table's caption."""
    rows = f"{m} row{'s' if m != 1 else ''}"
    return (f"Per family, the difference of the two methods' rates of 'detected' verdicts over the "
            f"same models (implants that took), with Newcombe's paired score interval at the "
            f"simultaneous level 1 - {alpha}/{m} (Bonferroni over the {rows} shown), and "
            f"McNemar's exact p over the family's models, Holm-adjusted over the same {rows}; "
            f"significant: p_holm <= {alpha}. The exact test decides; the interval is an "
            "approximate score interval that describes the difference's size and at a few "
            "models can exclude 0 where the exact test does not: such a difference is not "
            "significant")


def family_rate_differences(verdicts: pd.DataFrame, pairs: Sequence[Pair], *,
                            alpha: float = 0.05) -> pd.DataFrame:
    """Per (family, method, against) over the family's anomalous models whose implant took
    (verdict != "implant failed", as ``verdicts.family_verdicts`` counts them) and that both
    methods scored: n_models, rate and against_rate (the share of models with verdict
    "detected"), difference = rate - against_rate, its interval low-high, n_only_method and
    n_only_against (the discordant models), p (McNemar's exact test over the family's models),
    p_holm and significant.

    Multiplicity, over the m rows shown: every interval is Newcombe's paired one
    (``paired_difference_interval``) at the simultaneous level 1 - alpha/m (Bonferroni: all m
    intervals hold their differences together with probability at least 1 - alpha), recorded
    in ``level``; p_holm is Holm's step-down adjustment of the m p-values, and a difference is
    ``significant`` when p_holm <= alpha (the family-wise error rate over the m rows at most
    alpha). A family no model of which both methods scored is not shown.

    ``verdicts``: ``verdicts.model_verdicts``' per-model frame (method, family, model, role,
    verdict, ...)."""
    check_columns(verdicts, ["method", "family", "model", "role", "verdict"], "verdict table")
    _require_methods(pairs, list(dict.fromkeys(verdicts["method"])), "verdict table")
    took = verdicts[(verdicts["role"] == ROLE_ANOMALOUS) & (verdicts["verdict"] != IMPLANT_FAILED)]
    took = took.assign(is_detected=took["verdict"] == DETECTED)
    counts = []
    for family, models in took.groupby("family", sort=False):
        for method, against in pairs:
            a, b = _paired_detections(models, method, against, "is_detected")
            if len(a):
                counts.append((family, method, against, a, b))
    m = len(counts)
    level = 1 - alpha / m if m else np.nan
    rows = []
    for family, method, against, a, b in counts:
        n_both, n_only_method = int((a & b).sum()), int((a & ~b).sum())
        n_only_against, n_neither = int((~a & b).sum()), int((~a & ~b).sum())
        difference, low, high = paired_difference_interval(n_both, n_only_method, n_only_against,
                                                           n_neither, level=level)
        rows.append({"family": family, "method": method, "against": against, "n_models": len(a),
                     "rate": float(a.mean()), "against_rate": float(b.mean()),
                     "difference": difference, "low": low, "high": high, "level": level,
                     "n_only_method": n_only_method, "n_only_against": n_only_against,
                     "p": mcnemar_exact_p(a, b)})
    table = pd.DataFrame(rows, columns=FAMILY_DIFFERENCE_COLUMNS[:-2])
    adjusted = holm(table["p"].to_numpy(float))
    return table.assign(p_holm=adjusted, significant=adjusted <= alpha)
