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

The paper's six triggers (``pattern = "paper_0"`` .. ``"paper_5"``, ``position = "paper"``) are the
authors' own (``assess_utils/anom_utils.py`` of js-d/auditing-vis): small patterns of white (1),
black (0) and transparent (-10) cells whose top-left cell sits at row 3, column 23 of the image,
written into the normalised training batch after the data transforms, as the first floor(nu * B)
images of each batch (``selection = "first"``, ``poison_before_flip = false``). Models here
normalise inside their forward pass, so writing 1 or 0 into the [0, 1] batch after the transforms is
the same as writing the normalised 1 or 0 into the normalised batch: a flip never mirrors the trigger.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from counteraudit.anomalies.base import FAMILIES, NOT_EXPRESSIBLE, AnomalyFamily, Verdict
from counteraudit.anomalies.common import (accuracy, check_fraction, select_rows,
                                           positions_in_rows, predict, reference_mean,
                                           verification_indices)
from counteraudit.train.core.params import added

# The original's trigger cells: white, black, and transparent (the image shows through).
WHITE, BLACK, TRANSPARENT = 1.0, 0.0, -10.0
_W, _B, _T = WHITE, BLACK, TRANSPARENT
# The paper's six triggers, backdoor_0 .. backdoor_5 (rows x columns: 5x3 for 0-3, 3x3 for 4, 7x7
# for 5), cell for cell as in the original code.
PAPER_PATTERNS = {
    "paper_0": ((_W, _B, _W), (_T, _W, _T), (_T, _T, _B), (_T, _W, _T), (_W, _B, _W)),
    "paper_1": ((_T, _B, _T), (_W, _W, _W), (_T, _W, _T), (_B, _W, _B), (_T, _T, _W)),
    "paper_2": ((_T, _T, _T), (_W, _T, _B), (_W, _T, _W), (_B, _T, _W), (_T, _T, _W)),
    "paper_3": ((_T, _W, _B), (_W, _T, _W), (_B, _W, _W), (_W, _W, _T), (_T, _W, _W)),
    "paper_4": ((_T, _W, _T), (_B, _W, _T), (_W, _T, _W)),
    "paper_5": ((_W,) * 7, (_W, _B, _B, _B, _B, _B, _W), (_W, _B, _W, _W, _W, _B, _W),
                (_W, _B, _W, _B, _W, _B, _W), (_W, _B, _W, _W, _W, _B, _W),
                (_W, _B, _B, _B, _B, _B, _W), (_W,) * 7),
}
PATTERNS = ("checker", "square", "cross", "noise", "stripes", *PAPER_PATTERNS)
# "paper": the trigger's top-left cell at row 3, column 23 (the original's x_top, y_top), in pixels.
PAPER_POSITION = (3, 23)
POSITIONS = ("top_left", "top_right", "bottom_left", "bottom_right", "center", "paper")
# "random": round(nu * B) rows drawn at random; "first": the first floor(nu * B) rows of the
# (already shuffled) batch, as the original's poison_batch.
SELECTIONS = ("random", "first")
ATTACK_SUCCESS_THRESHOLD = 0.9


@dataclass(frozen=True)
class BackdoorParams:
    nu: float = 0.1                 # fraction of each batch poisoned
    target: int = 0                 # label the trigger forces
    pattern: str = "checker"        # or "paper_0" .. "paper_5", the original's triggers
    size: float = 0.1               # trigger side, fraction of the image side (64px -> 6px);
                                    # the paper_* patterns have their own size in pixels
    position: str = "top_left"      # or "paper": top-left cell at row 3, column 23
    trigger_seed: int = 0           # colours of the "noise" pattern
    # The trigger is in the data before the training pipeline's random horizontal flip (module
    # docstring): half of the poisoned images show it mirrored. False pastes it after the flip.
    poison_before_flip: bool = True
    selection: str = added("random")  # which rows of a batch are poisoned (SELECTIONS)


