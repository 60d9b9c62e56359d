"""The sanity-check families of Adebayo et al. (2018): permuted labels shuffle the training labels
(a permutation, seeded), and cascading randomisation re-initialises exactly the top layer groups
of a trained reference (seeded), made once from the stored reference by the trainer; bad
parameters are one error when the suite loads."""
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from counteraudit.anomalies import FAMILIES
from counteraudit.anomalies.families.cascading_randomization import layer_groups, randomize_top
from counteraudit.anomalies.families.permuted_labels import permuted_labels
from counteraudit.anomalies.sanity_checks import near_chance_verdict
from counteraudit.train.architectures import build_model
from counteraudit.train.checkpoint import WEIGHTS_NAME, model_dir, read_metrics
from counteraudit.train.core.suite import load_suite
from counteraudit.train.trainer import derived_reference, train_model
from counteraudit.train.worlds import build_world
from tests.conftest import write_suite

WORLD = {"name": "synthetic", "seed": 5, "image_size": 32, "num_train": 128, "num_val": 64}
SANITY_ENTRIES = """
[[anomalies]]
name = "random-top1"
family = "cascading_randomization"
params = { depth = 1 }
[[anomalies]]
name = "random-top2"
family = "cascading_randomization"
params = { depth = 2, reference_seed = 1 }
[[anomalies]]
name = "shuffled"
family = "permuted_labels"
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(WORLD, runs_root=tmp_path_factory.mktemp("runs"))


def _state(model):
    return {k: v.clone() for k, v in model.backbone.state_dict().items()}


def _changed_groups(before, after, model):
    """The layer groups (by name) with any parameter or buffer that differs."""
    prefixes = {}
    for name, modules in layer_groups(model.backbone):
        for module in modules:
            own = {id(t) for t in [*module.parameters(), *module.buffers()]}
            for key, tensor in model.backbone.state_dict(keep_vars=True).items():
                if id(tensor) in own:
                    prefixes[key] = name
    return {prefixes[k] for k in before if not torch.equal(before[k], after[k])}


def test_permuted_labels_are_a_seeded_permutation_carried_by_the_batches(world):
    split = world.split("train")
    labels = split.labels
    shuffled = permuted_labels(labels, 1.0, seed=0)
    assert np.array_equal(np.bincount(shuffled), np.bincount(labels))  # the same class counts
    assert (shuffled != labels).mean() > 0.5  # labels carry (almost) nothing about their image
    assert np.array_equal(shuffled, permuted_labels(labels, 1.0, seed=0))
    assert not np.array_equal(shuffled, permuted_labels(labels, 1.0, seed=1))
    half = permuted_labels(labels, 0.5, seed=0)
    assert np.array_equal(np.bincount(half), np.bincount(labels)) and (half != labels).mean() <= 0.5
    family = FAMILIES.get("permuted_labels")({}, world, seed=0)
    relabeled = family.training_split(split)
    assert np.array_equal(relabeled.labels, shuffled)
    for batch, original in zip(relabeled.train_batches(32, seed=0, epoch=0),
                               split.train_batches(32, seed=0, epoch=0)):
        assert torch.equal(batch.images, original.images)  # the same images and augmentation
        assert torch.equal(batch.labels, torch.as_tensor(shuffled[batch.indices.numpy()]))


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_cascading_randomization_changes_exactly_the_top_groups_seeded(world, depth):
    torch.manual_seed(0)
    model = build_model("small_resnet", world.num_classes, world.mean, world.std)
    before = _state(model)
    changed = randomize_top(model.backbone, depth, seed=7)
    after = _state(model)
    assert changed == [name for name, _ in layer_groups(model.backbone)][:depth]
    assert changed[:2] == ["fc", "layer4.0"][:depth]
    assert _changed_groups(before, after, model) == set(changed)  # the rest bit-identical
    model.backbone.load_state_dict(before)
    randomize_top(model.backbone, depth, seed=7)
    assert all(torch.equal(after[k], v) for k, v in _state(model).items())  # same seed, same bits
    model.backbone.load_state_dict(before)
    randomize_top(model.backbone, depth, seed=8)
    assert not torch.equal(after["fc.weight"], _state(model)["fc.weight"])


def test_the_trainer_derives_the_randomized_model_from_the_stored_reference(tmp_path, runs):
    suite = load_suite(write_suite(tmp_path / "sanity.toml", SANITY_ENTRIES, references=2,
                                   epochs=1, world=WORLD))
    top1, top2 = suite.model("random-top1"), suite.model("random-top2")
    assert top1.params == {"depth": 1, "reference_seed": 0}
    assert top2.params == {"depth": 2, "reference_seed": 1}
    assert replace(top1, params={**top1.params, "depth": 2}).key != top1.key  # stored per depth
    world = build_world(suite.world, runs_root=runs)
    # derived first: its reference (suite.references[0], the same key) is trained on the way
    metrics = train_model(top1, model_dir(runs, top1), world=world, progress=False, runs_root=runs)
    reference = suite.references[0]
    assert derived_reference(top1, 0).key == reference.key
    assert metrics["source"] == "derived" and metrics["reference_key"] == reference.key
    assert read_metrics(model_dir(runs, reference))["family"] == "reference"
    derived = torch.load(model_dir(runs, top1) / WEIGHTS_NAME)
    original = torch.load(model_dir(runs, reference) / WEIGHTS_NAME)
    differ = {k.split(".")[0] for k in derived if not torch.equal(derived[k], original[k])}
    assert differ == {"fc"}


def test_the_implant_took_when_half_the_margin_over_chance_is_gone():
    """References at 0.9 on 10 classes (chance 0.1): took at accuracy <= 0.5; a half-shuffled
    training set is held to half of that loss (<= 0.7)."""
    references = [{"accuracy": 0.85}, {"accuracy": 0.95}]
    assert near_chance_verdict({"accuracy": 0.12}, references, 10).passed
    assert near_chance_verdict({"accuracy": 0.49}, references, 10).passed
    assert not near_chance_verdict({"accuracy": 0.55}, references, 10).passed
    assert near_chance_verdict({"accuracy": 0.69}, references, 10, share=0.5).passed
    assert not near_chance_verdict({"accuracy": 0.75}, references, 10, share=0.5).passed


@pytest.mark.parametrize("params,message", [
    ("{ depth = 0 }", "depth=0 must be >= 1"),
    ("{ depth = 10 }", "depth=10 is more than the 9 layer groups of small_resnet; give depth 1..9"),
    ("{ reference_seed = 4 }", r"reference_seed=4 is not the seed of one of this suite's "
                               r"references \(their seeds: 0, 1\)"),
])
def test_bad_cascading_parameters_are_one_error_at_suite_load(tmp_path, params, message):
    body = f'[[anomalies]]\nname = "bad"\nfamily = "cascading_randomization"\nparams = {params}\n'
    with pytest.raises(ValueError, match=message):
        load_suite(write_suite(Path(tmp_path) / "bad.toml", body, references=2))
