"""Tables 3 and 4's arithmetic against values worked out by hand: rank, precision@k, coverage of
the worst 10% (with ties), images_to_rank, the relative score with leave-one-out, recovery rates
and calibration."""
import math

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.proportion import proportion_confint

from counteraudit.evaluate.discovery.auditors import AuditResult, Finding, build_auditor, rank
from counteraudit.evaluate.discovery.budget_curves import images_to_rank
from counteraudit.evaluate.discovery.equal_budgets import equal_budget_table, selections_over_models
from counteraudit.evaluate.discovery.exhaustive import worst_subdomains
from counteraudit.evaluate.discovery.reference_evaluations import check_relative
from counteraudit.evaluate.discovery.relative import p_value, relative_score, significant
from counteraudit.evaluate.discovery.relative_results import finding_key, relative_result
from counteraudit.evaluate.discovery.tables import (OUTSIDE_GRID, precision_at, recovery_by_arity,
                                                   recovery_rates, slice_rank)

OBJECTIVE = "failure_rate"


def finding(statistic, objective=OBJECTIVE, **conditions):
    return Finding(conditions, statistic, statistic - 0.1, statistic + 0.1, 16, objective)


def result(*findings):
    return AuditResult(rank(list(findings)), 16 * len(findings), {})


def test_rank_orders_by_objective_then_worst_first_then_conditions_text():
    findings = [finding(0.5, **{"class": "b"}), finding(0.9, "other", **{"class": "z"}),
                finding(0.7, **{"class": "c"}), finding(0.5, **{"class": "a"})]
    ordered = rank(findings)
    # the first objective seen comes first; within it 0.7, then the two 0.5s by their text (a < b)
    assert [(f.objective, f.conditions["class"]) for f in ordered] == [
        (OBJECTIVE, "c"), (OBJECTIVE, "a"), (OBJECTIVE, "b"), ("other", "z")]


def test_slice_rank_is_the_first_finding_inside_the_slice():
    planted = {"class": "star", "face": "present"}
    audit = result(finding(0.9, **{"class": "disk"}),
                   finding(0.8, **{"class": "star"}),  # wider than the slice: not inside it
                   finding(0.7, **{"class": "star", "face": "present", "size": "small"}),
                   finding(0.6, **{"class": "star", "face": "present"}))
    assert slice_rank(audit, OBJECTIVE, planted) == 3.0
    assert math.isnan(slice_rank(audit, OBJECTIVE, {"class": "ring"}))
    assert math.isnan(slice_rank(audit, "another objective", planted))


def test_precision_at_k_counts_missing_findings_as_misses():
    planted = {"class": "star"}
    audit = result(finding(0.9, **{"class": "star", "size": "large"}),
                   finding(0.8, **{"class": "disk"}),
                   finding(0.7, **{"class": "star"}))
    assert precision_at(audit, OBJECTIVE, planted, 1) == 1.0
    assert precision_at(audit, OBJECTIVE, planted, 2) == 0.5
    # fewer findings (3) than k (5): 2 hits over k, not over the 3 returned
    assert precision_at(audit, OBJECTIVE, planted, 5) == pytest.approx(2 / 5)
    assert math.isnan(precision_at(result(), OBJECTIVE, planted, 5))


def test_the_worst_tenth_keeps_every_subdomain_tied_with_its_last():
    rates = np.array([0.1, 0.9, 0.3, 0.9, 0.2, 0.5, 0.0, 0.4, 0.6, 0.7, 0.9, 0.1])
    # ceil(0.1 * 12) = 2 worst; the second highest is 0.9, tied three ways
    assert worst_subdomains(rates).tolist() == [1, 3, 10]
    assert worst_subdomains(np.array([0.3, 0.1, 0.2]), share=0.5).tolist() == [0, 2]


