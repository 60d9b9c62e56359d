"""The paper's protocol choices of the explain stage, each against the library call the paper's
code made (js-d/auditing-vis, visualize/vis_functions.py): renderers, integrated gradients'
baseline, the gradient space, Grad-CAM's test-time augmentation, Caricatures' canvas, steps and
noise, the explained class; and that a new option at its old value keeps stored results' keys."""
from __future__ import annotations

import inspect
import io
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from PIL import Image
from captum.attr import GuidedBackprop, GuidedGradCam, IntegratedGradients, visualization
from lucent.optvis import param as lucent_param, render, transform as lucent_transform
from pytorch_grad_cam import GradCAM
from pytorch_grad_cam.utils.image import show_cam_on_image
from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

from counteraudit.evaluate.detect import get_args_parser, main
from counteraudit.explain.base import build_method
from counteraudit.explain.caricature_transforms import (AUGMENTATIONS, draw_parameters,
                                                        sampling_grid, sampling_grids)
from counteraudit.explain.methods.caricature import floor_uint8, per_row_start
from counteraudit.explain.renderers import RENDERERS, build_renderer
from counteraudit.explain.settings import suite_method
from counteraudit.train.architectures import ARCHITECTURES, build_model, resolve_layer
from counteraudit.train.core.artifacts import derive_seed
from counteraudit.train.core.registry import UnknownNameError
from counteraudit.train.core.suite import load_suite
from counteraudit.train.core.suite_schema import SuiteFileError
from tests.conftest import write_suite

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SIZE = 64
MATPLOTLIB35_FIGURES = Path(__file__).with_name("data") / "captum_figures_matplotlib35.npz"
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet's, as the paper normalised


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # see tests/test_explain_methods.py
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("small_resnet", num_classes=10, mean=MEAN, std=STD).eval()


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return torch.rand(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def targets(model, images) -> torch.Tensor:
    with torch.no_grad():
        return model(images).argmax(dim=1)


def normalised(images: torch.Tensor) -> torch.Tensor:
    """What the paper gave the libraries: transforms.Normalize(ImageNet mean, std)(images)."""
    return (images - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)


# ---------------------------------------------------------------- renderers
def captum_png(attribution_hwc: np.ndarray, image_hwc: np.ndarray) -> np.ndarray:
    """The paper's call: captum's figure, saved as a PNG, read back as the LPIPS loader reads it
    (its RGB channels)."""
    matplotlib.use("Agg")
    figure, _ = visualization.visualize_image_attr(attribution_hwc, image_hwc, "blended_heat_map",
                                                   alpha_overlay=0.8)
    buffer = io.BytesIO()
    figure.savefig(buffer)
    plt.close(figure)
    png = np.asarray(Image.open(io.BytesIO(buffer.getvalue())))
    assert png.shape == (600, 600, 4) and (png[..., 3] == 255).all()  # opaque: RGB is all of it
    return png[..., :3]


def test_captum_figure_installed_gives_the_pixels_of_captums_saved_figure():
    """``rasterisation = "installed"``: captum's call and savefig, on the installed versions."""
    rng = np.random.default_rng(0)
    # Three random attributions at the paper's 224 px, with a heavy-tailed one (captum clips at
    # 98% of the cumulative mass) and one of mixed signs that cancel across channels.
    attributions = np.stack([rng.normal(size=(3, 224, 224)),
                             rng.standard_cauchy(size=(3, 224, 224)),
                             rng.normal(size=(3, 224, 224)) * [[[1.0]], [[-1.0]], [[0.5]]]]
                            ).astype(np.float32)
    images = rng.random((3, 3, 224, 224)).astype(np.float32)
    renderer = build_renderer("captum_figure", {"rasterisation": "installed"}, "attributions",
                              "test")
    rendered = renderer.render(attributions, images)  # one figure, reused for all three
    assert rendered.shape == (3, 600, 600, 3) and rendered.dtype == np.uint8
    for attribution, image, ours in zip(attributions, images, rendered):
        np.testing.assert_array_equal(
            ours, captum_png(attribution.transpose(1, 2, 0), image.transpose(1, 2, 0)))


@pytest.mark.parametrize("geometry, dpi", [("demo", 16), ("half_paper", 50)])
def test_captum_figure_gives_the_pixels_of_the_papers_matplotlib_3_5(geometry, dpi):
    """By default, the figure the paper's captum 0.6.0 and matplotlib 3.5.2 saved
    (tests/data/make_matplotlib35_figures.py), at the demo's geometry and at the paper's halved
    (both upsample by less than 3x, where matplotlib >= 3.10 colour-maps before resampling: up
    to 137 grey levels apart on these figures). What remains is the Agg resampler, which
    matplotlib 3.11 made more accurate (PRs 30184, 31021): at most 4 grey levels (1.5 colour-map
    bins of resampled data), 0.15 on average; 2 and 0.006 on the smooth half-paper figure."""
    reference = np.load(MATPLOTLIB35_FIGURES)
    attributions = reference[f"{geometry}_attributions"].astype(np.float32)
    images = reference[f"{geometry}_images"].astype(np.float32) / 255
    rendered = build_renderer("captum_figure", {"dpi": dpi}, "attributions",
                              "test").render(attributions, images)
    difference = np.abs(rendered.astype(np.int16) - reference[f"{geometry}_figures"])
    assert rendered.shape == reference[f"{geometry}_figures"].shape
    assert difference.max() <= 4 and difference.mean() <= 0.2, \
        (difference.max(), difference.mean())


def test_captum_figure_scales_with_its_options_and_shows_no_heat_for_a_dead_map():
    renderer = build_renderer("captum_figure", {"figure_inches": 6, "dpi": 16}, "attributions",
                              "test")
    images = np.full((2, 3, SIZE, SIZE), 0.5, np.float32)
    images[:, :, :8] = 0.0  # a dark band, so the grey image is not flat
    attributions = np.zeros((2, 3, SIZE, SIZE), np.float32)
    attributions[1, :, 40:50, 40:50] = 1.0
    rendered = renderer.render(attributions, images)
    assert rendered.shape == (2, 96, 96, 3)
    # A map of zeros (where captum's own call would fail) differs from a map with heat only
    # where the heat is.
    different = (rendered[0] != rendered[1]).any(axis=-1)
    rows, columns = np.nonzero(different)
    assert different.any() and rows.min() > 96 * 0.5 and columns.min() > 96 * 0.5


def test_show_cam_on_image_renderer_is_the_librarys_call():
    rng = np.random.default_rng(0)
    cams = rng.random((2, SIZE, SIZE)).astype(np.float32)
    images = rng.random((2, 3, SIZE, SIZE)).astype(np.float32)
    rendered = build_renderer("show_cam_on_image", None, "cams", "gradcam").render(cams, images)
    for cam, image, ours in zip(cams, images, rendered):
        np.testing.assert_array_equal(ours, show_cam_on_image(image.transpose(1, 2, 0), cam,
                                                              use_rgb=True))


def test_unknown_or_mismatched_renderer_lists_the_valid_names():
    with pytest.raises(UnknownNameError, match="captum_figure.*hot_overlay"):
        build_method("guided_backprop", {"renderer": "captum"})
    with pytest.raises(ValueError, match="renders cams.*valid renderers for it: captum_figure, "
                                         "hot_overlay"):
        build_method("guided_backprop", {"renderer": "show_cam_on_image"})
    with pytest.raises(ValueError, match=r"renderer 'captum_figure' dpis: unknown key \(did you "
                                         r"mean 'dpi'\?\); valid keys: figure_inches, dpi, "
                                         r"rasterisation"):
        build_method("integrated_gradients", {"renderer": "captum_figure",
                                              "renderer_options": {"dpis": 10}})
    assert set(RENDERERS.names()) >= {"captum_figure", "hot_overlay", "jet_overlay",
                                      "show_cam_on_image"}


def test_unknown_choice_lists_the_valid_values():
    with pytest.raises(ValueError, match='baseline = "zero" is not one of the valid values '
                                         "'normalized_zero', 'black'"):
        build_method("integrated_gradients", {"baseline": "zero"})
    with pytest.raises(ValueError, match="'normalized', 'pixels'"):
        build_method("guided_backprop", {"gradient_space": "normalised"})
    with pytest.raises(ValueError, match="'shared', 'per_model'"):
        build_method("caricature", {"noise": "per_image"})
    with pytest.raises(ValueError, match="'top', 'label'"):
        build_method("gradcam", {"explained_class": "true"})
    with pytest.raises(ValueError, match='renderer \'captum_figure\' rasterisation = "3.5" is not '
                                         "one of the valid values 'matplotlib-3.5', 'installed'"):
        build_method("guided_backprop", {"renderer": "captum_figure",
                                         "renderer_options": {"rasterisation": "3.5"}})


# ---------------------------------------------------------------- attributions as the paper
def test_integrated_gradients_normalized_zero_is_captums_default_on_the_normalised_image(
        model, images, targets):
    method = build_method("integrated_gradients", {"baseline": "normalized_zero",
                                                   "gradient_space": "normalized"})
    ours = method.attribute(model, images, targets)
    expected = IntegratedGradients(model.backbone).attribute(normalised(images), target=targets)
    np.testing.assert_allclose(ours.detach().numpy(), expected.detach().numpy(), rtol=0, atol=1e-6)
    # The same integral in pixel space (IG is invariant to the affine normalisation), with the
    # mean colour as the baseline; the black baseline differs.
    pixels = build_method("integrated_gradients", {"baseline": "normalized_zero"})
    scale = expected.abs().max().item()
    np.testing.assert_allclose(pixels.attribute(model, images, targets).detach().numpy(),
                               expected.detach().numpy(), rtol=0, atol=1e-3 * scale)
    black = build_method("integrated_gradients").attribute(model, images, targets)
    assert (black - expected).abs().max() > 0.05 * scale


def test_guided_backprop_and_guided_gradcam_in_the_normalised_space(model, images, targets):
    z = normalised(images)
    gbp = build_method("guided_backprop", {"gradient_space": "normalized"})
    np.testing.assert_allclose(gbp.attribute(model, images, targets).detach().numpy(),
                               GuidedBackprop(model.backbone).attribute(z.clone(), target=targets)
                               .detach().numpy(), rtol=0, atol=1e-6)
    # d/dz = std * d/dx, channel by channel.
    in_pixels = build_method("guided_backprop").attribute(model, images, targets)
    np.testing.assert_allclose(gbp.attribute(model, images, targets).detach().numpy(),
                               (in_pixels * torch.tensor(STD).view(1, 3, 1, 1)).detach().numpy(),
                               rtol=1e-4, atol=1e-7)
    layer = resolve_layer(model, ARCHITECTURES.get("small_resnet").guided_gradcam_layer)
    ggc = build_method("guided_gradcam", {"gradient_space": "normalized"})
    np.testing.assert_allclose(
        ggc.attribute(model, images, targets).detach().numpy(),
        GuidedGradCam(model.backbone, layer).attribute(z.clone(), target=targets).detach().numpy(),
        rtol=0, atol=1e-6)


def test_gradcam_aug_smooth_on_the_normalised_input_and_show_cam_on_image(model, images, targets):
    method = build_method("gradcam", {"aug_smooth_space": "normalized",
                                      "renderer": "show_cam_on_image"})
    explanation = method.run(model, images)
    layer = resolve_layer(model, ARCHITECTURES.get("small_resnet").gradcam_layer)
    cam = GradCAM(model.backbone, [layer])
    try:
        expected = cam(normalised(images).requires_grad_(True),
                       targets=[ClassifierOutputTarget(int(t)) for t in targets], aug_smooth=True)
    finally:
        cam.activations_and_grads.release()
    np.testing.assert_allclose(explanation.raw, expected, rtol=1e-4, atol=1e-5)
    pixel_space = build_method("gradcam").run(model, images)
    assert np.abs(pixel_space.raw - explanation.raw).max() > 1e-3  # the choice matters
    for image, cam_map, ours in zip(images.numpy(), explanation.raw, explanation.images):
        np.testing.assert_array_equal(ours, show_cam_on_image(image.transpose(1, 2, 0), cam_map,
                                                              use_rgb=True))


def test_explained_class_label_explains_the_given_labels(model, images, targets):
    labels = (targets + 1) % 10
    method = build_method("gradcam", {"explained_class": "label", "aug_smooth": False})
    explanation = method.run(model, images, labels=labels.numpy())
    np.testing.assert_array_equal(explanation.targets, labels.numpy())
    layer = resolve_layer(model, ARCHITECTURES.get("small_resnet").gradcam_layer)
    cam = GradCAM(model, [layer])
    try:
        expected = cam(images.clone().requires_grad_(True),
                       targets=[ClassifierOutputTarget(int(t)) for t in labels])
    finally:
        cam.activations_and_grads.release()
    np.testing.assert_allclose(explanation.raw, expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="explained_class = 'label' but no labels"):
        method.run(model, images)
    top = build_method("gradcam", {"aug_smooth": False}).run(model, images, labels=labels.numpy())
    np.testing.assert_array_equal(top.targets, targets.numpy())  # "top" ignores labels


# ---------------------------------------------------------------- Caricatures
def test_paper_caricature_settings_are_render_vis_defaults(monkeypatch):
    """What lucent's render_vis does when called as the paper called it (objective and
    thresholds only), recorded by wrapping param.image and Adam, against the paper suite."""

    recorded = {}
    image = lucent_param.image

    def recording_image(*args, **kwargs):
        recorded["image"] = (args, kwargs)
        return image(*args, **kwargs)

    class RecordingAdam(torch.optim.Adam):
        def __init__(self, params, lr):
            recorded["lr"] = lr
            super().__init__(params, lr=lr)

    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 2, 3)

        def forward(self, x):
            recorded["input"] = tuple(x.shape)
            return self.conv(x)

    monkeypatch.setattr(lucent_param, "image", recording_image)
    monkeypatch.setattr(torch.optim, "Adam", RecordingAdam)
    render.render_vis(Probe().to(lucent_param.spatial.device), "conv:0", thresholds=(1,),
                      show_image=False, progress=False)
    method = suite_method(load_suite("paper"), "caricature")
    params = method.params
    assert recorded["image"] == ((params.canvas,), {})  # param.image(128)
    assert recorded["lr"] == params.learning_rate
    assert recorded["input"][-2:] == (224, 224)  # upsampled to the model's input
    default_steps = inspect.signature(render.render_vis).parameters["thresholds"].default
    assert (params.steps,) == default_steps  # thresholds=(512,)
    # get_vis: 1024 steps for layer4's layers, 512 for the others, for the paper's layers.
    layers = ARCHITECTURES.get("resnet50").caricature_layers
    assert [method.steps_for(layer) for layer in layers] == [512] * 5 + [1024] * 2
    assert (params.noise, params.quantize) == ("per_model", "floor")
    assert params.transforms == "lucent"  # lucent's own standard_transforms (tests below)


