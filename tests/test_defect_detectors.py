"""Model-level defect detectors: every registered one on real trained models (generated from
``DETECTORS``), the inspect stage's store, their rows beside the methods' in Tables 1 and 2, and
the errors that come before any work."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import ONE_PROCESS, run_in_process, write_suite
from counteraudit.evaluate import detect
from counteraudit.evaluate.defect_detectors.detectors import DETECTORS, Evidence, build_detector
from counteraudit.evaluate.defect_detectors.detectors.weight_statistics import layer_statistics
from counteraudit.evaluate.defect_detectors.evidence import evidence_for
from counteraudit.evaluate.defect_detectors.scores import MODEL_SET, StatisticDistance
from counteraudit.evaluate.defect_detectors.stage import (INSPECTION_STORE, DetectorRefused, check_detectors,
                                                          inspect_suite, inspection_dir, inspection_key,
                                                          load_inspections)
from counteraudit.evaluate.defect_detectors.tables import trigger_footprint
from counteraudit.explain.base import METHODS
from counteraudit.explain.stage import load_image_sets, sets_for
from counteraudit.train.architectures import build_model
from counteraudit.train.checkpoint import model_dir
from counteraudit.train.core.registry import UnknownNameError
from counteraudit.train.core.stage import RunOptions
from counteraudit.train.core.suite import load_suite
from counteraudit.train.trainer import load_trained_model
from counteraudit.train.training_parts import build_family
from counteraudit.train.worlds import build_world

NAMES = DETECTORS.names()


@pytest.fixture(scope="module")
def inspected(finished_run):
    """Every model of the finished run with its evidence, loaded once: (suite, runs, world,
    {model: (model, evidence with training data)})."""
    suite_path, runs, _ = finished_run
    suite = load_suite(suite_path)
    world = build_world(suite.world, runs_root=runs)
    image_sets = load_image_sets(suite, runs, world)
    loaded = {}
    for spec in suite.models:
        model = load_trained_model(model_dir(runs, spec), spec, world)
        loaded[spec.name] = (model, evidence_for(suite, spec, world, model, image_sets,
                                                 with_training=True))
    return suite, runs, world, loaded


def test_detector_names_are_not_method_names():
    """One namespace for Table 1's columns: a detector named like a method would merge with it."""
    assert NAMES and not set(NAMES) & set(METHODS.names())


# The optimising detectors at a quarter of their steps here: each step runs the same code (the
# cost schedule's patience is 5 steps), so the bits, lengths and shapes below are checked as at
# their defaults, in a quarter of the time; their own tests (test_neural_cleanse_mmbd.py) run
# them at full length and check what they find.
FEWER_STEPS = {"neural_cleanse": {"steps": 15}, "mm_bd": {"steps": 20}}


@pytest.mark.parametrize("name", NAMES)
def test_every_detector_inspects_models_deterministically(name, inspected):
    """The same seed gives the same bits; every model's statistic has one length (the anomaly
    score compares them); what the class flags promise is there, in the shapes scoring reads.
    On a reference (twice), the backdoor and the smoothed model (each detector's own test checks
    what it finds)."""
    suite, _, _, loaded = inspected
    detector = build_detector(name, FEWER_STEPS.get(name))
    repeated = build_detector(name, FEWER_STEPS.get(name)).run(*loaded["reference-00"], seed=0)
    lengths = {repeated.statistic.shape}
    for model_name in ("reference-00", "backdoor", "smoothing"):
        spec = suite.model(model_name)
        model, evidence = loaded[model_name]
        first = detector.run(model, evidence, seed=0)
        lengths.add(first.statistic.shape)
        if model_name == "reference-00":
            assert first.statistic.tobytes() == repeated.statistic.tobytes()
            assert ((math.isnan(first.score) and math.isnan(repeated.score))
                    or first.score == repeated.score)
            assert first.flagged == repeated.flagged
            for set_name, values in first.per_input.items():
                assert values.tobytes() == repeated.per_input[set_name].tobytes()
        if detector.scores_inputs:
            assert set(first.per_input) == set(evidence.image_sets) == set(sets_for(suite, spec))
            for set_name, values in first.per_input.items():
                assert len(values) == len(evidence.image_sets[set_name])
        else:
            assert first.per_input == {}
        if detector.reverse_engineers_trigger:
            assert first.mask is not None and first.mask.shape == evidence.image_size
        if detector.needs_training_data:
            assert first.training_scores is not None
            assert len(first.training_scores) == len(evidence.training.labels)
        if detector.control:
            assert first.flagged is None  # a control has no rule of its own to report
    assert len(lengths) == 1, f"{name}: statistics of different lengths {lengths}"
    json.dumps(detector.describe())  # part of a stored key


@pytest.mark.parametrize("name", NAMES)
def test_an_inspection_leaves_the_model_as_it_found_it(name, inspected):
    """In training mode with trainable parameters before, the same after, and no gradient left
    on them: the model is inspected frozen, in evaluation mode."""
    model, evidence = inspected[3]["backdoor"]
    model.train()
    try:
        build_detector(name, {"steps": 2} if name in FEWER_STEPS else None).run(model, evidence)
        assert model.training
        assert all(p.requires_grad and p.grad is None for p in model.parameters())
    finally:
        model.eval()


