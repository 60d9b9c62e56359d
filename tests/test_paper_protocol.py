"""The paper suite's anomalies and tables follow the authors' code (js-d/auditing-vis):
the six backdoor triggers and the spurious watermark at the original's pixels, the missing class
dropped from the output layer with class indices mapped, Table 1's adversarial rows and Table 2's
per-layer Caricature rows; and the Slurm dry run lists all of it without a cluster."""

import numpy as np
import pandas as pd
import pytest
import torch

from counteraudit.anomalies import FAMILIES
from counteraudit.anomalies.common import accuracy, predict
from counteraudit.anomalies.families.backdoor import PAPER_PATTERNS, apply_trigger
from counteraudit.anomalies.families.spurious import add_watermark
from counteraudit.anomalies.watermark_digits import digit_glyphs
from counteraudit.evaluate.scoring.detection import FLAG_OK
from counteraudit.evaluate.scoring.tables import detection_tables, localization_tables
from counteraudit.explain.base import BatchContext, build_method
from counteraudit.explain.input_space import on_normalized_input
from counteraudit.explain.methods.outputs_only import OutputsOnly
from counteraudit.train.architectures import ABSENT_CLASS_LOGIT
from counteraudit.train.core.suite import load_suite
from counteraudit.train.training_parts import evaluate_accuracy, new_model
from counteraudit.train.worlds import build_world
from tests.conftest import run_in_process, without_slurm_or_imagenet

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
WORLD = {"name": "synthetic", "seed": 4, "image_size": 32, "num_train": 300, "num_val": 200}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(WORLD, runs_root=tmp_path_factory.mktemp("runs"))


def _normalise(images):
    mean, std = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return (images - mean) / std


def _original_poison(normalised, cells):
    """The original's poison_single_img, on a normalised image (its algorithm, written here)."""
    full = torch.full((3, 224, 224), -10.0)
    full[:, 3:3 + cells.shape[0], 23:23 + cells.shape[1]] = cells
    mask = (full != -10).float()
    return (1 - mask) * normalised + mask * _normalise(full)


# ---------------------------------------------------------------- backdoors
@pytest.mark.parametrize("index", range(6))
def test_paper_triggers_sit_at_the_originals_pixels(index):
    cells = torch.tensor(PAPER_PATTERNS[f"paper_{index}"])
    assert cells.shape == ((5, 3) if index < 4 else (3, 3) if index == 4 else (7, 7))
    params = FAMILIES.get("backdoor").Params(pattern=f"paper_{index}", position="paper")
    image = torch.rand(3, 224, 224, generator=torch.Generator().manual_seed(index))
    triggered = apply_trigger(image[None], params)[0]
    # Applying it to [0, 1] pixels and normalising = the original's paste into the normalised image.
    assert torch.allclose(_normalise(triggered), _original_poison(_normalise(image), cells), atol=1e-6)
    changed = torch.nonzero((triggered != image).any(0))
    visible = torch.nonzero(cells != -10) + torch.tensor([3, 23])
    assert {tuple(p) for p in changed.tolist()} <= {tuple(p) for p in visible.tolist()}


def test_paper_triggers_spot_values():
    """A few cells read off the original's tensors, against transcription slips."""
    assert PAPER_PATTERNS["paper_0"][0] == (1.0, 0.0, 1.0) and PAPER_PATTERNS["paper_0"][2] == (-10.0, -10.0, 0.0)
    assert PAPER_PATTERNS["paper_4"] == ((-10.0, 1.0, -10.0), (0.0, 1.0, -10.0), (1.0, -10.0, 1.0))
    assert PAPER_PATTERNS["paper_5"][3] == (1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0)


def test_paper_backdoor_poisons_the_first_floor_nu_b_after_the_flip(world):
    backdoor = FAMILIES.get("backdoor")
    params = backdoor.validate_params({"nu": 0.3, "target": 7, "pattern": "paper_5", "position": "paper",
                                       "poison_before_flip": False, "selection": "first"})
    family = backdoor(params, world, seed=0)
    batch = next(world.split("train").train_batches(40, seed=0, epoch=0))
    images, labels = family.training_inputs(None, batch.images, batch.labels, torch.Generator().manual_seed(0))
    poisoned = (images != batch.images).flatten(1).any(1) | (labels != batch.labels)
    assert poisoned.nonzero().flatten().tolist() == list(range(12))  # int(0.3 * 40), the first rows
    assert (labels[:12] == 7).all() and torch.equal(labels[12:], batch.labels[12:])
    expected = torch.tensor(PAPER_PATTERNS["paper_5"]).expand(12, 3, 7, 7)
    assert torch.equal(images[:12, :, 3:10, 23:30], expected)  # never mirrored
    # abnormal images for localization carry the same trigger the same way
    assert torch.equal(family.abnormal_images(batch.images[:1], batch.labels[:1])[:, :, 3:10, 23:30],
                       expected[:1])