def test_canvas_is_upsampled_to_the_input_as_lucents_chain_does():
    """The fused path (transforms = "fused") with a canvas smaller than the input: as lucent's
    standard_transforms followed by render_vis's upsample, on a smooth image (on a high-frequency
    one it is not: test_the_fused_path_differs_from_lucents_chain_on_a_high_frequency_canvas)."""
    canvas = 40
    y, x = torch.meshgrid(torch.linspace(0, 1, canvas), torch.linspace(0, 1, canvas), indexing="ij")
    image = torch.stack([0.5 + 0.4 * torch.sin(6 * x), 0.5 + 0.4 * torch.cos(5 * y), x * y])[None]
    chain = lucent_transform.compose(lucent_transform.standard_transforms + [
        torch.nn.Upsample(size=(SIZE, SIZE), mode="bilinear", align_corners=True)])
    for seed in range(4):
        np.random.seed(seed)
        expected = chain(image)
        np.random.seed(seed)
        fused = AUGMENTATIONS["fused"](canvas, canvas, (SIZE, SIZE))(image)
        assert fused.shape == expected.shape == (1, 3, SIZE, SIZE)
        difference = (expected - fused).abs()
        assert difference.median() < 0.01 and difference.mean() < 0.03, (seed, difference.mean())


def render_vis_chain(output_size: int):
    """What render_vis applies to the canvas every step (models that normalise themselves, so
    preprocess=False): lucent's standard_transforms, then its upsample to the model's input."""
    return lucent_transform.compose(lucent_transform.standard_transforms + [
        torch.nn.Upsample(size=output_size, mode="bilinear", align_corners=True)])


