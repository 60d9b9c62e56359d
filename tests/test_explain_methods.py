"""Every registered explanation method, on a small random ResNet: shapes, determinism, batching,
and agreement with a direct call of the library it wraps."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from captum.attr import (FeatureAblation, GuidedBackprop, GuidedGradCam, IntegratedGradients,
                         NoiseTunnel, Saliency)
from lucent.optvis import transform as lucent_transform
import pytorch_grad_cam
from pytorch_grad_cam import FullGrad, GradCAM, GradCAMPlusPlus
from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

from counteraudit.explain.base import METHODS, build_method
from counteraudit.explain.caricature_transforms import StandardTransforms
from counteraudit.explain.explainable import make_explainable_copy
from counteraudit.explain.methods.caricature import StagedForward, depth_order
from counteraudit.explain.render import RENDERER_VERSION
from counteraudit.train.architectures import ARCHITECTURES, build_model, resolve_layer
from counteraudit.train.core.artifacts import derive_seed
from counteraudit.train.core.registry import UnknownNameError

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

NUM_IMAGES, SIZE = 3, 64
# Parameters that keep the slow methods fast in tests; every other method runs with its defaults.
SMALL_GRID = {"grid_cells": 4}
FAST_PARAMS = {
    "caricature": {"steps": 6},
    "feature_synthesis": {"steps": 3},
    # captum's sampling and perturbation methods (explain/methods/captum_*.py): tiny budgets
    "deep_lift_shap": {"baseline_samples": 2},
    "gradient_shap": {"baseline_samples": 2, "n_samples": 4},
    "smooth_grad": {"n_samples": 3}, "smooth_grad_squared": {"n_samples": 3},
    "var_grad": {"n_samples": 3},
    "occlusion": {"window_fraction": 0.25, "stride_fraction": 0.25},
    "feature_ablation": SMALL_GRID, "lime": {**SMALL_GRID, "n_samples": 24},
    "kernel_shap": {**SMALL_GRID, "n_samples": 24},
    "shapley_value_sampling": {**SMALL_GRID, "n_samples": 1},
    # pytorch-grad-cam's CAMs (explain/methods/gradcam_family.py): one view instead of six, and
    # the perturbation methods on an 8-channel layer (8 masked forwards per image, not 256).
    **{name: {"aug_smooth": False} for name in (
        "gradcam_plusplus", "hirescam", "gradcam_elementwise", "layercam", "eigencam",
        "eigengradcam", "fullgrad")},
    # XGrad-CAM divides by each channel's activation sum: on the pre-BatchNorm conv3 of a random
    # model some sums are near 0 and batching's rounding is amplified past the tolerance; after
    # the block's ReLU (its derivation's assumption) the sums are positive.
    "xgradcam": {"layer": "layer4.0", "aug_smooth": False},
    "scorecam": {"aug_smooth": False, "layer": "layer1.0.conv1", "batch_size": 8},
    "ablationcam": {"aug_smooth": False, "layer": "layer1.0.conv1", "batch_size": 8,
                    "ratio_channels_to_ablate": 1.0},
}


def method_params(name: str) -> dict:
    return FAST_PARAMS.get(name, {})


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: small models gain nothing from more, and on a shared 2-core machine
    OpenMP threads waiting on each other under load make every pass many times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("small_resnet", num_classes=10, mean=(0.5,) * 3, std=(0.25,) * 3).eval()


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return torch.rand(NUM_IMAGES, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def targets(model, images) -> torch.Tensor:
    with torch.no_grad():
        return model(images).argmax(dim=1)


class RunOnce(dict):
    """Each method run once (batch of 2, so two batches) when a test first asks for it: a run
    of some of the tests (``-k <method>``, as tests/test_explain_readme.py does for its example)
    pays only for the methods it checks."""

    def __init__(self, model: torch.nn.Module, images: torch.Tensor):
        super().__init__()
        self.model, self.images = model, images

    def __missing__(self, name: str):
        self[name] = build_method(name, method_params(name)).run(self.model, self.images,
                                                                 batch_size=2)
        return self[name]


@pytest.fixture(scope="module")
def explanations(model, images) -> dict:
    """Each method's explanation of ``images``, shared by the tests below."""
    return RunOnce(model, images)


