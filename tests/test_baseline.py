"""Every method against the outputs-only control (paired dAUROC, margin ratios) and Table 1's
exact intervals (evaluate/scoring/baseline.py)."""
import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm
from sklearn.metrics import roc_auc_score

from counteraudit.evaluate.scoring.baseline import (ADDS, LESS, SAME, detection_margin_ratios,
                                            fraction_intervals, localization_versus_baseline,
                                            paired_delta_interval)
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


def test_margin_ratios_divide_by_the_controls_margin():
    ratios = detection_margin_ratios(detection_frame()).set_index("model")
    assert ratios["gradcam"].to_dict() == pytest.approx({"bd-1": 2.0, "bd-2": 0.6, "smooth": 0.5})
    assert "outputs_only" not in ratios.columns


def test_table1_intervals_are_clopper_pearsons_for_families_of_two_or_more():
    intervals = fraction_intervals(detection_frame()).set_index(["family", "method"])
    one_of_two = intervals.loc[("backdoor", "gradcam")]
    assert (one_of_two["n_detected"], one_of_two["n_models"]) == (1, 2)
    # the exact 95% interval of 1 success in 2 trials: [0.0126, 0.9874]
    assert (one_of_two["ci_low"], one_of_two["ci_high"]) == pytest.approx((0.01258, 0.98742),
                                                                          abs=1e-5)
    single = intervals.loc[("randomized_smoothing", "gradcam")]
    assert single["fraction_detected"] == 1.0 and np.isnan(single["ci_low"])
