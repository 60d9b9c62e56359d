"""The pieces under the methods: the hook-safe model copy, parameters, renderer and store."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import nn

from counteraudit.explain.base import build_method
from counteraudit.explain.base import Explanation
from counteraudit.explain.explainable import check_relus_used_once, explainable
from counteraudit.train.core.params import execution_only, parse_params, recorded_params
from counteraudit.explain.render import (HOT, JET, RENDERER_VERSION, cam_overlay, probability_bars,
                                         saliency_heat, saliency_overlay)
from counteraudit.explain.store import is_stored, load_explanation, result_key, save_explanation, stored_key
from counteraudit.train.architectures import build_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # see tests/test_explain_methods.py
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model() -> nn.Module:
    torch.manual_seed(0)
    return build_model("small_resnet", num_classes=10, mean=(0.5,) * 3, std=(0.25,) * 3).eval()


# ---------------------------------------------------------------- explainable
def test_explainable_copy_computes_the_same_logits_with_one_relu_per_use(model):
    images = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        expected = model(images)
    with explainable(model, images[:1]) as safe:
        with torch.no_grad():  # channels_last weights: equal up to float rounding
            np.testing.assert_allclose(safe(images).numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)
        assert safe.backbone.conv1.weight.is_contiguous(memory_format=torch.channels_last)
        relus = [m for m in safe.modules() if isinstance(m, nn.ReLU)]
        assert len({id(m) for m in relus}) == len(relus) and not any(m.inplace for m in relus)
        assert not safe.training and not any(p.requires_grad for p in safe.parameters())
        assert safe.backbone.layer2[1].relu3 is not safe.backbone.layer2[1].relu1
        check_relus_used_once(safe, images[:1])  # does not raise
    assert model.backbone.layer2[1].relu.inplace  # the caller's model is untouched


def test_a_reused_relu_the_copy_cannot_split_is_reported():
    class Reuses(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 3, 1)
            self.act = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.act(self.conv(self.act(x))).mean(dim=(2, 3))

    with pytest.raises(ValueError, match=r"called more than once.*'act': 2"):
        with explainable(Reuses(), torch.rand(1, 3, 8, 8)):
            pass


# ---------------------------------------------------------------- parameters
@dataclass(frozen=True)
class ExampleParams:
    steps: int = 10
    rate: float = 0.5
    layers: tuple[str, ...] | None = None
    chunk: int | None = execution_only(64)


def test_params_from_a_suite_table():
    params = parse_params(ExampleParams, {"steps": 3, "rate": 1, "layers": ["(3,3)"]},
                          "method 'example'")
    assert params == ExampleParams(steps=3, rate=1.0, layers=("(3,3)",))
    assert recorded_params(params) == {"steps": 3, "rate": 1.0, "layers": ["(3,3)"]}  # no chunk


def test_params_errors_name_the_key_and_the_fix():
    where = "method 'example'"
    with pytest.raises(ValueError, match=r"^method 'example' stpes: unknown key \(did you mean "
                                         r"'steps'\?\); valid keys: steps, rate, layers, chunk$"):
        parse_params(ExampleParams, {"stpes": 3}, where)
    with pytest.raises(ValueError, match='^method \'example\' rate = "fast" must be a number'):
        parse_params(ExampleParams, {"rate": "fast"}, where)
    with pytest.raises(ValueError, match="^method 'example' steps = true must be a whole number"):
        parse_params(ExampleParams, {"steps": True}, where)
    with pytest.raises(ValueError, match="^method 'example' rate = inf must be a finite number"):
        parse_params(ExampleParams, {"rate": float("inf")}, where)


def test_execution_only_params_do_not_change_the_recorded_key():
    small = build_method("integrated_gradients", {"internal_batch_size": 8})
    large = build_method("integrated_gradients", {"internal_batch_size": 512})
    assert small.describe("small_resnet") == large.describe("small_resnet")
    assert build_method("integrated_gradients", {"n_steps": 20}).describe("small_resnet") \
        != large.describe("small_resnet")


def test_architecture_defaults_need_an_architecture():
    with pytest.raises(ValueError, match=r"set layer in \[methods.gradcam\]"):
        build_method("gradcam").describe(None)
    assert build_method("gradcam", {"layer": "(4,0,3)"}).describe(None)["method_params"]["layer"] \
        == "layer4.0.conv3"


# ---------------------------------------------------------------- renderer
def test_saliency_heat_reduces_abs_sum_and_normalises_by_99th_percentile():
    attributions = np.zeros((1, 3, 10, 10))
    attributions[0, 0] = np.arange(100).reshape(10, 10)
    attributions[0, 1] = -np.arange(100).reshape(10, 10)  # opposite sign: adds, does not cancel
    heat = saliency_heat(attributions)
    p99 = np.percentile(2 * np.arange(100), 99)
    np.testing.assert_allclose(heat[0].ravel(), np.clip(2 * np.arange(100) / p99, 0, 1))
    assert saliency_heat(np.zeros((1, 3, 4, 4))).max() == 0  # a dead map stays dark, no NaN


def test_overlays_are_deterministic_uint8_images():
    rng = np.random.default_rng(0)
    images = rng.random((2, 3, 16, 16))
    attributions = rng.normal(size=(2, 3, 16, 16))
    first = saliency_overlay(attributions, images)
    assert first.dtype == np.uint8 and first.shape == (2, 16, 16, 3)
    np.testing.assert_array_equal(first, saliency_overlay(attributions.copy(), images.copy()))
    cams = cam_overlay(rng.random((2, 16, 16)), images)
    assert cams.dtype == np.uint8 and cams.shape == (2, 16, 16, 3) and cams.max() == 255
    # The renderer's pixels, pinned to its version: RENDERER_VERSION is part of every stored
    # result's key, so a change of pixels without a new version would compare new renders with
    # old ones. If this fails on purpose, bump RENDERER_VERSION and record the new digest here.
    digest = hashlib.sha256(first.tobytes() + cams.tobytes()).hexdigest()
    assert (RENDERER_VERSION, digest) in RENDERED_DIGESTS, \
        f"renderer pixels changed ({digest}) at RENDERER_VERSION {RENDERER_VERSION}"


RENDERED_DIGESTS = {(1, "b2d16c60361c263582ccdae75f40002768e21671cf429ba23c84db6f0ddad344")}


def test_colour_tables():
    assert HOT.shape == JET.shape == (256, 3)
    np.testing.assert_allclose(HOT[-1], [1, 1, 1])
    np.testing.assert_allclose(JET[0], [0, 0, 0.5])
    np.testing.assert_allclose(JET[-1], [0.5, 0, 0])
    assert np.all(np.diff(HOT @ [0.299, 0.587, 0.114]) >= 0)  # luminance rises with the value


def test_probability_bars():
    probabilities = np.array([[0.0, 1.0], [0.5, 0.5]])
    bars = probability_bars(probabilities, height=4, width=4)
    assert bars.shape == (2, 4, 4, 3)
    filled = bars.max(axis=-1) > 0
    np.testing.assert_array_equal(filled[0], [[0, 0, 1, 1]] * 4)  # class 1 full height
    np.testing.assert_array_equal(filled[1], [[0, 0, 0, 0]] * 2 + [[1, 1, 1, 1]] * 2)
    # More classes than columns: a column shows the largest probability among its classes.
    many = np.zeros((1, 1000))
    many[0, 637] = 1.0
    assert (probability_bars(many, 8, 10)[0].max(axis=-1) > 0).sum(axis=0).tolist() == \
        [0, 0, 0, 0, 0, 0, 8, 0, 0, 0]


# ---------------------------------------------------------------- store
def make_explanation(layers=None) -> Explanation:
    rng = np.random.default_rng(0)
    shape = (2, 8, 8, 3) if layers is None else (len(layers), 2, 8, 8, 3)
    return Explanation(images=rng.integers(0, 256, shape, dtype=np.uint8),
                       targets=np.array([3, 7]),
                       params={"method": "m", "method_params": {"steps": 5, "layers": ["a"]},
                               "renderer_version": RENDERER_VERSION},
                       raw=rng.normal(size=(2, 3, 8, 8)).astype(np.float32), layers=layers,
                       diagnostics={"objective_final": np.ones((1, 2))} if layers else {})


def test_store_round_trip_and_key(tmp_path):
    explanation = make_explanation(layers=("(3,3)",))
    key = result_key(explanation.params, "reference-00", "detection-50")
    assert not is_stored(tmp_path, key)
    save_explanation(tmp_path, explanation, "reference-00", "detection-50")
    assert is_stored(tmp_path, key)
    assert stored_key(tmp_path)["model_id"] == "reference-00"
    loaded = load_explanation(tmp_path)
    np.testing.assert_array_equal(loaded.images, explanation.images)
    np.testing.assert_array_equal(loaded.targets, explanation.targets)
    np.testing.assert_allclose(loaded.raw, explanation.raw, rtol=1e-3, atol=1e-3)  # float16
    assert loaded.layers == ("(3,3)",) and loaded.params == explanation.params
    np.testing.assert_array_equal(loaded.diagnostics["objective_final"], np.ones((1, 2)))


def test_store_key_mismatch_means_recompute(tmp_path):
    explanation = make_explanation()
    save_explanation(tmp_path, explanation, "reference-00", "detection-50")
    key = result_key(explanation.params, "reference-00", "detection-50")
    assert not is_stored(tmp_path, {**key, "renderer_version": RENDERER_VERSION + 1})
    assert not is_stored(tmp_path, {**key, "method_params": {"steps": 6, "layers": ["a"]}})
    assert not is_stored(tmp_path, {**key, "model_id": "backdoor-00"})
    (tmp_path / "params.json").unlink()  # an interrupted save leaves no params file
    assert not is_stored(tmp_path, key)
    with pytest.raises(FileNotFoundError, match="no finished explanation"):
        load_explanation(tmp_path)


def test_stored_key_matches_describe_before_running(tmp_path, model):
    method = build_method("guided_backprop")
    explanation = method.run(model, torch.rand(1, 3, 64, 64))
    save_explanation(tmp_path, explanation, "reference-00", "detection-50")
    # What a driver computes before loading the model: the architecture is enough.
    assert is_stored(tmp_path, result_key(method.describe("small_resnet"), "reference-00",
                                          "detection-50"))
