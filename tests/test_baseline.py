"""Every method against the outputs-only control (paired dAUROC, margin ratios) and Table 1's
exact intervals (evaluate/scoring/baseline.py)."""
import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm
from sklearn.metrics import roc_auc_score

from scipy.stats import binomtest

from counteraudit.evaluate.scoring.baseline import (ADDS, LESS, NEITHER, SAME, detection_versus_baseline,
                                                    fraction_intervals, localization_versus_baseline,
                                                    mcnemar_exact_p, paired_delta_interval)
from counteraudit.evaluate.scoring.detection import detection_table
from counteraudit.evaluate.scoring.localization import bootstrap_auroc_interval


def correlated_scores(rng, n: int, shift_a: float, shift_b: float, rho: float):
    """Two methods' scores on the same n abnormal and n normal images: per image a bivariate
    normal with correlation rho, abnormal images shifted by shift_a / shift_b. The true AUROC of a
    method is Phi(shift / sqrt(2))."""
    cov = [[1, rho], [rho, 1]]
    abnormal = rng.multivariate_normal([shift_a, shift_b], cov, size=n)
    normal = rng.multivariate_normal([0, 0], cov, size=n)
    return abnormal[:, 0], normal[:, 0], abnormal[:, 1], normal[:, 1]


def test_the_difference_is_the_difference_of_scikit_learns_aurocs():
    rng = np.random.default_rng(1)
    a_abn, a_nor, b_abn, b_nor = correlated_scores(rng, 30, 1.0, 0.3, 0.5)
    delta, low, high = paired_delta_interval(a_abn, a_nor, b_abn, b_nor, seed=0)
    labels = [1] * 30 + [0] * 30
    expected = roc_auc_score(labels, [*a_abn, *a_nor]) - roc_auc_score(labels, [*b_abn, *b_nor])
    assert delta == pytest.approx(expected)
    assert low < delta < high
    assert paired_delta_interval(a_abn, a_nor, b_abn, b_nor, seed=0) == (delta, low, high)


def test_the_paired_interval_covers_the_true_difference_at_about_its_nominal_rate():
    """A seeded simulation: 300 draws of 40 + 40 images from a known model; the 95% interval
    should hold the true dAUROC in about 95% of them (percentile bootstrap: a little less)."""
    rng = np.random.default_rng(2026)
    shift_a, shift_b = 1.2, 0.6
    truth = norm.cdf(shift_a / np.sqrt(2)) - norm.cdf(shift_b / np.sqrt(2))
    covered = []
    for draw in range(300):
        scores = correlated_scores(rng, 40, shift_a, shift_b, rho=0.6)
        _, low, high = paired_delta_interval(*scores, n_resamples=1000, seed=draw)
        covered.append(low <= truth <= high)
    coverage = float(np.mean(covered))
    assert 0.90 <= coverage <= 0.985, coverage


def test_pairing_narrows_the_interval_when_the_methods_share_their_noise():
    """Unpaired, the two AUROCs' own intervals are as wide as ever; paired, what the two methods
    share (rho = 0.95) cancels out of the difference."""
    rng = np.random.default_rng(3)
    a_abn, a_nor, b_abn, b_nor = correlated_scores(rng, 40, 1.0, 0.8, rho=0.95)
    _, low, high = paired_delta_interval(a_abn, a_nor, b_abn, b_nor, seed=0)
    a_low, a_high = bootstrap_auroc_interval(a_abn, a_nor, seed=0)
    assert (high - low) < 0.5 * (a_high - a_low)


def scores_frame(rng, methods: dict[str, float], n: int = 40) -> pd.DataFrame:
    """A tidy localization score frame: one model, n abnormal + n normal images, each method's
    abnormal images shifted by its value; the methods share each image's base score."""
    base = rng.normal(size=2 * n)
    rows = []
    for method, shift in methods.items():
        own = rng.normal(scale=0.3, size=2 * n)
        for image in range(2 * n):
            abnormal = image < n
            rows.append({"method": method, "model": "backdoor", "image": image, "layer": "",
                         "abnormal": abnormal,
                         "score": base[image] + own[image] + (shift if abnormal else 0.0)})
    return pd.DataFrame(rows)


