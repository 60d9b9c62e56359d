"""Discovery statistics with the null population: the relative score's baseline is the references
and the fitting held-out references, the checking ones are judged as anomalous models are, and
discovery-calibration counts false positives per half; Table 3's top finding against the planted
slice. Values worked out by hand on AuditResults built directly."""
import json
import math

import pytest
from scipy.stats import t as student_t

from conftest import write_suite
from counteraudit.evaluate import discover
from counteraudit.train import train
from counteraudit.evaluate.discovery.auditors import AUDITORS, AuditResult, Finding, rank
from counteraudit.evaluate.discovery.reference_evaluations import (REFERENCE_FINDINGS, adaptive_results,
                                                                   baseline_models, evaluate_references,
                                                                   relative_results, scored_findings)
from counteraudit.evaluate.discovery.relative import significant
from counteraudit.evaluate.discovery.relative_results import baseline_count
from counteraudit.evaluate.discovery.tables import (CHECKING_HALF, FITTING_HALF, IN_SLICE, NO_FINDING,
                                                    NO_SLICE, SHARES_FACTOR, UNRELATED,
                                                    calibration_frame, detection_frame,
                                                    finding_relation, relation_counts)
from counteraudit.evaluate.reporting.discovery import per_model_detections
from counteraudit.evaluate.reporting.html import html_table
from counteraudit.evaluate.scoring.detection import ROLE_ANOMALOUS
from counteraudit.train.core.stage import RunOptions
from counteraudit.train.core.suite import load_suite
from counteraudit.train.worlds import build_world, synthetic_factors
from tests.test_auditors import DISCOVER_BODY

AUDITOR = "twise"  # non-adaptive: every model's own result holds its statistic on every subgroup
OBJECTIVE = AUDITORS.get(AUDITOR).objective
FACTORS = {"class": ["star", "disk"], "size": ["small", "large"], "colour": ["red", "grey"]}


def finding(statistic: float, **conditions) -> Finding:
    return Finding(conditions, statistic, statistic - 0.1, statistic + 0.1, 16, OBJECTIVE)


def audit(*findings: Finding) -> AuditResult:
    return AuditResult(rank(list(findings)), 16 * len(findings), {})


def test_twise_is_scored_from_every_models_own_result():
    # what the hand values below assume: no stored evaluations, and a floor below their spread
    assert not AUDITORS.get(AUDITOR).adaptive
    assert AUDITORS.get(AUDITOR).spread_floor == 0.05


@pytest.fixture
def halves_suite(tmp_path):
    """Three references and four held-out ones, the last two checking (nothing trained)."""
    return load_suite(write_suite(tmp_path / "halves.toml", body="held_out = 4\nheld_out_check = 2"))


def one_subgroup(values: dict[str, float]) -> dict[tuple[str, str], AuditResult]:
    """Every model's twise result on one subgroup, its statistic as given."""
    return {(AUDITOR, model): audit(finding(value, **{"class": "star"}))
            for model, value in values.items()}


def test_the_baseline_is_the_references_and_the_fitting_held_out_ones(halves_suite):
    names = [s.name for s in baseline_models(halves_suite)]
    assert names == [s.name for s in halves_suite.references + halves_suite.null_fit]
    assert len(names) == 5
    assert not set(names) & {s.name for s in halves_suite.null_check}


def test_a_suite_without_held_out_models_keeps_the_references_alone(tiny_suite):
    suite = load_suite(tiny_suite)
    assert suite.held_out == []
    assert baseline_models(suite) == suite.references


