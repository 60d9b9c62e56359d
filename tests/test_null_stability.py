"""Verdicts that do not hinge on one clean model (issue 49): the robust null test, its behaviour on
a contaminated null, the stability of every verdict, and the clean models named as outlying."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from statsmodels.robust.scale import Huber as StatsmodelsHuber

from counteraudit.evaluate.scoring.detection import detection_table
from counteraudit.evaluate.scoring.null_tests.base import (NULL_TESTS, RECOMMENDED_TEST,
                                                           detectable_effect, power)
from counteraudit.evaluate.scoring.null_tests.huber import huber_location_scale
from counteraudit.evaluate.scoring.provenance import provenance_table
from counteraudit.evaluate.scoring.stability import outlying_nulls, with_stability
from counteraudit.evaluate.scoring.verdicts import (DETECTED, NullPlan, method_power,
                                                    verdict_table)
from counteraudit.train.core import numerics
from counteraudit.train.core.suite_schema import ReferencesTable
from counteraudit.evaluate.scoring.null_tests.base import null_test_problems
from tests.test_verdicts import CHECK, FIT, REFERENCES, _scores


# ---------------------------------------------------------------- the robust test
def test_huber_fit_is_statsmodels_huber_row_by_row():
    rng = np.random.default_rng(49)
    samples = rng.standard_normal((40, 10))
    samples[:10, 0] += 6.0  # an outlier in a quarter of the rows
    samples[10:12, :3] = 0.25  # ties
    location, scale = huber_location_scale(samples)
    for row, m, s in zip(samples, location, scale):
        expected = StatsmodelsHuber(maxiter=500)(row)
        assert (m, s) == pytest.approx((float(expected[0]), float(expected[1])), abs=1e-9)
    # broadcast over leading axes, as the power simulation calls it
    stacked, _ = huber_location_scale(samples.reshape(4, 10, 10))
    assert np.array_equal(stacked.reshape(-1), location)


def test_one_outlying_clean_model_barely_moves_the_robust_test_and_wrecks_student_t():
    """On a null of 10 where one clean model lies 5 SD high, Huber stays calibrated (a clean
    model is flagged at most at alpha) and keeps most of its power; the Student-t fit widens,
    so it needs a much larger effect. The second half is what makes this test able to fail."""
    huber, student = NULL_TESTS.get("huber")(), NULL_TESTS.get("student_t")()
    settings = dict(alpha=0.05, target_power=0.8, simulations=4000)
    clean = detectable_effect(huber, 10, **settings)
    contaminated = detectable_effect(huber, 10, outliers=1, **settings)
    assert contaminated < 4.0 and contaminated - clean < 1.0, (clean, contaminated)
    assert detectable_effect(student, 10, outliers=1, **settings) > 4.5
    false_positives = power(huber, 10, [0.0], alpha=0.05, simulations=4000, outliers=1)[0]
    assert false_positives <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / 4000)
    # on a clean null Huber costs little power against the Student-t test
    assert clean - detectable_effect(student, 10, **settings) < 0.2


def test_the_recommended_test_is_registered_and_is_the_plans_default():
    assert RECOMMENDED_TEST in NULL_TESTS.names()
    assert NullPlan(fit=tuple(FIT), check=()).test == RECOMMENDED_TEST


def test_a_test_refuses_fewer_nulls_than_it_needs():
    with pytest.raises(ValueError, match="at least 5"):
        NULL_TESTS.get("huber")().p_values(np.ones(4), np.ones(1))
    # a suite (or --p-value) asking for it with too few fitting nulls fails when read
    problems = null_test_problems(ReferencesTable(held_out=4), "huber", "[evaluate] p_value")
    assert len(problems) == 1 and "needs at least 5" in problems[0]


# ---------------------------------------------------------------- stability and outliers
OUTLIER = FIT[3]


def _table(anomalous: dict[str, float], methods=("gradcam", "guided_backprop"),
           outlier_log: float = 0.6) -> pd.DataFrame:
    """Clean log Abars 0.05 z; ``OUTLIER`` (a fitting null) ``outlier_log`` higher for every
    method; the anomalous models' Abars as given."""
    rng = np.random.default_rng(7)
    frames = []
    for method in methods:
        clean = {m: float(np.exp(0.05 * rng.standard_normal())) for m in [*REFERENCES, *FIT, *CHECK]}
        clean[OUTLIER] *= float(np.exp(outlier_log))
        frames.append(_scores({**clean, **anomalous}, method))
    return detection_table(pd.concat(frames), REFERENCES,
                           families={m: m.split("-r")[0] for m in anomalous},
                           null_models=[*FIT, *CHECK])