def test_verdicts_say_whether_the_explanation_adds_to_the_outputs():
    rng = np.random.default_rng(4)
    frame = scores_frame(rng, {"outputs_only": 0.5, "sharper": 3.0, "blunter": -0.5,
                               "copy": 0.5})
    copy = frame[frame["method"] == "outputs_only"].assign(method="copy")
    frame = pd.concat([frame[frame["method"] != "copy"], copy])
    versus = localization_versus_baseline(frame).set_index("method")
    assert versus.loc["sharper", "verdict"] == ADDS
    assert versus.loc["blunter", "verdict"] == LESS
    # the control against itself: no difference, and an interval of exactly 0
    assert versus.loc["copy", "verdict"] == SAME
    assert versus.loc["copy", ["delta_auroc", "delta_low", "delta_high"]].tolist() == [0, 0, 0]
    assert "outputs_only" not in versus.index
    assert (versus["n_abnormal"] == 40).all() and (versus["n_normal"] == 40).all()


def test_an_image_flagged_for_either_method_is_left_out_of_both():
    rng = np.random.default_rng(5)
    frame = scores_frame(rng, {"outputs_only": 0.5, "sharper": 3.0})
    flagged = (frame["method"] == "outputs_only") & (frame["image"] == 0)
    frame.loc[flagged, "score"] = np.nan
    row = localization_versus_baseline(frame).iloc[0]
    assert (row["n_abnormal"], row["n_normal"]) == (39, 40)


def test_no_control_is_one_clear_error():
    frame = scores_frame(np.random.default_rng(6), {"gradcam": 1.0})
    with pytest.raises(ValueError, match="'outputs_only' control.*add 'outputs_only'"):
        localization_versus_baseline(frame)


def detection_frame() -> pd.DataFrame:
    rows = []
    for model, family, margins in [("bd-1", "backdoor", {"gradcam": 1.2, "outputs_only": 0.6}),
                                   ("bd-2", "backdoor", {"gradcam": 0.9, "outputs_only": 1.5}),
                                   ("smooth", "randomized_smoothing",
                                    {"gradcam": 2.0, "outputs_only": 4.0})]:
        for method, margin in margins.items():
            rows.append({"method": method, "model": model, "family": family, "role": "anomalous",
                         "margin": margin, "detected": margin > 1})
    rows.append({"method": "gradcam", "model": "reference-00", "family": "reference",
                 "role": "reference", "margin": np.nan, "detected": np.nan})
    return pd.DataFrame(rows)


REFERENCES = [f"ref-{i}" for i in range(4)]


def per_image_scores(rng, shifts: dict[str, float], n: int = 36) -> pd.DataFrame:
    """A tidy detection score frame: 4 references and model "bd" on n images; each method's
    scores share each image's base (lognormal), and "bd" is ``shifts[method]`` times higher."""
    base = rng.lognormal(size=n)
    rows = []
    for method, shift in shifts.items():
        for model in [*REFERENCES, "bd"]:
            own = rng.lognormal(sigma=0.2, size=n)
            factor = shift if model == "bd" else 1.0
            rows += [{"method": method, "model": model, "image": i, "layer": "", "flag": "ok",
                      "score": base[i] * own[i] * factor} for i in range(n)]
    return pd.DataFrame(rows)