def test_pooled_baseline_scores_by_hand(halves_suite):
    references = [s.name for s in halves_suite.references]
    fitting = [s.name for s in halves_suite.null_fit]
    checking = [s.name for s in halves_suite.null_check]
    baseline = references + fitting
    # the five baseline models' statistics: 0.1 .. 0.5, mean 0.3, sd 0.158
    values = dict(zip(baseline, [0.1, 0.2, 0.3, 0.4, 0.5]))
    values.update({checking[0]: 0.35, checking[1]: 0.9, "anomalous": 0.9})
    scored = relative_results(one_subgroup(values), baseline, {})
    sd = math.sqrt(0.025)
    # an anomalous model against all five: R = 5, df 4
    anomalous = scored[(AUDITOR, "anomalous")]
    assert anomalous.findings[0].statistic == pytest.approx(0.6 / (sd * math.sqrt(1 + 1 / 5)))
    assert anomalous.notes["relative"]["references"] == sorted(baseline)
    assert anomalous.notes["relative"]["df"] == 4 and baseline_count(anomalous) == 5
    # a checking held-out model is never in its own baseline: the same five, the same scale
    check = scored[(AUDITOR, checking[1])]
    assert check.notes["relative"]["leave_out"] is None
    assert check.notes["relative"]["references"] == sorted(baseline)
    assert check.findings[0].statistic == pytest.approx(anomalous.findings[0].statistic)
    assert scored[(AUDITOR, checking[0])].findings[0].statistic == pytest.approx(
        0.05 / (sd * math.sqrt(1.2)))
    # a fitting held-out model is left out of its own: the other four (0.1 .. 0.4), df 3
    fit = scored[(AUDITOR, fitting[1])]  # the last baseline model: its statistic is 0.5
    others = [0.1, 0.2, 0.3, 0.4]
    expected = (0.5 - 0.25) / (math.sqrt(sum((v - 0.25) ** 2 for v in others) / 3)
                               * math.sqrt(1 + 1 / 4))
    assert fit.findings[0].statistic == pytest.approx(expected)
    assert fit.notes["relative"]["leave_out"] == fitting[1]
    assert fitting[1] not in fit.notes["relative"]["references"]
    assert fit.notes["relative"]["df"] == 3
    # the p-values' degrees of freedom follow: the anomalous model's score is significant
    # against t(4) exactly where its tail is below 0.05
    z = anomalous.findings[0].statistic
    assert significant(anomalous.findings, baseline_count(anomalous)) == [
        student_t.sf(z, df=4) <= 0.05]


def test_references_alone_give_the_old_numbers(tiny_suite):
    suite = load_suite(tiny_suite)
    references = [s.name for s in baseline_models(suite)]
    values = dict(zip(references, [0.2, 0.3, 0.4]))
    values["anomalous"] = 0.6
    scored = relative_results(one_subgroup(values), references, {})
    # the issue-31 formula against the three references (test_discovery_metrics' hand values)
    assert scored[(AUDITOR, "anomalous")].findings[0].statistic == pytest.approx(
        0.3 / (0.1 * math.sqrt(4 / 3)))
    assert scored[(AUDITOR, "anomalous")].notes["relative"]["df"] == 2
    # a reference leave-one-out against the other two
    assert scored[(AUDITOR, references[2])].findings[0].statistic == pytest.approx(
        0.15 / (math.sqrt(0.005) * math.sqrt(1.5)))
    detections = detection_frame(scored, references, {"anomalous": "planted_slice"}, [],
                                 "relative")
    assert calibration_frame(detections, scored, references, [], [], "relative").empty


def test_calibration_counts_false_positives_per_half(halves_suite):
    references = [s.name for s in halves_suite.references]
    fitting = [s.name for s in halves_suite.null_fit]
    checking = [s.name for s in halves_suite.null_check]
    baseline = references + fitting
    star = dict(zip(baseline, [0.12, 0.13, 0.14, 0.10, 0.11]))  # the references highest
    # one checking model far above the baseline (a false positive by either rule), one inside
    star.update({checking[0]: 0.9, checking[1]: 0.11})
    # and one fitting model that fails on red things alone: flagged, on its own half
    red = {model: 0.9 if model == fitting[1] else 0.1 for model in star}
    scored = relative_results({(AUDITOR, model): audit(finding(star[model], **{"class": "star"}),
                                                       finding(red[model], colour="red"))
                               for model in star}, baseline, {})
    held_out = fitting + checking
    detections = detection_frame(scored, references, {}, held_out, "relative")
    frame = calibration_frame(detections, scored, references, checking, fitting, "relative")
    rows = frame.set_index("design")
    assert list(frame["design"]) == [CHECKING_HALF, FITTING_HALF]
    check = rows.loc[CHECKING_HALF]
    assert check["held_out"] == 2 and check["table3_false_positives"] == 1
    assert check["table3_rate"] == 0.5 and check["any_significant"] == 1
    assert check["df"] == 4 and check["baseline"] == "3 references + 2 fitting held-out"
    assert check["table3_low"] < 0.5 < check["table3_high"]  # a Wilson interval around it
    fit = rows.loc[FITTING_HALF]
    assert fit["held_out"] == 2 and fit["table3_false_positives"] == 1
    assert fit["df"] == 3 and fit["baseline"].endswith("each model left out of its own")


