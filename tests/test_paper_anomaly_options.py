"""The paper suite's anomaly options: the spurious cue's training space, Yang et al.'s face blur,
a named abnormal class, a face-blurred training root, and published checkpoints' recipes and
output counts, each checked when the suite loads (tiny inputs, no training)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from counteraudit.anomalies.families.blurred_faces import BlurredFaces, blur_boxes, yang_blur
from counteraudit.anomalies.families.spurious import Spurious, add_watermark
from counteraudit.anomalies.watermark_digits import digit_overlay
from counteraudit.train.architectures import build_model
from counteraudit.train.core.suite import load_suite
from counteraudit.train.core.suite_files import toml_text
from counteraudit.train.core.suite_schema import SuiteFileError
from counteraudit.train.core.weights import clean_state_dict
from counteraudit.train.stage import _provenance_text
from counteraudit.train.worlds.synthetic_images import CLASS_NAMES

STD = (0.229, 0.224, 0.225)
SUITE = {"name": "options", "world": {"name": "synthetic", "image_size": 32, "num_train": 64,
                                      "num_val": 32},
         "recipe": {"epochs": 1, "batch_size": 16}, "references": {"count": 3},
         "evaluate": {"detection_images": 16, "localization_images": 8}}  # within the 32 images


def _suite(tmp_path, *entries):
    path = tmp_path / "options.toml"
    path.write_text(toml_text({**SUITE, "anomalies": list(entries)}))
    return load_suite(path)


def _spurious(**params):
    world = SimpleNamespace(image_size=64, num_classes=1000, std=STD)
    return Spurious({"cue": "watermark", "placement": "scaled", "delta": 1.0,
                     "selection": "first", **params}, world, seed=0)


def test_normalized_training_cue_is_std_scaled_and_unclamped():
    images = torch.full((2, 3, 64, 64), 0.9)
    labels = torch.tensor([123, 987])
    generator = torch.Generator().manual_seed(0)
    normalized, _ = _spurious(training_space="normalized").training_inputs(None, images, labels, generator)
    pixels, _ = _spurious().training_inputs(None, images, labels, generator)
    overlay = digit_overlay(labels, 64, 64, "scaled")
    expected = images + 0.7 * torch.tensor(STD).view(1, 3, 1, 1) * overlay
    assert torch.equal(normalized, expected)
    assert normalized.max() > 1.0                        # not clamped, as spurious_batch
    assert torch.equal(pixels, add_watermark(images, labels, "scaled", 0.7))
    assert pixels.max() == 1.0 and not torch.equal(pixels, normalized)
    # its evaluation images stay the pixel cue, clamped (spurious_single_img)
    model = _spurious(training_space="normalized")
    assert torch.equal(model.abnormal_images(images, labels), pixels)


def test_new_params_at_default_keep_the_canonical_dict():
    assert "training_space" not in Spurious.validate_params({"cue": "watermark"})
    assert Spurious.validate_params({"cue": "watermark", "training_space": "normalized"})[
        "training_space"] == "normalized"
    assert BlurredFaces.validate_params({}) == {"radius": 0.15}


def _noise_image(seed=0, side=64):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (side, side, 3), np.uint8))


def test_yang_blur_spares_far_pixels_and_fades_in():
    image, box = _noise_image(), (20, 20, 40, 40)
    yang = np.asarray(yang_blur(image, [box], 0.1)).astype(int)
    hard = np.asarray(blur_boxes(image, [box], 0.1)).astype(int)
    original = np.asarray(image).astype(int)
    assert np.array_equal(yang[:8], original[:8]) and np.array_equal(yang[:, 54:], original[:, 54:])
    assert np.abs(yang[28:32, 28:32] - original[28:32, 28:32]).mean() > 20  # the face is blurred
    # just outside the grown box (20 - 2 px margin): Yang's fades in, the plain blur stops at the box
    band = (slice(25, 35), slice(14, 18))
    assert np.array_equal(hard[band], original[band])
    assert 0 < np.abs(yang[band] - original[band]).mean() < np.abs(yang[28:32, 28:32]
                                                                   - original[28:32, 28:32]).mean()


def test_abnormal_class_restricts_the_pool():
    labels = np.array([0, 1, 1, 2, 1])
    faces = {0: [(1, 1, 5, 5)], 1: [(1, 1, 5, 5)], 2: [], 3: [(1, 1, 5, 5)], 4: [(2, 2, 6, 6)]}
    val = SimpleNamespace(labels=labels, annotation=lambda i: {"face_boxes": faces[i]})
    world = SimpleNamespace(name="synthetic", class_names=["a", "b", "c"])
    implant = {"details": {"most_affected_class": "c"}}
    assert BlurredFaces({}, world, 0).abnormal_pool(val, implant).tolist() == [3]
    named = BlurredFaces({"abnormal_class": "b"}, world, 0)
    assert named.abnormal_pool(val, implant).tolist() == [1, 4]
    assert named.planted_slice(implant) == {"class": "b", "face": "present"}


def test_bad_blur_options_fail_when_the_suite_loads(tmp_path):
    entry = {"name": "blur", "family": "blurred_faces"}
    with pytest.raises(SuiteFileError, match="blur='box'; valid: gaussian, yang2022"):
        _suite(tmp_path, {**entry, "params": {"blur": "box"}})
    with pytest.raises(SuiteFileError, match=f"abnormal_class='kazoo'.*valid: {', '.join(CLASS_NAMES)}"):
        _suite(tmp_path, {**entry, "params": {"abnormal_class": "kazoo"}})
    with pytest.raises(SuiteFileError, match="blurred_root is for the imagenet world"):
        _suite(tmp_path, {**entry, "params": {"blurred_root": "/data/blurred"}})
    suite = _suite(tmp_path, {**entry, "params": {"abnormal_class": "harmonica", "blur": "yang2022"}})
    assert suite.anomalies[0].params["abnormal_class"] == "harmonica"


def test_abnormal_class_never_changes_the_models_key(tmp_path):
    """Which val images are abnormal is chosen after training: the same weights, one key, so
    naming a class never trains the model again (a ResNet-50 on ImageNet, in `paper`)."""
    entry = {"name": "blur", "family": "blurred_faces", "seed": 5}
    plain = _suite(tmp_path, entry).anomalies[0]
    named = _suite(tmp_path, {**entry, "params": {"abnormal_class": "harmonica"}}).anomalies[0]
    yang = _suite(tmp_path, {**entry, "params": {"blur": "yang2022"}}).anomalies[0]
    assert named.params["abnormal_class"] == "harmonica"     # the family still gets it
    assert named.key == plain.key and "abnormal_class" not in named.to_dict()["params"]
    assert yang.key != plain.key                             # a blur is part of the weights


def _checkpoint(path, outputs):
    torch.save(build_model("small_resnet", outputs, (0.5,) * 3, (0.25,) * 3).backbone.state_dict(), path)
    return str(path)


def test_checkpoint_of_the_wrong_output_count_fails_when_the_suite_loads(tmp_path):
    seven = _checkpoint(tmp_path / "seven.pth", 7)
    with pytest.raises(SuiteFileError, match=rf"{seven} has 7 outputs .* model has 10; .*remove checkpoint"):
        _suite(tmp_path, {"name": "s", "family": "randomized_smoothing", "checkpoint": seven})
    ten = _checkpoint(tmp_path / "ten.pth", 10)
    with pytest.raises(SuiteFileError, match="has 10 outputs .* model has 9"):  # 999 of 1000
        _suite(tmp_path, {"name": "m", "family": "missing_class", "checkpoint": ten,
                          "params": {"class_id": 3, "drop_output": True}})


def test_checkpoint_recipe_checked_and_recorded(tmp_path):
    ten = _checkpoint(tmp_path / "ten.pth", 10)
    entry = {"name": "s", "family": "randomized_smoothing", "params": {"sigma": 0.25}}
    with pytest.raises(SuiteFileError, match="no checkpoint ="):
        _suite(tmp_path, {**entry, "checkpoint_recipe": "cohen2019-sigma0.25"})
    with pytest.raises(SuiteFileError, match="unknown .*did you mean 'cohen2019-sigma0.25'.*valid: "):
        _suite(tmp_path, {**entry, "checkpoint": ten, "checkpoint_recipe": "cohen2019-sigma0.2"})
    with pytest.raises(SuiteFileError, match="is a adversarial checkpoint.*valid for randomized_smoothing"):
        _suite(tmp_path, {**entry, "checkpoint": ten, "checkpoint_recipe": "salman2020-l2-1"})
    with pytest.raises(SuiteFileError, match="sigma = 0.25, but .* trained with sigma = 0.5"):
        _suite(tmp_path, {**entry, "checkpoint": ten, "checkpoint_recipe": "cohen2019-sigma0.50"})
    spec = _suite(tmp_path, {**entry, "checkpoint": ten, "checkpoint_recipe": "cohen2019-sigma0.25"},
                  {"name": "a", "family": "adversarial", "params": {"eps": 0.01}}).anomalies
    assert spec[0].to_dict()["checkpoint_recipe"] == "cohen2019-sigma0.25"
    assert _provenance_text(spec[0]).startswith("; loaded: Cohen et al. 2019")
    assert "trained here: every batch replaced by its linf PGD" in _provenance_text(spec[1])
    assert "checkpoint_recipe" not in spec[1].to_dict()


def test_cohen_checkpoint_layout_loads():
    weight = torch.zeros(2)
    assert clean_state_dict({"state_dict": {"1.module.fc.bias": weight}}) == {"fc.bias": weight}
