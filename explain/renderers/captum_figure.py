"""What the paper scored for guided backprop, integrated gradients and guided Grad-CAM: captum's

    fig, _ = visualize_image_attr(attr_HWC, image_HWC, "blended_heat_map", alpha_overlay=0.8)
    fig.savefig(png)

with captum's other defaults (sign "absolute_value": the absolute value of the channel *sum*;
outlier_perc 2: scaled by the value holding 98% of the cumulative mass and clipped; cmap "Blues";
the image shown as the mean of its uint8 channels in grey, auto-scaled), in a 6 x 6 in figure
saved at matplotlib's default 100 dpi: a 600 x 600 image with the axes frame and white margins
(``visualize/vis_functions.py`` ``get_gbp``/``get_intgrad``/``get_guided_gradcam`` and
``launch_main`` in js-d/auditing-vis). The PNG's alpha is opaque everywhere, and the LPIPS loader
reads its RGB, which is what this returns.

Fast enough to run inside the explain stage's workers: one Agg figure and axes per renderer
(cleared between images, no pyplot, no PNG encoding), drawn straight into an RGBA buffer;
tests/test_explain_protocol.py checks the pixels: "installed" equal captum's call plus ``savefig``
read back, bit for bit; the default within 4 grey levels of figures drawn by matplotlib 3.5.2 and
captum 0.6.0 (tests/data/make_matplotlib35_figures.py), the rest being matplotlib 3.11's rewritten
C++ resampler, which Python cannot reach.

Options (``renderer_options``): ``figure_inches`` (captum's ``fig_size``, 6) and ``dpi`` (100): the
image is ``figure_inches * dpi`` pixels square. The paper is 6 in at 100 dpi; a suite of small
images may scale the figure down (demo.toml says why and what it measured). ``rasterisation``:
how matplotlib turns the two images into pixels. "matplotlib-3.5" (the default), as the paper's
matplotlib 3.5.2 did: resample the data, then colour-map it, laid out as 3.5.2 laid it out
(explain/renderers/matplotlib35_image.py); "installed", whatever the installed matplotlib does
(3.10 and later colour-map first where the image is upsampled by less than 3x, as in the paper's
figure and the demo's).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
from captum.attr import visualization  # captum.attr._utils.visualization, where _prepare_image lives
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from counteraudit.train.core.params import added
from counteraudit.explain.renderers import ATTRIBUTIONS, RENDERERS, Renderer
from counteraudit.explain.renderers.matplotlib35_image import rasterise_as_matplotlib_3_5

ALPHA_OVERLAY = 0.8  # the paper's call; captum's default is 0.5
MATPLOTLIB_3_5, INSTALLED = "matplotlib-3.5", "installed"
Rasterisation = Literal["matplotlib-3.5", "installed"]
RASTERISATIONS = get_args(Rasterisation)


@RENDERERS.register
class CaptumFigure(Renderer):
    name = "captum_figure"
    renders = ATTRIBUTIONS

    @dataclass(frozen=True)
    class Params:
        figure_inches: float = 6.0  # captum's default fig_size (6, 6)
        dpi: int = 100               # matplotlib's default figure.dpi, which savefig uses
        # Results stored before this option were drawn by the installed matplotlib: they keep
        # their key under "installed"; the default is recorded, so they are not reused for it.
        rasterisation: Rasterisation = added(MATPLOTLIB_3_5, before=INSTALLED)

    def __init__(self, options=None):
        super().__init__(options)
        if self.params.figure_inches <= 0 or self.params.dpi < 1:
            raise ValueError(f"renderer {self.name!r}: figure_inches must be > 0 and dpi >= 1, "
                             f"got {self.params.figure_inches} and {self.params.dpi}")
        self._figure = None
        self._shape: tuple[int, int] | None = None  # the image size the figure was laid out for

    def _figure_for(self, shape: tuple[int, int]):
        """The figure, its grey image and its heat map, laid out by captum's own call for images
        of this size; made once per size (a worker renders thousands of images with it), after
        which each image only replaces the two images' data (``render``)."""
        if self._shape != shape:
            size = self.params.figure_inches
            self._figure = Figure(figsize=(size, size), dpi=self.params.dpi)
            FigureCanvasAgg(self._figure)
            axes = self._figure.subplots()
            visualization.visualize_image_attr(  # a placeholder map; its data is replaced
                np.ones(shape + (1,), np.float32), np.zeros(shape + (3,), np.float32),
                "blended_heat_map", alpha_overlay=ALPHA_OVERLAY, plt_fig_axis=(self._figure, axes),
                use_pyplot=False)
            self._grey, self._heat = axes.images
            if self.params.rasterisation == MATPLOTLIB_3_5:
                for image in axes.images:
                    rasterise_as_matplotlib_3_5(image)
            self._shape = shape
        return self._figure

    def render(self, raw: np.ndarray, images: np.ndarray) -> np.ndarray:
        raw, images = np.asarray(raw, np.float32), np.asarray(images, np.float32)
        if raw.ndim != 4 or images.ndim != 4 or len(raw) != len(images) \
                or raw.shape[2:] != images.shape[2:]:
            raise ValueError(f"expected attributions (n, C, H, W) and images (n, 3, H, W), got "
                             f"{raw.shape} and {images.shape}")
        figure = self._figure_for(tuple(images.shape[2:]))
        rendered = []
        for attribution, image in zip(raw, images):
            grey, heat = captum_arrays(attribution.transpose(1, 2, 0), image.transpose(1, 2, 0))
            self._grey.set_data(grey)
            self._grey.autoscale()  # as imshow's: the grey image spans black to white
            self._heat.set_data(heat)
            figure.canvas.draw()
            rendered.append(np.asarray(figure.canvas.buffer_rgba())[..., :3].copy())
        return np.stack(rendered)


def captum_arrays(attribution: np.ndarray, image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two arrays ``visualize_image_attr(attribution, image, "blended_heat_map")`` shows,
    (H, W) each, computed by captum's own helpers: the grey image (the mean of the image's uint8
    channels, floored as captum's ``_prepare_image`` does) and the normalised absolute channel sum.
    An all-zero map (where captum's call would fail an assertion) shows no heat."""
    grey = np.mean(visualization._prepare_image(image * 255), axis=2)
    summed = np.sum(attribution, axis=2)
    if not np.any(summed):
        return grey, np.zeros_like(summed)
    with warnings.catch_warnings():  # captum warns on a map close to zero, for every image
        warnings.simplefilter("ignore", UserWarning)
        return grey, visualization._normalize_attr(summed, "absolute_value", 2)
