"""The zoo suite runs every shipped method (a user's plug-in file's are not its to list), and its
summary table ranks them by the defects they find beyond the outputs-only control (evaluate/scoring/zoo.py)."""
import pandas as pd

from counteraudit.anomalies.base import FAMILIES
import pytest

from counteraudit.evaluate.scoring.tables import (seeds_per_configuration, zoo_summary_caption,
                                                  zoo_summary_tables)
from counteraudit.evaluate.scoring.zoo import paper_rule_basis, zoo_summary
from counteraudit.explain.base import METHODS
from counteraudit.train.core.suite import load_suite


def test_zoo_suite_runs_every_registered_method_on_the_demos_models():
    zoo, demo = load_suite("zoo"), load_suite("demo")
    methods = zoo.explain.methods
    assert sorted(methods) == sorted(METHODS.shipped_names()), "add a new method to zoo.toml's list"
    assert len(methods) == len(set(methods))
    # the demo's models, key for key, then the sanity checks (Adebayo et al. 2018)
    assert [s.key for s in zoo.models[:len(demo.models)]] == [s.key for s in demo.models]
    extra = zoo.models[len(demo.models):]
    assert extra and all(FAMILIES.get(s.family).sanity_check for s in extra)
    assert {s.family for s in extra} == {n for n in FAMILIES.shipped_names() if FAMILIES.get(n).sanity_check}
    for name, table in demo.method_tables.items():  # the demo's visualizations, same keys
        assert zoo.method_tables[name] == table


def _detections(rows):
    """Table 1's per-model rows: (method, model, detected) of anomalous models, plus a reference
    row (no verdict) that must not count."""
    frame = pd.DataFrame([{"method": m, "model": f, "family": "x", "role": "anomalous",
                           "detected": d, "margin": 1.1 if d else 0.9} for m, f, d in rows])
    refs = pd.DataFrame([{"method": m, "model": "reference-00", "family": "reference",
                          "role": "reference", "detected": float("nan"), "margin": float("nan")}
                         for m in dict.fromkeys(frame["method"])])
    return pd.concat([frame, refs], ignore_index=True)


# Three anomalous models a, b, c; outputs-only detects a only.
DETECTIONS = _detections([
    ("outputs_only", "a", True), ("outputs_only", "b", False), ("outputs_only", "c", False),
    ("random_map", "a", False), ("random_map", "b", True), ("random_map", "c", False),
    ("gradcam", "a", True), ("gradcam", "b", True), ("gradcam", "c", False),     # 2, 1 beyond
    ("saliency", "a", True), ("saliency", "b", False), ("saliency", "c", False),  # 1, 0 beyond
    ("lime", "a", False), ("lime", "b", True), ("lime", "c", True),              # 2, 2 beyond
])
# Localizable models a and b: verdicts against outputs-only.
VERSUS = pd.DataFrame([{"method": m, "model": f, "verdict": v} for m, f, v in [
    ("random_map", "a", "less"), ("random_map", "b", "same"),
    ("gradcam", "a", "adds"), ("gradcam", "b", "adds"),    # beyond = 1 + 2 = 3
    ("saliency", "a", "adds"), ("saliency", "b", "less"),  # beyond = 0 + 1 = 1
    ("lime", "a", "same"), ("lime", "b", "adds"),          # beyond = 2 + 1 = 3, ties gradcam
]])


def test_summary_counts_ranks_and_puts_controls_last_with_the_null_rate():
    table = zoo_summary(DETECTIONS, VERSUS, n_references=4).set_index("method")
    assert list(table.index) == ["gradcam", "lime", "saliency", "outputs_only", "random_map"]
    expected = {  # beyond, detected, beyond outputs, adds, same, less, rank
        "gradcam": (3, 2, 1, 2, 0, 0, 1), "lime": (3, 2, 2, 1, 1, 0, 1),
        "saliency": (1, 1, 0, 1, 0, 1, 3), "random_map": (1, 1, 1, 0, 1, 1, None)}
    for method, (beyond, detected, beyond_det, adds, same, less, rank) in expected.items():
        row = table.loc[method]
        assert (row["beyond_outputs"], row["detected"], row["detected_beyond_outputs"],
                row["localized_adds"], row["localized_same"], row["localized_less"]) == \
            (beyond, detected, beyond_det, adds, same, less), method
        assert (pd.isna(row["rank"]) if rank is None else row["rank"] == rank), method
    assert table.loc["random_map", "detection_rate"] == pytest.approx(1 / 3)
    assert table.loc["random_map", "null_rate"] == pytest.approx(1 / 5)
    assert table.loc["outputs_only", "detected"] == 1 and table["n_models"].eq(3).all()
    assert table.loc[["gradcam", "lime", "saliency"], "null_rate"].isna().all()


def test_summary_carries_table_1s_paired_comparison():
    """detection_adds/same/less count the paired margin verdicts of anomalous models only;
    mcnemar_p tests each method's detections against the control's on the same models."""
    paired = pd.DataFrame([{"method": m, "model": f, "role": r, "verdict": v} for m, f, r, v in [
        ("gradcam", "a", "anomalous", "same"), ("gradcam", "b", "anomalous", "adds"),
        ("gradcam", "c", "anomalous", "adds"), ("gradcam", "held-out", "null", "adds"),
        ("lime", "a", "anomalous", "less"), ("lime", "b", "anomalous", "adds"),
        ("lime", "c", "anomalous", "adds"),
    ]])
    table = zoo_summary(DETECTIONS, VERSUS, 4, detection_versus=paired).set_index("method")
    assert table.loc["gradcam", ["detection_adds", "detection_same", "detection_less"]].tolist() \
        == [2, 1, 0]
    assert table.loc["lime", ["detection_adds", "detection_same", "detection_less"]].tolist() \
        == [2, 0, 1]
    assert table.loc["saliency", "detection_adds"] == 0  # no paired rows: nothing counted
    # lime: b, c only lime, a only outputs-only; 3 discordant, 1 the other way: 2 P(X <= 1) = 1
    assert table.loc["lime", "mcnemar_p"] == pytest.approx(1.0)
    assert table.loc["saliency", "mcnemar_p"] == 1.0  # the same detections as the control
    assert pd.isna(table.loc["outputs_only", "mcnemar_p"])