def augmented_with_gradient(augment, canvas: torch.Tensor, weights: torch.Tensor):
    """augment(canvas) and the gradient of a weighted sum of it with respect to the canvas."""
    canvas = canvas.clone().requires_grad_(True)
    augmented = augment(canvas)
    (augmented * weights).sum().backward()
    return augmented.detach(), canvas.grad


def noise_canvas(rows: int, side: int) -> torch.Tensor:
    """A high-frequency canvas: uniform noise, where one resampling and five differ most."""
    return torch.rand(rows, 3, side, side, generator=torch.Generator().manual_seed(2))


CANVAS, INPUT = 24, 40  # a canvas smaller than the input, as the paper's 128 -> 224


def test_the_paper_suites_transforms_are_lucents_chain_bit_for_bit():
    """The paper suite's Caricature augmentation, on a noise canvas and with numpy's global seed
    (noise = "shared"): the output and its gradient are those of lucent's standard_transforms +
    render_vis's upsample, bit for bit."""
    path = suite_method(load_suite("paper"), "caricature").params.transforms
    canvas = noise_canvas(2, CANVAS)
    weights = torch.rand(2, 3, INPUT, INPUT, generator=torch.Generator().manual_seed(3))
    for seed in range(3):
        np.random.seed(seed)
        expected = augmented_with_gradient(render_vis_chain(INPUT), canvas, weights)
        np.random.seed(seed)
        got = augmented_with_gradient(AUGMENTATIONS[path](CANVAS, CANVAS, (INPUT, INPUT)),
                                      canvas, weights)
        assert got[0].shape == (2, 3, INPUT, INPUT)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_the_fused_path_differs_from_lucents_chain_on_a_high_frequency_canvas():
    """The choice is real: with the same draws, one resampling is not five on a noise canvas."""
    canvas = noise_canvas(1, CANVAS)
    differences = []
    for seed in range(3):
        np.random.seed(seed)
        lucent = AUGMENTATIONS["lucent"](CANVAS, CANVAS, (INPUT, INPUT))(canvas)
        np.random.seed(seed)
        fused = AUGMENTATIONS["fused"](CANVAS, CANVAS, (INPUT, INPUT))(canvas)
        differences.append((lucent - fused).abs().mean().item())
    assert min(differences) > 0.02, differences  # canvas std 0.29


