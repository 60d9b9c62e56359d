"""The plug-in interface of explanation methods, and the batched loop they all share.

In the spirit of captum's ``Attribution`` and pytorch-grad-cam's ``BaseCAM``, a method is a small
class that sets ``name`` (and, optionally, a ``Params`` dataclass) and implements ONE method:
- ``AttributionMethod.attribute(model, images, targets) -> tensor``: raw attributions, rendered
  over the input by ``render`` (explain/render.py; override ``render`` for another kind of map);
- ``VisualizationMethod.visualize(model, images, targets) -> uint8 images`` for methods that
  produce images directly (Caricatures), optionally per layer.

``ExplanationMethod.run(model, images)`` does the rest once for every method: it makes the model
hook-safe (explain/explainable.py), takes the target class (the model's own top class,
c_max = argmax_c f_c(x), as the paper; or, with ``explained_class = "label"`` for methods whose
parameters derive from ``TargetParams``, the image's true label), runs batches under a seeded RNG
(same seed, same bits), and assembles an ``Explanation``. Attribution methods render their raw
output with a renderer named in their parameters (explain/renderers/). Register a method with
``@METHODS.register``; ``METHODS`` imports every module of ``explain/methods/`` on first lookup, so
a new method is one new file there.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator, Literal, Mapping, get_args

import numpy as np
import torch
from torch import nn

from counteraudit.explain.explainable import explainable
from counteraudit.train.core.params import NoParams, added, parse_params, recorded_params
from counteraudit.explain.render import RENDERER_VERSION
from counteraudit.explain.renderers import ATTRIBUTIONS, CAMS, Renderer, build_renderer
from counteraudit.train.core.artifacts import derive_seed
from counteraudit.train.core.plugin_files import plugin_digest
from counteraudit.train.core.registries import ARCHITECTURES
from counteraudit.train.core.registry import Registry

# Explanation methods: one module each in explain/methods/, imported on the first lookup.
METHODS: Registry[type] = Registry("method", plugins="counteraudit.explain.methods")


# ---------------------------------------------------------------- results
@dataclass
class Explanation:
    """One method's output for one model on one image set.

    images: uint8 (N, H, W, 3), or (L, N, H, W, 3) for per-layer methods (``layers`` names L).
    targets: int64 (N,), the class each image was explained for (the model's top class, or the
        image's label with ``explained_class = "label"``).
    params: what determined the result (method, its parameters, renderer version; see
        ``ExplanationMethod.describe``); the store compares it to decide whether to recompute.
    raw: the method's float output before rendering, image axis first (attributions (N, 3, H, W),
        CAMs (N, H, W)), or None for methods that produce images directly.
    diagnostics: small float arrays whose LAST axis is the image axis (e.g. a Caricature's
        objective per layer and image, (L, N)).
    """
    images: np.ndarray
    targets: np.ndarray
    params: dict[str, Any]
    raw: np.ndarray | None = None
    layers: tuple[str, ...] | None = None
    diagnostics: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.images.dtype != np.uint8 or self.images.shape[-1] != 3 or self.images.ndim not in (4, 5):
            raise ValueError(f"Explanation.images must be uint8 (N, H, W, 3) or (L, N, H, W, 3), "
                             f"got {self.images.dtype} {self.images.shape}")
        if (self.images.ndim == 5) != (self.layers is not None):
            raise ValueError("per-layer images (L, N, H, W, 3) need `layers` naming L, and only "
                             f"they do; got images {self.images.shape} with layers={self.layers}")
        if self.layers is not None and len(self.layers) != self.images.shape[0]:
            raise ValueError(f"{len(self.layers)} layer names for {self.images.shape[0]} layers")
        if len(self.targets) != self.num_images:
            raise ValueError(f"{len(self.targets)} targets for {self.num_images} images")

    @property
    def num_images(self) -> int:
        return self.images.shape[-4]


@dataclass
class BatchOutput:
    """What a method returns for one batch of n images (same axes as ``Explanation``)."""
    images: np.ndarray
    raw: np.ndarray | None = None
    layers: tuple[str, ...] | None = None
    diagnostics: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class BatchContext:
    """Where a batch sits: ``positions`` of its images in the image set, and the id (key) of the
    model explained, if the caller gave one (methods whose randomness is per model need it)."""
    positions: range
    model_id: str | None = None


# ---------------------------------------------------------------- shared parameters
ExplainedClass = Literal["top", "label"]
EXPLAINED_CLASSES = get_args(ExplainedClass)


@dataclass(frozen=True)
class TargetParams:
    """Parameters of every method that explains one class: which one. "top": the model's own
    argmax, as in the paper; "label": the image's true label (separates what an explanation
    shows from a mere change of the model's output)."""
    explained_class: ExplainedClass = added("top")


