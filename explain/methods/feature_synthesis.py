"""Feature synthesis with lucent: for each class c, an image that maximises the model's logit f_c.

A *model-level* method (``ExplanationMethod.model_level``): it explains the model, not an image.
The explain stage runs it on the ``classes`` set of the suite's world (anomalies/image_sets.py):
one row per class, its label the class, its pixels a constant canvas that is never looked at; so
a model's result is C images, row c the synthesis of class c. Detection (Table 1) scores these C
images as it scores the detection images of the other methods (the anomaly score per class, the
references leave-one-out, the same rule); localization (Table 2) does not apply to it and is
marked "not applicable".

The optimisation is lucent's ``render_vis`` recipe, as Caricatures use it
(explain/methods/caricature.py):
- parameterisation ``param.image``: FFT spectrum with 1/f scaling, decorrelated colours, sigmoid,
  at the input's size (the world's image size);
- objective: the class's logit, ``objectives.channel(<logit layer>, c)`` in lucent's terms, read
  from the model's forward directly (the models take [0, 1] images and normalise them
  themselves, so lucent's ImageNet preprocessing is not applied);
- augmentation: lucent's ``standard_transforms`` every step, "fused" into one resampling or
  lucent's own chain (``transforms``, explain/caricature_transforms.py);
- Adam, learning rate 5e-2, ``steps`` steps.

Rows are independent, bit for bit: each class is optimised alone (its own forward and backward;
a batch shares nothing, so ``batch_invariant`` holds exactly, not only up to the reduction order
a batched convolution picks), from its own random start and its own augmentation draws, seeded
from ``seed`` and the class index. The seed does not involve the model: every model starts each
class from the same noise and sees the same augmentations (a paired design, as Caricatures'
``noise = "shared"``), so two models' images differ by what the models compute.

Diagnostics per class, measured on the un-augmented image before and after optimising:
``logit_initial``, ``logit_final``, ``probability_initial``, ``probability_final`` (softmax).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import numpy as np
import torch
from lucent.optvis import param as lucent_param
from torch import nn

from counteraudit.explain.base import (METHODS, BatchContext, BatchOutput, VisualizationMethod,
                                       model_device)
from counteraudit.explain.caricature_transforms import AUGMENTATIONS
from counteraudit.explain.methods.caricature import TransformPath, per_row_start
from counteraudit.train.core.params import added, at_most
from counteraudit.explain.render import to_uint8
from counteraudit.train.core import size_bounds as bounds
from counteraudit.train.core.artifacts import derive_seed

DIAGNOSTICS = ("logit_initial", "logit_final", "probability_initial", "probability_final")


@METHODS.register
class FeatureSynthesis(VisualizationMethod):
    """Class-logit feature visualisation (lucent), one image per class of the world (module
    docstring); a model-level method: detection only, localization not applicable."""
    name = "feature_synthesis"
    model_level = True
    default_batch_size = 16  # classes per call of ``visualize``; each is optimised alone

    @dataclass(frozen=True)
    class Params:
        """steps: Adam steps per class (lucent's render_vis: 512 thresholds, kept by the zoo
        suite). Measured on a 10-class small_resnet at 64 px, one thread, "fused" transforms, on
        a shared 2-core AMD EPYC (2026-11-26): 1.48 CPU s per class at 512 steps (2.9 ms a
        step; evaluate/benchmarks/methods.py measured 1.83), so the zoo's 10 classes x 17
        models cost 4.2 to 5.2 CPU minutes; "lucent" transforms cost about 1.4x as much.
        learning_rate: Adam's, lucent's 5e-2.
        seed: each class's random start and augmentation draws come from (seed, class index),
        the same for every model (a paired design).
        transforms: "fused", lucent's standard_transforms as one resampling (faster on a CPU),
        or "lucent", lucent's own chain (explain/caricature_transforms.py)."""
        steps: Annotated[int, at_most(bounds.PASSES)] = 512
        learning_rate: float = 5e-2
        seed: int = 0
        transforms: TransformPath = added("fused")

        def __post_init__(self) -> None:
            if self.steps < 1:
                raise ValueError(f"steps = {self.steps!r}: feature_synthesis needs a positive "
                                 "budget of optimisation steps per class; set steps in "
                                 "[methods.feature_synthesis] (default 512, lucent's)")

    def passes_per_image(self, architecture: str | None) -> float:
        return float(self.params.steps)

    def visualize(self, model: nn.Module, images: torch.Tensor, targets: torch.Tensor,
                  context: BatchContext) -> BatchOutput:
        device = model_device(model)
        if device != torch.device(lucent_param.spatial.device):
            raise ValueError(f"lucent creates its tensors on {lucent_param.spatial.device} but the "
                             f"model is on {device}; move the model there first")
        height, width = images.shape[-2:]
        rendered, diagnostics = [], []
        for target in targets.tolist():
            image, values = self._synthesize(model, int(target), height, width)
            rendered.append(image)
            diagnostics.append(values)
        return BatchOutput(
            images=to_uint8(torch.cat(rendered).permute(0, 2, 3, 1).cpu().numpy()),
            diagnostics={key: np.array([d[key] for d in diagnostics], np.float32)
                         for key in DIAGNOSTICS})

    def _synthesize(self, model: nn.Module, target: int, height: int, width: int
                    ) -> tuple[torch.Tensor, dict[str, float]]:
        """One class's image (1, 3, H, W) in [0, 1] and its diagnostics."""
        params = self.params
        row_seed = derive_seed(params.seed, self.name, target)
        spectrum, image_f = lucent_param.image(width, h=height, batch=1)
        per_row_start(spectrum[0], [row_seed])
        augment = AUGMENTATIONS[params.transforms](
            height, width, (height, width), [np.random.RandomState(row_seed % 2**32)])
        optimizer = torch.optim.Adam(spectrum, lr=params.learning_rate)

        def measure() -> tuple[float, float]:
            with torch.no_grad():
                logits = model(image_f())
            if not 0 <= target < logits.shape[1]:
                raise ValueError(f"feature_synthesis: class {target} is not one of the model's "
                                 f"{logits.shape[1]} outputs; it explains the rows of the "
                                 "'classes' set, one per class of the world")
            return (float(logits[0, target]), float(logits.softmax(dim=1)[0, target]))

        logit_initial, probability_initial = measure()
        for _ in range(params.steps):
            optimizer.zero_grad()
            (-model(augment(image_f()))[0, target]).backward()
            optimizer.step()
        logit_final, probability_final = measure()
        with torch.no_grad():
            image = image_f().detach()
        return image, {"logit_initial": logit_initial, "logit_final": logit_final,
                       "probability_initial": probability_initial,
                       "probability_final": probability_final}
