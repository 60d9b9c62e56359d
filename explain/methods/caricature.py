"""Caricatures (Olah 2018) with lucent: what a layer "sees" in an image, as an image.

Caricature_l(x, f) = argmax_x' <f_l(x'), f_l(x)>, optionally times cos(f_l(x'), f_l(x))^cossim_pow
(lucid's caricature recipe; the cosine is floored at 0.1 as lucid's ``_dot_cossim`` does so the
power stays defined), solved with lucent's default regularisation, as ``render_vis`` does it:
- parameterisation ``param.image``: FFT spectrum with 1/f scaling, decorrelated colours, sigmoid,
  on a ``canvas`` x ``canvas`` image (render_vis: 128; default: the input's size), which is the
  size of the result;
- augmentation ``transform.standard_transforms`` (pad 12, jitter 8, scale 0.9-1.1, rotate +-10
  degrees, jitter 4), then bilinear resizing to the input size, as ``render_vis`` upsamples to
  the model's input size (224 for its zoo); ``transforms`` chooses how
  (explain/caricature_transforms.py): "lucent" calls lucent's own functions and that upsample,
  as render_vis does (the ``paper`` suite); "fused", the default, composes them into one
  resampling with the same random draws (lucent's five resamplings cost more than the small
  model on a CPU; the ``demo`` suite, see demo.toml for the measured cost); the target f_l(x) is
  computed once on the clean input x, as the paper's code did, so both feature maps have the
  same shape;
- Adam, learning rate 5e-2, ``steps`` steps (512, the paper's), or per layer from ``steps_by_layer``
  (the paper's code: ``{ layer4 = 1024 }``); layers with different step counts are rendered by
  separate optimisations;
- randomness (``noise``): "shared", one random start and one augmentation draw per step for the
  whole batch from the batch's seed, the same for every model (a paired design); or "per_model",
  each (model, image, layer) row its own start and draws, seeded from the seed, the model's key,
  the image's position and the layer (the paper's unseeded calls were independent, and a rerun
  here gives the same bits); with ``transforms = "lucent"`` each such row goes through lucent's
  chain alone, numpy's global generator swapped for the row's own for the call;
- ``quantize``: "round" to the nearest uint8, or "floor" as the paper's ``uint8(vis * 255)``.
The models take [0, 1] images and normalise them themselves, so lucent's ImageNet preprocessing
is not applied.

Why not ``render_vis``: it optimises one objective for one batch and hooks every module. Here
ONE optimisation renders every (layer, image) pair of a batch: L x n parameterised images, a
group of n rows per layer, row i of layer l's group maximising layer l's term for image i (the
groups are ordered deepest layer first, see below; results come back in the order of ``layers``).
Rows never interact (BatchNorm is in eval mode,
Adam is per-parameter, the loss is a sum of per-row terms), except that with ``noise = "shared"``
lucent's transforms draw one random jitter/scale/rotation per step for the whole batch; so the
result depends on which images share a batch, and the batch size is recorded with the result
(``batch_invariant``).

Cost: rows for an early layer are dropped from the batch once the block holding that layer has
run (``StagedForward``), so they pay neither for the later blocks nor for their backward; one
batch then costs what the per-layer renders would cost with an early exit, minus per-step
overheads that batching shares.

Diagnostics per (layer, image), measured on the un-augmented image before and after optimising:
``objective_initial``, ``objective_final`` and ``cosine_final``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated, Callable, Literal, Sequence, get_args

import numpy as np
import torch
import torch.nn.functional as F
from lucent.optvis import param as lucent_param
from torch import nn
from torchvision.models.resnet import ResNet

from counteraudit.explain.base import (METHODS, BatchContext, BatchOutput, VisualizationMethod,
                                       architecture_default, model_device)
from counteraudit.explain.caricature_transforms import AUGMENTATIONS
from counteraudit.train.core.params import added, at_most
from counteraudit.explain.render import to_uint8
from counteraudit.train.architectures import Classifier, layer_name, resolve_layer
from counteraudit.train.core import size_bounds as bounds
from counteraudit.train.core.artifacts import derive_seed

# lucid's floor on the cosine in its cosine-weighted dot objectives.
COSINE_FLOOR = 0.1
Noise = Literal["shared", "per_model"]
NOISES = get_args(Noise)
LUCENT_SD = 0.01  # lucent's param.image start: a normal spectrum times this
Quantization = Literal["round", "floor"]
QUANTIZATIONS = get_args(Quantization)
TRANSFORM_PATHS = tuple(AUGMENTATIONS)
TransformPath = Literal[TRANSFORM_PATHS]  # Literal[(a, b)] is Literal[a, b]: one valid value per name


def forward_stages(model: nn.Module) -> list[Callable[[torch.Tensor], torch.Tensor]]:
    """The model's forward as a sequence of steps: a Classifier with a torchvision ResNet
    backbone is split into normalisation, stem modules, each residual block and the head (the
    same operations as its forward); any other model is one step."""
    backbone = getattr(model, "backbone", None)
    if not (isinstance(model, Classifier) and isinstance(backbone, ResNet)):
        return [model]
    return [lambda x: (x - model.mean) / model.std,
            backbone.conv1, backbone.bn1, backbone.relu, backbone.maxpool,
            *backbone.layer1, *backbone.layer2, *backbone.layer3, *backbone.layer4,
            backbone.avgpool, lambda x: torch.flatten(x, 1), backbone.fc]


def stage_index(stages: Sequence[Callable], module: nn.Module) -> int:
    """Position of the forward step that contains ``module``."""
    for index, stage in enumerate(stages):
        if isinstance(stage, nn.Module) and any(m is module for m in stage.modules()):
            return index
    raise ValueError(f"layer {module} is not inside any step of this model's forward")


class StagedForward:
    """Runs a batch whose rows are grouped by layer and returns each group's layer output,
    dropping a group's rows as soon as the step holding its layer has run.

    ``modules[g]`` is group g's layer; the groups must be ordered by the step holding their layer,
    deepest first (``depth_order`` gives that order), so the groups to drop are always the last
    rows of the batch and every group keeps its row offset until its layer has fired.
    """

    def __init__(self, model: nn.Module, modules: Sequence[nn.Module], rows_per_group: int):
        self.model = model
        self.stages = forward_stages(model)
        self.modules = list(modules)
        self.rows_per_group = rows_per_group
        self.group_stage = [stage_index(self.stages, m) for m in self.modules]
        if self.group_stage != sorted(self.group_stage, reverse=True):
            raise ValueError("StagedForward needs its layers ordered deepest first; see depth_order")
        self.outputs: dict[int, torch.Tensor] = {}
        self.handles = [m.register_forward_hook(self._keep) for m in self.modules]

    def _keep(self, module: nn.Module, _inputs, output: torch.Tensor) -> None:
        self.outputs[id(module)] = output

    def __call__(self, images: torch.Tensor) -> list[torch.Tensor]:
        """Layer output of each group, (rows_per_group, ...) each, in group order."""
        self.outputs.clear()
        x = images
        last_group = len(self.modules)  # groups [0, last_group) are still in the batch
        for index, stage in enumerate(self.stages):
            x = stage(x)
            while last_group > 0 and self.group_stage[last_group - 1] == index:
                last_group -= 1
            if last_group == 0:
                break
            x = x[:last_group * self.rows_per_group]
        n = self.rows_per_group
        return [self.outputs[id(m)][g * n:(g + 1) * n] for g, m in enumerate(self.modules)]

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


def depth_order(model: nn.Module, modules: Sequence[nn.Module]) -> list[int]:
    """Indices of ``modules`` sorted by the forward step holding them, deepest first (stable)."""
    stages = forward_stages(model)
    return sorted(range(len(modules)), key=lambda i: -stage_index(stages, modules[i]))


def caricature_objective(features: list[torch.Tensor], target_features: list[torch.Tensor],
                         cossim_pow: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Objective and cosine per (layer, image), both (L, n).

    ``features[l]`` is layer l on the n images optimised for it, ``target_features[l]`` layer l
    on the n real images.
    """
    objectives, cosines = [], []
    for rendered, target in zip(features, target_features):
        rendered = rendered.flatten(1)
        target = target.flatten(1)
        dot = (rendered * target).sum(dim=1)
        cosine = dot / (rendered.norm(dim=1) * target.norm(dim=1) + 1e-6)
        objective = dot if cossim_pow == 0 else dot * cosine.clamp(min=COSINE_FLOOR) ** cossim_pow
        objectives.append(objective)
        cosines.append(cosine)
    return torch.stack(objectives), torch.stack(cosines)