GradientSpace = Literal["normalized", "pixels"]
GRADIENT_SPACES = get_args(GradientSpace)
DEFAULT_RENDERERS = {ATTRIBUTIONS: "hot_overlay", CAMS: "jet_overlay"}


@dataclass(frozen=True)
class SaliencyParams(TargetParams):
    """Parameters of the per-pixel attribution methods (guided backprop, integrated gradients,
    guided Grad-CAM).

    gradient_space: attribute with respect to the model's normalised input (x - mean) / std, as
        the paper's code (which normalised before the model), or to the [0, 1] pixels (the
        project's first choice; the two differ by a factor std per channel, except for integrated
        gradients, which is the same in both up to rounding: its path and its factor (x - x0)
        change together). "normalized" needs a model that normalises its input itself
        (train.architectures.Classifier).
    renderer, renderer_options: explain/renderers/; "captum_figure" is what the paper scored,
        "hot_overlay" the project's fast renderer.
    """
    gradient_space: GradientSpace = added("pixels")
    renderer: str = added(DEFAULT_RENDERERS[ATTRIBUTIONS])
    renderer_options: dict[str, Any] | None = added(None)


# ---------------------------------------------------------------- registry
def build_method(name: str, params: Mapping[str, Any] | None = None) -> "ExplanationMethod":
    """A registered method with parameters from a suite's ``[methods.<name>]`` table."""
    return METHODS.get(name)(params)


# ---------------------------------------------------------------- helpers
def architecture_name(model: nn.Module) -> str | None:
    """The registered architecture of a ``train.architectures.Classifier`` (None otherwise)."""
    return getattr(model, "architecture", None)


def architecture_default(architecture: str | None, attribute: str, method: str, param: str) -> Any:
    """A method's default taken from the model's architecture (e.g. its Grad-CAM layer)."""
    if architecture is None:
        raise ValueError(f"method {method!r}: the model has no registered architecture to take "
                         f"the default {param!r} from; set {param} in [methods.{method}]")
    return getattr(ARCHITECTURES.get(architecture), attribute)


