"""The protocol choices evaluate/sensitivity.py varies: one registry entry per choice.

A choice is one method parameter and the values it can take (e.g. Integrated Gradients' baseline:
``normalized_zero``, the original's, or ``black``). Applied to a suite, it sets that parameter on
every method of the suite that has it (or on the methods it names), so a choice never needs to
know which methods a suite runs. The suite's own value is read from its parsed parameters; every
other value is an alternative protocol, explained and scored beside it.

Adding a choice is one ``PROTOCOL_CHOICES.register(ProtocolChoice(...))`` call here; its test is generated
from this registry (tests/test_sensitivity.py).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from counteraudit.explain.base import METHODS
from counteraudit.explain.methods.caricature import TRANSFORM_PATHS
from counteraudit.explain.renderers import ATTRIBUTIONS
from counteraudit.explain.renderers.captum_figure import RASTERISATIONS
from counteraudit.explain.settings import method_table, suite_method
from counteraudit.train.core.registry import Registry

# Protocol choices: registered in this module.
PROTOCOL_CHOICES: Registry = Registry("protocol choice", plugins="counteraudit.evaluate.studies.protocol_choices")

MIXED = "mixed"  # the suite sets the parameter differently on different methods


@dataclass(frozen=True)
class ProtocolChoice:
    name: str
    parameter: str                  # a field of the methods' Params dataclasses
    options: tuple[Any, ...]        # the values it is compared under
    description: str
    # Which methods it may set, a test of the method's class (None: every method of the suite
    # with the parameter).
    methods: Callable[[type], bool] | None = None
    # Parameters set along with a value (None: removed, back to the method's default), e.g. a
    # renderer's options, which belong to the renderer they were written for; a function of
    # (value, suite) where they depend on the suite (a figure's size on the image size).
    along: Callable[[Any, Any], dict[str, Any]] | None = None
    # "renderer_options": ``parameter`` is an option of the renderer each method uses (set inside
    # its ``renderer_options``), not a field of the method's Params; it applies to the methods
    # whose renderer, in the suite at hand, has that option.
    within: str | None = None

    def applicable(self, methods: list[str], suite=None) -> list[str]:
        """The suite's methods this choice sets (those whose parameters have the field; for a
        renderer option, those whose renderer in ``suite`` has it)."""
        if self.within is not None:
            return [m for m in methods if suite is not None and (self.methods is None or self.methods(
                METHODS.get(m))) and self.parameter in _renderer_fields(suite, m)]
        return [m for m in methods if (self.methods is None or self.methods(METHODS.get(m)))
                and self.parameter in {f.name for f in dataclasses.fields(METHODS.get(m).Params)}]

    def value_of(self, suite, method: str) -> Any:
        """The method's value of the parameter in ``suite`` (a renderer option's, its default
        filled in)."""
        built = suite_method(suite, method)
        if self.within is not None:
            return getattr(built.renderer.params, self.parameter)
        return getattr(built.params, self.parameter)

    def current(self, suite, methods: list[str]) -> Any:
        """The suite's own value of the parameter (``MIXED`` if its methods disagree; None if no
        method of the suite has it)."""
        values = {_hashable(self.value_of(suite, m)) for m in self.applicable(methods, suite)}
        if not values:
            return None
        return values.pop() if len(values) == 1 else MIXED

    def patch(self, suite, methods: list[str], value: Any) -> dict[str, Any]:
        """The suite-file tables that set ``value`` (and what goes ``along`` with it) on the
        applicable methods; a None removes a parameter (``train.suite.write_derived_suite``). A
        renderer option is set inside the method's own ``renderer_options``, the others kept."""
        if self.within is not None:
            return {"methods": {m: {**_taken(suite, m),
                                    self.within: {**self._options(suite, m), self.parameter: value}}
                                for m in self.applicable(methods, suite)}}
        settings = {self.parameter: value, **(self.along(value, suite) if self.along else {})}
        return {"methods": {m: {**_taken(suite, m), **settings} for m in self.applicable(methods, suite)}}


    def _options(self, suite, method: str) -> dict[str, Any]:
        """The method's own ``within`` table in ``suite`` (its renderer's options as written)."""
        return dict(getattr(suite_method(suite, method).params, self.within) or {})