@METHODS.register
class Caricature(VisualizationMethod):
    name = "caricature"
    default_batch_size = 4  # images per optimisation; the batch holds L x 4 parameterised images
    batch_invariant = False
    version = 2  # 2: lucent's augmentations as one resampling (explain/caricature_transforms.py)

    @dataclass(frozen=True)
    class Params:
        layers: tuple[str, ...] | None = None  # addresses "(2,2,1)"...; None: the architecture's
        steps: Annotated[int, at_most(bounds.PASSES)] = 512
        learning_rate: float = 5e-2
        cossim_pow: float = 0.0
        seed: int = 0
        # Steps for the layers whose module name starts with a key (the longest matching key
        # wins; other layers take `steps`): the paper's code used { layer4 = 1024 }.
        steps_by_layer: dict[str, Annotated[int, at_most(bounds.PASSES)]] | None = added(None)
        # The parameterised image's side (lucent's render_vis: param.image(128), then upsampled
        # to the model's input); None: the input's size. The result has the canvas's size.
        canvas: Annotated[int, at_most(bounds.IMAGE_SIDE)] | None = added(None)
        # "shared": every model renders an image from the same random start and augmentation
        # draws (one draw per step for the whole batch; a paired design); "per_model": each
        # (model, image, layer) its own start and draws, seeded from the seed, the model's key,
        # the image's position and the layer, as the paper's unseeded render_vis calls were
        # independent.
        noise: Noise = added("shared")
        # Float [0, 1] -> uint8: "round" (nearest), or "floor" as the paper's
        # uint8(vis * 255).
        quantize: Quantization = added("round")
        # The augmentation of every step (explain/caricature_transforms.py): "lucent", lucent's
        # own standard_transforms and render_vis's upsample to the input (the original code's
        # pixels); "fused", the same draws as one resampling (faster on a CPU, slightly sharper).
        # "fused" is what results before this option were computed with, so it keeps their keys.
        transforms: TransformPath = added("fused")

    def resolve(self, architecture: str | None) -> Params:
        layers = self.params.layers or architecture_default(
            architecture, "caricature_layers", self.name, "layers")
        return replace(self.params, layers=tuple(layers))

    def steps_for(self, layer: str) -> int:
        """The steps of one layer (``steps_by_layer``, else ``steps``)."""
        name = layer_name(layer)
        keys = [key for key in (self.params.steps_by_layer or {}) if name.startswith(key)]
        return self.params.steps_by_layer[max(keys, key=len)] if keys else self.params.steps

    def passes_per_image(self, architecture: str | None) -> float:
        return float(sum(self.steps_for(layer) for layer in self.resolve(architecture).layers))

    def visualize(self, model: nn.Module, images: torch.Tensor, targets: torch.Tensor,
                  context: BatchContext) -> BatchOutput:
        """Layers with the same number of steps are rendered by one optimisation (one for all
        layers unless ``steps_by_layer`` gives some more steps), then put back in the order of
        ``layers``."""
        params = self.params_for(model)
        if min(self.steps_for(layer) for layer in params.layers) < 1:
            raise ValueError(f"caricature steps must be >= 1, got steps = {params.steps}, "
                             f"steps_by_layer = {params.steps_by_layer}")
        if params.noise == "per_model" and context.model_id is None:
            raise ValueError("caricature noise = 'per_model' draws each model's noise from its "
                             "key: pass run(..., model_id=...) (the explain stage does)")
        device = model_device(model)
        if device != torch.device(lucent_param.spatial.device):
            raise ValueError(f"lucent creates its tensors on {lucent_param.spatial.device} but the "
                             f"model is on {device}; move the model there first")
        groups: dict[int, list[int]] = {}  # steps -> indices into params.layers
        for index, layer in enumerate(params.layers):
            groups.setdefault(self.steps_for(layer), []).append(index)
        results = {}
        for steps, indices in sorted(groups.items(), reverse=True):
            rendered, diagnostics = self._render(model, images, [params.layers[i] for i in indices],
                                                 steps, params, context)
            for g, index in enumerate(indices):
                results[index] = (rendered[g], {k: v[g] for k, v in diagnostics.items()})
        rendered = torch.stack([results[i][0] for i in range(len(params.layers))])
        rendered = rendered.permute(0, 1, 3, 4, 2).cpu().numpy()
        return BatchOutput(
            images=to_uint8(rendered) if params.quantize == "round" else floor_uint8(rendered),
            layers=tuple(params.layers),
            diagnostics={key: torch.stack([results[i][1][key] for i in range(len(params.layers))]
                                          ).cpu().numpy() for key in DIAGNOSTICS})

    def _render(self, model: nn.Module, images: torch.Tensor, layers: list[str], steps: int,
                params: Params, context: BatchContext
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One optimisation of every (layer, image) pair of ``layers``: rendered canvases
        (L, n, 3, side, side) and each diagnostic (L, n), in the order of ``layers``."""
        num_layers, n = len(layers), len(images)
        height, width = images.shape[-2:]
        canvas_height, canvas_width = (params.canvas, params.canvas) if params.canvas \
            else (height, width)
        modules = [resolve_layer(model, layer) for layer in layers]
        # Row group g of the batch renders layer order[g]; results are put back in `layers`
        # order at the end.
        order = depth_order(model, modules)
        modules = [modules[i] for i in order]
        recorder = StagedForward(model, modules, rows_per_group=n)
        try:
            with torch.no_grad():
                targets_batch = images.repeat(num_layers, 1, 1, 1)  # layer g's group: the images
                target_features = [f.detach() for f in recorder(targets_batch)]
            spectrum, image_f = lucent_param.image(canvas_width, h=canvas_height,
                                                   batch=num_layers * n)
            generators = None
            if params.noise == "per_model":
                row_seeds = [derive_seed(params.seed, "caricature", context.model_id, position,
                                         layer_name(layers[order[g]]))
                             for g in range(num_layers) for position in context.positions]
                per_row_start(spectrum[0], row_seeds)
                generators = [np.random.RandomState(s % 2**32) for s in row_seeds]
            optimizer = torch.optim.Adam(spectrum, lr=params.learning_rate)
            augment = AUGMENTATIONS[params.transforms](canvas_height, canvas_width,
                                                      (height, width), generators)
            resize = resize_to(height, width)

            def measure() -> tuple[torch.Tensor, torch.Tensor]:
                with torch.no_grad():
                    return caricature_objective(recorder(resize(image_f())), target_features,
                                                params.cossim_pow)

            objective_initial, _ = measure()
            for _ in range(steps):
                optimizer.zero_grad()
                objective, _ = caricature_objective(recorder(augment(image_f())),
                                                    target_features, params.cossim_pow)
                (-objective.sum()).backward()
                optimizer.step()
            objective_final, cosine_final = measure()
            with torch.no_grad():
                rendered = image_f().reshape(num_layers, n, 3, canvas_height, canvas_width)
        finally:
            recorder.close()
        back = torch.as_tensor(order).argsort()  # group of each layer of `layers`
        return rendered[back], {"objective_initial": objective_initial[back],
                                "objective_final": objective_final[back],
                                "cosine_final": cosine_final[back]}


DIAGNOSTICS = ("objective_initial", "objective_final", "cosine_final")


def per_row_start(spectrum: torch.Tensor, row_seeds: list[int]) -> None:
    """Replace lucent's random start (``fft_image``: a normal spectrum times sd 0.01, drawn for
    the whole batch from torch's global generator) by one drawn per row from the row's seed."""
    with torch.no_grad():
        for row, seed in enumerate(row_seeds):
            generator = torch.Generator().manual_seed(seed)
            spectrum[row] = (torch.randn(spectrum.shape[1:], generator=generator) * LUCENT_SD
                             ).to(spectrum.device)


def resize_to(height: int, width: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The un-augmented canvas as the model sees it: bilinearly resized to the input size (align
    corners, as render_vis's upsample), or unchanged if it has that size."""
    def resize(canvas: torch.Tensor) -> torch.Tensor:
        if tuple(canvas.shape[-2:]) == (height, width):
            return canvas
        return F.interpolate(canvas, size=(height, width), mode="bilinear", align_corners=True)
    return resize


def floor_uint8(images: np.ndarray) -> np.ndarray:
    """Float images in [0, 1] -> uint8 as the paper's code saved them: ``uint8(vis * 255)``
    (float32, truncated)."""
    return (np.asarray(images, np.float32) * 255).astype(np.uint8)
