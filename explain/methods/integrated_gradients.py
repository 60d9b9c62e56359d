"""Integrated Gradients (Sundararajan et al. 2017) with captum's ``IntegratedGradients``.

captum's defaults as in the paper: zero (black) baseline, 50 steps, Gauss-Legendre quadrature.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from captum.attr import IntegratedGradients as CaptumIntegratedGradients
from torch import nn

from explain.base import AttributionMethod, register_method
from explain.params import execution_only


@register_method
class IntegratedGradients(AttributionMethod):
    name = "integrated_gradients"
    default_batch_size = 8

    @dataclass(frozen=True)
    class Params:
        n_steps: int = 50
        method: str = "gausslegendre"
        # Images x steps per forward pass inside captum; memory only, not the result.
        internal_batch_size: int | None = execution_only(128)

    def passes_per_image(self, architecture: str | None) -> float:
        return float(self.params.n_steps)

    def attribute(self, model: nn.Module, images: torch.Tensor,
                  targets: torch.Tensor) -> torch.Tensor:
        return CaptumIntegratedGradients(model).attribute(
            images, baselines=torch.zeros_like(images), target=targets,
            n_steps=self.params.n_steps, method=self.params.method,
            internal_batch_size=self.params.internal_batch_size)
