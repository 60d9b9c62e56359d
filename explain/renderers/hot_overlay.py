"""The project's own saliency renderer (explain/render.py ``saliency_overlay``): sum of absolute
attributions over channels, scaled by the 99th percentile, HOT colours at alpha 0.8 over the
BT.601 grey image, at the image's size. Fast (numpy only) and every result before renderers could
be chosen was made with it."""
from __future__ import annotations

import numpy as np

from counteraudit.explain.render import RENDERER_VERSION, saliency_overlay
from counteraudit.explain.renderers import ATTRIBUTIONS, RENDERERS, Renderer


@RENDERERS.register
class HotOverlay(Renderer):
    name = "hot_overlay"
    renders = ATTRIBUTIONS
    version = RENDERER_VERSION  # pinned by tests/test_explain_support.py's digest

    def render(self, raw: np.ndarray, images: np.ndarray) -> np.ndarray:
        return saliency_overlay(raw, images)