@pytest.mark.parametrize("name", [n for n in NAMES if DETECTORS.get(n).needs_training_data])
def test_a_detector_that_reads_training_data_refuses_evidence_without_it(name, inspected):
    suite, _, _, loaded = inspected
    model, evidence = loaded["backdoor"]
    bare = type(evidence)(evidence.num_classes, evidence.clean_images, evidence.clean_labels,
                          evidence.image_sets, training=None)
    with pytest.raises(ValueError, match="needs the model's training data"):
        build_detector(name).run(model, bare)


def test_the_training_sample_marks_the_poisoned_rows(inspected):
    """The backdoor's replayed first epoch: about nu of the rows carry the trigger and the target
    label; a reference's sample is untouched."""
    suite, _, _, loaded = inspected
    poisoned = loaded["backdoor"][1].training
    share = poisoned.changed.mean()
    assert 0.2 < share < 0.4  # nu = 0.3
    assert (poisoned.labels[torch.from_numpy(poisoned.changed)] == 0).all()  # the target class
    clean = loaded["reference-00"][1].training
    assert not clean.changed.any()
    # the defender's clean images are the same for every model
    assert torch.equal(loaded["backdoor"][1].clean_images, loaded["reference-00"][1].clean_images)


def test_weight_statistics_are_the_published_statistics_and_see_weights_only():
    values = np.random.default_rng(0).normal(0.5, 2.0, size=1001)
    log_std, mean_over_std, *quantiles = layer_statistics(values)
    std = values.std()
    assert log_std == pytest.approx(np.log(std))
    assert mean_over_std == pytest.approx(values.mean() / std)
    assert quantiles == pytest.approx(list(np.quantile(values, [0, .25, .5, .75, 1]) / std))
    # a model with the same weights and a different input pipeline has the same statistic
    model = build_model("small_resnet", 10, (0.5,) * 3, (0.25,) * 3)
    other = build_model("small_resnet", 10, (0.1,) * 3, (0.9,) * 3)
    other.backbone.load_state_dict(model.backbone.state_dict())
    evidence = Evidence(10, torch.rand(4, 3, 32, 32), torch.zeros(4, dtype=torch.long))
    detector = build_detector("weight_statistics")
    first, second = detector.run(model, evidence), detector.run(other, evidence)
    assert first.statistic.tobytes() == second.statistic.tobytes()
    with torch.no_grad():
        next(other.backbone.parameters()).mul_(2)
    assert detector.run(other, evidence).statistic[0] == pytest.approx(first.statistic[0] + np.log(2))


def test_statistic_distance_is_euclidean_and_exact():
    distance = StatisticDistance()
    a = np.array([[0.0, 3.0], [1.0, 1.0]])
    b = np.array([[4.0, 0.0], [1.0, 1.0]])
    assert distance.paired(distance.features(a), distance.features(b)).tolist() == [5.0, 0.0]
    with pytest.raises(ValueError, match="different lengths"):
        distance.paired(distance.features(a), distance.features(np.zeros((2, 3))))


def test_the_trigger_footprint_is_the_planted_trigger(inspected):
    suite, runs, world, loaded = inspected
    detection = load_image_sets(suite, runs, world)["detection"]
    images = detection.tensor()
    backdoor = build_family(suite.model("backdoor"), world)
    footprint = trigger_footprint(backdoor, images, np.asarray(detection.labels))
    rows, columns = np.nonzero(footprint)
    # a 6-px trigger (size 0.2 of 32 px) at the top left
    assert 0 < footprint.sum() <= 36 and rows.max() < 8 and columns.max() < 8
    smoothing = build_family(suite.model("smoothing"), world)
    assert trigger_footprint(smoothing, images, np.asarray(detection.labels)) is None


# ---------------------------------------------------------------- the stage and the tables
@pytest.fixture
def run_copy(finished_run, tmp_path):
    suite_path, runs, _ = finished_run
    shutil.copytree(runs, tmp_path / "runs", symlinks=True)
    return suite_path, tmp_path / "runs"


def test_the_stage_stores_once_and_recomputes_a_damaged_inspection(run_copy):
    suite_path, runs = run_copy
    suite = load_suite(suite_path)
    # its items in this process: a worker pool (one per core by default) would start an
    # interpreter per worker for 5 tiny items; the executors' tests start workers themselves
    options = RunOptions(runs_dir=str(runs), progress=False, executor={"local_jobs": 1})
    assert inspect_suite(suite, options, ["weight_statistics"]) == {"computed": 5, "stored": 0}
    assert inspect_suite(suite, options, ["weight_statistics"]) == {"computed": 0, "stored": 5}
    stored = load_inspections(suite, ["weight_statistics"], runs)
    spec = suite.model("backdoor")
    ids = {n: s.id for n, s in load_image_sets(suite, runs).items()}
    key = inspection_key(suite, build_detector("weight_statistics"), spec, ids)
    directory = inspection_dir(runs, key)
    payload = INSPECTION_STORE.payload_path(directory)
    payload.write_text(payload.read_text().replace("[", "[1.5, ", 1))  # a changed statistic
    assert inspect_suite(suite, options, ["weight_statistics"]) == {"computed": 1, "stored": 4}
    again = load_inspections(suite, ["weight_statistics"], runs)
    assert (again[("weight_statistics", "backdoor")].inspection.statistic.tobytes()
            == stored[("weight_statistics", "backdoor")].inspection.statistic.tobytes())