def test_lucent_path_per_model_rows_draw_from_their_own_generators():
    """noise = "per_model" with lucent's chain: each row is lucent's chain on that row alone,
    drawing from the row's generator as if it were numpy's global one, step after step; a rerun
    gives the same bits, rows of the same canvas differ, numpy's global generator is untouched."""
    seeds = [11, 12, 13]
    canvas = noise_canvas(1, CANVAS).expand(3, -1, -1, -1)  # the same canvas in every row
    weights = torch.rand(3, 3, INPUT, INPUT, generator=torch.Generator().manual_seed(3))
    expected = []  # two steps per row, each row through render_vis's chain alone
    for row, seed in enumerate(seeds):
        np.random.seed(seed)
        expected.append([augmented_with_gradient(render_vis_chain(INPUT), canvas[row:row + 1],
                                                 weights[row:row + 1]) for _ in range(2)])
    runs = []
    for _ in range(2):
        np.random.seed(99)
        augment = AUGMENTATIONS["lucent"](CANVAS, CANVAS, (INPUT, INPUT),
                                          [np.random.RandomState(s) for s in seeds])
        runs.append([augmented_with_gradient(augment, canvas, weights) for _ in range(2)])
        assert np.random.rand() == np.random.RandomState(99).rand()  # global state untouched
    for step in range(2):
        for row in range(3):
            for got, want in zip(runs[0][step], expected[row][step]):
                assert torch.equal(got[row:row + 1], want)
        assert torch.equal(runs[1][step][0], runs[0][step][0])  # a rerun: the same bits
        assert torch.equal(runs[1][step][1], runs[0][step][1])
        outputs = runs[0][step][0]
        assert not torch.equal(outputs[0], outputs[1]) and not torch.equal(outputs[1], outputs[2])
    assert not torch.equal(runs[0][0][0], runs[0][1][0])  # the generators advance


