"""Method against method, paired (evaluate/scoring/pairwise.py, evaluate/compare.py): margin
ratios, dAUROC, McNemar over models and the per-family rate differences with Newcombe's paired
interval, on constructed data whose answer is known and on small real runs."""
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.multitest import multipletests

from counteraudit.evaluate.pipeline import load_checked_suite
from counteraudit.evaluate.scoring.baseline import (BASELINE, detection_versus_baseline,
                                                    localization_versus_baseline)
from counteraudit.evaluate.scoring.detection import detection_table
from counteraudit.evaluate.scoring.distances import build_distance
from counteraudit.evaluate.scoring.pair_tables import significant_lines
from counteraudit.evaluate.scoring.pairwise import (ADDS, LESS, NEITHER, SAME, detection_mcnemar, detection_pairs,
                                                    family_rate_differences, holm, localization_pairs,
                                                    mcnemar_exact_p, paired_difference_interval,
                                                    paired_margin_ratio_interval, pairs_for)
from counteraudit.evaluate.scoring.stage import detection_scores, localization_scores
from counteraudit.evaluate.scoring.verdicts import DETECTED, IMPLANT_FAILED, INCONCLUSIVE, NOT_DETECTED
from counteraudit.train.core.artifacts import derive_seed
from tests.conftest import ONE_PROCESS, run_in_process
from tests.test_baseline import REFERENCES, per_image_scores, scores_frame


# ---------------------------------------------------------------- constructed data
def test_pairs_are_every_method_against_every_other_never_itself():
    assert pairs_for("mine", ["gradcam", "guided_backprop"]) == [("mine", "gradcam"),
                                                                ("mine", "guided_backprop")]
    assert pairs_for(["a", "b"], ["b", "c"]) == [("a", "b"), ("a", "c"), ("b", "c")]
    with pytest.raises(ValueError, match="make no pair"):
        pairs_for("gradcam", "gradcam")


def test_a_method_against_an_identical_copy_is_the_same():
    frame = per_image_scores(np.random.default_rng(11), {"gradcam": 2.0})
    frame = pd.concat([frame, frame.assign(method="copy")], ignore_index=True)
    versus = detection_pairs(frame, detection_table(frame, REFERENCES), [("gradcam", "copy")])
    row = versus.iloc[0]
    assert row[["margin_ratio", "ratio_low", "ratio_high"]].tolist() == [1, 1, 1]
    assert row["verdict"] == SAME and row["detected"] and row["against_detected"]
    local = scores_frame(np.random.default_rng(12), {"gradcam": 1.0})
    local = pd.concat([local, local.assign(method="copy")], ignore_index=True)
    delta = localization_pairs(local, [("gradcam", "copy")]).iloc[0]
    assert delta[["delta_auroc", "delta_low", "delta_high"]].tolist() == [0, 0, 0]
    assert delta["verdict"] == SAME


def test_a_method_that_dominates_on_every_image_adds_and_its_mirror_is_less():
    frame = per_image_scores(np.random.default_rng(13), {"sharp": 4.0, "blunt": 1.5})
    per_model = detection_table(frame, REFERENCES)
    both = detection_pairs(frame, per_model, [("sharp", "blunt"), ("blunt", "sharp")])
    ahead, behind = both.iloc[0], both.iloc[1]
    assert (ahead["verdict"], behind["verdict"]) == (ADDS, LESS)
    # (a, b) mirrors (b, a): the same resamples, so the ratio and its interval invert exactly
    assert ahead["margin_ratio"] == pytest.approx(1 / behind["margin_ratio"])
    assert (ahead["ratio_low"], ahead["ratio_high"]) == pytest.approx(
        (1 / behind["ratio_high"], 1 / behind["ratio_low"]))
    assert (ahead["margin"], ahead["against_margin"]) == (behind["against_margin"], behind["margin"])

    local = scores_frame(np.random.default_rng(14), {"sharp": 3.0, "blunt": 0.2})
    pair = localization_pairs(local, [("sharp", "blunt"), ("blunt", "sharp")])
    assert pair["verdict"].tolist() == [ADDS, LESS]
    assert pair["delta_auroc"].iloc[0] == pytest.approx(-pair["delta_auroc"].iloc[1])
    assert (pair["delta_low"].iloc[0], pair["delta_high"].iloc[0]) == pytest.approx(
        (-pair["delta_high"].iloc[1], -pair["delta_low"].iloc[1]))
    assert pair["auroc"].iloc[0] == pytest.approx(pair["against_auroc"].iloc[1])