def test_images_to_rank_is_where_the_final_stretch_that_holds_begins():
    curves = pd.DataFrame({
        "model": "m", "auditor": "a",
        "seed": [0] * 5 + [1] * 5,
        "images": [100, 200, 300, 400, 500] * 2,
        # seed 0: first at 200, lost at 300, first again from 400 on -> 400
        # seed 1: never first -> does not reach
        "rank": [2, 1, 3, 1, 1, 5, 4, np.nan, 2, 2]})
    row = images_to_rank(curves, within=1).iloc[0]
    assert row["images_to_top1"] == 400 and row["seeds_reaching_top1"] == "1/2"
    row = images_to_rank(curves, within=2).iloc[0]
    # within 2: seed 0 holds from 100 except 300 -> 400; seed 1 from 400 on -> mean 400
    assert row["images_to_top2"] == 400 and row["seeds_reaching_top2"] == "2/2"
    assert row["max_images"] == 500


def test_the_relative_score_by_hand():
    # references 0.2, 0.3, 0.4: mean 0.3, sd 0.1, scale 0.1 * sqrt(1 + 1/3)
    assert relative_score(0.6, [0.2, 0.3, 0.4], floor=0.05) == pytest.approx(
        0.3 / (0.1 * math.sqrt(4 / 3)))
    # every reference the same: the floor is the spread, not zero
    assert relative_score(0.6, [0.5, 0.5, 0.5], floor=0.05) == pytest.approx(
        0.1 / (0.05 * math.sqrt(4 / 3)))
    # a reference without the subgroup (NaN) is left out; one reference has no spread
    assert relative_score(0.6, [0.2, float("nan"), 0.4], floor=0.05) == pytest.approx(
        0.3 / (math.sqrt(0.02) * math.sqrt(3 / 2)))
    assert math.isnan(relative_score(0.6, [0.2], floor=0.05))
    # Student-t with R - 1 degrees of freedom: a score of 0 is the median
    assert p_value(0.0, 5) == pytest.approx(0.5)
    assert p_value(2.132, 5) == pytest.approx(0.05, abs=1e-3)  # t(4) 95th percentile


def test_a_reference_is_scored_leave_one_out():
    subgroup = finding(0.4, **{"class": "star"})
    key = finding_key(subgroup)
    values = {"reference-00": {key: 0.2}, "reference-01": {key: 0.3},
              "reference-02": {key: 0.4}}
    scored = relative_result(result(subgroup), values, floor=0.05, leave_out="reference-02")
    # against reference-00 and -01 only: mean 0.25, sd 0.0707, scale sd * sqrt(1 + 1/2)
    expected = 0.15 / (math.sqrt(0.005) * math.sqrt(1.5))
    assert scored.findings[0].statistic == pytest.approx(expected)
    assert scored.notes["relative"]["references"] == ["reference-00", "reference-01"]
    # its interval moves with it (the model's own +-0.1, on the same scale)
    assert scored.findings[0].high - scored.findings[0].statistic == pytest.approx(
        0.1 / (math.sqrt(0.005) * math.sqrt(1.5)))
    # without leaving it out, the model is its own baseline and scores lower
    kept = relative_result(result(subgroup), values, floor=0.05)
    assert kept.findings[0].statistic < scored.findings[0].statistic


def test_relative_ranking_puts_the_excess_over_the_references_first():
    hard = finding(0.95, **{"class": "crescent", "colour": "red"})  # hard for every model
    planted = finding(0.60, **{"class": "harmonica", "face": "present"})
    values = {f"reference-0{i}": {finding_key(hard): 0.94 + 0.01 * i,
                                  finding_key(planted): 0.10 + 0.02 * i} for i in range(3)}
    absolute = result(hard, planted)
    assert absolute.findings[0].conditions["class"] == "crescent"
    relative = relative_result(absolute, values, floor=0.05)
    assert relative.findings[0].conditions["class"] == "harmonica"
    assert significant(relative.findings, references=3) == [True, False]