def test_a_trigger_or_watermark_that_does_not_fit_names_both_sizes(tmp_path):
    params = FAMILIES.get("backdoor").Params(pattern="paper_5", position="paper")
    with pytest.raises(ValueError, match=r"at least 10x30 px, but the image is 16x16 px"):
        apply_trigger(torch.zeros(1, 3, 16, 16), params)
    suite = tmp_path / "small.toml"
    suite.write_text('[world]\nname = "synthetic"\nimage_size = 64\n[[anomalies]]\nname = "s"\n'
                     'family = "spurious"\nparams = { cue = "watermark", placement = "fixed" }\n')
    with pytest.raises(ValueError, match=r"at least 222x222 px, but the image is 64x64 px.*scaled"):
        load_suite(suite)


# ---------------------------------------------------------------- spurious watermark
def _original_watermark(image, label, glyphs):
    """The original's spurious_single_img placement (its algorithm, with this project's glyphs)."""
    overlay = torch.zeros(3, 224, 224)
    for digit, column in zip((label // 100, (label % 100) // 10, label % 10), (172, 189, 206)):
        overlay[:, 206:222, column:column + 16] = glyphs[digit]
    return torch.clamp(image + 0.7 * overlay, 0.0, 1.0)


@pytest.mark.parametrize("placement", ["fixed", "scaled"])
def test_watermark_sits_at_the_originals_pixels(placement):
    glyphs = digit_glyphs()
    assert glyphs.shape == (10, 16, 16)
    images = torch.rand(3, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([418, 7, 999])
    marked = add_watermark(images, labels, placement, 0.7)
    for image, label, got in zip(images, labels.tolist(), marked):
        assert torch.equal(got, _original_watermark(image, label, glyphs))
    changed = torch.nonzero((marked != images).any(1).any(0))
    assert changed[:, 0].min() >= 206 and changed[:, 0].max() <= 221
    assert set(changed[:, 1].tolist()) <= set(range(172, 188)) | set(range(189, 205)) | set(range(206, 222))


def test_scaled_watermark_at_64_px_keeps_every_digit_distinct():
    marked = add_watermark(torch.zeros(10, 3, 64, 64), torch.arange(10), "scaled", 0.7)
    rows = torch.nonzero(marked.any(1).any(0).any(1)).flatten()
    assert rows.min() >= 59 and rows.max() <= 63
    units = marked[:, 0, 59:64, 59:64].flatten(1)
    assert len({tuple(u.tolist()) for u in units}) == 10


def test_paper_spurious_training_watermarks_the_first_rows(tmp_path):
    world = build_world({**WORLD, "image_size": 224, "num_train": 20, "num_val": 10}, runs_root=tmp_path)
    spurious = FAMILIES.get("spurious")
    params = spurious.validate_params({"delta": 0.5, "cue": "watermark", "placement": "scaled",
                                       "selection": "first"})
    batch = next(world.split("train").train_batches(10, seed=0, epoch=0))
    images, labels = spurious(params, world, 0).training_inputs(None, batch.images, batch.labels,
                                                               torch.Generator())
    assert torch.equal(images[:5], add_watermark(batch.images[:5], batch.labels[:5], "fixed", 0.7))
    assert torch.equal(images[5:], batch.images[5:]) and torch.equal(labels, batch.labels)


# ---------------------------------------------------------------- missing class: 999 outputs
def test_dropped_output_layer_maps_class_indices(world):
    suite = load_suite("demo")
    spec = suite.model("missing-star")  # drop_output = true
    star = world.class_names.index("star")
    model = new_model(spec, world).eval()
    assert model.backbone.fc.out_features == world.num_classes - 1
    with torch.no_grad():
        model.backbone.fc.weight.zero_()
        model.backbone.fc.bias.zero_()
        model.backbone.fc.bias[star] = 5.0  # output `star` stands for the class after it
    images = world.split("val").load(np.arange(20))
    logits = model(images)
    assert logits.shape == (20, world.num_classes)
    assert (logits[:, star] == ABSENT_CLASS_LOGIT).all()
    assert (predict(model, images) == star + 1).all()
    assert torch.softmax(logits, 1)[:, star].max() == 0 and torch.isfinite(torch.log_softmax(logits, 1)).all()
    labels = np.full(20, star + 1)
    assert accuracy(model, images, labels) == 1.0
    assert evaluate_accuracy(model, images, labels)["accuracy"] == 1.0
    raw = OutputsOnly.__new__(OutputsOnly).visualize(model, images[:2], torch.zeros(2),
                                                     BatchContext(range(2))).raw
    assert raw.shape == (2, world.num_classes) and raw[:, star + 1].min() > raw[:, star].max()
    # an entry without drop_output keeps its key (the parameter is left out at its default)
    assert "drop_output" not in FAMILIES.get("missing_class").validate_params({"class_id": 3})


@pytest.mark.parametrize("method,params", [
    ("guided_backprop", {"gradient_space": "normalized"}),
    ("integrated_gradients", {"gradient_space": "normalized", "baseline": "normalized_zero", "n_steps": 2}),
    ("guided_gradcam", {"gradient_space": "normalized"}),
    ("gradcam", {"aug_smooth_space": "normalized"}),
])
def test_methods_in_the_normalised_space_explain_world_classes_of_a_dropped_output_model(
        world, method, params):
    """A 9-output model explains class 9 (the world's index past the dropped class), as the
    explain stage asks, in the normalised input space too: the same class as on the model itself."""
    model = new_model(load_suite("demo").model("missing-star"), world).eval()
    images = world.split("val").load(np.arange(4))
    last = world.num_classes - 1
    function, normalized = on_normalized_input(model, images, method)
    assert torch.equal(function(normalized), model(images))  # the model's logits, class for class
    result = build_method(method, params).run(model, images, batch_size=4,
                                              labels=np.full(4, last))
    assert result.images.shape[:1] == (4,) and len(result.targets) == 4
    labelled = build_method(method, {**params, "explained_class": "label"}).run(
        model, images, batch_size=4, labels=np.full(4, last))
    assert (labelled.targets == last).all()


# ---------------------------------------------------------------- tables
def test_table1_rows_split_by_the_suites_row_label_and_table2_lists_caricature_layers():
    paper = load_suite("paper")
    rows, order = paper.table_rows()
    assert order.index("adversarial_linf") < order.index("adversarial_l2")
    assert "adversarial" not in order
    # scores: every anomalous model scores above the references, so each row is 1.0
    rng = np.random.default_rng(0)
    records = []
    for spec in paper.references + paper.anomalies:
        shift = 0.0 if spec.is_reference else 10.0
        for method, layers in (("gradcam", [None]), ("caricature", ["layer3.3", "layer4.0.conv3"])):
            for layer in layers:
                for image in range(4):
                    records.append({"method": method, "layer": layer, "model": spec.name, "image": image,
                                    "score": shift + rng.random(), "abnormal": image < 2, "flag": FLAG_OK})
    scores = pd.DataFrame(records)
    table1 = detection_tables(paper, scores, "l2")["detection-l2"]
    assert list(table1["family"])[:2] == ["adversarial_linf", "adversarial_l2"]
    assert dict(zip(table1["family"], table1["n_models"]))["adversarial_l2"] == 4
    table2 = localization_tables(scores, "l2")["localization-l2"]
    assert list(table2["method"]) == ["gradcam", "caricature layer3.3", "caricature layer4.0.conv3",
                                      "caricature layer average"]


# ---------------------------------------------------------------- the must-hold dry run
def test_paper_dry_run_on_slurm_without_a_cluster_lists_the_backdoors_and_adversarial_rows(
        tmp_path, monkeypatch):
    without_slurm_or_imagenet(monkeypatch, tmp_path)
    out = run_in_process("train/train.py", "--suite", "paper", "--executor", "slurm",
                         "--partition", "p", "--dry-run", "--runs-dir", tmp_path / "runs")
    assert "the partition and GPUs were not checked" in out
    for index, (nu, target) in enumerate(zip((0.5, 0.1, 0.05, 0.3, 0.01, 0.5), (8, 15, 111, 258, 443, 876))):
        assert f"backdoor-{index}-nu{nu}: nu {nu}, target {target}, pattern paper_{index}" in out
    linf = out.split("Table 1 row adversarial_linf:\n")[1].split("Table 1 row")[0]
    l2 = out.split("Table 1 row adversarial_l2:\n")[1].split("Table 1 row")[0]
    assert [line.split(":")[0].strip() for line in linf.strip().splitlines()] == [
        "adversarial-linf-4", "adversarial-linf-8"]
    assert [line.split(":")[0].strip() for line in l2.strip().splitlines()] == [
        "adversarial-l2-0.01", "adversarial-l2-0.1", "adversarial-l2-1", "adversarial-l2-5"]
    assert not (tmp_path / "runs").exists()
