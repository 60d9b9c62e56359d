"""Spurious cue: a fraction delta of every training batch shows its class index.

Two cues: ``"outlined"``, real glyphs (white digits with a black outline) at the bottom right, as
the paper's Figure 6 shows them; and ``"watermark"``, the paper's code (``spurious_single_img``):
the index as three zero-padded 16x16-px digits at rows 206-221, columns 172-187, 189-204 and
206-221, added to every channel with strength 0.7 and clamped to [0, 1]. The original's digit
glyphs are not public; ``anomalies/watermark_digits.py`` draws this project's own.

Where the training cue is added (``training_space``): ``"pixels"`` (the default), +strength in
[0, 1] pixel units, clamped, as the evaluation images; ``"normalized"``, the original's
``spurious_batch`` (assess_utils/anom_utils.py:334-371), which adds strength x overlay with no
clamp to the batch its training loop hands it, the normalised batch (its training script is not
public; ``poison_batch`` beside it writes a normalised pattern, so its batch is normalised). The
model here normalises inside its forward, so that is x + strength x std_c x overlay in pixels,
unclamped: x_norm + s o = (x + s std o - mean) / std.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from counteraudit.anomalies.base import FAMILIES, NOT_EXPRESSIBLE, AnomalyFamily, Verdict
from counteraudit.anomalies.common import (accuracy, check_fraction, positions_in_rows,
                                           reference_mean, select_rows, verification_indices)
from counteraudit.anomalies.watermark_digits import digit_overlay, watermark_boxes
from counteraudit.train.core.params import added

CUES = ("outlined", "watermark")
PLACEMENTS = ("fixed", "scaled")
SELECTIONS = ("random", "first")
TRAINING_SPACES = ("pixels", "normalized")

# The cue took when showing a wrong class costs the model at least this much accuracy.
DROP_THRESHOLD = 0.10


@dataclass(frozen=True)
class SpuriousParams:
    delta: float = 1.0          # fraction of each batch that shows its class index
    height: float = 0.3         # glyph height, fraction of the image side
    wrong_cue_seed: int = 0     # which wrong index the verification draws on each image
    cue: str = added("outlined")  # CUES: "watermark" is the paper's code's
    # The watermark's boxes: "fixed", the original's pixels (224-px images); "scaled", those boxes
    # scaled to the image side (the same at 224 px; what smaller images and crops can hold).
    placement: str = added("fixed")
    strength: float = added(0.7)  # the watermark's alpha times this is added, then clamped to [0, 1]
    # "random": round(delta * B) rows drawn at random; "first": the first floor(delta * B) rows of
    # the shuffled batch (the original's spurious_batch)
    selection: str = added("random")
    # Where the training-time watermark is added: "pixels", +strength in pixels, clamped (as the
    # evaluation images); "normalized", +strength in normalised units, unclamped (the original's
    # spurious_batch, on its normalised batch). Evaluation images are always "pixels".
    training_space: str = added("pixels")


@lru_cache(maxsize=32)
def glyph_layers(num_classes: int, side: int, height: float) -> torch.Tensor:
    """(num_classes, 4, side, side): RGB and alpha of each class index, bottom-right aligned."""
    font = ImageFont.load_default(size=max(6, int(round(height * side))))
    stroke = max(1, side // 48)
    layers = np.zeros((num_classes, side, side, 4), np.float32)
    for index in range(num_classes):
        canvas = Image.new("RGBA", (side, side), (0, 0, 0, 0))
        draw = ImageDraw.Draw(canvas)
        text = str(index)
        x0, y0, x1, y1 = draw.textbbox((0, 0), text, font=font, stroke_width=stroke)
        margin = max(1, side // 32)
        draw.text((side - margin - x1, side - margin - y1), text, font=font, fill=(255, 255, 255, 255),
                  stroke_width=stroke, stroke_fill=(0, 0, 0, 255))
        layers[index] = np.asarray(canvas, np.float32) / 255
    return torch.from_numpy(layers).permute(0, 3, 1, 2).contiguous()


def add_watermark(images: torch.Tensor, indices: torch.Tensor, placement: str,
                  strength: float) -> torch.Tensor:
    """Each image plus strength x its index's three-digit watermark on every channel, clamped."""
    overlay = digit_overlay(indices, *images.shape[-2:], placement).to(images.dtype)
    return (images + strength * overlay).clamp(0.0, 1.0)


def add_watermark_normalized(images: torch.Tensor, indices: torch.Tensor, placement: str,
                             strength: float, std: tuple[float, float, float]) -> torch.Tensor:
    """Each image (pixels) plus strength x its watermark in normalised units, not clamped: the
    pixel image whose normalisation is the normalised image plus strength x overlay."""
    overlay = digit_overlay(indices, *images.shape[-2:], placement).to(images.dtype)
    per_channel = torch.tensor(std, dtype=images.dtype).view(1, -1, 1, 1)
    return images + strength * per_channel * overlay


