"""The augmentation of every Caricature step, two ways (``Caricature.Params.transforms``).

lucent's ``render_vis`` augments every optimisation step with ``standard_transforms``, five
resamplings of the whole (padded, up to 97 px on a 64-px canvas) batch: ``pad(12, constant
0.5)``, ``jitter(8)`` (a kornia warp), ``random_scale`` (a bilinear upsample), ``random_rotate`` (a
kornia warp) and ``jitter(4)``; it then upsamples to the model's input size (bilinear, align
corners). Two implementations, drawing the same random parameters in the same order:

- "lucent" (``LucentStandardTransforms``; the ``paper`` suite): lucent's own functions, composed
  as ``render_vis`` composes them, followed by ``render_vis``'s ``torch.nn.Upsample``: the
  original code's pixels (render_vis applies lucent's ImageNet normalisation before that
  upsample; the models here normalise themselves, after it: equal up to float rounding, 1e-6).
  Rows with their own generators (noise = "per_model") each run the chain alone with numpy's
  global generator swapped for their own (``drawing_from``), as if each were its own
  ``render_vis`` call.
- "fused" (``StandardTransforms``; the method's default, so visualizations stored before the
  option keep their keys; the ``demo`` suite sets it explicitly): the six geometric maps composed
  into one map from output pixels to the 0.5-padded input, sampled once, bilinearly, at the
  output size. On a CPU lucent's five resamplings and their backward passes cost more than the
  small model itself: a demo Caricature batch took 1.7x to 2.1x as long with "lucent"
  (evaluate/benchmarks/caricature_transforms.py; at 128 -> 224 px the model dominates, 1.0x to
  1.3x).

What "fused" changes: one interpolation instead of five (sharper: on a uniform-noise canvas, std
0.29, the model's input differs from lucent's by a mean of 0.05, at 64 -> 64 and 128 -> 224 px,
and the Caricature after 12 steps by a mean of 0.06; on a smooth image the two agree except along
the borders of the zero-filled regions), hard borders on those regions (content shifted or
rotated out of the canvas, the border around a shrunk image: zero in both; the 0.5 padding stays
0.5), and kornia 0.4's half-pixel quirk in ``translate`` (a shift of d pixels moves the image by
d * W / (W - 1)) is not reproduced: shifts are whole pixels, as intended.
"""
from __future__ import annotations

import math
import warnings
from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F

with warnings.catch_warnings():
    # lucent's transforms import kornia, which calls torch.jit.script at import; torch 2.x answers
    # with a FutureWarning on the stderr of every command. Nothing here uses kornia's JIT.
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.jit")
    from lucent.optvis import transform as lucent_transform

# lucent.optvis.transform.standard_transforms, parameter for parameter.
PAD = 12
PAD_VALUE = 0.5
JITTER_FIRST = 8
SCALES = [1 + (i - 5) / 50.0 for i in range(11)]
ANGLES = list(range(-10, 11)) + 5 * [0]
JITTER_LAST = 4


def draw_parameters(generator=np.random) -> dict[str, float]:
    """One step's random augmentation, drawn as lucent draws it (from numpy's global generator,
    or from ``generator``, a ``np.random.RandomState``, in the same order)."""
    first = (int(generator.choice(JITTER_FIRST)), int(generator.choice(JITTER_FIRST)))
    scale = float(generator.choice(SCALES))
    angle = float(generator.choice(ANGLES))
    last = (int(generator.choice(JITTER_LAST)), int(generator.choice(JITTER_LAST)))
    return {"shift_first": first, "scale": scale, "angle": angle, "shift_last": last}