def test_paired_detection_comparison_gives_table_1s_margins_and_their_ratio():
    frame = per_image_scores(np.random.default_rng(7), {"outputs_only": 1.2, "sharper": 3.0,
                                                        "blunter": 0.6})
    copy = frame[frame["method"] == "outputs_only"].assign(method="copy")
    frame = pd.concat([frame, copy], ignore_index=True)
    per_model = detection_table(frame, REFERENCES)
    versus = detection_versus_baseline(frame, per_model).set_index("method")
    margins = per_model[per_model["role"] == "anomalous"].set_index("method")["margin"]
    for method in ("sharper", "blunter", "copy"):
        row = versus.loc[method]
        assert row["margin"] == pytest.approx(margins[method])
        assert row["baseline_margin"] == pytest.approx(margins["outputs_only"])
        assert row["margin_ratio"] == pytest.approx(margins[method] / margins["outputs_only"])
        assert row["ratio_low"] <= row["margin_ratio"] <= row["ratio_high"]
        assert row["n_images"] == 36 and row["model"] == "bd"
    assert versus.loc["sharper", "verdict"] == ADDS
    assert versus.loc["blunter", "verdict"] == LESS
    # the control against itself, on the same resamples: a ratio of exactly 1, no width
    assert versus.loc["copy", ["margin_ratio", "ratio_low", "ratio_high"]].tolist() == [1, 1, 1]
    assert versus.loc["copy", "verdict"] == SAME
    assert "outputs_only" not in versus.index
    assert versus.loc["sharper", "detected"] and versus.loc["sharper", "baseline_detected"]


def test_margins_of_a_model_neither_method_detects_compare_nothing():
    """Both below 1 (the control's far below): the ratio is reported, but no adds."""
    frame = per_image_scores(np.random.default_rng(9), {"outputs_only": 0.5, "near": 0.97})
    versus = detection_versus_baseline(frame, detection_table(frame, REFERENCES)).iloc[0]
    assert not versus["detected"] and not versus["baseline_detected"]
    assert versus["ratio_low"] > 1  # the margins differ ...
    assert versus["verdict"] == NEITHER  # ... but neither sets the model apart


def test_paired_detection_leaves_out_an_image_flagged_for_either_method():
    frame = per_image_scores(np.random.default_rng(8), {"outputs_only": 1.2, "sharper": 3.0})
    flagged = (frame["method"] == "outputs_only") & (frame["model"] == "ref-2") \
        & (frame["image"] == 5)
    frame.loc[flagged, ["score", "flag"]] = [np.nan, "zero_reference_spread"]
    row = detection_versus_baseline(frame, detection_table(frame, REFERENCES)).iloc[0]
    assert row["n_images"] == 35
    kept = frame[frame["image"] != 5]
    margins = detection_table(kept, REFERENCES).query("role == 'anomalous'").set_index("method")
    assert row["margin"] == pytest.approx(margins.loc["sharper", "margin"])


def test_mcnemar_is_the_exact_binomial_test_on_the_discordant_models():
    # 5 models only the method detects, 1 only the control, 6 both or neither
    method = [True] * 5 + [False] + [True] * 3 + [False] * 3
    control = [False] * 5 + [True] + [True] * 3 + [False] * 3
    assert mcnemar_exact_p(method, control) == pytest.approx(binomtest(1, 6, 0.5).pvalue)
    assert mcnemar_exact_p(method, control) == pytest.approx(2 * 7 / 64)  # 2 P(X <= 1), X~B(6, 1/2)
    assert mcnemar_exact_p([True, False], [True, False]) == 1.0


def test_table1_intervals_are_clopper_pearsons_for_families_of_two_or_more():
    intervals = fraction_intervals(detection_frame()).set_index(["family", "method"])
    one_of_two = intervals.loc[("backdoor", "gradcam")]
    assert (one_of_two["n_detected"], one_of_two["n_models"]) == (1, 2)
    # the exact 95% interval of 1 success in 2 trials: [0.0126, 0.9874]
    assert (one_of_two["ci_low"], one_of_two["ci_high"]) == pytest.approx((0.01258, 0.98742),
                                                                          abs=1e-5)
    single = intervals.loc[("randomized_smoothing", "gradcam")]
    assert single["fraction_detected"] == 1.0 and np.isnan(single["ci_low"])