def test_finding_relation_to_the_planted_slice():
    planted = {"class": "star", "size": "large"}
    inside = Finding({"class": "star", "size": "large", "colour": "red"}, 0.9, 0.8, 1.0, 16,
                     OBJECTIVE)
    assert finding_relation(inside, planted, FACTORS) == IN_SLICE
    assert finding_relation(finding(0.9, **{"class": "star", "size": "small"}), planted,
                            FACTORS) == SHARES_FACTOR
    # the slice's factor at another value shares nothing
    assert finding_relation(finding(0.9, **{"class": "disk", "size": "small"}), planted,
                            FACTORS) == UNRELATED
    assert finding_relation(finding(0.9, colour="red"), planted, FACTORS) == UNRELATED
    assert finding_relation(None, planted, FACTORS) == NO_FINDING
    # a stark family (None), a cue no factor expresses (a text), a factor the world lacks
    assert finding_relation(inside, None, FACTORS) == NO_SLICE
    assert finding_relation(inside, "not expressible", FACTORS) == NO_SLICE
    assert finding_relation(inside, {"face": "present"}, FACTORS) == NO_SLICE


def test_table3_rows_say_what_each_detection_is():
    references = ["reference-00", "reference-01", "reference-02"]
    results = one_subgroup(dict(zip(references, [0.1, 0.2, 0.15])))
    results[(AUDITOR, "in")] = audit(finding(0.9, **{"class": "star", "size": "large"}))
    results[(AUDITOR, "near")] = audit(finding(0.9, **{"class": "star"}))
    results[(AUDITOR, "off")] = audit(finding(0.9, colour="grey"))
    results[(AUDITOR, "stark")] = audit(finding(0.9, colour="grey"))
    results[(AUDITOR, "missed")] = audit(finding(0.05, colour="grey"))
    planted = {"class": "star", "size": "large"}
    slices = {"in": planted, "near": planted, "off": planted, "missed": planted, "stark": None}
    families = {"in": "planted_slice", "near": "planted_slice", "off": "planted_slice",
                "missed": "planted_slice", "stark": "randomized_smoothing"}
    detections = detection_frame(results, references, families, [], "absolute", slices, FACTORS)
    relation = detections.set_index("model")["top_finding_relation"]
    assert relation["in"] == IN_SLICE and relation["near"] == SHARES_FACTOR
    assert relation["off"] == UNRELATED and relation["stark"] == NO_SLICE
    assert relation["reference-00"] == NO_SLICE
    counts = relation_counts(detections, ["planted_slice", "randomized_smoothing"]).set_index(
        "family")
    sliced = counts.loc["planted_slice"]
    # four models, three detected ("missed" is below the references): one of each kind
    assert sliced["n_models"] == 4 and sliced["n_detected"] == 3
    assert (sliced["detected_in_the_slice"], sliced["detected_shares_a_factor"],
            sliced["detected_unrelated"]) == (1, 1, 1)
    assert counts.loc["randomized_smoothing", "detected_no_slice"] == 1
    assert set(detections[detections["role"] == ROLE_ANOMALOUS]["model"]) == set(slices)