def paper_trigger(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(pattern (3, rows, columns) in [0, 1], mask (1, rows, columns)) of one of the paper's
    triggers: every channel gets the cell's value; transparent cells are outside the mask."""
    cells = torch.tensor(PAPER_PATTERNS[name])
    mask = (cells != TRANSPARENT)[None]
    return torch.where(mask, cells, torch.zeros(())).expand(3, *cells.shape).contiguous(), mask


def trigger_pattern(params: BackdoorParams, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(pattern (3, side, side) in [0, 1], mask (1, side, side)) for a trigger."""
    if params.pattern in PAPER_PATTERNS:
        return paper_trigger(params.pattern)
    y, x = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    mask = torch.ones(1, side, side, dtype=torch.bool)
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


def trigger_box(params: BackdoorParams, height: int, width: int) -> tuple[int, int, int, int]:
    """(top row, left column, rows, columns) of the trigger in a height x width image; a ValueError
    naming both sizes when it does not fit."""
    if params.pattern in PAPER_PATTERNS:
        rows, columns = len(PAPER_PATTERNS[params.pattern]), len(PAPER_PATTERNS[params.pattern][0])
    else:
        rows = columns = max(2, int(round(params.size * min(height, width))))
    side, margin = rows, max(1, rows // 3)
    y0, x0 = {"top_left": (margin, margin), "top_right": (margin, width - columns - margin),
              "bottom_left": (height - rows - margin, margin),
              "bottom_right": (height - rows - margin, width - columns - margin),
              "center": ((height - side) // 2, (width - columns) // 2),
              "paper": PAPER_POSITION}[params.position]
    if y0 < 0 or x0 < 0 or y0 + rows > height or x0 + columns > width:
        raise ValueError(
            f"backdoor: the {rows}x{columns}-px trigger {params.pattern!r} at {params.position!r} "
            f"covers rows {y0}..{y0 + rows - 1} and columns {x0}..{x0 + columns - 1}, so it needs an "
            f"image of at least {y0 + rows}x{x0 + columns} px, but the image is {height}x{width} px; "
            "use larger images or another position")
    return y0, x0, rows, columns


def apply_trigger(images: torch.Tensor, params: BackdoorParams, mirrored: bool = False) -> torch.Tensor:
    """``images`` with the trigger pasted; ``mirrored``: as a horizontal flip of the image would
    show it (the pattern mirrored, in the mirrored position)."""
    if mirrored:
        return apply_trigger(images.flip(-1), params).flip(-1)
    height, width = images.shape[-2:]
    y0, x0, rows, columns = trigger_box(params, height, width)
    pattern, mask = trigger_pattern(params, rows)
    out = images.clone()
    box = out[..., y0:y0 + rows, x0:x0 + columns]
    out[..., y0:y0 + rows, x0:x0 + columns] = torch.where(mask, pattern.to(images.dtype), box)
    return out


@FAMILIES.register
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
        if params.selection not in SELECTIONS:
            raise ValueError(f"backdoor: selection={params.selection!r}; valid: {', '.join(SELECTIONS)}")
        if int(params.target) < 0:
            raise ValueError(f"backdoor: target={params.target} must be a class index >= 0")

    @classmethod
    def check_image_size(cls, params, height, width):
        trigger_box(cls.Params(**params), height, width)

    def __init__(self, params, world, seed):
        super().__init__(params, world, seed)
        trigger_box(self.params, world.image_size, world.image_size)
        if self.params.target >= world.num_classes:
            raise ValueError(f"backdoor: target={self.params.target} is not a class of this world "
                             f"(classes 0..{world.num_classes - 1})")

    def training_inputs(self, model, images, labels, generator, offset=0, global_size=None):
        # Drawn over the global batch (base class): which rows are poisoned, and mirrored.
        chosen = select_rows(global_size or len(images), self.params.nu, self.params.selection,
                             generator)
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
                       f"attack success rate on triggered inputs: {rate:.3f}, references "
                       f"{refs:.3f}; the implant took if it is at least {ATTACK_SUCCESS_THRESHOLD}"
                       f" ({mirrored:.3f} with the trigger mirrored)")

    def planted_slice(self, implant=None):
        """The trigger is a pixel pattern, no factor of the world: not expressible."""
        return NOT_EXPRESSIBLE
