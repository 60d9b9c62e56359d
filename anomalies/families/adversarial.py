"""Adversarial training (Madry et al.): every training batch replaced by its PGD adversarial
examples, l-inf or l2, budgets in [0, 1] pixel units (the paper's eps 4/255, 8/255 for l-inf and
0.01 .. 5 for l2). A stark anomaly: clean accuracy falls, accuracy under attack rises."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import torch
from pydantic import Field

from counteraudit.anomalies.base import FAMILIES, AnomalyFamily, Verdict
from counteraudit.anomalies.common import accuracy, reference_mean, rows_of, verification_indices
from counteraudit.train.core import size_bounds as bounds

NORMS = ("linf", "l2")


@dataclass(frozen=True)
class AdversarialParams:
    norm: str = "linf"
    eps: float = 8 / 255
    steps: Annotated[int, Field(le=bounds.PASSES.limit, json_schema_extra=bounds.PASSES.extra)] = 3
    step_size: float | None = None   # default 2.5 * eps / steps (Madry et al.)
    # PGD steps of the verification attack
    eval_steps: Annotated[int, Field(le=bounds.PASSES.limit, json_schema_extra=bounds.PASSES.extra)] = 10
    # val images attacked for verification (each model)
    eval_images: Annotated[int, Field(le=bounds.SET_IMAGES.limit, json_schema_extra=bounds.SET_IMAGES.extra)] = 200


def _flat_norm(x: torch.Tensor) -> torch.Tensor:
    return x.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, 1, 1, 1)


def random_start(shape: tuple[int, ...], norm: str, eps: float,
                 generator: torch.Generator) -> torch.Tensor:
    """PGD's random start for a batch of ``shape``: uniform in the L-inf ball, or uniform in
    direction and radius for L2. Drawn on the CPU from ``generator``, so any device and any number
    of processes start from the same bits."""
    if norm == "linf":
        return (torch.rand(shape, generator=generator) * 2 - 1) * eps
    noise = torch.randn(shape, generator=generator)
    return noise / _flat_norm(noise) * eps * torch.rand(shape[0], 1, 1, 1, generator=generator)


def pgd(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, norm: str, eps: float,
        steps: int, step_size: float, generator: torch.Generator, offset: int = 0,
        global_size: int | None = None) -> torch.Tensor:
    """Projected gradient ascent on the loss from a random start inside the eps-ball.

    ``images`` may be rows offset.. of a global batch of ``global_size``: the random start is
    drawn for the global batch and these rows kept, so a DDP process attacks only its own slice
    and starts where one process attacking the whole batch would (AnomalyFamily.training_inputs).
    The caller's autocast applies to the attack's passes too (the trainer runs it under the
    training's autocast)."""
    delta = random_start((global_size or len(images), *images.shape[1:]), norm, eps, generator)
    delta = rows_of(delta, offset, len(images))
    delta = (images + delta.to(images.device)).clamp(0, 1) - images
    for _ in range(steps):
        delta.requires_grad_(True)
        loss = torch.nn.functional.cross_entropy(model(images + delta), labels)
        grad, = torch.autograd.grad(loss, delta)  # input gradient only: parameters untouched
        with torch.no_grad():
            if norm == "linf":
                delta = (delta + step_size * grad.sign()).clamp(-eps, eps)
            else:
                delta = delta + step_size * grad / _flat_norm(grad)
                delta = delta * (eps / _flat_norm(delta)).clamp(max=1.0)
            delta = (images + delta).clamp(0, 1) - images
    return (images + delta).detach()


@FAMILIES.register
class Adversarial(AnomalyFamily):
    name = "adversarial"
    headline_figure = "pgd_accuracy"
    strength = "eps"
    stark = True
    training_reads_model = True  # PGD attacks the model being trained
    Params = AdversarialParams

    @classmethod
    def check(cls, params):
        if params.norm not in NORMS:
            raise ValueError(f"adversarial: norm={params.norm!r}; valid: {', '.join(NORMS)}")
        if not params.eps > 0:
            raise ValueError(f"adversarial: eps={params.eps} must be > 0 (l-inf: 4/255 or 8/255)")
        if int(params.eval_images) < 10:
            raise ValueError(f"adversarial: eval_images={params.eval_images} must be >= 10")
        if int(params.steps) < 1 or int(params.eval_steps) < 1:
            raise ValueError(f"adversarial: steps={params.steps}, eval_steps={params.eval_steps} must be >= 1")
        if params.step_size is not None and params.step_size <= 0:
            raise ValueError(f"adversarial: step_size={params.step_size} must be > 0")

    @classmethod
    def relative_training_cost(cls, params: dict) -> float:
        return 1.0 + int(params.get("steps", AdversarialParams.steps))  # PGD passes + the update

    @classmethod
    def training_recipe(cls, params):
        p = AdversarialParams(**params)
        step = f"{p.step_size:g}" if p.step_size else f"2.5*eps/{p.steps}"
        return (f"every batch replaced by its {p.norm} PGD examples, eps={p.eps:.4g} in [0, 1] "
                f"pixels, {p.steps} steps of {step}, random start, under the suite's recipe")

    def step_size(self, steps: int) -> float:
        return self.params.step_size or 2.5 * self.params.eps / steps

    def training_inputs(self, model, images, labels, generator, offset=0, global_size=None):
        p = self.params
        device = next(model.parameters()).device
        adversarial = pgd(model, images.to(device), labels.to(device), p.norm, p.eps, p.steps,
                          self.step_size(p.steps), generator, offset, global_size)
        return adversarial.cpu() if images.device.type == "cpu" else adversarial, labels

    def measure(self, model, device="cpu"):
        p = self.params
        val = self.world.split("val")
        idx = verification_indices(val, count=p.eval_images)
        images, labels = val.load(idx), torch.as_tensor(val.labels[idx])
        model.eval()
        generator = torch.Generator().manual_seed(0)
        attacked = torch.cat([
            pgd(model, images[i:i + 250].to(device), labels[i:i + 250].to(device), p.norm, p.eps,
                p.eval_steps, self.step_size(p.eval_steps), generator).cpu()
            for i in range(0, len(images), 250)])
        return {"pgd_accuracy": accuracy(model, attacked, labels, device)}

    def judge(self, figures, reference_figures):
        robust, refs = figures["pgd_accuracy"], reference_mean(reference_figures, "pgd_accuracy")
        return Verdict(robust > refs, f"accuracy on {self.params.norm} PGD inputs (eps "
                                      f"{self.params.eps:.4g}): {robust:.3f}, references {refs:.3f}; "
                                      "the implant took if it is higher than the references'")
