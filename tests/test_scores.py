"""Anomaly score, detection rule, localization statistics and table output, on hand-checkable inputs."""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import roc_auc_score

from counteraudit.evaluate.scoring.detection import detection_rule, detection_table, mean_scores, table1
from counteraudit.evaluate.scoring.distances import build_distance
from counteraudit.evaluate.scoring.distances.base import Distance, Features
from counteraudit.evaluate.scoring.localization import (auroc, bootstrap_auroc_interval, chance_band,
                                                localization_table, table2)
from counteraudit.evaluate.scoring.scores import FLAG_OK, FLAG_ZERO_REFERENCE_SPREAD, anomaly_scores
from counteraudit.evaluate.reporting.tables import to_latex, to_markdown, write_table


class AbsoluteDifference(Distance):
    """d(a, b) = |a - b| on one number per image, so scores can be worked out by hand."""

    name = "absolute-difference"

    def __init__(self):
        self.paired_calls = 0

    def features(self, images) -> Features:
        values = torch.as_tensor(np.asarray(images, dtype=np.float64))
        return Features(self.name, (values,), (1, 1))

    def paired(self, features_a, features_b):
        self._check_pair(features_a, features_b)
        self.paired_calls += 1
        return (features_a.tensors[0] - features_b.tensors[0]).abs().numpy()


def scalar_features(distance, values_by_model):
    return {name: distance.features(values) for name, values in values_by_model.items()}


def test_score_matches_hand_computation_and_leaves_references_out():
    # one image: references at 0, 1, 3 and a model at 5
    distance = AbsoluteDifference()
    features = scalar_features(distance, {"g1": [0.0], "g2": [1.0], "g3": [3.0], "f": [5.0]})
    scores = anomaly_scores(features, ["g1", "g2", "g3"], distance).set_index("model")
    # f: distances 5, 4, 2 -> 11/3; reference pairs 1, 3, 2 -> 2
    assert scores.loc["f", "numerator"] == pytest.approx(11 / 3)
    assert scores.loc["f", "spread"] == pytest.approx(2.0)
    assert scores.loc["f", "score"] == pytest.approx(11 / 6)
    assert scores.loc["f", "n_references"] == 3 and not scores.loc["f", "is_reference"]
    # leave-one-out: g1 vs {g2, g3}: (1 + 3) / 2 over d(g2, g3) = 2
    assert scores.loc["g1", "score"] == pytest.approx(2.0 / 2.0)
    assert scores.loc["g2", "score"] == pytest.approx(((1 + 2) / 2) / 3)
    assert scores.loc["g3", "score"] == pytest.approx(((3 + 2) / 2) / 1)
    assert (scores.loc[["g1", "g2", "g3"], "n_references"] == 2).all()
    assert (scores["flag"] == FLAG_OK).all()


def test_reference_distances_are_computed_once_for_all_models():
    distance = AbsoluteDifference()
    rng = np.random.default_rng(0)
    values = {f"g{k}": rng.normal(size=5) for k in range(6)} | {f"f{k}": rng.normal(size=5) for k in range(4)}
    scores = anomaly_scores(scalar_features(distance, values), [f"g{k}" for k in range(6)], distance)
    assert distance.paired_calls == 15 + 4 * 6  # C(6, 2) reference pairs + 6 per non-reference model
    assert len(scores) == 10 * 5


