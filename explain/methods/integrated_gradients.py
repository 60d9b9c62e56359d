"""Integrated Gradients (Sundararajan et al. 2017) with captum's ``IntegratedGradients``.

captum's defaults as in the paper: zero (black) baseline, 50 steps, Gauss-Legendre quadrature.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from captum.attr import IntegratedGradients as CaptumIntegratedGradients
from torch import nn

from counteraudit.explain.base import AttributionMethod, register_method
from counteraudit.explain.params import execution_only


@register_method
class IntegratedGradients(AttributionMethod):
    name = "integrated_gradients"
    default_batch_size = 16

    @dataclass(frozen=True)
    class Params:
        n_steps: int = 50
        method: str = "gausslegendre"
        # Images x steps per forward pass inside captum; memory and speed only, not the result.
        # One image's 50 steps per pass is 1.4x faster on a CPU core than 128 (64-px small
        # ResNet, batches of 16: 12.6 against 9.0 images/s, mean of 3 interleaved runs; the
        # activations stay in cache), and the rendered images are identical.
        internal_batch_size: int | None = execution_only(50)

    def passes_per_image(self, architecture: str | None) -> float:
        return float(self.params.n_steps)

    def attribute(self, model: nn.Module, images: torch.Tensor,
                  targets: torch.Tensor) -> torch.Tensor:
        return CaptumIntegratedGradients(model).attribute(
            images, baselines=torch.zeros_like(images), target=targets,
            n_steps=self.params.n_steps, method=self.params.method,
            internal_batch_size=self.params.internal_batch_size)