def test_two_methods_that_detect_nothing_compare_nothing():
    frame = per_image_scores(np.random.default_rng(9), {"faint": 0.5, "fainter": 0.97})
    row = detection_pairs(frame, detection_table(frame, REFERENCES), [("fainter", "faint")]).iloc[0]
    assert not row["detected"] and not row["against_detected"] and row["verdict"] == NEITHER


def test_a_method_the_scores_lack_is_one_clear_error():
    frame = per_image_scores(np.random.default_rng(15), {"gradcam": 2.0})
    with pytest.raises(ValueError, match=r"scores of \['mine'\].*add \['mine'\]"):
        detection_pairs(frame, detection_table(frame, REFERENCES), [("mine", "gradcam")])


# Newcombe (1998), Stat Med 17:2635, Table II, example (a): 20 pairs both, 12 only the first,
# 2 only the second, 16 neither; method 10 (the hybrid score interval with phi): 0.0562 to 0.3292.
# Fagerland, Lydersen & Laake (2014), Stat Med 33:2850, the airway hyper-responsiveness table
# (1, 1, 7, 12), Newcombe's method 10: -0.507 to -0.026.
@pytest.mark.parametrize("counts, published, digits", [((20, 12, 2, 16), (0.0562, 0.3292), 4),
                                                       ((1, 1, 7, 12), (-0.507, -0.026), 3)])
def test_newcombes_paired_interval_matches_the_published_examples(counts, published, digits):
    difference, low, high = paired_difference_interval(*counts)
    both, only_first, only_second, _ = counts
    assert difference == pytest.approx((only_first - only_second) / sum(counts))
    assert (round(low, digits), round(high, digits)) == published


def test_newcombes_interval_stays_in_range_at_small_n_and_narrows_with_n():
    for counts in [(0, 3, 0, 0), (3, 0, 0, 0), (0, 0, 0, 3), (0, 0, 3, 0), (1, 1, 1, 1)]:
        difference, low, high = paired_difference_interval(*counts)
        assert -1 <= low <= difference <= high <= 1, counts
    _, small_low, small_high = paired_difference_interval(2, 3, 1, 4)
    _, large_low, large_high = paired_difference_interval(20, 30, 10, 40)
    assert large_high - large_low < small_high - small_low
    assert np.isnan(paired_difference_interval(0, 0, 0, 0)[1])


def test_holm_is_statsmodels_holm_and_leaves_missing_p_values_missing():
    p = np.array([0.01, 0.04, 0.03, 0.2])
    assert holm(p) == pytest.approx(multipletests(p, method="holm")[1])
    assert holm(p) == pytest.approx([0.04, 0.09, 0.09, 0.2])  # 4 p, 3 p then the running max
    with_missing = holm([0.01, np.nan, 0.03])
    assert np.isnan(with_missing[1]) and with_missing[[0, 2]] == pytest.approx([0.02, 0.03])


def detections_frame(rows) -> pd.DataFrame:
    """Table 1's per-model rows from (model, {method: detected})."""
    return pd.DataFrame([{"method": method, "model": model, "family": "backdoor",
                          "role": "anomalous", "detected": detected}
                         for model, by_method in rows for method, detected in by_method.items()])