def test_recovery_rates_count_a_slice_never_found_as_a_miss():
    recovery = pd.DataFrame({
        "auditor": "twise", "family": "planted_slice", "arity": [2, 2, 2, 2, 1], "strength": [1.0, 1.0, 1.0, 1.0, 0.5],
        "status": ["ranked", "ranked", "ranked", "not found", "ranked"],
        "rank": pd.array([1, 3, 7, pd.NA, 1], dtype="Int64")})
    # a sixth model whose implant did not take: no defect to find, left out
    recovery = pd.concat([recovery.assign(implant_took=True), pd.DataFrame({
        "auditor": ["twise"], "family": ["planted_slice"], "arity": [2], "strength": [1.0], "status": ["not found"],
        "rank": pd.array([pd.NA], dtype="Int64"), "implant_took": [False]})], ignore_index=True)
    rates = recovery_rates(recovery).set_index(["arity", "strength"])
    row = rates.loc[(2, 1.0)]
    assert row["n_models"] == 4 and row["top1"] == 0.25 and row["top5"] == 0.5
    assert row["top1_low"] < 0.25 < row["top1_high"]
    assert rates.loc[(1, 0.5)]["top1"] == 1.0


def test_recovery_by_arity_pools_strengths_counts_slices_and_keeps_outside_apart():
    # one auditor, arity 2: slice a at two strengths (hit first, then 3rd), slice b at one
    # (not found), slice c at 1.0 whose implant did not take (left out), and slice d outside the
    # auditor's factors (counted apart, never a miss)
    recovery = pd.DataFrame({
        "auditor": "twise", "family": "planted_slice", "arity": 2,
        "planted_slice": ["a", "a", "b", "c", "d", "d"],
        "strength": [0.75, 1.0, 1.0, 1.0, 0.75, 1.0],
        "status": ["ranked", "ranked", "not found", "ranked", OUTSIDE_GRID, OUTSIDE_GRID],
        "rank": pd.array([1, 3, pd.NA, 1, pd.NA, pd.NA], dtype="Int64"),
        "implant_took": [True, True, True, False, True, None]})
    row = recovery_by_arity(recovery).set_index("arity").loc[2]
    assert row["n_models"] == 3 and row["n_slices"] == 2 and row["outside"] == 2
    assert row["top1"] == 1 / 3 and row["top5"] == 2 / 3
    low, high = proportion_confint(1, 3, alpha=0.05, method="wilson")
    assert (row["top1_low"], row["top1_high"]) == (low, high)
    # the per-strength table agrees with the pooled one, strength by strength
    per_strength = recovery_rates(recovery).set_index("strength")
    assert per_strength["n_models"].sum() == row["n_models"]
    assert (per_strength["top1"] * per_strength["n_models"]).sum() == 1


def test_recovery_by_arity_keeps_an_arity_no_model_can_express():
    recovery = pd.DataFrame({"auditor": "error_ratio", "family": "planted_slice", "arity": 3,
                             "planted_slice": ["e"], "strength": [1.0], "status": [OUTSIDE_GRID],
                             "rank": pd.array([pd.NA], dtype="Int64"), "implant_took": [True]})
    row = recovery_by_arity(recovery).iloc[0]
    assert row["n_models"] == 0 and row["outside"] == 1 and np.isnan(row["top1"])


def test_a_relative_score_without_references_is_one_clear_error(tmp_path):
    class OneReference:
        path = tmp_path / "mine.toml"
        references = ["reference-00"]
    with pytest.raises(ValueError, match=r"mine\.toml.*\[discover\] score = \"relative\".*has 1 "
                                         r".*\[references\] count >= 2.*score = \"absolute\""):
        check_relative(OneReference, "relative")
    check_relative(OneReference, "absolute")  # the absolute score needs none