def test_summary_is_written_only_when_detection_and_the_comparison_are_both_there():
    tables = {"detection-per-model-l2": DETECTIONS,
              "localization-vs-outputs-per-model-l2": VERSUS}
    written = zoo_summary_tables(tables, "l2", n_references=4)
    assert list(written) == ["zoo-summary-l2"]
    assert list(written["zoo-summary-l2"]["method"][:2]) == ["gradcam", "lime"]
    assert zoo_summary_tables({"detection-per-model-l2": DETECTIONS}, "l2", 4) == {}
    without_control = DETECTIONS[DETECTIONS["method"] != "outputs_only"]
    assert zoo_summary_tables({"detection-per-model-l2": without_control,
                               "localization-vs-outputs-per-model-l2": VERSUS}, "l2", 4) == {}
    with pytest.raises(ValueError, match="outputs_only"):
        zoo_summary(without_control, VERSUS, 4)


# The family verdicts of a suite with null models: gradcam's verdicts detect two families, lime's
# one, though lime detects more models by the paper's rule (DETECTIONS); the control detects x.
FAMILIES_TABLE = pd.DataFrame([{"family": f, "method": m, "verdict": v, "test": "huber"}
                               for f, m, v in [
    ("x", "outputs_only", "detected"), ("y", "outputs_only", "inconclusive"),
    ("z", "outputs_only", "not detected"),
    ("x", "gradcam", "detected"), ("y", "gradcam", "detected"), ("z", "gradcam", "inconclusive"),
    ("x", "lime", "inconclusive"), ("y", "lime", "detected"), ("z", "lime", "not detected"),
    ("x", "saliency", "not detected"), ("y", "saliency", "not detected"),
    ("z", "saliency", "detected"),
    ("x", "random_map", "not detected"), ("y", "random_map", "not detected"),
    ("z", "random_map", "not detected")]])


def test_with_null_models_the_summary_reads_the_family_verdicts_and_ranks_by_them():
    table = zoo_summary(DETECTIONS, VERSUS, 4, families=FAMILIES_TABLE).set_index("method")
    assert list(table.columns[:5]) == ["rank", "families_beyond_outputs", "families_detected",
                                       "families_not_detected", "families_inconclusive"]
    counts = table[["families_beyond_outputs", "families_detected", "families_not_detected",
                    "families_inconclusive"]]
    # each count is the verdicts' own: (beyond the control's detected x, detected, missed, undecided)
    for method, rows in FAMILIES_TABLE.groupby("method"):
        said = rows.set_index("family")["verdict"]
        assert counts.loc[method].tolist() == [
            int(((said == "detected") & (said.index != "x")).sum()), int((said == "detected").sum()),
            int((said == "not detected").sum()), int((said == "inconclusive").sum())], method
    # ranked by families beyond the control, then detected, then localized_adds: lime and
    # saliency tie on the verdicts (1, 1); lime localizes 1 model beyond the control, saliency 1
    assert list(table.index[:3]) == ["gradcam", "lime", "saliency"]
    assert table.loc["gradcam", "rank"] == 1 and table.loc["lime", "rank"] == 2
    assert table.loc["saliency", "rank"] == 2  # the same keys as lime: a shared rank
    # the paper's rule alone ranks lime level with gradcam (beyond_outputs 3 each)
    plain = zoo_summary(DETECTIONS, VERSUS, 4).set_index("method")
    assert plain.loc["lime", "rank"] == plain.loc["gradcam", "rank"] == 1
    assert "families_detected" not in plain.columns  # no nulls: the old table, unchanged
    # the controls stay last and unranked
    assert list(table.index[-2:]) == ["outputs_only", "random_map"]
    assert table.loc[["outputs_only", "random_map"], "rank"].isna().all()
    # zoo_summary_tables reads the verdicts wherever the tables hold them
    written = zoo_summary_tables({"detection-per-model-l2": DETECTIONS,
                                  "localization-vs-outputs-per-model-l2": VERSUS,
                                  "detection-families-l2": FAMILIES_TABLE}, "l2", 4)
    assert written["zoo-summary-l2"]["families_detected"].tolist() == \
        table.reset_index()["families_detected"].tolist()


def test_the_caption_says_what_the_summary_rests_on():
    """Without null models: the seeds per configuration and the references, counts by the
    paper's rule; with them: the verdicts' test."""
    quick, replicated = load_suite("quick"), load_suite("replicated")
    assert seeds_per_configuration(quick) == 1 and seeds_per_configuration(replicated) > 1
    caption = zoo_summary_caption(quick, None, "l2")
    assert caption.startswith(f"One seed per configuration and {len(quick.references)} "
                              "references: counts by the paper's rule, not statistical verdicts.")
    assert "huber" not in caption
    assert paper_rule_basis(5, seeds_per_configuration(replicated)).startswith(
        f"{seeds_per_configuration(replicated)} seeds per configuration and 5 references")
    with_verdicts = zoo_summary_caption(replicated, FAMILIES_TABLE, "l2")
    assert "family verdicts of the huber test" in with_verdicts
    assert "not statistical verdicts" not in with_verdicts