def test_mcnemar_over_models_counts_the_discordant_models_and_adjusts_over_the_pairs():
    rows = ([(f"only-a-{i}", {"a": True, "b": False, "c": False}) for i in range(6)]
            + [("only-b", {"a": False, "b": True, "c": False}),
               ("all", {"a": True, "b": True, "c": True}),
               ("none", {"a": False, "b": False, "c": False})])
    table = detection_mcnemar(detections_frame(rows), pairs_for("a", ["b", "c"]))
    first = table.iloc[0]
    assert (first["n_models"], first["n_only_method"], first["n_only_against"]) == (9, 6, 1)
    assert first["p"] == pytest.approx(mcnemar_exact_p([True] * 6 + [False], [False] * 6 + [True]))
    assert table["p_holm"].tolist() == pytest.approx(multipletests(table["p"], method="holm")[1])


def verdict_rows(family: str, verdicts: dict[str, list[str]]) -> list[dict]:
    """``model_verdicts``' rows: model i of ``family`` gets ``verdicts[method][i]``."""
    return [{"method": method, "family": family, "configuration": family,
             "model": f"{family}-r{i}", "role": "anomalous", "verdict": said}
            for method, said_by_model in verdicts.items() for i, said in enumerate(said_by_model)]


def test_family_rate_differences_are_paired_over_the_models_that_took():
    d, n, i, failed = DETECTED, NOT_DETECTED, INCONCLUSIVE, IMPLANT_FAILED
    rows = (verdict_rows("backdoor", {"a": [d, d, d, d, failed], "b": [n, i, n, d, failed],
                                      "copy": [d, d, d, d, failed]})
            + verdict_rows("spurious", {"a": [d, n, i], "b": [d, n, d], "copy": [d, n, i]})
            + [{"method": "a", "family": "null", "configuration": "held-out-00",
                "model": "held-out-00", "role": "null", "verdict": d}])
    verdicts = pd.DataFrame(rows)
    pairs = [("a", "b"), ("b", "a"), ("a", "copy")]
    table = family_rate_differences(verdicts, pairs, alpha=0.05).set_index(
        ["family", "method", "against"])
    assert len(table) == 6  # 2 families x 3 pairs: the Bonferroni and Holm m
    row = table.loc[("backdoor", "a", "b")]
    assert row["n_models"] == 4  # the failed implant left out, the null model too
    assert (row["rate"], row["against_rate"], row["difference"]) == (1.0, 0.25, 0.75)
    assert (row["n_only_method"], row["n_only_against"]) == (3, 0)
    assert row["level"] == pytest.approx(1 - 0.05 / 6)
    assert (row["difference"], row["low"], row["high"]) == pytest.approx(
        paired_difference_interval(1, 3, 0, 0, level=1 - 0.05 / 6))
    assert row["p"] == pytest.approx(mcnemar_exact_p([True] * 4, [False, False, False, True]))
    # the pair reversed: the difference and its interval mirror
    mirror = table.loc[("backdoor", "b", "a")]
    assert (mirror["difference"], mirror["low"], mirror["high"]) == pytest.approx(
        (-row["difference"], -row["high"], -row["low"]))
    same = table.loc[("spurious", "a", "copy")]
    assert same["difference"] == 0 and same["p"] == 1 and not same["significant"]
    assert table["p_holm"].tolist() == pytest.approx(multipletests(table["p"], method="holm")[1])
    assert (table["significant"] == (table["p_holm"] <= 0.05)).all()