def test_the_transforms_path_enters_the_key_only_when_not_fused():
    """Results stored before the option were computed with the fused path: "fused" keeps their
    key, "lucent" gets its own."""
    layers = {"layers": ["(3,1)"]}
    default = build_method("caricature", layers).describe(None)
    assert "transforms" not in default["method_params"]
    assert build_method("caricature", {**layers, "transforms": "fused"}).describe(None) == default
    lucent = build_method("caricature", {**layers, "transforms": "lucent"}).describe(None)
    assert lucent["method_params"]["transforms"] == "lucent"
    with pytest.raises(ValueError, match="'fused', 'lucent'"):
        build_method("caricature", {"transforms": "lucid"})


CARICATURE = {"steps": 2, "layers": ["(2,1,1)", "(4,0,3)"], "noise": "per_model",
              "canvas": 32, "quantize": "floor", "steps_by_layer": {"layer4": 3}}


@pytest.mark.parametrize("transforms", ["fused", "lucent"])
def test_per_model_noise_differs_between_models_and_repeats_bit_for_bit(model, images, transforms):
    params = {**CARICATURE, "transforms": transforms}
    method = build_method("caricature", params)
    first = method.run(model, images, batch_size=2, model_id="model-a")
    again = build_method("caricature", params).run(model, images, batch_size=2,
                                                   model_id="model-a")
    other = method.run(model, images, batch_size=2, model_id="model-b")
    assert first.images.shape == (2, 2, 32, 32, 3)  # the canvas's size
    np.testing.assert_array_equal(again.images, first.images)
    for layer in range(2):
        for image in range(2):
            assert not np.array_equal(other.images[layer, image], first.images[layer, image])
    # Each (image, layer) has its own draws: image 1 alone, at its position, is image 1 of the
    # batch up to float rounding (no whole-batch draw couples the rows).
    alone = method.run(model, images[1:], batch_size=1, first_position=1, model_id="model-a")
    assert np.abs(alone.images.astype(int) - first.images[:, 1:].astype(int)).max() <= 1
    with pytest.raises(ValueError, match="model_id"):
        method.run(model, images)


