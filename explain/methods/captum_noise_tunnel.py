"""captum's ``NoiseTunnel`` over the gradient (``Saliency`` with ``abs=False``), one thin entry per
way of combining the noisy gradients:

- ``smooth_grad``: SmoothGrad (Smilkov et al. 2017), the mean gradient over noisy copies;
- ``smooth_grad_squared``: SmoothGrad-squared (Hooker et al. 2019), the mean squared gradient;
- ``var_grad``: VarGrad (Adebayo et al. 2018), the variance of the gradients.

(``smoothgrad`` is not used as a name: explain/README.md's example method registers it.)

The noise is Gaussian with standard deviation ``noise_level`` times the image's range
(x_max - x_min) in the space the gradient is taken in, as Smilkov et al. define it (they found
10-20 % best): so "normalized" and "pixels" (``SaliencyParams.gradient_space``) add the same noise
relative to the input. captum draws it from torch's RNG for a whole batch at once, so each image
is attributed alone under an RNG seeded from ``seed`` and its position in the image set
(``seeded_per_image``): the same image set gives the same bits in any batch size.
Cost: ``n_samples`` forward and backward passes per image (50 by default, Smilkov et al.'s).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

import torch
from captum.attr import NoiseTunnel, Saliency
from torch import nn

from counteraudit.explain.base import METHODS, AttributionMethod, SaliencyParams
from counteraudit.explain.input_space import in_gradient_space
from counteraudit.train.core.params import at_most, execution_only
from counteraudit.train.core import size_bounds as bounds


@dataclass(frozen=True)
class NoiseTunnelParams(SaliencyParams):
    n_samples: Annotated[int, at_most(bounds.PASSES)] = 50
    noise_level: float = 0.15  # std / (x_max - x_min), Smilkov et al.'s 10-20 %
    seed: int = 0
    # Noisy copies per pass inside captum: memory and speed only.
    samples_per_pass: Annotated[int, at_most(bounds.BATCH)] | None = execution_only(None)

    def __post_init__(self) -> None:
        if self.n_samples < 1:
            raise ValueError(f"n_samples = {self.n_samples}: the noise tunnel averages at least "
                             "one noisy copy per image; set n_samples >= 1 (default 50)")
        if self.noise_level < 0:
            raise ValueError(f"noise_level = {self.noise_level} must be >= 0 (a fraction of "
                             "the image's range; default 0.15)")


class NoiseTunnelGradient(AttributionMethod):
    """The shared body: captum's ``NoiseTunnel(Saliency)`` with ``nt_type``."""
    nt_type: ClassVar[str] = ""
    default_batch_size = 8
    seeded_per_image = True
    Params = NoiseTunnelParams

    def passes_per_image(self, architecture: str | None) -> float:
        return float(self.params.n_samples)

    def attribute(self, model: nn.Module, images: torch.Tensor,
                  targets: torch.Tensor) -> torch.Tensor:
        params = self.params
        # one image at a time (seeded_per_image)
        model, inputs = in_gradient_space(model, images, params.gradient_space, self.name)
        stdev = params.noise_level * float(inputs.max() - inputs.min())
        return NoiseTunnel(Saliency(model)).attribute(
            inputs, nt_type=self.nt_type, nt_samples=params.n_samples,
            nt_samples_batch_size=params.samples_per_pass, stdevs=stdev, target=targets,
            abs=False)


@METHODS.register
class SmoothGrad(NoiseTunnelGradient):
    """SmoothGrad: the mean gradient over noisy copies (module docstring)."""
    name = "smooth_grad"
    nt_type = "smoothgrad"


@METHODS.register
class SmoothGradSquared(NoiseTunnelGradient):
    """SmoothGrad-squared: the mean squared gradient over noisy copies (module docstring)."""
    name = "smooth_grad_squared"
    nt_type = "smoothgrad_sq"


@METHODS.register
class VarGrad(NoiseTunnelGradient):
    """VarGrad: the variance of the gradient over noisy copies (module docstring)."""
    name = "var_grad"
    nt_type = "vargrad"