# ---------------------------------------------------------------- a small real run
def test_the_outputs_only_tables_are_the_pairwise_tables_against_the_control(finished_run):
    """baseline.py's tables are pairwise.py's with outputs_only as the one 'against', columns
    renamed, and each bootstrap seeded as it always was."""
    suite_path, runs, _ = finished_run
    suite = load_checked_suite(suite_path)
    methods = list(suite.explain.methods)
    distance = build_distance("l2")
    detection = detection_scores(suite, distance, methods, runs)
    per_model = detection_table(detection, [s.name for s in suite.references],
                                families=suite.table_rows()[0])
    others = [m for m in methods if m != BASELINE]
    renamed = {"against_detected": "baseline_detected", "against_margin": "baseline_margin",
               "against_auroc": "baseline_auroc"}
    versus = detection_versus_baseline(detection, per_model)
    pairwise = detection_pairs(detection, per_model, pairs_for(others, BASELINE))
    pd.testing.assert_frame_equal(versus, pairwise.drop(columns="against").rename(
        columns=renamed)[list(versus.columns)], check_exact=True)
    localization = localization_scores(suite, distance, methods, runs)
    pd.testing.assert_frame_equal(
        localization_versus_baseline(localization),
        localization_pairs(localization, pairs_for(others, BASELINE)).drop(
            columns="against").rename(columns=renamed), check_exact=True)
    # the seed of (method, control) on a model: derive_seed(0, "detection-versus-baseline", ...)
    row = versus.iloc[0]
    names = [row["model"], *[s.name for s in suite.references]]
    wide = detection.pivot_table(index=["method", "model"], columns="image", values="score")
    a = wide.loc[[(row["method"], name) for name in names]].to_numpy(float)
    b = wide.loc[[(BASELINE, name) for name in names]].to_numpy(float)
    _, _, ratio, low, high = paired_margin_ratio_interval(
        a, b, seed=derive_seed(0, "detection-versus-baseline", row["method"], row["model"]))
    # (the mean over images summed in another order: equal to rounding; another seed's interval
    # would differ in the second digit)
    assert (ratio, low, high) == pytest.approx(
        (row["margin_ratio"], row["ratio_low"], row["ratio_high"]), rel=1e-12)


def test_compare_end_to_end_on_a_finished_run_and_in_the_report(finished_run, tmp_path):
    suite, runs, _ = finished_run
    runs = Path(shutil.copytree(runs, tmp_path / "runs", symlinks=True))
    out = run_in_process("evaluate/compare.py", "--suite", suite, "--runs-dir", runs, "--distance",
                         "l2", "--method", "guided_backprop", "--no-progress", *ONE_PROCESS)  # --against: the control
    assert "guided_backprop vs outputs_only" in out and "McNemar's exact" in out
    assert "need a suite with null models" in out  # said, not silently skipped
    folder = runs / "e2e" / "tables" / "method-guided_backprop+outputs_only"
    per_model = pd.read_csv(folder / "compare-guided_backprop-vs-outputs_only-detection-per-model-l2.csv",
                            keep_default_na=False, na_values=[""])
    # the same numbers as detect.py's comparison with the control (the same seeds)
    stored = pd.read_csv(runs / "e2e" / "tables" / "detection-vs-outputs-per-model-l2.csv",
                         keep_default_na=False, na_values=[""])
    assert per_model["margin_ratio"].tolist() == pytest.approx(stored["margin_ratio"].tolist())
    assert per_model["verdict"].tolist() == stored["verdict"].tolist()
    assert (folder / "compare-guided_backprop-vs-outputs_only-localization-l2.md").is_file()
    mcnemar = pd.read_csv(folder / "compare-guided_backprop-vs-outputs_only-mcnemar-l2.csv")
    assert mcnemar["n_models"].tolist() == [2]

    report = tmp_path / "report.html"
    run_in_process("evaluate/report.py", "--suite", suite, "--runs-dir", runs, "--distance", "l2",
                   "--method", "guided_backprop", "--against", "outputs_only", "--output", report,
                   "--no-progress", *ONE_PROCESS)
    html = report.read_text()
    section = html.split('<section id="comparison">', 1)[1].split("</section>", 1)[0]
    assert '<a href="#comparison">Method against method</a>' in html
    assert "guided_backprop vs outputs_only" in section and "need a suite with null models" in section
    assert "McNemar&#x27;s exact p" in section  # escaped as every caption


