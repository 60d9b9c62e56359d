"""Verdicts that survive a change of seed (issue 30): replicates, null p-values, their power and
calibration, the three verdicts, a family's exact interval, and Table 2 over replicates."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import kstest, nct
from scipy.stats import t as student_t
from statsmodels.stats.proportion import proportion_confint

from counteraudit.evaluate.pipeline import load_checked_suite, scoring_suite
from counteraudit.evaluate.reporting.page import Report
from counteraudit.evaluate.reporting.verdicts import verdict_section
from counteraudit.evaluate.scoring.detection import detection_table
from counteraudit.evaluate.scoring.localization import auroc, replicate_auroc_interval
from counteraudit.evaluate.scoring.null_tests.base import (NULL_TESTS, detectable_effect, power)
from counteraudit.evaluate.scoring.verdicts import (DETECTED, IMPLANT_FAILED, INCONCLUSIVE,
                                                    NOT_DETECTED, NullPlan, calibration,
                                                    exact_interval, family_verdict,
                                                    family_verdicts, model_verdicts)
from counteraudit.train.core.suite import load_suite
from counteraudit.train.core.suite_schema import SuiteFileError
from tests.conftest import write_suite

TESTS = NULL_TESTS.names()


# ---------------------------------------------------------------- the p-values, simulated
@pytest.mark.parametrize("name", TESTS)
def test_null_p_values_are_uniform_on_a_known_null(name):
    """Clean models against k = 19 clean ones, 4000 times (log-normal Abars): p <= alpha at
    rate alpha for three alphas, and (continuous p-values) a uniform distribution."""
    rng = np.random.default_rng(30)
    k, draws = 19, 4000
    nulls = np.exp(0.1 + 0.05 * rng.standard_normal((draws, k)))
    candidates = np.exp(0.1 + 0.05 * rng.standard_normal((draws, 1)))
    p = NULL_TESTS.get(name)().p_values(nulls, candidates)[:, 0]
    for alpha in (0.05, 0.1, 0.2):
        # exactly alpha for the empirical test when alpha * (k + 1) is whole (all three here)
        tolerance = 3 * np.sqrt(alpha * (1 - alpha) / draws)
        assert abs((p <= alpha).mean() - alpha) < tolerance, (name, alpha, (p <= alpha).mean())
    if NULL_TESTS.get(name).continuous:  # the empirical p-value lies on a grid of k + 1 values
        assert kstest(p, "uniform").pvalue > 0.01


def test_a_broken_p_value_fails_the_uniformity_check():
    """The check above can fail: the normal quantile in place of Student's t (k = 5) is
    anti-conservative, and the coverage test sees it."""
    rng = np.random.default_rng(30)
    logs = rng.standard_normal((4000, 5))
    candidate = rng.standard_normal(4000)
    z = (candidate - logs.mean(axis=1)) / logs.std(axis=1, ddof=1)
    naive = 1 - __import__("scipy").stats.norm.cdf(z)
    assert (naive <= 0.05).mean() > 0.05 + 3 * np.sqrt(0.05 * 0.95 / 4000)


@pytest.mark.parametrize("name", TESTS)
def test_power_rises_with_the_margin(name):
    effects = [0.0, 1.0, 2.0, 3.0, 5.0]
    curve = power(NULL_TESTS.get(name)(), 19, effects, alpha=0.05, simulations=4000)
    assert np.all(np.diff(curve) > 0), curve
    assert curve[0] < 0.05 + 0.015 and curve[-1] > 0.95


def test_student_t_power_agrees_with_the_noncentral_t():
    """The simulated power of the t prediction test is scipy's noncentral t: the statistic is
    t(k-1) with noncentrality effect / sqrt(1 + 1/k)."""
    k, alpha = 10, 0.05
    critical = student_t.ppf(1 - alpha, k - 1)
    for effect in (1.0, 2.5):
        exact = nct.sf(critical, k - 1, effect / np.sqrt(1 + 1 / k))
        simulated = power(NULL_TESTS.get("student_t")(), k, [effect], alpha=alpha)[0]
        assert abs(simulated - exact) < 0.01, (effect, simulated, exact)


def test_the_empirical_test_cannot_detect_below_its_smallest_p_value():
    """With k nulls its p-value is at least 1/(k+1): 10 nulls never reach 0.05, 20 do."""
    empirical = NULL_TESTS.get("empirical")()
    assert detectable_effect(empirical, 10, alpha=0.05, target_power=0.8) == np.inf
    assert np.isfinite(detectable_effect(empirical, 20, alpha=0.05, target_power=0.8))
    assert empirical.p_values(np.array([1.0, 2.0, 3.0]), np.array([5.0, 2.0, 0.5])).tolist() == \
        [0.25, 0.75, 1.0]  # (1 + #{null >= Abar}) / 4: ties count as at least


# ---------------------------------------------------------------- verdicts on a detection table
REFERENCES = [f"reference-{i:02d}" for i in range(5)]
FIT = [f"held-out-{i:02d}" for i in range(10)]
CHECK = [f"held-out-{i:02d}" for i in range(10, 20)]


def _scores(abars: dict[str, float], method: str = "gradcam") -> pd.DataFrame:
    """Two images per model averaging to the given Abar."""
    return pd.DataFrame([{"method": method, "model": m, "image": i, "score": a + d, "flag": "ok"}
                         for m, a in abars.items() for i, d in enumerate((-0.01, 0.01))])


def _per_model(anomalous: dict[str, float], seed: int = 0, methods=("gradcam",)) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frames = []
    for method in methods:
        clean = {m: float(np.exp(0.05 * rng.standard_normal())) for m in [*REFERENCES, *FIT, *CHECK]}
        frames.append(_scores({**clean, **anomalous}, method))
    return detection_table(pd.concat(frames), REFERENCES,
                           families={m: m.split("-r")[0] for m in anomalous},
                           null_models=[*FIT, *CHECK])


def test_three_verdicts_from_the_p_value_and_the_power_level():
    plan = NullPlan(fit=tuple(FIT), check=tuple(CHECK))
    # the clean Abars are exp(0.05 z): far above (+10 sd), at the clean median, and in between
    # (several clean ones: both claims are adjusted over the table's cells, Benjamini-Hochberg)
    clean = {"clean-r0": 0.98, "clean-r1": 1.0, "clean-r2": 0.99}
    per_model = _per_model({"far-r0": float(np.exp(0.5)), **clean,
                            "between-r0": float(np.exp(0.08))})
    verdicts = model_verdicts(per_model, plan, configurations={"far-r0": "far"}).set_index("model")
    assert verdicts.loc["far-r0", "verdict"] == DETECTED
    assert (verdicts.loc[list(clean), "verdict"] == NOT_DETECTED).all()
    assert verdicts.loc["between-r0", "verdict"] == INCONCLUSIVE
    assert verdicts.loc["far-r0", "configuration"] == "far"
    assert verdicts.loc["clean-r0", "configuration"] == "clean-r0"
    # the checking nulls get p-values, the fitting ones (the null itself) do not
    assert set(verdicts.index) == {"far-r0", *clean, "between-r0", *CHECK}
    # q is Benjamini-Hochberg over the anomalous cells (statsmodels)
    anomalous = verdicts[verdicts["role"] == "anomalous"]
    p = anomalous[f"p_{plan.test}"].to_numpy()
    order = np.argsort(p)
    expected = np.minimum.accumulate((p[order] * len(p) / np.arange(1, len(p) + 1))[::-1])[::-1]
    assert np.allclose(anomalous["q"].to_numpy()[order], np.minimum(expected, 1))


def test_a_model_whose_implant_failed_is_no_counter_audit():
    plan = NullPlan(fit=tuple(FIT), check=tuple(CHECK))
    per_model = _per_model({"fam-r0": 1.0, "fam-r1": 1.0, "fam-r2": 1.0})
    verdicts = model_verdicts(per_model, plan, implants_passed={"fam-r2": False})
    assert verdicts.set_index("model").loc["fam-r2", "verdict"] == IMPLANT_FAILED
    row = family_verdicts(verdicts, plan).iloc[0]
    assert (row["n_models"], row["n_implant_failed"], row["n_not_detected"]) == (2, 1, 2)


def test_a_family_rate_interval_is_the_exact_binomial_interval():
    for k, n in [(0, 5), (1, 5), (3, 5), (5, 5), (2, 10)]:
        low, high = exact_interval(k, n)
        assert np.allclose((low, high), proportion_confint(k, n, alpha=0.05, method="beta"))
    assert np.isclose(exact_interval(0, 5)[1], 1 - 0.025 ** (1 / 5))  # by hand
    assert exact_interval(5, 5)[0] == pytest.approx(0.025 ** (1 / 5))


def test_family_verdicts_follow_the_stated_rule():
    assert family_verdict(5, 0, 5, alpha=0.05, power=0.8)[2] == DETECTED
    assert family_verdict(2, 0, 5, alpha=0.05, power=0.8)[2] == DETECTED    # low 0.053 > 0.05
    assert family_verdict(1, 4, 5, alpha=0.05, power=0.8)[2] == NOT_DETECTED  # high 0.72 < 0.8
    assert family_verdict(0, 2, 5, alpha=0.05, power=0.8)[2] == INCONCLUSIVE  # 2 of 5 powered
    assert family_verdict(0, 3, 3, alpha=0.05, power=0.8)[2] == NOT_DETECTED  # high 0.71
    # the rule reads the interval, not the count: 0 of 2, both powered misses, has high 0.84
    assert family_verdict(0, 2, 2, alpha=0.05, power=0.8)[2] == INCONCLUSIVE


def test_calibration_counts_the_checking_nulls_flagged_both_ways():
    plan = NullPlan(fit=tuple(FIT), check=tuple(CHECK))
    per_model = _per_model({}, seed=3, methods=("gradcam", "guided_backprop"))
    table = calibration(per_model, plan)
    assert set(table["test"]) == set(TESTS)
    halves = table[table["design"] == "halves"].set_index(["test", "method"])
    assert halves.loc[("student_t", "gradcam"), "n_checked"] == 20  # 10 each way
    assert halves.loc[("student_t", "gradcam"), "n_null"] == 10
    assert halves.loc[("student_t", "all methods"), "n_checked"] == 40
    # leave-one-out: each of the 20 against the other 19, where the empirical p reaches 1/20
    loo = table[table["design"] == "leave-one-out"].set_index(["test", "method"])
    assert loo.loc[("empirical", "gradcam"), "n_checked"] == 20
    assert loo.loc[("empirical", "gradcam"), "n_null"] == 19
    # the empirical p-value of the highest of 20 exchangeable models is exactly 1/20 = alpha
    assert loo.loc[("empirical", "gradcam"), "n_flagged"] == 1
    # a shifted checking half is flagged: the check can fail
    shifted = per_model.copy()
    shifted.loc[shifted["model"].isin(CHECK), "abar"] *= np.exp(0.5)
    flagged = calibration(shifted, plan)
    flagged = flagged[flagged["design"] == "halves"].set_index(["test", "method"])
    assert flagged.loc[("student_t", "gradcam"), "n_flagged"] >= 10


# ---------------------------------------------------------------- Table 2 over replicates
def test_the_replicate_interval_resamples_models_then_images():
    rng = np.random.default_rng(0)
    normal = rng.standard_normal(30)
    same = [(rng.standard_normal(30) + 1.0, normal)] * 4
    varied = [(rng.standard_normal(30) + shift, normal) for shift in (0.0, 0.5, 1.5, 3.0)]
    mean, low, high = replicate_auroc_interval(varied, seed=1)
    assert mean == pytest.approx(np.mean([auroc(a, n) for a, n in varied]))
    _, same_low, same_high = replicate_auroc_interval(same, seed=1)
    # between-seed spread widens the interval beyond the images' alone
    assert (high - low) > 1.5 * (same_high - same_low)
    assert replicate_auroc_interval(varied, seed=1) == (mean, low, high)  # seeded


# ---------------------------------------------------------------- the suite file
REPLICATED = """
[[anomalies]]
name = "smoothing"
family = "randomized_smoothing"
seed = 7
replicates = {replicates}
params = {{ sigma = 0.5 }}
"""


def test_replicates_differ_only_in_their_seed(tmp_path):
    suite = load_suite(write_suite(tmp_path / "rep.toml", body=REPLICATED.format(replicates=3)))
    models = suite.anomalies
    assert [m.name for m in models] == ["smoothing-r0", "smoothing-r1", "smoothing-r2"]
    assert models[0].seed == 7  # the one-model entry's seed: shared through the store
    assert len({m.seed for m in models}) == 3 and len({m.key for m in models}) == 3
    identities = [{k: v for k, v in m.identity().items() if k != "seed"} for m in models]
    assert identities[0] == identities[1] == identities[2]
    assert {m.configuration for m in models} == {"smoothing"}
    assert [m.replicate for m in models] == [0, 1, 2]
    single = load_suite(write_suite(tmp_path / "one.toml", body=REPLICATED.format(replicates=1)))
    assert [m.name for m in single.anomalies] == ["smoothing"]
    assert single.anomalies[0].key == models[0].key


@pytest.mark.parametrize("value", ["0", "-2", "2.5", '"3"', "true"])
def test_replicates_that_is_not_a_positive_integer_is_one_clear_error(tmp_path, value):
    path = write_suite(tmp_path / "bad.toml", body=REPLICATED.format(replicates=value))
    with pytest.raises(SuiteFileError) as caught:
        load_suite(path)
    message = str(caught.value)
    assert "bad.toml" in message and "nothing was run" in message
    assert "[[anomalies]] entry 1" in message and f"replicates = {value}" in message
    assert "must be" in message


def _with_nulls(tmp_path, references: str, evaluate: str) -> str:
    path = write_suite(tmp_path / "nulls.toml", body=f"[evaluate]\n{evaluate}\n")
    path.write_text(path.read_text().replace("[references]\n", f"[references]\n{references}\n"))
    return path


def test_an_unknown_p_value_test_lists_the_valid_ones(tmp_path):
    with pytest.raises(SuiteFileError) as caught:
        load_checked_suite(_with_nulls(tmp_path, "held_out = 4", 'p_value = "studnet_t"'))
    message = str(caught.value)
    assert "[evaluate] p_value" in message and "student_t" in message and "empirical" in message


@pytest.mark.parametrize("references", ["held_out = 1", "held_out = 4\nheld_out_check = 3"])
def test_null_p_values_need_two_fitting_nulls(tmp_path, references):
    with pytest.raises(SuiteFileError) as caught:
        load_checked_suite(_with_nulls(tmp_path, references, 'p_value = "student_t"'))
    message = str(caught.value)
    assert "at least 2" in message and "[references] held_out" in message
    assert "nothing was run" in message


def test_the_command_line_test_is_checked_before_any_work(tmp_path):
    path = _with_nulls(tmp_path, "held_out = 1", "seed = 0")
    assert scoring_suite(str(path)).evaluate.p_value is None  # the paper's rule alone: nothing asked
    with pytest.raises(SuiteFileError, match=r"--p-value = 'student_t' .* at least 2"):
        scoring_suite(str(path), p_value="student_t")
    with pytest.raises(SuiteFileError, match=r"--p-value = 'bogus'.*student_t"):
        scoring_suite(str(path), p_value="bogus")


# ---------------------------------------------------------------- a small real run
def test_a_replicated_suite_with_nulls_gets_verdicts_end_to_end(replicas_run):
    """The session's finished run extended with replicates and 4 held-out references (2 fit, 2
    check): detect.py gives every table of the verdicts, consistent with each other, and the
    replicates' r0 is the one-model entry's model (nothing retrained for it)."""
    derived, runs, out, trained = replicas_run
    replicated = load_suite(derived)
    assert trained == {s.key for s in [*replicated.held_out, replicated.model("smoothing-r1")]}
    assert "Table 1 with verdicts" in out and "Calibration" in out
    assert "Every detection in Table 1 is the paper's rule" not in out  # the verdicts say it
    tables = runs / "replicas" / "tables"
    # keep_default_na=False: the role "null" is a word here, not a missing value
    per_model = pd.read_csv(tables / "detection-verdicts-per-model-l2.csv", keep_default_na=False)
    anomalous = per_model[per_model["role"] == "anomalous"]
    assert set(anomalous["model"]) == {"smoothing-r0", "smoothing-r1"}
    assert set(anomalous["configuration"]) == {"smoothing"}
    assert set(per_model.loc[per_model["role"] == "null", "model"]) == {"held-out-02", "held-out-03"}
    assert set(per_model["verdict"]) <= {DETECTED, NOT_DETECTED, INCONCLUSIVE, IMPLANT_FAILED}
    families = pd.read_csv(tables / "detection-families-l2.csv")
    for row in families.itertuples():
        rows = anomalous[(anomalous["method"] == row.method) & (anomalous["family"] == row.family)]
        assert row.n_detected == (rows["verdict"] == DETECTED).sum()
        assert (row.ci_low, row.ci_high) == pytest.approx(exact_interval(row.n_detected,
                                                                         row.n_models))
    assert families["fragile"].dtype == bool and "flipped_by" in families
    outlying = pd.read_csv(tables / "detection-outlying-nulls-l2.csv", keep_default_na=False)
    assert set(outlying["model"]) == {s.name for s in replicated.held_out}
    assert outlying["val_accuracy"].between(0, 1).all()  # read from each model's metrics.json
    provenance = pd.read_csv(tables / "provenance.csv").set_index("stage")
    assert provenance.loc["scoring", "mode"] == "portable"  # the tests' default
    training = provenance.loc[["training"]]
    assert training["models"].sum() == len(replicated.models)
    assert set(training["mode"]) == {"portable"}
    calibration_table = pd.read_csv(tables / "detection-calibration-l2.csv")
    halves = calibration_table[calibration_table["design"] == "halves"]
    assert set(halves["n_checked"]) == {4, 8}  # 2 + 2 swapped; both methods pooled
    power_table = pd.read_csv(tables / "detection-power-l2.csv")
    assert set(power_table["k"]) == {2} and (power_table["power_level"] > 0).all()
    cells = pd.read_csv(tables / "detection-verdicts-l2.csv").set_index("family")
    for row in families.itertuples():
        assert cells.loc[row.family, row.method].startswith(f"{row.rate:.2f} [")
        assert f"] {row.verdict} (paper " in cells.loc[row.family, row.method]
    # the report's section: the same tables, each verdict cell coloured by its verdict
    stored = {f"{name}-l2": pd.read_csv(tables / f"{name}-l2.csv", keep_default_na=False)
              for name in ("detection-verdicts", "detection-families", "detection-power",
                           "detection-calibration", "detection-verdicts-per-model",
                           "detection-verdicts-configurations", "detection-outlying-nulls")}
    stored["detection-families-l2"] = families
    report = Report(suite=replicated, methods=[], distance_name="l2", source="the suite",
                    detection=pd.DataFrame(columns=["model", "method", "image", "score"]),
                    localization=None, tables=stored, implants={}, image_sets={})
    html = verdict_section(report)
    assert html.startswith('<section id="verdicts">')
    for verdict in set(families["verdict"]):
        assert f'class="v-{verdict.replace(" ", "-")}"' in html
    assert "randomized_smoothing (2 models):" in html
    assert "robust SDs of log Abar" in html  # the outlying clean models: a table, or "none"
    assert "<b>fragile</b>" in html


def test_the_replicated_suite_shares_demo_fulls_references_and_the_demos_models():
    """What the store reuses: demo-full's 12 references (the same keys) and, as each
    configuration's r0, the demo's model; every demo configuration at 5 seeds; 20 + 20 nulls."""
    replicated, full, demo = (load_suite(name) for name in ("replicated", "demo-full", "demo"))
    assert [s.key for s in replicated.references] == [s.key for s in full.references]
    first = {s.configuration: s for s in replicated.anomalies if s.replicate == 0}
    assert {name: spec.key for name, spec in first.items()} == {s.name: s.key for s in demo.anomalies}
    counts = pd.Series([s.configuration for s in replicated.anomalies]).value_counts()
    assert (counts >= 5).all() and set(counts.index) == {s.name for s in demo.anomalies}
    assert (len(replicated.null_fit), len(replicated.null_check)) == (20, 20)
    assert replicated.evaluate.p_value in NULL_TESTS.names()