def sampling_grid(height: int, width: int, scale: float, angle: float,
                  shift_first: tuple[int, int], shift_last: tuple[int, int],
                  device=None, output_size: tuple[int, int] | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """For every output pixel: where it samples the padded input (grid_sample coordinates, align
    corners) and whether lucent's chain would have a zero there. ``height``, ``width``: the
    canvas (the parameterised image); ``output_size``: what the chain is resized to at the end
    (``render_vis``'s upsample to the model's input; default: the canvas size). Returns
    (grid (1, H, W, 2), mask (1, 1, H, W)) at the output size."""
    canvas_height, canvas_width = height, width
    height, width = output_size or (height, width)
    padded = (canvas_height + 2 * PAD, canvas_width + 2 * PAD)          # after pad(12)
    upsampled = tuple(math.ceil(scale * d) for d in padded)             # random_scale's upsample
    border = tuple(max(0, math.ceil((d - u) / 2)) for d, u in zip(padded, upsampled))
    canvas = tuple(u + 2 * b for u, b in zip(upsampled, border))        # after random_scale
    y, x = torch.meshgrid(torch.arange(height, dtype=torch.float64),
                          torch.arange(width, dtype=torch.float64), indexing="ij")
    # Resize of the canvas to the output size (bilinear, align corners).
    x = x * (canvas[1] - 1) / max(width - 1, 1)
    y = y * (canvas[0] - 1) / max(height - 1, 1)
    # jitter(4): output(u) = input(u - shift).
    x, y = x - shift_last[0], y - shift_last[1]
    valid = (x >= 0) & (y >= 0)
    # random_rotate: kornia's (OpenCV's) rotation about the canvas centre; sample at R^T (u - c).
    cx, cy = (canvas[1] - 1) / 2, (canvas[0] - 1) / 2
    cos, sin = math.cos(math.radians(angle)), math.sin(math.radians(angle))
    x, y = cos * (x - cx) - sin * (y - cy) + cx, sin * (x - cx) + cos * (y - cy) + cy
    valid &= (x >= 0) & (x <= canvas[1] - 1) & (y >= 0) & (y <= canvas[0] - 1)
    # random_scale: the zero border, then the upsample (align corners).
    x, y = x - border[1], y - border[0]
    valid &= (x >= 0) & (x <= upsampled[1] - 1) & (y >= 0) & (y <= upsampled[0] - 1)
    x = x * (padded[1] - 1) / (upsampled[1] - 1)
    y = y * (padded[0] - 1) / (upsampled[0] - 1)
    # jitter(8).
    x, y = x - shift_first[0], y - shift_first[1]
    valid &= (x >= 0) & (y >= 0)
    grid = torch.stack([2 * x / (padded[1] - 1) - 1, 2 * y / (padded[0] - 1) - 1], dim=-1)
    return (grid[None].to(device=device, dtype=torch.float32),
            valid[None, None].to(device=device, dtype=torch.float32))


def sampling_grids(height: int, width: int, draws: list[dict], device=None,
                   output_size: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``sampling_grid`` for many draws at once, one row each: (grid (B, H, W, 2), mask
    (B, 1, H, W)), bit for bit the rows ``sampling_grid`` gives one at a time (the same float64
    operations in the same order, with each row's numbers as (B, 1, 1) columns), computed on
    ``device``: on a GPU one pass over B x H x W points instead of B small passes on the CPU
    (on a CPU the B passes are as fast: ``StandardTransforms`` uses them there)."""
    out_height, out_width = output_size or (height, width)
    padded = (height + 2 * PAD, width + 2 * PAD)
    rows = []
    for draw in draws:
        upsampled = tuple(math.ceil(draw["scale"] * d) for d in padded)
        border = tuple(max(0, math.ceil((d - u) / 2)) for d, u in zip(padded, upsampled))
        canvas = tuple(u + 2 * b for u, b in zip(upsampled, border))
        radians = math.radians(draw["angle"])
        rows.append((*upsampled, *border, *canvas, math.cos(radians), math.sin(radians),
                     *draw["shift_first"], *draw["shift_last"]))
    columns = torch.tensor(rows, dtype=torch.float64, device=device).T.reshape(-1, len(draws), 1, 1)
    (up_h, up_w, border_h, border_w, canvas_h, canvas_w, cos, sin,
     first_x, first_y, last_x, last_y) = columns
    y, x = torch.meshgrid(torch.arange(out_height, dtype=torch.float64, device=device),
                          torch.arange(out_width, dtype=torch.float64, device=device), indexing="ij")
    x = x * (canvas_w - 1) / max(out_width - 1, 1)
    y = y * (canvas_h - 1) / max(out_height - 1, 1)
    x, y = x - last_x, y - last_y
    valid = (x >= 0) & (y >= 0)
    cx, cy = (canvas_w - 1) / 2, (canvas_h - 1) / 2
    x, y = cos * (x - cx) - sin * (y - cy) + cx, sin * (x - cx) + cos * (y - cy) + cy
    valid &= (x >= 0) & (x <= canvas_w - 1) & (y >= 0) & (y <= canvas_h - 1)
    x, y = x - border_w, y - border_h
    valid &= (x >= 0) & (x <= up_w - 1) & (y >= 0) & (y <= up_h - 1)
    x = x * (padded[1] - 1) / (up_w - 1)
    y = y * (padded[0] - 1) / (up_h - 1)
    x, y = x - first_x, y - first_y
    valid &= (x >= 0) & (y >= 0)
    grid = torch.stack([2 * x / (padded[1] - 1) - 1, 2 * y / (padded[0] - 1) - 1], dim=-1)
    return (grid.to(device=device, dtype=torch.float32),
            valid[:, None].to(device=device, dtype=torch.float32))


class StandardTransforms:
    """The "fused" path: lucent's chain and the upsample to the input as ONE resampling.

    Callable on a (B, 3, H, W) batch of canvases in [0, 1]: output (B, 3, *output_size).

    ``generators`` None: one random augmentation for the whole batch per call, drawn from numpy's
    global generator (lucent's ``render_vis`` on one batch); else one ``np.random.RandomState``
    per row, each row drawing its own augmentation from its own generator (rows rendered as if
    each were its own ``render_vis`` call)."""

    def __init__(self, height: int, width: int, output_size: tuple[int, int] | None = None,
                 generators: list[np.random.RandomState] | None = None):
        self.height, self.width = height, width
        self.output_size = output_size
        self.generators = generators

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        def grid_for(generator=np.random, draw=None):
            return sampling_grid(self.height, self.width, device=images.device,
                                 output_size=self.output_size,
                                 **(draw or draw_parameters(generator)))

        if self.generators is None:
            grid, mask = grid_for()
            grid = grid.expand(len(images), -1, -1, -1)
        else:
            if len(self.generators) != len(images):
                raise ValueError(f"{len(self.generators)} generators for {len(images)} rows")
            draws = [draw_parameters(g) for g in self.generators]
            if images.device.type == "cpu":
                grids, masks = zip(*(grid_for(None, draw) for draw in draws))
                grid, mask = torch.cat(grids), torch.cat(masks)
            else:
                grid, mask = sampling_grids(self.height, self.width, draws, images.device,
                                            self.output_size)
        padded = F.pad(images, [PAD] * 4, mode="constant", value=PAD_VALUE)
        sampled = F.grid_sample(padded, grid, mode="bilinear", padding_mode="zeros",
                                align_corners=True)
        return sampled * mask


@contextmanager
def drawing_from(generator: np.random.RandomState) -> Iterator[None]:
    """Inside the block, numpy's global generator (which lucent's transforms draw from) continues
    ``generator``'s sequence; on leaving, ``generator`` holds the advanced state (as if drawn from
    directly) and the global generator is back where it was."""
    saved = np.random.get_state()
    np.random.set_state(generator.get_state())
    try:
        yield
    finally:
        generator.set_state(np.random.get_state())
        np.random.set_state(saved)


def lucent_chain(output_size: tuple[int, int]) -> Callable[[torch.Tensor], torch.Tensor]:
    """render_vis's ``transform_f`` without lucent's ImageNet normalisation (the models normalise
    themselves): ``standard_transforms``, then ``torch.nn.Upsample`` to the model's input size, as
    ``render_vis`` appends it (called with ``fixed_image_size``, or a canvas under 224 px for its
    224-px zoo)."""
    return lucent_transform.compose([
        *lucent_transform.standard_transforms,
        torch.nn.Upsample(size=output_size, mode="bilinear", align_corners=True)])


class LucentStandardTransforms:
    """The "lucent" path: lucent's own transform functions, composed as ``render_vis`` composes
    them. The same interface as ``StandardTransforms``.

    ``generators`` None: the whole batch through the chain at once, drawing from numpy's global
    generator (lucent's ``render_vis`` on one batch); else each row through the chain alone,
    drawing from its own ``np.random.RandomState`` (rows rendered as if each were its own
    ``render_vis`` call: lucent draws one augmentation per call for the whole batch)."""

    def __init__(self, height: int, width: int, output_size: tuple[int, int] | None = None,
                 generators: list[np.random.RandomState] | None = None):
        self.chain = lucent_chain(output_size or (height, width))
        self.generators = generators

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if self.generators is None:
            return self.chain(images)
        if len(self.generators) != len(images):
            raise ValueError(f"{len(self.generators)} generators for {len(images)} rows")
        rows = []
        for row, generator in zip(images.split(1), self.generators):
            with drawing_from(generator):
                rows.append(self.chain(row))
        return torch.cat(rows)


# Caricature.Params.transforms: the implementation of each path.
AUGMENTATIONS = {"fused": StandardTransforms, "lucent": LucentStandardTransforms}
