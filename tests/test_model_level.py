"""Model-level methods (feature synthesis): every model explained on the world's ``classes`` set
alone, detection scored per class, localization marked "not applicable"."""
import numpy as np
import pandas as pd

from counteraudit.anomalies.image_sets import CLASSES, DETECTION, classes_set, classes_set_id
from counteraudit.evaluate.scoring.distances import build_distance
from counteraudit.evaluate.scoring.stage import detection_scores, localization_scores
from counteraudit.evaluate.scoring.tables import localization_tables
from counteraudit.evaluate.scoring.zoo import zoo_summary
from counteraudit.explain.base import Explanation, build_method
from counteraudit.explain.stage import detection_set_for, result_dir, sets_for
from counteraudit.explain.store import save_explanation
from counteraudit.train.core.suite import load_suite
from counteraudit.train.worlds import build_world
from conftest import write_suite

BODY = """
[[anomalies]]
name = "backdoor"
family = "backdoor"

[explain]
methods = ["outputs_only", "feature_synthesis"]
"""
METHOD = "feature_synthesis"
CLASS_COUNT, SIDE = 10, 32  # conftest's tiny world


def test_every_model_is_explained_on_the_classes_set_only(tmp_path):
    suite = load_suite(write_suite(tmp_path / "s.toml", body=BODY))
    for spec in suite.models:  # references and the localizable anomaly alike
        assert sets_for(suite, spec, METHOD) == [CLASSES]
    assert sets_for(suite, suite.model("backdoor"), "outputs_only") == [DETECTION, "backdoor-abnormal"]
    assert detection_set_for(METHOD) == CLASSES and detection_set_for("outputs_only") == DETECTION
    other = load_suite(write_suite(tmp_path / "other.toml", body=BODY, references=4))
    assert classes_set_id(other) == classes_set_id(suite)  # a function of the world alone


def test_detection_scores_one_score_per_class_and_localization_leaves_it_out(tmp_path, runs):
    suite = load_suite(write_suite(tmp_path / "s.toml", body=BODY))
    classes = classes_set(suite, build_world(suite.world, runs_root=runs))
    assert classes.images.shape == (CLASS_COUNT, SIDE, SIDE, 3)
    np.testing.assert_array_equal(classes.labels, np.arange(CLASS_COUNT))
    description = build_method(METHOD, {"steps": 1}).describe("small_resnet")
    rng = np.random.default_rng(0)
    for spec in suite.models:  # stored results, as the explain stage links them
        explanation = Explanation(images=rng.integers(0, 256, (CLASS_COUNT, SIDE, SIDE, 3), np.uint8),
                                  targets=np.arange(CLASS_COUNT), params=description)
        save_explanation(result_dir(suite.root(runs), METHOD, spec.name, CLASSES), explanation,
                         spec.key, classes.id)
    scores = detection_scores(suite, build_distance("l2"), [METHOD], runs)
    assert set(scores["image_set"]) == {CLASSES}
    for model in [spec.name for spec in suite.models]:
        assert sorted(scores[scores["model"] == model]["image"]) == list(range(CLASS_COUNT))
    assert np.isfinite(scores["score"]).all()
    assert localization_scores(suite, build_distance("l2"), [METHOD], runs).empty


def test_table2_and_the_zoo_summary_say_not_applicable():
    scores = pd.DataFrame([{"method": "gradcam", "model": "backdoor", "image": i,
                            "score": float(i), "abnormal": i >= 4, "layer": ""} for i in range(8)])
    table2 = localization_tables(scores, "l2", not_applicable=[METHOD])["localization-l2"]
    row = table2.set_index("method").loc[METHOD]
    assert list(row) == ["not applicable"]
    assert table2.set_index("method").loc["gradcam", "backdoor"] == 1.0
    only_model_level = localization_tables(scores.iloc[:0], "l2", not_applicable=[METHOD])
    assert only_model_level["localization-l2"].set_index("method").loc[METHOD].tolist() == [
        "not applicable"]
    detections = pd.DataFrame([{"method": m, "model": "backdoor", "role": "anomalous",
                                "detected": d} for m, d in
                               [("outputs_only", False), (METHOD, True), ("gradcam", False)]])
    versus = pd.DataFrame([{"method": "gradcam", "model": "backdoor", "verdict": "adds"}])
    summary = zoo_summary(detections, versus, 3, not_localized=[METHOD]).set_index("method")
    assert (summary.loc[METHOD, ["localized_adds", "localized_same", "localized_less"]]
            == "not applicable").all()
    assert summary.loc[METHOD, "beyond_outputs"] == 1  # its detection beyond the control
    assert summary.loc["gradcam", "localized_adds"] == 1