def test_compare_gives_each_familys_rate_difference_on_a_suite_with_nulls(replicas_run, tmp_path):
    """The finished run with replicates and 4 held-out references (2 fit, 2 check): compare
    gives per family the rate difference, its interval at 1 - alpha/m and Holm's p, and the
    rates are the shares of detect.py's per-model verdicts of each method run alone."""
    derived, shared, _, _ = replicas_run
    runs = Path(shutil.copytree(shared, tmp_path / "runs", symlinks=True))
    options = ["--suite", derived, "--runs-dir", runs, "--distance", "l2", "--no-progress",
               "--method", "guided_backprop", *ONE_PROCESS]
    # in this process: test_compare_end_to_end_... starts compare.py as a command
    out = run_in_process("evaluate/compare.py", *options, "--against", "outputs_only")
    assert "Which differences are significant after Holm" in out
    assert "guided_backprop vs outputs_only: " in out
    folder = runs / "replicas" / "tables" / "method-guided_backprop+outputs_only"
    differences = pd.read_csv(folder / "compare-guided_backprop-vs-outputs_only-family-differences-l2.csv")
    # each side's verdicts as detect.py gives them for that method run alone: a comparison's
    # verdicts do not depend on the methods run beside it (verdicts.own_verdicts)
    alone = {}
    for method in ("guided_backprop", "outputs_only"):
        run_in_process("evaluate/detect.py", "--suite", derived, "--runs-dir", runs, "--distance",
                       "l2", "--no-progress", "--method", method, "--no-control", *ONE_PROCESS)
        alone[method] = pd.read_csv(runs / "replicas" / "tables" / f"method-{method}"
                                    / "detection-verdicts-per-model-l2.csv", keep_default_na=False)
    verdicts = pd.concat(alone.values(), ignore_index=True)
    assert set(differences["family"]) == {"randomized_smoothing"}
    m = len(differences)
    for row in differences.itertuples():
        models = verdicts[(verdicts["family"] == row.family) & (verdicts["role"] == "anomalous")
                          & (verdicts["verdict"] != IMPLANT_FAILED)]
        rate = lambda method: (models[models["method"] == method]["verdict"] == DETECTED).mean()  # noqa: E731
        assert row.n_models == 2
        assert (row.rate, row.against_rate) == pytest.approx((rate("guided_backprop"),
                                                              rate("outputs_only")))
        assert row.level == pytest.approx(1 - 0.05 / m)
        assert row.low <= row.difference <= row.high
    assert differences["p_holm"].tolist() == pytest.approx(
        multipletests(differences["p"], method="holm")[1])


def test_an_interval_that_excludes_0_without_the_exact_test_is_said_not_significant():
    """The exact test decides: a family whose approximate interval excludes 0 while its Holm p
    does not reach alpha (7 of 7 discordant models one way among 14 rows) is named as not
    significant, and a significant one is listed as such."""

    differences = pd.DataFrame([
        {"family": "spurious", "method": "a", "against": "b", "difference": -0.7, "low": -0.89,
         "high": -0.06, "p_holm": 0.219, "significant": False},
        {"family": "backdoor", "method": "a", "against": "b", "difference": 0.0, "low": -0.4,
         "high": 0.4, "p_holm": 1.0, "significant": False},
        {"family": "spurious", "method": "a", "against": "c", "difference": 0.9, "low": 0.5,
         "high": 0.99, "p_holm": 0.01, "significant": True}])
    first, second = significant_lines(differences)
    assert first.startswith("a vs b: no family's difference is significant after Holm")
    assert "spurious's interval [-0.89, -0.06] excludes 0 but its exact p_holm is 0.219: not significant" in first
    assert "backdoor" not in first
    assert second == "a vs c: significant in spurious (+0.90 [+0.50, +0.99])"
