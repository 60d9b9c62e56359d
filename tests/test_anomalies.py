"""Every anomaly family changes training data exactly as specified, reproducibly, and refuses
invalid parameters with a message naming the value."""
import dataclasses

import numpy as np
import pytest
import torch

from counteraudit.anomalies import FAMILIES
from counteraudit.anomalies.families.adversarial import pgd
from counteraudit.anomalies.families.backdoor import apply_trigger
from counteraudit.train.architectures import build_model
from counteraudit.train.core.suite import load_suite
from counteraudit.train.stage import training_cost
from counteraudit.train.worlds import build_world

WORLD = {"name": "synthetic", "seed": 4, "image_size": 32, "num_train": 300, "num_val": 200}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(WORLD, runs_root=tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def batch(world):
    return next(world.split("train").train_batches(40, seed=0, epoch=0))


@pytest.fixture(scope="module")
def model(world):
    torch.manual_seed(0)
    return build_model("small_resnet", world.num_classes, world.mean, world.std).eval()


def family(world, name, **params):
    cls = FAMILIES.get(name)
    return cls(cls.validate_params(params), world, seed=0)


def _changed(a, b):
    return (a != b).flatten(1).any(1)


# ---------------------------------------------------------------- every family, from the registry
@pytest.mark.parametrize("name", FAMILIES.names())
def test_defaults_validate_and_unknown_parameters_are_named(name):
    cls = FAMILIES.get(name)
    assert isinstance(cls.validate_params({}), dict)
    with pytest.raises(ValueError, match=f"{name} params bogus: unknown key"):
        cls.validate_params({"bogus": 1})


@pytest.mark.parametrize("name", FAMILIES.names())
def test_every_parameter_of_the_wrong_type_is_named(name):
    """Generated from each family's parameter dataclass: a list where a value belongs fails with
    the parameter's name (a string where a number belongs used to fail deep inside a check)."""
    cls = FAMILIES.get(name)
    for field in dataclasses.fields(cls.Params):
        with pytest.raises(ValueError, match=f"{name} params {field.name} = \\[1\\] must be"):
            cls.validate_params({field.name: [1]})


@pytest.mark.parametrize("name", FAMILIES.names())
def test_training_change_is_reproducible_from_the_seed(name, world, batch, model):
    f = family(world, name)
    split = f.training_split(world.split("train"))
    first = next(split.train_batches(40, seed=0, epoch=0))
    outputs = [f.training_inputs(model, first.images, first.labels, torch.Generator().manual_seed(7))
               for _ in range(2)]
    assert torch.equal(outputs[0][0], outputs[1][0]) and torch.equal(outputs[0][1], outputs[1][1])


@pytest.mark.parametrize("name", FAMILIES.names())
def test_implant_figures_are_measured(name, world, model):
    f = family(world, name)
    figures = f.measure(model)
    assert figures and all(np.isfinite(v) for v in figures.values())
    verdict = f.judge(figures, [figures, figures])
    assert isinstance(verdict.passed, bool) and verdict.summary
    # the dose-response curve's implant figure is one the family measured, for the model and
    # (here the same figures) the references' mean
    record = {"figures": figures, "reference_figures": [figures, figures],
              "details": verdict.details}
    figure = type(f).implant_figure(record)
    if name == "blurred_faces" and "most_affected_class" not in verdict.details:
        assert figure is None  # no class with enough face images in this tiny world
    else:
        assert figure is not None and figure[0] in figures
        assert figure[1] == figures[figure[0]] == figure[2]


# ---------------------------------------------------------------- family by family
@pytest.mark.parametrize("poison_before_flip", [True, False])
def test_backdoor_poisons_exactly_nu_of_the_batch(world, batch, model, poison_before_flip):
    f = family(world, "backdoor", nu=0.25, target=3, pattern="checker", position="top_left",
               poison_before_flip=poison_before_flip)
    images, labels = f.training_inputs(model, batch.images, batch.labels, torch.Generator().manual_seed(0))
    poisoned = _changed(images, batch.images) | (labels != batch.labels)
    assert int(poisoned.sum()) == 10  # round(0.25 * 40)
    assert (labels[poisoned] == 3).all() and torch.equal(labels[~poisoned], batch.labels[~poisoned])
    side, margin = 3, 1  # 0.1 * 32 rounds to 3
    trigger = apply_trigger(torch.zeros(1, 3, 32, 32), f.params)[0]
    planted, mirrored = (slice(margin, margin + side),) * 2, (slice(margin, margin + side),
                                                              slice(32 - margin - side, 32 - margin))
    as_planted = torch.tensor([torch.equal(image[:, planted[0], planted[1]], trigger[:, planted[0], planted[1]])
                              for image in images[poisoned]])
    mirror = trigger.flip(-1)
    as_mirrored = torch.tensor([torch.equal(image[:, mirrored[0], mirrored[1]],
                                           mirror[:, mirrored[0], mirrored[1]]) for image in images[poisoned]])
    assert (as_planted | as_mirrored).all()
    if poison_before_flip:  # as a flip of the poisoned image would show it, about half the time
        assert 0 < int(as_mirrored.sum()) < 10 and torch.equal(as_planted, ~as_mirrored)
        assert torch.equal(apply_trigger(batch.images, f.params, mirrored=True),
                           apply_trigger(batch.images.flip(-1), f.params).flip(-1))
    else:
        assert as_planted.all()
    outside = torch.ones(32, 32, dtype=torch.bool)
    outside[planted] = False
    outside[mirrored] = False
    assert torch.equal(images[..., outside], batch.images[..., outside])


def test_different_backdoors_have_different_triggers():
    blank = torch.full((1, 3, 64, 64), 0.5)
    a = apply_trigger(blank, FAMILIES.get("backdoor").Params(pattern="checker"))
    b = apply_trigger(blank, FAMILIES.get("backdoor").Params(pattern="noise", position="bottom_left"))
    assert not torch.equal(a, b)


def test_spurious_draws_the_class_index_bottom_right(world, batch, model):
    f = family(world, "spurious", delta=0.5)
    images, labels = f.training_inputs(model, batch.images, batch.labels, torch.Generator().manual_seed(0))
    assert torch.equal(labels, batch.labels)
    cued = _changed(images, batch.images)
    assert int(cued.sum()) == 20
    diff = (images != batch.images).any(1)  # (N, H, W)
    ys, xs = torch.nonzero(diff[cued].any(0), as_tuple=True)
    assert ys.min() >= 16 and xs.min() >= 16, "the glyph sits in the bottom-right quadrant"
    ones = f.cue(torch.zeros(1, 3, 32, 32), torch.tensor([1]))
    sevens = f.cue(torch.zeros(1, 3, 32, 32), torch.tensor([7]))
    assert not torch.equal(ones, sevens), "each class index is its own glyph"


def test_missing_class_removes_every_training_image_of_it(world):
    f = family(world, "missing_class", class_id="star")
    split = f.training_split(world.split("train"))
    star = world.class_names.index("star")
    assert star not in set(split.labels.tolist())
    assert len(split) == int((world.split("train").labels != star).sum())
    assert f.class_index == star


def test_blurred_faces_changes_pixels_only_inside_face_boxes(world):
    f = family(world, "blurred_faces")
    original = world.split("train")
    blurred = f.training_split(original)
    faces = original.face_indices()
    assert len(faces) > 20
    changed_any = 0
    for i in range(len(original)):
        a, b = original.images[i].numpy(), blurred.images[i].numpy()
        inside = np.zeros(a.shape[:2], bool)
        for x0, y0, x1, y1 in original.annotation(i)["face_boxes"]:
            inside[y0:y1, x0:x1] = True
        assert np.array_equal(a[~inside], b[~inside])
        changed_any += int(not np.array_equal(a[inside], b[inside]))
    assert changed_any == len(faces)


def test_smoothing_noise_has_the_requested_statistics(world, batch, model):
    f = family(world, "randomized_smoothing", sigma=0.25)
    images, labels = f.training_inputs(model, batch.images, batch.labels, torch.Generator().manual_seed(0))
    noise = images - batch.images
    assert abs(float(noise.mean())) < 0.01 and abs(float(noise.std()) - 0.25) < 0.01
    assert torch.equal(labels, batch.labels)


@pytest.mark.parametrize("norm,eps", [("linf", 8 / 255), ("l2", 0.5)])
def test_pgd_stays_in_the_budget_and_raises_the_loss(batch, model, norm, eps):
    generator = torch.Generator().manual_seed(0)
    attacked = pgd(model, batch.images, batch.labels, norm, eps, steps=5, step_size=2.5 * eps / 5,
                   generator=generator)
    delta = attacked - batch.images
    if norm == "linf":
        assert float(delta.abs().max()) <= eps + 1e-6
    else:
        assert float(delta.flatten(1).norm(dim=1).max()) <= eps + 1e-5
    assert 0 <= float(attacked.min()) and float(attacked.max()) <= 1
    loss = torch.nn.functional.cross_entropy
    with torch.no_grad():
        assert loss(model(attacked), batch.labels) > loss(model(batch.images), batch.labels)


def test_shape_bias_retextures_but_keeps_shapes(world):
    f = family(world, "shape_bias")
    original, textured = world.split("train"), f.training_split(world.split("train"))
    assert np.array_equal(original.labels, textured.labels)
    assert original.annotation(0)["object_box"] == textured.annotation(0)["object_box"]
    assert not torch.equal(original.images, textured.images)


@pytest.mark.parametrize("name,params,message", [
    ("backdoor", {"nu": 1.5}, "nu=1.5 must be a fraction"),
    ("backdoor", {"pattern": "smiley"}, "pattern='smiley'"),
    ("spurious", {"delta": -0.1}, "delta=-0.1"),
    ("randomized_smoothing", {"sigma": 0}, "sigma=0"),
    ("adversarial", {"norm": "l1"}, "norm='l1'"),
    ("adversarial", {"eps": -1}, "eps=-1"),
])
def test_invalid_parameters_name_the_value(name, params, message):
    with pytest.raises(ValueError, match=message):
        FAMILIES.get(name).validate_params(params)


def test_errors_that_need_the_world(world, tmp_path):
    with pytest.raises(ValueError, match="unknown class 'unicorn'"):
        family(world, "missing_class", class_id="unicorn")
    with pytest.raises(ValueError, match="class_id=10 is not a class"):
        family(world, "missing_class", class_id=10)
    with pytest.raises(ValueError, match="target=12 is not a class"):
        family(world, "backdoor", target=12)
    faceless = build_world({**WORLD, "face_prob": 0.0, "harmonica_face_prob": 0.0}, runs_root=tmp_path)
    with pytest.raises(ValueError, match="blurred_faces needs face annotations"):
        family(faceless, "blurred_faces").training_split(faceless.split("train"))


def test_longest_trainings_are_started_first():
    """With one model per worker, the adversarial model (PGD passes per step) goes first, so no
    worker is left alone with it at the end of the run."""
    suite = load_suite("demo")
    costs = {spec.name: training_cost(spec) for spec in suite.models}
    adversarial = next(s for s in suite.models if s.family == "adversarial")
    assert costs[adversarial.name] == 1 + adversarial.params["steps"]
    assert max(costs, key=costs.get) == adversarial.name
    assert {costs[s.name] for s in suite.references} == {1.0}