def test_detect_scores_detectors_beside_the_methods(run_copy):
    """Table 1 has a column per detector, computed by the anomaly score of its output against
    the references' (recomputed here from the stored inspections), and its own tables."""
    suite_path, runs = run_copy
    out = run_in_process("evaluate/detect.py", "--suite", suite_path, "--runs-dir", runs, "--distance",
                         "l2", "--no-progress", "--method", "guided_backprop",
                         "--detector", "weight_statistics", *ONE_PROCESS)
    assert "weight_statistics" in out.split("Table 1", 1)[1].split("\n\n", 2)[1]
    folder = runs / "e2e" / "tables" / "method-guided_backprop+weight_statistics"
    per_model = pd.read_csv(folder / "detection-per-model-l2.csv")
    rows = per_model[per_model["method"] == "weight_statistics"].set_index("model")
    suite = load_suite(suite_path)
    stored = load_inspections(suite, ["weight_statistics"], runs)
    vectors = {s.name: stored[("weight_statistics", s.name)].inspection.statistic for s in suite.models}
    references = [s.name for s in suite.references]
    spread = np.mean([np.linalg.norm(vectors[a] - vectors[b])
                      for i, a in enumerate(references) for b in references[i + 1:]])
    for model in ("backdoor", "smoothing"):
        expected = np.mean([np.linalg.norm(vectors[model] - vectors[r]) for r in references]) / spread
        assert rows.loc[model, "abar"] == pytest.approx(expected, rel=1e-12)
    assert (folder / "inspect-time.csv").exists()
    # the suite's own tables are not replaced by a run with a detector
    assert "weight_statistics" not in (runs / "e2e" / "tables" / "detection-l2.csv").read_text()
    # a model-level detector has one "image", the model: no image to pair with the control's
    versus = pd.read_csv(folder / "detection-vs-outputs-l2.csv", keep_default_na=False)
    assert versus[versus["method"] == "weight_statistics"].drop(columns="method").isin(
        ["n/a"]).all(axis=None)
    scores = pd.read_csv(folder / "detection-per-model-l2.csv")
    assert set(scores[scores["method"] == "weight_statistics"]["n_images"]) == {1}
    assert MODEL_SET == "model"


# ---------------------------------------------------------------- bad input, before any work
def test_an_unknown_detector_lists_the_valid_names_before_any_work(tmp_path):
    suite = write_suite(tmp_path / "tiny.toml")
    runs = tmp_path / "runs"
    with pytest.raises(UnknownNameError, match=r"weight_statistic.*weight_statistics"):
        detect.main(detect.get_args_parser().parse_args(["--suite", str(suite), "--runs-dir", str(runs),
                                            "--detector", "weight_statistic", "--no-progress"]))
    assert not (runs / "store").exists()  # nothing trained


@pytest.mark.parametrize("name", [n for n in NAMES if DETECTORS.get(n).needs_training_data])
def test_a_training_data_detector_on_an_imported_checkpoint_is_refused_before_any_work(name, tmp_path):
    weights = tmp_path / "imported.pth"
    torch.save(build_model("small_resnet", 10, (0.5,) * 3, (0.25,) * 3).backbone.state_dict(), weights)
    suite_path = write_suite(tmp_path / "imported.toml", body=f"""
[[anomalies]]
name = "imported"
family = "randomized_smoothing"
checkpoint = "{weights}"
""")
    runs = tmp_path / "runs"
    with pytest.raises(DetectorRefused) as error:
        detect.main(detect.get_args_parser().parse_args(["--suite", str(suite_path), "--runs-dir", str(runs),
                                            "--detector", name, "--no-progress"]))
    message = str(error.value)
    assert f"detector {name!r} needs the model's training data" in message
    assert "'imported'" in message and str(weights) in message and "--detector" in message
    assert "weight_statistics" in message  # what can run instead
    assert not (runs / "store").exists()
    # a detector that needs no training data runs on the same suite
    suite = load_suite(suite_path)
    assert [d.name for d in check_detectors(suite, ["weight_statistics"])] == ["weight_statistics"]


def test_the_detector_store_is_inside_the_runs_folder(run_copy):
    suite_path, runs = run_copy
    suite = load_suite(suite_path)
    spec = suite.model("backdoor")
    key = inspection_key(suite, build_detector("weight_statistics"), spec, {"detection": "x"})
    assert Path(inspection_dir(runs, key)).resolve().is_relative_to(Path(runs).resolve())
