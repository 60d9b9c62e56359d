"""Gradient-based attribution methods of captum, one thin entry each (registered under captum's
class name in snake case):

- ``saliency``: Saliency (Simonyan et al. 2014), the absolute gradient (captum's default ``abs``);
- ``input_x_gradient``: InputXGradient (Shrikumar et al. 2016), the input times its gradient;
- ``deconvolution``: Deconvolution (Zeiler & Fergus 2014), ReLUs passing positive gradients;
- ``deep_lift``: DeepLift (Shrikumar et al. 2017, captum's Rescale rule) against one reference
  image, ``baseline`` as integrated gradients' ("black" pixels, or "normalized_zero": the mean
  colour, the paper's integrated-gradients reference);
- ``deep_lift_shap``: DeepLiftShap, DeepLift averaged over ``baseline_samples`` reference images;
- ``gradient_shap``: GradientShap (Lundberg & Lee 2017; expected gradients), gradients at
  ``n_samples`` random points between the image and a reference drawn from the same references.

The references of the two SHAP methods are uniform-noise images in [0, 1] pixels (mapped into the
gradient space), drawn from the method's ``seed`` and the same for every image: SHAP averages over
a background distribution, a method here sees no training images to draw one from, and uniform
noise holds no class content and favours no colour (one black or mean-colour reference is
``deep_lift``'s).

Every method honours ``gradient_space`` (``SaliencyParams``): with "normalized" it attributes the
model's normalised input, as the paper's code did for its methods. DeepLift and Deconvolution
hook the ReLUs: the hook-safe copy every method gets (explain/explainable.py) has one non-inplace
ReLU module per use, which they need. The inputs' gradient is all they need; ``deep_lift`` and
``deep_lift_shap`` compute it on the image and its references in one pass.

LRP is not here: captum's LRP has no rule for ``nn.Identity`` (the classifier's head) and none for
the residual additions of torchvision's ResNets, which are not modules (captum documents LRP for
sequential networks only); with rules forced it would run but not conserve relevance, so it is
not registered rather than registered broken.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import torch
from captum.attr import Deconvolution as CaptumDeconvolution
from captum.attr import DeepLift as CaptumDeepLift
from captum.attr import DeepLiftShap as CaptumDeepLiftShap
from captum.attr import GradientShap as CaptumGradientShap
from captum.attr import InputXGradient as CaptumInputXGradient
from captum.attr import Saliency as CaptumSaliency
from torch import nn

from counteraudit.explain.base import METHODS, AttributionMethod, SaliencyParams
from counteraudit.explain.input_space import Baseline, baseline_image, in_gradient_space, normalization
from counteraudit.train.core.params import added, at_most
from counteraudit.train.core import size_bounds as bounds


def noise_references(model: nn.Module, count: int, seed: int, like: torch.Tensor,
                     normalized_space: bool, method: str) -> torch.Tensor:
    """``count`` uniform-noise images in [0, 1] pixels, the same for every image of every batch
    (their own generator, seeded by the method's seed), in the space the method works in."""
    generator = torch.Generator().manual_seed(seed)
    references = torch.rand(count, *like.shape[1:], generator=generator).to(like)
    if normalized_space:
        mean, std = normalization(model, method)
        references = (references - mean) / std
    return references


@METHODS.register
class Saliency(AttributionMethod):
    """captum's ``Saliency``: |d f_c / d x| (module docstring)."""
    name = "saliency"
    default_batch_size = 32
    groups_models = True

    def attribute(self, model: nn.Module, images: torch.Tensor,
                  targets: torch.Tensor) -> torch.Tensor:
        model, inputs = in_gradient_space(model, images, self.params.gradient_space, self.name)
        return CaptumSaliency(model).attribute(inputs, target=targets)


@METHODS.register
class InputXGradient(AttributionMethod):
    """captum's ``InputXGradient``: x * d f_c / d x, x in the gradient space (module docstring)."""
    name = "input_x_gradient"
    default_batch_size = 32
    groups_models = True

    def attribute(self, model: nn.Module, images: torch.Tensor,
                  targets: torch.Tensor) -> torch.Tensor:
        model, inputs = in_gradient_space(model, images, self.params.gradient_space, self.name)
        return CaptumInputXGradient(model).attribute(inputs, target=targets)


@METHODS.register
class Deconvolution(AttributionMethod):
    """captum's ``Deconvolution`` (DeconvNet): the gradient with each ReLU's backward replaced by
    a ReLU of the incoming gradient (module docstring)."""
    name = "deconvolution"
    default_batch_size = 32
    groups_models = True

    def attribute(self, model: nn.Module, images: torch.Tensor,
                  targets: torch.Tensor) -> torch.Tensor:
        model, inputs = in_gradient_space(model, images, self.params.gradient_space, self.name)
        return CaptumDeconvolution(model).attribute(inputs, target=targets)


@METHODS.register
class DeepLift(AttributionMethod):
    """captum's ``DeepLift`` (Rescale rule) against one reference image (module docstring)."""
    name = "deep_lift"
    default_batch_size = 32

    @dataclass(frozen=True)
    class Params(SaliencyParams):
        baseline: Baseline = added("black")

    def attribute(self, model: nn.Module, images: torch.Tensor,
                  targets: torch.Tensor) -> torch.Tensor:
        function, inputs = in_gradient_space(model, images, self.params.gradient_space, self.name)
        baseline = baseline_image(model, inputs, self.params.baseline,
                                  self.params.gradient_space == "normalized", self.name)
        return CaptumDeepLift(function).attribute(inputs, baselines=baseline, target=targets)


@dataclass(frozen=True)
class ShapParams(SaliencyParams):
    """baseline_samples: how many uniform-noise references (module docstring); seed: draws them."""
    baseline_samples: Annotated[int, at_most(bounds.PASSES)] = 8
    seed: int = 0

    def __post_init__(self) -> None:
        if self.baseline_samples < 1:
            raise ValueError(f"baseline_samples = {self.baseline_samples}: the SHAP methods "
                             "average over at least one reference image; set baseline_samples "
                             ">= 1 (default 8)")


@METHODS.register
class DeepLiftShap(AttributionMethod):
    """captum's ``DeepLiftShap``: DeepLift averaged over ``baseline_samples`` uniform-noise
    references; one pass over the image and all of them (module docstring)."""
    name = "deep_lift_shap"
    default_batch_size = 8
    Params = ShapParams

    def passes_per_image(self, architecture: str | None) -> float:
        return float(self.params.baseline_samples)

    def attribute(self, model: nn.Module, images: torch.Tensor,
                  targets: torch.Tensor) -> torch.Tensor:
        function, inputs = in_gradient_space(model, images, self.params.gradient_space, self.name)
        references = noise_references(model, self.params.baseline_samples, self.params.seed,
                                      inputs, self.params.gradient_space == "normalized", self.name)
        return CaptumDeepLiftShap(function).attribute(inputs, baselines=references, target=targets)


@METHODS.register
class GradientShap(AttributionMethod):
    """captum's ``GradientShap`` (expected gradients): ``n_samples`` gradients at random points
    between the image and a random one of ``baseline_samples`` uniform-noise references, times
    (image - reference); each image's draws are seeded from ``seed`` and its position."""
    name = "gradient_shap"
    default_batch_size = 8
    seeded_per_image = True

    @dataclass(frozen=True)
    class Params(ShapParams):
        n_samples: Annotated[int, at_most(bounds.PASSES)] = 50  # as integrated gradients' 50 steps: one pass each
        stdevs: float = 0.0  # captum's default: no noise added to the sampled points

        def __post_init__(self) -> None:
            super().__post_init__()
            if self.n_samples < 1:
                raise ValueError(f"n_samples = {self.n_samples}: gradient_shap needs at least "
                                 "one sample per image; set n_samples >= 1 (default 50)")

    def passes_per_image(self, architecture: str | None) -> float:
        return float(self.params.n_samples)

    def attribute(self, model: nn.Module, images: torch.Tensor,
                  targets: torch.Tensor) -> torch.Tensor:
        params = self.params
        function, inputs = in_gradient_space(model, images, self.params.gradient_space, self.name)
        references = noise_references(model, params.baseline_samples, params.seed, inputs,
                                      params.gradient_space == "normalized", self.name)
        return CaptumGradientShap(function).attribute(
            inputs, baselines=references, n_samples=params.n_samples, stdevs=params.stdevs,
            target=targets)