def test_per_model_random_starts_differ_and_shared_starts_are_shared():
    spectra = []
    for model_id in ("model-a", "model-b", "model-a"):
        spectrum = torch.zeros(2, 3, 8, 5, 2)
        per_row_start(spectrum, [derive_seed(0, "caricature", model_id, p, "layer4.0.conv3")
                                 for p in (0, 1)])
        spectra.append(spectrum)
    assert torch.equal(spectra[0], spectra[2]) and not torch.equal(spectra[0], spectra[1])
    assert 0.005 < spectra[0].std() < 0.02  # lucent's sd 0.01


@pytest.mark.parametrize("transforms", ["fused", "lucent"])
def test_shared_noise_gives_every_model_the_same_draws(model, images, transforms):
    """The paired design: two model ids, same model, same bits (the draws do not depend on the
    model's key)."""
    params = {**CARICATURE, "noise": "shared", "transforms": transforms}
    first = build_method("caricature", params).run(model, images, model_id="model-a")
    other = build_method("caricature", params).run(model, images, model_id="model-b")
    np.testing.assert_array_equal(first.images, other.images)


def test_caricature_steps_by_layer_and_floor_quantisation(model, images):
    method = build_method("caricature", CARICATURE)
    assert method.passes_per_image("small_resnet") == 2 + 3
    values = np.array([0.0, 0.5, 254.9 / 255, 1.0], np.float32)
    np.testing.assert_array_equal(floor_uint8(values), (values * 255).astype(np.uint8))
    assert floor_uint8(np.float32([0.999]))[0] == 254  # floor, where rounding gives 255
    # Three steps for layer4 and two for the other layer: the same as rendering each layer alone
    # with that many steps in a separate optimisation.
    both = method.run(model, images, model_id="m")
    alone = build_method("caricature", {**CARICATURE, "layers": ["(4,0,3)"], "steps": 3}
                         ).run(model, images, model_id="m")
    assert np.abs(both.images[1].astype(int) - alone.images[0].astype(int)).max() <= 1


