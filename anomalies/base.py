"""The contract of an anomaly family: one file per family in anomalies/, registered in FAMILIES.

A family knows (1) how to change training (the data split, or each batch, or the inputs through
the model as PGD does), (2) which inputs are abnormal for a model of its kind, and (3) how to
measure that its defect took. Every hook has a no-op default, so a family fills in only what it
changes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from counteraudit.anomalies.common import VERIFY_IMAGES
from counteraudit.train.core.registries import FAMILIES, strength_families
from counteraudit.train.core.params import NoParams, key_params, parse_params

__all__ = ["FAMILIES", "NOT_EXPRESSIBLE", "AnomalyFamily", "NoParams", "Verdict", "strength_families"]

# ``planted_slice`` of a family whose cue (a trigger, a drawn index) is not a factor of the world.
NOT_EXPRESSIBLE = "not expressible"


class AnomalyFamily:
    name: ClassVar[str]
    stark: ClassVar[bool] = False       # stark: lowers clean accuracy; subtle: off-distribution only
    localizable: ClassVar[bool] = False  # has a well-defined set of abnormal inputs
    Params: ClassVar[type] = NoParams
    # The parameter that sets how strong the defect is (a field of Params, larger = stronger), the
    # one a suite's [[sweeps]] varies for a dose-response curve; None: the family has no such knob.
    strength: ClassVar[str | None] = None
    # The figure of ``measure`` that ``judge`` reads: a dose-response curve's implant figure.
    headline_figure: ClassVar[str | None] = None
    # Bump when ``measure`` changes: the references' cached figures are then measured again.
    measure_version: ClassVar[int] = 1
    # validation images the implant check measures (part of the cached reference figures' key)
    verify_images: ClassVar[int] = VERIFY_IMAGES
    # Parameters that decide only what is evaluated (which images are abnormal), never the
    # weights: always left out of the model's key, so changing one never trains a model again.
    key_excludes: ClassVar[tuple[str, ...]] = ()
    # A sanity check (Adebayo et al. 2018): a model that has learnt nothing of the task. A method
    # that does not detect it does not depend on the model, and the report says so.
    sanity_check: ClassVar[bool] = False
    # Whether ``training_inputs`` runs the model being trained (PGD does). The grouped engine hands
    # such a family a view of the one member it trains (train/grouped.py, MemberView), every
    # other family ``model = None``.
    training_reads_model: ClassVar[bool] = False

    def __init__(self, params: dict[str, Any], world, seed: int):
        self.params = self.Params(**params)
        self.world = world
        self.seed = seed

    @classmethod
    def validate_params(cls, params: dict[str, Any]) -> dict[str, Any]:
        """Defaults filled in, every value checked; returns the canonical dict (part of the
        model's identity: ``key_params``, so a field declared ``added`` is left out while at the
        value models were trained with before it existed). Errors name the bad value and the
        valid range."""
        # values kept as written: the keys of models trained so far hold them so (2, not 2.0)
        instance = parse_params(cls.Params, params, f"{cls.name} params", as_written=True)
        cls.check(instance)
        return key_params(instance)

    @classmethod
    def check_image_size(cls, params: dict[str, Any], height: int, width: int) -> None:
        """Raise ValueError, naming both sizes, when this model's cue (a trigger, a watermark)
        does not fit a ``height`` x ``width`` image. Called when a suite loads (for the world's
        image size and every training crop size) and before each use."""

    @classmethod
    def check(cls, params) -> None:
        """Raise ValueError for invalid parameter values."""

    @classmethod
    def check_world(cls, params: dict[str, Any], world_name: str,
                    class_names: list[str] | None) -> None:
        """Raise ValueError, naming the key and the valid values, when these parameters do not fit
        the world (a class it lacks, an option of another world). ``class_names``: the world's,
        or None where they cannot be known before it is built. Called when a suite loads and
        when the family is built."""

    @classmethod
    def check_suite(cls, params: dict[str, Any], architecture: str,
                    reference_seeds: list[int]) -> None:
        """Raise ValueError, naming the key and the valid values, when these parameters do not fit
        the suite's model (``architecture``) or its references (their seeds). Called when a suite
        loads."""

    @classmethod
    def training_recipe(cls, params: dict[str, Any]) -> str | None:
        """How this project trains the defect in, in one line for a person (a dry run, a report:
        "trained here: ..." beside a loaded checkpoint's published recipe); None: no line."""
        return None

    # ---- training hooks
    @classmethod
    def relative_training_cost(cls, params: dict[str, Any]) -> float:
        """Training time relative to a reference's (the executor starts the longest trainings
        first, so a 2-worker run does not end with one worker alone on the slowest model)."""
        return 1.0

    def reference_seed(self) -> int | None:
        """The seed of the reference this model is derived from instead of trained (None: it is
        trained). The trainer loads that reference, training it first if it is not yet, and hands
        it to ``derive``; the model's key holds the seed, so it is made once and shared."""
        return None

    def derive(self, model: torch.nn.Module) -> None:
        """Change the loaded reference ``model`` in place into this model (``reference_seed``)."""
        raise NotImplementedError(f"{self.name} is trained, not derived from a reference")

    def training_split(self, split):
        """The training split this family trains on (default: the world's own)."""
        return split

    def training_inputs(self, model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor,
                        generator: torch.Generator, offset: int = 0,
                        global_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Change one training batch (images in [0, 1]) before the forward pass.

        ``images`` may be one process's slice of a global batch: rows offset .. offset +
        len(images) of ``global_size`` (None: the whole batch). A family draws its randomness for
        the global batch (the same draws, so the same generator state after, on every process) and
        applies the rows it holds, so N processes change the batch as one process would."""
        return images, labels

    @classmethod
    def output_count(cls, params: dict[str, Any], num_classes: int) -> int:
        """How many outputs this model's layer has in a world of ``num_classes`` classes (the
        length of ``output_classes``), known before the world is built, to check a checkpoint."""
        return num_classes

    def output_classes(self) -> list[int] | None:
        """The world's classes this model's output layer has (None: all of them). The model
        still answers in the world's class indices (``train.architectures.Classifier``)."""
        return None

    # ---- implant verification
    def measure(self, model: torch.nn.Module, device="cpu") -> dict[str, float]:
        """This family's behaviour figures for any model (measured on the anomalous model and on
        every reference, with the same inputs, so they can be compared)."""
        return {}

    def judge(self, figures: dict[str, float], reference_figures: list[dict[str, float]]) -> Verdict:
        """Did the defect take? Compares the anomalous model's figures with the references'."""
        return Verdict(True, "no implant check for this family")

    @classmethod
    def implant_figure(cls, record: dict) -> tuple[str, float, float] | None:
        """(figure name, the model's value, the references' mean) of a stored implant record
        (``train/implant_checks.py``), the figure its verdict reads; None when the family has none."""
        name = cls.headline_figure
        if name is None or name not in record.get("figures", {}):
            return None
        references = [f[name] for f in record.get("reference_figures", []) if name in f]
        return name, float(record["figures"][name]), (float(sum(references) / len(references))
                                                     if references else float("nan"))

    # ---- localization
    def abnormal_pool(self, val, implant: dict | None = None):
        """Positions in the val split of every input this model misbehaves on (None if the family
        has no well-defined abnormal set). The abnormal set is a nested draw from it
        (``anomalies.image_sets.nested_draw``): p = 25 images are the first 25 of p = 40."""
        return None

    def normal_pool(self, val):
        """Positions of val images that count as normal for this family (default: all)."""
        return np.arange(len(val))

    def abnormal_images(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """How abnormal inputs are made from the chosen val images (e.g. add the trigger)."""
        return images

    # ---- failure discovery (evaluate/discovery/auditors/, evaluate/discover.py)
    def planted_slice(self, implant: dict | None = None):
        """The subgroup of world factors ({factor: value}) where this model's defect should show,
        None when the defect is global (no slice: stark families), or NOT_EXPRESSIBLE when its
        cue is no world factor (a miss by design for auditors that search factors)."""
        return None


@dataclass
class Verdict:
    passed: bool
    summary: str                    # one line a person reads: the figure and its threshold
    details: dict = field(default_factory=dict)  # e.g. the class a blurred-faces model lost most
