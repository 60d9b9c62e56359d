"""Perturbation-based attribution methods of captum, one thin entry each (registered under
captum's class name in snake case). They only evaluate the model, so they have no gradient space;
what they replace a feature with is ``baseline`` ("black" pixels, or "normalized_zero": the mean
colour, zero of the normalised input).

- ``occlusion``: Occlusion (Zeiler & Fergus 2014), a square window slid over the image;
- ``feature_ablation``: FeatureAblation, each superpixel replaced in turn;
- ``lime``: Lime (Ribeiro et al. 2016), a sparse linear model (captum's Lasso, alpha 0.01) fitted
  to the outputs on random subsets of superpixels, weighted by similarity to the image;
- ``kernel_shap``: KernelShap (Lundberg & Lee 2017), a linear model fitted with the Shapley kernel;
- ``shapley_value_sampling``: ShapleyValueSampling (Castro et al. 2009), Shapley values of the
  superpixels estimated from random permutations.

Superpixels: a fixed grid of ``grid_cells`` x ``grid_cells`` square cells (the same features for
every image and model, and for any image size; no segmentation library: SLIC would need
scikit-image, which the project does not use).

Budgets (forward passes per image; defaults give about 250 at any image size, since windows and
cells scale with the image): ``occlusion``: ((1 - window_fraction) / stride_fraction + 1)^2 =
225; ``feature_ablation``: grid_cells^2 = 64; ``lime`` and ``kernel_shap``: n_samples = 256 (plus a
fit of a 64-feature linear model); ``shapley_value_sampling``: n_samples * (grid_cells^2 + 1) =
260. A budget that is not positive is one error naming it, when the suite is read. The
random methods (lime, kernel_shap, shapley_value_sampling) draw per image, seeded from ``seed``
and the image's position (``seeded_per_image``), so any batch size gives the same bits.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import torch
from captum.attr import FeatureAblation as CaptumFeatureAblation
from captum.attr import KernelShap as CaptumKernelShap
from captum.attr import Lime as CaptumLime
from captum.attr import Occlusion as CaptumOcclusion
from captum.attr import ShapleyValueSampling as CaptumShapleyValueSampling
from torch import nn

from counteraudit.explain.base import DEFAULT_RENDERERS, METHODS, AttributionMethod, TargetParams
from counteraudit.explain.input_space import Baseline, baseline_image
from counteraudit.train.core.params import added, at_most, execution_only
from counteraudit.explain.renderers import ATTRIBUTIONS
from counteraudit.train.core import size_bounds as bounds


def check_budget(method: str, **budgets: Any) -> None:
    """One error naming the first budget that is not a positive number."""
    for key, value in budgets.items():
        if value is None or value <= 0:
            raise ValueError(f"{key} = {value!r}: {method} is a perturbation method and needs a "
                             f"positive budget; set {key} in [methods.{method}] (its default is "
                             "in explain/methods/captum_perturbation.py)")


def grid_superpixels(height: int, width: int, cells: int, device: torch.device) -> torch.Tensor:
    """(1, 1, H, W) int64 feature mask: ``cells`` x ``cells`` near-square cells, numbered row by
    row; every channel of a pixel is in its cell."""
    rows = torch.arange(height, device=device) * cells // height
    columns = torch.arange(width, device=device) * cells // width
    return (rows[:, None] * cells + columns[None, :])[None, None]


@dataclass(frozen=True)
class PerturbationParams(TargetParams):
    """What every perturbation method shares: the replaced value, the renderer, and how many
    perturbed images go through the model at once (speed and memory only)."""
    baseline: Baseline = added("black")
    renderer: str = added(DEFAULT_RENDERERS[ATTRIBUTIONS])
    renderer_options: dict[str, Any] | None = added(None)
    perturbations_per_pass: Annotated[int, at_most(bounds.BATCH)] = execution_only(64)


@dataclass(frozen=True)
class SuperpixelParams(PerturbationParams):
    grid_cells: Annotated[int, at_most(bounds.GRID)] = 8  # per side: 64 superpixels

    method_name: ClassVar[str] = "a superpixel method"  # each method's own, for its errors

    def __post_init__(self) -> None:
        check_budget(self.method_name, grid_cells=self.grid_cells)


class PerturbationMethod(AttributionMethod):
    """The shared body: the reference image, the superpixels, and captum's call."""
    default_batch_size = 8

    def reference(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        return baseline_image(model, images, self.params.baseline, False, self.name)

    def superpixels(self, images: torch.Tensor) -> torch.Tensor:
        return grid_superpixels(images.shape[2], images.shape[3], self.params.grid_cells,
                                images.device)


@METHODS.register
class Occlusion(PerturbationMethod):
    """captum's ``Occlusion``: a window of ``window_fraction`` of the image's side, moved by
    ``stride_fraction`` of it (module docstring: 225 passes per image by default)."""
    name = "occlusion"

    @dataclass(frozen=True)
    class Params(PerturbationParams):
        window_fraction: float = 0.125  # 8 px at 64 px, 28 px at 224 px
        stride_fraction: float = 0.0625

        def __post_init__(self) -> None:
            check_budget("occlusion", window_fraction=self.window_fraction,
                         stride_fraction=self.stride_fraction)
            if self.window_fraction > 1 or self.stride_fraction > 1:
                raise ValueError(f"window_fraction = {self.window_fraction} and stride_fraction "
                                 f"= {self.stride_fraction} are fractions of the image's side: "
                                 "set them in (0, 1] in [methods.occlusion]")

    def passes_per_image(self, architecture: str | None) -> float:
        return ((1 - self.params.window_fraction) / self.params.stride_fraction + 1) ** 2

    def attribute(self, model: nn.Module, images: torch.Tensor,
                  targets: torch.Tensor) -> torch.Tensor:
        side = min(images.shape[2:])
        window = max(1, round(self.params.window_fraction * side))
        stride = max(1, round(self.params.stride_fraction * side))
        return CaptumOcclusion(model).attribute(
            images, sliding_window_shapes=(3, window, window), strides=(3, stride, stride),
            baselines=self.reference(model, images), target=targets,
            perturbations_per_eval=self.params.perturbations_per_pass)


@METHODS.register
class FeatureAblation(PerturbationMethod):
    """captum's ``FeatureAblation`` over the grid's superpixels, one pass per cell."""
    name = "feature_ablation"

    @dataclass(frozen=True)
    class Params(SuperpixelParams):
        method_name = "feature_ablation"

    def passes_per_image(self, architecture: str | None) -> float:
        return float(self.params.grid_cells ** 2)

    def attribute(self, model: nn.Module, images: torch.Tensor,
                  targets: torch.Tensor) -> torch.Tensor:
        return CaptumFeatureAblation(model).attribute(
            images, baselines=self.reference(model, images), target=targets,
            feature_mask=self.superpixels(images),
            perturbations_per_eval=self.params.perturbations_per_pass)


@dataclass(frozen=True)
class SampledSuperpixelParams(SuperpixelParams):
    n_samples: Annotated[int, at_most(bounds.PASSES)] = 256
    seed: int = 0

    def __post_init__(self) -> None:
        check_budget(self.method_name, grid_cells=self.grid_cells, n_samples=self.n_samples)


class SampledSuperpixelMethod(PerturbationMethod):
    """A method that samples perturbations of the superpixels with captum's RNG, per image."""
    seeded_per_image = True
    captum_class: type = CaptumLime

    def passes_per_image(self, architecture: str | None) -> float:
        return float(self.params.n_samples)

    def attribute(self, model: nn.Module, images: torch.Tensor,
                  targets: torch.Tensor) -> torch.Tensor:
        return self.captum_class(model).attribute(
            images, baselines=self.reference(model, images), target=targets,
            feature_mask=self.superpixels(images), n_samples=self.params.n_samples,
            perturbations_per_eval=self.params.perturbations_per_pass)


@METHODS.register
class Lime(SampledSuperpixelMethod):
    """captum's ``Lime`` over the grid's superpixels, ``n_samples`` random subsets per image."""
    name = "lime"
    captum_class = CaptumLime

    @dataclass(frozen=True)
    class Params(SampledSuperpixelParams):
        method_name = "lime"


@METHODS.register
class KernelShap(SampledSuperpixelMethod):
    """captum's ``KernelShap`` over the grid's superpixels, ``n_samples`` coalitions per image."""
    name = "kernel_shap"
    captum_class = CaptumKernelShap

    @dataclass(frozen=True)
    class Params(SampledSuperpixelParams):
        method_name = "kernel_shap"


@METHODS.register
class ShapleyValueSampling(SampledSuperpixelMethod):
    """captum's ``ShapleyValueSampling`` over the grid's superpixels: ``n_samples`` random
    permutations per image, each grid_cells^2 + 1 passes."""
    name = "shapley_value_sampling"
    captum_class = CaptumShapleyValueSampling

    @dataclass(frozen=True)
    class Params(SampledSuperpixelParams):
        n_samples: Annotated[int, at_most(bounds.PASSES)] = 4  # permutations: 4 x 65 = 260 passes with the default grid
        method_name = "shapley_value_sampling"

    def passes_per_image(self, architecture: str | None) -> float:
        return float(self.params.n_samples * (self.params.grid_cells ** 2 + 1))