# ---------------------------------------------------------------- every registered method
@pytest.mark.parametrize("name", METHODS.names())
def test_output_shape_dtype_and_record(name, explanations, targets):
    explanation = explanations[name]
    assert explanation.images.dtype == np.uint8
    if explanation.layers is None:
        assert explanation.images.shape == (NUM_IMAGES, SIZE, SIZE, 3)
    else:
        assert explanation.images.shape == (len(explanation.layers), NUM_IMAGES, SIZE, SIZE, 3)
    assert explanation.raw is None or explanation.raw.shape[0] == NUM_IMAGES
    if METHODS.get(name).model_level:  # row c explains class c (the rows of the classes set)
        np.testing.assert_array_equal(explanation.targets, np.arange(NUM_IMAGES))
    else:
        np.testing.assert_array_equal(explanation.targets, targets.numpy())  # the model's top class
    assert explanation.params["method"] == name
    assert explanation.params["renderer_version"] == RENDERER_VERSION
    for values in explanation.diagnostics.values():
        assert values.shape[-1] == NUM_IMAGES


@pytest.mark.parametrize("name", METHODS.names())
def test_same_seed_same_bits(name, model, images, explanations):
    again = build_method(name, method_params(name)).run(model, images, batch_size=2)
    np.testing.assert_array_equal(again.images, explanations[name].images)
    if again.raw is not None:
        np.testing.assert_array_equal(again.raw, explanations[name].raw)


@pytest.mark.parametrize("name", [n for n in METHODS.names() if METHODS.get(n).batch_invariant])
def test_batched_equals_one_at_a_time(name, model, images, explanations):
    batched = explanations[name]
    single = build_method(name, method_params(name)).run(model, images, batch_size=1)
    if batched.raw is not None:
        scale = np.abs(batched.raw).max()
        np.testing.assert_allclose(single.raw, batched.raw, rtol=1e-4, atol=1e-5 * scale)
    # Rendering can round a value sitting on a level boundary the other way: one level of the
    # HOT table's steepest ramp (blue, over its top quarter) is 0.8 * 255 / 64 = 3.2 values.
    difference = np.abs(single.images.astype(int) - batched.images.astype(int))
    assert difference.max() <= 4 and (difference > 0).mean() < 0.01


@pytest.mark.parametrize("name", METHODS.names())
def test_does_not_change_the_callers_model(name, model, images):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    inplace_relus = [m for m in model.modules() if isinstance(m, torch.nn.ReLU) and m.inplace]
    build_method(name, method_params(name)).run(model, images[:1])
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert inplace_relus and all(m.inplace for m in inplace_relus)
    assert all(p.requires_grad for p in model.parameters())


# ---------------------------------------------------------------- same as the libraries
def test_guided_backprop_equals_captum(model, images, targets, explanations):
    expected = GuidedBackprop(model).attribute(images.clone(), target=targets)
    np.testing.assert_allclose(explanations["guided_backprop"].raw, expected.detach().numpy(),
                               rtol=1e-4, atol=1e-6)


def test_integrated_gradients_equals_captum(model, images, targets, explanations):
    expected = IntegratedGradients(model).attribute(images.clone(), target=targets, n_steps=50)
    np.testing.assert_allclose(explanations["integrated_gradients"].raw,
                               expected.detach().numpy(), rtol=1e-4, atol=1e-6)


def test_guided_gradcam_equals_captum(model, images, targets, explanations):
    layer = resolve_layer(model, ARCHITECTURES.get("small_resnet").guided_gradcam_layer)
    expected = GuidedGradCam(model, layer).attribute(images.clone(), target=targets)
    np.testing.assert_allclose(explanations["guided_gradcam"].raw, expected.detach().numpy(),
                               rtol=1e-4, atol=1e-6)


