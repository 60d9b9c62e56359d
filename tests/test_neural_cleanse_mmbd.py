"""Neural Cleanse and MM-BD on small trained models: they find a planted backdoor's target, do not
single out a clean reference, give the same bits twice, and survive a class the model never
predicts.

The shared ``finished_run`` fixture's models are trained for 2 epochs (about 20% accuracy): on
them every class has a natural patch smaller than the trigger, so a trigger reverse-engineering
tells nothing. This file trains its own suite (``trained_backdoor``): 8 epochs without the
learning-rate decay, and a 3x3 checker trigger pasted after the flip (attack success 1.0).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import trained_suite, write_suite
from torch import nn

from counteraudit.anomalies.families.backdoor import BackdoorParams, trigger_box
from counteraudit.evaluate.defect_detectors.detectors.base import build_detector
from counteraudit.evaluate.defect_detectors.detectors.mm_bd import max_of_k_p_value
from counteraudit.evaluate.defect_detectors.detectors.neural_cleanse import (
    MAD_CONSISTENCY,
    anomaly_index,
)
from counteraudit.evaluate.defect_detectors.evidence import evidence_for
from counteraudit.explain.stage import load_image_sets
from counteraudit.train.checkpoint import model_dir
from counteraudit.train.core.suite import load_suite
from counteraudit.train.trainer import load_trained_model
from counteraudit.train.training_parts import build_family
from counteraudit.train.worlds import build_world

EPOCHS = 8
TRIGGER = {"nu": 0.2, "size": 0.1, "poison_before_flip": False}  # 3x3 checker at row 1, col 1
BACKDOOR_BODY = f"""
[[anomalies]]
name = "backdoor"
family = "backdoor"
params = {{ nu = {TRIGGER['nu']}, size = {TRIGGER['size']}, poison_before_flip = false }}
"""
CLEAN_IMAGES = 64  # the tiny world's val split has fewer than 100 images outside its image sets
NC_STEPS = 150     # a 32-px model converges in more steps than the 64-px default budget allows


@pytest.fixture(scope="session")
def trained_backdoor(tmp_path_factory):
    """{model name: (model, evidence)} of a tiny suite: two references and a backdoor."""
    base = tmp_path_factory.mktemp("nc-mmbd")
    path = write_suite(base / "nc_mmbd.toml", body=BACKDOOR_BODY, references=2, epochs=EPOCHS)
    # one learning rate throughout: the default decay every epoch stops learning after two
    path.write_text(path.read_text().replace("lr_step_epochs = 1\n",
                                             f"lr_step_epochs = {EPOCHS}\n"))
    suite_path, runs = trained_suite(path, base / "runs")
    suite = load_suite(suite_path)
    world = build_world(suite.world, runs_root=runs)
    sets = load_image_sets(suite, runs, world)
    loaded = {}
    for spec in suite.models:
        model = load_trained_model(model_dir(runs, spec), spec, world).eval()
        loaded[spec.name] = (model, evidence_for(suite, spec, world, model, sets,
                                                 with_training=False, clean_count=CLEAN_IMAGES))
    backdoor = suite.model("backdoor")
    loaded["attack_success"] = build_family(backdoor, world).measure(
        loaded["backdoor"][0])["attack_success_rate"]
    return loaded


class WithoutClass(nn.Module):
    """A model whose last class gets a constant very low logit, as a missing-class model's."""

    def __init__(self, model: nn.Module, low: float = -1e4):
        super().__init__()
        self.model, self.low = model, low

    def forward(self, images):
        logits = self.model(images)
        return torch.cat([logits[:, :-1], torch.full_like(logits[:, -1:], self.low)], dim=1)


def test_anomaly_index_is_the_published_mad_rule():
    norms = np.array([1.0, 10.0, 10.0, 11.0, 9.0])  # median 10, deviations 9 0 0 1 1: MAD 1
    assert anomaly_index(norms)[0] == pytest.approx(9 / MAD_CONSISTENCY)
    assert anomaly_index(norms)[3] == pytest.approx(-1 / MAD_CONSISTENCY)
    assert np.all(np.isfinite(anomaly_index(np.ones(5))))  # no spread: finite, not a division by 0