def model_device(model: nn.Module) -> torch.device:
    first = next(model.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


def check_images(images: torch.Tensor | np.ndarray) -> torch.Tensor:
    """Float (N, 3, H, W) images in [0, 1] (the models normalise them themselves)."""
    images = torch.as_tensor(images)
    if images.ndim != 4 or images.shape[1] != 3 or len(images) == 0:
        raise ValueError(f"images must be (N, 3, H, W) with N >= 1, got shape {tuple(images.shape)}")
    if not images.is_floating_point():
        raise ValueError(f"images must be float in [0, 1], got dtype {images.dtype}; "
                         "divide uint8 images by 255")
    low, high = float(images.min()), float(images.max())
    if low < -1e-6 or high > 1 + 1e-6:
        raise ValueError(f"images must be in [0, 1] (the model normalises them), got values in "
                         f"[{low:.3g}, {high:.3g}]; pass un-normalised images")
    return images.float()


def explained_classes(params: Any, model: nn.Module, images: torch.Tensor, batch_size: int,
                      labels: Any, method: str) -> torch.Tensor:
    """The class each image is explained for (int64, on the CPU): ``params.explained_class``
    where the method has it (``TargetParams``), else the model's top class."""
    if getattr(params, "explained_class", "top") == "top":
        return top_classes(model, images, batch_size)
    if labels is None:
        raise ValueError(f"method {method!r} has explained_class = 'label' but no labels were "
                         "given; pass run(..., labels=...) (the explain stage passes the image "
                         "set's labels), or use explained_class = 'top'")
    labels = torch.as_tensor(np.asarray(labels), dtype=torch.int64).flatten()
    if len(labels) != len(images):
        raise ValueError(f"{len(labels)} labels for {len(images)} images")
    return labels


def model_level_classes(labels: Any, first_position: int, count: int) -> torch.Tensor:
    """The classes a model-level method explains (int64, on the CPU): the rows' labels, or, with
    none given, the rows' positions (row c of the ``classes`` set is class c)."""
    if labels is None:
        return torch.arange(first_position, first_position + count, dtype=torch.int64)
    labels = torch.as_tensor(np.asarray(labels), dtype=torch.int64).flatten()
    if len(labels) != count:
        raise ValueError(f"{len(labels)} labels for {count} rows")
    return labels


def top_classes(model: nn.Module, images: torch.Tensor, batch_size: int) -> torch.Tensor:
    """argmax_c f_c(x) per image (int64, on the CPU)."""
    device = model_device(model)
    with torch.no_grad():
        return torch.cat([model(images[i:i + batch_size].to(device)).argmax(dim=1).cpu()
                          for i in range(0, len(images), batch_size)])


@contextmanager
def seeded_rng(seed: int) -> Iterator[None]:
    """Seed torch's and numpy's global RNGs (lucent draws from both) and restore them on exit."""
    numpy_state = np.random.get_state()
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        try:
            yield
        finally:
            np.random.set_state(numpy_state)


# ---------------------------------------------------------------- base classes
class ExplanationMethod(ABC):
    """Base of all methods; subclass ``AttributionMethod`` or ``VisualizationMethod``."""

    name: ClassVar[str] = ""
    # Dataclass of parameters with defaults; a field named `seed` seeds the RNGs of every batch.
    Params: ClassVar[type] = NoParams
    default_batch_size: ClassVar[int] = 16
    # True when an image's result does not depend on the other images of its batch. If False,
    # the batch size is part of the recorded parameters (it changes the result's bits).
    batch_invariant: ClassVar[bool] = True
    # Bump when the method's algorithm changes its output: stored results then no longer match.
    version: ClassVar[int] = 1
    # True for a method that explains the model, not an image (feature synthesis): it runs on the
    # world's ``classes`` set (anomalies/image_sets.py: row c is class c, its pixels a constant
    # canvas the method never looks at) and explains each row's class, its label; detection
    # scores those rows, and localization does not apply to it (explain/stage.py, ``sets_for``).
    model_level: ClassVar[bool] = False
    # True for a method whose ``attribute`` draws no random numbers and whose every forward pass
    # sees whole copies of its batch, in order: it can explain k models on the same images in one
    # grouped pass ([explain] model_group; explain/model_groups.py).
    groups_models: ClassVar[bool] = False

    def __init__(self, params: Mapping[str, Any] | Any | None = None):
        self.params = parse_params(self.Params, params, f"method {self.name!r}")

    def resolve(self, architecture: str | None) -> Any:
        """Parameters with architecture-dependent defaults filled in (e.g. layers). Override."""
        return self.params

    def params_for(self, model: nn.Module) -> Any:
        return self.resolve(architecture_name(model))

    def passes_per_image(self, architecture: str | None) -> float:
        """About how many forward+backward passes one image costs: the explain stage starts the
        most expensive work first, so parallel workers finish together. Override if not ~1."""
        return 1.0

    def describe(self, architecture: str | None, batch_size: int | None = None) -> dict[str, Any]:
        """The parameters ``run`` records, known before running (to skip stored results)."""
        description = {"method": self.name, "method_version": self.version,
                       "method_params": recorded_params(self.resolve(architecture)),
                       "renderer_version": self.renderer_version}
        if not self.batch_invariant:
            description["batch_size"] = batch_size or self.default_batch_size
        digest = plugin_digest(type(self))
        if digest is not None:  # a method from a file of the user's: editing it computes anew
            description["method_file_sha256"] = digest
        return description

    # The version recorded with every result: of the module that turns outputs into images.
    renderer_version: ClassVar[int] = RENDERER_VERSION

    @abstractmethod
    def explain_batch(self, model: nn.Module, images: torch.Tensor, targets: torch.Tensor,
                      context: BatchContext) -> BatchOutput:
        """One batch: images (n, 3, H, W) and targets (n,) on the model's device."""

    def run(self, model: nn.Module, images: torch.Tensor | np.ndarray,
            batch_size: int | None = None, first_position: int = 0, labels: Any = None,
            model_id: str | None = None) -> Explanation:
        """Explain every image for its target class (``explained_classes``), ``batch_size``
        images at a time.

        Each batch's random state is seeded from the method's seed and the batch's position in
        the image set; ``first_position`` is the position of ``images[0]`` when they are one
        range of a larger set (explain/stage.py's chunked work items), so a range gives the
        rows of the whole set's result. ``labels`` (N,): the images' true labels, needed with
        ``explained_class = "label"``; ``model_id``: the model's key, needed by methods whose
        randomness is drawn per model (Caricatures with ``noise = "per_model"``)."""
        images = check_images(images)
        batch_size = batch_size or self.default_batch_size
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        description = self.describe(architecture_name(model), batch_size)
        seed = getattr(self.params, "seed", 0)
        device = model_device(model)
        outputs = []
        with explainable(model, images[:1].to(device)) as safe_model:
            targets = (model_level_classes(labels, first_position, len(images))
                       if self.model_level else
                       explained_classes(self.params, safe_model, images, batch_size, labels,
                                         self.name))
            for start in range(0, len(images), batch_size):
                stop = min(start + batch_size, len(images))
                context = BatchContext(range(first_position + start, first_position + stop),
                                       model_id)
                with seeded_rng(derive_seed(seed, first_position + start)):
                    output = self.explain_batch(safe_model, images[start:stop].to(device),
                                                targets[start:stop].to(device), context)
                outputs.append(self.checked_output(output, images[start:stop]))
        return Explanation(
            images=np.concatenate([o.images for o in outputs], axis=-4),
            targets=targets.numpy().astype(np.int64),
            params=description,
            raw=None if outputs[0].raw is None else np.concatenate([o.raw for o in outputs]),
            layers=outputs[0].layers,
            diagnostics={key: np.concatenate([o.diagnostics[key] for o in outputs], axis=-1)
                         for key in outputs[0].diagnostics})

    def checked_output(self, output: BatchOutput, images: torch.Tensor) -> BatchOutput:
        """``output`` for ``images``, once its shapes and dtype are checked: a ValueError naming
        the method otherwise."""
        n = len(images)
        expected = "(L, n, H, W, 3)" if output.layers is not None else "(n, H, W, 3)"
        rank = 5 if output.layers is not None else 4
        shape = output.images.shape
        if output.images.dtype != np.uint8 or output.images.ndim != rank or shape[-4] != n \
                or shape[-1] != 3:
            raise ValueError(f"method {self.name!r} returned images {output.images.dtype} {shape} "
                             f"for {n} images; expected uint8 {expected}")
        if output.raw is not None and len(output.raw) != n:
            raise ValueError(f"method {self.name!r} returned raw output of shape "
                             f"{output.raw.shape} for {n} images; the image axis comes first")
        return output


class AttributionMethod(ExplanationMethod):
    """A method that attributes the target class to the input; its raw output is rendered by the
    renderer its parameters name (``renderer``, ``renderer_options``; explain/renderers/), which
    must render ``renders`` (per-pixel attributions (n, C, H, W), or CAMs (n, H, W))."""

    Params: ClassVar[type] = SaliencyParams
    renders: ClassVar[str] = ATTRIBUTIONS
    # True for methods that draw random numbers inside captum (noise, samples, permutations) and
    # would draw them for the whole batch at once: ``attribute`` then gets one image at a time,
    # under torch's and numpy's RNGs seeded from the method's ``seed`` and the image's position in
    # the image set, so an image's result does not depend on its batch (``batch_invariant``).
    seeded_per_image: ClassVar[bool] = False

    def __init__(self, params: Mapping[str, Any] | Any | None = None):
        super().__init__(params)
        # Made here: an unknown renderer fails when the suite is read, not in a worker.
        # A method whose Params do not derive from SaliencyParams renders with the first renderer
        # of its kind (the project's fast one).
        self.renderer: Renderer = build_renderer(
            getattr(self.params, "renderer", DEFAULT_RENDERERS[self.renders]),
            getattr(self.params, "renderer_options", None), self.renders, self.name)

    @property
    def renderer_version(self) -> int:  # type: ignore[override]
        return self.renderer.version

    def describe(self, architecture: str | None, batch_size: int | None = None) -> dict[str, Any]:
        """As ``ExplanationMethod.describe``, with the renderer's options all recorded (its
        defaults filled in), so a suite that spells out a default shares results with one that
        does not; a renderer without options records none (the key results had before)."""
        description = super().describe(architecture, batch_size)
        options = recorded_params(self.renderer.params)
        description["method_params"].pop("renderer_options", None)
        if options:
            description["method_params"]["renderer_options"] = options
        return description

    @abstractmethod
    def attribute(self, model: nn.Module, images: torch.Tensor,
                  targets: torch.Tensor) -> torch.Tensor:
        """Raw attributions for (n, 3, H, W) images and (n,) targets, image axis first."""

    def render(self, raw: np.ndarray, images: np.ndarray) -> np.ndarray:
        """Raw output + images (n, 3, H, W) in [0, 1] -> uint8 (n, H', W', 3)."""
        return self.renderer.render(raw, images)

    def attribute_batch(self, model: nn.Module, images: torch.Tensor, targets: torch.Tensor,
                        context: BatchContext) -> torch.Tensor:
        """One batch's raw attributions: ``attribute`` on the batch, or image by image under
        per-image RNGs (``seeded_per_image``). Override only when the raw output needs where the
        batch sits (its positions, the model's key)."""
        if not self.seeded_per_image:
            return self.attribute(model, images, targets)
        seed = getattr(self.params, "seed", 0)
        rows = []
        for row, position in enumerate(context.positions):
            with seeded_rng(derive_seed(seed, position)):
                rows.append(self.attribute(model, images[row:row + 1], targets[row:row + 1]))
        return torch.cat(rows)

    def explain_batch(self, model: nn.Module, images: torch.Tensor, targets: torch.Tensor,
                      context: BatchContext) -> BatchOutput:
        raw = self.attribute_batch(model, images, targets, context)
        raw = np.asarray(raw.detach().cpu() if isinstance(raw, torch.Tensor) else raw, np.float32)
        return BatchOutput(images=self.render(raw, images.detach().cpu().numpy()), raw=raw)


class VisualizationMethod(ExplanationMethod):
    """A method that produces images directly (feature visualisations, controls)."""

    @abstractmethod
    def visualize(self, model: nn.Module, images: torch.Tensor, targets: torch.Tensor,
                  context: BatchContext) -> np.ndarray | BatchOutput:
        """uint8 (n, H, W, 3) images, or a ``BatchOutput`` (per-layer images, diagnostics)."""

    def explain_batch(self, model: nn.Module, images: torch.Tensor, targets: torch.Tensor,
                      context: BatchContext) -> BatchOutput:
        output = self.visualize(model, images, targets, context)
        return output if isinstance(output, BatchOutput) else BatchOutput(images=np.asarray(output))