def test_gradcam_equals_pytorch_grad_cam(model, images, targets, explanations):
    layer = resolve_layer(model, ARCHITECTURES.get("small_resnet").gradcam_layer)
    cam = GradCAM(model, [layer])
    try:
        expected = cam(images.clone(), targets=[ClassifierOutputTarget(int(t)) for t in targets],
                       aug_smooth=True)
    finally:
        cam.activations_and_grads.release()
    np.testing.assert_allclose(explanations["gradcam"].raw, expected, rtol=1e-4, atol=1e-5)


def test_saliency_equals_captum(model, images, targets, explanations):
    expected = Saliency(model).attribute(images.clone(), target=targets)
    np.testing.assert_allclose(explanations["saliency"].raw, expected.detach().numpy(),
                               rtol=1e-4, atol=1e-6)


def test_smooth_grad_equals_captums_noise_tunnel_with_each_images_seed(model, images, targets,
                                                                       explanations):
    """Image i's noise is drawn from the seed derive_seed(seed, i), whatever its batch."""
    for i in range(NUM_IMAGES):
        image = images[i:i + 1].clone()
        torch.manual_seed(derive_seed(0, i))
        expected = NoiseTunnel(Saliency(model)).attribute(
            image, nt_type="smoothgrad", nt_samples=3, stdevs=0.15 * float(image.max() - image.min()),
            target=targets[i:i + 1], abs=False)
        np.testing.assert_allclose(explanations["smooth_grad"].raw[i:i + 1],
                                   expected.detach().numpy(), rtol=1e-4, atol=1e-6)


def test_feature_ablation_equals_captum_on_a_grid_of_square_cells(model, images, targets,
                                                                   explanations):
    cell = torch.arange(SIZE) // (SIZE // 4)  # 4 x 4 cells of 16 px (FAST_PARAMS)
    grid = (cell[:, None] * 4 + cell[None, :])[None, None]
    expected = FeatureAblation(model).attribute(images.clone(), target=targets, feature_mask=grid)
    raw = explanations["feature_ablation"].raw
    np.testing.assert_allclose(raw, expected.detach().numpy(), rtol=1e-4, atol=1e-6)
    assert len(np.unique(raw[0])) > 1  # the cells' values differ: the model's output moved


@pytest.mark.parametrize("name, params, key", [
    ("occlusion", {"stride_fraction": 0}, "stride_fraction"),
    ("lime", {"n_samples": 0}, "n_samples"),
    ("kernel_shap", {"grid_cells": -1}, "grid_cells"),
    ("shapley_value_sampling", {"n_samples": 0}, "n_samples"),
    ("smooth_grad", {"n_samples": 0}, "n_samples"),
    ("feature_synthesis", {"steps": 0}, "steps")])
def test_a_budget_that_is_not_positive_is_one_error_naming_it(name, params, key):
    with pytest.raises(ValueError, match=rf"^{key} = .*set {key}"):
        build_method(name, params)


def test_gradcam_plusplus_equals_pytorch_grad_cam(model, images, targets, explanations):
    layer = resolve_layer(model, ARCHITECTURES.get("small_resnet").gradcam_layer)
    cam = GradCAMPlusPlus(model, [layer])
    try:
        expected = cam(images.clone(), targets=[ClassifierOutputTarget(int(t)) for t in targets])
    finally:
        cam.activations_and_grads.release()
    np.testing.assert_allclose(explanations["gradcam_plusplus"].raw, expected, rtol=1e-4, atol=1e-5)


def test_fullgrad_pairs_every_bias_with_its_own_gradient(model, images):
    """pytorch-grad-cam's FullGrad pairs bias layers (module order) with gradients (arrival
    order): the explainable copy must run its modules in registration order."""
    cam = FullGrad(make_explainable_copy(model), [])
    by_module = {}

    def record_gradient(module, _inputs, output):
        output.register_hook(lambda gradient: by_module.__setitem__(module, gradient))

    handles = [layer.register_forward_hook(record_gradient) for layer in cam.target_layers]
    try:
        cam.activations_and_grads(images[:1].clone().requires_grad_(True))[0, 0].backward()
        gradients = list(cam.activations_and_grads.gradients)  # release() empties the list
    finally:
        cam.activations_and_grads.release()
        for handle in handles:
            handle.remove()
    assert len(gradients) == len(cam.target_layers) > 20
    assert all(torch.equal(by_module[layer], gradient)
               for layer, gradient in zip(cam.target_layers, gradients))


