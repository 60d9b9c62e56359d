"""A model-blind method (maps the same for every model, so every anomaly score is 0 / 0) is said
to be one, in words, by Table 1, Table 2, the report's summary and the zoo summary, and left out
of rankings, McNemar comparisons and "missed by" lines; a method whose maps depend on the model
is not (evaluate/scoring/model_blind.py). Checked on score tables built here for the demo suite's
models. edge_map, the shipped blind control, gives the same maps for two different models and
different maps for different images."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from counteraudit.anomalies.image_sets import localizable
from counteraudit.evaluate.reporting.summary import summary_sentences
from counteraudit.evaluate.scoring.distances.base import Distance, Features
from counteraudit.evaluate.scoring.detection import paper_rule_caution
from counteraudit.evaluate.scoring.model_blind import MODEL_BLIND, detection_blind, model_blind_table
from counteraudit.evaluate.scoring.scores import anomaly_scores
from counteraudit.evaluate.scoring.tables import detection_tables, localization_tables, zoo_summary_tables
from counteraudit.explain.base import METHODS, build_method
from counteraudit.train.core.suite import load_suite

BLIND, SEEING, OTHER, CONTROL = "edge_map", "gradcam", "saliency", "outputs_only"
IMAGES = 12
DEMO = load_suite("demo")
REFERENCES = [spec.name for spec in DEMO.references]
ANOMALOUS = [spec.name for spec in DEMO.anomalies]


class AbsoluteDifference(Distance):
    """d(a, b) = |a - b| on one number per image: a map reduced to one value."""

    name = "absolute-difference"

    def features(self, images) -> Features:
        return Features(self.name, (torch.as_tensor(np.asarray(images, dtype=np.float64)),), (1, 1))

    def paired(self, features_a, features_b):
        return (features_a.tensors[0] - features_b.tensors[0]).abs().numpy()


DISTANCE = AbsoluteDifference()


def map_values(method: str, model: str, images: int = IMAGES, shift: float = 0.0) -> np.ndarray:
    """One value per image standing for a method's map: the blind method's depends on the image
    alone; the others' on the model too, some anomalous models far from the references: the
    first three for the seeing method, the fourth for the other, the first for the control."""
    image_part = np.arange(images, dtype=np.float64)
    if method == BLIND:
        return image_part
    rng = np.random.default_rng([sum(map(ord, method)), sum(map(ord, model))])
    far = {SEEING: ANOMALOUS[:3], OTHER: ANOMALOUS[3:4], CONTROL: ANOMALOUS[:1]}[method]
    return image_part + rng.random(images) + (5.0 if model in far else 0.0) + shift


def detection_scores(methods=(BLIND, SEEING, OTHER, CONTROL)) -> pd.DataFrame:
    return pd.concat([anomaly_scores(
        {m: DISTANCE.features(map_values(method, m)) for m in [*REFERENCES, *ANOMALOUS]},
        REFERENCES, DISTANCE, labels={"method": method, "image_set": "detection"})
        for method in methods], ignore_index=True)


def localization_scores(methods=(BLIND, SEEING, OTHER, CONTROL)) -> pd.DataFrame:
    """Each localizable model on its normal and abnormal images (abnormal: shifted for the
    seeing method and the control, so they get AUROCs; the blind method's stay 0 / 0)."""
    frames = []
    for method in methods:
        for spec in localizable(DEMO):
            for abnormal in (False, True):
                shift = 0.5 if abnormal else 0.0
                features = {m: DISTANCE.features(map_values(method, m, shift=shift if m == spec.name
                                                            else 0.0)) for m in REFERENCES}
                features[spec.name] = DISTANCE.features(map_values(method, spec.name, shift=shift))
                frames.append(anomaly_scores(features, REFERENCES, DISTANCE, models=[spec.name],
                                             labels={"method": method, "abnormal": abnormal}))
    return pd.concat(frames, ignore_index=True)


def test_the_rule_flags_a_method_only_when_its_references_never_differ():
    table = model_blind_table(detection_scores()).set_index("method")
    assert bool(table.loc[BLIND, "model_blind"])
    assert table.loc[BLIND, "n_reference_pairs"] == len(REFERENCES) * (len(REFERENCES) - 1) // 2
    assert table.loc[BLIND, "n_images"] == IMAGES
    assert not table.loc[[SEEING, OTHER, CONTROL], "model_blind"].any()
    # references identical on every image but one: that image still scores, so it is not blind
    features = {m: DISTANCE.features(np.r_[np.zeros(IMAGES - 1), [float(k)]])
                for k, m in enumerate([*REFERENCES, *ANOMALOUS])}
    almost = anomaly_scores(features, REFERENCES, DISTANCE, labels={"method": "almost"})
    assert not model_blind_table(almost)["model_blind"].any()


def test_table_1_names_the_blind_method_and_leaves_it_out_of_the_comparisons():
    tables = detection_tables(DEMO, detection_scores(), "l2")
    table1 = tables["detection-l2"]
    assert (table1[BLIND] == MODEL_BLIND).all()  # never a 0.000 that reads as "missed"
    assert pd.to_numeric(table1[SEEING]).notna().all()
    assert (tables["detection-intervals-l2"][BLIND] == MODEL_BLIND).all()
    said = detection_blind(tables, "l2")
    assert list(said) == [BLIND]
    assert said[BLIND] == (f"{BLIND}: model-blind \u2014 its maps are the same for every model "
                           f"(all 10 reference pairs at distance 0 on all {IMAGES} images); no "
                           "detection is possible, so it is not ranked")
    versus = tables["detection-vs-outputs-per-model-l2"]
    assert BLIND not in set(versus["method"]) and SEEING in set(versus["method"])
    assert BLIND not in set(tables["detection-vs-outputs-l2"]["method"])


def test_table_2_says_model_blind_instead_of_an_empty_row():
    tables = localization_tables(localization_scores(), "l2", DEMO)
    table2 = tables["localization-l2"].set_index("method")
    assert (table2.loc[BLIND] == MODEL_BLIND).all()
    assert pd.to_numeric(table2.loc[SEEING]).notna().all()
    assert BLIND not in set(tables["localization-vs-outputs-per-model-l2"]["method"])
    per_model = tables["localization-per-model-l2"]
    assert (per_model[per_model["method"] == BLIND]["flag"] == "all_scores_flagged").all()


def test_the_zoo_summary_lists_the_blind_method_last_unranked_without_mcnemar():
    tables = {**detection_tables(DEMO, detection_scores(), "l2"),
              **localization_tables(localization_scores(), "l2", DEMO)}
    summary = zoo_summary_tables(tables, "l2", len(REFERENCES))["zoo-summary-l2"]
    assert summary["method"].iloc[-1] == BLIND
    row = summary.set_index("method").loc[BLIND]
    assert row["note"] == MODEL_BLIND and pd.isna(row["rank"])
    assert pd.isna(row["mcnemar_p"]) and pd.isna(row["beyond_outputs"]) and pd.isna(row["detected"])
    seeing = summary.set_index("method").loc[SEEING]
    assert seeing["rank"] == 1 and seeing["note"] == "" and seeing["detected"] == 3
    assert np.isfinite(seeing["mcnemar_p"])


def test_the_reports_summary_says_it_first_and_never_missed_by():
    tables = {**detection_tables(DEMO, detection_scores(), "l2"),
              **localization_tables(localization_scores(), "l2", DEMO)}
    topics = summary_sentences(tables["detection-l2"], tables["localization-per-model-l2"],
                               tables["localization-vs-outputs-per-model-l2"],
                               sanity_families=["backdoor"], n_references=len(REFERENCES),
                               model_blind=detection_blind(tables, "l2"))
    assert list(topics)[0] == "Model-blind methods (not ranked)"
    assert topics["Model-blind methods (not ranked)"] == [detection_blind(tables, "l2")[BLIND] + "."]
    others = [line for topic, lines in topics.items() if topic != list(topics)[0] for line in lines]
    assert others and not [line for line in others if BLIND in line]
    # a seeing method that misses is still named; the blind one never is
    assert "backdoor (2 models): detected by gradcam (2/2) only (" \
        f"{paper_rule_caution(len(REFERENCES))}); missed by saliency; the " \
        "outputs-only control detects 1/2." in others
    assert "backdoor: missed by saliency, which therefore do not depend on the model enough to " \
        "tell it from one that learnt nothing." in others
    # without the blind table's sentences, Table 1's cells still keep it out of the counts
    plain = summary_sentences(tables["detection-l2"], n_references=len(REFERENCES))
    assert list(plain) == ["Detection (Table 1, the paper's rule)", "Beyond the outputs"]
    assert not [line for lines in plain.values() for line in lines if BLIND in line]


def test_edge_map_is_registered_and_sees_the_image_never_the_model():
    assert BLIND in METHODS.names()
    torch.manual_seed(0)
    first = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 4))
    second = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 4))
    assert not torch.equal(first[1].weight, second[1].weight)
    images = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    images[2] = 0.5  # a flat image has no edges
    method = build_method(BLIND)
    a, b = method.run(first, images, batch_size=2), method.run(second, images, batch_size=3)
    assert np.array_equal(a.images, b.images) and np.array_equal(a.raw, b.raw)
    assert not np.array_equal(a.raw[0], a.raw[1]) and not np.array_equal(a.images[0], a.images[1])
    assert a.raw.min() >= 0 and a.raw[:2].max() == pytest.approx(1.0) and a.raw[2].max() == 0
    # a vertical step: the edge is where the columns change, nowhere else
    step = torch.zeros(1, 3, 16, 16)
    step[..., 8:] = 1.0
    edges = method.run(first, step).raw[0]
    assert (edges[:, 7:9] == 1).all() and (edges[:, :7] == 0).all() and (edges[:, 9:] == 0).all()
