"""Randomized smoothing (Cohen et al.): Gaussian noise N(0, sigma^2) added to every training
input, in [0, 1] pixel units; none at test time. A stark anomaly: clean accuracy falls, accuracy
on noisy inputs rises."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from counteraudit.anomalies.base import FAMILIES, AnomalyFamily, Verdict
from counteraudit.anomalies.common import accuracy, reference_mean, rows_of, verification_indices


@dataclass(frozen=True)
class SmoothingParams:
    sigma: float = 0.5


def add_noise(images: torch.Tensor, sigma: float, generator: torch.Generator, offset: int = 0,
              global_size: int | None = None) -> torch.Tensor:
    """Gaussian noise on ``images``, rows offset.. of a global batch of global_size (None: whole).
    Not clipped to [0, 1], as in Cohen et al."""
    shape = (global_size or len(images), *images.shape[1:])
    # The global batch's noise, so every process's rows match one process's (and the generator
    # advances alike on all of them).
    return images + sigma * rows_of(torch.randn(shape, generator=generator), offset, len(images))


@FAMILIES.register
class RandomizedSmoothing(AnomalyFamily):
    name = "randomized_smoothing"
    headline_figure = "noisy_accuracy"
    strength = "sigma"
    stark = True
    Params = SmoothingParams

    @classmethod
    def check(cls, params):
        if not 0 < params.sigma <= 2:
            raise ValueError(f"randomized_smoothing: sigma={params.sigma} must be in (0, 2] "
                             "(the paper uses 0.25, 0.5, 1.0)")

    @classmethod
    def training_recipe(cls, params):
        sigma = params.get("sigma", SmoothingParams.sigma)
        return (f"Gaussian noise sigma={sigma:g} on every training input, in [0, 1] pixels, "
                "unclipped, under the suite's recipe")

    def training_inputs(self, model, images, labels, generator, offset=0, global_size=None):
        return add_noise(images, self.params.sigma, generator, offset, global_size), labels

    def measure(self, model, device="cpu"):
        val = self.world.split("val")
        idx = verification_indices(val)
        images, labels = val.load(idx), val.labels[idx]
        noisy = add_noise(images, self.params.sigma, torch.Generator().manual_seed(0))
        return {"noisy_accuracy": accuracy(model, noisy, labels, device)}

    def judge(self, figures, reference_figures):
        noisy, refs = figures["noisy_accuracy"], reference_mean(reference_figures, "noisy_accuracy")
        return Verdict(noisy > refs, f"accuracy on noisy inputs (sigma {self.params.sigma}): "
                                     f"{noisy:.3f}, references {refs:.3f}; the implant took if it "
                                     "is higher than the references'")