def test_auditors_at_equal_budgets_by_hand():
    curves = pd.DataFrame({
        "model": ["m1", "m1", "m2", "m2", "m1", "m1", "m1", "m1"],
        "auditor": ["a"] * 4 + ["b"] * 4,
        "seed": [0, 0, 0, 0, 0, 0, 1, 1],
        "images": [100, 300, 100, 300, 200, 400, 200, 400],
        "rank": [3, 1, 1, np.nan, 2, 1, 1, 1]})
    table = equal_budget_table(curves, within=1, budgets=[100, 200, 400]).set_index(
        ["auditor", "images"])
    # a at 100: m1 rank 3 (miss), m2 rank 1 (hit) -> 1/2; at 400: m1 hit, m2 lost it -> 1/2
    assert table.loc[("a", 100), "top1_rate"] == 0.5
    assert table.loc[("a", 400), "top1_rate"] == 0.5
    # b at 100: no point yet (a miss); at 200: seed 0 rank 2, seed 1 rank 1 -> m1's hit 0.5
    assert table.loc[("b", 100), "top1_rate"] == 0.0
    assert table.loc[("b", 200), "top1_rate"] == 0.5 and table.loc[("b", 200), "models"] == 1
    assert np.isnan(table.loc[("b", 200), "low"])  # one model with a fractional hit: no interval
    assert table.loc[("b", 400), "top1_rate"] == 1.0
    low, high = table.loc[("a", 100), ["low", "high"]]
    assert 0 < low < 0.5 < high < 1  # Wilson for 1 of 2


class FactorsOnly:
    """What ``expresses`` reads of a world: its factors and their values."""
    @staticmethod
    def factors():
        return {"class": ["disk", "star"], "colour": ["red", "grey"], "face": ["present", "absent"],
                "size": ["small", "large"]}


def test_table_4_says_when_a_slice_is_beyond_an_auditors_reach():
    tiny_world = FactorsOnly()
    surrogate = build_auditor("surrogate_search", {"factors": ("class", "face", "size")})
    assert surrogate.expresses({"class": "disk", "face": "present"}, tiny_world)
    assert not surrogate.expresses({"class": "disk", "colour": "red"}, tiny_world)  # not in grid
    ratio = build_auditor("error_ratio")
    assert ratio.expresses({"colour": "red"}, tiny_world)
    assert ratio.expresses({"class": "disk", "colour": "red"}, tiny_world)  # per class
    assert not ratio.expresses({"size": "large", "colour": "red"}, tiny_world)  # no class
    assert not ratio.expresses({"class": "disk", "size": "large", "colour": "red"}, tiny_world)
    assert not build_auditor("error_ratio", {"breakdown": "global"}).expresses(
        {"class": "disk", "colour": "red"}, tiny_world)
    caption = build_auditor("caption_lift", {"captioner": "partial", "described_factors": ["face"]})
    assert caption.expresses({"class": "disk", "face": "present"}, tiny_world)
    assert not caption.expresses({"class": "disk", "size": "large"}, tiny_world)


def test_selections_over_models_average_each_models_seed_mean():
    comparison = pd.DataFrame({
        "model": ["m1"] * 4 + ["m2"] * 4,
        "selection": ["bo", "bo", "random", "random"] * 2,
        "explored": [20, 40] * 4,
        "explored_share": [0.2, 0.4] * 4,
        "coverage_mean": [0.5, 0.9, 0.1, 0.3, 0.7, 1.0, 0.3, 0.5]})
    table = selections_over_models(comparison, shares=(0.2, 0.4)).set_index(
        ["selection", "explored_share"])
    assert table.loc[("bo", 0.2), "coverage_mean"] == pytest.approx(0.6)
    assert table.loc[("bo", 0.2), "coverage_sd_over_models"] == pytest.approx(0.1414, abs=1e-4)
    assert table.loc[("random", 0.4), "coverage_mean"] == pytest.approx(0.4)
    assert (table["models"] == 2).all()
