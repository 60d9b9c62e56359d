"""Neural Cleanse (Wang et al., IEEE S&P 2019): trigger reverse-engineering.

For every class t it looks for the smallest patch that sends clean images to t: a mask m (H, W)
in [0, 1] and a pattern p (3, H, W) in [0, 1], applied as ``(1 - m) * x + m * p``, optimised for
cross-entropy towards t plus ``cost * |m|_1``. A backdoor's target needs a far smaller mask than
any other class (the trigger), so the smallest norm is an outlier below the others.

- ``statistic``: the L1 norm of each class's best mask (the smallest one that reached the attack
  success threshold), in class order. A class the optimisation never reaches (a missing class's
  constant low logit) keeps its last mask's norm: large and finite.
- ``score``: the published anomaly index of the smallest norm, (median - min) / (1.4826 * MAD).
- ``flagged``: the paper's rule, anomaly index above 2 (``threshold``).
- ``mask``: the recovered mask of the smallest-norm class, to compare with the planted trigger.

Like the published method, the cost adapts (per class): it is 0 until the class is first reached,
then ``cost`` and multiplied by ``cost_up`` after ``patience`` steps that all reached the
threshold, divided by ``cost_up ** 1.5`` after ``patience`` steps that all missed it. The paper
uses Adam (lr 0.1), a threshold of 0.99, an initial cost of 1e-3, patience 5 and up to 1000
mini-batch steps per class over the whole clean set; the defaults here are a short schedule on a
subset (``images`` clean images, ``steps`` steps, every class optimised in one batch) that keeps a
64-px model within ~20 CPU-seconds. Raise ``steps`` and ``images`` for the published budget.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from counteraudit.evaluate.defect_detectors.detectors.base import DETECTORS, Detector, Evidence, Inspection

MAD_CONSISTENCY = 1.4826  # MAD of a normal sample times this estimates its standard deviation


def anomaly_index(norms: np.ndarray) -> np.ndarray:
    """Each norm's deviation below the median in units of the consistent MAD (Neural Cleanse's
    anomaly index; positive below the median). A MAD of 0 (all norms alike but for ties) is
    floored at a tiny fraction of the median so that the index stays finite."""
    norms = np.asarray(norms, dtype=np.float64)
    median = np.median(norms)
    mad = MAD_CONSISTENCY * np.median(np.abs(norms - median))
    floor = np.finfo(np.float64).eps * max(abs(median), 1.0)
    return (median - norms) / max(mad, floor)


@dataclass(frozen=True)
class NeuralCleanseParams:
    steps: int = 60             # optimisation steps (every class at once)
    images: int = 12            # clean images the trigger must flip (a subset of the evidence's)
    lr: float = 0.2             # Adam's step size on the mask's and pattern's logits
    cost: float = 1e-3          # the L1 weight once a class is first reached
    cost_up: float = 1.5        # the cost's factor up (its 1.5th power down)
    patience: int = 5           # steps between cost changes
    success: float = 0.99       # attack success a mask must reach to count
    threshold: float = 2.0      # anomaly index above which the model is flagged

    def __post_init__(self):
        for name in ("steps", "images", "patience"):
            if getattr(self, name) < 1:
                raise ValueError(f"neural_cleanse's {name} must be at least 1, got "
                                 f"{getattr(self, name)}")
        if not 0 < self.success <= 1:
            raise ValueError(f"neural_cleanse's success must be in (0, 1], got {self.success}")


@DETECTORS.register
class NeuralCleanse(Detector):
    name = "neural_cleanse"
    Params = NeuralCleanseParams
    reverse_engineers_trigger = True
    mechanism = "trigger reverse-engineering"

    def inspect(self, model: nn.Module, evidence: Evidence) -> Inspection:
        p = self.params
        images = evidence.clean_images[:p.images].float()
        classes, count = evidence.num_classes, len(images)
        height, width = evidence.image_size
        # logits of every class's mask and pattern, random (seeded by Detector.run) as published
        mask_logits = (torch.rand(classes, 1, height, width) * 2 - 4).requires_grad_()
        pattern_logits = (torch.rand(classes, 3, height, width) * 4 - 2).requires_grad_()
        optimizer = torch.optim.Adam([mask_logits, pattern_logits], lr=p.lr, betas=(0.5, 0.9))
        targets = torch.arange(classes).repeat_interleave(count)
        cost = torch.zeros(classes, dtype=torch.float64)
        reached_once = torch.zeros(classes, dtype=torch.bool)
        up_streak = torch.zeros(classes, dtype=torch.long)
        down_streak = torch.zeros(classes, dtype=torch.long)
        best_norm = torch.full((classes,), float("inf"), dtype=torch.float64)
        best_mask = torch.zeros(classes, height, width, dtype=torch.float64)
        best_success = torch.zeros(classes, dtype=torch.float64)
        for _ in range(p.steps):
            mask, pattern = torch.sigmoid(mask_logits), torch.sigmoid(pattern_logits)
            stamped = (1 - mask[:, None]) * images[None] + (mask * pattern)[:, None]
            logits = model(stamped.reshape(classes * count, 3, height, width))
            cross_entropy = F.cross_entropy(logits, targets, reduction="none").view(classes, count)
            norms = mask.flatten(1).sum(1)
            loss = (cross_entropy.mean(1) + cost.float() * norms).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                success = (logits.argmax(1) == targets).view(classes, count).double().mean(1)
                last_success = success
                reached = success >= p.success
                better = reached & (norms.double() < best_norm)
                best_norm[better] = norms.double()[better]
                best_mask[better] = mask[better, 0].double()
                best_success[better] = success[better]
                # the published schedule: cost 0 until first reached, then up on success and
                # down on failure after `patience` steps in a row
                first = reached & ~reached_once
                cost[first] = p.cost
                reached_once |= reached
                up_streak = torch.where(reached, up_streak + 1, torch.zeros_like(up_streak))
                down_streak = torch.where(reached, torch.zeros_like(down_streak), down_streak + 1)
                raise_cost = reached_once & (up_streak >= p.patience)
                lower_cost = reached_once & (down_streak >= p.patience)
                cost[raise_cost] *= p.cost_up
                cost[lower_cost] /= p.cost_up ** 1.5
                up_streak[raise_cost] = 0
                down_streak[lower_cost] = 0
        with torch.no_grad():
            last_mask = torch.sigmoid(mask_logits)[:, 0].double()
            never = ~torch.isfinite(best_norm)
            best_mask[never] = last_mask[never]
            best_norm[never] = last_mask[never].flatten(1).sum(1)
            best_success[never] = last_success[never]
        norms = best_norm.numpy()
        index = anomaly_index(norms)
        target = int(np.argmin(norms))
        return Inspection(
            statistic=norms, score=float(index[target]), flagged=bool(index[target] > p.threshold),
            mask=best_mask[target].numpy(),
            notes={"target_class": target, "anomaly_index": index.tolist(),
                   "attack_success": best_success.tolist(),
                   "reached": (~never).tolist()})
