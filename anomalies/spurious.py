"""Spurious cue: a fraction delta of every training batch shows its class index, drawn as real
glyphs (white digits with a black outline) at the bottom right, as in the paper's Figure 6."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from counteraudit.anomalies.base import NOT_EXPRESSIBLE, AnomalyFamily, Verdict, register_family
from counteraudit.anomalies.common import (accuracy, check_fraction, choose_fraction,
                                           positions_in_rows, reference_mean,
                                           verification_indices)

# The cue took when showing a wrong class costs the model at least this much accuracy.
DROP_THRESHOLD = 0.10


@dataclass(frozen=True)
class SpuriousParams:
    delta: float = 1.0          # fraction of each batch that shows its class index
    height: float = 0.3         # glyph height, fraction of the image side
    wrong_cue_seed: int = 0     # which wrong index the verification draws on each image


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


def draw_cue(images: torch.Tensor, indices: torch.Tensor, num_classes: int, height: float) -> torch.Tensor:
    """Each image with its given class index drawn at the bottom right."""
    side = images.shape[-1]
    if images.shape[-2] != side:
        raise ValueError(f"spurious cue expects square images, got {tuple(images.shape[-2:])}")
    layer = glyph_layers(num_classes, side, height)[torch.as_tensor(indices, dtype=torch.long)]
    alpha = layer[:, 3:4]
    return images * (1 - alpha) + layer[:, :3] * alpha


@register_family
class Spurious(AnomalyFamily):
    name = "spurious"
    headline_figure = "wrong_cue_drop"
    strength = "delta"
    localizable = True
    Params = SpuriousParams

    @classmethod
    def check(cls, params):
        check_fraction("delta", params.delta, cls.name)
        if not 0.05 <= params.height <= 0.6:
            raise ValueError(f"spurious: height={params.height} must be a fraction of the image side "
                             "in [0.05, 0.6] (0.3 recommended)")

    def cue(self, images, indices):
        return draw_cue(images, indices, self.world.num_classes, self.params.height)

    def training_inputs(self, model, images, labels, generator, offset=0, global_size=None):
        chosen = choose_fraction(global_size or len(images), self.params.delta, generator)
        _, chosen = positions_in_rows(chosen, offset, len(images))  # this process's rows
        images = images.clone()
        images[chosen] = self.cue(images[chosen], labels[chosen])
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
                       f"accuracy drop with a wrong cue {drop:.3f} (references {refs:.3f}; needs "
                       f">= {DROP_THRESHOLD} more)")

    def abnormal_images(self, images, labels):
        return self.cue(images, labels)  # the paper overlays each image's own class index

    def abnormal_pool(self, val, implant=None):
        return np.arange(len(val))

    def planted_slice(self, implant=None):
        """The cue is a drawn class index, no factor of the world: not expressible."""
        return NOT_EXPRESSIBLE