def _taken(suite, method: str) -> dict[str, Any]:
    """The shared settings a method the suite gives no table takes (explain/shared_settings.py),
    written into the table a patch gives it, so that the patch changes its one parameter and not,
    by giving it a table of its own, the settings it took."""
    return {} if method in suite.method_tables else method_table(suite, method)


def _renderer_fields(suite, method: str) -> set[str]:
    """The options of the renderer ``method`` uses in ``suite`` (none for a method without one)."""
    renderer = getattr(suite_method(suite, method), "renderer", None)
    return {f.name for f in dataclasses.fields(renderer.Params)} if renderer is not None else set()


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def saliency_method(method: type) -> bool:
    """A per-pixel saliency method: one whose attributions (not CAMs) a renderer turns into images."""
    return getattr(method, "renders", None) == ATTRIBUTIONS


def named(name: str) -> Callable[[type], bool]:
    """The test of ``ProtocolChoice.methods`` that picks the one method ``name``."""
    return lambda method: method.name == name


def figure_options(suite) -> dict[str, Any]:
    """captum's 6-in figure at the resolution that gives a 224-px image the paper's 600 px
    (100 dpi), scaled to the suite's image size: the demo's 64 px get 29 dpi, 174 px. At the
    paper's scale, not smaller, so the comparison is with the figure the paper scored."""
    side = int(suite.world.get("image_size", 224))
    return {"figure_inches": 6.0, "dpi": max(1, round(100 * side / 224))}


PROTOCOL_CHOICES.register(ProtocolChoice(
    "renderer", "renderer", ("captum_figure", "hot_overlay"), methods=saliency_method,
    along=lambda value, suite: {"renderer_options": figure_options(suite) if value == "captum_figure"
                                else None},
    description="how a saliency map becomes the image that is scored: the paper's captum figure "
                "(blended heat map on a grey image, with the figure's frame and margins) or the "
                "project's image-sized hot overlay"))
PROTOCOL_CHOICES.register(ProtocolChoice(
    "rasterisation", "rasterisation", RASTERISATIONS, methods=saliency_method,
    within="renderer_options",
    description="how matplotlib turns captum's figure into pixels: as the paper's matplotlib 3.5.2 "
                "did (resample the data, then colour-map it) or as the installed version does "
                "(3.10 and later colour-map first when upsampling by less than 3x)"))
PROTOCOL_CHOICES.register(ProtocolChoice(
    "ig_baseline", "baseline", ("normalized_zero", "black"), methods=named("integrated_gradients"),
    description="Integrated Gradients' baseline: zero in the normalised input space (the ImageNet "
                "mean colour; the paper's code) or black pixels"))
PROTOCOL_CHOICES.register(ProtocolChoice(
    "gradient_space", "gradient_space", ("normalized", "pixels"),
    description="attributions with respect to the normalised input (the paper's code) or to the "
                "[0, 1] pixels (a factor 1/std per channel)"))
PROTOCOL_CHOICES.register(ProtocolChoice(
    "caricature_noise", "noise", ("per_model", "shared"), methods=named("caricature"),
    description="Caricatures' random start and augmentations: drawn per model, image and layer "
                "(the paper's code, unseeded there) or shared by every model (a paired design)"))
PROTOCOL_CHOICES.register(ProtocolChoice(
    "caricature_transforms", "transforms", TRANSFORM_PATHS, methods=named("caricature"),
    description="Caricatures' augmentation at every step: lucent's own standard_transforms chain "
                "(five resamplings, then render_vis's upsample; the paper's code) or one fused "
                "resampling with the same random draws (faster on a CPU, slightly sharper)"))
PROTOCOL_CHOICES.register(ProtocolChoice(
    "explained_class", "explained_class", ("top", "label"),
    description="the class explained: the model's own top class (the paper) or the image's true "
                "label, which separates what an explanation shows from a change of the model's "
                "output"))