def test_random_map_depends_on_the_image_seed_and_key_never_the_model(model, images, explanations):
    torch.manual_seed(5)
    other_model = build_model("small_resnet", num_classes=10, mean=(0.4,) * 3, std=(0.3,) * 3).eval()
    reference = explanations["random_map"]
    other = build_method("random_map").run(other_model, images, batch_size=3)
    np.testing.assert_array_equal(other.raw, reference.raw)  # other weights, same (no) key
    np.testing.assert_array_equal(other.images, reference.images)
    assert not np.allclose(reference.raw[0], reference.raw[1], atol=0.05)  # another image
    other_seed = build_method("random_map", {"seed": 1}).run(model, images[:1])
    assert not np.allclose(other_seed.raw[0], reference.raw[0], atol=0.05)
    # Each model key its own draw, whatever the weights: references' maps then differ (a spread
    # the anomaly score can divide by), and a model's maps are exchangeable with theirs.
    keyed = [build_method("random_map").run(m, images, model_id=key).raw
             for m, key in [(model, "reference-00"), (other_model, "reference-00"),
                            (model, "reference-01")]]
    np.testing.assert_array_equal(keyed[0], keyed[1])
    assert all(not np.allclose(a, b, atol=0.05) for a, b in zip(keyed[0], keyed[2]))


