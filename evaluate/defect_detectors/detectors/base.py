"""The plug-in interface of model-level defect detectors (trojan and backdoor detectors), and the
run they all share.

A detector looks at one trained model, with what a defender has beside it (``Evidence``: a small
set of clean held-out images, the image sets every auditor scores, and, for the detectors that
need it, a sample of the model's own training data as it trained on it), and says how suspect the
model is. Like an explanation method (explain/base.py) or a failure-discovery auditor
(evaluate/discovery/auditors/base.py), it is a small class that sets ``name`` (and, optionally, a
``Params`` dataclass) and implements ONE method:

    inspect(model, evidence) -> Inspection

``Detector.run`` does the rest once for every detector: evaluation mode, a seeded RNG (same seed,
same bits), the model's mode restored after, and a check that the inspection has the shapes the
scoring needs. What an ``Inspection`` holds:

- ``statistic``: the detector's output for the whole model as a float vector (Neural Cleanse's
  per-class trigger norms, per-layer weight statistics, ...). The benchmark scores it as it scores
  a visualization: the anomaly score of the model's vector against the references' (Euclidean
  distance, ``defect_detectors.scores``), so a detector sits in Table 1 beside the explanation
  methods with the same p-values and verdicts.
- ``per_input`` (detectors that score inputs, ``scores_inputs``): a vector per image of each
  image set in ``Evidence.image_sets``. Table 1 then reads the detection set, as for an
  explanation method, and Table 2 the abnormal and normal sets: per image, the anomaly score of
  the model's vector against the references' on the same image.
- ``score`` and ``flagged``: the detector's own suspicion and its published decision rule (Neural
  Cleanse's anomaly index above 2, ...), reported beside the benchmark's verdicts.
- ``mask`` (``reverse_engineers_trigger``): the trigger mask it recovered, compared with the
  planted one where there is one.
- ``training_scores``: its suspicion of each training image (``needs_training_data``), compared
  with which images the anomaly family changed.

Register with ``@DETECTORS.register``; ``DETECTORS`` imports every module of this folder on first
lookup, so a new detector is one new file here, and tests/test_defect_detectors.py tests it.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

import numpy as np
import torch
from torch import nn

from counteraudit.explain.base import seeded_rng
from counteraudit.train.core.params import NoParams, parse_params, recorded_params
from counteraudit.train.core.plugin_files import plugin_description
from counteraudit.train.core.registry import Registry

# Defect detectors: one module each in this folder, imported on the first lookup.
DETECTORS: Registry[type] = Registry("detector",
                                     plugins="counteraudit.evaluate.defect_detectors.detectors")

DETECTION_SET = "detection"  # the image set Table 1 reads (explain/stage.py's DETECTION)


@dataclass(frozen=True)
class TrainingSample:
    """Training images as the model trained on them: the world's training split through the
    model's anomaly family (a backdoor's trigger and target label pasted in, a relabelling, ...),
    and which rows the family changed (the ground truth of a training-data detector's flags)."""
    images: torch.Tensor  # (N, 3, H, W) float in [0, 1]
    labels: torch.Tensor  # (N,) the labels trained on
    changed: np.ndarray   # (N,) bool: rows the family changed (all False for a clean model)

    def __post_init__(self):
        if not (len(self.images) == len(self.labels) == len(self.changed)):
            raise ValueError(f"a training sample needs as many labels and flags as images: "
                             f"{len(self.images)} images, {len(self.labels)} labels, "
                             f"{len(self.changed)} flags")


@dataclass(frozen=True)
class Evidence:
    """What a detector sees besides the model."""
    num_classes: int
    clean_images: torch.Tensor  # (n, 3, H, W) in [0, 1]: clean held-out images (the defender's set)
    clean_labels: torch.Tensor  # (n,)
    # image set name -> (N, 3, H, W) images in [0, 1]: the sets every auditor is scored on (the
    # detection set first; a localizable model's abnormal and normal sets)
    image_sets: Mapping[str, torch.Tensor] = field(default_factory=dict)
    training: TrainingSample | None = None  # given only to a detector that needs_training_data

    @property
    def image_size(self) -> tuple[int, int]:
        return int(self.clean_images.shape[-2]), int(self.clean_images.shape[-1])


@dataclass
class Inspection:
    """One detector's output for one model (module docstring)."""
    statistic: np.ndarray  # (d,) float: the model-level output the anomaly score compares
    # the detector's own suspicion (higher = more suspect) and its published decision rule; a
    # control without a rule of its own leaves them NaN and None
    score: float = float("nan")
    flagged: bool | None = None
    per_input: dict[str, np.ndarray] = field(default_factory=dict)  # set -> (N, d) float
    mask: np.ndarray | None = None             # (H, W) in [0, 1]: a recovered trigger mask
    training_scores: np.ndarray | None = None  # (N,) suspicion of each training image
    notes: dict[str, Any] = field(default_factory=dict)


class Detector(ABC):
    """A model-level defect detector (module docstring). Subclasses set ``name`` and implement
    ``inspect``."""

    name: ClassVar[str]
    Params: ClassVar[type] = NoParams
    version: ClassVar[int] = 1  # raise it when a change alters results: stored ones are recomputed
    # Reads Evidence.training: a run on a model whose training data is unknown (an imported
    # checkpoint, a world without a training split) is refused before any work.
    needs_training_data: ClassVar[bool] = False
    # Scores every image of Evidence.image_sets (Inspection.per_input): Tables 1 and 2 read those.
    scores_inputs: ClassVar[bool] = False
    reverse_engineers_trigger: ClassVar[bool] = False  # Inspection.mask
    # A control: it sees less than the model's behaviour (its weights alone), so a defect it
    # detects is visible without running the model on any input.
    control: ClassVar[bool] = False
    # What it is, in a few words, for tables and --help (e.g. "trigger reverse-engineering").
    mechanism: ClassVar[str] = ""

    def __init__(self, params: Mapping[str, Any] | Any | None = None):
        self.params = parse_params(self.Params, params, f"detector {self.name!r}")

    def describe(self) -> dict[str, Any]:
        """What determines a result besides the model and the evidence: part of its key."""
        return plugin_description("detector", type(self), recorded_params(self.params))

    @abstractmethod
    def inspect(self, model: nn.Module, evidence: Evidence) -> Inspection:
        """The inspection of one model in evaluation mode with its parameters frozen (``run``
        sets both), its RNGs seeded."""

    def run(self, model: nn.Module, evidence: Evidence, seed: int = 0) -> Inspection:
        if self.needs_training_data and evidence.training is None:
            raise ValueError(f"detector {self.name!r} needs the model's training data, and the "
                             "evidence has none")
        was_training = model.training
        # An inspection optimises inputs, never the model: without the parameters' gradients a
        # backward pass skips the weight gradients (Neural Cleanse 25% and MM-BD 31% faster on
        # one core, the same bits) and leaves no .grad on the model.
        required = [(parameter, parameter.requires_grad) for parameter in model.parameters()]
        model.eval()
        try:
            for parameter, _ in required:
                parameter.requires_grad_(False)
            with seeded_rng(seed):
                inspection = self.inspect(model, evidence)
        finally:
            for parameter, requires_grad in required:
                parameter.requires_grad_(requires_grad)
            model.train(was_training)
        return self._checked(inspection, evidence)

    def _checked(self, inspection: Inspection, evidence: Evidence) -> Inspection:
        where = f"detector {self.name!r}"
        statistic = np.asarray(inspection.statistic, dtype=np.float64).ravel()
        if statistic.size == 0 or not np.all(np.isfinite(statistic)):
            raise ValueError(f"{where}: its statistic must be a non-empty finite vector, got "
                             f"{statistic!r}")
        per_input = {}
        if self.scores_inputs:
            missing = sorted(set(evidence.image_sets) - set(inspection.per_input))
            if missing:
                raise ValueError(f"{where} scores inputs but gave no scores for the image sets "
                                 f"{missing}")
            for name, images in evidence.image_sets.items():
                values = np.asarray(inspection.per_input[name], dtype=np.float64)
                values = values.reshape(len(values), -1)
                if len(values) != len(images) or not np.all(np.isfinite(values)):
                    raise ValueError(f"{where}: per-input scores of {name!r} must be finite, one "
                                     f"row per image ({len(images)}), got shape {values.shape}")
                per_input[name] = values
        mask = inspection.mask
        if mask is not None:
            mask = np.asarray(mask, dtype=np.float64)
            if mask.shape != evidence.image_size:
                raise ValueError(f"{where}: its trigger mask must be {evidence.image_size}, got "
                                 f"{mask.shape}")
        training_scores = inspection.training_scores
        if training_scores is not None:
            training_scores = np.asarray(training_scores, dtype=np.float64).ravel()
            if evidence.training is None or len(training_scores) != len(evidence.training.labels):
                raise ValueError(f"{where}: training scores need one value per training image")
        flagged = None if inspection.flagged is None else bool(inspection.flagged)
        return Inspection(statistic=statistic, score=float(inspection.score), flagged=flagged,
                          per_input=per_input, mask=mask,
                          training_scores=training_scores, notes=dict(inspection.notes))


def build_detector(name: str, params: Mapping[str, Any] | None = None) -> Detector:
    return DETECTORS.get(name)(params)


def penultimate_features(model: nn.Module, images: torch.Tensor,
                         batch_size: int = 256) -> torch.Tensor:
    """The input of the model's last linear layer for each image (N, features), float64: the
    latent space activation clustering and spectral signatures separate."""
    final = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not final:
        raise ValueError(f"{type(model).__name__} has no linear layer: no penultimate features")
    captured: list[torch.Tensor] = []
    hook = final[-1].register_forward_hook(
        lambda module, inputs, output: captured.append(inputs[0].detach().flatten(1)))
    try:
        with torch.no_grad():
            for start in range(0, len(images), batch_size):
                model(images[start:start + batch_size])
    finally:
        hook.remove()
    return torch.cat(captured).double()


def predict_probabilities(model: nn.Module, images: torch.Tensor,
                          batch_size: int = 256) -> torch.Tensor:
    """Softmax probabilities (N, classes), float64, batched, without gradients."""
    with torch.no_grad():
        return torch.cat([torch.softmax(model(images[start:start + batch_size]).float(), dim=1)
                          for start in range(0, len(images), batch_size)]).double()