def draw_cue(images: torch.Tensor, indices: torch.Tensor, num_classes: int, height: float) -> torch.Tensor:
    """Each image with its given class index drawn at the bottom right."""
    side = images.shape[-1]
    if images.shape[-2] != side:
        raise ValueError(f"spurious cue expects square images, got {tuple(images.shape[-2:])}")
    layer = glyph_layers(num_classes, side, height)[torch.as_tensor(indices, dtype=torch.long)]
    alpha = layer[:, 3:4]
    return images * (1 - alpha) + layer[:, :3] * alpha


@FAMILIES.register
class Spurious(AnomalyFamily):
    name = "spurious"
    headline_figure = "wrong_cue_drop"
    strength = "delta"
    localizable = True
    Params = SpuriousParams

    @classmethod
    def check(cls, params):
        check_fraction("delta", params.delta, cls.name)
        for name, valid in (("cue", CUES), ("placement", PLACEMENTS), ("selection", SELECTIONS),
                            ("training_space", TRAINING_SPACES)):
            if getattr(params, name) not in valid:
                raise ValueError(f"spurious: {name}={getattr(params, name)!r}; valid: {', '.join(valid)}")
        if not 0 < params.strength <= 1:
            raise ValueError(f"spurious: strength={params.strength} must be in (0, 1] (the paper: 0.7)")
        if params.training_space != "pixels" and params.cue != "watermark":
            raise ValueError(f"spurious: training_space={params.training_space!r} applies to the "
                             f"watermark cue; set cue = \"watermark\" or leave training_space out")
        if not 0.05 <= params.height <= 0.6:
            raise ValueError(f"spurious: height={params.height} must be a fraction of the image side "
                             "in [0.05, 0.6] (0.3 recommended)")

    @classmethod
    def check_image_size(cls, params, height, width):
        params = cls.Params(**params)
        if params.cue == "watermark":
            watermark_boxes(height, width, params.placement)

    def __init__(self, params, world, seed):
        super().__init__(params, world, seed)
        self.check_image_size(asdict(self.params), world.image_size, world.image_size)

    def cue(self, images, indices):
        if self.params.cue == "watermark":
            return add_watermark(images, indices, self.params.placement, self.params.strength)
        return draw_cue(images, indices, self.world.num_classes, self.params.height)

    def training_cue(self, images, indices):
        """The cue as training adds it (``training_space``); evaluation uses ``cue``."""
        if self.params.training_space == "normalized":
            return add_watermark_normalized(images, indices, self.params.placement,
                                            self.params.strength, self.world.std)
        return self.cue(images, indices)

    def training_inputs(self, model, images, labels, generator, offset=0, global_size=None):
        chosen = select_rows(global_size or len(images), self.params.delta, self.params.selection,
                             generator)
        _, chosen = positions_in_rows(chosen, offset, len(images))  # this process's rows
        images = images.clone()
        images[chosen] = self.training_cue(images[chosen], labels[chosen])
        return images, labels

    def _wrong_indices(self, labels: np.ndarray) -> np.ndarray:
        rng = np.random.default_rng(self.params.wrong_cue_seed)
        shift = rng.integers(1, self.world.num_classes, len(labels))
        return (labels + shift) % self.world.num_classes

    def measure(self, model, device="cpu"):
        val = self.world.split("val")
        idx = verification_indices(val)
        images, labels = val.load(idx), val.labels[idx]
        right = accuracy(model, self.cue(images, labels), labels, device)
        wrong = accuracy(model, self.cue(images, self._wrong_indices(labels)), labels, device)
        # The cue's effect: accuracy with the true index drawn minus with a wrong one. (A delta=1
        # model may never have seen an image without the cue, so clean accuracy is no baseline.)
        return {"right_cue_accuracy": right, "wrong_cue_accuracy": wrong,
                "wrong_cue_drop": right - wrong}

    def judge(self, figures, reference_figures):
        drop = figures["wrong_cue_drop"]
        refs = reference_mean(reference_figures, "wrong_cue_drop")
        return Verdict(drop - refs >= DROP_THRESHOLD,
                       f"accuracy drop when the cue names a wrong class: {drop:.3f}, references "
                       f"{refs:.3f}; the implant took if it is at least {DROP_THRESHOLD} larger "
                       "than the references'")

    def abnormal_images(self, images, labels):
        return self.cue(images, labels)  # the paper overlays each image's own class index

    def abnormal_pool(self, val, implant=None):
        return np.arange(len(val))

    def planted_slice(self, implant=None):
        """The cue is a drawn class index, no factor of the world: not expressible."""
        return NOT_EXPRESSIBLE
