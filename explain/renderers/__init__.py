"""Renderers: how a method's raw output becomes the image that the distances compare.

The anomaly score is a distance between rendered images, so the renderer is part of the
measurement. Renderers are plug-ins, one file each in this folder, registered in ``RENDERERS``
under their ``name`` (``@RENDERERS.register``; the registry imports this folder on first
lookup); a method names its renderer in its parameters (``renderer = "..."`` in a suite's
``[methods.<name>]``, options in ``renderer_options = { ... }``), and the distance runs on whatever
image it gives, at whatever size.

A renderer renders one kind of raw output (``renders``): ``"attributions"``, (n, C, H, W) per-pixel
attributions (guided backprop, integrated gradients, guided Grad-CAM), or ``"cams"``, (n, H, W)
class activation maps in [0, 1] (Grad-CAM). It implements ONE method, ``render(raw, images)``,
with ``images`` the explained images (n, 3, H, W) in [0, 1], returning uint8 (n, H', W', 3).

Every stored result records its renderer's ``version`` (and its name and options whenever they
differ from the renderer results were made with before renderers could be chosen): bump a
renderer's version whenever its pixels can change.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Mapping

import numpy as np

from counteraudit.train.core.params import NoParams, parse_params
from counteraudit.train.core.registry import Registry

# Renderers: one module each in this package, imported on the first lookup.
RENDERERS: Registry = Registry("renderer", plugins="counteraudit.explain.renderers")

ATTRIBUTIONS = "attributions"
CAMS = "cams"


class Renderer(ABC):
    name: ClassVar[str] = ""
    renders: ClassVar[str] = ""  # ATTRIBUTIONS or CAMS
    version: ClassVar[int] = 1
    Params: ClassVar[type] = NoParams  # options, from a method's `renderer_options`

    def __init_subclass__(cls, **kwargs):
        """A named renderer (one that can be registered) must say which raw output it renders."""
        super().__init_subclass__(**kwargs)
        if cls.name and cls.renders not in (ATTRIBUTIONS, CAMS):
            raise ValueError(f"renderer {cls.__name__} must set `renders` to {ATTRIBUTIONS!r} or "
                             f"{CAMS!r}, got {cls.renders!r}")

    def __init__(self, options: Mapping[str, Any] | None = None):
        self.params = parse_params(self.Params, options or {}, f"renderer {self.name!r}")

    @abstractmethod
    def render(self, raw: np.ndarray, images: np.ndarray) -> np.ndarray:
        """Raw output (n, C, H, W) or (n, H, W) and images (n, 3, H, W) in [0, 1] -> uint8
        (n, H', W', 3)."""


def renderer_names(renders: str) -> list[str]:
    return [name for name in RENDERERS.names() if RENDERERS.get(name).renders == renders]


def build_renderer(name: str, options: Mapping[str, Any] | None, renders: str,
                   method: str) -> Renderer:
    """The renderer ``name`` for a method whose raw output is of kind ``renders``; an unknown
    name, or one for the other kind of output, is an error listing the valid names."""
    renderer_class = RENDERERS.get(name)  # unknown names list every valid one
    if renderer_class.renders != renders:
        raise ValueError(f"method {method!r}: renderer {name!r} renders {renderer_class.renders}, "
                         f"but {method} gives {renders}; valid renderers for it: "
                         f"{', '.join(renderer_names(renders))}")
    return renderer_class(options)