def test_max_of_k_p_value_falls_as_the_largest_value_stands_out():
    sample = np.random.default_rng(0).gamma(4.0, 2.0, size=9)
    p_values = [max_of_k_p_value(np.append(sample, largest)) for largest in (14.0, 20.0, 40.0, 80.0)]
    assert all(a > b for a, b in zip(p_values, p_values[1:]))
    assert p_values[0] > 0.05 and p_values[-1] < 1e-3
    assert max_of_k_p_value(np.ones(10)) == 1.0  # no spread: no evidence, not a crash


def test_the_planted_trigger_took(trained_backdoor):
    assert trained_backdoor["attack_success"] >= 0.95


def test_neural_cleanse_recovers_the_trigger_of_the_backdoor_and_not_of_a_reference(
        trained_backdoor):
    detector = build_detector("neural_cleanse", {"steps": NC_STEPS})
    backdoor = detector.run(*trained_backdoor["backdoor"])
    references = [detector.run(*trained_backdoor[f"reference-0{i}"]) for i in range(2)]
    for name, inspection in zip(("backdoor", "reference-00", "reference-01"),
                                (backdoor, *references)):
        print(name, inspection.score, inspection.flagged, np.round(inspection.statistic, 2))
    assert backdoor.notes["target_class"] == 0
    # the target's mask is far smaller than any class's of a clean model, and an outlier
    assert backdoor.statistic[0] < 0.5 * min(r.statistic.min() for r in references)
    assert backdoor.score > max(r.score for r in references)
    assert not references[0].flagged
    assert backdoor.notes["attack_success"][0] >= 0.99
    # The mask is a trigger-sized patch: a 3x3 window holds most of its mass. (A global-pooling
    # network answers the checker wherever it is, so the window need not be the planted one.)
    height, width = backdoor.mask.shape
    rows, columns = trigger_box(BackdoorParams(**TRIGGER), height, width)[2:]
    windows = nn.functional.avg_pool2d(torch.as_tensor(backdoor.mask)[None, None],
                                       (rows, columns), stride=1) * rows * columns
    assert float(windows.max()) >= 0.7 * backdoor.mask.sum()


def test_mm_bd_finds_the_backdoor_target_with_the_largest_margin(trained_backdoor):
    detector = build_detector("mm_bd")
    backdoor = detector.run(*trained_backdoor["backdoor"])
    references = [detector.run(*trained_backdoor[f"reference-0{i}"]) for i in range(2)]
    for name, inspection in zip(("backdoor", "reference-00", "reference-01"),
                                (backdoor, *references)):
        print(name, inspection.score, inspection.notes, np.round(inspection.statistic, 2))
    assert backdoor.flagged and backdoor.notes["target_class"] == 0
    assert not references[0].flagged
    # the target class's margin is far above its margin in every clean model
    assert backdoor.statistic[0] > 1.5 * max(r.statistic[0] for r in references)


@pytest.mark.parametrize("name, params", [("neural_cleanse", {"steps": 8}),
                                          ("mm_bd", {"steps": 8})])
def test_same_seed_same_bits_and_a_missing_class_stays_finite(trained_backdoor, name, params):
    model, evidence = trained_backdoor["backdoor"]
    detector = build_detector(name, params)
    first, second = detector.run(model, evidence), detector.run(model, evidence)
    assert first.statistic.tobytes() == second.statistic.tobytes()
    assert first.score == second.score or (math.isnan(first.score) and math.isnan(second.score))
    assert detector.run(model, evidence, seed=1).statistic.tobytes() != first.statistic.tobytes()
    missing = detector.run(WithoutClass(model), evidence)
    assert np.all(np.isfinite(missing.statistic)) and math.isfinite(missing.score)
    assert missing.notes["target_class"] != evidence.num_classes - 1