# ---------------------------------------------------------------- keys
def test_new_options_at_their_old_values_keep_the_stored_key():
    old = {"method": "integrated_gradients", "method_version": 1,
           "method_params": {"n_steps": 50, "method": "gausslegendre"}, "renderer_version": 1}
    assert build_method("integrated_gradients").describe(None) == old
    explicit = build_method("integrated_gradients", {
        "baseline": "black", "gradient_space": "pixels", "renderer": "hot_overlay",
        "explained_class": "top"}).describe(None)
    assert explicit == old
    paper = build_method("integrated_gradients", {"baseline": "normalized_zero",
                                                  "renderer": "captum_figure"}).describe(None)
    assert paper["method_params"]["baseline"] == "normalized_zero"
    assert paper["method_params"]["renderer"] == "captum_figure"
    # Options spelled out or left to their defaults: one key.
    spelled = build_method("integrated_gradients", {
        "baseline": "normalized_zero", "renderer": "captum_figure",
        "renderer_options": {"figure_inches": 6.0, "dpi": 100}}).describe(None)
    assert spelled == paper and paper["method_params"]["renderer_options"] == {
        "figure_inches": 6.0, "dpi": 100, "rasterisation": "matplotlib-3.5"}
    # Results stored before `rasterisation` existed were drawn by the installed matplotlib: they
    # keep their key under "installed" and are not reused for the default (3.5.2's pixels).
    installed = build_method("integrated_gradients", {
        "baseline": "normalized_zero", "renderer": "captum_figure",
        "renderer_options": {"rasterisation": "installed"}}).describe(None)
    assert installed["method_params"]["renderer_options"] == {"figure_inches": 6.0, "dpi": 100}


def test_per_row_grids_at_once_equal_the_grids_one_at_a_time():
    """The per-row augmentation (noise = "per_model") computes every row's grid in one pass on a
    GPU: bit for bit the rows of the one-at-a-time computation."""
    generator = np.random.RandomState(0)
    for canvas, output in ((SIZE, SIZE), (40, SIZE), (128, 224)):
        draws = [draw_parameters(generator) for _ in range(5)]
        grid, mask = sampling_grids(canvas, canvas, draws, output_size=(output, output))
        one_by_one = [sampling_grid(canvas, canvas, output_size=(output, output), **draw)
                      for draw in draws]
        assert torch.equal(grid, torch.cat([g for g, _ in one_by_one]))
        assert torch.equal(mask, torch.cat([m for _, m in one_by_one]))


@pytest.mark.parametrize("table, error, valid", [
    ({"guided_backprop": {"renderer": "captum_figur"}}, SuiteFileError, "captum_figure, hot_overlay"),
    ({"integrated_gradients": {"baseline": "zero"}}, ValueError, "'normalized_zero', 'black'"),
])
def test_a_bad_method_table_fails_when_the_suite_is_read_before_any_training(tmp_path, runs, table,
                                                                              error, valid):
    """The main job reads the methods before stage 1: a typo costs seconds, not a training run."""
    (method, params), = table.items()
    body = "[explain]\nmethods = [\"guided_backprop\", \"integrated_gradients\"]\n" + \
        f"[methods.{method}]\n" + "\n".join(f'{k} = "{v}"' for k, v in params.items())
    suite = write_suite(tmp_path / "typo.toml", body=body)
    args = get_args_parser().parse_args(["--suite", str(suite), "--runs-dir", str(runs),
                                         "--distance", "l2", "--no-progress"])
    with pytest.raises(error, match=valid):
        main(args)
    assert not runs.exists() or not any(runs.rglob("*.pth")), "models were trained before the error"