# ---------------------------------------------------------------- end to end, on a tiny suite
@pytest.fixture(scope="module")
def halves_run(tmp_path_factory):
    """test_auditors' tiny discover suite with two held-out references, one of them checking,
    trained for one epoch; discover.py run on twise (each model's own result) and caption_lift
    (adaptive: the baseline evaluated on every model's subgroups)."""
    base = tmp_path_factory.mktemp("halves")
    path = write_suite(base / "halves.toml", body="held_out = 2\nheld_out_check = 1\n" + DISCOVER_BODY,
                       references=2, epochs=1)
    runs = base / "runs"
    train.main(train.get_args_parser().parse_args(["--suite", str(path), "--runs-dir", str(runs),
                                                    "--no-progress", "--jobs", "1"]))
    with pytest.MonkeyPatch.context() as patch:  # a small pool: the stage runs in this process
        patch.setattr(synthetic_factors, "POOL_PER_CLASS", 300)
        tables = discover.main(discover.get_args_parser().parse_args(
            ["--suite", str(path), "--runs-dir", str(runs), "--no-progress", "--jobs", "1",
             "--auditor", "twise", "--auditor", "caption_lift"]))
        yield load_suite(path), runs, tables


def test_discover_scores_against_the_pooled_baseline_end_to_end(halves_run, capsys):
    suite, runs, tables = halves_run
    references = [s.name for s in suite.references]
    (fitting,), (checking,) = [s.name for s in suite.null_fit], [s.name for s in suite.null_check]
    world = build_world(suite.world, runs_root=runs)
    results = scored_findings(suite, runs, ["twise", "caption_lift"], world, "relative")
    for auditor in ("twise", "caption_lift"):
        assert results[(auditor, "missing-star")].notes["relative"]["references"] == sorted(
            references + [fitting])
        assert results[(auditor, checking)].notes["relative"]["references"] == sorted(
            references + [fitting])
        assert results[(auditor, fitting)].notes["relative"]["references"] == sorted(references)
    # the adaptive auditor's subgroups were evaluated by the fitting held-out model, never by
    # the checking one, and a rerun computes nothing again
    evaluators = {json.loads(p.read_text())["key"]["reference_id"]
                  for p in (runs / "store" / REFERENCE_FINDINGS / "caption_lift").glob("*/params.json")}
    assert evaluators == {suite.model(name).key for name in [*references, fitting]}
    options = RunOptions(runs_dir=str(runs), device="cpu", executor={"local_jobs": 1})
    assert evaluate_references(suite, options, adaptive_results(
        suite, runs, ["caption_lift"], world)) == 0
    calibration = tables["discovery-calibration"]
    assert set(zip(calibration["auditor"], calibration["design"])) == {
        (a, d) for a in ("twise", "caption_lift") for d in (CHECKING_HALF, FITTING_HALF)}
    assert (calibration["held_out"] == 1).all()
    # df: the checking model against all three baseline models, the fitting one against two
    # (also where an auditor has no finding on it: caption_lift keeps significant ones only)
    assert calibration.set_index(["auditor", "design"])["df"].to_dict() == {
        (a, d): df for a in ("twise", "caption_lift")
        for d, df in ((CHECKING_HALF, 2), (FITTING_HALF, 1))}
    per_model = tables["discovery-detection-per-model"].set_index(["auditor", "model"])
    assert per_model.loc[("twise", "missing-star"), "top_finding_relation"] != NO_SLICE
    assert per_model.loc[("twise", checking), "top_finding_relation"] == NO_SLICE
    assert "discovery-detection-relations" in tables
    assert (runs / "halves" / "tables" / "discovery-detection-relations.csv").is_file()


def test_the_report_shows_each_detections_relation_escaped():
    references = ["reference-00", "reference-01"]
    stranger = "<script>x</script>"
    results = one_subgroup(dict(zip(references, [0.1, 0.2])))
    results[(AUDITOR, stranger)] = audit(finding(0.9, colour="grey"))
    detections = detection_frame(results, references, {stranger: "planted_slice"}, [],
                                 "absolute", {stranger: {"class": "star"}}, FACTORS)
    rows = per_model_detections(detections)
    assert list(rows["model"]) == [stranger]  # the judged models only, not the references
    html = html_table(rows)
    assert UNRELATED in html and "colour=grey" in html
    assert stranger not in html and "&lt;script&gt;" in html