def test_zero_reference_spread_is_flagged_not_inf():
    distance = AbsoluteDifference()
    features = scalar_features(distance, {"g1": [2.0, 0.0], "g2": [2.0, 1.0], "g3": [2.0, 3.0], "f": [4.0, 5.0]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no divide-by-zero RuntimeWarning either
        scores = anomaly_scores(features, ["g1", "g2", "g3"], distance)
    first_image = scores[scores["image"] == 0]
    assert first_image["score"].isna().all()
    assert (first_image["flag"] == FLAG_ZERO_REFERENCE_SPREAD).all()
    assert (scores[scores["image"] == 1]["flag"] == FLAG_OK).all()
    # the flagged image is skipped (and counted) in Abar, not averaged as inf or 0
    abar = mean_scores(scores.assign(method="m")).set_index("model")
    assert abar.loc["f", "abar"] == pytest.approx(scores.query("model == 'f' and image == 1")["score"].item())
    assert abar.loc["f", "n_flagged"] == 1 and abar.loc["f", "n_images"] == 1


def test_identical_renders_through_a_real_distance_are_flagged():
    distance = build_distance("ssim")
    same = np.full((2, 16, 16, 3), 120, dtype=np.uint8)
    renders = {"g1": same, "g2": same.copy(), "g3": same.copy(), "f": 255 - same}
    scores = anomaly_scores({name: distance.features(images) for name, images in renders.items()},
                            ["g1", "g2", "g3"], distance)
    assert scores["score"].isna().all() and (scores["flag"] == FLAG_ZERO_REFERENCE_SPREAD).all()


def test_too_few_references_and_missing_models_fail_clearly():
    distance = AbsoluteDifference()
    features = scalar_features(distance, {"g1": [0.0], "g2": [1.0], "f": [2.0]})
    with pytest.raises(ValueError, match="at least 3"):
        anomaly_scores(features, ["g1", "g2"], distance)  # scoring g1 leaves a single reference
    assert len(anomaly_scores(features, ["g1", "g2"], distance, models=["f"])) == 1
    with pytest.raises(KeyError, match="g9"):
        anomaly_scores(features, ["g1", "g9"], distance)


def abar_frame(abars_by_model: dict, method="m", layer=None) -> pd.DataFrame:
    """Score rows whose per-model mean is the given Abar (two images at Abar -/+ 0.1)."""
    rows = [{"method": method, "model": model, "image": image, "score": abar + offset, "flag": FLAG_OK,
             **({"layer": layer} if layer is not None else {})}
            for model, abar in abars_by_model.items() for image, offset in enumerate((-0.1, 0.1))]
    return pd.DataFrame(rows)


def test_detection_rule_margin_and_rank_p_value():
    references = [1.0, 1.2, 0.9]
    above = detection_rule(1.3, references)
    assert above["detected"] and above["margin"] == pytest.approx(1.3 / 1.2) and above["p_value"] == 1 / 4
    tie = detection_rule(1.2, references)
    assert not tie["detected"] and tie["p_value"] == 2 / 4  # strictly above every reference
    below = detection_rule(0.95, references)
    assert not below["detected"] and below["p_value"] == 3 / 4
    assert detection_rule(np.nan, references)["detection_flag"] != FLAG_OK


def test_detection_table_and_table1():
    scores = abar_frame({"g1": 1.0, "g2": 1.2, "g3": 0.9, "stark": 2.0, "subtle_a": 1.1, "subtle_b": 1.5})
    families = {"stark": "smoothing", "subtle_a": "backdoor", "subtle_b": "backdoor"}
    table = detection_table(scores, ["g1", "g2", "g3"], families=families).set_index("model")
    assert table.loc["stark", "detected"] and not table.loc["subtle_a", "detected"]
    assert table.loc["subtle_b", "margin"] == pytest.approx(1.5 / 1.2)
    assert table.loc["g1", "role"] == "reference" and pd.isna(table.loc["g1", "detected"])
    fractions = table1(table.reset_index()).set_index("family")
    assert fractions.loc["smoothing", "m"] == 1.0 and fractions.loc["backdoor", "m"] == 0.5
    assert fractions.loc["backdoor", "n_models"] == 2


def test_layered_methods_average_layers_and_report_per_layer():
    layer_a = abar_frame({"g1": 1.0, "g2": 1.1, "g3": 0.9, "f": 1.5}, method="caricature", layer="layer2.2.conv1")
    layer_b = abar_frame({"g1": 1.0, "g2": 1.4, "g3": 0.9, "f": 1.1}, method="caricature", layer="layer3.3")
    scores = pd.concat([layer_a, layer_b], ignore_index=True)
    overall = detection_table(scores, ["g1", "g2", "g3"]).set_index("model")
    assert overall.loc["f", "abar"] == pytest.approx((1.5 + 1.1) / 2)
    assert overall.loc["f", "max_reference_abar"] == pytest.approx((1.1 + 1.4) / 2)
    assert overall.loc["f", "detected"] and overall.loc["f", "n_layers"] == 2
    per_layer = detection_table(scores, ["g1", "g2", "g3"], per_layer=True).set_index(["layer", "model"])
    assert per_layer.loc[("layer2.2.conv1", "f"), "detected"]
    assert not per_layer.loc[("layer3.3", "f"), "detected"]


def test_auroc_equals_scikit_learn_with_ties():
    rng = np.random.default_rng(2)
    abnormal = rng.integers(0, 6, 40).astype(float)  # many ties
    normal = rng.integers(0, 5, 37).astype(float)
    expected = roc_auc_score(np.r_[np.ones(40), np.zeros(37)], np.r_[abnormal, normal])
    assert auroc(abnormal, normal) == pytest.approx(expected, abs=1e-12)
    continuous_a, continuous_n = rng.normal(1, 1, 40), rng.normal(0, 1, 40)
    assert auroc(continuous_a, continuous_n) == pytest.approx(
        roc_auc_score(np.r_[np.ones(40), np.zeros(40)], np.r_[continuous_a, continuous_n]), abs=1e-12)


def test_bootstrap_resamples_are_exact_aurocs_and_deterministic():
    rng = np.random.default_rng(3)
    abnormal, normal = rng.normal(1, 1, 12), rng.normal(0, 1, 9)
    interval = bootstrap_auroc_interval(abnormal, normal, n_resamples=50, seed=5)
    assert interval == bootstrap_auroc_interval(abnormal, normal, n_resamples=50, seed=5)
    assert interval != bootstrap_auroc_interval(abnormal, normal, n_resamples=50, seed=6)
    # same draws, AUROC recomputed naively on the resampled sets
    draws = np.random.default_rng(5)
    counts_a = draws.multinomial(12, np.full(12, 1 / 12), size=50)
    counts_n = draws.multinomial(9, np.full(9, 1 / 9), size=50)
    naive = [roc_auc_score(np.r_[np.ones(12), np.zeros(9)], np.r_[np.repeat(abnormal, ca), np.repeat(normal, cn)])
             for ca, cn in zip(counts_a, counts_n)]
    assert interval == pytest.approx(tuple(np.percentile(naive, [2.5, 97.5])))


def test_permutation_chance_band_is_deterministic_and_centred():
    untied = np.arange(40, dtype=float), np.arange(40, 80, dtype=float)  # 40 and 40 images
    low, high, _ = chance_band(*untied, seed=0)
    assert (low, high) == chance_band(*untied, seed=0)[:2]
    assert 0.3 < low < 0.45 and 0.55 < high < 0.7
    separated = chance_band(np.arange(40) + 100.0, np.arange(40, dtype=float), seed=1)
    assert separated[2] < 0.01  # p-value of a perfect AUROC


def test_localization_table_is_seeded_per_group():
    rng = np.random.default_rng(4)
    rows = [{"method": method, "model": model, "image": f"{abnormal}-{k}", "abnormal": abnormal,
             "score": rng.normal(1.0 if abnormal and model == "backdoor" else 0.0), "flag": FLAG_OK}
            for method in ["ig", "gbp"] for model in ["backdoor", "missing"] for abnormal in (True, False)
            for k in range(20)]
    scores = pd.DataFrame(rows)
    table = localization_table(scores, n_resamples=200, seed=0)
    again = localization_table(scores, n_resamples=200, seed=0)
    pd.testing.assert_frame_equal(table, again)
    only_ig = localization_table(scores[scores["method"] == "ig"], n_resamples=200, seed=0)
    pd.testing.assert_frame_equal(only_ig, table[table["method"] == "ig"].reset_index(drop=True))
    row = table.set_index(["method", "model"]).loc[("ig", "backdoor")]
    subset = scores.query("method == 'ig' and model == 'backdoor'")
    assert row["auroc"] == pytest.approx(roc_auc_score(subset["abnormal"], subset["score"]))
    assert row["ci_low"] <= row["auroc"] <= row["ci_high"] and row["n_abnormal"] == 20
    wide = table2(table)
    assert list(wide.columns) == ["method", "backdoor", "missing"]


def test_tables_render_and_write_atomically(tmp_path):
    frame = pd.DataFrame({"family": ["back_door", "smoothing"], "ig": [0.5, 1.0], "detected": [True, False]})
    markdown = to_markdown(frame)
    assert markdown.splitlines()[0].startswith("| family") and "0.500" in markdown and "yes" in markdown
    assert r"back\_door" in to_latex(frame) and r"\toprule" in to_latex(frame)
    paths = write_table(frame, tmp_path / "table1")
    assert sorted(p.name for p in paths) == ["table1.csv", "table1.md", "table1.tex"]
    assert pd.read_csv(tmp_path / "table1.csv")["ig"].tolist() == [0.5, 1.0]
    assert not list(tmp_path.glob(".*.tmp"))
