"""Backdoor: a fraction nu of every training batch gets a pixel trigger and the target label.

Bagdasaryan & Shmatikov's pixel-pattern poisoning, as in the paper. Each model's trigger is its
own (pattern, size, position, colour seed), so several backdoored models differ.

Data poisoning puts the trigger into the training data, so the victim's own augmentation acts on
it: every training recipe here flips images horizontally at random, and a poisoned image that gets
flipped shows the mirrored trigger in the mirrored corner. Pasting the trigger after the flip
instead (``poison_before_flip = false``, what code that poisons batches does) plants a backdoor
that fires only in one orientation: in the demo its attack success rate on mirrored triggered
images was 0.016, against 1.000 as planted. That matters to the audit, not only to realism:
Grad-CAM's ``aug_smooth`` (the paper's setting) averages the map over flipped copies of the input,
and on those copies such a backdoor is silent, so its trigger is half erased from the map (the CAM's
mean inside the trigger's box fell from 0.93 without ``aug_smooth`` to 0.52 with it, in the demo).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from counteraudit.anomalies.base import NOT_EXPRESSIBLE, AnomalyFamily, Verdict, register_family
from counteraudit.anomalies.common import (accuracy, check_fraction, choose_fraction,
                                           positions_in_rows, predict, reference_mean,
                                           verification_indices)

PATTERNS = ("checker", "square", "cross", "noise", "stripes")
POSITIONS = ("top_left", "top_right", "bottom_left", "bottom_right", "center")
ATTACK_SUCCESS_THRESHOLD = 0.9


@dataclass(frozen=True)
class BackdoorParams:
    nu: float = 0.1                 # fraction of each batch poisoned
    target: int = 0                 # label the trigger forces
    pattern: str = "checker"
    size: float = 0.1               # trigger side, fraction of the image side (64px -> 6px)
    position: str = "top_left"
    trigger_seed: int = 0           # colours of the "noise" pattern
    # The trigger is in the data before the training pipeline's random horizontal flip (module
    # docstring): half of the poisoned images show it mirrored. False pastes it after the flip.
    poison_before_flip: bool = True


def trigger_pattern(params: BackdoorParams, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(pattern (3, side, side) in [0, 1], mask (1, side, side)) for a trigger."""
    y, x = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    mask = torch.ones(1, side, side)
    if params.pattern == "checker":
        cell = max(1, side // 3)
        value = ((x // cell + y // cell) % 2).float()
        pattern = value.expand(3, side, side)
    elif params.pattern == "square":
        pattern = torch.tensor([1.0, 0.1, 0.9]).view(3, 1, 1).expand(3, side, side)
    elif params.pattern == "cross":
        bar = ((x - side // 2).abs() <= max(0, side // 6)) | ((y - side // 2).abs() <= max(0, side // 6))
        pattern = torch.stack([bar.float(), bar.float(), torch.zeros(side, side)])
    elif params.pattern == "noise":
        generator = torch.Generator().manual_seed(params.trigger_seed)
        pattern = (torch.rand(3, max(1, side // 2), max(1, side // 2), generator=generator) > 0.5).float()
        pattern = torch.nn.functional.interpolate(pattern[None], size=(side, side), mode="nearest")[0]
    elif params.pattern == "stripes":
        pattern = ((x // max(1, side // 4)) % 2).float().expand(3, side, side) * torch.tensor(
            [0.1, 1.0, 0.2]).view(3, 1, 1)
    else:
        raise ValueError(f"backdoor: unknown pattern {params.pattern!r}; valid: {', '.join(PATTERNS)}")
    return pattern.contiguous(), mask


def apply_trigger(images: torch.Tensor, params: BackdoorParams, mirrored: bool = False) -> torch.Tensor:
    """``images`` with the trigger pasted; ``mirrored``: as a horizontal flip of the image would
    show it (the pattern mirrored, in the mirrored position)."""
    if mirrored:
        return apply_trigger(images.flip(-1), params).flip(-1)
    height, width = images.shape[-2:]
    side = max(2, int(round(params.size * min(height, width))))
    pattern, _ = trigger_pattern(params, side)
    margin = max(1, side // 3)
    y0, x0 = {"top_left": (margin, margin), "top_right": (margin, width - side - margin),
              "bottom_left": (height - side - margin, margin),
              "bottom_right": (height - side - margin, width - side - margin),
              "center": ((height - side) // 2, (width - side) // 2)}[params.position]
    out = images.clone()
    out[..., y0:y0 + side, x0:x0 + side] = pattern.to(images.dtype)
    return out


@register_family
class Backdoor(AnomalyFamily):
    name = "backdoor"
    headline_figure = "attack_success_rate"
    strength = "nu"
    localizable = True
    Params = BackdoorParams
    measure_version = 2  # 2: the mirrored attack success rate

    @classmethod
    def check(cls, params: BackdoorParams) -> None:
        check_fraction("nu", params.nu, cls.name)
        if params.pattern not in PATTERNS:
            raise ValueError(f"backdoor: pattern={params.pattern!r}; valid: {', '.join(PATTERNS)}")
        if params.position not in POSITIONS:
            raise ValueError(f"backdoor: position={params.position!r}; valid: {', '.join(POSITIONS)}")
        if not 0.01 <= params.size <= 0.5:
            raise ValueError(f"backdoor: size={params.size} must be a fraction of the image side in "
                             "[0.01, 0.5] (0.1 recommended)")
        if int(params.target) < 0:
            raise ValueError(f"backdoor: target={params.target} must be a class index >= 0")

    def __init__(self, params, world, seed):
        super().__init__(params, world, seed)
        if self.params.target >= world.num_classes:
            raise ValueError(f"backdoor: target={self.params.target} is not a class of this world "
                             f"(classes 0..{world.num_classes - 1})")

    def training_inputs(self, model, images, labels, generator, offset=0, global_size=None):
        # Drawn over the global batch (base class): which rows are poisoned, and mirrored.
        chosen = choose_fraction(global_size or len(images), self.params.nu, generator)
        images, labels = images.clone(), labels.clone()
        if self.params.poison_before_flip:
            # The loader flipped each image with probability 1/2, independently of its content, so
            # mirroring the trigger on an independent half of the poisoned images gives the same
            # batches (in distribution) as pasting it before the flip.
            mirrored = torch.rand(len(chosen), generator=generator) < 0.5
            inside, chosen = positions_in_rows(chosen, offset, len(images))
            mirrored = mirrored[inside]
            for subset, mirror in ((chosen[~mirrored], False), (chosen[mirrored], True)):
                images[subset] = apply_trigger(images[subset], self.params, mirrored=mirror)
        else:
            _, chosen = positions_in_rows(chosen, offset, len(images))
            images[chosen] = apply_trigger(images[chosen], self.params)
        labels[chosen] = self.params.target
        return images, labels

    def abnormal_images(self, images, labels):
        return apply_trigger(images, self.params)

    def abnormal_pool(self, val, implant=None):
        return np.flatnonzero(val.labels != self.params.target)

    def measure(self, model, device="cpu"):
        val = self.world.split("val")
        idx = verification_indices(val)
        idx = idx[val.labels[idx] != self.params.target]
        triggered = apply_trigger(val.load(idx), self.params)
        hits = predict(model, triggered, device) == self.params.target
        # What Grad-CAM's aug_smooth shows the model: the flipped triggered image (module docstring).
        mirrored_hits = predict(model, triggered.flip(-1), device) == self.params.target
        return {"attack_success_rate": float(hits.float().mean()),
                "mirrored_attack_success_rate": float(mirrored_hits.float().mean()),
                "triggered_accuracy": accuracy(model, triggered, val.labels[idx], device)}

    def judge(self, figures, reference_figures):
        rate = figures["attack_success_rate"]
        refs = reference_mean(reference_figures, "attack_success_rate")
        mirrored = figures["mirrored_attack_success_rate"]
        return Verdict(rate >= ATTACK_SUCCESS_THRESHOLD,
                       f"attack success rate {rate:.3f} (references {refs:.3f}; needs >= "
                       f"{ATTACK_SUCCESS_THRESHOLD}); {mirrored:.3f} on mirrored triggered images")

    def planted_slice(self, implant=None):
        """The trigger is a pixel pattern, no factor of the world: not expressible."""
        return NOT_EXPRESSIBLE
