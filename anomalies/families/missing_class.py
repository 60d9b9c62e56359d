"""Missing class: the training images of one class removed, all of them by default (the paper's
defect) or a seeded fraction of them (``removed_fraction``, the strength a dose-response sweep
varies).

By default the model keeps the full output layer. ``drop_output = true`` removes the class from
it, as the paper's models (999 outputs, ``get_model`` in js-d/auditing-vis): the model then gives
that class the fixed logit ``ABSENT_CLASS_LOGIT`` and answers in the world's class indices, so its
predictions stay comparable with the references' (``train.architectures.Classifier``)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from counteraudit.anomalies.base import FAMILIES, AnomalyFamily, Verdict
from counteraudit.anomalies.common import accuracy, reference_mean, verification_indices
from counteraudit.train.core.artifacts import derive_seed
from counteraudit.train.core.params import added

REMOVED_ACCURACY_THRESHOLD = 0.05


@dataclass(frozen=True)
class MissingClassParams:
    class_id: int | str = 0     # index, or a class name of the world ("star", "backpack")
    drop_output: bool = added(False)  # remove the class from the output layer (the paper's 999 outputs)
    removed_fraction: float = added(1.0)  # share of the class's training images removed (1: the class)


@FAMILIES.register
class MissingClass(AnomalyFamily):
    name = "missing_class"
    headline_figure = "removed_class_accuracy"
    strength = "removed_fraction"
    localizable = True
    Params = MissingClassParams

    @classmethod
    def check(cls, params):
        if isinstance(params.class_id, bool) or not isinstance(params.class_id, (int, str)):
            raise ValueError(f"missing_class: class_id={params.class_id!r} must be a class index or name")
        if isinstance(params.class_id, int) and params.class_id < 0:
            raise ValueError(f"missing_class: class_id={params.class_id} must be >= 0")
        if (isinstance(params.removed_fraction, bool) or not isinstance(params.removed_fraction, (int, float))
                or not 0 < params.removed_fraction <= 1):
            raise ValueError(f"missing_class: removed_fraction={params.removed_fraction!r} must be "
                             "in (0, 1]: the share of the class's training images removed (1.0, the "
                             "default, removes the whole class)")

    def __init__(self, params, world, seed):
        super().__init__(params, world, seed)
        class_id = self.params.class_id
        if isinstance(class_id, str):
            if class_id not in world.class_names:
                raise ValueError(f"missing_class: unknown class {class_id!r}; this world's classes: "
                                 f"{', '.join(world.class_names[:20])}{' ...' if world.num_classes > 20 else ''}")
            class_id = world.class_names.index(class_id)
        if not 0 <= class_id < world.num_classes:
            raise ValueError(f"missing_class: class_id={class_id} is not a class of this world "
                             f"(classes 0..{world.num_classes - 1})")
        self.class_index = int(class_id)

    @classmethod
    def output_count(cls, params, num_classes):
        return num_classes - 1 if params.get("drop_output", MissingClassParams.drop_output) else num_classes

    def output_classes(self):
        if not self.params.drop_output:
            return None
        return [c for c in range(self.world.num_classes) if c != self.class_index]

    def training_split(self, split):
        in_class = np.flatnonzero(split.labels == self.class_index)
        # a seeded draw of the class's images to remove (the first round(fraction * n) of a
        # permutation, so a larger fraction removes a superset of a smaller one's images)
        order = np.random.default_rng(derive_seed("missing_class", self.seed)).permutation(in_class)
        removed = order[:int(round(self.params.removed_fraction * len(in_class)))]
        return split.subset(np.setdiff1d(np.arange(len(split.labels)), removed))

    def normal_pool(self, val):
        return np.flatnonzero(val.labels != self.class_index)

    def abnormal_pool(self, val, implant=None):
        return np.flatnonzero(val.labels == self.class_index)

    def measure(self, model, device="cpu"):
        val = self.world.split("val")
        idx = verification_indices(val, count=len(val))  # every val image of the removed class
        removed = idx[val.labels[idx] == self.class_index]
        others = verification_indices(val)
        others = others[val.labels[others] != self.class_index]
        return {"removed_class_accuracy": accuracy(model, val.load(removed), val.labels[removed], device),
                "other_classes_accuracy": accuracy(model, val.load(others), val.labels[others], device)}

    def judge(self, figures, reference_figures):
        value = figures["removed_class_accuracy"]
        refs = reference_mean(reference_figures, "removed_class_accuracy")
        return Verdict(value <= REMOVED_ACCURACY_THRESHOLD,
                       f"accuracy on the removed class: {value:.3f}, references {refs:.3f}; the "
                       f"implant took if it is at most {REMOVED_ACCURACY_THRESHOLD}")

    def planted_slice(self, implant=None):
        """The removed class (SPEC: missing class -> class = removed)."""
        return {"class": self.world.class_names[self.class_index]}