FAMILY = {f"fam-r{i}": float(np.exp(0.3)) for i in range(3)}  # 6 clean SDs up
CONFIGURATIONS = {name: "fam" for name in FAMILY}


def _stability(per_model, test):
    return with_stability(per_model, NullPlan(fit=tuple(FIT), check=tuple(CHECK), test=test),
                          configurations=CONFIGURATIONS)


def test_a_verdict_one_clean_model_decides_is_fragile_and_names_it():
    """With one fitting null 12 SD high, the Student-t fit misses a family 6 SD up and finds it
    once that model is left out: the verdict is fragile, flipped by that model. Huber detects
    the family with or without it."""
    per_model = _table(FAMILY)
    _, student, _ = _stability(per_model, "student_t")
    row = student[student["method"] == "gradcam"].iloc[0]
    assert row["verdict"] != DETECTED and row["fragile"]
    assert f"without {OUTLIER}: {DETECTED}" in row["flipped_by"]
    cells = verdict_table(student).set_index("family")
    assert cells.loc["fam", "gradcam"].endswith(", fragile")
    _, huber, _ = _stability(per_model, "huber")
    assert (huber["verdict"] == DETECTED).all()
    assert not huber["fragile"].any() and (huber["flipped_by"] == "").all()


def test_a_family_verdict_one_replicate_decides_is_fragile():
    """2 of 3 replicates detected: the exact interval starts at 0.094 > alpha, detected; without
    either detected replicate, 1 of 2 starts at 0.013: inconclusive. Without the undetected one
    it stays detected, so only the two detected replicates are named."""
    per_model = _table({"fam-r0": float(np.exp(0.5)), "fam-r1": float(np.exp(0.5)),
                        "fam-r2": 1.0}, outlier_log=0.0)
    verdicts, families, configurations = _stability(per_model, "huber")
    row = families[families["method"] == "gradcam"].iloc[0]
    assert (row["n_detected"], row["verdict"], row["fragile"]) == (2, DETECTED, True)
    assert "without fam-r0: inconclusive" in row["flipped_by"]
    assert "without fam-r1: inconclusive" in row["flipped_by"]
    assert "fam-r2" not in row["flipped_by"]
    assert configurations["fragile"].tolist() == families["fragile"].tolist()
    # the model-level verdicts carry the columns too (the records)
    assert {"fragile", "flipped_by"} <= set(verdicts.columns)


def test_an_outlying_clean_model_is_named_with_its_accuracy_and_what_it_moves():
    per_model = _table(FAMILY)
    plan = NullPlan(fit=tuple(FIT), check=tuple(CHECK), test="student_t")
    _, families, _ = with_stability(per_model, plan, configurations=CONFIGURATIONS)
    accuracies = {name: 0.88 for name in [*FIT, *CHECK]} | {OUTLIER: 0.81}
    table = outlying_nulls(per_model, plan, accuracies, families)
    first = table.iloc[0]
    assert first["model"] == OUTLIER and first["every_method"]
    assert first["outlying_in"] == "gradcam, guided_backprop"
    assert first["val_accuracy"] == 0.81 and first["role"] == "fitting"
    assert "gradcam on fam" in first["moves"]
    assert (table.iloc[1:]["outlying_in"] == "").all()  # the clean ones are not named


def test_the_power_level_uses_the_tests_own_fit():
    """Huber's power level sits where its fit puts the null: one outlier raises the Student-t
    level (its mean and SD move) far more than Huber's."""
    per_model = _table({}, outlier_log=0.6)
    levels = {test: method_power(per_model, NullPlan(fit=tuple(FIT), check=(), test=test))
              .set_index("method").loc["gradcam"] for test in ("huber", "student_t")}
    assert levels["huber"]["power_level"] < levels["student_t"]["power_level"]
    assert levels["huber"]["log_scale"] < 0.5 * levels["student_t"]["log_scale"]


def test_provenance_names_this_process_mode_and_cpu():
    table = provenance_table(0)
    row = table.iloc[0]
    assert (row["stage"], row["mode"], row["cpu"]) == ("scoring", numerics.requested_mode(),
                                                       numerics.cpu_model())
    assert len(table) == 1  # no trained model, no training row