def test_outputs_only_raw_is_softmax(model, images, explanations):
    with torch.no_grad():
        expected = torch.softmax(model(images), dim=1).numpy()
    np.testing.assert_allclose(explanations["outputs_only"].raw, expected, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- Caricatures
def test_caricature_objective_rises_well_above_initialisation(explanations):
    diagnostics = explanations["caricature"].diagnostics
    initial, final = diagnostics["objective_initial"], diagnostics["objective_final"]
    assert initial.shape == final.shape == (7, NUM_IMAGES)
    # Six Adam steps already multiply <f_l(x'), f_l(x)> many times over, for every layer and image.
    assert (final > 3 * np.abs(initial)).all(), (initial, final)


def test_caricature_layers_default_to_architecture(explanations):
    assert explanations["caricature"].layers == ARCHITECTURES.get("small_resnet").caricature_layers


def test_caricature_seed_and_batch_size_are_recorded_and_matter(model, images, explanations):
    reference = explanations["caricature"]
    assert reference.params["batch_size"] == 2
    assert reference.params["method_params"]["seed"] == 0
    other_seed = build_method("caricature", {"steps": 6, "seed": 1}).run(model, images, batch_size=2)
    assert not np.array_equal(other_seed.images, reference.images)


def test_feature_synthesis_raises_the_logit_of_each_rows_class():
    """Row c maximises logit c (not the top class, not another row's): on a random linear model
    of the pooled colours every row's logit rises, and logit c is higher on row c's image than
    on any other row's, which a wrong sign or a wrong target would not give."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(2), torch.nn.Flatten(),
                                torch.nn.Linear(12, 4)).eval()
    result = build_method("feature_synthesis", {"steps": 20}).run(model, torch.full((4, 3, 32, 32), 0.5))
    gains = result.diagnostics["logit_final"] - result.diagnostics["logit_initial"]
    assert (gains > 0.1).all(), gains
    rendered = torch.from_numpy(result.images).permute(0, 3, 1, 2).float() / 255
    with torch.no_grad():
        logits = model(rendered)  # logits[row, class]
    assert logits.argmax(dim=0).tolist() == [0, 1, 2, 3]  # class c's best image: row c
    np.testing.assert_array_equal(result.targets, [0, 1, 2, 3])


def test_staged_forward_gives_each_layer_group_its_full_forward_features(model):
    safe = make_explainable_copy(model)
    layers = ARCHITECTURES.get("small_resnet").caricature_layers
    modules = [resolve_layer(safe, layer) for layer in layers]
    order = depth_order(safe, modules)
    assert set(order[:2]) == {5, 6} and order[-1] == 0  # deepest block (layer4.0) first
    modules = [modules[i] for i in order]
    rows = torch.rand(2 * len(modules), 3, SIZE, SIZE)
    staged = StagedForward(safe, modules, rows_per_group=2)
    with torch.no_grad():
        staged_features = staged(rows)
        full = {}
        for module in modules:
            module.register_forward_hook(lambda m, i, o: full.__setitem__(id(m), o))
        safe(rows)
    staged.close()
    for g, module in enumerate(modules):
        np.testing.assert_allclose(staged_features[g].numpy(),
                                   full[id(module)][2 * g:2 * g + 2].numpy(), rtol=1e-5, atol=1e-6)


def test_caricature_single_layer_and_cossim(model, images):
    explanation = build_method("caricature", {"steps": 2, "layers": ["(3,1)"], "cossim_pow": 1.0}
                               ).run(model, images[:1])
    assert explanation.images.shape == (1, 1, SIZE, SIZE, 3) and explanation.layers == ("(3,1)",)


def test_fused_augmentation_matches_lucents_transform_chain():
    """The fused path (explain/caricature_transforms.py, transforms = "fused") draws what lucent
    draws and resamples once: on a smooth image the two agree except along the borders of
    zero-filled regions (hard there, blended by lucent's repeated bilinear warps), for every
    random draw."""
    y, x = torch.meshgrid(torch.linspace(0, 1, SIZE), torch.linspace(0, 1, SIZE), indexing="ij")
    image = torch.stack([0.5 + 0.4 * torch.sin(6 * x), 0.5 + 0.4 * torch.cos(5 * y), x * y])[None]
    lucent_chain = lucent_transform.compose(lucent_transform.standard_transforms + [
        torch.nn.Upsample(size=(SIZE, SIZE), mode="bilinear", align_corners=True)])
    for seed in range(6):
        np.random.seed(seed)
        expected = lucent_chain(image)
        np.random.seed(seed)
        fused = StandardTransforms(SIZE, SIZE)(image)
        difference = (expected - fused).abs()
        assert difference.median() < 0.01 and difference.mean() < 0.03, (seed, difference.mean())


# ---------------------------------------------------------------- errors a user can make
def test_unknown_method_lists_valid_names():
    with pytest.raises(UnknownNameError, match="gradcam"):
        build_method("grad_cam")


def test_unknown_parameter_lists_valid_ones():
    with pytest.raises(ValueError, match=r"step: unknown key \(did you mean 'steps'\?\); valid "
                                         r"keys: layers, steps, "):
        build_method("caricature", {"step": 10})


def test_wrongly_typed_parameter_is_an_error():
    with pytest.raises(ValueError, match='steps = "512" must be a whole number, not a string'):
        build_method("caricature", {"steps": "512"})


def test_images_outside_unit_range_are_refused(model):
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        build_method("guided_backprop").run(model, torch.randn(1, 3, SIZE, SIZE) * 3)


def test_a_cam_method_missing_from_the_installed_library_names_the_version(monkeypatch):
    monkeypatch.delattr(pytorch_grad_cam, "HiResCAM")
    with pytest.raises(ImportError, match=r"'hirescam' needs grad-cam >= 1\.4\.2 \(installed: "):
        build_method("hirescam")


@pytest.mark.parametrize("name, params, message", [
    ("scorecam", {"batch_size": None}, r"'scorecam' needs its budget 'batch_size'"),
    ("scorecam", {"batch_size": 0}, r"batch_size = 0 must be >= 1"),
    ("ablationcam", {"ratio_channels_to_ablate": None}, r"needs its budget 'ratio_channels_to_ablate'"),
    ("ablationcam", {"batch_size": 8, "ratio_channels_to_ablate": 1.5},
     r"ratio_channels_to_ablate = 1.5 must be in \(0, 1\]"),
])
def test_perturbation_cams_need_a_valid_budget(name, params, message):
    with pytest.raises(ValueError, match=message):
        build_method(name, params)


def test_registering_a_name_twice_is_an_error():
    with pytest.raises(ValueError, match="already registered"):
        METHODS.register(METHODS.get("gradcam"))
